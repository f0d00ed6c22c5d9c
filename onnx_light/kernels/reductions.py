"""Reductions, ArgMax/ArgMin, Softmax and LogSoftmax.

Every Reduce* op is the :class:`Reduce` base class parameterised by one numpy
function ``(x, axis, keepdims) -> array``; the base class reads the axes (an
attribute before opset 13 for ReduceSum and 18 for the others, an input after),
``keepdims`` and ``noop_with_empty_axes``. float16 and bfloat16 are computed in
float32 and rounded back; integer results are cast back to the input type.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from .base import Kernel, NodeContext, compute_dtype, ints, normalize_axes, normalize_axis
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "Reduce"]

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
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            result = type(self).function(_widened(x), normalised, self.keepdims)
            return [np.asarray(result).astype(x.dtype, copy=False)]


class ReduceSum(Reduce):
    op_type = "ReduceSum"
    axes_input_since = 13
    function = staticmethod(_sum)


class ReduceMean(Reduce):
    op_type = "ReduceMean"
    function = staticmethod(_mean)


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
    """Softmax along ``axis``; before opset 13 over everything from ``axis`` on (a 2-D view)."""

    op_type = "Softmax"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = ctx.attribute("axis", 1 if ctx.opset < 13 else -1)

    @staticmethod
    def normalise(shifted: np.ndarray, axis: int) -> np.ndarray:
        exp = np.exp(shifted)
        return exp / np.sum(exp, axis=axis, keepdims=True)

    def run(self, x: np.ndarray) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        data = x.astype(compute_dtype(x.dtype), copy=False)
        if self.ctx.opset < 13:
            data, axis = data.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), 1
        with np.errstate(invalid="ignore", divide="ignore"):
            shifted = data - np.max(data, axis=axis, keepdims=True, initial=-np.inf)
            return [self.normalise(shifted, axis).reshape(x.shape).astype(x.dtype, copy=False)]


class LogSoftmax(Softmax):
    op_type = "LogSoftmax"

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
    declare(Softmax, (1, 11, 13)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
