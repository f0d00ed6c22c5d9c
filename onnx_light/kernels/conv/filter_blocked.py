"""Conv's ``filters_blocked`` algorithm: a float32 2-D full convolution (group 1) with few
input channels, the stem of a CNN (3x3 stride 2 over an RGB image), computed with vector
registers of L lanes (L of :func:`~onnx_light.kernels.conv.channel_blocked.vector_lanes`).

im2col copies such a convolution's 27 taps per output position and multiplies them by a
27-deep product, which BLAS computes far below its peak; here each output is the bias plus,
for each tap (input channel, kernel row, kernel column) in that order, the filter's weight
times the tap's input value, one fused multiply-add each. Where an output row has at least
:data:`~onnx_light.kernels.conv.channel_blocked.COLUMN_VECTORS` x L columns and the stride
along it is 1 or 2 (every stem of the zoo), the lanes are consecutive output columns:
``columns_broadcast`` computes 3 x L columns of L/2 filters at once, 12 sums in registers,
each tap one vector load per L columns and one broadcast weight per filter, and stores each
filter's row directly (no transpose); at stride 2 the input's columns are split into their
two phases as the tile is filled (``split_pairs``), so that a tap's inputs for consecutive
outputs are consecutive. Elsewhere the lanes are L filters (``positions_broadcast``: L
positions in L registers, each tap the filters' weights as one vector times the input value
broadcast, then transposed into the filters' planes). The sums are clamped (a fused Relu or
Clip) and a fused HardSigmoid or HardSwish is computed in registers before they are stored;
another fused compiled activation (SiLU, ...) follows on the stored rows. The input rows a
band of output rows reads (:data:`TILE_BYTES`) are copied into a tile with zeros for the
padding (its padding columns never written, its padding rows zeroed band by band), which
every block of filters then reads while it is in cache. At more than one thread (plan
``region``) one compiled call splits the output rows over numba's threads
(:func:`blocked_filters_parallel`), each with its own tile.

The weights are arranged once per weight set as ``(M/L, C*KH*KW, L)``
(:func:`~onnx_light.kernels.conv.channel_blocked.blocked_weights`). Numerics: every output is
its bias plus its C*KH*KW terms in that order, one rounding each (a fused multiply-add),
within the bound of :mod:`~onnx_light.kernels.conv.numerics`; a sum does not depend on the
other lanes, the block, the rows a thread computes, L, or whether its lanes are filters or
columns: the same bits at any thread count and by either intrinsic.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..compiled import compiled, prange
from ..compiled_activations import activate_run
from .blocks import _Algorithm
from .channel_blocked import (
    COLUMN_VECTORS,
    _columns_broadcast,
    _lane_count,
    _positions_broadcast,
    _split_pairs,
    blocked_weights,
    output_chunks,
    padded_bias,
    register_gate,
    vector_lanes,
)
from .depthwise import EPILOGUE_BLOCK_BYTES, bound_entry, read_only, region_threads
from .finish import fused_parts
from .problem import _Problem

__all__ = ["TILE_BYTES", "FiltersCall", "blocked_filters", "blocked_filters_parallel",
           "compile_filters", "filters_applies", "filters_call"]

#: The tile's bytes per band of output rows: the input rows a band reads stay in the
#: second-level cache while every block of filters passes over them.
TILE_BYTES = 1 << 16


def filters_applies(dtype: np.dtype, window_rank: int, groups: int,
                    dilations: tuple[int, ...]) -> bool:
    """Whether ``filters_blocked`` computes a convolution: float32, 2-D, group 1, dilation 1,
    on a processor with AVX-512 or AVX2 and FMA."""
    return (np.dtype(dtype) == np.float32 and window_rank == 2 and groups == 1
            and all(d == 1 for d in dilations) and vector_lanes() > 0)


@compiled
def blocked_filters(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, out: np.ndarray,
                    first: int, last: int, r0: int, r1: int, band: int, channels: int, filters: int,
                    size: tuple[int, int], output: tuple[int, int], kernel: tuple[int, int],
                    strides: tuple[int, int], pads: tuple[int, int], low: float, high: float,
                    code: int, alpha: float, beta: float) -> None:
    """Output rows ``r0:r1`` of images ``first:last`` of ``out`` (flat N x M x OH x OW) from
    ``x`` (flat N x C x H x W), ``weights`` and ``bias`` arranged by
    :func:`~onnx_light.kernels.conv.channel_blocked.blocked_weights` (the bias padded to whole
    blocks), clamped into [low, high], then activation ``code`` of
    :data:`~onnx_light.kernels.compiled_activations.ACTIVATIONS` (-1: none); by bands of
    ``band`` output rows, whose input rows the tile holds while every block of filters reads
    them."""
    lanes = _lane_count()
    height, width = size
    out_h, out_w = output
    kernel_h, kernel_w = kernel
    half = lanes // 2
    span = COLUMN_VECTORS * lanes
    # L/2 filters by COLUMN_VECTORS x L columns of a row at a time (columns_broadcast), where
    # a row has that many and the columns are at most 2 apart; at stride 2 the tile's rows
    # hold the padded input's columns split into their two phases (column q at
    # (q % 2) * phase_w + q // 2), so that the columns a tap reads for consecutive outputs
    # are consecutive
    by_columns = out_w >= span and strides[1] <= 2
    phases = strides[1] if by_columns else 1
    padded_w = max(pads[1] + width, (out_w - 1) * strides[1] + kernel_w)
    phase_w = -(-padded_w // phases)
    tile_w = phases * phase_w
    tile_h = (min(band, r1 - r0) - 1) * strides[0] + kernel_h
    tile_plane = tile_h * tile_w
    tile = np.zeros(channels * tile_plane, np.float32)
    taps = channels * kernel_h * kernel_w
    offsets = np.empty(taps, np.int64)
    for c in range(channels):
        for i in range(kernel_h):
            for j in range(kernel_w):
                offsets[(c * kernel_h + i) * kernel_w + j] = (c * tile_plane + i * tile_w
                                                              + (j % phases) * phase_w + j // phases)
    # where a row's input column pairs go (the even columns first: padded column pads[1])
    even = (pads[1] % 2) * phase_w + pads[1] // 2
    odd = ((pads[1] + 1) % 2) * phase_w + (pads[1] + 1) // 2
    out_plane = out_h * out_w
    scratch = np.zeros(lanes * lanes, np.float32)  # fewer than L positions
    blocks = -(-filters // lanes)
    low32, high32 = np.float32(low), np.float32(high)
    gate, alpha32, beta32 = register_gate(code), np.float32(alpha), np.float32(beta)
    for b0 in range(r0, r1, band):
        b1 = min(r1, b0 + band)
        positions = (b1 - b0) * out_w
        if not by_columns:
            firsts, bases = output_chunks(positions, out_w, strides, tile_w, lanes)
        rows_in = (b1 - b0 - 1) * strides[0] + kernel_h  # padded rows b0 * stride_h onwards
        for n in range(first, last):
            for c in range(channels):
                for t in range(rows_in):
                    ih = b0 * strides[0] + t - pads[0]
                    row = c * tile_plane + t * tile_w
                    if not 0 <= ih < height:  # a padding row (an earlier band may have held input)
                        # unsigned: numba then emits no negative-index fix-up
                        for iw in range(np.uintp(tile_w)):
                            tile[np.uintp(row) + iw] = 0.0
                        continue
                    source = ((n * channels + c) * height + ih) * width
                    if phases == 1:
                        into = np.uintp(row + pads[1])
                        for iw in range(np.uintp(width)):
                            tile[into + iw] = x[np.uintp(source) + iw]
                        continue
                    pairs = width // 2
                    whole = pairs - pairs % lanes
                    for m in range(0, whole, lanes):
                        _split_pairs(x, source + 2 * m, tile, row + even + m, row + odd + m)
                    for m in range(whole, pairs):
                        tile[row + even + m] = x[source + 2 * m]
                        tile[row + odd + m] = x[source + 2 * m + 1]
                    if width % 2:
                        tile[row + even + pairs] = x[source + width - 1]
            for k in range(blocks):
                rows = min(lanes, filters - k * lanes)
                out_at = (n * filters + k * lanes) * out_plane + b0 * out_w
                w_at = k * taps * lanes
                if by_columns:
                    for h in range(0, rows, half):
                        for i in range(b1 - b0):
                            window = i * strides[0] * tile_w
                            for j in range(0, out_w, span):
                                j0 = min(j, out_w - span)  # the last overlaps the ones before
                                _columns_broadcast(tile, window + j0, offsets, weights, w_at + h,
                                                   bias, k * lanes + h, low32, high32, gate,
                                                   alpha32, beta32, out,
                                                   out_at + h * out_plane + i * out_w + j0,
                                                   out_plane, rows - h)
                elif positions >= lanes:
                    for chunk in range(firsts.shape[0]):
                        _positions_broadcast(tile, bases, chunk * lanes, offsets, weights, w_at, bias,
                                             k * lanes, low32, high32, gate, alpha32, beta32, out,
                                             out_at + firsts[chunk], out_plane, rows)
                else:
                    _positions_broadcast(tile, bases, 0, offsets, weights, w_at, bias, k * lanes,
                                         low32, high32, gate, alpha32, beta32, scratch, 0, lanes,
                                         rows)
                    for r in range(rows):
                        for j in range(positions):
                            out[out_at + r * out_plane + j] = scratch[r * lanes + j]
                if code >= 0 and gate == 0:
                    for r in range(rows):
                        # unsigned: no negative-index fix-up, and LLVM vectorises the run
                        activate_run(out, np.uintp(out_at + r * out_plane), np.uintp(positions),
                                     code, alpha, beta)


@compiled(parallel=True)
def blocked_filters_parallel(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, out: np.ndarray,
                             first: int, last: int, r0: int, r1: int, band: int, channels: int,
                             filters: int, size: tuple[int, int], output: tuple[int, int],
                             kernel: tuple[int, int], strides: tuple[int, int],
                             pads: tuple[int, int], low: float, high: float, code: int,
                             alpha: float, beta: float, threads: int) -> None:
    """:func:`blocked_filters` with output rows ``r0:r1`` split in ``threads`` contiguous
    ranges run by numba's threads (the caller has set their count), each with its own tile:
    the same values, whichever thread computes a row."""
    count = r1 - r0
    for t in prange(threads):
        start, stop = r0 + t * count // threads, r0 + (t + 1) * count // threads
        if start < stop:
            blocked_filters(x, weights, bias, out, first, last, start, stop, band, channels, filters,
                            size, output, kernel, strides, pads, low, high, code, alpha, beta)


def compile_filters(threads: int = 1) -> None:
    """Compile :func:`blocked_filters` (or load it from numba's cache), and
    :func:`blocked_filters_parallel` for more than one thread: a session does it at
    construction, not in its first run."""
    x = read_only(np.zeros(20, np.float32))
    weights = blocked_weights(np.zeros((1, 1, 1, 1), np.float32))
    bias = read_only(np.zeros(vector_lanes(), np.float32))
    arguments = (x, weights, bias, np.empty(20, np.float32), 0, 1, 0, 4, 4, 1, 1, (4, 5), (4, 5),
                 (1, 1), (1, 1), (0, 0), -np.inf, np.inf, -1, 1.0, 0.0)
    blocked_filters.dispatcher(*arguments)
    if region_threads(threads) > 1:
        blocked_filters_parallel.dispatcher(*arguments, 1)


@dataclass(frozen=True)
class FiltersCall:
    """The geometry of ``filters_blocked`` for one problem (its shapes, the band), made once
    per problem (:func:`filters_call`), and its calls (:meth:`run`): what
    :class:`_BlockedFilters`' blocks call, and what a settled Conv kernel binds
    (:meth:`bind`)."""

    channels: int
    filters: int
    size: tuple[int, int]
    output: tuple[int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int]
    band: int  # output rows per band (TILE_BYTES)

    def run(self, x: np.ndarray, arranged: np.ndarray, bias: np.ndarray, out: np.ndarray,
            start: int, stop: int, r0: int, r1: int, clamp: tuple[float, float],
            activation: tuple[int, float, float], epilogue: Callable[[np.ndarray], None] | None,
            threads: int) -> None:
        """Images ``start:stop``, output rows ``r0:r1`` of flat float32 ``out`` from flat
        read-only ``x``, the weights and bias arranged by
        :func:`~onnx_light.kernels.conv.channel_blocked.blocked_weights` and
        :func:`~onnx_light.kernels.conv.channel_blocked.padded_bias`, clamped, then the
        compiled ``activation``; with an ``epilogue``, by blocks of rows of about
        :data:`~onnx_light.kernels.conv.depthwise.EPILOGUE_BLOCK_BYTES`, each finished by it
        (on the output's planes) while in cache; on ``threads`` numba threads where a call
        has rows for two."""
        step = 1 << 62
        if epilogue is not None:
            step = max(1, EPILOGUE_BLOCK_BYTES // (self.filters * self.output[1] * 4))
            planes = out.reshape(-1, self.filters, *self.output)
        for first in range(r0, r1, step):
            last = min(r1, first + step)
            arguments = (x, arranged, bias, out, start, stop, first, last, self.band, self.channels,
                         self.filters, self.size, self.output, self.kernel, self.strides, self.pads,
                         *clamp, *activation)
            if min(threads, last - first) > 1:  # a region only with work for two
                blocked_filters_parallel.dispatcher(*arguments, min(threads, last - first))
            else:
                blocked_filters.dispatcher(*arguments)
            if epilogue is not None:
                epilogue(planes[start:stop, :, first:last])

    def bind(self, arranged: np.ndarray, bias: np.ndarray, images: int, clamp: tuple[float, float],
             activation: tuple[int, float, float], epilogue: Callable[[np.ndarray], None] | None,
             threads: int) -> Callable[[np.ndarray, np.ndarray], None]:
        """:meth:`run` over ``images`` images, every row, bound to these weights, bias and
        fused parts: ``bound(x, out)``, ``x`` and ``out`` flat float32 of this call's shapes
        (not checked). Without an epilogue and with one numba thread (``threads``; plan
        ``region``'s count is set on each call, per calling thread), :meth:`run`'s one
        compiled call through its compiled entry
        (:func:`~onnx_light.kernels.conv.depthwise.compiled_entry`): the same bits."""
        if epilogue is not None or threads > 1:
            def bound(x: np.ndarray, out: np.ndarray) -> None:
                self.run(read_only(x), arranged, bias, out, 0, images, 0, self.output[0], clamp, activation,
                         epilogue, region_threads(threads))

            return bound
        tail = (0, images, 0, self.output[0], self.band, self.channels, self.filters, self.size,
                self.output, self.kernel, self.strides, self.pads, *clamp, *activation)
        return bound_entry(blocked_filters.dispatcher, read_only(np.zeros(1, np.float32)), arranged, bias,
                           np.empty(1, np.float32), tail)


@functools.lru_cache(maxsize=1024)
def filters_call(problem: _Problem) -> FiltersCall:
    """The :class:`FiltersCall` of ``problem`` (a ``filters_blocked`` one), remembered per
    problem."""
    window = problem.window
    # the input rows of a band of output rows, per channel
    tile_row_bytes = problem.channels * window.strides[0] * (window.begin[1] + window.input[1]
                                                             + window.kernel[1]) * 4
    return FiltersCall(problem.channels, problem.filters, tuple(window.input), tuple(window.output),
                       tuple(window.kernel), tuple(window.strides), tuple(window.begin),
                       max(1, TILE_BYTES // tile_row_bytes))


class _BlockedFilters(_Algorithm):
    """``filters_blocked``: images ``start:stop``, output rows ``r0:r1``, every filter, by
    blocks of :func:`~onnx_light.kernels.conv.channel_blocked.vector_lanes` filters, through
    its :class:`FiltersCall`. ``arranged`` are the weights of
    :func:`~onnx_light.kernels.conv.channel_blocked.blocked_weights` when the kernel arranged
    them once (constant weights); ``threads`` (the ``region`` plan) the numba threads each
    compiled call splits its rows over."""

    uses_blas: ClassVar[bool] = False

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None,
                 arranged: np.ndarray | None = None, threads: int = 1) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        self.threads = region_threads(threads)
        self.call = filters_call(problem)
        self.x = read_only(x.reshape(-1))
        self.flat_out = out.reshape(-1)
        self.arranged = blocked_weights(w) if arranged is None else arranged
        self.padded_bias = padded_bias(b, problem.filters)
        residual, self.clamp, self.activation, self.epilogue = fused_parts(epilogue, np.float32)
        if residual is not None:  # the residual's addition runs with the epilogue, after
            self.clamp, self.activation, self.epilogue = (-np.inf, np.inf), (-1, 1.0, 0.0), epilogue

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        """Images ``start:stop``, output rows ``r0:r1``: the epilogue (when it runs after)
        on blocks of rows while they are in cache."""
        self.call.run(self.x, self.arranged, self.padded_bias, self.flat_out, start, stop, r0, r1,
                      self.clamp, self.activation, self.epilogue, self.threads)
