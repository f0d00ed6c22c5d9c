"""Test settings: never touch the user's real kernel tuning cache."""

import os
import tempfile

# Set before onnx_light is imported anywhere, so the import-time load reads an empty location.
os.environ["ONNX_LIGHT_KERNEL_TUNING_CACHE"] = os.path.join(
    tempfile.mkdtemp(prefix="onnx_light-tests-"), "kernel-tuning-cache.txt"
)
