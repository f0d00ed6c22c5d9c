"""onnxruntime's quantized operators of the QOperator format (``quantize_static`` with
``QuantFormat.QOperator``), outside its products: QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearSoftmax, QLinearConcat, QLinearWhere, QLinearGlobalAveragePool and
QLinearAveragePool; and its QuantizeLinear and DequantizeLinear, which the quantizer writes
for QDQ models with ``UseQDQContribOps`` (ONNX QuantizeLinear-21's and DequantizeLinear-21's
kernels: int8 to uint16, int4, per tensor, axis or block).

Each takes uint8 or int8 tensors with per-tensor scales and zero points (an omitted zero point
is 0), computes on the real values ``(q - zero_point) * scale`` in float32 and requantizes to
the output's scale and zero point (:func:`~onnx_light.kernels.quantization.requantize`:
rounding half to even, saturation); the output has the output zero point's type, else the
input's. QLinearAdd, QLinearMul and QLinearGlobalAveragePool with float32 scales are one
compiled pass each with onnxruntime's x86 arithmetic instead (its ratios, operation order and
FMAs), so that their outputs are onnxruntime's bit for bit (docs/quantization.md). The unary
ones with a byte input go through a 256-entry table, as onnxruntime's do. AveragePool and the
softmax reuse the float kernels (:class:`~onnx_light.kernels.pooling.AveragePool`,
:class:`~onnx_light.kernels.reductions.Softmax`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ...tuning.keys import ElementType as T
from .. import quantization
from ..base import Kernel, NodeContext, normalize_axis, numpy_dtype
from ..compiled import compiled, fused_multiply_add, read_only
from ..declaration import KernelDeclaration
from ..elementwise import _sigmoid
from ..integer_loops import add_terms
from ..pooling import AveragePool
from ..quantization import quantized_type, requantize
from ..reductions import Softmax
from .base import ContribKernel, ValueType, broadcast_shape, declare_contrib, onnx_kernel

__all__ = ["DECLARATIONS", "dequantize", "quantize"]

Arrays = list[np.ndarray]
BYTES = (T.UINT8, T.INT8)
_RANGES = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max) for t in (np.uint8, np.int8)}


def _scalar(ctx: NodeContext, name: str, value: np.ndarray | None) -> np.ndarray | None:
    if value is not None and value.size != 1:
        raise ctx.error(f"{name} must be a scalar (per tensor), got shape {list(value.shape)}")
    return None if value is None else value.reshape(())


def dequantize(ctx: NodeContext, name: str, x: np.ndarray, scale: np.ndarray | None,
               zero_point: np.ndarray | None) -> np.ndarray:
    """The real values of the quantized ``x`` (named ``name``) in float32, per tensor."""
    if scale is None:
        raise ctx.error(f"{name}_scale is required with {name}")
    if quantized_type(x.dtype) not in BYTES:
        raise ctx.error(f"{name} must be uint8 or int8, got {x.dtype}")
    zero = _scalar(ctx, f"{name}_zero_point", zero_point)
    if zero is not None and zero.dtype != x.dtype:
        raise ctx.error(f"{name}_zero_point's type {zero.dtype} differs from {name}'s {x.dtype}")
    scale = _scalar(ctx, f"{name}_scale", scale).astype(np.float32)
    shifted = x.astype(np.int32) if zero is None else x.astype(np.int32) - np.int32(zero)
    return shifted.astype(np.float32) * scale


def quantize(ctx: NodeContext, values: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
             like: np.ndarray) -> np.ndarray:
    """Real ``values`` quantized to ``scale`` and ``zero_point``, in the zero point's type
    (``like``'s without one)."""
    zero = _scalar(ctx, "the output zero point", zero_point)
    target = quantized_type(like.dtype if zero is None else zero.dtype)
    if target not in BYTES:
        raise ctx.error(f"the output zero point must be uint8 or int8, got {zero.dtype}")
    scale = _scalar(ctx, "the output scale", scale).astype(np.float32)
    return requantize(values / scale, target, zero_point=zero)


def _output_type(inputs: Sequence[ValueType], zero_index: int, shape_index: int = 0) -> ValueType:
    """The output zero point's element type (the first input's without one), with input
    ``shape_index``'s shape."""
    zero = inputs[zero_index] if zero_index < len(inputs) else None
    source = zero if zero is not None else inputs[0]
    shaped = inputs[shape_index] if shape_index < len(inputs) else None
    if source is None:
        return None
    return source[0], None if shaped is None else shaped[1]


@compiled(inline="always")
def _saturated(value, low, high):
    """``value`` rounded half to even and clamped to ``low:high`` (a byte type's range)."""
    return min(max(np.rint(value), low), high)


@compiled
def _combine_bytes(first, second, out, multiply, parameters):
    """:class:`_QLinearBinary`'s arithmetic, onnxruntime's on x86 (MLAS), on rows:
    ``out[r, j]`` from ``first[r, j]`` (or ``first[r, 0]``: one value per row) and ``second[r,
    j]``; ``parameters``: float32 ``first_scale, first_zero, second_scale, second_zero,
    c_scale, c_zero, low, high`` (one array: numba types it faster than eight numpy scalars).
    Add: :func:`~onnx_light.kernels.integer_loops.add_terms`' ratios ``r1``, ``r2`` and
    ``fixed``, then ``fma(second, r2, fma(first, r1, fixed))`` (the caller makes the operand
    with one value per row ``first``, else B: the roles onnxruntime gives them). Mul:
    ``(first - z1) * (second - z2)`` (exact in float32) times ``first_scale * second_scale /
    c_scale``, plus ``c_zero``. Then rounded half to even and saturated to ``low:high``."""
    first_scale, first_zero, second_scale, second_zero = parameters[:4]
    c_scale, c_zero, lowest, highest = parameters[4:]
    first_ratio, second_ratio, fixed = add_terms(parameters)
    ratio = (first_scale * second_scale) / c_scale
    inner = np.uintp(out.shape[1])
    per_row = first.shape[1] == 1 and inner > 1
    for r in range(np.uintp(out.shape[0])):
        row, other = out[r], second[r]
        if per_row:
            value = np.float32(first[r, 0])
            if multiply:
                shifted = value - first_zero
                for j in range(inner):
                    row[j] = _saturated(shifted * (np.float32(other[j]) - second_zero) * ratio + c_zero,
                                        lowest, highest)
            else:
                folded = fused_multiply_add(value, first_ratio, fixed)
                for j in range(inner):
                    row[j] = _saturated(fused_multiply_add(np.float32(other[j]), second_ratio, folded),
                                        lowest, highest)
        else:
            values = first[r]
            if multiply:
                for j in range(inner):
                    product = (np.float32(values[j]) - first_zero) * (np.float32(other[j]) - second_zero)
                    row[j] = _saturated(product * ratio + c_zero, lowest, highest)
            else:
                for j in range(inner):
                    folded = fused_multiply_add(np.float32(values[j]), first_ratio, fixed)
                    row[j] = _saturated(fused_multiply_add(np.float32(other[j]), second_ratio, folded),
                                        lowest, highest)


def _broadcast_rows(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """The broadcast shape of A and B and how many of its trailing axes form one run in which
    each operand is either whole or a single value (broadcast along all of them): the rows of
    :func:`_combine_bytes`."""
    shape = tuple(np.broadcast_shapes(a_shape, b_shape))
    padded = [(1,) * (len(shape) - len(s)) + tuple(s) for s in (a_shape, b_shape)]
    kinds: list[bool | None] = [None, None]  # per operand: whole (True) or single (False) in the run
    run = 0
    for axis in reversed(range(len(shape))):
        if shape[axis] != 1:
            whole = [p[axis] == shape[axis] for p in padded]
            if any(k is not None and k != w for k, w in zip(kinds, whole, strict=True)):
                break
            kinds = list(whole)
        run += 1
    return shape, run


def _rows(x: np.ndarray, shape: tuple[int, ...], run: int) -> np.ndarray:
    """``x`` broadcast to the leading axes of ``shape`` (before the last ``run``) as C-ordered
    rows of its values in the run (one value when it is broadcast along the run)."""
    padded = x.reshape((1,) * (len(shape) - x.ndim) + x.shape)
    lead = shape[:len(shape) - run]
    rows = np.broadcast_to(padded, lead + padded.shape[len(lead):])
    return np.ascontiguousarray(rows).reshape(math.prod(lead), -1)


def _warm_up_byte(element_type: int | None, constants: Sequence[np.ndarray | None],
                  out_zero: int) -> tuple[np.dtype, np.dtype] | None:
    """(input, output) numpy types a construction-time warm-up compiles a byte pass for: the
    first input's byte type and that of the constant output zero point at ``out_zero`` (else
    the input's); None for other input types."""
    if element_type not in (T.UINT8, T.INT8):
        return None
    byte = numpy_dtype(element_type)
    zero = constants[out_zero] if len(constants) > out_zero else None
    return byte, zero.dtype if zero is not None else byte


class _QLinearBinary(ContribKernel):
    """C = quantize(f(dequantize(A), dequantize(B))), broadcasting multidirectionally: one
    compiled pass (:func:`_combine_bytes`, onnxruntime's arithmetic)."""

    multiply: ClassVar[bool] = False

    @staticmethod
    def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        typed = _output_type(inputs, 7)
        a, b = inputs[0], inputs[3] if len(inputs) > 3 else None
        shape = None if a is None or b is None else broadcast_shape(a[1], b[1])
        return [None if typed is None else (typed[0], shape)]

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile the compiled pass now, at session construction, for byte operands (the
        output type a constant C zero point gives, else A's)."""
        byte = _warm_up_byte(self.ctx.input_types[0], constants, 7)
        if byte is not None:
            one, zero, out_zero = np.ones(1, np.float32), np.zeros(1, byte[0]), np.zeros(1, byte[1])
            self._compiled(zero, one, zero, zero, one, zero, one, out_zero)
        return None

    def run(self, a: np.ndarray, a_scale: np.ndarray, a_zero_point: np.ndarray | None,
            b: np.ndarray, b_scale: np.ndarray, b_zero_point: np.ndarray | None,
            c_scale: np.ndarray, c_zero_point: np.ndarray | None = None) -> Arrays:
        if a.dtype != b.dtype:
            raise self.ctx.error(f"A ({a.dtype}) and B ({b.dtype}) must have the same type")
        if a.shape != b.shape:
            try:
                np.broadcast_shapes(a.shape, b.shape)
            except ValueError:
                raise self.ctx.error(f"cannot broadcast A {list(a.shape)} and B {list(b.shape)}") from None
        fused = self._compiled(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point)
        if fused is not None:
            return [fused]
        real_a = dequantize(self.ctx, "A", a, a_scale, a_zero_point)
        real_b = dequantize(self.ctx, "B", b, b_scale, b_zero_point)
        return [quantize(self.ctx, self.combine(real_a, real_b), c_scale, c_zero_point, a)]

    def _compiled(self, a: np.ndarray, a_scale: np.ndarray, a_zero: np.ndarray | None, b: np.ndarray,
                  b_scale: np.ndarray, b_zero: np.ndarray | None, c_scale: np.ndarray,
                  c_zero: np.ndarray | None) -> np.ndarray | None:
        """The compiled pass's output when it applies (byte operands, float32 per-tensor scales,
        zero points of the operands' type), else None."""
        parameters = (a_scale, a_zero, b_scale, b_zero, c_scale, c_zero)
        if (quantized_type(a.dtype) not in BYTES
                or any(p is not None and p.size != 1 for p in parameters)
                or any(s.dtype != np.float32 for s in (a_scale, b_scale, c_scale))
                or any(z is not None and z.dtype != a.dtype for z in (a_zero, b_zero))):
            return None
        target = a.dtype if c_zero is None else c_zero.dtype
        if target not in (np.dtype(np.uint8), np.dtype(np.int8)):
            return None
        if a.shape == b.shape:  # one row, no broadcasting
            shape, rows = a.shape, [read_only(np.ascontiguousarray(x).reshape(1, -1)) for x in (a, b)]
        else:
            shape, run = _broadcast_rows(a.shape, b.shape)
            rows = [read_only(_rows(x, shape, run)) for x in (a, b)]
        out = np.empty(shape, target)
        if not out.size:
            return out
        first, second = (0, 1) if rows[0].shape[1] == 1 < rows[1].shape[1] else (1, 0)
        scales = (a_scale.item(), b_scale.item())
        zeros = [0 if z is None else z.item() for z in (a_zero, b_zero)]
        parameters = np.array([scales[first], zeros[first], scales[second], zeros[second], c_scale.item(),
                               0 if c_zero is None else c_zero.item(), *_RANGES[target]], np.float32)
        _combine_bytes(rows[first], rows[second], out.reshape(rows[0].shape[0], -1), self.multiply,
                       parameters)
        return out


class QLinearAdd(_QLinearBinary):
    op_type = "QLinearAdd"
    combine = staticmethod(np.add)


class QLinearMul(_QLinearBinary):
    op_type = "QLinearMul"
    multiply = True
    combine = staticmethod(np.multiply)


class _QLinearUnary(ContribKernel):
    """Y = quantize(f(dequantize(X))), through a table of the 256 byte values."""

    zero_index: ClassVar[int] = 4

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        return [_output_type(inputs, cls.zero_index)]

    def function(self, real: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def run(self, x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None,
            y_scale: np.ndarray, y_zero_point: np.ndarray | None = None) -> Arrays:
        every = np.arange(256, dtype=np.uint8).view(x.dtype) if x.dtype.itemsize == 1 else x
        real = dequantize(self.ctx, "X", every, x_scale, x_zero_point)
        table = quantize(self.ctx, self.function(real), y_scale, y_zero_point, x)
        return [table[x.view(np.uint8)] if every is not x else table]


class QLinearSigmoid(_QLinearUnary):
    op_type = "QLinearSigmoid"

    def function(self, real: np.ndarray) -> np.ndarray:
        out = np.empty_like(real)
        _sigmoid(real, out=out)
        return out


class QLinearLeakyRelu(_QLinearUnary):
    """LeakyRelu with ``alpha`` (0.01 by default)."""

    op_type = "QLinearLeakyRelu"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.alpha = np.float32(ctx.attribute("alpha", 0.01))

    def function(self, real: np.ndarray) -> np.ndarray:
        return np.where(real < 0, real * self.alpha, real)


class QLinearSoftmax(ContribKernel):
    """Softmax of the real values along ``axis`` (-1 by default), with the meaning of ONNX
    Softmax at the node's ``opset`` attribute (before 13: everything from ``axis`` on), tuned
    as float Softmax."""

    op_type = "QLinearSoftmax"
    tuned_as = "softmax"

    def __init__(self, ctx: NodeContext) -> None:
        opset = ctx.attribute("opset")
        if opset is None:
            raise ctx.error("attribute 'opset' is required")
        self.softmax = onnx_kernel(ctx, Softmax, int(opset), {"axis": ctx.attribute("axis", -1)},
                                   (T.FLOAT,))
        super().__init__(ctx)

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        return [_output_type(inputs, 4)]

    def run(self, x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None,
            y_scale: np.ndarray, y_zero_point: np.ndarray | None = None) -> Arrays:
        real = dequantize(self.ctx, "X", x, x_scale, x_zero_point)
        return [quantize(self.ctx, self.softmax.run(real)[0], y_scale, y_zero_point, x)]


class QLinearConcat(ContribKernel):
    """Concat along ``axis`` of quantized tensors, each (tensor, scale, zero point) after the
    output's scale and zero point, requantized to the output's."""

    op_type = "QLinearConcat"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        if ctx.attribute("axis") is None:
            raise ctx.error("attribute 'axis' is required")
        self.axis = int(ctx.attribute("axis"))
        if ctx.num_inputs < 5 or (ctx.num_inputs - 2) % 3:
            raise ctx.error(f"expected Y_scale, Y_zero_point and triples (X, X_scale, "
                            f"X_zero_point), got {ctx.num_inputs} inputs")

    @classmethod
    def element_type_of(cls, ctx: NodeContext) -> int | None:
        """The first tensor's type (the inputs start with the output's scale)."""
        return ctx.input_types[2] if len(ctx.input_types) > 2 else None

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        zero, first = inputs[1], inputs[2] if len(inputs) > 2 else None
        source = zero if zero is not None else first
        return [None if source is None else (source[0], None)]

    def run(self, y_scale: np.ndarray, y_zero_point: np.ndarray | None,
            *triples: np.ndarray | None) -> Arrays:
        tensors = triples[0::3]
        if any(x is None for x in tensors):
            raise self.ctx.error("every X input must be given")
        first = tensors[0]
        axis = normalize_axis(self.ctx, self.axis, first.ndim)
        reals = [dequantize(self.ctx, f"X{i}", x, scale, zero)
                 for i, (x, scale, zero) in enumerate(zip(tensors, triples[1::3], triples[2::3],
                                                          strict=True))]
        try:
            joined = np.concatenate(reals, axis=axis)
        except ValueError:
            raise self.ctx.error(f"cannot concatenate shapes {[list(x.shape) for x in tensors]} "
                                 f"along axis {self.axis}") from None
        return [quantize(self.ctx, joined, y_scale, y_zero_point, first)]


class QLinearWhere(ContribKernel):
    """Where(condition, X, Y) of the real values, requantized to Z's scale and zero point."""

    op_type = "QLinearWhere"

    @classmethod
    def element_type_of(cls, ctx: NodeContext) -> int | None:
        """X's type (the first input is the boolean condition)."""
        return ctx.input_types[1] if len(ctx.input_types) > 1 else None

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        typed = _output_type(inputs[1:], 7)
        shapes = [inputs[i][1] if len(inputs) > i and inputs[i] is not None else None for i in (0, 1, 4)]
        return [None if typed is None else (typed[0], broadcast_shape(*shapes))]

    def run(self, condition: np.ndarray, x: np.ndarray, x_scale: np.ndarray,
            x_zero_point: np.ndarray | None, y: np.ndarray, y_scale: np.ndarray,
            y_zero_point: np.ndarray | None, z_scale: np.ndarray,
            z_zero_point: np.ndarray | None = None) -> Arrays:
        if condition.dtype != np.bool_:
            raise self.ctx.error(f"condition must be bool, got {condition.dtype}")
        real_x = dequantize(self.ctx, "X", x, x_scale, x_zero_point)
        real_y = dequantize(self.ctx, "Y", y, y_scale, y_zero_point)
        try:
            chosen = np.where(condition, real_x, real_y)
        except ValueError:
            raise self.ctx.error(f"cannot broadcast condition {list(condition.shape)}, X "
                                 f"{list(x.shape)} and Y {list(y.shape)}") from None
        return [quantize(self.ctx, chosen, z_scale, z_zero_point, x)]


class _QuantizeOrDequantize(ContribKernel):
    """The ONNX kernel of the same name at version 21, with the node's attributes."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.linear = onnx_kernel(ctx, self.onnx_class, 21, ctx.attributes, ctx.input_types)

    def run(self, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None) -> Arrays:
        return list(self.linear.run(x, scale, zero_point))


class QuantizeLinear(_QuantizeOrDequantize):
    op_type = "QuantizeLinear"
    onnx_class = quantization.QuantizeLinear

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        x, zero = inputs[0], inputs[2] if len(inputs) > 2 else None
        return [None if x is None else (T.UINT8 if zero is None else zero[0], x[1])]


class DequantizeLinear(_QuantizeOrDequantize):
    op_type = "DequantizeLinear"
    onnx_class = quantization.DequantizeLinear

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        x, scale = inputs[0], inputs[1] if len(inputs) > 1 else None
        return [None if x is None or scale is None else (scale[0], x[1])]


def _channels_first(x: np.ndarray, channels_last: bool) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if channels_last and x.ndim > 2 else x


def _channels_back(y: np.ndarray, channels_last: bool) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if channels_last and y.ndim > 2 else y


@compiled
def _mean_bytes(x, out, channels_last, bias, parameters):
    """onnxruntime's QLinearGlobalAveragePool on x86 (MLAS): ``out[b, c]`` from the positions
    ``x[b, :, c]`` (``channels_last``; else ``x[b, c, :]``): their integer sum plus ``bias``
    (``-x_zero * positions``), times ``scale`` in float32, rounded half to even, plus ``zero``,
    saturated to ``low:high`` (``parameters``: float32 ``scale, zero, low, high``)."""
    scale, zero, lowest, highest = parameters
    batches, channels = out.shape
    positions = x.shape[1] if channels_last else x.shape[2]
    totals = np.empty(channels, np.int64)
    for b in range(batches):
        if channels_last:
            totals[:] = 0
            for p in range(positions):
                for c in range(channels):
                    totals[c] += x[b, p, c]
        else:
            for c in range(channels):
                total = 0
                for p in range(positions):
                    total += x[b, c, p]
                totals[c] = total
        for c in range(channels):
            out[b, c] = _saturated(np.float32(totals[c] + bias) * scale, lowest - zero, highest - zero) + zero


class QLinearGlobalAveragePool(ContribKernel):
    """The mean over the spatial axes of (N, C, ...) (channels last with ``channels_last``),
    requantized: one compiled pass (:func:`_mean_bytes`, onnxruntime's integer sums and
    float32 rescaling) with per-tensor float32 scales."""

    op_type = "QLinearGlobalAveragePool"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.channels_last = bool(ctx.attribute("channels_last", 0))

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        typed = _output_type(inputs, 4)
        if typed is None or typed[1] is None or len(typed[1]) < 3:
            return [None if typed is None else (typed[0], None)]
        shape = typed[1]
        ones = (1,) * (len(shape) - 2)
        pooled = (shape[0], *ones, shape[-1]) if attributes.get("channels_last", 0) else (*shape[:2], *ones)
        return [(typed[0], pooled)]

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile the compiled pass now, at session construction, for byte X."""
        byte = _warm_up_byte(self.ctx.input_types[0], constants, 4)
        if byte is not None and byte[0] == byte[1]:
            one, zero = np.ones(1, np.float32), np.zeros(1, byte[0])
            self._compiled(np.zeros((1, 1, 1, 1), byte[0]), one, zero, one, zero)
        return None

    def run(self, x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None,
            y_scale: np.ndarray, y_zero_point: np.ndarray | None = None) -> Arrays:
        if x.ndim < 3:
            raise self.ctx.error(f"X must have shape (N, C, D1, ...), got {list(x.shape)}")
        fused = self._compiled(x, x_scale, x_zero_point, y_scale, y_zero_point)
        if fused is not None:
            return [fused]
        real = _channels_first(dequantize(self.ctx, "X", x, x_scale, x_zero_point), self.channels_last)
        mean = np.mean(real, axis=tuple(range(2, real.ndim)), keepdims=True, dtype=np.float32)
        pooled = quantize(self.ctx, mean, y_scale, y_zero_point, x)
        return [_channels_back(pooled, self.channels_last)]

    def _compiled(self, x: np.ndarray, x_scale: np.ndarray, x_zero: np.ndarray | None, y_scale: np.ndarray,
                  y_zero: np.ndarray | None) -> np.ndarray | None:
        """The compiled pass's output when it applies (byte X, float32 per-tensor scales, zero
        points of X's type, a sum that fits in 24 bits as onnxruntime requires), else None."""
        target = x.dtype if y_zero is None else y_zero.dtype
        if (target != x.dtype or x.dtype not in (np.dtype(np.uint8), np.dtype(np.int8))
                or any(p is not None and p.size != 1 for p in (x_scale, x_zero, y_scale, y_zero))
                or any(s.dtype != np.float32 for s in (x_scale, y_scale))
                or (x_zero is not None and x_zero.dtype != x.dtype) or not x.size):
            return None
        positions = math.prod(x.shape[1:-1] if self.channels_last else x.shape[2:])
        if positions >= 1 << 24:
            return None
        n, channels = x.shape[0], x.shape[-1] if self.channels_last else x.shape[1]
        planes = read_only(np.ascontiguousarray(x).reshape((n, positions, channels) if self.channels_last
                                                           else (n, channels, positions)))
        zeros = [0 if z is None else int(z.reshape(-1)[0]) for z in (x_zero, y_zero)]
        x_step, y_step = (np.float32(s.reshape(-1)[0]) for s in (x_scale, y_scale))
        scale = x_step / (y_step * np.float32(positions))
        out = np.empty((n, channels), target)
        parameters = np.array([scale, zeros[1], *_RANGES[target]], np.float32)
        _mean_bytes(planes, out, self.channels_last, -zeros[0] * positions, parameters)
        ones = (1,) * (x.ndim - 2)
        return out.reshape((n, *ones, channels) if self.channels_last else (n, channels, *ones))


class QLinearAveragePool(ContribKernel):
    """ONNX AveragePool (kernel_shape, strides, pads, auto_pad, ceil_mode, count_include_pad)
    of the real values, requantized; channels last with ``channels_last``."""

    op_type = "QLinearAveragePool"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.channels_last = bool(ctx.attribute("channels_last", 0))
        attributes = {k: v for k, v in ctx.attributes.items() if k != "channels_last"}
        self.pool_kernel = onnx_kernel(ctx, AveragePool, 19, attributes, (T.FLOAT,))

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        typed = _output_type(inputs, 4)
        return [None if typed is None else (typed[0], None)]

    def run(self, x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None,
            y_scale: np.ndarray, y_zero_point: np.ndarray | None = None) -> Arrays:
        real = _channels_first(dequantize(self.ctx, "X", x, x_scale, x_zero_point), self.channels_last)
        pooled = self.pool_kernel.run(np.ascontiguousarray(real))[0]
        return [_channels_back(quantize(self.ctx, pooled, y_scale, y_zero_point, x), self.channels_last)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    *(declare_contrib(kernel, BYTES) for kernel in (
        QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearConcat,
        QLinearWhere, QLinearGlobalAveragePool, QLinearAveragePool)),
    declare_contrib(QuantizeLinear), declare_contrib(DequantizeLinear),
)
