"""Conv's ``im2col_units`` algorithm: a 1-D convolution of one group (float32 or float64)
as im2col in one compiled call, its output columns cut into units, each unit's windows
copied into a buffer and multiplied by numpy's own BLAS (``cblas_?gemm``, called from the
compiled code: :func:`~onnx_light.kernels.blas_tiles.gemm_function`), then finished (bias,
fused residual, clamp, compiled activation) while in cache.

Why: wav2vec2's feature extractor (128 or 512 channels, kernel 3 or 2, stride 2) spends its
time in BLAS products deep enough for BLAS to be fast, but the pool's plans around im2col
(``output_rows``: Python blocks on the pool's threads, each copying its windows with numpy)
gained nothing at two threads here (docs/model-zoo.md, "wav2vec2"). Here every unit runs
inside one compiled call; at more than one thread (plan ``region``) the session's threads
take the units in turn inside one numba region (:func:`im2col_units_parallel`), each product
on one BLAS thread (the caller holds BLAS to one). The units depend on the shape alone
(:func:`unit_columns`), so each output comes from the same BLAS call at any thread count:
the same bits. Numerics: each output is a BLAS dot product of its C x K terms plus the bias
(then the residual), within the bound of :mod:`~onnx_light.kernels.conv.numerics`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...parallel import BLAS
from ..blas_tiles import gemm_function
from ..compiled import compiled, prange
from ..spin import claim
from .blocks import _Algorithm
from .depthwise import read_only, region_threads
from .finish import FINISHED_TYPES, fused_parts
from .pointwise import _finish_tile
from .problem import _Problem

__all__ = ["UnitsCall", "compile_units", "im2col_units", "im2col_units_parallel", "unit_columns",
           "units_applies", "units_call"]

_ROW_MAJOR, _NO_TRANS = 101, 111


def units_applies(dtype: np.dtype, window_rank: int, groups: int) -> bool:
    """Whether ``im2col_units`` computes a convolution: 1-D, one group, float32 or float64
    with numpy's BLAS reachable from compiled code."""
    return (window_rank == 1 and groups == 1 and np.dtype(dtype) in FINISHED_TYPES
            and gemm_function(np.dtype(dtype)) is not None)


def unit_columns(out_len: int, columns: int) -> int:
    """Output columns per unit: about ``columns`` (``im2col_units.columns``), the units
    equal, a multiple of 16 (or the whole row)."""
    units = max(1, -(-out_len // max(1, columns)))
    per_unit = -(-out_len // units)
    return min(out_len, -(-per_unit // 16) * 16)


@compiled
def im2col_units(gemm: Any, x: np.ndarray, weights: np.ndarray, out: np.ndarray,
                 bias: np.ndarray, residual: np.ndarray, low: float, high: float, activation: int,
                 alpha: float, beta: float, buffer: np.ndarray, buffer_at: int, channels: int,
                 length: int, filters: int, out_len: int, kernel: int, stride: int, dilation: int,
                 pad: int, tile: int, begin: int, end: int) -> None:
    """Units ``begin`` to ``end - 1`` of a 1-D convolution of one group: unit ``u`` is image
    ``u // tiles``, output columns ``(u % tiles) * tile`` on (``tiles`` of ``tile`` columns a
    row). Its windows (C x K rows of its columns, zeros for the padding) are copied into
    ``buffer`` from ``buffer_at``, multiplied by ``weights`` (M, C*K) with one BLAS call
    (``gemm``) into ``out`` (flat N x M x out_len), then finished as
    :func:`~onnx_light.kernels.conv.pointwise.pointwise_tiles` finishes a tile (an empty
    ``bias`` or ``residual`` is not added; clamp; ``activation`` -1: none)."""
    item = out.itemsize
    depth = channels * kernel
    tiles = (out_len + tile - 1) // tile
    for u in range(begin, end):
        n, j0 = u // tiles, (u % tiles) * tile
        columns = min(tile, out_len - j0)
        for c in range(channels):
            source = (n * channels + c) * length
            for j in range(kernel):
                row = buffer_at + (c * kernel + j) * columns
                at = j0 * stride + j * dilation - pad  # input column of the row's first window
                lo = 0 if at >= 0 else min(columns, (stride - 1 - at) // stride)
                hi = 0 if at >= length else min(columns, (length - at + stride - 1) // stride)
                hi = max(lo, hi)
                # unsigned indices: numba then emits no negative-index fix-up
                for t in range(np.uintp(lo)):
                    buffer[np.uintp(row) + t] = 0.0
                first, step = np.uintp(source + at + lo * stride), np.uintp(stride)
                into = np.uintp(row + lo)
                for t in range(np.uintp(hi - lo)):
                    buffer[into + t] = x[first + t * step]
                for t in range(np.uintp(hi), np.uintp(columns)):
                    buffer[np.uintp(row) + t] = 0.0
        start = n * filters * out_len + j0
        gemm(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, filters, columns, depth, 1.0, weights.ctypes.data,
             depth, buffer.ctypes.data + buffer_at * item, columns, 0.0,
             out.ctypes.data + start * item, out_len)
        _finish_tile(out, start, out_len, filters, columns, bias, 0, residual, low, high,
                     activation, alpha, beta)


@compiled(parallel=True)
def im2col_units_parallel(gemm: Any, x: np.ndarray, weights: np.ndarray, out: np.ndarray,
                          bias: np.ndarray, residual: np.ndarray, low: float, high: float,
                          activation: int, alpha: float, beta: float, buffer: np.ndarray,
                          channels: int, length: int, filters: int, out_len: int, kernel: int,
                          stride: int, dilation: int, pad: int, tile: int, units: int,
                          threads: int, counter: np.ndarray) -> None:
    """:func:`im2col_units` of units ``0`` to ``units - 1`` shared by ``threads`` of numba's
    threads (the caller has set their count and holds BLAS to one thread), each taking the
    next unit in turn (:data:`~onnx_light.kernels.spin.claim`), with its own part of
    ``buffer`` (``threads`` x C*K x ``tile``). ``counter``: one int64 0, the caller's."""
    size = channels * kernel * tile
    for t in prange(threads):
        unit = claim(counter, 0)
        while unit < units:
            im2col_units(gemm, x, weights, out, bias, residual, low, high, activation, alpha, beta,
                         buffer, t * size, channels, length, filters, out_len, kernel, stride,
                         dilation, pad, tile, unit, unit + 1)
            unit = claim(counter, 0)


def compile_units(dtype: np.dtype, threads: int = 1) -> None:
    """Compile :func:`im2col_units` for ``dtype`` (or load it from numba's cache), and
    :func:`im2col_units_parallel` for more than one thread: a session does it at
    construction, not in its first run."""
    gemm = gemm_function(dtype)
    if gemm is None:
        return
    x, w, empty = (read_only(np.ones(shape, dtype)) for shape in (2, (1, 1), 0))
    out, buffer = np.empty(2, dtype), np.empty(2, dtype)
    arguments = (gemm, x, w, out, empty, empty, -math.inf, math.inf, -1, 1.0, 0.0, buffer)
    geometry = (1, 2, 1, 2, 1, 1, 1, 0, 2)
    im2col_units.dispatcher(*arguments, 0, *geometry, 0, 1)
    if region_threads(threads) > 1:
        im2col_units_parallel.dispatcher(*arguments, *geometry, 1, 1, np.zeros(1, np.int64))


@dataclass(frozen=True)
class UnitsCall:
    """The geometry of ``im2col_units`` for one problem (:func:`units_call`) and its call."""

    batch: int
    channels: int
    length: int
    filters: int
    out_len: int
    kernel: int
    stride: int
    dilation: int
    pad: int
    tile: int  # output columns per unit (unit_columns)

    @property
    def units(self) -> int:
        return self.batch * -(-self.out_len // self.tile)

    def run(self, x: np.ndarray, weights: np.ndarray, bias: np.ndarray | None, out: np.ndarray,
            epilogue: Callable[[np.ndarray], None] | None, threads: int) -> None:
        """Every output into C-contiguous ``out`` from read-only C-contiguous ``x`` and
        ``weights`` (M, C*K) of ``out``'s type, the bias (or None) and the fused ``epilogue``
        (what :func:`~onnx_light.kernels.conv.finish.fused_parts` takes inside; the rest on
        the whole output after); on ``threads`` numba threads where there are units for two."""
        dtype = out.dtype
        gemm = gemm_function(dtype)
        residual, clamp, activation, after = fused_parts(epilogue, dtype)
        empty = np.empty(0, dtype)
        flat_out = out.reshape(-1)
        arguments = (gemm, x.reshape(-1), weights, flat_out, empty if bias is None else bias,
                     empty if residual is None else residual, *clamp, *activation)
        geometry = (self.channels, self.length, self.filters, self.out_len, self.kernel, self.stride,
                    self.dilation, self.pad, self.tile)
        size = self.channels * self.kernel * self.tile
        units = self.units
        if threads > 1 and units > 1 and (threads := region_threads(min(threads, units))) > 1:
            with BLAS.limited(1):
                im2col_units_parallel.dispatcher(*arguments, np.empty(threads * size, dtype), *geometry,
                                                 units, threads, np.zeros(1, np.int64))
        else:
            with BLAS.limited(1):
                im2col_units.dispatcher(*arguments, np.empty(size, dtype), 0, *geometry, 0, units)
        if after is not None:
            after(out)


@functools.lru_cache(maxsize=1024)
def units_call(problem: _Problem, columns: int) -> UnitsCall:
    """The :class:`UnitsCall` of ``problem`` (an ``im2col_units`` one) with units of about
    ``columns`` output columns, remembered per problem."""
    window = problem.window
    return UnitsCall(problem.batch, problem.channels, window.input[0], problem.filters,
                     window.output[0], window.kernel[0], window.strides[0], window.dilations[0],
                     window.begin[0], unit_columns(window.output[0], columns))


class _Im2colUnits(_Algorithm):
    """``im2col_units``: everything through its :class:`UnitsCall` (the plans ``serial`` and
    ``region`` run one block of everything); ``threads`` (the ``region`` plan): the numba
    threads its units are shared by."""

    uses_blas: ClassVar[bool] = False  # it holds BLAS to one thread itself

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None, threads: int = 1,
                 columns: int = 256) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        self.threads = threads
        self.call = units_call(problem, columns)
        self.x = read_only(x)
        self.w = read_only(np.ascontiguousarray(w).reshape(problem.filters, problem.depth))
        self.b = None if b is None else read_only(np.ascontiguousarray(b))
        self.target = out

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        """Everything (the plans that run this algorithm call it once)."""
        self.call.run(self.x, self.w, self.b, self.target, self.epilogue, self.threads)
