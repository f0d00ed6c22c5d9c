"""Bitwise kernels: BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot and BitShift.

Rows of the elementwise machinery (:class:`~onnx_light.kernels.elementwise.ElementwiseOp`:
type checks, broadcasting, the parallel split) over numpy's integer ufuncs, with the portable
default threshold and no tuning keys of their own. numpy's shifts already give what ONNX
asks of shift amounts at or past the type's width, or negative: 0, and -1 for a negative
value shifted right (arithmetic shifts on signed types).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as T

from .activations import _untuned_class
from .base import INTEGER_TYPES, Kernel, NodeContext, check_element_type
from .elementwise import BINARY, UNARY, Attribute, ElementwiseOp

__all__ = ["KERNELS", "OPS"]

_UNSIGNED = (T.UINT8, T.UINT16, T.UINT32, T.UINT64)


def _bit_shift(x: np.ndarray, y: np.ndarray, *, out: np.ndarray, direction: str) -> None:
    (np.left_shift if direction == "LEFT" else np.right_shift)(x, y, out=out, casting="unsafe")


_OP = ElementwiseOp
OPS: tuple[ElementwiseOp, ...] = (
    _OP("BitwiseAnd", BINARY, INTEGER_TYPES, np.bitwise_and, (18,), warns="never"),
    _OP("BitwiseOr", BINARY, INTEGER_TYPES, np.bitwise_or, (18,), warns="never"),
    _OP("BitwiseXor", BINARY, INTEGER_TYPES, np.bitwise_xor, (18,), warns="never"),
    _OP("BitwiseNot", UNARY, INTEGER_TYPES, np.invert, (18,), warns="never"),
    _OP("BitShift", BINARY, INTEGER_TYPES, _bit_shift, (11, 28), warns="never",
        attributes=(Attribute("direction", "", ("LEFT", "RIGHT")),)),
)
del _OP

KERNELS: dict[str, dict[int, type[Kernel]]] = {
    op.op_type: dict.fromkeys(op.versions, _untuned_class(op)) for op in OPS
}


class BitShiftKernel(KERNELS["BitShift"][11]):  # type: ignore[misc, valid-type]
    """BitShift: unsigned types only before opset 28."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        check_element_type(ctx, self.element_type, {11: _UNSIGNED, 28: INTEGER_TYPES})


KERNELS["BitShift"] = dict.fromkeys((11, 28), BitShiftKernel)
