"""Conv's pointwise (1x1) product finished tile by tile, in one compiled call
(:func:`pointwise_tiles`).

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
One compiled call also replaces the Python layers a block goes through.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..blas_tiles import gemm_function
from ..compiled import compiled
from ..compiled_activations import activate_run
from .depthwise import read_only
from .finish import FINISHED_TYPES, finish_run

__all__ = ["TILED_OUTPUT_BYTES", "TILED_WEIGHT_BYTES", "TILE_COLUMNS", "compile_pointwise",
           "pointwise_gemm", "pointwise_tiles", "tile_columns"]

#: Columns (output positions) per tile, about: each tile's product is finished while it is in
#: cache. Narrower tiles lose more in BLAS than the cache saves, wider ones save less.
TILE_COLUMNS = 256
#: Weights larger than this keep one tile: each tile's product packs them again.
TILED_WEIGHT_BYTES = 1 << 16
#: Outputs smaller than this keep one tile: they stay in the second-level cache anyway.
TILED_OUTPUT_BYTES = 1 << 18

_ROW_MAJOR, _NO_TRANS = 101, 111


def pointwise_gemm(dtype: np.dtype) -> Any | None:
    """numpy's ``cblas_?gemm`` for the compiled pointwise product in ``dtype``, or None when
    the type is not one the finishing pass takes or numpy's BLAS has none (``direct_1x1``
    then keeps its numpy product)."""
    return gemm_function(dtype) if np.dtype(dtype) in FINISHED_TYPES else None


def tile_columns(filters: int, depth: int, width: int, itemsize: int) -> int | None:
    """Columns per tile for an output of ``filters`` x ``width``: about :data:`TILE_COLUMNS`,
    equal tiles, a multiple of 16; None (one tile) for weights larger than
    :data:`TILED_WEIGHT_BYTES` or an output smaller than :data:`TILED_OUTPUT_BYTES`."""
    if filters * depth * itemsize > TILED_WEIGHT_BYTES or filters * width * itemsize < TILED_OUTPUT_BYTES:
        return None
    tiles = -(-width // TILE_COLUMNS)
    per_tile = -(-width // tiles)
    return -(-per_tile // 16) * 16


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
    lo, hi = out.dtype.type(low), out.dtype.type(high)
    zero = out.dtype.type(0)
    with_bias, with_residual = bias.size > 0, residual.size > 0
    for j0 in range(0, width, tile):
        columns = min(tile, width - j0)
        start = out_offset + j0
        gemm(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, filters, columns, depth, 1.0, weights.ctypes.data,
             depth, source.ctypes.data + (source_offset + j0) * item, source_stride, 0.0,
             out.ctypes.data + start * item, out_stride)
        for i in range(filters):
            row = np.uintp(start + i * out_stride)
            n = np.uintp(columns)
            finish_run(out, row, n, bias[i] if with_bias else zero, residual, lo, hi, with_bias,
                       with_residual)
            if activation >= 0:
                activate_run(out, row, n, activation, alpha, beta)


def compile_pointwise(dtype: np.dtype) -> None:
    """Compile :func:`pointwise_tiles` for ``dtype`` (or load it from numba's cache): a session
    does it at construction, not in its first run. Its operands are read-only views, as
    ``direct_1x1`` passes them (one compiled version per type)."""
    gemm = pointwise_gemm(dtype)
    if gemm is None:
        return
    w, x, empty = (read_only(np.ones(shape, dtype)) for shape in ((1, 1), 1, 0))
    pointwise_tiles.dispatcher(gemm, w, x, 0, 1, np.empty(1, dtype), 0, 1, 1, 1, 1, empty, empty,
                               -math.inf, math.inf, -1, 1.0, 0.0, 16)
