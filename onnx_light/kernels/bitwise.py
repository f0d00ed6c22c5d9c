"""Bitwise kernels: BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot, BitShift and BitCast.

BitCast reinterprets each element's bits as another type of the same width (a numpy view;
the 4- and 2-bit types, one element per byte in ml_dtypes, keep only their low bits). The
others are rows of the elementwise machinery (:class:`~onnx_light.kernels.elementwise_op.ElementwiseOp`:
type checks, broadcasting, the parallel split) over numpy's integer ufuncs, with the portable
default threshold and no tuning keys of their own. numpy's shifts already give what ONNX
asks of shift amounts at or past the type's width, or negative: 0, and -1 for a negative
value shifted right (arithmetic shifts on signed types).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..tuning.keys import ELEMENT_TYPE_CODES, element_type_name
from ..tuning.keys import ElementType as T
from .base import INTEGER_TYPES, Kernel, NodeContext, numpy_dtype
from .declaration import KernelDeclaration, declare, dispatch_table
from .elementwise import kernel_class
from .elementwise_op import BINARY, UNARY, Attribute, ElementwiseOp

__all__ = ["KERNELS", "OPS", "BitCast"]

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

# The rows' kernels: elementwise machinery without tuning keys (the portable threshold).
_CLASSES = {op.op_type: kernel_class(op) for op in OPS}


_NARROW_BITS = {T.INT4: 4, T.UINT4: 4, T.FLOAT4E2M1: 4, T.INT2: 2, T.UINT2: 2}
_ELEMENT_TYPES = frozenset(ELEMENT_TYPE_CODES.values()) - {T.UNDEFINED, T.STRING}


def _bits(element_type: int) -> int:
    return _NARROW_BITS.get(element_type) or numpy_dtype(element_type).itemsize * 8


class BitCast(Kernel):
    """ONNX BitCast (26): the input's bits as element type ``to`` of the same bit width."""

    op_type: ClassVar[str] = "BitCast"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        to = ctx.attribute("to")
        if not isinstance(to, int) or to not in _ELEMENT_TYPES:
            raise ctx.error(f"attribute 'to' must be a non-string ONNX element type, got {to!r}")
        source = self.element_type
        if source == T.STRING:
            raise ctx.error("strings have no bit pattern to reinterpret")
        if source is not None and _bits(source) != _bits(to):
            raise ctx.error(f"cannot reinterpret {element_type_name(source)} ({_bits(source)} bits) as "
                            f"{element_type_name(to)} ({_bits(to)} bits)")
        self.to = to
        self.dtype = numpy_dtype(to)

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        if x.dtype.kind == "O" or x.dtype.itemsize != self.dtype.itemsize:
            raise self.ctx.error(f"cannot reinterpret {x.dtype} as {element_type_name(self.to)}")
        data = x.copy(order="C")  # the output never aliases the input
        if self.to in _NARROW_BITS:  # keep the low bits only
            data = data.view(np.uint8) & np.uint8((1 << _NARROW_BITS[self.to]) - 1)
        return [data.view(self.dtype)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    *(declare(cls, cls.op.versions, types=cls.op.types) for name, cls in _CLASSES.items()
      if name != "BitShift"),
    # BitShift: unsigned types only before opset 28.
    declare(_CLASSES["BitShift"], (11, 28), types={11: _UNSIGNED, 28: INTEGER_TYPES}),
    declare(BitCast, (26,)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
