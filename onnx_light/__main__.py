"""``python -m onnx_light``: see :mod:`onnx_light.cli`."""

import sys

from .cli import main

sys.exit(main())
