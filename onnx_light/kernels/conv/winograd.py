"""Winograd's minimal filtering F(2x2, 3x3): the arithmetic of Conv's ``winograd`` algorithm.

A 3x3 convolution with stride and dilation 1 computes each 2x2 tile of outputs from the 4x4
tile of inputs under it. With the matrices below, ``Y = A^T [(G g G^T) * (B^T d B)] A``
for one channel (``*`` elementwise), summed over the channels: 16 products per tile and
channel pair instead of 36. The 16 elementwise products of all the tiles and channels are 16
matrix products (filters x channels times channels x tiles), which BLAS computes; the
transforms are additions and subtractions (every entry of ``B`` and ``A`` is 0 or +-1), one
numpy pass over the tiles per term. The filter transform has entries of 1/2 and is done once
per filter set, in float64.

Larger tiles (F(4x4, 3x3): 36 products per 16 outputs) need multiplications in their
transforms and lose accuracy in float32 (measured: docs/conv.md).

Every function also takes the matrices, so that the same passes with the absolute values
of the matrices, on the absolute values of the data, compute the magnitudes that bound the
rounding error (see :func:`onnx_light.kernels.conv.numerics.error_bound`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ALPHA", "FILTER", "INPUT", "OUTPUT", "TILE", "combine", "transform_filters",
           "transform_inputs", "transform_outputs"]

TILE = 2  # outputs per tile along each axis
ALPHA = 4  # inputs per tile along each axis: TILE + 3 - 1
INPUT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])  # B^T
FILTER = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])  # G
OUTPUT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]])  # A^T


def combine(coefficients: Sequence[float], terms: Sequence[np.ndarray], out: np.ndarray) -> np.ndarray:
    """``out = sum(c * t)`` over the nonzero coefficients, which must be +-1 (one pass each)."""
    first = True
    for coefficient, term in zip(coefficients, terms, strict=True):
        if coefficient == 0:
            continue
        if coefficient not in (1, -1):
            raise ValueError(f"coefficient {coefficient} is not 0 or +-1")
        if first:
            if coefficient == 1:
                np.copyto(out, term)
            else:
                np.negative(term, out=out)
            first = False
        elif coefficient == 1:
            out += term
        else:
            out -= term
    if first:
        out.fill(0)
    return out


def transform_filters(w: np.ndarray, dtype: np.dtype | type, matrix: np.ndarray = FILTER) -> np.ndarray:
    """``G g G^T`` of every 3x3 filter of ``w`` (..., 3, 3), as (16, ...) in ``dtype``,
    contiguous (computed in float64, rounded once)."""
    # entry (i, j) of G g G^T is sum over (r, s) of G[i, r] G[j, s] g[r, s]: one product with
    # the Kronecker product of G with itself, (16, 9) x (9, filters)
    u = np.kron(matrix, matrix) @ w.reshape(-1, 9).astype(np.float64).T
    return u.reshape(ALPHA * ALPHA, *w.shape[:-2]).astype(dtype)


def transform_inputs(x: np.ndarray, tiles: tuple[int, int], out: np.ndarray,
                     scratch: np.ndarray, matrix: np.ndarray = INPUT) -> np.ndarray:
    """``B^T d B`` of every input tile.

    ``x`` (C, 2 * th + 2, 2 * tw + 2) are the padded input rows of ``tiles = (th, tw)``
    tiles; ``out`` is (4, 4, C, th, tw) and ``scratch`` (4, C, th, 2 * tw + 2): the rows
    are transformed first, then the columns.
    """
    th, tw = tiles
    rows = [x[:, j:j + TILE * th:TILE] for j in range(ALPHA)]
    for i in range(ALPHA):
        combine(matrix[i], rows, scratch[i])
        columns = [scratch[i][..., j:j + TILE * tw:TILE] for j in range(ALPHA)]
        for k in range(ALPHA):
            combine(matrix[k], columns, out[i, k])
    return out


def transform_outputs(m: np.ndarray, out: np.ndarray, scratch: np.ndarray,
                      matrix: np.ndarray = OUTPUT) -> np.ndarray:
    """``A^T M A`` of every tile: ``m`` (4, 4, F, th, tw) -> ``out`` (F, th, 2, tw, 2);
    ``scratch`` is (2, 4, F, th, tw)."""
    for i in range(TILE):
        combine(matrix[i], [m[j] for j in range(ALPHA)], scratch[i])
        for k in range(TILE):
            combine(matrix[k], [scratch[i][j] for j in range(ALPHA)], out[:, :, i, :, k])
    return out
