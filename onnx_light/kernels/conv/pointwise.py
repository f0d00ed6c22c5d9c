"""Conv's pointwise (1x1) product finished tile by tile, in one compiled call
(:func:`pointwise_tiles`, :func:`pointwise_units`), on one or several threads.

``direct_1x1`` multiplies the weights by the input rows with one BLAS product, then finishes
the output (the bias, the fused residual and clamp: :class:`~onnx_light.kernels.conv.finish.Finish`)
in a second pass. On a large plane (MobileNetV2's 16 -> 96 channels at 112x112: a 4.8 MB
output) that pass reads and writes the whole output again from memory. Here the columns
(output positions) are cut into tiles of :data:`TILE_COLUMNS`; each tile is
one call of numpy's own BLAS ``cblas_?gemm`` (:func:`~onnx_light.kernels.blas_tiles.gemm_function`,
the product ``direct_1x1`` computes, restricted to the tile's columns) and is finished while it
is still in the second-level cache, with the operations of the finishing pass in its order
and type: ``clamp((product + bias) + residual)``, bitwise :func:`~onnx_light.kernels.conv.finish.finish_rows`.
A fused Sigmoid, SiLU, HardSigmoid or HardSwish
(:class:`~onnx_light.kernels.compiled_activations.InPlace`) is applied to each tile then too.
One compiled call also replaces the Python layers a block goes through; a whole call of one
group (:class:`PointwiseCall`, made once per shape) skips the blocks too.

Two threads. A call of one group is cut into units (:func:`product_units`: its tiles, or, for
a large product kept in one tile, two halves of its filters or of its columns), each one
BLAS product on one BLAS thread then finished (:func:`pointwise_units`), and from
``pointwise.minimum_flops`` multiply-adds the session's threads share the units in one numba
region (:func:`pointwise_units_parallel`: about 10-15 us here, against 20-60 us for the
pool). The units depend on the shape alone, so each output element comes from the same BLAS
call with the same arguments at one thread and at two: the same bits. (OpenBLAS does not
promise the same bits for the same element in products of other shapes: a split by rows or
columns where its kernels' blocks fall otherwise changes the last bit, measured on this
machine's Haswell kernels.) numpy's OpenBLAS (pthreads) may be called from two threads at
once (docs/conv.md, "Pointwise convolutions on two threads").

With ``pointwise.product = packed`` (float32, AVX2 and FMA or AVX-512F) :func:`pointwise_packed` computes each
tile's product with :mod:`~onnx_light.kernels.packed_gemm`'s micro-kernel instead, the weights
as its rows and the input's rows read in place as its panels, and finishes it the same way;
measured, it does not beat the BLAS tiles (docs/conv.md), so ``blas`` is the default.

On planes up to ``pointwise.transposed_positions`` positions, float32 convolutions with
constant weights take :func:`pointwise_transposed` instead: the micro-kernel transposed, the
weights packed once as its panels (:func:`transposed_weights`), the positions its rows, each
block stored transposed into the output (docs/conv.md, "Small planes: the product transposed").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...parallel import BLAS
from .. import packed_gemm
from ..blas_tiles import gemm_function
from ..compiled import compiled, prange
from ..compiled_activations import activate_run
from ..compiled_elementwise import numba_threads
from ..packed_gemm import (
    BLOCK_A_BYTES,
    LANES,
    MR,
    NR,
    VECTORS,
    PackedWeights,
    _tile_transposed,
    aligned_empty,
    pack_columns,
    pack_panels,
    pack_rows,
    packed_layout,
    panels_over_rows,
)
from ..spin import claim
from .depthwise import compiled_entry, read_only
from .finish import FINISHED_TYPES, finish_run

__all__ = ["ALIGNED_OUTPUT_BYTES", "CUT_MULTIPLY_ADDS", "PACK_FILTERS", "TILED_OUTPUT_BYTES",
           "TILED_WEIGHT_BYTES", "TILE_COLUMNS",
           "PointwiseCall", "compile_pointwise", "pointwise_call", "pointwise_gemm",
           "pointwise_packed", "pointwise_product", "pointwise_tiles", "pointwise_transposed",
           "pointwise_transposed_parallel", "pointwise_units", "pointwise_units_parallel",
           "pointwise_vector", "product_units", "tile_columns", "transposed_weights",
           "uses_packed", "uses_transposed", "vector_weights"]

#: Columns (output positions) per tile, about: each tile's product is finished while it is in
#: cache. Narrower tiles lose more in BLAS than the cache saves, wider ones save less.
TILE_COLUMNS = 256
#: Weights larger than this keep one tile: each tile's product packs them again.
TILED_WEIGHT_BYTES = 1 << 16
#: Outputs smaller than this keep one tile: they stay in the second-level cache anyway.
TILED_OUTPUT_BYTES = 1 << 18
#: A product :func:`tile_columns` keeps in one tile is cut into two units from this many
#: multiply-adds (:func:`product_units`): two threads can then share it, for about 1%
#: more time on one thread (docs/conv.md, "Pointwise convolutions on two threads").
CUT_MULTIPLY_ADDS = 1 << 23
#: :meth:`PointwiseCall.bind`'s outputs from this size on start on a 64-byte boundary
#: (:func:`~onnx_light.kernels.packed_gemm.aligned_empty`, 3 times numpy's allocation).
ALIGNED_OUTPUT_BYTES = 1 << 12

_ROW_MAJOR, _NO_TRANS = 101, 111


def pointwise_gemm(dtype: np.dtype) -> Any | None:
    """numpy's ``cblas_?gemm`` for the compiled pointwise product in ``dtype``, or None when
    the type is not one the finishing pass takes or numpy's BLAS has none (``direct_1x1``
    then keeps its numpy product)."""
    return gemm_function(dtype) if np.dtype(dtype) in FINISHED_TYPES else None


def uses_packed(dtype: np.dtype, product: str) -> bool:
    """Whether ``direct_1x1`` computes its products in ``dtype`` with :func:`pointwise_packed`
    for the ``pointwise.product`` value ``product``: float32 where the packed kernel runs
    (:func:`~onnx_light.kernels.packed_gemm.available`)."""
    return product == "packed" and np.dtype(dtype) == np.float32 and packed_gemm.available()


def pointwise_product(dtype: np.dtype, product: str) -> Callable[..., None] | None:
    """The compiled call that multiplies and finishes a block of ``direct_1x1`` in ``dtype``
    (the arguments of :func:`pointwise_packed`): :func:`pointwise_packed` where
    :func:`uses_packed`, else :func:`pointwise_tiles` with :func:`pointwise_gemm`; None where
    neither applies."""
    if uses_packed(dtype, product):
        return pointwise_packed.dispatcher
    gemm = pointwise_gemm(dtype)
    return None if gemm is None else functools.partial(pointwise_tiles.dispatcher, gemm)


def tile_columns(filters: int, depth: int, width: int, itemsize: int, packed: bool = False
                 ) -> int | None:
    """Columns per tile for an output of ``filters`` x ``width``: about :data:`TILE_COLUMNS`,
    equal tiles, a multiple of 16; None (one tile) for weights larger than
    :data:`TILED_WEIGHT_BYTES` or an output smaller than :data:`TILED_OUTPUT_BYTES`. The
    ``packed`` product (nothing packed again per tile) always takes :data:`TILE_COLUMNS`, a
    multiple of its panels' 16 or 64 columns."""
    if packed:
        return TILE_COLUMNS
    if filters * depth * itemsize > TILED_WEIGHT_BYTES or filters * width * itemsize < TILED_OUTPUT_BYTES:
        return None
    tiles = -(-width // TILE_COLUMNS)
    per_tile = -(-width // tiles)
    return -(-per_tile // 16) * 16


@compiled(inline="always")
def _finish_tile(out: np.ndarray, start: int, out_stride: int, filters: int, columns: int,
                 bias: np.ndarray, first: int, residual: np.ndarray, low: float, high: float,
                 activation: int, alpha: float, beta: float) -> None:
    """The finishing pass of one tile (``columns`` positions from ``start``, each of its
    ``filters`` filters' rows ``out_stride`` further, the first being filter ``first``), while
    it is in cache: bias, residual, clamp, activation."""
    lo, hi = out.dtype.type(low), out.dtype.type(high)
    zero = out.dtype.type(0)
    with_bias, with_residual = bias.size > 0, residual.size > 0
    n = np.uintp(columns)
    for i in range(filters):
        row = np.uintp(start + i * out_stride)
        finish_run(out, row, n, bias[first + i] if with_bias else zero, residual, lo, hi,
                   with_bias, with_residual)
        if activation >= 0:
            activate_run(out, row, n, activation, alpha, beta)


@compiled
def pointwise_tiles(gemm, weights: np.ndarray, source: np.ndarray, source_offset: int,
                    source_stride: int, out: np.ndarray, out_offset: int, out_stride: int,
                    filters: int, depth: int, width: int, bias: np.ndarray, residual: np.ndarray,
                    low: float, high: float, activation: int, alpha: float, beta: float,
                    tile: int) -> None:
    """``out[o + i * out_stride + j] = clamp((sum_k weights[i, k] source[s + k *
    source_stride + j] + bias[i]) + residual[o + i * out_stride + j])`` for filters ``i <
    filters`` and columns ``j < width`` (``o``, ``s``: the offsets), ``tile`` columns at a
    time, each tile one BLAS product (``gemm``) then finished; ``weights`` is (filters, depth)
    C-contiguous; an empty ``bias`` or ``residual`` is not added; the clamp is numpy's
    maximum with ``low``, then minimum with ``high``; then, when ``activation`` is not -1 (a
    float32 output), that compiled activation
    (:func:`~onnx_light.kernels.compiled_activations.activate_run`, with ``alpha`` and ``beta``)."""
    item = out.itemsize
    for j0 in range(0, width, tile):
        columns = min(tile, width - j0)
        start = out_offset + j0
        gemm(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, filters, columns, depth, 1.0, weights.ctypes.data,
             depth, source.ctypes.data + (source_offset + j0) * item, source_stride, 0.0,
             out.ctypes.data + start * item, out_stride)
        _finish_tile(out, start, out_stride, filters, columns, bias, 0, residual, low, high,
                     activation, alpha, beta)


@compiled
def pointwise_units(gemm, weights: np.ndarray, source: np.ndarray, source_offset: int,
                    source_stride: int, image_source: int, out: np.ndarray, out_offset: int,
                    out_stride: int, image_out: int, filters: int, depth: int, width: int,
                    bias: np.ndarray, residual: np.ndarray, low: float, high: float,
                    activation: int, alpha: float, beta: float, tile: int, block: int,
                    begin: int, end: int) -> None:
    """Units ``begin`` to ``end - 1`` of :func:`pointwise_tiles`'s product over a batch of
    images (image ``n`` reads ``source`` from ``source_offset + n * image_source`` and writes
    ``out`` from ``out_offset + n * image_out``): each image's units are its tiles of
    ``tile`` columns, each cut into blocks of ``block`` filters (unit ``u``: image ``u //
    (tiles x blocks)``, then tile, then block), each unit one BLAS product then finished as
    :func:`pointwise_tiles` finishes a tile. With ``block = filters`` an image's units are
    :func:`pointwise_tiles`'s calls, argument for argument."""
    item = out.itemsize
    tiles = (width + tile - 1) // tile
    blocks = (filters + block - 1) // block
    per_image = tiles * blocks
    for u in range(begin, end):
        n, unit = u // per_image, u % per_image
        j0, f0 = unit // blocks * tile, unit % blocks * block
        columns, count = min(tile, width - j0), min(block, filters - f0)
        start = out_offset + n * image_out + f0 * out_stride + j0
        gemm(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, count, columns, depth, 1.0,
             weights.ctypes.data + f0 * depth * item, depth,
             source.ctypes.data + (source_offset + n * image_source + j0) * item, source_stride,
             0.0, out.ctypes.data + start * item, out_stride)
        _finish_tile(out, start, out_stride, count, columns, bias, f0, residual, low, high,
                     activation, alpha, beta)


@compiled(parallel=True)
def pointwise_units_parallel(gemm, weights: np.ndarray, source: np.ndarray, source_offset: int,
                             source_stride: int, image_source: int, out: np.ndarray,
                             out_offset: int, out_stride: int, image_out: int, filters: int,
                             depth: int, width: int, bias: np.ndarray, residual: np.ndarray,
                             low: float, high: float, activation: int, alpha: float, beta: float,
                             tile: int, block: int, units: int, threads: int,
                             counter: np.ndarray) -> None:
    """:func:`pointwise_units` of units ``0`` to ``units - 1`` shared by ``threads`` of
    numba's threads (the caller has set their count and holds BLAS to one thread, so that
    each product runs on the thread that calls it), each thread taking the next unit in turn
    (:data:`~onnx_light.kernels.spin.claim`) until none is left: the calling thread starts at
    once, and a thread that wakes late takes fewer. The same products as one thread makes, so the same bits.
    ``counter`` is one int64 0, the caller's (an array made here would be each thread's own)."""
    for _ in prange(threads):
        unit = claim(counter, 0)
        while unit < units:
            pointwise_units(gemm, weights, source, source_offset, source_stride, image_source, out,
                            out_offset, out_stride, image_out, filters, depth, width, bias, residual,
                            low, high, activation, alpha, beta, tile, block, unit, unit + 1)
            unit = claim(counter, 0)


@compiled
def pointwise_packed(weights: np.ndarray, source: np.ndarray, source_offset: int,
                     source_stride: int, out: np.ndarray, out_offset: int, out_stride: int,
                     filters: int, depth: int, width: int, bias: np.ndarray, residual: np.ndarray,
                     low: float, high: float, activation: int, alpha: float, beta: float,
                     tile: int) -> None:
    """:func:`pointwise_tiles` in float32 with the packed micro-kernel
    (:func:`~onnx_light.kernels.packed_gemm.panels_over_rows`) for the product of each tile:
    ``weights`` are its rows (packed once per call by
    :func:`~onnx_light.kernels.packed_gemm.pack_rows`), and its panels are the input's rows
    themselves (each step of the sum the next channel's ``NR`` positions, ``source_stride``
    further), but for the last ``width % NR`` positions of a tile, which are packed into one
    zero-padded panel
    (:func:`~onnx_light.kernels.packed_gemm.pack_panels`). The product lands straight in the
    output's rows and is finished as :func:`pointwise_tiles` finishes it. ``out`` is the whole
    flat output, ``out_stride`` dividing its size; ``tile`` a multiple of ``NR``."""
    grid = out.reshape(out.size // out_stride, out_stride)
    row0, column0 = out_offset // out_stride, out_offset % out_stride
    edge = np.empty((1, depth, NR), np.float32)
    no_bias = np.zeros(-(-tile // NR) * NR, np.float32)
    block = max(MR, BLOCK_A_BYTES // (4 * max(depth, 1)) // MR * MR)
    rows = pack_rows(weights, 0, filters)  # once for all the tiles
    for j0 in range(0, width, tile):
        columns = min(tile, width - j0)
        full = columns // NR * NR
        for top in range(0, filters, block):
            bottom = min(filters, top + block)
            if full > 0:
                # the first block of filters fetches each channel's next NR positions
                panels_over_rows(rows, source, (source_offset + j0, NR, source_stride, NR), no_bias,
                                 False, grid, top, bottom, row0, column0 + j0, full)
            if full < columns:
                if top == 0:
                    pack_panels(source, source_offset + j0 + full, source_stride, depth,
                                columns - full, edge)
                panels_over_rows(rows, edge, packed_layout(depth), no_bias, False, grid, top, bottom,
                                 row0, column0 + j0 + full, columns - full)
        _finish_tile(out, out_offset + j0, out_stride, filters, columns, bias, 0, residual, low,
                     high, activation, alpha, beta)


#: Filters from which :func:`pointwise_transposed` packs the input's positions
#: (:func:`~onnx_light.kernels.packed_gemm.pack_columns`, once per image and thread) instead of
#: reading them in place: the pack costs about 0.7 ns a value, the packed rows save 10-30% of
#: the product where many filters share them (docs/conv.md, "Small planes transposed").
PACK_FILTERS = 128


@compiled(inline="always")
def _panel_transposed(a: np.ndarray, a_start: int, a_block: int, a_step: int, packed: bool, m: int,
                      panels: np.ndarray, out: np.ndarray, out_row: int, panel: int, n: int,
                      no_bias: np.ndarray) -> None:
    """Panel ``panel`` of :func:`~onnx_light.kernels.packed_gemm.panels_transposed`'s product
    (its ``a_layout`` is ``(a_start, a_block, a_step)``, positions from 0, no bias, no
    prefetch), with the micro-kernel's arguments constants where they can be: a whole panel's
    blocks of ``MR`` positions at the full height and width, and packed positions (``packed``)
    at the step ``MR``, so that LLVM drops the height's and width's selects and the prefetch
    test from the loop and keeps one address per block instead of six spilled ones (10-20%
    less time on 14x14 and 28x28 planes; docs/conv.md). The same calls of the micro-kernel
    with the same values: the same bits."""
    k = panels.shape[1]
    column = panel * NR
    width = min(NR, n - column)
    b_start = panel * k * NR
    full = m // MR * MR if width == NR else 0
    if packed:
        for i0 in range(0, full, MR):
            _tile_transposed(a, panels, out, no_bias, a_start + i0 // MR * a_block, MR, b_start, NR, 0,
                             column, MR, i0, out_row + column, False, False, k, VECTORS, NR)
    else:
        for i0 in range(0, full, MR):
            _tile_transposed(a, panels, out, no_bias, a_start + i0 // MR * a_block, a_step, b_start, NR,
                             0, column, MR, i0, out_row + column, False, False, k, VECTORS, NR)
    vectors = -(-width // LANES)
    for i0 in range(full, m, MR):
        _tile_transposed(a, panels, out, no_bias, a_start + i0 // MR * a_block, a_step, b_start, NR, 0,
                         column, min(MR, m - i0), i0, out_row + column, False, False, k, vectors,
                         width)


@compiled(inline="always")
def _transposed_unit(panels: np.ndarray, source: np.ndarray, source_offset: int,
                     source_stride: int, image_source: int, out: np.ndarray, out_offset: int,
                     out_stride: int, image_out: int, filters: int, depth: int, width: int,
                     bias: np.ndarray, residual: np.ndarray, low: float, high: float,
                     activation: int, alpha: float, beta: float, unit: int, rows: np.ndarray,
                     packed: int, no_bias: np.ndarray) -> int:
    """Unit ``unit`` of :func:`pointwise_transposed`, its image's positions packed into
    ``rows`` unless image ``packed`` is there already (or read in place where ``rows`` is
    empty); returns the image in ``rows``."""
    count = -(-filters // NR)
    n, panel = unit // count, unit % count
    start = out_offset + n * image_out
    grid = out.reshape(out.size // out_stride, out_stride)
    if rows.size == 0:
        _panel_transposed(source, source_offset + n * image_source, MR, source_stride, False, width,
                          panels, grid, start // out_stride, panel, filters, no_bias)
    else:
        if n != packed:
            pack_columns(source, source_offset + n * image_source, source_stride, depth, width, rows)
        _panel_transposed(rows.reshape(-1), 0, depth * MR, MR, True, width, panels, grid,
                          start // out_stride, panel, filters, no_bias)
    f0 = panel * NR
    _finish_tile(out, start + f0 * out_stride, out_stride, min(NR, filters - f0), width, bias, f0,
                 residual, low, high, activation, alpha, beta)
    return n


@compiled(inline="always")
def _transposed_buffers(filters: int, depth: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows :func:`_transposed_unit` packs an image's positions into (none below
    :data:`PACK_FILTERS` filters), and the zeros it passes as the micro-kernel's bias."""
    blocks = -(-width // MR) if filters >= PACK_FILTERS else 0
    return np.empty((blocks, depth, MR), np.float32), np.zeros(-(-filters // NR) * NR, np.float32)


@compiled
def pointwise_transposed(panels: np.ndarray, source: np.ndarray, source_offset: int,
                         source_stride: int, image_source: int, out: np.ndarray, out_offset: int,
                         out_stride: int, image_out: int, filters: int, depth: int, width: int,
                         bias: np.ndarray, residual: np.ndarray, low: float, high: float,
                         activation: int, alpha: float, beta: float, begin: int, end: int) -> None:
    """Units ``begin`` to ``end - 1`` of :func:`pointwise_units`'s finished product in float32
    over a batch of images, computed by the packed micro-kernel transposed
    (:func:`~onnx_light.kernels.packed_gemm.panels_transposed`'s blocks, :func:`_panel_transposed`):
    the weights' transpose in
    ``panels`` (:func:`transposed_weights`), the input's positions its rows (channel p of
    image n's position j at ``source_offset + n * image_source + p * source_stride + j``),
    read in place or, from :data:`PACK_FILTERS` filters, packed once per image
    (:func:`~onnx_light.kernels.packed_gemm.pack_columns`), each block stored transposed into
    the output's rows. Unit ``u``: image ``u // P``, its panel ``u % P`` of ``NR`` filters (P
    panels), finished (bias, residual, clamp, activation) as :func:`pointwise_tiles`
    finishes a tile while its rows are in cache. ``out_offset`` and ``image_out`` are
    multiples of ``out_stride``. The layout of the rows changes no element's sum."""
    rows, no_bias = _transposed_buffers(filters, depth, width)
    packed = -1
    for unit in range(begin, end):
        packed = _transposed_unit(panels, source, source_offset, source_stride, image_source, out,
                                  out_offset, out_stride, image_out, filters, depth, width, bias,
                                  residual, low, high, activation, alpha, beta, unit, rows, packed,
                                  no_bias)


@compiled(parallel=True)
def pointwise_transposed_parallel(panels: np.ndarray, source: np.ndarray, source_offset: int,
                                  source_stride: int, image_source: int, out: np.ndarray,
                                  out_offset: int, out_stride: int, image_out: int, filters: int,
                                  depth: int, width: int, bias: np.ndarray, residual: np.ndarray,
                                  low: float, high: float, activation: int,
                                  alpha: float, beta: float, units: int, threads: int,
                                  counter: np.ndarray) -> None:
    """:func:`pointwise_transposed` of units ``0`` to ``units - 1`` shared by ``threads`` of
    numba's threads, each taking the next unit in turn as :func:`pointwise_units_parallel`
    does (and packing the positions of the images it meets into its own rows): the same
    units as one thread, so the same bits. ``counter`` is one int64 0."""
    for _ in prange(threads):
        rows, no_bias = _transposed_buffers(filters, depth, width)
        packed = -1
        unit = claim(counter, 0)
        while unit < units:
            packed = _transposed_unit(panels, source, source_offset, source_stride, image_source,
                                      out, out_offset, out_stride, image_out, filters, depth, width,
                                      bias, residual, low, high, activation, alpha, beta, unit, rows,
                                      packed, no_bias)
            unit = claim(counter, 0)


def uses_transposed(dtype: np.dtype, plane: int, positions: int) -> bool:
    """Whether a 1x1 convolution of constant weights in ``dtype`` on a plane of ``plane``
    positions takes :func:`pointwise_transposed` for the ``pointwise.transposed_positions``
    value ``positions``: float32, planes of 2 to ``positions``, where the packed kernel runs."""
    return (1 < plane <= positions and np.dtype(dtype) == np.float32
            and packed_gemm.available())


def transposed_weights(w: np.ndarray) -> np.ndarray:
    """Weights (filters, depth, 1, ...) as :func:`pointwise_transposed` takes them: their
    (depth, filters) transpose packed in panels of ``NR`` filters
    (:class:`~onnx_light.kernels.packed_gemm.PackedWeights`), read-only."""
    flat = w.reshape(w.shape[0], -1)
    return read_only(PackedWeights(flat.T.astype(np.float32, copy=False)).panels)


@compiled
def pointwise_vector(weights: np.ndarray, source: np.ndarray, out: np.ndarray, batch: int,
                     filters: int, depth: int, bias: np.ndarray, residual: np.ndarray, low: float,
                     high: float, activation: int, alpha: float, beta: float) -> None:
    """A 1x1 convolution of 1x1 planes (a matrix-vector product per image: a squeeze-and-
    excitation's two convolutions), finished as :func:`pointwise_tiles` finishes a tile:
    ``out[n * filters + i] = sum_k weights[k * filters + i] source[n * depth + k]``, the sum
    in the order of ``k`` (a product, then an addition: two roundings per step, no fused
    multiply-add), each step one pass over the filters that LLVM vectorises; ``weights`` is
    the (depth, filters) transpose of the weights, flat (:func:`vector_weights`), ``depth``
    at least 1. No tile machinery, no BLAS call: one BLAS product of one column cost 5 times
    this (docs/conv.md, "Squeeze-and-excitation")."""
    count, terms = np.uintp(filters), np.uintp(depth)
    for n in range(np.uintp(batch)):
        o, s = n * count, n * terms
        first = source[s]
        for i in range(count):  # the first product alone: a -0.0 product stays -0.0
            out[o + i] = weights[i] * first
        for k in range(np.uintp(1), terms):
            value = source[s + k]
            row = k * count
            for i in range(count):
                out[o + i] += weights[row + i] * value
        _finish_tile(out, o, 1, filters, 1, bias, 0, residual, low, high, activation, alpha, beta)


def vector_weights(w: np.ndarray) -> np.ndarray:
    """Weights (filters, depth, 1, ...) as :func:`pointwise_vector` takes them: the
    (depth, filters) transpose, flat and read-only."""
    return read_only(np.ascontiguousarray(w.reshape(w.shape[0], -1).T).reshape(-1))


def product_units(filters: int, depth: int, width: int, itemsize: int) -> tuple[int, int]:
    """The units of ``direct_1x1``'s BLAS product of one image, (columns per tile, filters per
    block): the tiles of :func:`tile_columns` with every filter; a product it keeps in one
    tile is cut in two where it has at least :data:`CUT_MULTIPLY_ADDS` multiply-adds, so
    that two threads can share it, along the side whose other operand each unit then reads
    whole is the smaller: its filters (in blocks of a multiple of 8) where the input
    (``depth`` x ``width``) is smaller than the weights (``filters`` x ``depth``), else its
    columns. A function of the shape alone: the same units, hence the same products and
    bits, at every thread count."""
    tile = tile_columns(filters, depth, width, itemsize)
    if tile is not None:
        return tile, filters
    if filters * depth * width < CUT_MULTIPLY_ADDS:
        return width, filters
    if width < filters:
        block = -(-filters // 16) * 8
        return width, block if block < filters else filters
    return -(-width // 2), filters


def compile_pointwise(dtype: np.dtype, product: str, threads: int = 1, transposed: bool = False,
                      rows: bool = False) -> None:
    """Compile what :func:`pointwise_call` runs for ``dtype`` and ``product`` at ``threads``
    threads (or load it from numba's cache), and :func:`pointwise_transposed` when
    ``transposed``, :func:`~onnx_light.kernels.conv.pointwise_rows.pointwise_rows` when
    ``rows``: a session does it at construction, not in its first run. Its operands
    are read-only views, as ``direct_1x1`` passes them (one compiled version per type)."""
    for kind in ("transposed",) * transposed + ("rows",) * rows:
        from .pointwise_rows import rows_weights

        call = pointwise_call((1, 1, 2), (1, 1, 1), np.dtype(np.float32), product, kind == "transposed",
                              kind == "rows")
        x, w = read_only(np.ones((1, 1, 2), np.float32)), np.ones((1, 1), np.float32)
        packed = transposed_weights(w) if kind == "transposed" else rows_weights(w)
        empty = _EMPTY[np.dtype(np.float32)]
        call(x, packed, None, None, (-math.inf, math.inf), (-1, 1.0, 0.0), 1)
        if threads > 1 and numba_threads(threads):
            call._packed_kernels()[1](
                packed, x.reshape(-1), 0, 2, 2, np.empty(2, np.float32), 0, 2, 2, 1, 1,
                2, empty, empty, -math.inf, math.inf, -1, 1.0, 0.0, 1, 1, np.zeros(1, np.int64))
    function = pointwise_product(dtype, product)
    if function is None:
        return
    w, x, empty = (read_only(np.ones(shape, dtype)) for shape in ((1, 1), 1, 0))
    out = np.empty(1, dtype)
    function(w, x, 0, 1, out, 0, 1, 1, 1, 1, empty, empty, -math.inf, math.inf, -1, 1.0, 0.0,
             TILE_COLUMNS)
    if uses_packed(dtype, product):
        return
    arguments = (pointwise_gemm(dtype), w, x, 0, 1, 1, out, 0, 1, 1, 1, 1, 1, empty, empty,
                 -math.inf, math.inf, -1, 1.0, 0.0, 1, 1)
    pointwise_units.dispatcher(*arguments, 0, 1)
    pointwise_vector.dispatcher(x, x, out, 1, 1, 1, empty, empty, -math.inf, math.inf, -1, 1.0, 0.0)
    if threads > 1 and numba_threads(threads):
        pointwise_units_parallel.dispatcher(*arguments, 1, 1, np.zeros(1, np.int64))


@dataclass(frozen=True)
class PointwiseCall:
    """A whole ``direct_1x1`` call of one group for one shape of X and W, without the Python
    layers of the general path (the algorithm object, its views, the plan, the finishing
    object), which cost more than a small node's product (docs/conv.md). With BLAS
    (``gemm``), one compiled call of the units of :func:`product_units` over the batch
    (:func:`pointwise_units`), shared by numba's threads when the caller asks for more than
    one; with the packed product (``function``), each image one call of it with the
    arguments ``direct_1x1``'s blocks pass it (same values, bitwise). Made once per shape
    (:func:`pointwise_call`)."""

    gemm: Any | None
    function: Callable[..., None] | None
    batch: int
    filters: int
    depth: int
    plane: int
    tile: int
    block: int
    out_shape: tuple[int, ...]
    units: int  # of the whole batch (:func:`pointwise_units`)
    multiply_adds: int
    vector: bool = False
    transposed: bool = False
    rows: bool = False  # pointwise_rows.pointwise_rows's call

    def _packed_kernels(self) -> tuple[Any, Any]:
        """The serial and parallel kernels of a ``transposed`` or ``rows`` call (their
        arguments are the same)."""
        if self.rows:
            from .pointwise_rows import pointwise_rows, pointwise_rows_parallel

            return pointwise_rows.dispatcher, pointwise_rows_parallel.dispatcher
        return pointwise_transposed.dispatcher, pointwise_transposed_parallel.dispatcher

    def __call__(self, x: np.ndarray, weights: np.ndarray, bias: np.ndarray | None,
                 residual: np.ndarray | None, clamp: tuple[float, float],
                 activation: tuple[int, float, float], blas_threads: int, threads: int = 1
                 ) -> np.ndarray:
        """The finished output of C-contiguous ``x`` (the call's shape) by read-only
        ``weights`` (filters, depth) and flat read-only ``bias`` and ``residual`` (or None):
        the units on ``threads`` numba threads (each product on one BLAS thread) where there
        are several, else with ``blas_threads`` BLAS threads on the calling thread. A
        ``vector`` call takes the weights of :func:`vector_weights` and runs on the calling
        thread (into an output not aligned: it stores no whole blocks). A ``transposed`` call
        takes the weights of :func:`transposed_weights`, a ``rows`` call those of
        :func:`~onnx_light.kernels.conv.pointwise_rows.rows_weights`, their units shared as
        the BLAS units are."""
        out = (np.empty if self.vector else aligned_empty)(self.out_shape, x.dtype)
        flat_x, flat_out = x.reshape(-1), out.reshape(-1)
        if flat_x.flags.writeable:  # a session's feeds and values are read-only already
            flat_x = read_only(flat_x)
        empty = _EMPTY[x.dtype]
        bias = empty if bias is None else bias
        residual = empty if residual is None else residual
        filters, depth, plane = self.filters, self.depth, self.plane
        low, high = clamp
        code, alpha, beta = activation
        if self.vector:
            pointwise_vector.dispatcher(weights, flat_x, flat_out, self.batch, filters, depth, bias,
                                        residual, low, high, code, alpha, beta)
            return out
        if self.transposed or self.rows:
            arguments = (weights, flat_x, 0, plane, depth * plane, flat_out, 0, plane, filters * plane,
                         filters, depth, plane, bias, residual, low, high, code, alpha, beta)
            units = self.units
            serial, parallel = self._packed_kernels()
            if threads > 1 and units > 1 and numba_threads(threads := min(threads, units)):
                parallel(*arguments, units, threads, np.zeros(1, np.int64))
            else:
                serial(*arguments, 0, units)
            return out
        if self.gemm is None:
            with BLAS.limited(blas_threads):
                for n in range(self.batch):
                    self.function(weights, flat_x, n * depth * plane, plane, flat_out,
                                  n * filters * plane, plane, filters, depth, plane, bias, residual,
                                  low, high, code, alpha, beta, self.tile)
            return out
        arguments = (self.gemm, weights, flat_x, 0, plane, depth * plane, flat_out, 0, plane,
                     filters * plane, filters, depth, plane, bias, residual, low, high, code, alpha,
                     beta, self.tile, self.block)
        units = self.units
        if threads > 1 and units > 1 and numba_threads(threads := min(threads, units)):
            with BLAS.limited(1):
                pointwise_units_parallel.dispatcher(*arguments, units, threads, np.zeros(1, np.int64))
        else:
            with BLAS.limited(blas_threads):
                pointwise_units.dispatcher(*arguments, 0, units)
        return out

    def aligns(self, dtype: np.dtype) -> bool:
        """Whether :meth:`bind`'s call allocates its output of ``dtype`` on a 64-byte
        boundary (from :data:`ALIGNED_OUTPUT_BYTES`, but for the ``vector`` call), so that
        it takes no output given to it."""
        size = math.prod(self.out_shape) * np.dtype(dtype).itemsize
        return not self.vector and size >= ALIGNED_OUTPUT_BYTES

    def bind(self, weights: np.ndarray, bias: np.ndarray | None, clamp: tuple[float, float],
             activation: tuple[int, float, float], blas_threads: int, threads: int = 1
             ) -> Callable[[np.ndarray, np.ndarray | None, np.ndarray | None], np.ndarray]:
        """This call bound to its weights, bias and fused parts (the arguments of
        :meth:`__call__`): ``bound(x, residual, out=None)``, ``x`` C-contiguous of the call's
        shape and the weights' type, ``residual`` flat, read-only and of that type or None,
        ``out`` a C-contiguous array of the output's shape and type to write into where the
        call does not align its output (:meth:`aligns`), or None (none of them checked).
        On one numba thread (``threads``), but for the packed product: one compiled call
        through its compiled entry (:func:`~onnx_light.kernels.conv.depthwise.compiled_entry`,
        which unboxes a writable X as it does a read-only one), no argument typed per run,
        the BLAS threads set only where they differ (a session holds its count already), into
        an output aligned only from :data:`ALIGNED_OUTPUT_BYTES` (the alignment saves a small
        output nothing): the arguments of :meth:`__call__`, so its bits."""
        dtype = np.dtype(weights.dtype)
        if threads > 1 or (self.gemm is None and not self.vector and not self.transposed
                           and not self.rows):
            def called(x: np.ndarray, residual: np.ndarray | None, out: np.ndarray | None = None
                       ) -> np.ndarray:
                return self(x, weights, bias, residual, clamp, activation, blas_threads, threads)

            return called
        empty = _EMPTY[dtype]
        bias = empty if bias is None else bias
        filters, depth, plane, units = self.filters, self.depth, self.plane, self.units
        fused = (*clamp, *activation)
        out_shape = self.out_shape
        allocate = aligned_empty if self.aligns(dtype) else np.empty
        x_sample, out_sample = read_only(np.empty(1, dtype)), np.empty(1, dtype)
        if self.vector:
            head, middle, tail = (weights,), (), (self.batch, filters, depth, bias)
            dispatcher = pointwise_vector.dispatcher
            fused_tail: tuple = fused
        else:
            head = (weights,) if self.transposed or self.rows else (self.gemm, weights)
            middle, tail = (0, plane, depth * plane), (0, plane, filters * plane, filters, depth, plane, bias)
            if self.transposed or self.rows:
                dispatcher, fused_tail = self._packed_kernels()[0], (*fused, 0, units)
            else:
                dispatcher = pointwise_units.dispatcher
                fused_tail = (*fused, self.tile, self.block, 0, units)
        entry = compiled_entry(dispatcher, (*head, x_sample, *middle, out_sample, *tail, empty,
                                            *fused_tail))
        limit = self.gemm is not None

        def bound(x: np.ndarray, residual: np.ndarray | None, out: np.ndarray | None = None
                  ) -> np.ndarray:
            if out is None:
                out = allocate(out_shape, dtype)
            arguments = (*head, x.reshape(-1), *middle, out.reshape(-1), *tail,
                         empty if residual is None else residual, *fused_tail)
            if not limit:
                entry(*arguments)
                return out
            hold = BLAS.limit(blas_threads)
            try:
                entry(*arguments)
            finally:
                BLAS.restore(hold)
            return out

        return bound


# The read-only empty operand (no bias, no residual) of each type.
_EMPTY = {dtype: read_only(np.empty(0, dtype)) for dtype in FINISHED_TYPES}

@functools.lru_cache(maxsize=1024)
def pointwise_call(x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype,
                   product: str, transposed: bool = False, rows: bool = False) -> PointwiseCall | None:
    """The :class:`PointwiseCall` of a 1x1 convolution of one group with these shapes (as
    its problem checked them), remembered per shape; None where ``direct_1x1`` takes no
    compiled product (another type) or the output or the sum is empty. ``transposed``
    (where :func:`uses_transposed` holds: the caller has the weights of
    :func:`transposed_weights`): :func:`pointwise_transposed`'s call; ``rows`` (where
    :func:`~onnx_light.kernels.conv.pointwise_rows.uses_rows` holds, the caller having the
    weights of :func:`~onnx_light.kernels.conv.pointwise_rows.rows_weights`):
    :func:`~onnx_light.kernels.conv.pointwise_rows.pointwise_rows`'s call, its units an
    image's tiles of :data:`TILE_COLUMNS` positions."""
    batch, depth, filters = x_shape[0], x_shape[1], w_shape[0]
    plane = math.prod(x_shape[2:])
    out_shape = (batch, filters, *x_shape[2:])
    if batch * depth * filters * plane == 0:
        return None
    if plane == 1 and dtype in FINISHED_TYPES:
        return PointwiseCall(None, None, batch, filters, depth, plane, 1, filters, out_shape,
                             batch, batch * filters * depth, True)
    if rows:
        return PointwiseCall(None, None, batch, filters, depth, plane, TILE_COLUMNS, filters, out_shape,
                             batch * -(-plane // TILE_COLUMNS), batch * filters * depth * plane, rows=True)
    if transposed:
        return PointwiseCall(None, None, batch, filters, depth, plane, plane, NR.value, out_shape,
                             batch * -(-filters // NR.value), batch * filters * depth * plane,
                             transposed=True)
    if uses_packed(dtype, product):
        return PointwiseCall(None, pointwise_packed.dispatcher, batch, filters, depth, plane,
                             TILE_COLUMNS, filters, out_shape, batch, batch * filters * depth * plane)
    gemm = pointwise_gemm(dtype)
    if gemm is None:
        return None
    tile, block = product_units(filters, depth, plane, dtype.itemsize)
    units = batch * -(-plane // tile) * -(-filters // block)
    return PointwiseCall(gemm, None, batch, filters, depth, plane, tile, block, out_shape, units,
                         batch * filters * depth * plane)
