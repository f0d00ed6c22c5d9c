"""Conv's ``columns_blocked`` algorithm: a float32 1-D convolution (any stride, padding,
dilation and group count) computed directly, the lanes of vector registers over consecutive
output columns: the feature extractors of speech models (wav2vec2's kernel 10 stride 5 on the
waveform, kernel 3 and 2 at stride 2 over 512 or 128 channels, and its positional
convolution, kernel 128 or 64 in 16 groups).

im2col copies every window (C/group x K values per output column) and multiplies them in one
BLAS product per group; at these shapes the copy, its buffer's page faults and, for a
strided convolution on one channel, BLAS's shallow product (10 deep) cost as much as the
arithmetic. Here, for a band of output columns, the input columns the band reads are copied
once into a *tile* split into the stride's phases (input column ``u * stride + p`` of a
channel goes to phase p's row at u, zeros for the padding), so that the inputs a tap reads
for consecutive outputs are consecutive; then for each block of L filters of a group (L of
:func:`~onnx_light.kernels.conv.channel_blocked.vector_lanes`) and each chunk of
:data:`~onnx_light.kernels.conv.channel_blocked.COLUMN_VECTORS` x L columns, the stems'
intrinsic ``columns_broadcast`` sums L/2 filters over the chunk in 12 registers (AVX2), one
fused multiply-add per tap (input channel, then kernel position) and column, and stores each
filter's columns in place. A row's last chunk overlaps the one before it (computed again,
the same values): the output must have at least COLUMN_VECTORS x L columns
(:func:`columns_applies`). A band holds about ``columns_blocked.tile_bytes`` of tile, which
the filters' blocks then read from cache. At more than one thread (plan ``region``) one
compiled call splits the chunks of columns over numba's threads
(:func:`blocked_columns_parallel`), each with its own tile.

The weights are arranged once per weight set as ``(groups * ceil(M/group/L), C/group*K, L)``
(:func:`columns_weights`). Numerics: every output is its bias plus its C/group x K terms in
(channel, kernel position) order, one rounding each (a fused multiply-add), within the bound
of :mod:`~onnx_light.kernels.conv.numerics`; a sum depends neither on the band, the block,
the chunk nor the thread: the same bits at any thread count.
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
from .channel_blocked import COLUMN_VECTORS, _columns_broadcast, _lane_count, register_gate, vector_lanes
from .depthwise import EPILOGUE_BLOCK_BYTES, read_only, region_threads
from .finish import fused_parts
from .problem import _Problem

__all__ = ["ColumnsCall", "blocked_columns", "blocked_columns_parallel", "columns_applies",
           "columns_bias", "columns_call", "columns_weights", "compile_columns"]


def columns_applies(dtype: np.dtype, window_rank: int, outputs: int) -> bool:
    """Whether ``columns_blocked`` computes a convolution: float32, 1-D, at least
    COLUMN_VECTORS x L output columns, on a processor with AVX-512 or AVX2 and FMA."""
    lanes = vector_lanes()
    return (np.dtype(dtype) == np.float32 and window_rank == 1 and lanes > 0
            and outputs >= COLUMN_VECTORS * lanes)


def columns_weights(w: np.ndarray, groups: int) -> np.ndarray:
    """Weights (M, C/group, K) as ``(groups * B, C/group * K, L)`` float32, B = ceil(M/group/L)
    blocks of L filters per group (the filters past a group's zero; read-only): one vector per
    block and tap."""
    lanes = vector_lanes()
    filters, taps = w.shape[0], w.shape[1] * w.shape[2]
    per_group = filters // groups
    blocks = -(-per_group // lanes)
    arranged = np.zeros((groups, blocks * lanes, taps), np.float32)
    arranged[:, :per_group] = w.reshape(groups, per_group, taps)
    return read_only(np.ascontiguousarray(
        arranged.reshape(groups * blocks, lanes, taps).transpose(0, 2, 1)))


def columns_bias(b: np.ndarray | None, filters: int, groups: int) -> np.ndarray:
    """The bias (zeros for none) as ``(groups * B * L,)``, each group's padded with zeros to
    whole blocks of L filters, as :func:`columns_weights` arranges them (read-only)."""
    lanes = vector_lanes()
    per_group = filters // groups
    blocks = -(-per_group // lanes)
    padded = np.zeros((groups, blocks * lanes), np.float32)
    if b is not None:
        padded[:, :per_group] = b.reshape(groups, per_group)
    return read_only(padded.reshape(-1))


@compiled
def blocked_columns(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, out: np.ndarray,
                    first: int, last: int, c0: int, c1: int, band: int, channels: int,
                    filters: int, groups: int, length: int, out_len: int, kernel: int, stride: int,
                    dilation: int, pad: int, low: float, high: float, code: int, alpha: float,
                    beta: float) -> None:
    """Output columns ``c0:c1`` (multiples of the chunk, COLUMN_VECTORS x L, but ``c1`` may be
    ``out_len``; at least a chunk of columns) of images ``first:last`` of ``out`` (flat N x M x
    out_len) from ``x`` (flat N x C x length), ``weights`` and ``bias`` arranged by
    :func:`columns_weights` and :func:`columns_bias`, clamped into [low, high], then activation ``code`` of
    :data:`~onnx_light.kernels.compiled_activations.ACTIVATIONS` (-1: none); by bands of
    ``band`` columns (a multiple of the chunk), whose phase-split input the tile holds while
    every block of filters reads it."""
    lanes = _lane_count()
    half = lanes // 2
    span = COLUMN_VECTORS * lanes
    group_channels = channels // groups
    group_filters = filters // groups
    blocks = -(-group_filters // lanes)
    taps = group_channels * kernel
    reach = (kernel - 1) * dilation // stride  # tile columns past a band's last output column
    tile_w = band + reach
    tile = np.zeros(group_channels * stride * tile_w, np.float32)
    offsets = np.empty(taps, np.int64)
    for c in range(group_channels):
        for j in range(kernel):
            step = j * dilation
            offsets[c * kernel + j] = (c * stride + step % stride) * tile_w + step // stride
    low32, high32 = np.float32(low), np.float32(high)
    gate, alpha32, beta32 = register_gate(code), np.float32(alpha), np.float32(beta)
    for b0 in range(c0, c1, band):
        b1 = min(c1, b0 + band)
        u0 = min(b0, out_len - span)  # the last chunk of a row overlaps the ones before it
        width = b1 - u0 + reach
        for n in range(first, last):
            for g in range(groups):
                for c in range(group_channels):
                    source = (n * channels + g * group_channels + c) * length
                    for p in range(stride):
                        row = (c * stride + p) * tile_w
                        at = u0 * stride + p - pad  # input column of the row's first value
                        for i in range(width):
                            column = at + i * stride
                            if 0 <= column < length:
                                tile[row + i] = x[source + column]
                            else:
                                tile[row + i] = 0.0
                for k in range(blocks):
                    rows = min(lanes, group_filters - k * lanes)
                    block = g * blocks + k
                    out_at = (n * filters + g * group_filters + k * lanes) * out_len
                    for h in range(0, rows, half):
                        for j in range(b0, b1, span):
                            j0 = min(j, out_len - span)
                            _columns_broadcast(tile, j0 - u0, offsets, weights,
                                               block * taps * lanes + h, bias, block * lanes + h,
                                               low32, high32, gate, alpha32, beta32, out,
                                               out_at + h * out_len + j0, out_len, rows - h)
                    if code >= 0 and gate == 0:
                        for r in range(rows):
                            # unsigned: no negative-index fix-up, and LLVM vectorises the run
                            # from u0: the last chunk wrote the columns before b0 again
                            activate_run(out, np.uintp(out_at + r * out_len + u0), np.uintp(b1 - u0),
                                         code, alpha, beta)


@compiled(parallel=True)
def blocked_columns_parallel(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, out: np.ndarray,
                             first: int, last: int, c0: int, c1: int, band: int, channels: int,
                             filters: int, groups: int, length: int, out_len: int, kernel: int,
                             stride: int, dilation: int, pad: int, low: float, high: float, code: int,
                             alpha: float, beta: float, threads: int) -> None:
    """:func:`blocked_columns` with the whole chunks of columns ``c0:c1`` split in
    ``threads`` contiguous ranges run by numba's threads (the caller has set their count; at
    most one per whole chunk), the last range taking the columns past the last whole chunk,
    each with its own tile: the same values, whichever thread computes a column, and no
    column written by two threads (the last chunk of a row, which overlaps the one before it,
    lies within the last range)."""
    span = COLUMN_VECTORS * _lane_count()
    chunks = (c1 - c0) // span
    for t in prange(threads):
        start = c0 + t * chunks // threads * span
        stop = c1 if t == threads - 1 else c0 + (t + 1) * chunks // threads * span
        if start < stop:
            blocked_columns(x, weights, bias, out, first, last, start, stop, band, channels, filters,
                            groups, length, out_len, kernel, stride, dilation, pad, low, high, code,
                            alpha, beta)


def compile_columns(threads: int = 1) -> None:
    """Compile :func:`blocked_columns` (or load it from numba's cache), and
    :func:`blocked_columns_parallel` for more than one thread: a session does it at
    construction, not in its first run."""
    span = COLUMN_VECTORS * vector_lanes()
    x = read_only(np.zeros(span, np.float32))
    weights = columns_weights(np.zeros((1, 1, 1), np.float32), 1)
    bias = columns_bias(None, 1, 1)
    arguments = (x, weights, bias, np.empty(span, np.float32), 0, 1, 0, span, span, 1, 1, 1, span,
                 span, 1, 1, 1, 0, -np.inf, np.inf, -1, 1.0, 0.0)
    blocked_columns.dispatcher(*arguments)
    if region_threads(threads) > 1:
        blocked_columns_parallel.dispatcher(*arguments, 1)


@dataclass(frozen=True)
class ColumnsCall:
    """The geometry of ``columns_blocked`` for one problem, made once per problem
    (:func:`columns_call`), and its call (:meth:`run`)."""

    channels: int
    filters: int
    groups: int
    length: int
    out_len: int
    kernel: int
    stride: int
    dilation: int
    pad: int
    band: int  # output columns per band: a multiple of the chunk

    def run(self, x: np.ndarray, arranged: np.ndarray, bias: np.ndarray, out: np.ndarray,
            images: int, clamp: tuple[float, float], activation: tuple[int, float, float],
            epilogue: Callable[[np.ndarray], None] | None, threads: int) -> None:
        """Every output of ``images`` images into flat float32 ``out`` from flat read-only
        ``x``, the weights and bias of :func:`columns_weights` and :func:`columns_bias`,
        clamped, then the compiled ``activation``; with an ``epilogue``, by blocks of images
        of about :data:`~onnx_light.kernels.conv.depthwise.EPILOGUE_BLOCK_BYTES`, each
        finished by it while in cache; on ``threads`` numba threads where the columns have a
        chunk for each."""
        step = images
        if epilogue is not None:
            step = max(1, EPILOGUE_BLOCK_BYTES // (self.filters * self.out_len * 4))
            planes = out.reshape(images, self.filters, self.out_len)
        span = COLUMN_VECTORS * vector_lanes()
        threads = min(threads, self.out_len // span)
        for first in range(0, images, step):
            last = min(images, first + step)
            arguments = (x, arranged, bias, out, first, last, 0, self.out_len, self.band,
                         self.channels, self.filters, self.groups, self.length, self.out_len,
                         self.kernel, self.stride, self.dilation, self.pad, *clamp, *activation)
            if threads > 1:
                blocked_columns_parallel.dispatcher(*arguments, threads)
            else:
                blocked_columns.dispatcher(*arguments)
            if epilogue is not None:
                epilogue(planes[first:last])


@functools.lru_cache(maxsize=1024)
def columns_call(problem: _Problem, tile_bytes: int) -> ColumnsCall:
    """The :class:`ColumnsCall` of ``problem`` (a ``columns_blocked`` one) with bands of about
    ``tile_bytes`` of tile, remembered per problem."""
    window = problem.window
    span = COLUMN_VECTORS * vector_lanes()
    stride = window.strides[0]
    per_column = problem.group_channels * stride * 4  # tile bytes per output column
    band = max(1, min(tile_bytes // per_column, window.output[0]) // span) * span
    return ColumnsCall(problem.channels, problem.filters, problem.groups, window.input[0],
                       window.output[0], window.kernel[0], stride, window.dilations[0],
                       window.begin[0], band)


class _BlockedColumns(_Algorithm):
    """``columns_blocked``: every image, group and column through its :class:`ColumnsCall`
    (the plans ``serial`` and ``region`` run one block of everything). ``arranged``: the
    weights of :func:`columns_weights` when the kernel arranged them once (constant weights);
    ``threads`` (the ``region`` plan): the numba threads the call splits its columns over."""

    uses_blas: ClassVar[bool] = False

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None,
                 arranged: np.ndarray | None = None, threads: int = 1,
                 tile_bytes: int = 1 << 16) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        self.threads = region_threads(threads)
        self.call = columns_call(problem, tile_bytes)
        self.x = read_only(x.reshape(-1))
        self.flat_out = out.reshape(-1)
        self.arranged = columns_weights(w, problem.groups) if arranged is None else arranged
        self.padded_bias = columns_bias(b, problem.filters, problem.groups)
        residual, self.clamp, self.activation, self.epilogue = fused_parts(epilogue, np.float32)
        if residual is not None:  # the residual's addition runs with the epilogue, after
            self.clamp, self.activation, self.epilogue = (-np.inf, np.inf), (-1, 1.0, 0.0), epilogue

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        """Everything (the plans that run this algorithm call it once, for every item and
        column)."""
        self.call.run(self.x, self.arranged, self.padded_bias, self.flat_out, self.problem.batch,
                      self.clamp, self.activation, self.epilogue, self.threads)
