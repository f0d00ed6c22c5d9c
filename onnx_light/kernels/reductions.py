"""Reductions, ArgMax/ArgMin, Softmax and LogSoftmax.

Every Reduce* op is the :class:`Reduce` base class parameterised by one numpy
function ``(x, axis, keepdims) -> array``; the base class reads the axes (an
attribute before opset 13 for ReduceSum and 18 for the others, an input after),
``keepdims`` and ``noop_with_empty_axes``. float16 and bfloat16 are computed in
float32 and rounded back; integer results are cast back to the input type.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from ..tuning.schema import Parameter, Value
from .attention_calibration import calibrate_softmax
from .base import (
    Kernel,
    NodeContext,
    Prepared,
    TensorSpec,
    compute_dtype,
    ints,
    normalize_axes,
    normalize_axis,
)
from .compiled_softmax import SoftmaxRows
from .declaration import KernelDeclaration, declare, dispatch_table
from .fused_attention import ATTENTION_MINIMUM_FLOPS as DEFAULT_ATTENTION_MINIMUM_FLOPS
from .pooling import MEAN_ROWS_TYPES, mean_of_rows

__all__ = ["ATTENTION_MINIMUM_FLOPS", "KERNELS", "MINIMUM_ELEMENTS", "SOFTMAX_PARALLEL_MINIMUM",
           "Reduce", "Softmax", "softmax_parameters"]

MINIMUM_ELEMENTS = "parallel.minimum_elements"
ATTENTION_MINIMUM_FLOPS = "attention.minimum_flops"
#: The portable threshold of the compiled Softmax: elements of X from which its rows are split
#: over the session's threads (docs/attention.md).
SOFTMAX_PARALLEL_MINIMUM = 1 << 16


def softmax_parameters(element_type: int | None) -> tuple[Parameter, ...]:
    """Softmax's schema: the compiled (float32) rows' parallel threshold, and the threshold
    of the attention step the runtime may fuse around the node (``runtime/attention_fusion.py``)."""
    return (Parameter(MINIMUM_ELEMENTS, "int", SOFTMAX_PARALLEL_MINIMUM, minimum=1,
                      description="elements of X from which the rows are split over the threads "
                                  "(float32, compiled)"),
            Parameter(ATTENTION_MINIMUM_FLOPS, "int", DEFAULT_ATTENTION_MINIMUM_FLOPS, minimum=1,
                      description="multiply-adds of a fused attention's two products from which "
                                  "it runs as compiled tasks, over the threads in one region"))

Arrays = list[np.ndarray]
Reduction = Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray]


def _sum(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sum(x, axis=axis, keepdims=keepdims)


def _max(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """An empty maximum is -inf, or the type's lowest value (False for bool)."""
    lowest = False if x.dtype.kind == "b" else -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    return np.max(x, axis, keepdims=keepdims, initial=lowest)


def _min(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """An empty minimum is +inf, or the type's highest value (True for bool)."""
    highest = True if x.dtype.kind == "b" else np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).max
    return np.min(x, axis, keepdims=keepdims, initial=highest)


def _mean(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    count = math.prod(x.shape[a] for a in axis)
    return _sum(x, axis, keepdims) / count  # 0 / 0 is NaN: undefined by ONNX


def _log_sum_exp(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    x = x.astype(np.float64) if x.dtype.kind in "iu" else x  # x - max must not wrap around
    shift = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(shift), shift, 0)
    total = np.log(_sum(np.exp(x - shift), axis, True)) + shift
    return total if keepdims else np.squeeze(total, axis=axis)


def _widened(x: np.ndarray) -> np.ndarray:
    """Narrow floats compute in float32, integers in 64 bits (no wrapping squares or sums)."""
    if x.dtype.kind in "iu":
        return x.astype(np.int64 if x.dtype.kind == "i" else np.uint64, copy=False)
    return x.astype(compute_dtype(x.dtype), copy=False)


class Reduce(Kernel):
    """One Reduce* op: ``function`` reduces, the base class reads axes and keepdims."""

    function: ClassVar[Reduction]
    axes_input_since: ClassVar[int] = 18

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.keepdims = bool(ctx.attribute("keepdims", 1))
        self.noop = bool(ctx.attribute("noop_with_empty_axes", 0))

    def views(self) -> Sequence[Sequence[int]]:
        return ((0,),) if self.noop else ()  # no axes and noop_with_empty_axes: the input

    def run(self, x: np.ndarray, axes: np.ndarray | None = None) -> Arrays:
        from_input = self.ctx.opset >= self.axes_input_since
        given = ints(axes if from_input else self.ctx.attribute("axes")) or []
        if not given and self.noop and from_input:
            return [x]
        normalised = normalize_axes(self.ctx, given, x.ndim) if given else tuple(range(x.ndim))
        return [self._reduce(x, normalised)]

    def _reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        """``x`` reduced over ``axes`` (normalised) by :attr:`function`, in ``x``'s type."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            result = type(self).function(_widened(x), axes, self.keepdims)
            return np.asarray(result).astype(x.dtype, copy=False)


class ReduceSum(Reduce):
    op_type = "ReduceSum"
    axes_input_since = 13
    function = staticmethod(_sum)


class ReduceMean(Reduce):
    """The mean; float32 and float64 over trailing axes (the spatial means of CNNs) by
    :func:`~onnx_light.kernels.pooling.mean_rows` (one compiled pass, summed in float64 and
    rounded once: within one unit in the last place of the exact mean where numpy's float32
    sums drift), else numpy's sum divided by the count."""

    op_type = "ReduceMean"
    function = staticmethod(_mean)

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile :func:`~onnx_light.kernels.pooling.mean_rows` for the input's type (at
        construction)."""
        dtype = self.ctx.input_dtype(0)
        if dtype is not None and np.dtype(dtype) in MEAN_ROWS_TYPES:
            mean_of_rows(np.zeros((1, 1), dtype))
        return None

    def _reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        first = x.ndim - len(axes)
        if x.dtype in MEAN_ROWS_TYPES and x.size and axes and sorted(axes) == list(range(first, x.ndim)):
            means = mean_of_rows(x.reshape(math.prod(x.shape[:first]), -1))
            return means.reshape(x.shape[:first] + ((1,) * len(axes) if self.keepdims else ()))
        return super()._reduce(x, axes)


class ReduceMax(Reduce):
    op_type = "ReduceMax"
    function = staticmethod(_max)


class ReduceMin(Reduce):
    op_type = "ReduceMin"
    function = staticmethod(_min)


class ReduceProd(Reduce):
    op_type = "ReduceProd"
    function = staticmethod(lambda x, axis, keepdims: np.prod(x, axis, keepdims=keepdims))


class ReduceL1(Reduce):
    op_type = "ReduceL1"
    function = staticmethod(lambda x, axis, keepdims: _sum(np.abs(x), axis, keepdims))


class ReduceL2(Reduce):
    op_type = "ReduceL2"
    function = staticmethod(lambda x, axis, keepdims: np.sqrt(_sum(np.square(x), axis, keepdims)))


class ReduceSumSquare(Reduce):
    op_type = "ReduceSumSquare"
    function = staticmethod(lambda x, axis, keepdims: _sum(np.square(x), axis, keepdims))


class ReduceLogSum(Reduce):
    op_type = "ReduceLogSum"
    function = staticmethod(lambda x, axis, keepdims: np.log(_sum(x, axis, keepdims)))


class ReduceLogSumExp(Reduce):
    op_type = "ReduceLogSumExp"
    function = staticmethod(_log_sum_exp)


class ArgMax(Kernel):
    op_type = "ArgMax"
    function: ClassVar[Callable[..., np.ndarray]] = staticmethod(np.argmax)

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = ctx.attribute("axis", 0)
        self.keepdims = bool(ctx.attribute("keepdims", 1))
        self.last = bool(ctx.attribute("select_last_index", 0))

    def run(self, x: np.ndarray) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        size = x.shape[axis]
        if size == 0:
            raise self.ctx.error(f"cannot take {self.op_type} over the empty axis {self.axis}")
        data = x.astype(compute_dtype(x.dtype), copy=False)
        if self.last:
            found = size - 1 - type(self).function(np.flip(data, axis), axis=axis, keepdims=self.keepdims)
        else:
            found = type(self).function(data, axis=axis, keepdims=self.keepdims)
        return [np.asarray(found, np.int64)]


class ArgMin(ArgMax):
    op_type = "ArgMin"
    function = staticmethod(np.argmin)


class Softmax(Kernel):
    """Softmax along ``axis``; before opset 13 over everything from ``axis`` on (a 2-D view).

    float32 data runs the compiled rows of :mod:`.compiled_softmax` (the axis moved last
    when it is not), over numba's threads from ``parallel.minimum_elements`` elements on;
    other types compute with numpy in their compute type.
    """

    op_type = "Softmax"
    compiled: ClassVar[bool] = True  # LogSoftmax keeps numpy
    #: 2 since ``attention.minimum_flops`` chooses the fused attention's compiled tasks at any
    #: thread count (1: splitting its heads over the pool at more than one).
    tuning_abi: ClassVar[int] = 2

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = ctx.attribute("axis", 1 if ctx.opset < 13 else -1)

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.minimum_elements = int(values[MINIMUM_ELEMENTS])
        self.minimum_flops = int(values[ATTENTION_MINIMUM_FLOPS])

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile the rows now, at session construction (a warm cache loads them)."""
        if self.compiled and self.element_type == T.FLOAT:
            self.rows().compile()
        return None

    def rows(self) -> SoftmaxRows:
        """The compiled softmax with this kernel's threads and threshold."""
        return SoftmaxRows(self.num_threads, self.minimum_elements)

    @staticmethod
    def normalise(shifted: np.ndarray, axis: int) -> np.ndarray:
        exp = np.exp(shifted)
        return exp / np.sum(exp, axis=axis, keepdims=True)

    def run(self, x: np.ndarray) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        if self.compiled and x.dtype == np.float32:
            return [self._compiled(x, axis)]
        data = x.astype(compute_dtype(x.dtype), copy=False)
        if self.ctx.opset < 13:
            data, axis = data.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), 1
        with np.errstate(invalid="ignore", divide="ignore"):
            shifted = data - np.max(data, axis=axis, keepdims=True, initial=-np.inf)
            return [self.normalise(shifted, axis).reshape(x.shape).astype(x.dtype, copy=False)]

    def _compiled(self, x: np.ndarray, axis: int) -> np.ndarray:
        if x.size == 0:
            return np.empty(x.shape, np.float32)
        if self.ctx.opset < 13:  # one row per index before the axis
            rows = np.ascontiguousarray(x).reshape(math.prod(x.shape[:axis]), -1)
            out = np.empty(rows.shape, np.float32)
            self.rows()(rows, out)
            return out.reshape(x.shape)
        last = np.ascontiguousarray(np.moveaxis(x, axis, -1))
        out = np.empty(last.shape, np.float32)
        self.rows()(last, out)
        return np.moveaxis(out, -1, axis)

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The compiled rows into the given buffer for a float32 X whose rows are its last
        axis (the axis is last, or opset < 13); None otherwise."""
        ((shape, dtype),) = inputs
        if not self.compiled or dtype != np.float32 or not shape:
            return None
        axis = normalize_axis(self.ctx, self.axis, len(shape))
        if axis != len(shape) - 1 and self.ctx.opset >= 13:
            return None
        length = math.prod(shape[axis:])
        if length == 0 or math.prod(shape) == 0:
            return None
        rows = self.rows()

        def compute(x: np.ndarray, out: np.ndarray) -> None:
            rows(x.reshape(-1, length), out.reshape(-1, length))

        return Prepared(compute, shape, dtype)


class LogSoftmax(Softmax):
    op_type = "LogSoftmax"
    compiled = False

    @staticmethod
    def normalise(shifted: np.ndarray, axis: int) -> np.ndarray:
        # log(sum exp) = log(maxima + rest) = log(maxima) + log1p(rest / maxima): no cancellation
        # when one element dominates, where a plain log of the sum loses the small log-probabilities
        top = shifted == 0
        maxima = np.sum(top, axis=axis, keepdims=True).astype(shifted.dtype)
        rest = np.sum(np.where(top, 0, np.exp(shifted)), axis=axis, keepdims=True)
        return shifted - (np.log(maxima) + np.log1p(rest / maxima))


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(ArgMax, (1, 11, 12, 13)),
    declare(ArgMin, (1, 11, 12, 13)),
    declare(LogSoftmax, (1, 11, 13)),
    declare(ReduceL1, (1, 11, 13, 18)),
    declare(ReduceL2, (1, 11, 13, 18)),
    declare(ReduceLogSum, (1, 11, 13, 18, 28)),
    declare(ReduceLogSumExp, (1, 11, 13, 18, 28)),
    declare(ReduceMax, (1, 11, 12, 13, 18, 20)),
    declare(ReduceMean, (1, 11, 13, 18)),
    declare(ReduceMin, (1, 11, 12, 13, 18, 20)),
    declare(ReduceProd, (1, 11, 13, 18)),
    declare(ReduceSum, (1, 11, 13)),
    declare(ReduceSumSquare, (1, 11, 13, 18)),
    declare(Softmax, (1, 11, 13), types={1: (T.FLOAT16, T.FLOAT, T.DOUBLE),
                                         13: (T.FLOAT16, T.FLOAT, T.DOUBLE, T.BFLOAT16)},
            parameters=softmax_parameters,
            calibrate=calibrate_softmax(MINIMUM_ELEMENTS, ATTENTION_MINIMUM_FLOPS)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
