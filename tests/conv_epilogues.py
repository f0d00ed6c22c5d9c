"""The check the compiled convolution kernels' tests share: a fused epilogue gives the plain
convolution finished alike, bit for bit."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnx_light.kernels.compiled_activations import in_place


def assert_fused_epilogue_matches(plain: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray,
                                  epilogue: str, rng: np.random.Generator) -> None:
    """``plain`` (a bound Conv kernel) with ``epilogue`` fused: ``relu6`` (a clamp), a compiled
    activation's operator name (``HardSwish``, ``Swish``: inside the kernel) or ``residual``
    (a residual Add, then Relu), against the plain convolution finished alike."""
    expected = plain.run(x, w, b)[0]
    if epilogue == "relu6":
        fused = plain.variant(epilogue=lambda block: np.clip(block, 0, 6, out=block), clamp=(0.0, 6.0))
        np.clip(expected, 0, 6, out=expected)
        got = fused.run(x, w, b)[0]
    elif epilogue == "residual":
        residual = rng.uniform(-1, 1, expected.shape).astype(np.float32)
        fused = plain.variant(epilogue=lambda block: np.maximum(block, 0, out=block), residual=True)
        got = fused.run(x, w, b, residual)[0]
        expected = np.maximum(expected + residual, 0)
    else:
        activation = in_place(epilogue, {}, lambda block: None)
        got = plain.variant(epilogue=activation).run(x, w, b)[0]
        activation(expected)
    assert expected.min() <= 0 < expected.max()
    np.testing.assert_array_equal(got, expected)
