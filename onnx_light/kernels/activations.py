"""Activations beyond elementwise.py's table: Mish, Swish, ThresholdedRelu, Shrink, SwiGLU,
Hardmax.

The first five are rows of the elementwise machinery (:class:`~onnx_light.kernels.elementwise.
ElementwiseOp`: type checks, attributes, broadcasting, half-precision widening, the parallel
split) with the portable default threshold and no tuning keys of their own. Hardmax is
Softmax's axis handling (one axis from opset 13, everything from ``axis`` on before) with a
one-hot of the first maximum in place of the exponentials.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import FLOAT_TYPES, INTEGER_TYPES, Kernel
from .declaration import KernelDeclaration, declare, dispatch_table
from .elementwise import _sigmoid, _softplus, kernel_class
from .elementwise_op import BINARY, UNARY, Attribute, ElementwiseOp
from .reductions import Softmax

__all__ = ["KERNELS", "OPS", "Hardmax"]

_SHRINK_TYPES = (*INTEGER_TYPES, T.FLOAT16, T.FLOAT, T.DOUBLE)


def _mish(x: np.ndarray, *, out: np.ndarray) -> None:
    """x * tanh(softplus(x)), safe in place (x is read last)."""
    t = np.empty_like(out)
    _softplus(x, out=t)
    np.tanh(t, out=t)
    np.multiply(x, t, out=out)


def _swish(x: np.ndarray, *, out: np.ndarray, alpha: float) -> None:
    """x * sigmoid(alpha * x), safe in place."""
    t = np.multiply(x, alpha)
    _sigmoid(t, out=t)
    np.multiply(x, t, out=out)


def _thresholded_relu(x: np.ndarray, *, out: np.ndarray, alpha: float) -> None:
    """x where x > alpha, else 0 (NaN too), safe in place."""
    drop = np.logical_not(np.greater(x, alpha))
    np.copyto(out, x)
    np.copyto(out, 0, where=drop)


def _swiglu(a: np.ndarray, b: np.ndarray, *, out: np.ndarray, alpha: float) -> None:
    """Swish(a) * b."""
    _swish(a, out=out, alpha=alpha)
    np.multiply(out, b, out=out)


def _shrink(x: np.ndarray, *, out: np.ndarray, bias: float, lambd: float) -> None:
    """x + bias below -lambd, x - bias above lambd, 0 between (integers computed in float64
    and cast back, as the reference does)."""
    value = x if x.dtype.kind == "f" else x.astype(np.float64)
    result = np.where(value < -lambd, value + bias, np.where(value > lambd, value - bias, 0))
    np.copyto(out, result, casting="unsafe")


_OP = ElementwiseOp
OPS: tuple[ElementwiseOp, ...] = (
    _OP("Mish", UNARY, FLOAT_TYPES, _mish, (18, 22), precision="float32", cost="transcendental",
        in_place=True),
    _OP("Swish", UNARY, FLOAT_TYPES, _swish, (24,), precision="float32", cost="transcendental",
        attributes=(Attribute("alpha", 1.0),), in_place=True),
    _OP("ThresholdedRelu", UNARY, FLOAT_TYPES, _thresholded_relu, (10, 22), precision="float32",
        attributes=(Attribute("alpha", 1.0),), in_place=True),
    _OP("SwiGLU", BINARY, FLOAT_TYPES, _swiglu, (28,), precision="float32", cost="transcendental",
        attributes=(Attribute("alpha", 1.0),)),
    _OP("Shrink", UNARY, _SHRINK_TYPES, _shrink, (9,), precision="float32",
        attributes=(Attribute("bias", 0.0), Attribute("lambd", 0.5))),
)
del _OP


class Hardmax(Softmax):
    """ONNX Hardmax (1, 11, 13): 1 at the first maximum along the axis, 0 elsewhere."""

    op_type: ClassVar[str] = "Hardmax"
    compiled = False

    @staticmethod
    def normalise(shifted: np.ndarray, axis: int) -> np.ndarray:
        first = np.argmax(shifted, axis=axis, keepdims=True)
        shape = [-1 if a == axis else 1 for a in range(shifted.ndim)]
        positions = np.arange(shifted.shape[axis]).reshape(shape)
        return (positions == first).astype(shifted.dtype)


# The rows' kernels: elementwise machinery without tuning keys (the portable threshold).
_CLASSES = {op.op_type: kernel_class(op) for op in OPS}


class SwiGLUKernel(_CLASSES["SwiGLU"]):  # type: ignore[misc, valid-type]
    """SwiGLU: A and B of one shape (the operator does not broadcast)."""

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        if len(inputs) == 2 and inputs[0] is not None and inputs[1] is not None \
                and inputs[0].shape != inputs[1].shape:
            raise self.ctx.error(f"A {list(inputs[0].shape)} and B {list(inputs[1].shape)} must "
                                 "have one shape")
        return super().run(*inputs)


_CLASSES["SwiGLU"] = SwiGLUKernel
# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    *(declare(cls, cls.op.versions, types=cls.op.types) for cls in _CLASSES.values()),
    declare(Hardmax, (1, 11, 13), types=FLOAT_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
