"""Integer products: MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.

Byte operands (uint8, int8) run through the tunable integer product of
:mod:`~onnx_light.kernels.integer_gemm`: exact int32 sums of the operands minus their zero
points (per tensor, per row of A, per column of B, per output channel of W), wrapping modulo
2**32 as the spec allows. The QLinear operators requantize each finished block as onnxruntime
does: ``float32(acc + bias) * multiplier`` in float32, the multiplier
``a_scale * b_scale / y_scale`` computed in the scales' type, rounded half to even, plus the
output zero point, saturated to the output type. onnx's reference rescales in float64 instead,
so the two can differ by one step where the float32 product rounds across a half.

Convolutions use Conv's window geometry (:class:`~onnx_light.kernels.window.WindowAttributes`,
:func:`~onnx_light.kernels.window.pad_spatial`) and an im2col of the raw bytes: padding holds
the input's zero point, so padded positions add nothing once it is subtracted. The weights
are the left operand (one row per output channel), the windows the right one, so the product
comes out channel-major, as the output is laid out. That is the ``compiled`` algorithm's
path; depthwise (1-D, 2-D) and pointwise (1x1, stride 1, no padding) convolutions run
compiled loops of :mod:`~onnx_light.kernels.integer_loops` instead, and the others with the
``blas`` algorithm an exact float32 product of a channel-major im2col of the shifted input
(:meth:`_ConvProduct.real_columns`); all requantize as they write.

What the product does not take runs through :func:`integer_matmul` (numpy, exact): zero points
or scales with a batch shape, 1-D operands, and QLinearMatMul-21's float8 operands, which hold
no integers and are shifted and summed in float64.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from ..tuning.keys import ElementType as T
from .base import FLOAT8_TYPES, Kernel, KernelError, NodeContext, numpy_dtype
from .conv.depthwise import plane_layout, read_only
from .declaration import KernelDeclaration, declare
from .integer_gemm import (
    PACKED_ALGORITHMS,
    ByteRows,
    Epilogue,
    IntegerProductKernel,
    PackedColumns,
    PackedPlan,
    Residual,
    calibrate_integer_product,
    integer_parameters,
    short_sums,
)
from .integer_loops import (
    EXACT_CHANNELS,
    POINTWISE_BLOCK,
    add_residual,
    depthwise_sums,
    finish_sums,
    pack_windows,
    pad_planes,
    pointwise_sums,
)
from .integer_loops import requantize as requantize_block
from .quantization import INTEGER_RANGES, quantized_type, requantize
from .window import Window, WindowAttributes, pad_spatial

__all__ = ["DECLARATIONS", "add_whole", "exact_matmul", "integer_matmul"]

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


_BYTE_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8))
#: A requantized output: ``y``, the multiplier per output channel, the zero point, the range.
Requantization = tuple[np.ndarray, np.ndarray, int, int, int]


def _bytes(array: np.ndarray | None) -> bool:
    return array is not None and array.dtype in _BYTE_DTYPES


def _vector(value: np.ndarray | None, size: int) -> np.ndarray | None:
    """A zero point or scale as ``size`` values (a scalar repeated), or None when it has
    another shape (the numpy path takes it)."""
    if value is None:
        return np.zeros(size, np.int32)
    if value.size == 1 and value.ndim <= 1:
        return np.full(size, value.reshape(())[()])
    if value.ndim == 1 and value.size == size:
        return value
    return None


class _IntegerProduct(IntegerProductKernel):
    """A product whose cost is its multiply-adds: the output's elements times the reduced
    length, the product of the dimensions after the first of input ``reduced_input``
    (``reduced_axes`` of them, counted from the end)."""

    reduced_input: ClassVar[int] = 0
    reduced_axes: ClassVar[int | None] = 1
    # output_range's answer for the constant zero point and operand type it was made of (a
    # run of a small convolution is mostly such checks), held at construction (hold_range)
    _range: tuple[Any, np.dtype, tuple[np.dtype, int, int, int]] | None = None

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        written = super().work(input_shapes, output_shapes)
        shape = input_shapes[self.reduced_input] if len(input_shapes) > self.reduced_input else None
        if written is None or not shape:
            return None
        return written * math.prod(shape[-self.reduced_axes:] if self.reduced_axes else shape[1:])

    def output_range(self, zero: np.ndarray | None, operand: np.ndarray,
                     allowed: tuple[int, ...] = _BYTES) -> tuple[np.dtype, int, int, int]:
        """The output's dtype, zero point and saturation range: the zero point's type (the
        first operand's without one); the held one for the same zero point (the same array)."""
        held = self._range
        if held is not None and held[0] is zero and held[1] is operand.dtype:
            return held[2]
        if zero is None:
            target = quantized_type(operand.dtype)
        else:
            target = quantized_type(zero.dtype)
            if target not in allowed:
                raise self.ctx.error(f"y_zero_point's type {zero.dtype} is not one of the output "
                                     f"types {[str(numpy_dtype(t)) for t in allowed]}")
            if zero.size != 1:
                raise self.ctx.error(f"y_zero_point must be a scalar (per tensor), got shape "
                                     f"{list(zero.shape)}")
        low, high = INTEGER_RANGES[target]
        value = 0 if zero is None else int(zero.reshape(-1)[0])
        return numpy_dtype(target), value, low, high

    def hold_range(self, zero: np.ndarray | None, operand: np.dtype) -> None:
        """Hold :meth:`output_range`'s answer for this constant zero point (None: absent) and
        operand type, at construction (a bad zero point: the run reports it)."""
        with contextlib.suppress(KernelError):
            self._range = (zero, operand, self.output_range(zero, np.empty(0, operand)))

    def requantizing(self, out: np.ndarray, multiplier: np.ndarray, zero: int, low: int,
                     high: int) -> Epilogue:
        """The epilogue writing each block of sums requantized into ``out`` (rows, columns)."""
        run = requantize_block.dispatcher

        def epilogue(acc: np.ndarray, r0: int, r1: int, c0: int, c1: int) -> None:
            run(acc, r0, r1, c0, c1, multiplier, zero, low, high, out)

        return epilogue

    def warm_up(self, left: np.dtype, right: np.dtype, output: np.dtype | None,
                swapped: bool = False) -> None:
        """Compile the loops the runs will call (at session construction)."""
        self.compile_for(left, right, output, swapped)
        if output is not None:
            requantize_block(np.zeros((1, 1), np.int32), 0, 1, 0, 1, np.ones((1, 1), np.float32),
                             0, 0, 1, np.zeros((1, 1), output))


def _multiplier(ctx: NodeContext, scales: Sequence[tuple[str, np.ndarray, tuple[int, ...] | None]]
                ) -> np.ndarray:
    """``first * second / output`` in the scales' type, reshaped, as float32."""
    (a_name, a, a_shape), (b_name, b, b_shape), (y_name, y, y_shape) = scales
    if not a.dtype == b.dtype == y.dtype:
        raise ctx.error(f"the scales' types differ: {a.dtype}, {b.dtype}, {y.dtype}")
    combined = _parameter(ctx, a_name, a, a_shape) * _parameter(ctx, b_name, b, b_shape)
    return (combined / _parameter(ctx, y_name, y, y_shape)).astype(np.float32)


class _MatMulProduct(_IntegerProduct):
    """What MatMulInteger and QLinearMatMul share: A (..., M, K) times B (..., K, N), B's
    rows packed once when B and its zero point are constants."""

    a_inputs: ClassVar[tuple[int, int]]  # positions of A and its zero point
    b_inputs: ClassVar[tuple[int, int]]

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.packed: tuple[np.ndarray, np.ndarray | None, ByteRows] | None = None

    def specialize(self, constants: Sequence[np.ndarray | None]) -> _MatMulProduct | None:
        b, b_zero = (constants[i] if i < len(constants) else None for i in self.b_inputs)
        left = self.ctx.input_types[self.a_inputs[0]] if self.ctx.input_types else None
        if not _bytes(b) or left not in _BYTES:
            return None
        self.warm_up(numpy_dtype(left), b.dtype, self.output_dtype(constants))
        has_zero = self.b_inputs[1] < self.ctx.num_inputs and self.ctx.input_types[self.b_inputs[1]]
        if b.ndim != 2 or (has_zero and b_zero is None):
            return None
        zero = _vector(b_zero, b.shape[1])
        if zero is None or (b_zero is not None and b_zero.dtype != b.dtype):
            return None
        return self.variant(packed=(b, b_zero, ByteRows(b.T, zero)))

    def output_dtype(self, constants: Sequence[np.ndarray | None]) -> np.dtype | None:
        """The requantized output's type (None: an int32 product)."""
        return None

    def rows(self, a: np.ndarray, a_zero: np.ndarray | None, b: np.ndarray,
             b_zero: np.ndarray | None) -> tuple[list[tuple[ByteRows, ByteRows]], tuple[int, ...]] | None:
        """The products as pairs of byte rows, and the output's batch shape, when the product
        takes them: both operands of byte types and 2-D or more, zero points per tensor, per
        row of A or per column of B. A 2-D B makes one product, A's batch folded into its
        rows; a batched B one product per batch entry (broadcast)."""
        if not (_bytes(a) and _bytes(b)) or a.ndim < 2 or b.ndim < 2:
            return None
        for name, zero, operand in (("a", a_zero, a), ("b", b_zero, b)):
            if zero is not None and zero.dtype != operand.dtype:
                raise self.ctx.error(f"{name}_zero_point's type {zero.dtype} differs from its "
                                     f"operand's {operand.dtype}")
        if a.shape[-1] != b.shape[-2]:
            raise self.ctx.error(f"cannot multiply shapes {list(a.shape)} and {list(b.shape)}")
        row_zero, column_zero = _vector(a_zero, a.shape[-2]), _vector(b_zero, b.shape[-1])
        if row_zero is None or column_zero is None:
            return None
        if b.ndim == 2:
            batch = a.shape[:-2]
            left = ByteRows(a.reshape(-1, a.shape[-1]), np.tile(row_zero, math.prod(batch)))
            packed = self.packed
            if packed is not None and packed[0] is b and packed[1] is b_zero:
                return [(left, packed[2])], batch
            return [(left, ByteRows(b.T, column_zero))], batch
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise self.ctx.error(f"cannot multiply shapes {list(a.shape)} and {list(b.shape)}") from None
        a_all = np.broadcast_to(a, (*batch, *a.shape[-2:]))
        b_all = np.broadcast_to(b, (*batch, *b.shape[-2:]))
        return [(ByteRows(a_all[index], row_zero), ByteRows(b_all[index].T, column_zero))
                for index in np.ndindex(*batch)], batch


class MatMulInteger(_MatMulProduct):
    """``(A - a_zero_point) @ (B - b_zero_point)`` as int32."""

    op_type = "MatMulInteger"
    a_inputs = (0, 2)
    b_inputs = (1, 3)

    def run(self, a: np.ndarray, b: np.ndarray, a_zero_point: np.ndarray | None = None,
            b_zero_point: np.ndarray | None = None) -> Arrays:
        operands = self.rows(a, a_zero_point, b, b_zero_point)
        if operands is None:
            return [integer_matmul(self.ctx, a, b, a_zero_point, b_zero_point)]
        pairs, batch = operands
        if len(pairs) == 1:
            return [self.product(*pairs[0]).reshape(*batch, a.shape[-2], b.shape[-1])]
        y = np.empty((len(pairs), a.shape[-2], b.shape[-1]), np.int32)
        for index, (left, right) in enumerate(pairs):
            y[index] = self.product(left, right)
        return [y.reshape(*batch, a.shape[-2], b.shape[-1])]


def _requantized_output_dtype(kernel: Kernel, constants: Sequence[np.ndarray | None]) -> np.dtype | None:
    """The output type of a requantizing product (QLinearMatMul, QLinearConv): the output zero
    point's (input 7) when it is a constant, else the first input's; None unless a byte type."""
    zero = constants[7] if len(constants) > 7 else None
    if zero is not None:
        return zero.dtype if _bytes(zero) else None
    first = kernel.ctx.input_types[0] if kernel.ctx.input_types else None
    return numpy_dtype(first) if first in _BYTES else None


class QLinearMatMul(_MatMulProduct):
    """The int32 product of two quantized matrices, requantized to the output's scale and
    zero point. From opset 21 the operands and output may be float8: their products are
    summed in float64 and the output cast, saturating."""

    op_type = "QLinearMatMul"
    a_inputs = (0, 2)
    b_inputs = (3, 5)

    output_dtype = _requantized_output_dtype

    def specialize(self, constants: Sequence[np.ndarray | None]) -> QLinearMatMul | None:
        chosen = super().specialize(constants)
        zero = constants[7] if len(constants) > 7 else None
        fed = zero is None and self.ctx.num_inputs > 7 and self.ctx.input_types[7]
        if chosen is not None and not fed:
            chosen.hold_range(zero, numpy_dtype(self.ctx.input_types[0]))
        return chosen

    def run(self, a: np.ndarray, a_scale: np.ndarray, a_zero_point: np.ndarray | None,
            b: np.ndarray, b_scale: np.ndarray, b_zero_point: np.ndarray | None,
            y_scale: np.ndarray, y_zero_point: np.ndarray | None = None) -> Arrays:
        for name, scale, zero in (("a", a_scale, a_zero_point), ("b", b_scale, b_zero_point)):
            if zero is not None and zero.size != scale.size:
                raise self.ctx.error(f"{name}_scale has {scale.size} values, {name}_zero_point "
                                     f"{zero.size}")
        multiplier = _multiplier(self.ctx, (
            ("a_scale", a_scale, _row_shape(a, a_scale)), ("b_scale", b_scale, _column_shape(b, b_scale)),
            ("y_scale", y_scale, _column_shape(b, y_scale))))
        operands = self.rows(a, a_zero_point, b, b_zero_point)
        if operands is None or multiplier.ndim > 2 or (y_zero_point is not None and not _bytes(y_zero_point)):
            product = integer_matmul(self.ctx, a, b, a_zero_point, b_zero_point)
            allowed = _BYTES_AND_FLOAT8 if self.ctx.opset >= 21 else _BYTES
            return [_output(self.ctx, product, multiplier, y_zero_point, a, allowed)]
        pairs, batch = operands
        dtype, zero, low, high = self.output_range(y_zero_point, a)
        m, n = a.shape[-2], b.shape[-1]
        rows = pairs[0][0].data.shape[0]  # M, or M times A's batch folded in
        multiplier = multiplier.reshape((1,) * (2 - multiplier.ndim) + multiplier.shape)
        if multiplier.shape[0] > 1:  # per row of A: the same rows in every batch entry
            multiplier = np.ascontiguousarray(np.tile(multiplier, (rows // m, 1)))
        y = np.empty((len(pairs), rows, n), dtype)
        for index, (left, right) in enumerate(pairs):
            self.product(left, right, requantization=(y[index], multiplier, zero, low, high))
        return [y.reshape(*batch, m, n)]


def _output(ctx: NodeContext, product: np.ndarray, multiplier: np.ndarray, y_zero: np.ndarray | None,
            operand: np.ndarray, allowed: tuple[int, ...]) -> np.ndarray:
    """The numpy path's requantization: float32 rescaling (float64 for float8 operands, whose
    sums are float64), plus the output zero point, rounded and saturated to its type."""
    if product.dtype == np.float64:  # float8 operands: float64 sums
        values = product * multiplier.astype(np.float64)
    else:
        values = product.astype(np.float32) * multiplier
    if y_zero is None:
        return requantize(values, quantized_type(operand.dtype))
    target = quantized_type(y_zero.dtype)
    if target not in allowed:
        raise ctx.error(f"y_zero_point's type {y_zero.dtype} is not one of the output types "
                        f"{[str(numpy_dtype(t)) for t in allowed]}")
    return requantize(values + _parameter(ctx, "y_zero_point", y_zero, None).astype(values.dtype), target)


class _WindowPlan(NamedTuple):
    """A packed convolution's setup for one input shape (:meth:`_ConvProduct.window_plan`):
    the weights, bias and multipliers it was made of (checked by identity at each run), the
    packing geometry (kernel, strides, dilations), the reduced length, each group's product
    and output channels, whether the packing splits across the pool, and the windows'
    packed layout."""

    weights: list[ByteRows]
    bias: np.ndarray | None
    scales: np.ndarray | None
    geometry: tuple[int, ...]
    depth: int
    groups: tuple[tuple[PackedPlan, slice], ...]
    parallel: bool
    layout: str


class _DepthwisePlan(NamedTuple):
    """A depthwise convolution's setup for one input shape (:meth:`_ConvProduct.depthwise_plan`):
    the weights, zero point, bias and multipliers it was made of (checked by identity at each
    run), the shapes of the input planes and of the output, the shifted weights, the bias,
    the plane geometry (strides, pads, phases, rows, columns), the multipliers (read-only) and
    whether the (image, channel) pairs split across the pool."""

    weights: np.ndarray
    zero: np.ndarray | None
    bias: np.ndarray | None
    scales: np.ndarray | None
    images: tuple[int, ...]
    target: tuple[int, ...]
    taps: np.ndarray
    sums: np.ndarray
    geometry: tuple[Any, ...]
    multipliers: np.ndarray
    parallel: bool


class _ConvProduct(_IntegerProduct):
    """What ConvInteger and QLinearConv share: the window attributes and the int32
    convolution (each output element takes C/group x kernel size multiply-adds), the
    weights' rows packed once when they and their zero point are constants."""

    reduced_input = 1
    reduced_axes = None
    w_inputs: ClassVar[tuple[int, int]]  # positions of W and its zero point

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.window_attributes = WindowAttributes.read(ctx)
        self.group = int(ctx.attribute("group", 1))
        if self.group < 1:
            raise ctx.error(f"group must be positive, got {self.group}")
        self.packed: tuple[np.ndarray, np.ndarray | None, list[ByteRows]] | None = None
        # the constant inputs by position (None where fed), held by :meth:`specialize`
        self.constants: tuple[np.ndarray | None, ...] | None = None
        # for the settled input shape (:meth:`settle`), made at construction and only read by
        # runs: its window geometry and its depthwise or packed convolution's setup; runs of
        # other shapes make theirs per call, unkept, so that concurrent runs share no state
        self.windows: dict[tuple[tuple[int, ...], tuple[int, ...]], Window] = {}
        self.depthwise_plans: dict[tuple[Any, ...], _DepthwisePlan] = {}
        self.window_plans: dict[tuple[Any, ...], _WindowPlan] = {}

    def window(self, spatial: tuple[int, ...], kernel: tuple[int, ...]) -> Window:
        """The window geometry of an input and kernel shape: the settled one's, or made."""
        window = self.windows.get((spatial, kernel))
        return self.window_attributes.window(self.ctx, spatial, kernel) if window is None else window

    def specialize(self, constants: Sequence[np.ndarray | None]) -> _ConvProduct | None:
        w, w_zero = (constants[i] if i < len(constants) else None for i in self.w_inputs)
        x = self.ctx.input_types[0] if self.ctx.input_types else None
        if not _bytes(w) or x not in _BYTES or w.ndim < 3:
            return None
        self.warm_up(w.dtype, numpy_dtype(x), self.output_dtype(constants),
                     swapped=w.shape[0] >= SWAPPED_POSITIONS)
        if w.shape[1] == 1 and self.group == w.shape[0] > 1 and w.ndim <= 4:
            compile_depthwise(numpy_dtype(x), w.shape[-1], w[0].size, self.output_dtype(constants))
        if self.algorithm in PACKED_ALGORITHMS and w.ndim <= 4:
            compile_pack_windows(numpy_dtype(x))
            if self.layout == "pairs" and short_sums(ByteRows(w.reshape(w.shape[0], -1), 0), numpy_dtype(x)):
                self.compile_short(self.output_dtype(constants), swapped=w.shape[0] >= SWAPPED_POSITIONS)
        elif self.group == 1 and math.prod(w.shape[2:]) == 1:
            compile_pointwise(numpy_dtype(x), self.output_dtype(constants))
        if self.algorithm not in PACKED_ALGORITHMS or w.ndim > 4:
            compile_finish(self.output_dtype(constants), w[0].size)
        has_zero = self.w_inputs[1] < self.ctx.num_inputs and self.ctx.input_types[self.w_inputs[1]]
        if has_zero and w_zero is None:
            return None
        try:
            return self.variant(packed=(w, w_zero, self.weight_rows(w, w_zero)), constants=tuple(constants))
        except KernelError:  # a bad zero point: the run reports it
            return None

    def settle(self, input_shapes: Sequence[tuple[int, ...] | None]) -> _ConvProduct | None:
        """A kernel holding, for X of the inferred shape and the constant inputs
        :meth:`specialize` held, the window geometry and the depthwise or packed-windows
        convolution's plan (the weights' packing included), which runs of that shape read
        instead of making them."""
        shape = input_shapes[0] if input_shapes else None
        constants, packed = self.constants, self.packed
        if shape is None or constants is None or packed is None or len(shape) not in (3, 4):
            return None
        w, w_zero, weights = packed
        x_zero = constants[2] if len(constants) > 2 else None
        if len(shape) != w.ndim or shape[1] != w.shape[1] * self.group or (
                x_zero is None and self.ctx.num_inputs > 2 and self.ctx.input_types[2]):
            return None
        # X stands in by its shape and type: the plans read nothing else of it
        x = np.broadcast_to(np.zeros((), numpy_dtype(self.ctx.input_types[0])), tuple(shape))
        settled = self.variant(windows={}, depthwise_plans={}, window_plans={})
        try:
            requantization = settled.settled_requantization(x)
            if not settled.settle_plans(x, x_zero, w, w_zero, weights, requantization):
                return None
        except KernelError:  # bad constants: the run reports them
            return None
        return settled

    def settled_requantization(self, x: np.ndarray) -> Requantization | None:
        """The requantization of a run on ``x`` (its output an empty stand-in), from the
        constants: None for int32 sums."""
        return None

    def settle_plans(self, x: np.ndarray, x_zero: np.ndarray | None, w: np.ndarray,
                     w_zero: np.ndarray | None, weights: list[ByteRows],
                     requantization: Requantization | None) -> bool:
        """:meth:`settle`'s plans, made as :meth:`convolve`'s first run would for ``x`` (a
        stand-in); False when the constants do not fit (the run reports it)."""
        if x_zero is not None and (x_zero.dtype != x.dtype or x_zero.size != 1):
            return False
        bias = self.constants[8] if len(self.constants) > 8 else None  # QLinearConv's (ConvInteger: none)
        if bias is not None and (bias.dtype != np.int32 or bias.shape != (w.shape[0],)):
            return False
        window = self.windows[(x.shape[2:], w.shape[2:])] = self.window_attributes.window(
            self.ctx, x.shape[2:], w.shape[2:])
        zero = 0 if x_zero is None else int(x_zero.reshape(-1)[0])
        scales = None if requantization is None else requantization[1]
        per_group, channels_out = x.shape[1] // self.group, w.shape[0] // self.group
        if per_group == channels_out == 1 and self.group > 1:
            self.depthwise_plans[(x.shape, requantization is None)] = self.depthwise_plan(
                x, w, w_zero, bias, window, scales)
        elif self.algorithm in PACKED_ALGORITHMS:
            if swapped_product(math.prod(window.output), per_group * math.prod(window.kernel), channels_out):
                layout = self.weights_layout(weights, x.dtype)[1]
                for rows in weights:
                    rows.packed(layout)
            else:
                self.window_plans[self.window_key(x, zero, requantization)] = self.window_plan(
                    x, zero, weights, bias, window, requantization)
        return True

    def output_dtype(self, constants: Sequence[np.ndarray | None]) -> np.dtype | None:
        return None

    def weights_layout(self, weights: list[ByteRows], inputs: np.dtype) -> tuple[bool, str]:
        """Whether the packed products of these weights and input bytes of type ``inputs``
        sum the byte products in int16 pairs, and the packed layout they then take: 7-bit
        weights against uint8 where the processor lacks the byte dot product (the bytes
        packed as bytes; :func:`~onnx_light.kernels.integer_gemm.short_sums`, exact for
        them), else the kernel's layout."""
        short = self.layout == "pairs" and all(short_sums(rows, inputs) for rows in weights)
        return short, "packed" if short else self.layout

    def weight_rows(self, w: np.ndarray, w_zero: np.ndarray | None) -> list[ByteRows]:
        """One operand per group: its output channels' weights as rows, with their zero points."""
        if w_zero is not None and w_zero.dtype != w.dtype:
            raise self.ctx.error(f"w_zero_point's type {w_zero.dtype} differs from its operand's {w.dtype}")
        zero = _vector(w_zero, w.shape[0])
        if zero is None:
            raise self.ctx.error(f"w_zero_point must be a scalar or have one value per output "
                                 f"channel ({w.shape[0]}), got shape {list(w_zero.shape)}")
        m = w.shape[0]
        if m % self.group:
            raise self.ctx.error(f"{m} output channels do not split into group {self.group}")
        per_group = m // self.group
        rows = w.reshape(m, -1)
        return [ByteRows(rows[g * per_group:(g + 1) * per_group], zero[g * per_group:(g + 1) * per_group])
                for g in range(self.group)]

    def convolve(self, x: np.ndarray, x_zero: np.ndarray | None, w: np.ndarray,
                 w_zero: np.ndarray | None, bias: np.ndarray | None,
                 finish: Callable[[np.ndarray, int, slice], Epilogue | None],
                 requantization: Requantization | None = None) -> np.ndarray:
        """The int32 sums (N, M, positions) of the convolution; ``finish(out, image,
        channels)`` gives the epilogue for one image's group of channels (or None). A 1-D or
        2-D depthwise convolution writes ``requantization``'s output itself instead (and
        returns it) when given."""
        if x.ndim < 3 or w.ndim != x.ndim:
            raise self.ctx.error(f"input of shape {list(x.shape)} and weights of shape "
                                 f"{list(w.shape)}: both need rank 3 or more, alike")
        if not (_bytes(x) and _bytes(w)):
            raise self.ctx.error(f"input {x.dtype} and weights {w.dtype} must be int8 or uint8")
        if x_zero is not None:
            if x_zero.dtype != x.dtype:
                raise self.ctx.error(f"x_zero_point's type {x_zero.dtype} differs from its "
                                     f"operand's {x.dtype}")
            if x_zero.size != 1:
                raise self.ctx.error(f"x_zero_point must be a scalar (per tensor), got shape "
                                     f"{list(x_zero.shape)}")
        n, c = x.shape[:2]
        m, group = w.shape[0], self.group
        if c != w.shape[1] * group or m % group:
            raise self.ctx.error(f"input channels {c} and weights of shape {list(w.shape)} do not "
                                 f"match group {group}")
        packed = self.packed
        weights = (packed[2] if packed is not None and packed[0] is w and packed[1] is w_zero
                   else self.weight_rows(w, w_zero))
        zero = 0 if x_zero is None else int(x_zero.reshape(-1)[0])
        window = self.window(x.shape[2:], w.shape[2:])
        positions, per_group = math.prod(window.output), c // group
        channels_out = m // group
        if per_group == channels_out == 1 and group > 1 and len(window.output) <= 2:
            return self.depthwise(x, zero, w, w_zero, bias, window, requantization)
        if (self.algorithm in PACKED_ALGORITHMS and not (per_group == channels_out == 1 and group > 1)
                and len(window.output) <= 2):
            return self.packed_windows(x, zero, weights, bias, window, requantization)
        if group == 1 and math.prod(window.kernel) == 1 and set(window.strides) == {1} and not window.padded:
            return self.pointwise(x, zero, w, w_zero, bias, requantization)
        if self.algorithm == "blas" and not (per_group == channels_out == 1 and group > 1):
            return self.real_columns(x, zero, w, w_zero, bias, window, requantization)
        padded = pad_spatial(x, window, value=zero)
        acc = np.empty((n, m, positions), np.int32)
        if per_group == channels_out == 1 and group > 1:  # 3-D depthwise: one pass per tap
            shifted = w.reshape(m, -1).astype(np.int32) - _vector(w_zero, m).astype(np.int32)[:, None]
            for image in range(n):
                acc[image] = _depthwise(padded[image], shifted, zero, window)
                if bias is not None:
                    acc[image] += bias[:, None]
                epilogue = finish(acc, image, slice(0, m))
                if epilogue is not None:
                    epilogue(acc[image], 0, m, 0, positions)
            return acc.reshape(n, m, *window.output)
        for image in range(n):
            for g in range(group):
                columns = _im2col(padded[image, g * per_group:(g + 1) * per_group], window)
                right = ByteRows(columns, zero)
                channels = slice(g * channels_out, (g + 1) * channels_out)
                group_bias = None if bias is None else bias[channels].reshape(-1, 1)
                acc[image, channels] = self.product(weights[g], right, group_bias,
                                                    finish(acc, image, channels))
        return acc.reshape(n, m, *window.output)

    def depthwise(self, x: np.ndarray, zero: int, w: np.ndarray, w_zero: np.ndarray | None,
                  bias: np.ndarray | None, window: Window, requantization: Requantization | None
                  ) -> np.ndarray:
        """The 1-D or 2-D depthwise convolution (one input channel per output channel) by the
        compiled :func:`~onnx_light.kernels.integer_loops.depthwise_sums`: the int32 sums, or
        with ``requantization`` its output ``y`` (N, M, positions) written requantized. The
        (image, channel) pairs split across the pool from ``parallel.minimum_macs``
        multiply-adds."""
        n, m = x.shape[0], w.shape[0]
        scales = None if requantization is None else requantization[1]
        key = (x.shape, requantization is None)
        plan = self.depthwise_plans.get(key)
        if plan is None or not (plan.weights is w and plan.zero is w_zero and plan.bias is bias
                                and plan.scales is scales):
            plan = self.depthwise_plan(x, w, w_zero, bias, window, scales)
        if requantization is None:
            y, y_zero, low, high = np.empty((n, m, *window.output), np.int32), 0, 0, 0
        else:
            y, _, y_zero, low, high = requantization
        self.run_depthwise(plan, x, zero, y, y_zero, low, high, requantization is not None)
        return y

    def run_depthwise(self, plan: _DepthwisePlan, x: np.ndarray, zero: int, y: np.ndarray, y_zero: int,
                      low: int, high: int, scaled: bool) -> None:
        """:meth:`depthwise`'s loop for its ``plan``: ``y`` the int32 sums, or with ``scaled``
        the output requantized to ``y_zero``, ``low`` and ``high``."""
        images, target = read_only(x.reshape(plan.images)), y.reshape(plan.target)
        kernel, geometry, taps, sums = depthwise_sums.dispatcher, plan.geometry, plan.taps, plan.sums
        multipliers = plan.multipliers

        def block(first: int, last: int) -> None:
            kernel(images, zero, taps, sums, target, first, last, *geometry, multipliers, y_zero, low, high,
                   scaled)

        pairs = plan.images[0]
        if plan.parallel:
            self.pool.parallel_for(pairs, block)
        else:
            block(0, pairs)

    def depthwise_plan(self, x: np.ndarray, w: np.ndarray, w_zero: np.ndarray | None,
                       bias: np.ndarray | None, window: Window, scales: np.ndarray | None
                       ) -> _DepthwisePlan:
        """:meth:`depthwise`'s setup for this input shape (the settled one's reused while the
        weights, their zero point, the bias and the multipliers are the same arrays): the shifted weights,
        the bias, the plane layout and the multipliers."""
        n, m = x.shape[0], w.shape[0]
        planar = len(window.output) == 1

        def two(values: tuple[int, ...], fill: int) -> tuple[int, int]:
            return (fill, values[0]) if planar else (values[0], values[1])

        exact = np.float32 if w[0].size <= EXACT_CHANNELS else np.int32
        taps = (w.reshape(m, *two(window.kernel, 1)).astype(np.int32)
                - _vector(w_zero, m).astype(np.int32).reshape(m, 1, 1)).astype(exact)
        sums = read_only(np.zeros(m, np.int32) if bias is None else np.array(bias, np.int32))
        strides, pads, output = two(window.strides, 1), two(window.begin, 0), two(window.output, 1)
        plane = two(window.input, 1)
        phases, rows, columns = plane_layout(plane, output, taps.shape[1:], strides,
                                             two(window.dilations, 1), pads)
        multipliers = (read_only(np.ones(m, np.float32)) if scales is None
                       else read_only(np.array(scales, np.float32).reshape(m)))
        parallel = self.num_threads > 1 and n * m * w[0].size * math.prod(window.output) >= self.minimum_macs
        return _DepthwisePlan(w, w_zero, bias, scales, (n * m, *plane), (n * m, *output), taps, sums,
                              (strides, pads, phases, rows, columns), multipliers, parallel)

    def pointwise(self, x: np.ndarray, zero: int, w: np.ndarray, w_zero: np.ndarray | None,
                  bias: np.ndarray | None, requantization: Requantization | None) -> np.ndarray:
        """The 1x1 convolution at stride 1 without padding by the compiled
        :func:`~onnx_light.kernels.integer_loops.pointwise_sums` (no im2col: the input's
        channel rows are read in place), as :meth:`depthwise` returns it; each image's
        positions split across the pool from ``parallel.minimum_macs`` multiply-adds."""
        n, c, m = x.shape[0], x.shape[1], w.shape[0]
        positions = math.prod(x.shape[2:])
        images = read_only(x.reshape(n, c, positions))
        taps = w.reshape(m, c).astype(np.float32) - _vector(w_zero, m).astype(np.float32).reshape(m, 1)
        sums = read_only(np.zeros(m, np.int32) if bias is None else bias)
        y, scales, y_zero, low, high = _target(requantization, (n, m, *x.shape[2:]))
        target = y.reshape(n, m, positions)
        kernel = pointwise_sums.dispatcher
        blocks = -(-positions // POINTWISE_BLOCK)
        parallel = self.num_threads > 1 and m * c * positions >= self.minimum_macs
        for image in range(n):

            def block(first: int, last: int, image: int = image) -> None:
                kernel(images[image], zero, taps, sums, target[image], first * POINTWISE_BLOCK,
                       min(last * POINTWISE_BLOCK, positions), scales, y_zero, low, high,
                       requantization is not None)

            if parallel:
                self.pool.parallel_for(blocks, block)
            else:
                block(0, blocks)
        return y

    def packed_windows(self, x: np.ndarray, zero: int, weights: list[ByteRows], bias: np.ndarray | None,
                       window: Window, requantization: Requantization | None) -> np.ndarray:
        """The ``packed`` algorithm's convolution, as :meth:`depthwise` returns it: per image
        and group, the windows of the padded bytes packed for the product as the columns of
        an im2col (C x kernel size, positions) would be, without one
        (:func:`~onnx_light.kernels.integer_loops.pack_windows`, split across the pool), the
        weights the left operand, bias and requantization fused into its writes. 1-D and
        2-D convolutions; the others keep the ``blas`` path."""
        n, c, group = x.shape[0], x.shape[1], self.group
        per_group, channels_out = c // group, weights[0].data.shape[0]
        positions = math.prod(window.output)
        source = _padded_bytes(x, window, zero)
        if swapped_product(positions, per_group * math.prod(window.kernel), channels_out):
            return self.packed_filters(source, zero, weights, bias, window, requantization)
        plan = self.window_plans.get(self.window_key(x, zero, requantization))
        scales = None if requantization is None else requantization[1]
        if plan is None or not (plan.weights is weights and plan.bias is bias and plan.scales is scales):
            plan = self.window_plan(x, zero, weights, bias, window, requantization)
        if requantization is None:
            y = np.empty((n, group * channels_out, *window.output), np.int32)
        else:
            y = requantization[0]
        self.run_windows(plan, source, positions, y)
        return y

    def run_windows(self, plan: _WindowPlan, source: np.ndarray, positions: int, y: np.ndarray,
                    residual: Residual | None = None) -> None:
        """:meth:`packed_windows`' packing and products for its ``plan`` on the padded input
        ``source``, written to ``y`` (N, M, ...) of ``positions`` output positions; a
        requantized ``y`` gets ``residual`` (bytes of its shape and type, C-ordered, and
        QLinearAdd's parameters) added as each strip of rows is written."""
        n, per_group = source.shape[0], source.shape[1] // self.group
        target = y.reshape(n, -1, positions)
        added = None if residual is None else residual[0].reshape(n, -1, positions)
        if source.ndim == 3:  # 1-D: one row of height 1
            source = source[:, :, None, :]
        pack, geometry = pack_windows.dispatcher, plan.geometry
        lanes = PackedColumns.empty(plan.depth, positions, source.dtype, plan.layout)
        words = PackedColumns.words(lanes)
        for image in range(n):
            for g, (product, channels) in enumerate(plan.groups):
                inputs = read_only(source[image, g * per_group:(g + 1) * per_group])
                if plan.parallel:

                    def fill(first: int, last: int, inputs: np.ndarray = inputs) -> None:
                        pack(inputs, *geometry, words, lanes.shape[3], first, last)

                    self.pool.parallel_for(lanes.shape[1], fill)
                else:
                    pack(inputs, *geometry, words, lanes.shape[3], 0, lanes.shape[1])
                sums = PackedColumns.sums_of(lanes, positions) if product.column_sums is None \
                    else product.column_sums
                self.run_packed(product, lanes, sums, target[image, channels], None,
                                None if added is None else (added[image, channels], residual[1]))

    @staticmethod
    def window_key(x: np.ndarray, zero: int, requantization: Requantization | None) -> tuple[Any, ...]:
        """What a packed convolution's plan depends on besides its constant inputs."""
        output = None if requantization is None else requantization[0].dtype
        return (x.shape, x.dtype, zero, output, *(requantization[2:] if requantization else ()))

    def window_plan(self, x: np.ndarray, zero: int, weights: list[ByteRows], bias: np.ndarray | None,
                    window: Window, requantization: Requantization | None) -> _WindowPlan:
        """:meth:`packed_windows`' setup for this input shape (the settled one's reused
        while the weights, bias and multipliers are the same arrays): the packing geometry
        and each group's :class:`~onnx_light.kernels.integer_gemm.PackedPlan`. Plans are
        read-only, so concurrent runs share them."""
        scales = None if requantization is None else requantization[1]
        group, per_group = self.group, x.shape[1] // self.group
        channels_out = weights[0].data.shape[0]
        if len(window.output) == 1:
            kernel, strides, dilations = (1, *window.kernel), (1, *window.strides), (1, *window.dilations)
        else:
            kernel, strides, dilations = window.kernel, window.strides, window.dilations
        depth, positions = per_group * math.prod(kernel), math.prod(window.output)
        short, layout = self.weights_layout(weights, x.dtype)
        template = PackedColumns(PackedColumns.empty(depth, positions, x.dtype, layout), positions, zero)
        groups = []
        for g in range(group):
            channels = slice(g * channels_out, (g + 1) * channels_out)
            row_bias = (np.zeros(channels_out, np.int32) if bias is None
                        else np.array(bias[channels], np.int32))
            quantized = None if requantization is None else (
                None, np.ascontiguousarray(scales.reshape(-1)[channels], np.float32).reshape(-1, 1),
                *requantization[2:])
            groups.append((self.packed_plan(weights[g], template, row_bias, np.zeros(positions, np.int32),
                                            quantized, short), channels))
        return _WindowPlan(weights, bias, scales, (*kernel, *strides, *dilations), depth, tuple(groups),
                           self.num_threads > 1 and depth * positions * channels_out >= self.minimum_macs,
                           layout)

    def packed_filters(self, padded: np.ndarray, zero: int, weights: list[ByteRows],
                       bias: np.ndarray | None, window: Window, requantization: Requantization | None
                       ) -> np.ndarray:
        """:meth:`packed_windows` for few output positions (:func:`swapped_product`) and at
        least as many filters (a classifier written as a convolution, the last
        layers of a CNN): the product the other way round, the windows (an im2col) the left
        operand and the weights the packed one (packed once), written transposed, so that
        the micro-tiles run along the filters instead of a few positions."""
        n, m, group = padded.shape[0], sum(w.data.shape[0] for w in weights), self.group
        per_group, channels_out = padded.shape[1] // group, m // group
        y, scales, y_zero, low, high = _target(requantization, (n, m, *window.output))
        target = y.reshape(n, m, -1)
        pointwise = math.prod(window.kernel) == 1 and set(window.strides) == {1} and not window.padded
        short, layout = self.weights_layout(weights, padded.dtype)
        for image in range(n):
            for g in range(group):
                inputs = padded[image, g * per_group:(g + 1) * per_group]
                windows = (np.ascontiguousarray(inputs.reshape(per_group, -1).T) if pointwise
                           else _im2col(inputs, window))
                rows = ByteRows(windows, zero)
                channels = slice(g * channels_out, (g + 1) * channels_out)
                group_bias = None if bias is None else bias[channels].reshape(1, -1)
                if requantization is None:
                    target[image, channels] = self.product(rows, weights[g].packed(layout), group_bias,
                                                           short=short).T
                else:
                    self.product(rows, weights[g].packed(layout), group_bias, short=short, requantization=(
                        target[image, channels].T, scales[channels].reshape(1, -1), y_zero, low, high))
        return y

    def real_columns(self, x: np.ndarray, zero: int, w: np.ndarray, w_zero: np.ndarray | None,
                     bias: np.ndarray | None, window: Window, requantization: Requantization | None
                     ) -> np.ndarray:
        """The ``blas`` algorithm's convolution, as :meth:`depthwise` returns it: per image
        and group, the float32 BLAS product of the shifted weights (filters, C x kernel) and
        a channel-major im2col of the shifted input (C x kernel, positions), whose rows are
        strided copies of the input, not a transpose; exact over runs of
        :data:`~onnx_light.kernels.integer_loops.EXACT_CHANNELS` of the reduced axis
        (:func:`_exact_product`), then the bias and the requantization by the compiled
        :func:`~onnx_light.kernels.integer_loops.finish_sums`."""
        n, c, m, group = x.shape[0], x.shape[1], w.shape[0], self.group
        per_group, channels_out = c // group, m // group
        shifted = pad_spatial(np.subtract(x, np.float32(zero), dtype=np.float32), window)
        taps = (w.reshape(m, -1).astype(np.float32)
                - _vector(w_zero, m).astype(np.float32).reshape(m, 1))
        sums = read_only(np.zeros(m, np.int32) if bias is None else bias)
        y, scales, y_zero, low, high = _target(requantization, (n, m, *window.output))
        target = y.reshape(n, m, -1)
        finish = finish_sums.dispatcher
        for image in range(n):
            for g in range(group):
                rows = slice(g * channels_out, (g + 1) * channels_out)
                columns = _real_columns(shifted[image, g * per_group:(g + 1) * per_group], window)
                finish(_exact_product(taps[rows], columns), sums[rows], target[image, rows],
                       scales[rows], y_zero, low, high, requantization is not None)
        return y


#: Output positions below which a packed convolution with at least as many filters runs the
#: product the other way round (:meth:`_ConvProduct.packed_filters`): fewer than a vector has
#: lanes (a classifier written as a 1x1 convolution).
SWAPPED_POSITIONS = 8
#: Output positions below which a deep convolution (a reduced length above
#: :data:`SWAPPED_DEPTH`) with at least as many filters runs swapped too: 7 x 7 (49
#: positions: two micro-tiles of 24 and one of 8 holding 1) packs its windows at some 90 ns a
#: word of the reduced axis, which the swapped product's numpy passes over the windows beat
#: only on long reduced lengths (ResNet-50's 2048 -> 512 and 512-channel 3x3 layers, not
#: MobileNetV2's 160-960 channels: docs/quantization.md).
DEEP_SWAPPED_POSITIONS = 64
SWAPPED_DEPTH = 1024


def swapped_product(positions: int, depth: int, filters: int) -> bool:
    """Whether a packed convolution of ``positions`` output positions, a reduced length of
    ``depth`` and ``filters`` output channels (per group, at least as many as the positions' limit) runs the
    swapped product."""
    limit = DEEP_SWAPPED_POSITIONS if depth > SWAPPED_DEPTH else SWAPPED_POSITIONS
    return positions < limit <= filters


def add_whole(y: np.ndarray, residual: Residual) -> None:
    """``residual`` (bytes of ``y``'s shape and type, C-ordered, and QLinearAdd's parameters)
    added into the requantized ``y`` (N, M, ...) in one compiled pass
    (:func:`~onnx_light.kernels.integer_loops.add_residual`): a fused QLinearAdd after a
    convolution that adds it in no product's epilogue."""
    rows = y.reshape(y.shape[0] * y.shape[1], -1)
    add_residual.dispatcher(rows, residual[0].reshape(rows.shape), 0, rows.shape[0], 0, rows.shape[1],
                            residual[1])


def _exact_product(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``left @ right`` of float32 integers below 256 in magnitude, exactly: float32 when the
    reduced length allows, else int32 sums of exact chunks."""
    depth = left.shape[1]
    if depth <= EXACT_CHANNELS:
        return np.matmul(left, right)
    total = np.zeros((left.shape[0], right.shape[1]), np.int32)
    for k in range(0, depth, EXACT_CHANNELS):
        total += np.matmul(left[:, k:k + EXACT_CHANNELS], right[k:k + EXACT_CHANNELS]).astype(np.int32)
    return total


def _target(requantization: Requantization | None, shape: tuple[int, ...]
            ) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """Where a compiled depthwise or pointwise pass writes: int32 sums of ``shape`` (N, M,
    ...), or the requantized output; and the multipliers (M,), zero point and range."""
    if requantization is None:
        return np.empty(shape, np.int32), read_only(np.ones(shape[1], np.float32)), 0, 0, 0
    y, multiplier, zero, low, high = requantization
    return y, read_only(np.ascontiguousarray(multiplier, np.float32).reshape(shape[1])), zero, low, high


def _padded_bytes(x: np.ndarray, window: Window, zero: int) -> np.ndarray:
    """``x`` (N, C, W) or (N, C, H, W) padded with its zero point as
    :func:`~onnx_light.kernels.window.pad_spatial` pads it, by the compiled
    :func:`~onnx_light.kernels.integer_loops.pad_planes` (one pass); ``x`` itself when the
    window pads nothing."""
    if not window.padded:
        return x
    out = np.empty((*x.shape[:2], *window.padded_shape()), x.dtype)
    out.fill(zero)
    planar = x.ndim == 3  # 1-D: planes of one row
    top, left = (0, window.begin[0]) if planar else window.begin
    planes = np.ascontiguousarray(x).reshape(-1, 1 if planar else x.shape[2], x.shape[-1])
    pad_planes.dispatcher(read_only(planes), out.reshape(-1, 1 if planar else out.shape[2], out.shape[-1]),
                          top, left)
    return out


def compile_pack_windows(dtype: np.dtype) -> None:
    """Compile :func:`~onnx_light.kernels.integer_loops.pack_windows` and
    :func:`~onnx_light.kernels.integer_loops.pad_planes` for input ``dtype``, at session
    construction."""
    pad_planes(read_only(np.zeros((1, 1, 1), dtype)), np.zeros((1, 3, 3), dtype), 1, 1)
    lanes = PackedColumns.empty(1, 1, dtype)
    pack_windows(read_only(np.zeros((1, 1, 1), dtype)), 1, 1, 1, 1, 1, 1, PackedColumns.words(lanes),
                 lanes.shape[3], 0, lanes.shape[1])


def compile_pointwise(dtype: np.dtype, output: np.dtype | None) -> None:
    """Compile :func:`~onnx_light.kernels.integer_loops.pointwise_sums` for input ``dtype``
    and the ``output`` type (None: int32 sums), at session construction."""
    out = np.empty((1, 1), np.int32 if output is None else output)
    pointwise_sums(read_only(np.zeros((1, 1), dtype)), 0, np.zeros((1, 1), np.float32),
                   read_only(np.zeros(1, np.int32)), out, 0, 1, read_only(np.ones(1, np.float32)),
                   0, 0, 0, output is not None)


def compile_finish(output: np.dtype | None, depth: int) -> None:
    """Compile :func:`~onnx_light.kernels.integer_loops.finish_sums` for the ``output`` type
    (None: int32 sums) and the sums a reduced length of ``depth`` gives, at session
    construction."""
    out = np.empty((1, 1), np.int32 if output is None else output)
    finish_sums(np.zeros((1, 1), np.float32 if depth <= EXACT_CHANNELS else np.int32),
                read_only(np.zeros(1, np.int32)), out, read_only(np.ones(1, np.float32)), 0, 0, 0,
                output is not None)


def compile_depthwise(dtype: np.dtype, kernel_width: int, taps: int, output: np.dtype | None) -> None:
    """Compile :func:`~onnx_light.kernels.integer_loops.depthwise_sums` for input ``dtype``,
    ``kernel_width``, windows of ``taps`` taps (float32 or int32 sums) and the ``output``
    type (None: int32 sums), at session construction."""
    phases, rows, columns = plane_layout((1, kernel_width), (1, 1), (1, kernel_width), (1, 1),
                                         (1, 1), (0, 0))
    out = np.empty((1, 1, 1), np.int32 if output is None else output)
    depthwise_sums(read_only(np.zeros((1, 1, kernel_width), dtype)), 0,
                   np.zeros((1, 1, kernel_width), np.float32 if taps <= EXACT_CHANNELS else np.int32),
                   read_only(np.zeros(1, np.int32)), out,
                   0, 1, (1, 1), (0, 0), phases, rows, columns, read_only(np.ones(1, np.float32)),
                   0, 0, 0, output is not None)


def _tap(padded: np.ndarray, offsets: tuple[int, ...], window: Window) -> np.ndarray:
    """What one kernel offset reads of a padded (C, *spatial) image: (C, *output)."""
    return padded[(slice(None), *(
        slice(o * d, o * d + s * (size - 1) + 1, s) for o, d, s, size in zip(
            offsets, window.dilations, window.strides, window.output, strict=True)))]


def _im2col(padded: np.ndarray, window: Window) -> np.ndarray:
    """The windows of a padded (C, *spatial) image as rows (positions, C x kernel size), each
    row ordered as the weights' (C, *kernel): one strided copy per kernel offset."""
    columns = np.empty((*window.output, padded.shape[0], *window.kernel), padded.dtype)
    for offsets in itertools.product(*(range(k) for k in window.kernel)):
        columns[(Ellipsis, *offsets)] = np.moveaxis(_tap(padded, offsets, window), 0, -1)
    return columns.reshape(math.prod(window.output), -1)


def _real_columns(padded: np.ndarray, window: Window) -> np.ndarray:
    """The windows of a padded (C, *spatial) image as columns (C x kernel size, positions),
    rows ordered as the weights' (C, *kernel): one strided copy per kernel offset."""
    columns = np.empty((padded.shape[0], *window.kernel, *window.output), padded.dtype)
    for offsets in itertools.product(*(range(k) for k in window.kernel)):
        columns[(slice(None), *offsets)] = _tap(padded, offsets, window)
    return columns.reshape(-1, math.prod(window.output))


def _depthwise(padded: np.ndarray, shifted: np.ndarray, zero: int, window: Window) -> np.ndarray:
    """A depthwise convolution's int32 sums (C, positions): for each kernel offset, the
    strided input of every channel minus the zero point times that tap of each channel's
    shifted weights (C, kernel size), accumulated in place."""
    channels = padded.shape[0]
    acc = np.zeros((channels, math.prod(window.output)), np.int32)
    term = np.empty_like(acc)
    for tap, offsets in enumerate(itertools.product(*(range(k) for k in window.kernel))):
        source = _tap(padded, offsets, window)
        np.subtract(source.reshape(channels, -1), zero, out=term, dtype=np.int32)
        term *= shifted[:, tap:tap + 1]
        acc += term
    return acc


class ConvInteger(_ConvProduct):
    """Conv of ``x - x_zero_point`` and ``w - w_zero_point`` as int32."""

    op_type = "ConvInteger"
    w_inputs = (1, 3)

    def run(self, x: np.ndarray, w: np.ndarray, x_zero_point: np.ndarray | None = None,
            w_zero_point: np.ndarray | None = None) -> Arrays:
        return [self.convolve(x, x_zero_point, w, w_zero_point, None, lambda *_: None)]


class QLinearConv(_ConvProduct):
    """The int32 convolution of quantized input and weights (per-channel weight scales), plus
    the int32 bias, requantized to the output's scale and zero point."""

    op_type = "QLinearConv"
    reduced_input = 3
    w_inputs = (3, 5)

    output_dtype = _requantized_output_dtype

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        # the requantization multiplier per output channel, for the constant scales it was
        # made of (:meth:`specialize`), and the settled shape's route (:meth:`settle`)
        self.multiplier: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self.route: _Route | None = None

    def specialize(self, constants: Sequence[np.ndarray | None]) -> QLinearConv | None:
        chosen = super().specialize(constants)
        x_scale, w, w_scale, y_scale = (constants[i] if i < len(constants) else None for i in (1, 3, 4, 6))
        if chosen is not None and x_scale is not None and w_scale is not None and y_scale is not None:
            with contextlib.suppress(KernelError):  # bad scales: the run reports them
                multiplier = self.multiplier_of(x_scale, w_scale, y_scale, w)
                chosen.multiplier = (x_scale, w_scale, y_scale, multiplier)
        return chosen

    def multiplier_of(self, x_scale: np.ndarray, w_scale: np.ndarray, y_scale: np.ndarray,
                      w: np.ndarray) -> np.ndarray:
        """The requantization multiplier per output channel of these scales."""
        scales = (("x_scale", x_scale, None), ("w_scale", w_scale, (w.shape[0], 1)),
                  ("y_scale", y_scale, None))
        multiplier = _multiplier(self.ctx, scales).reshape(-1)
        return np.full(w.shape[0], multiplier[0], np.float32) if multiplier.size == 1 else multiplier

    def settle(self, input_shapes: Sequence[tuple[int, ...] | None]) -> QLinearConv | None:
        """:meth:`_ConvProduct.settle`'s kernel, with the route of runs of the settled shape
        and type (:meth:`_route`)."""
        if self.multiplier is None or self.constants is None:
            return None  # the scales or the weights are fed
        constants = (*self.constants, None, None)[:9]  # the absent ones None
        if constants[7] is None and self.ctx.num_inputs > 7 and self.ctx.input_types[7]:
            return None  # the output's zero point is fed
        settled = super().settle(input_shapes)
        if settled is not None:
            x = np.broadcast_to(np.zeros((), numpy_dtype(self.ctx.input_types[0])), tuple(input_shapes[0]))
            settled.hold_range(constants[7], x.dtype)
            output = settled.output_range(constants[7], x)
            settled.route = settled._route(x, constants[3], constants[1:], output)
        return settled

    def settled_requantization(self, x: np.ndarray) -> Requantization:
        dtype, zero, low, high = self.output_range((*self.constants, None)[7], x)
        return np.empty(0, dtype), self.multiplier[3], zero, low, high

    def run(self, x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None,
            w: np.ndarray, w_scale: np.ndarray, w_zero_point: np.ndarray | None,
            y_scale: np.ndarray, y_zero_point: np.ndarray | None = None,
            bias: np.ndarray | None = None) -> Arrays:
        constants = (x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, bias)
        route = self.routed(x, constants)
        if route is not None and route.call is not None:
            return [route.call(x, None)]
        if bias is not None and (bias.dtype != np.int32 or bias.shape != (w.shape[0],)):
            raise self.ctx.error(f"the bias must be int32 of shape [{w.shape[0]}], got "
                                 f"{bias.dtype} of shape {list(bias.shape)}")
        held = self.multiplier
        if held is not None and held[0] is x_scale and held[1] is w_scale and held[2] is y_scale:
            multiplier = held[3]
        else:
            multiplier = self.multiplier_of(x_scale, w_scale, y_scale, w)
        dtype, zero, low, high = self.output_range(y_zero_point, x)
        spatial = self.window(x.shape[2:], w.shape[2:]).output \
            if x.ndim >= 3 and w.ndim == x.ndim else ()
        y = np.empty((x.shape[0], w.shape[0], math.prod(spatial)), dtype)

        def finish(acc: np.ndarray, image: int, channels: slice) -> Epilogue:
            return self.requantizing(y[image, channels], multiplier[channels].reshape(-1, 1),
                                     zero, low, high)

        self.convolve(x, x_zero_point, w, w_zero_point, bias, finish, (y, multiplier, zero, low, high))
        return [y.reshape(x.shape[0], w.shape[0], *spatial)]

    def routed(self, x: np.ndarray, constants: tuple[np.ndarray | None, ...]) -> _Route | None:
        """The settled route (:meth:`_route`) when a run on ``x`` with these inputs (all but
        X, in order; compared by identity) takes it, else None."""
        route = self.route
        if (route is not None and route.shape == x.shape and route.dtype == x.dtype
                and all(map(operator.is_, route.constants, constants))):
            return route
        return None

    def _route(self, x: np.ndarray, w: np.ndarray, constants: tuple[np.ndarray | None, ...],
               output: tuple[np.dtype, int, int, int]) -> _Route:
        """The run of inputs of ``x``'s shape and type (``x`` a stand-in) and these constant
        inputs, straight to the settled plan's loops (a depthwise or packed-windows
        convolution), without the checks and lookups a run of a small convolution mostly
        is; for the other paths a route without a call (the run goes the whole way, without
        asking again)."""
        none = _Route(constants, x.shape, x.dtype, None)
        if x.ndim not in (3, 4) or w.ndim != x.ndim:
            return none
        dtype, y_zero, low, high = output
        x_zero = constants[1]
        zero = 0 if x_zero is None else int(x_zero.reshape(-1)[0])
        window = self.window(x.shape[2:], w.shape[2:])
        n, c, m, group = x.shape[0], x.shape[1], w.shape[0], self.group
        per_group, channels_out, positions = c // group, m // group, math.prod(window.output)
        shape = (n, m, *window.output)
        if per_group == channels_out == 1 and group > 1:
            depthwise = self.depthwise_plans.get((x.shape, False))
            if depthwise is None:
                return none

            def call(x: np.ndarray, residual: Residual | None) -> np.ndarray:
                y = np.empty(shape, dtype)
                self.run_depthwise(depthwise, x, zero, y, y_zero, low, high, True)
                if residual is not None:
                    add_whole(y, residual)
                return y

        elif (self.algorithm in PACKED_ALGORITHMS
              and not swapped_product(positions, per_group * math.prod(window.kernel), channels_out)):
            plan = self.window_plans.get((x.shape, x.dtype, zero, dtype, y_zero, low, high))
            if plan is None:
                return none

            def call(x: np.ndarray, residual: Residual | None) -> np.ndarray:
                y = np.empty(shape, dtype)
                self.run_windows(plan, _padded_bytes(x, window, zero), positions, y, residual)
                return y

        else:
            return none
        return _Route(constants, x.shape, x.dtype, call)


class _Route(NamedTuple):
    """A QLinearConv's run for one input shape and type and its constant inputs (compared
    by identity): ``call(x, residual)`` gives the output (with the residual added, when not
    None, as :func:`add_whole` adds it), or None: the whole run (:meth:`QLinearConv._route`)."""

    constants: tuple[np.ndarray | None, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    call: Callable[[np.ndarray, Residual | None], np.ndarray] | None


DECLARATIONS: tuple[KernelDeclaration, ...] = tuple(
    declare(kernel, versions, types=types, parameters=integer_parameters,
            calibrate=calibrate_integer_product)
    for kernel, versions, types in (
        (MatMulInteger, (10,), _BYTES),
        (ConvInteger, (10,), _BYTES),
        (QLinearMatMul, (10, 21), {10: _BYTES, 21: _BYTES_AND_FLOAT8}),
        (QLinearConv, (10,), _BYTES),
    ))
