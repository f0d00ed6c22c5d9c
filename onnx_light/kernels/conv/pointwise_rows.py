"""Conv's 1x1 product on larger planes with the weights packed once as the micro-kernel's rows
(:func:`pointwise_rows`, ``pointwise.rows_positions``).

In NCHW a 1x1 convolution is ``Y(M, HW) = W(M, C) @ X(C, HW)``. Here the weights, packed once
when the session settles the shapes (:func:`rows_weights`: :func:`~onnx_light.kernels.packed_gemm.pack_rows`,
``MR`` filters' channel p side by side), are the rows of :mod:`~onnx_light.kernels.packed_gemm`'s
micro-kernel, and the input's rows are its panels, read in place (step p of a panel: channel p's
``NR`` positions, ``HW`` floats after channel p - 1's); each ``MR x NR`` block of sums is stored
straight into the output's NCHW rows. This is ``pointwise.product = packed``'s orientation
(:func:`~onnx_light.kernels.conv.pointwise.pointwise_packed`), without its per-call packing of
the weights, its passes of ``KC`` steps and its runtime block shapes: every whole block is one
call of the micro-kernel with its height, width, step and prefetch as constants, which LLVM
compiles to one loop of ``MR x NR / LANES`` fused multiply-adds per step with no selects and no
spilled addresses (45 GMAC/s on this machine's MobileNetV2 projections at 56x56, against 33 for
the BLAS tiles: docs/conv.md). A tile's last ``HW % NR`` positions are packed into one
zero-padded panel (:func:`~onnx_light.kernels.packed_gemm.pack_panels`) whose block goes through
a small buffer. Each tile of :data:`~onnx_light.kernels.conv.pointwise.TILE_COLUMNS` positions
is then finished in cache (bias, residual, clamp, compiled activation) like a BLAS tile.

Numerics: each element is ``sum_p w[i, p] x[p, j]`` in order of p from +0, one rounding per
fused multiply-add, in one pass, then the finishing: the order of the transposed and packed
products, which ``conv.numerics.error_bound`` covers, and the same bits whoever computes a unit
(an image's tile of positions): the same bits at one and two threads.
"""

from __future__ import annotations

import numpy as np

from .. import packed_gemm
from ..compiled import compiled, prange
from ..packed_gemm import LANES, MR, NR, VECTORS, _tile, pack_panels, pack_rows
from ..spin import claim
from .depthwise import read_only
from .pointwise import TILE_COLUMNS, _finish_tile

__all__ = ["pointwise_rows", "pointwise_rows_parallel", "rows_weights", "uses_rows"]


@compiled(inline="always")
def _rows_tile(rows_w: np.ndarray, source: np.ndarray, x_start: int, stride: int, grid: np.ndarray,
               out_row: int, j0: int, columns: int, filters: int, edge: np.ndarray,
               edge_out: np.ndarray, no_bias: np.ndarray) -> None:
    """The product of positions ``j0..j0 + columns - 1`` of one image (channel p's at
    ``source[x_start + p * stride + j]``) for every filter, into ``grid``'s rows from
    ``out_row`` (one per filter): each whole panel of ``NR`` positions by every block of
    ``MR`` filters, then the last part panel packed into ``edge`` and computed into
    ``edge_out``."""
    k = rows_w.shape[1]
    full = filters // MR * MR
    whole = columns // NR * NR
    for j in range(j0, j0 + whole, NR):
        for i0 in range(0, full, MR):
            _tile(rows_w, source, grid, no_bias, i0 // MR, x_start + j, stride, 0, 0, MR, out_row + i0, j,
                  False, False, 0, k, False, VECTORS)
        if full < filters:
            _tile(rows_w, source, grid, no_bias, full // MR, x_start + j, stride, 0, 0, filters - full,
                  out_row + full, j, False, False, 0, k, False, VECTORS)
    if whole < columns:
        width = columns - whole
        start = j0 + whole
        pack_panels(source, x_start + start, stride, k, width, edge)
        vectors = -(-width // LANES)
        for i0 in range(0, filters, MR):
            rows = min(MR, filters - i0)
            _tile(rows_w, edge, edge_out, no_bias, i0 // MR, 0, NR, 0, 0, rows, 0, 0, False, False, 0, k,
                  False, vectors)
            for r in range(rows):
                for c in range(width):
                    grid[out_row + i0 + r, start + c] = edge_out[r, c]


@compiled(inline="always")
def _rows_unit(rows_w: np.ndarray, source: np.ndarray, source_offset: int, source_stride: int,
               image_source: int, out: np.ndarray, out_offset: int, out_stride: int, image_out: int,
               filters: int, depth: int, width: int, bias: np.ndarray, residual: np.ndarray,
               low: float, high: float, activation: int, alpha: float, beta: float, unit: int,
               edge: np.ndarray, edge_out: np.ndarray, no_bias: np.ndarray) -> None:
    """Unit ``unit`` of :func:`pointwise_rows`: image ``unit // T``'s tile ``unit % T`` (T
    tiles of ``TILE_COLUMNS`` positions), computed then finished."""
    tiles = -(-width // TILE_COLUMNS)
    n, j0 = unit // tiles, unit % tiles * TILE_COLUMNS
    columns = min(TILE_COLUMNS, width - j0)
    start = out_offset + n * image_out
    grid = out.reshape(out.size // out_stride, out_stride)
    _rows_tile(rows_w, source, source_offset + n * image_source, source_stride, grid, start // out_stride,
               j0, columns, filters, edge, edge_out, no_bias)
    _finish_tile(out, start + j0, out_stride, filters, columns, bias, 0, residual, low, high, activation,
                 alpha, beta)


@compiled(inline="always")
def _rows_buffers(depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The part panel, its block and the zeros the micro-kernel takes as its bias."""
    return (np.empty((1, depth, NR), np.float32), np.empty((MR, NR), np.float32),
            np.zeros(NR, np.float32))


@compiled
def pointwise_rows(rows_w: np.ndarray, source: np.ndarray, source_offset: int, source_stride: int,
                   image_source: int, out: np.ndarray, out_offset: int, out_stride: int,
                   image_out: int, filters: int, depth: int, width: int, bias: np.ndarray,
                   residual: np.ndarray, low: float, high: float, activation: int, alpha: float,
                   beta: float, begin: int, end: int) -> None:
    """Units ``begin`` to ``end - 1`` of the finished 1x1 product in float32 over a batch of
    images (:func:`~onnx_light.kernels.conv.pointwise.pointwise_transposed`'s arguments, but
    ``rows_w``: the weights of :func:`rows_weights`), each unit an image's tile of
    ``TILE_COLUMNS`` positions: the weights as the micro-kernel's rows, the input's rows read in
    place as its panels, each block stored into the output's rows, then the tile finished
    (bias, residual, clamp, activation). ``out_offset`` and ``image_out`` are multiples of
    ``out_stride``."""
    edge, edge_out, no_bias = _rows_buffers(depth)
    for unit in range(begin, end):
        _rows_unit(rows_w, source, source_offset, source_stride, image_source, out, out_offset, out_stride,
                   image_out, filters, depth, width, bias, residual, low, high, activation, alpha, beta,
                   unit, edge, edge_out, no_bias)


@compiled(parallel=True)
def pointwise_rows_parallel(rows_w: np.ndarray, source: np.ndarray, source_offset: int,
                            source_stride: int, image_source: int, out: np.ndarray, out_offset: int,
                            out_stride: int, image_out: int, filters: int, depth: int, width: int,
                            bias: np.ndarray, residual: np.ndarray, low: float, high: float,
                            activation: int, alpha: float, beta: float, units: int, threads: int,
                            counter: np.ndarray) -> None:
    """:func:`pointwise_rows` of units ``0`` to ``units - 1`` shared by ``threads`` of numba's
    threads, each taking the next unit in turn (as
    :func:`~onnx_light.kernels.conv.pointwise.pointwise_units_parallel` does): the same units
    as one thread, so the same bits. ``counter`` is one int64 0."""
    for _ in prange(threads):
        edge, edge_out, no_bias = _rows_buffers(depth)
        unit = claim(counter, 0)
        while unit < units:
            _rows_unit(rows_w, source, source_offset, source_stride, image_source, out, out_offset,
                       out_stride, image_out, filters, depth, width, bias, residual, low, high,
                       activation, alpha, beta, unit, edge, edge_out, no_bias)
            unit = claim(counter, 0)


def uses_rows(dtype: np.dtype, plane: int, positions: int) -> bool:
    """Whether a 1x1 convolution of constant weights in ``dtype`` on a plane of ``plane``
    positions takes :func:`pointwise_rows` for the ``pointwise.rows_positions`` value
    ``positions``: float32, planes of at least ``positions`` (0: never) where the packed kernel
    runs."""
    return (0 < positions <= plane and plane > 1 and np.dtype(dtype) == np.float32
            and packed_gemm.available())


def rows_weights(w: np.ndarray) -> np.ndarray:
    """Weights (filters, depth, 1, ...) as :func:`pointwise_rows` takes them: blocks of ``MR``
    filters, each step's ``MR`` values side by side (:func:`~onnx_light.kernels.packed_gemm.pack_rows`),
    read-only."""
    flat = np.ascontiguousarray(w.reshape(w.shape[0], -1), dtype=np.float32)
    return read_only(pack_rows(flat, 0, flat.shape[0]))
