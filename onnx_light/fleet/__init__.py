"""onnx_light on a Ray cluster: calibration across its nodes and batch inference on Ray Data.

Needs the ``ray`` extra (``pip install "onnx_light[ray]"``). ``import onnx_light`` never
imports this package, so Ray costs nothing to those who do not use it (docs/fleet.md).
"""

from __future__ import annotations

from .calibration import calibrate_cluster
from .inference import Predictor

__all__ = ["Predictor", "calibrate_cluster"]
