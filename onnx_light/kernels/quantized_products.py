"""Integer products: MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.

Integer operands minus their zero points are multiplied and summed exactly, wrapping modulo
2**32 where the spec allows accumulation to overflow: through float64 BLAS products where every
partial sum is an integer below 2**53 (so no rounding can happen; always the case for 8-bit
operands), else in int32 numpy arithmetic (:func:`exact_matmul`). The QLinear operators then
rescale the int32 sums by the combined scale ``a_scale * b_scale / y_scale`` (computed in the
scales' type, as the reference does) in float64, add the output zero point, round half to even
and saturate to the output type
(:func:`~onnx_light.kernels.quantization.requantize`). QLinearMatMul-21's float8 operands
hold no integers: they are shifted and summed in float64.

Convolutions use Conv's window geometry (:class:`~onnx_light.kernels.conv.WindowAttributes`,
:func:`~onnx_light.kernels.conv.pad_spatial`) and an im2col: padding holds the zero point,
so the shifted operand is padded with zeros.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..tuning.keys import ElementType as T
from .base import FLOAT8_TYPES, Kernel, NodeContext, numpy_dtype
from .declaration import KernelDeclaration, declare
from .quantization import quantized_type, requantize
from .window import WindowAttributes, pad_spatial

__all__ = ["DECLARATIONS", "exact_matmul", "integer_conv", "integer_matmul"]

Arrays = list[np.ndarray]
_BYTES = (T.INT8, T.UINT8)
_BYTES_AND_FLOAT8 = (*_BYTES, *FLOAT8_TYPES)  # QLinearMatMul-21


def _shifted(ctx: NodeContext, name: str, operand: np.ndarray, zero_point: np.ndarray | None,
             shape: Sequence[int] | None) -> np.ndarray:
    """``operand - zero_point`` in int32 (float64 for float8 operands, which hold no
    integers); ``zero_point`` (of the operand's type) is reshaped to ``shape`` unless it is a
    scalar."""
    exact = np.int32 if quantized_type(operand.dtype) in _BYTES else np.float64
    shifted = operand.astype(exact)
    if zero_point is None:
        return shifted
    if zero_point.dtype != operand.dtype:
        raise ctx.error(f"{name}'s type {zero_point.dtype} differs from its operand's {operand.dtype}")
    return shifted - _parameter(ctx, name, zero_point, shape).astype(exact)


def _parameter(ctx: NodeContext, name: str, value: np.ndarray, shape: Sequence[int] | None
               ) -> np.ndarray:
    """A scalar as it is, else ``value`` reshaped to ``shape`` (None: only scalars allowed)."""
    if value.size == 1 and value.ndim <= 1:
        return value.reshape(())
    if shape is None:
        raise ctx.error(f"{name} must be a scalar (per tensor), got shape {list(value.shape)}")
    if value.size == math.prod(shape) and (value.ndim == 1 or value.shape == tuple(shape)):
        return value.reshape(shape)
    raise ctx.error(f"{name} of shape {list(value.shape)} does not fit its operand: expected a "
                    f"scalar, {math.prod(shape)} values or shape {list(shape)}")


def _row_shape(a: np.ndarray, value: np.ndarray) -> tuple[int, ...]:
    """Per row of ``a``: a 1-D tensor of M values, or ``a``'s batch shape with (M, 1)."""
    rows = a.shape[-2] if a.ndim >= 2 else 1
    return (rows, 1) if value.ndim <= 1 else (*a.shape[:-1], 1)


def _column_shape(b: np.ndarray, value: np.ndarray) -> tuple[int, ...]:
    """Per column of ``b``: a 1-D tensor of N values, or ``b``'s batch shape with (1, N)."""
    return (b.shape[-1],) if value.ndim <= 1 or b.ndim < 2 else (*b.shape[:-2], 1, b.shape[-1])


def exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` of int32 operands as int32 (wrapping modulo 2**32), exactly.

    numpy's integer products have no BLAS (about 100x a float64 product); when the reduced
    length times the largest magnitudes stays below 2**53, every partial sum of a float64
    product is an integer float64 holds exactly, in any order of summation, so BLAS gives the
    exact sums."""
    if a.dtype != np.int32 or b.dtype != np.int32 or a.size == 0 or b.size == 0:
        return np.matmul(a, b)
    if int(np.abs(a).max()) * int(np.abs(b).max()) * a.shape[-1] >= 2**53:
        return np.matmul(a, b)
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64).astype(np.int32)


def integer_matmul(ctx: NodeContext, a: np.ndarray, b: np.ndarray, a_zero: np.ndarray | None,
                   b_zero: np.ndarray | None) -> np.ndarray:
    """``(a - a_zero) @ (b - b_zero)`` in int32, zero points per tensor, row (a) or column (b)."""
    a32 = _shifted(ctx, "a_zero_point", a, a_zero, None if a_zero is None else _row_shape(a, a_zero))
    b32 = _shifted(ctx, "b_zero_point", b, b_zero, None if b_zero is None else _column_shape(b, b_zero))
    try:
        return exact_matmul(a32, b32)
    except ValueError:
        raise ctx.error(f"cannot multiply shapes {list(a.shape)} and {list(b.shape)}") from None


class _IntegerProduct(Kernel):
    """A product whose cost is its multiply-adds: the output's elements times the reduced
    length, the product of the dimensions after the first of input ``reduced_input``
    (``reduced_axes`` of them, counted from the end)."""

    reduced_input: ClassVar[int] = 0
    reduced_axes: ClassVar[int | None] = 1

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        written = super().work(input_shapes, output_shapes)
        shape = input_shapes[self.reduced_input] if len(input_shapes) > self.reduced_input else None
        if written is None or not shape:
            return None
        return written * math.prod(shape[-self.reduced_axes:] if self.reduced_axes else shape[1:])


class _IntegerConv(_IntegerProduct):
    """What ConvInteger and QLinearConv share: the window attributes and the int32 product
    (each output element takes C/group x kernel size multiply-adds)."""

    reduced_input = 1
    reduced_axes = None

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.window_attributes = WindowAttributes.read(ctx)
        self.group = int(ctx.attribute("group", 1))
        if self.group < 1:
            raise ctx.error(f"group must be positive, got {self.group}")

    def convolve(self, x32: np.ndarray, w32: np.ndarray) -> np.ndarray:
        return integer_conv(self.ctx, self.window_attributes, self.group, x32, w32)

    def operands(self, x: np.ndarray, x_zero: np.ndarray | None, w: np.ndarray,
                 w_zero: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """``x - x_zero`` (per tensor) and ``w - w_zero`` (per tensor or output channel)."""
        if x.ndim < 3 or w.ndim != x.ndim:
            raise self.ctx.error(f"input of shape {list(x.shape)} and weights of shape "
                                 f"{list(w.shape)}: both need rank 3 or more, alike")
        channel = (w.shape[0],) + (1,) * (w.ndim - 1)
        return (_shifted(self.ctx, "x_zero_point", x, x_zero, None),
                _shifted(self.ctx, "w_zero_point", w, w_zero, channel))


def integer_conv(ctx: NodeContext, attributes: WindowAttributes, group: int, x32: np.ndarray,
                 w32: np.ndarray) -> np.ndarray:
    """The int32 convolution of shifted int32 operands (N, C, *spatial) and (M, C/group, *kernel)."""
    n, c = x32.shape[:2]
    m = w32.shape[0]
    if c != w32.shape[1] * group or m % group:
        raise ctx.error(f"input channels {c} and weights of shape {list(w32.shape)} do not "
                        f"match group {group}")
    window = attributes.window(ctx, x32.shape[2:], w32.shape[2:])
    padded = pad_spatial(x32, window)
    steps = padded.strides
    windows = as_strided(
        padded, shape=(n, c, *window.output, *window.kernel),
        strides=(steps[0], steps[1], *(s * t for s, t in zip(window.strides, steps[2:], strict=True)),
                 *(d * t for d, t in zip(window.dilations, steps[2:], strict=True))),
        writeable=False)
    rank = len(window.output)
    positions, depth = math.prod(window.output), c // group * math.prod(window.kernel)
    # (n, group, C/group, *out, *kernel) -> (n, group, *out, C/group, *kernel): one row per position
    grouped = windows.reshape(n, group, c // group, *window.output, *window.kernel)
    order = (0, 1, *range(3, 3 + rank), 2, *range(3 + rank, 3 + 2 * rank))
    columns = grouped.transpose(order).reshape(n, group, positions, depth)
    weights = w32.reshape(group, m // group, depth)
    product = exact_matmul(columns, weights.transpose(0, 2, 1))  # (n, group, positions, M/group)
    return np.ascontiguousarray(product.transpose(0, 1, 3, 2)).reshape(n, m, *window.output)


def _multiplier(ctx: NodeContext, scales: Sequence[tuple[str, np.ndarray, tuple[int, ...] | None]]
                ) -> np.ndarray:
    """``first * second / output`` in the scales' type, reshaped, as float64."""
    (a_name, a, a_shape), (b_name, b, b_shape), (y_name, y, y_shape) = scales
    if not a.dtype == b.dtype == y.dtype:
        raise ctx.error(f"the scales' types differ: {a.dtype}, {b.dtype}, {y.dtype}")
    combined = _parameter(ctx, a_name, a, a_shape) * _parameter(ctx, b_name, b, b_shape)
    return (combined / _parameter(ctx, y_name, y, y_shape)).astype(np.float64)


def _output(ctx: NodeContext, values: np.ndarray, y_zero: np.ndarray | None,
            operand: np.ndarray, allowed: tuple[int, ...] = _BYTES) -> np.ndarray:
    """Rescaled ``values`` plus the output zero point, rounded and saturated to its type
    (the first operand's type without one); ``allowed``: the output types the node takes."""
    if y_zero is None:
        return requantize(values, quantized_type(operand.dtype))
    target = quantized_type(y_zero.dtype)
    if target not in allowed:
        raise ctx.error(f"y_zero_point's type {y_zero.dtype} is not one of the output types "
                        f"{[str(numpy_dtype(t)) for t in allowed]}")
    return requantize(values + _parameter(ctx, "y_zero_point", y_zero, None).astype(np.float64), target)


class MatMulInteger(_IntegerProduct):
    """``(A - a_zero_point) @ (B - b_zero_point)`` as int32."""

    op_type = "MatMulInteger"

    def run(self, a: np.ndarray, b: np.ndarray, a_zero_point: np.ndarray | None = None,
            b_zero_point: np.ndarray | None = None) -> Arrays:
        return [integer_matmul(self.ctx, a, b, a_zero_point, b_zero_point)]


class ConvInteger(_IntegerConv):
    """Conv of ``x - x_zero_point`` and ``w - w_zero_point`` as int32."""

    op_type = "ConvInteger"

    def run(self, x: np.ndarray, w: np.ndarray, x_zero_point: np.ndarray | None = None,
            w_zero_point: np.ndarray | None = None) -> Arrays:
        return [self.convolve(*self.operands(x, x_zero_point, w, w_zero_point))]


class QLinearMatMul(_IntegerProduct):
    """The int32 product of two quantized matrices, requantized to the output's scale and
    zero point. From opset 21 the operands and output may be float8: their products are
    summed in float64 and the output cast, saturating."""

    op_type = "QLinearMatMul"

    def run(self, a: np.ndarray, a_scale: np.ndarray, a_zero_point: np.ndarray | None,
            b: np.ndarray, b_scale: np.ndarray, b_zero_point: np.ndarray | None,
            y_scale: np.ndarray, y_zero_point: np.ndarray | None = None) -> Arrays:
        for name, scale, zero in (("a", a_scale, a_zero_point), ("b", b_scale, b_zero_point)):
            if zero is not None and zero.size != scale.size:
                raise self.ctx.error(f"{name}_scale has {scale.size} values, {name}_zero_point "
                                     f"{zero.size}")
        product = integer_matmul(self.ctx, a, b, a_zero_point, b_zero_point)
        multiplier = _multiplier(self.ctx, (
            ("a_scale", a_scale, _row_shape(a, a_scale)), ("b_scale", b_scale, _column_shape(b, b_scale)),
            ("y_scale", y_scale, _column_shape(b, y_scale))))
        allowed = _BYTES_AND_FLOAT8 if self.ctx.opset >= 21 else _BYTES
        return [_output(self.ctx, product * multiplier, y_zero_point, a, allowed)]


class QLinearConv(_IntegerConv):
    """The int32 convolution of quantized input and weights (per-channel weight scales), plus
    the int32 bias, requantized to the output's scale and zero point."""

    op_type = "QLinearConv"
    reduced_input = 3

    def run(self, x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None,
            w: np.ndarray, w_scale: np.ndarray, w_zero_point: np.ndarray | None,
            y_scale: np.ndarray, y_zero_point: np.ndarray | None = None,
            bias: np.ndarray | None = None) -> Arrays:
        accumulated = self.convolve(*self.operands(x, x_zero_point, w, w_zero_point))
        channel = (1, w.shape[0]) + (1,) * (w.ndim - 2)
        if bias is not None:
            if bias.dtype != np.int32 or bias.shape != (w.shape[0],):
                raise self.ctx.error(f"the bias must be int32 of shape [{w.shape[0]}], got "
                                     f"{bias.dtype} of shape {list(bias.shape)}")
            accumulated += bias.reshape(channel)
        multiplier = _multiplier(self.ctx, (("x_scale", x_scale, None), ("w_scale", w_scale, channel),
                                            ("y_scale", y_scale, None)))
        return [_output(self.ctx, accumulated * multiplier, y_zero_point, x)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(MatMulInteger, (10,), types=_BYTES),
    declare(ConvInteger, (10,), types=_BYTES),
    declare(QLinearMatMul, (10, 21), types={10: _BYTES, 21: _BYTES_AND_FLOAT8}),
    declare(QLinearConv, (10,), types=_BYTES),
)
