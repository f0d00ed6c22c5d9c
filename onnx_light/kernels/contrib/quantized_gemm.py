"""onnxruntime's quantized products outside ONNX: QGemm (the QOperator format's Gemm),
MatMulIntegerToFloat and DynamicQuantizeMatMul (what onnxruntime fuses dynamically quantized
MatMuls into).

The integer sums are exact (:func:`~onnx_light.kernels.quantized_products.integer_matmul`:
int32, zero points per tensor or per column of B); the real result is
``sums * a_scale * b_scale`` in float32, QGemm's bias (int32 at that scale) added to the sums
first, and QGemm's is requantized to ``y_scale`` and ``y_zero_point`` when given
(:func:`~onnx_light.kernels.quantization.requantize`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ...tuning.keys import ElementType as T
from ..base import KernelError, NodeContext
from ..declaration import KernelDeclaration
from ..integer_gemm import ByteRows, PackedColumns, packed_layout, packed_product
from ..quantization import quantized_type, requantize
from ..quantized_products import integer_matmul
from .base import ContribKernel, ValueType, declare_contrib

__all__ = ["BYTES", "DECLARATIONS", "quantized_sums", "real_scale"]

Arrays = list[np.ndarray]
BYTES = (T.UINT8, T.INT8)


def _per_column(ctx: NodeContext, name: str, value: np.ndarray | None, columns: int
                ) -> np.ndarray | None:
    """A scale or zero point per tensor (a scalar) or per column of B (``columns`` values)."""
    if value is None or value.size == 1:
        return None if value is None else value.reshape(())
    if value.ndim == 1 and value.size == columns:
        return value
    raise ctx.error(f"{name} must be a scalar or hold one value per column of B ({columns}), "
                    f"got shape {list(value.shape)}")


def packed_columns(ctx: NodeContext, b: np.ndarray, b_zero: np.ndarray | None) -> PackedColumns | None:
    """B, a matrix of bytes, packed for :func:`quantized_sums`' integer product with its zero
    point (in the host's layout: :func:`~onnx_light.kernels.integer_gemm.packed_layout`);
    None where numpy's exact path takes it."""
    b_zero = _per_column(ctx, "b_zero_point", b_zero, b.shape[-1])
    if (quantized_type(b.dtype) not in BYTES or b.ndim != 2 or b.size == 0
            or (b_zero is not None and b_zero.dtype != b.dtype)):
        return None
    return PackedColumns.of(np.ascontiguousarray(b), 0 if b_zero is None else b_zero.astype(np.int32),
                            layout=packed_layout("auto"))


def quantized_sums(ctx: NodeContext, a: np.ndarray, a_zero: np.ndarray | None, b: np.ndarray,
                   b_zero: np.ndarray | None, columns: PackedColumns | None = None) -> np.ndarray:
    """``(a - a_zero) @ (b - b_zero)`` as int32 (bytes; A's zero point per tensor, B's per
    tensor or per column). A matrix B takes the packed integer product
    (:func:`~onnx_light.kernels.integer_gemm.packed_product`): ``columns``, B packed at
    construction (:meth:`PackedProduct.specialize`), or packed for this call; the rest
    numpy's exact path."""
    for name, operand in (("A", a), ("B", b)):
        if quantized_type(operand.dtype) not in BYTES:
            raise ctx.error(f"{name} must be uint8 or int8, got {operand.dtype}")
    if a_zero is not None and a_zero.size != 1:
        raise ctx.error(f"a_zero_point must be a scalar, got shape {list(a_zero.shape)}")
    if b.ndim < 1 or a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise ctx.error(f"cannot multiply shapes {list(a.shape)} and {list(b.shape)}")
    b_zero = _per_column(ctx, "b_zero_point", b_zero, b.shape[-1])
    if b.ndim != 2 or a.ndim < 2 or a.size == 0 or b.size == 0 or \
            (b_zero is not None and b_zero.dtype != b.dtype):
        return integer_matmul(ctx, a, b, a_zero, b_zero)
    if columns is None:
        columns = PackedColumns.of(np.ascontiguousarray(b), 0 if b_zero is None else b_zero.astype(np.int32),
                                   layout=packed_layout("auto"))
    left = ByteRows(a.reshape(-1, a.shape[-1]), 0 if a_zero is None else int(a_zero.reshape(())))
    return packed_product(left, columns).reshape(*a.shape[:-1], b.shape[1])


def real_scale(ctx: NodeContext, a_scale: np.ndarray, b_scale: np.ndarray, columns: int) -> np.ndarray:
    """``a_scale * b_scale`` in float32: A's per tensor, B's per tensor or per column."""
    if a_scale.size != 1:
        raise ctx.error(f"a_scale must be a scalar, got shape {list(a_scale.shape)}")
    return (a_scale.reshape(()).astype(np.float32)
            * _per_column(ctx, "b_scale", b_scale, columns).astype(np.float32))


class PackedProduct(ContribKernel):
    """A kernel whose B, a constant in practice, is packed for the integer product once, at
    construction (:meth:`specialize`); runs only read it."""

    b_inputs: ClassVar[tuple[int, int]]  # positions of B and its zero point

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        # the constant B and zero point, and B (as the product takes it) packed
        self.packed: tuple[np.ndarray, np.ndarray | None, PackedColumns] | None = None

    def specialize(self, constants: Sequence[np.ndarray | None]) -> PackedProduct | None:
        b, b_zero = (constants[i] if i < len(constants) else None for i in self.b_inputs)
        fed_zero = b_zero is None and self.b_inputs[1] < self.ctx.num_inputs and \
            self.ctx.input_types[self.b_inputs[1]]
        if b is None or b.ndim != 2 or fed_zero:
            return None
        try:
            columns = packed_columns(self.ctx, self.operand(b), b_zero)
        except KernelError:  # a bad zero point: the run reports it
            return None
        return None if columns is None else self.variant(packed=(b, b_zero, columns))

    def operand(self, b: np.ndarray) -> np.ndarray:
        """B as the product takes it."""
        return b

    def columns(self, b: np.ndarray, b_zero: np.ndarray | None) -> PackedColumns | None:
        """The packed B of :meth:`specialize` when ``b`` and ``b_zero`` are its arrays."""
        packed = self.packed
        return packed[2] if packed is not None and packed[0] is b and packed[1] is b_zero else None


class QGemm(PackedProduct):
    """``alpha * (A' - a_zero) @ (B' - b_zero)`` plus the int32 bias C, at scale
    ``a_scale * b_scale`` (A', B': transposed with transA, transB); requantized to ``y_scale``
    and ``y_zero_point`` when given, float32 otherwise."""

    op_type = "QGemm"
    b_inputs = (3, 5)

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.alpha = np.float32(ctx.attribute("alpha", 1.0))
        self.trans_a = bool(ctx.attribute("transA", 0))
        self.trans_b = bool(ctx.attribute("transB", 0))

    def operand(self, b: np.ndarray) -> np.ndarray:
        return b.T if self.trans_b else b

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        a, b = inputs[0], inputs[3] if len(inputs) > 3 else None
        shape = None
        if a is not None and b is not None and a[1] is not None and b[1] is not None \
                and len(a[1]) == 2 and len(b[1]) == 2:
            shape = (a[1][1 if attributes.get("transA", 0) else 0],
                     b[1][0 if attributes.get("transB", 0) else 1])
        quantized = len(inputs) > 7 and inputs[7] is not None
        if quantized:
            zero = inputs[8] if len(inputs) > 8 else None
            element_type = (zero or a or (None,))[0]
        else:
            element_type = T.FLOAT
        return [None if element_type is None else (element_type, shape)]

    def run(self, a: np.ndarray, a_scale: np.ndarray, a_zero_point: np.ndarray | None,
            b: np.ndarray, b_scale: np.ndarray, b_zero_point: np.ndarray | None,
            c: np.ndarray | None = None, y_scale: np.ndarray | None = None,
            y_zero_point: np.ndarray | None = None) -> Arrays:
        if a.ndim != 2 or b.ndim != 2:
            raise self.ctx.error(f"A and B must be matrices, got shapes {list(a.shape)} and {list(b.shape)}")
        columns = self.columns(b, b_zero_point)
        a = a.T if self.trans_a else a
        b = self.operand(b)
        sums = quantized_sums(self.ctx, a, a_zero_point, b, b_zero_point, columns)
        if c is not None:
            if c.dtype != np.int32:
                raise self.ctx.error(f"C must be int32, got {c.dtype}")
            try:
                sums = sums + c
            except ValueError:
                raise self.ctx.error(f"C of shape {list(c.shape)} does not broadcast to the "
                                     f"output's {list(sums.shape)}") from None
        real = sums.astype(np.float32) * (real_scale(self.ctx, a_scale, b_scale, b.shape[1]) * self.alpha)
        if y_scale is None:
            return [real]
        if y_scale.size != 1 or (y_zero_point is not None and y_zero_point.size != 1):
            raise self.ctx.error("y_scale and y_zero_point must be scalars")
        target = quantized_type(a.dtype if y_zero_point is None else y_zero_point.dtype)
        if target not in BYTES:
            raise self.ctx.error(f"y_zero_point must be uint8 or int8, got {y_zero_point.dtype}")
        return [requantize(real / y_scale.reshape(()).astype(np.float32), target,
                           zero_point=None if y_zero_point is None else y_zero_point.reshape(()))]


class MatMulIntegerToFloat(PackedProduct):
    """``(A - a_zero) @ (B - b_zero) * a_scale * b_scale + bias``, float; A, B and their zero
    points as MatMulInteger takes them (B's scale and zero point per tensor or per column)."""

    op_type = "MatMulIntegerToFloat"
    b_inputs = (1, 5)

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        scale = inputs[2] if len(inputs) > 2 else None
        return [None if scale is None else (scale[0], None)]

    def run(self, a: np.ndarray, b: np.ndarray, a_scale: np.ndarray, b_scale: np.ndarray,
            a_zero_point: np.ndarray | None = None, b_zero_point: np.ndarray | None = None,
            bias: np.ndarray | None = None) -> Arrays:
        sums = quantized_sums(self.ctx, a, a_zero_point, b, b_zero_point, self.columns(b, b_zero_point))
        real = sums.astype(np.float32) * real_scale(self.ctx, a_scale, b_scale, b.shape[-1])
        return [(real if bias is None else real + bias).astype(a_scale.dtype, copy=False)]


class DynamicQuantizeMatMul(PackedProduct):
    """A (float) quantized to uint8 as DynamicQuantizeLinear does, then
    :class:`MatMulIntegerToFloat` with B and its scale and zero point."""

    op_type = "DynamicQuantizeMatMul"
    b_inputs = (1, 3)

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        first = inputs[0]
        return [None if first is None else (first[0], None)]

    def run(self, a: np.ndarray, b: np.ndarray, b_scale: np.ndarray,
            b_zero_point: np.ndarray | None = None, bias: np.ndarray | None = None) -> Arrays:
        real = a.astype(np.float32)
        low = min(float(real.min(initial=0.0)), 0.0)
        high = max(float(real.max(initial=0.0)), 0.0)
        scale = np.float32((high - low) / 255) if high > low else np.float32(1.0)
        zero = np.uint8(np.clip(np.rint(-low / scale), 0, 255))
        quantized = requantize(real / scale, T.UINT8, zero_point=np.asarray(zero))
        sums = quantized_sums(self.ctx, quantized, np.asarray(zero), b, b_zero_point,
                              self.columns(b, b_zero_point))
        result = sums.astype(np.float32) * real_scale(self.ctx, np.asarray(scale), b_scale, b.shape[-1])
        return [(result if bias is None else result + bias).astype(a.dtype, copy=False)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare_contrib(QGemm, BYTES), declare_contrib(MatMulIntegerToFloat, BYTES),
    declare_contrib(DynamicQuantizeMatMul, (T.FLOAT,)),
)
