"""Linear quantization: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear.

A scale and its zero point say how a quantized tensor maps to real numbers,
``real = (q - zero_point) * scale``, per tensor (a scalar), per axis (a 1-D tensor along
``axis``) or per block (the input's shape with ``axis`` cut into ``ceil(D / block_size)``
blocks). :func:`expand_parameter` checks a scale or zero point against its input and
broadcasts it; :func:`requantize` rounds and saturates real values to a quantized type, and
the integer products (:mod:`~onnx_light.kernels.quantized_products`) reuse both.

Integer targets round half to even and saturate to the type's range (int2 ``[-2, 1]`` to
uint16 ``[0, 65535]``); float8 targets saturate to their largest finite value unless
``saturate`` is 0; float4 and float6 have no infinity, so their casts saturate anyway. The
narrow element types (int2/int4/uint2/uint4, float8, float4, float6) are held in ml_dtypes'
numpy types, imported on first use through :func:`~onnx_light.kernels.base.numpy_dtype`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from ..tuning.keys import ElementType as T
from .base import FLOAT8_TYPES, Kernel, NodeContext, narrow_float_dtypes, normalize_axis, numpy_dtype
from .compiled import compiled, read_only
from .declaration import KernelDeclaration, declare
from .structural import cast

__all__ = ["DECLARATIONS", "INTEGER_RANGES", "expand_parameter", "quantized_type", "requantize"]

Arrays = list[np.ndarray]

#: The saturation range of each integer quantized type, as the spec states it.
INTEGER_RANGES: dict[int, tuple[int, int]] = {
    T.UINT2: (0, 3), T.INT2: (-2, 1), T.UINT4: (0, 15), T.INT4: (-8, 7),
    T.UINT8: (0, 255), T.INT8: (-128, 127), T.UINT16: (0, 65535), T.INT16: (-32768, 32767),
}

# The quantized types each since-version takes (QuantizeLinear's output, DequantizeLinear's input).
_Q10 = (T.INT8, T.UINT8)
_Q19 = (*_Q10, *FLOAT8_TYPES)
_Q21 = (*_Q19, T.INT16, T.UINT16, T.UINT4, T.INT4)
_Q23 = (*_Q21, T.FLOAT4E2M1)
_Q25 = (*_Q23, T.UINT2, T.INT2)
_Q28 = (*_Q25, T.FLOAT6E2M3, T.FLOAT6E3M2)
QUANTIZED_TYPES = {10: _Q10, 19: _Q19, 21: _Q21, 23: _Q23, 25: _Q25, 28: _Q28}
# The real types: QuantizeLinear's input and scale, DequantizeLinear's output.
_REAL10 = (T.FLOAT,)
_REAL19 = (T.FLOAT, T.FLOAT16, T.BFLOAT16)
VERSIONS = (10, 13, 19, 21, 23, 24, 25, 28)


def _in_force(table: dict[int, tuple[int, ...]], opset: int) -> tuple[int, ...]:
    return table[max(v for v in table if v <= opset)]


@functools.cache
def _types_by_dtype() -> dict[np.dtype, int]:
    return {numpy_dtype(t): t for t in (*_Q28, T.INT32)}


def quantized_type(dtype: np.dtype) -> int | None:
    """The element type of a quantized array's dtype (None: not a quantized type)."""
    return _types_by_dtype().get(np.dtype(dtype))


def expand_parameter(ctx: NodeContext, name: str, value: np.ndarray, shape: Sequence[int],
                     axis: int, block_size: int = 0) -> np.ndarray:
    """A scale or zero point broadcastable to an input of ``shape``: a scalar as it is, a
    1-D tensor along ``axis``, or blocks of ``block_size`` along ``axis`` repeated to the
    input's shape; any other shape is the node's error."""
    if value.ndim <= 1 and value.size == 1 and not block_size:
        return value.reshape(())
    rank = len(shape)
    if not block_size:
        if value.ndim != 1:
            raise ctx.error(f"{name} must be a scalar or a 1-D tensor (per axis), got shape "
                            f"{list(value.shape)}; give block_size for blocked quantization")
        a = normalize_axis(ctx, axis, rank)
        if value.shape[0] != shape[a]:
            raise ctx.error(f"{name} has {value.shape[0]} values but axis {axis} of the input "
                            f"(shape {list(shape)}) has {shape[a]}")
        return value.reshape([-1 if i == a else 1 for i in range(rank)])
    a = normalize_axis(ctx, axis, rank)
    blocks = -(-shape[a] // block_size)
    expected = [blocks if i == a else d for i, d in enumerate(shape)]
    if list(value.shape) != expected:
        raise ctx.error(f"{name} of shape {list(value.shape)} does not match block_size "
                        f"{block_size} on axis {axis} of the input (shape {list(shape)}): "
                        f"expected shape {expected}")
    return np.repeat(value, block_size, axis=a)[tuple(
        slice(0, shape[a]) if i == a else slice(None) for i in range(rank))]


def requantize(values: np.ndarray, element_type: int, saturate: bool = True,
               zero_point: np.ndarray | None = None) -> np.ndarray:
    """Real ``values`` (already divided by the scale) plus ``zero_point`` as ``element_type``:
    for integers ``round(values) + zero_point`` (half to even, then the integer zero point)
    saturated to :data:`INTEGER_RANGES`; floats are cast, saturating unless ``saturate`` is
    false."""
    zero = None if zero_point is None else _real(zero_point)
    if element_type in INTEGER_RANGES:
        low, high = INTEGER_RANGES[element_type]
        rounded = np.rint(values)
        if zero is not None:  # in the values' type: exact below 2**24, saturated above
            rounded += zero.astype(rounded.dtype)
        with np.errstate(invalid="ignore"):
            return np.clip(rounded, low, high, out=rounded).astype(numpy_dtype(element_type))
    return cast(values if zero is None else values + zero, element_type, saturate)


def _real(x: np.ndarray) -> np.ndarray:
    """``x`` in a type numpy computes in exactly: narrow floats as float32, integers as int64."""
    if x.dtype.kind in "iu" or quantized_type(x.dtype) in INTEGER_RANGES:
        return x.astype(np.int64)
    return x.astype(np.float32) if x.dtype in narrow_float_dtypes() or x.dtype.kind == "V" else x


def _divide(x: np.ndarray, scale: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x / scale`` rounded to ``dtype`` (a narrow float is computed in float32 and rounded,
    as numpy and ml_dtypes do), returned in float32 or float64."""
    if dtype in narrow_float_dtypes():
        quotient = x.astype(np.float32) / scale.astype(np.float32)
        return quotient.astype(dtype).astype(np.float32)
    return x.astype(dtype) / scale.astype(dtype)


@compiled
def _quantize_bytes(x, parameters, out):
    """QuantizeLinear per tensor from float32 to a byte type, in one pass (flat arrays):
    ``x / scale`` in float32, rounded half to even, plus ``zero``, saturated to ``low:high``
    (``parameters``: float32 ``scale, zero, low, high``); the numpy path's operations, so bit
    for bit its values (NaN aside: undefined)."""
    scale, zero, lowest, highest = parameters
    for i in range(np.uintp(x.size)):
        out[i] = min(max(np.rint(x[i] / scale) + zero, lowest), highest)


_BYTE_DTYPES = (np.dtype(np.uint8), np.dtype(np.int8))


class _Linear(Kernel):
    """What QuantizeLinear and DequantizeLinear share: axis, block_size and output_dtype."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = int(ctx.attribute("axis", 1))
        self.block_size = int(ctx.attribute("block_size", 0))
        if self.block_size < 0:
            raise ctx.error(f"block_size must be 0 or positive, got {self.block_size}")
        self.output_dtype = int(ctx.attribute("output_dtype", 0))

    def parameters(self, x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None
                   ) -> tuple[np.ndarray, np.ndarray | None]:
        """The scale and zero point broadcastable to ``x``, their shapes checked."""
        if zero_point is not None and zero_point.shape != scale.shape and not (
                zero_point.size == scale.size == 1 and max(zero_point.ndim, scale.ndim) <= 1):
            raise self.ctx.error(f"the zero point's shape {list(zero_point.shape)} differs from "
                                 f"the scale's {list(scale.shape)}")
        if self.ctx.opset < 21 and scale.ndim > 1:
            raise self.ctx.error(f"the scale must be a scalar or a 1-D tensor before opset 21, "
                                 f"got shape {list(scale.shape)}")
        expand = functools.partial(expand_parameter, self.ctx, shape=x.shape, axis=self.axis,
                                   block_size=self.block_size)
        return expand("scale", scale), None if zero_point is None else expand("zero point", zero_point)


class QuantizeLinear(_Linear):
    """``y = saturate(round(x / y_scale) + y_zero_point)``; the zero point's type (or
    ``output_dtype``, or uint8) is the output type."""

    op_type = "QuantizeLinear"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.saturate = bool(ctx.attribute("saturate", 1))
        self.precision = int(ctx.attribute("precision", 0))
        allowed = _in_force(QUANTIZED_TYPES, ctx.opset)
        if self.output_dtype and self.output_dtype not in allowed:
            raise ctx.error(f"output_dtype {self.output_dtype} is not a quantized type of "
                            f"QuantizeLinear-{ctx.opset}: valid codes {list(allowed)}")
        if self.precision and self.precision not in (T.FLOAT, T.FLOAT16, T.BFLOAT16, T.INT32):
            raise ctx.error(f"precision {self.precision} must be float, float16, bfloat16 or int32")

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile the byte pass now, at session construction, for float32 X and the output
        type a constant zero point (or ``output_dtype``, or uint8) gives."""
        zero = constants[2] if len(constants) > 2 else None
        output = zero.dtype if zero is not None else numpy_dtype(self.output_dtype or T.UINT8)
        if (self.ctx.input_types[:1] == (T.FLOAT,) and self.precision in (0, T.FLOAT)
                and output in _BYTE_DTYPES):
            _quantize_bytes(read_only(np.zeros(1, np.float32)), np.zeros(4, np.float32), np.empty(1, output))
        return None

    def run(self, x: np.ndarray, y_scale: np.ndarray, y_zero_point: np.ndarray | None = None
            ) -> Arrays:
        target = self.output_dtype or T.UINT8
        if y_zero_point is not None:
            zero_type = quantized_type(y_zero_point.dtype)
            if zero_type is None or zero_type not in _in_force(QUANTIZED_TYPES, self.ctx.opset):
                raise self.ctx.error(f"the zero point's type {y_zero_point.dtype} is not a "
                                     "quantized type of this version")
            if self.output_dtype and zero_type != self.output_dtype:
                raise self.ctx.error(f"the zero point's type {y_zero_point.dtype} differs from "
                                     f"output_dtype {numpy_dtype(self.output_dtype)}")
            target = zero_type
        scale, zero = self.parameters(x, y_scale, y_zero_point)
        output = numpy_dtype(target)
        if (x.dtype == np.float32 and scale.dtype == np.float32 and scale.size == 1 and output in _BYTE_DTYPES
                and self.precision in (0, T.FLOAT) and x.size):
            out = np.empty(x.shape, output)
            info = np.iinfo(output)
            parameters = np.array([scale.item(), 0 if zero is None else zero.item(), info.min, info.max],
                                  np.float32)
            _quantize_bytes(read_only(np.ascontiguousarray(x).reshape(-1)), parameters, out.reshape(-1))
            return [out]
        if self.precision:
            dtype = numpy_dtype(self.precision)
        else:
            try:
                dtype = np.result_type(x.dtype, scale.dtype)
            except TypeError:  # float16 with bfloat16
                dtype = np.dtype(np.float32)
        return [requantize(_divide(x, scale, dtype), target, self.saturate, zero)]


class DequantizeLinear(_Linear):
    """``y = (x - x_zero_point) * x_scale``, the difference exact; the output has the scale's
    type, or ``output_dtype``."""

    op_type = "DequantizeLinear"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        if self.output_dtype and self.output_dtype not in _REAL19:
            raise ctx.error(f"output_dtype {self.output_dtype} must be float, float16 or bfloat16")

    def run(self, x: np.ndarray, x_scale: np.ndarray, x_zero_point: np.ndarray | None = None
            ) -> Arrays:
        if x_zero_point is not None and x_zero_point.dtype != x.dtype:
            raise self.ctx.error(f"the zero point's type {x_zero_point.dtype} differs from the "
                                 f"input's {x.dtype}")
        if self.output_dtype:
            out = numpy_dtype(self.output_dtype)
        elif x_scale.dtype == numpy_dtype(T.FLOAT8E8M0):
            raise self.ctx.error("a float8e8m0 scale needs output_dtype (the output's type)")
        else:
            out = x_scale.dtype
        scale, zero = self.parameters(x, x_scale, x_zero_point)
        if x.dtype.kind in "iu" and x.dtype.itemsize <= 2:  # the difference is exact in float32
            real = x.astype(np.float32) if zero is None else np.subtract(x, zero, dtype=np.float32)
            real *= scale.astype(np.float32)
            return [real.astype(out, copy=False)]
        difference = _real(x) if zero is None else _real(x) - _real(zero)
        real_type = np.float64 if x.dtype == np.int32 else np.float32
        return [(difference.astype(real_type) * scale.astype(np.float32)).astype(out)]


class DynamicQuantizeLinear(Kernel):
    """uint8 quantization of a float tensor with the scale and zero point its range gives:
    the range ``[min(0, min x), max(0, max x)]`` mapped onto ``[0, 255]``."""

    op_type = "DynamicQuantizeLinear"

    def run(self, x: np.ndarray) -> Arrays:
        if x.size == 0:
            raise self.ctx.error("cannot compute a quantization range from an empty tensor")
        high = np.float32(max(0.0, float(np.max(x))))
        low = np.float32(min(0.0, float(np.min(x))))
        scale = (np.float32(1.0) if high == low else high - low) / np.float32(255)
        zero = np.array(np.rint(np.clip(-low / scale, 0, 255)), np.uint8)
        return [requantize(x / scale, T.UINT8, zero_point=zero), np.array(scale, x.dtype), zero]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(QuantizeLinear, VERSIONS, types={10: (*_REAL10, T.INT32), 19: (*_REAL19, T.INT32)}),
    declare(DequantizeLinear, VERSIONS,
            types={v: (*types, T.INT32) for v, types in QUANTIZED_TYPES.items()}),
    declare(DynamicQuantizeLinear, (11,), types=(T.FLOAT,)),
)
