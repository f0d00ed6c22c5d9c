"""Conv's ``depthwise`` algorithm: a 1-D or 2-D convolution with one input channel per group,
compiled by numba (:func:`depthwise_channels`), one pass over each channel.

Each channel is copied into a zero-bordered *plane* (the padding, and with strides the
channel split into phases), and each kernel row is then one contiguous multiply-add pass of
its taps times shifted plane elements into the output rows, which LLVM vectorises:

* The plane holds every element an output reads, split by strides into phases: plane element
  (p, q) lies in phase (q % s_w, p % s_h), at row p // s_h and column q // s_w of it, the
  phases one after the other (column phase outermost). The elements one tap reads for
  consecutive outputs, a stride apart in the input, are then consecutive in one phase, so
  every stride is a stride-1 pass.
* The pass runs over the output rows at a phase's width, as one run (the columns past the
  output width computed and dropped when the result is copied out): one loop per kernel row,
  long however narrow the image, instead of one per output row and tap.
* The sum over a kernel row's taps is unrolled (numba compiles one version per kernel width);
  the bias starts each output and the optional clamp (``low``, ``high``: a fused Relu is
  ``(0, inf)``, Relu6 ``(0, 6)``) is applied as the result is copied out.

Every output is the bias plus its taps in the same order whatever the channels a thread
computes, so the result does not depend on the thread count. From ``parallel.region_flops``
the compiled call splits the (image, filter) pairs into one contiguous range per thread
(:func:`depthwise_channels_parallel`, one numba region: plan ``region``, docs/conv.md); below,
one thread computes them all.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..compiled import compiled, prange, read_only
from ..compiled_elementwise import numba_threads
from .blocks import _Algorithm
from .finish import Finish
from .problem import _Problem

__all__ = ["DepthwiseCall", "bound_entry", "compile_depthwise", "compiled_entry", "depthwise_applies",
           "depthwise_call", "depthwise_channels", "depthwise_channels_parallel", "plane_layout",
           "read_only", "region_threads"]

#: Output bytes per call of the compiled kernel when an epilogue follows: each call's block
#: is still in the second-level cache when the epilogue runs over it.
EPILOGUE_BLOCK_BYTES = 1 << 18


def depthwise_applies(window_rank: int, group_channels: int, groups: int) -> bool:
    """Whether ``depthwise`` computes a convolution: 1-D or 2-D, one input channel per group."""
    return window_rank <= 2 and group_channels == 1 and groups > 1


def compiled_entry(dispatcher: Any, arguments: tuple) -> Callable[..., None]:
    """numba's compiled entry of ``dispatcher`` for the types of ``arguments`` (compiled now,
    or loaded from numba's cache, if it is not yet): called with arguments of those types, it
    skips the dispatcher's typing of each argument, most of a tiny call's time. It checks no
    type: only for calls whose arguments' types are fixed when it is taken (a settled
    kernel's direct call)."""
    signature = tuple(dispatcher.typeof_pyval(argument) for argument in arguments)
    dispatcher.compile(signature)
    return dispatcher.overloads[signature].entry_point


def bound_entry(dispatcher: Any, x_sample: np.ndarray, weights: np.ndarray, bias: np.ndarray,
                out_sample: np.ndarray, tail: tuple) -> Callable[[np.ndarray, np.ndarray], None]:
    """``bound(x, out)``: ``dispatcher(x, weights, bias, out, *tail)`` through its
    :func:`compiled_entry` for ``x`` and ``out`` of the samples' types (not checked): a
    settled direct call, its constant arguments taken once."""
    entry = compiled_entry(dispatcher, (x_sample, weights, bias, out_sample, *tail))

    def bound(x: np.ndarray, out: np.ndarray) -> None:
        entry(x, weights, bias, out, *tail)

    return bound


def region_threads(threads: int) -> int:
    """The numba threads a compiled kernel's call may split its work over: ``threads``, or 1
    where this process may not run numba's regions (a fork of one that did:
    :func:`~onnx_light.kernels.compiled_elementwise.numba_threads`)."""
    return threads if threads > 1 and numba_threads(threads) else 1


def compile_depthwise(dtype: np.dtype, kernel_width: int, threads: int = 1) -> None:
    """Compile :func:`depthwise_channels` for ``dtype`` and ``kernel_width`` (or load it from
    numba's cache), and :func:`depthwise_channels_parallel` for more than one thread: a
    session does it at construction, not in its first run."""
    x = read_only(np.zeros((1, 1, kernel_width), dtype))
    w = read_only(np.zeros((1, 1, kernel_width), dtype))
    out = np.empty((1, 1, 1), dtype)
    phases, rows, columns = plane_layout((1, kernel_width), (1, 1), (1, kernel_width), (1, 1),
                                         (1, 1), (0, 0))
    arguments = (x, w, read_only(np.zeros(1, dtype)), out, 0, 1, 1, (1, 1), (0, 0), phases, rows,
                 columns, -np.inf, np.inf)
    depthwise_channels.dispatcher(*arguments)
    if region_threads(threads) > 1:
        depthwise_channels_parallel.dispatcher(*arguments, 1)


@dataclass(frozen=True)
class DepthwiseCall:
    """The geometry of the compiled depthwise convolution of one problem (its views' shapes,
    the plane's layout), made once per problem (:func:`depthwise_call`), and its calls over a
    range of output channels (:meth:`run`): what :class:`_CompiledDepthwise`'s blocks call,
    and what a Conv kernel calls directly without the algorithm object
    (:meth:`~onnx_light.kernels.conv.kernel.ConvKernel._run_depthwise`)."""

    x_shape: tuple[int, int, int]  # (N * C, H, W), 1-D as (N * C, 1, W)
    w_shape: tuple[int, int, int]  # (M, KH, KW)
    out_shape: tuple[int, int, int]  # (N * M, OH, OW)
    multiplier: int  # output channels per input channel
    strides: tuple[int, int]
    pads: tuple[int, int]
    phases: tuple[int, int]
    rows: np.ndarray
    columns: tuple[np.uintp, ...]
    channel_bytes: int  # of one output channel, per byte of its element type

    def run(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, out: np.ndarray, first: int,
            last: int, clamp: tuple[float, float], epilogue: Callable[[np.ndarray], None] | None,
            threads: int) -> None:
        """Output channels ``first:last`` of ``out`` (of :attr:`out_shape`) from the read-only
        views ``x`` and ``w`` (of :attr:`x_shape`, :attr:`w_shape`) and ``b`` (M,), clamped;
        with an ``epilogue``, by blocks of :data:`EPILOGUE_BLOCK_BYTES`, each finished by it
        while in cache; on ``threads`` numba threads (:func:`region_threads`) where a block has
        work for two."""
        step = (max(1, EPILOGUE_BLOCK_BYTES // (self.channel_bytes * out.itemsize))
                if epilogue is not None else 1 << 62)
        for start in range(first, last, step):
            stop = min(last, start + step)
            arguments = (x, w, b, out, start, stop, self.multiplier, self.strides, self.pads,
                         self.phases, self.rows, self.columns, *clamp)
            if min(threads, stop - start) > 1:  # a region only with work for two
                depthwise_channels_parallel.dispatcher(*arguments, min(threads, stop - start))
            else:
                depthwise_channels.dispatcher(*arguments)
            if epilogue is not None:
                epilogue(out[start:stop])

    def bind(self, w: np.ndarray, b: np.ndarray, channels: int, clamp: tuple[float, float],
             epilogue: Callable[[np.ndarray], None] | None, threads: int
             ) -> Callable[[np.ndarray, np.ndarray], None]:
        """:meth:`run` over output channels ``0:channels`` bound to the views ``w`` and ``b``,
        the clamp and the epilogue: ``bound(x, out)``, ``x`` and ``out`` of :attr:`x_shape`
        and :attr:`out_shape` and the weights' type (not checked). Without an epilogue and
        with one numba thread (``threads``; plan ``region``'s count is set on each call, per
        calling thread), :meth:`run`'s one compiled call through its compiled entry
        (:func:`compiled_entry`): the same bits."""
        if epilogue is not None or threads > 1:
            def bound(x: np.ndarray, out: np.ndarray) -> None:
                self.run(x, w, b, out, 0, channels, clamp, epilogue, region_threads(threads))

            return bound
        tail = (0, channels, self.multiplier, self.strides, self.pads, self.phases, self.rows,
                self.columns, *clamp)
        return bound_entry(depthwise_channels.dispatcher, read_only(np.zeros((1, 1, 1), w.dtype)), w, b,
                           np.empty((1, 1, 1), w.dtype), tail)


@functools.lru_cache(maxsize=1024)
def depthwise_call(problem: _Problem) -> DepthwiseCall:
    """The :class:`DepthwiseCall` of ``problem`` (a ``depthwise`` one), remembered per
    problem (a kernel's problems are remembered per shape, so few distinct ones recur)."""
    window = problem.window
    planar = len(window.input) == 1  # 1-D: one row

    def two(values: tuple[int, ...], fill: int) -> tuple[int, int]:
        return (fill, values[0]) if planar else (values[0], values[1])

    size, output, kernel = two(window.input, 1), two(window.output, 1), two(window.kernel, 1)
    strides, pads = two(window.strides, 1), two(window.begin, 0)
    phases, rows, columns = plane_layout(size, output, kernel, strides,
                                         two(window.dilations, 1), pads)
    return DepthwiseCall((problem.batch * problem.channels, *size), (problem.filters, *kernel),
                         (problem.batch * problem.filters, *output), problem.group_filters,
                         strides, pads, phases, rows, columns, math.prod(output))


class _CompiledDepthwise(_Algorithm):
    """The compiled depthwise convolution of whole channels (a block's output rows are all
    of them), through its :class:`DepthwiseCall`; ``threads`` (the ``region`` plan) the numba
    threads each compiled call splits its channels over."""

    uses_blas: ClassVar[bool] = False

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None, threads: int = 1) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        self.threads = region_threads(threads)
        self.call = call = depthwise_call(problem)
        self.x = read_only(x.reshape(call.x_shape))
        self.w = read_only(w.reshape(call.w_shape))
        self.b = read_only(np.zeros(problem.filters, x.dtype) if b is None else b)
        self.out = out.reshape(call.out_shape)
        # a fused clamp alone (Relu, Clip: no residual, no other activation) is applied by the
        # kernel as it copies the result out; any other epilogue runs on each finished block
        self.clamp = (-np.inf, np.inf)
        if isinstance(epilogue, Finish) and epilogue.residual is None and epilogue.clamp is not None:
            self.clamp, self.epilogue = epilogue.clamp, None

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        """Output channels of (image, group) pairs ``start:stop`` (all their rows)."""
        self.call.run(self.x, self.w, self.b, self.out, start * self.mg, stop * self.mg,
                      self.clamp, self.epilogue, self.threads)


@compiled(fastmath=True)
def depthwise_channels(x: np.ndarray, w: np.ndarray, b: np.ndarray, out: np.ndarray,
                       first: int, last: int, multiplier: int, strides: tuple[int, int],
                       pads: tuple[int, int],
                       phases: tuple[int, int], rows: np.ndarray, columns: tuple[int, ...],
                       low: float, high: float) -> None:
    """Channels ``first:last`` of ``out`` (N * M, OH, OW) from ``x`` (N * C, H, W), ``w``
    (M, KH, KW) and ``b`` (M,) (zeros for no bias), clamped into ``[low, high]``; output
    channel m reads input channel ``m // multiplier`` (M = C * multiplier).

    See the module docstring for the plane: ``phases`` are the rows and columns of one of
    its phases, ``rows`` (KH,) and ``columns`` (KW,) the offsets of the kernel's rows and
    columns in it (from :func:`plane_layout`). ``columns`` is a tuple, so that numba
    compiles one version per kernel width, in which the sum over a kernel row is unrolled.
    The loops index with unsigned offsets and make no views: numba then emits no
    negative-index fix-up and no reference counting in them, and LLVM vectorises them."""
    height, width = x.shape[1], x.shape[2]
    out_h, out_w = out.shape[1], out.shape[2]
    channels, kernel_h = w.shape[0], w.shape[1]
    stride_h, stride_w = np.uintp(strides[0]), np.uintp(strides[1])
    phase_rows, phase_width = np.uintp(phases[0]), np.uintp(phases[1])
    phase_size = phase_rows * phase_width
    plane = np.zeros(stride_w * stride_h * phase_size, x.dtype)
    run = np.uintp(out_h) * phase_width  # the output rows at a phase's width
    result = np.empty(run, out.dtype)
    source, target, taps = x.reshape(-1), out.reshape(-1), w.reshape(-1)
    low_value, high_value = out.dtype.type(low), out.dtype.type(high)
    kernel_w = np.uintp(len(columns))
    for pair in range(first, last):
        c = np.uintp(pair % channels)
        start = np.uintp(pair // multiplier) * np.uintp(height * width)
        for ih in range(np.uintp(height)):  # plane element (p, q) at its phases' place
            p = ih + np.uintp(pads[0])
            into = (p % stride_h) * phase_size + (p // stride_h) * phase_width
            if stride_w == 1:
                into += np.uintp(pads[1])
                for iw in range(np.uintp(width)):
                    plane[into + iw] = source[start + iw]
            else:  # phase r holds the plane columns q = m * stride_w + r, input column q - pad
                for r in range(strides[1]):
                    lowest = max(0, -(-(pads[1] - r) // strides[1]))
                    highest = (pads[1] + width - 1 - r) // strides[1]
                    phase = into + np.uintp(r) * stride_h * phase_size
                    read = start + np.uintp(lowest * strides[1] + r - pads[1])
                    for m in range(np.uintp(max(0, highest + 1 - lowest))):
                        plane[phase + np.uintp(lowest) + m] = source[read + m * stride_w]
            start += np.uintp(width)
        bias = b[c]
        for j in range(run):
            result[j] = bias
        for kh in range(np.uintp(kernel_h)):  # one contiguous pass per kernel row
            tap, shift = (c * np.uintp(kernel_h) + kh) * kernel_w, rows[kh]
            for j in range(run):
                total = result[j]
                for k in range(kernel_w):
                    total += taps[tap + k] * plane[shift + j + np.uintp(columns[k])]
                result[j] = total
        into = np.uintp(pair) * np.uintp(out_h * out_w)
        for oh in range(np.uintp(out_h)):  # the clamp, and the copy out of the wide rows
            line = oh * phase_width
            for ow in range(np.uintp(out_w)):
                target[into + ow] = min(max(result[line + ow], low_value), high_value)
            into += np.uintp(out_w)


@compiled(parallel=True)
def depthwise_channels_parallel(x: np.ndarray, w: np.ndarray, b: np.ndarray, out: np.ndarray,
                                first: int, last: int, multiplier: int, strides: tuple[int, int],
                                pads: tuple[int, int], phases: tuple[int, int], rows: np.ndarray,
                                columns: tuple[int, ...], low: float, high: float,
                                threads: int) -> None:
    """:func:`depthwise_channels` with channels ``first:last`` split in ``threads`` contiguous
    ranges run by numba's threads (the caller has set their count), each with its own plane:
    the same values, whichever thread computes a channel."""
    count = last - first
    for t in prange(threads):
        start, stop = first + t * count // threads, first + (t + 1) * count // threads
        if start < stop:
            depthwise_channels(x, w, b, out, start, stop, multiplier, strides, pads, phases, rows,
                               columns, low, high)


@functools.lru_cache(maxsize=256)
def plane_layout(size: tuple[int, int], output: tuple[int, int], kernel: tuple[int, int],
                 strides: tuple[int, int], dilations: tuple[int, int], pads: tuple[int, int]
                 ) -> tuple[tuple[int, int], np.ndarray, tuple[np.uintp, ...]]:
    """The plane of :func:`depthwise_channels` for one geometry: the rows and columns of a
    phase, and the offsets of the kernel's rows (a read-only array) and columns (a tuple).
    Cached: a model's convolutions have few geometries, and each run needs its own."""
    phases = []
    for axis in range(2):
        reach = (kernel[axis] - 1) * dilations[axis] // strides[axis]
        # every element an output reads (one row more: the wide run's dropped columns reach
        # into the next row), and every input element
        phases.append(max(output[axis] + reach + (axis == 0),
                          -(-(pads[axis] + size[axis]) // strides[axis])))
    phase_size = phases[0] * phases[1]

    def offset(k: int, axis: int) -> tuple[int, int]:
        distance = k * dilations[axis]
        return distance % strides[axis], distance // strides[axis]  # phase, index in it

    rows = np.array([phase * phase_size + index * phases[1]
                     for phase, index in map(functools.partial(offset, axis=0), range(kernel[0]))],
                    np.uintp)
    rows.flags.writeable = False
    columns = tuple(np.uintp(phase * strides[0] * phase_size + index)
                    for phase, index in map(functools.partial(offset, axis=1), range(kernel[1])))
    return (phases[0], phases[1]), rows, columns
