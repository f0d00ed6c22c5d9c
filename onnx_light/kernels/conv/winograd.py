"""Winograd's minimal filtering F(m x m, 3x3) for m = 2 and 4: the arithmetic of Conv's
``winograd`` algorithm.

A 3x3 convolution with stride and dilation 1 computes each m x m tile of outputs from the
(m + 2) x (m + 2) tile of inputs under it: ``Y = A^T [(G g G^T) * (B^T d B)] A`` for one
channel (``*`` elementwise), summed over the channels, with the matrices of a
:class:`Tiling`. ``(m + 2)^2`` products per tile and channel pair instead of ``9 m^2``
(F(2x2, 3x3): 16 for 4 outputs, F(4x4, 3x3): 36 for 16). The products of all the tiles and
channels are ``(m + 2)^2`` matrix products (filters x channels times channels x tiles), which
BLAS computes; the transforms of the inputs and of the products are compiled loops
(:func:`transform_inputs`, :func:`transform_outputs`); the filter transform is done once per
filter set, in float64.

F(4x4, 3x3) interpolates at 0, 1, -1, 1/2, -2 and infinity rather than the usual 0, +-1,
+-2: its float32 error is about half as large (docs/conv.md), every entry of ``B^T`` and
``A^T`` stays a short binary fraction.

Every function also takes the matrices, so that the same passes with the absolute values
of the matrices, on the absolute values of the data, compute the magnitudes that bound the
rounding error (see :func:`onnx_light.kernels.conv.numerics.error_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..compiled import compiled

__all__ = ["F2", "F4", "TILINGS", "Tiling", "compile_transforms", "transform_filters",
           "transform_inputs", "transform_outputs"]


@dataclass(frozen=True, eq=False)
class Tiling:
    """F(m x m, 3x3): ``tile`` = m outputs per tile along each axis and its three matrices."""

    tile: int
    input: np.ndarray  # B^T, (alpha, alpha)
    filter: np.ndarray  # G, (alpha, 3)
    output: np.ndarray  # A^T, (tile, alpha)

    @property
    def alpha(self) -> int:
        """Inputs per tile along each axis: ``tile + 2``."""
        return self.tile + 2

    @property
    def roundings(self) -> int:
        """First-order count of the roundings on one output's path beyond the sum over the
        channels: the two passes of each transform (a sum of at most the nonzero entries of a
        row of its matrix, each product of a row a rounding too), the filter transform's
        rounding and the bias."""
        def widest(matrix: np.ndarray) -> int:
            return int(np.count_nonzero(matrix, axis=1).max())

        return 2 * widest(self.input) + 2 * widest(self.output) + 2


F2 = Tiling(2,
            np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
            np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
            np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64))
F4 = Tiling(4,
            np.array([[1, -1.5, -2, 1.5, 1, 0], [0, -1, 0.5, 2.5, 1, 0], [0, 1, -2.5, 0.5, 1, 0],
                      [0, -2, -1, 2, 1, 0], [0, 0.5, -1, -0.5, 1, 0], [0, 1, -1.5, -2, 1.5, 1]]),
            np.array([[1, 0, 0], [1 / 3, 1 / 3, 1 / 3], [-1 / 3, 1 / 3, -1 / 3],
                      [-16 / 15, -8 / 15, -4 / 15], [1 / 15, -2 / 15, 4 / 15], [0, 0, 1]]),
            np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 0.5, -2, 0], [0, 1, 1, 0.25, 4, 0],
                      [0, 1, -1, 0.125, -8, 1]]))
TILINGS = {tiling.tile: tiling for tiling in (F2, F4)}


def transform_filters(w: np.ndarray, dtype: np.dtype | type, tiling: Tiling = F2,
                      magnitudes: bool = False) -> np.ndarray:
    """``G g G^T`` of every 3x3 filter of ``w`` (..., 3, 3), as (alpha^2, ...) in ``dtype``,
    contiguous (computed in float64, rounded once); with ``|G|`` for ``magnitudes``."""
    # entry (i, j) of G g G^T is sum over (r, s) of G[i, r] G[j, s] g[r, s]: one product with
    # the Kronecker product of G with itself, (alpha^2, 9) x (9, filters)
    matrix = np.abs(tiling.filter) if magnitudes else tiling.filter
    u = np.kron(matrix, matrix) @ w.reshape(-1, 9).astype(np.float64).T
    return u.reshape(tiling.alpha * tiling.alpha, *w.shape[:-2]).astype(dtype)


@compiled(fastmath=True)
def transform_inputs(xp: np.ndarray, matrix: np.ndarray, out: np.ndarray, c0: int, c1: int,
                     into_channel: int, a: int, b: int, tile: int) -> None:
    """``B^T d B`` (``matrix`` = B^T, (alpha, alpha)) of the tiles of tile rows a:b of
    channels c0:c1 of ``xp`` (C, H, W), padded so that every tile's inputs are in it, into
    channels ``into_channel:into_channel + c1 - c0`` of ``out`` (alpha^2, channels,
    (b - a) * tw), tw = ``out``'s tiles per row.

    Per channel, the inputs of every tile are gathered (alpha^2 runs over the tiles), then
    combined along the tile's columns, then along its rows: every pass is a contiguous run
    over the block's tiles, which LLVM vectorises (each output the first nonzero term, then
    the others added: every row of the matrix has one). The loops index flat buffers with
    unsigned offsets and make no views (see :mod:`onnx_light.kernels.conv.depthwise`)."""
    height, width = xp.shape[1], xp.shape[2]
    alpha = np.uintp(matrix.shape[0])
    utile, count, tiles = np.uintp(tile), np.uintp(out.shape[1]), np.uintp(out.shape[2])
    tw = tiles // np.uintp(b - a)
    gathered = np.empty(alpha * alpha * tiles, xp.dtype)
    columns = np.empty(alpha * alpha * tiles, xp.dtype)
    source, target, coefficients = xp.reshape(-1), out.reshape(-1), matrix.reshape(-1)
    for c in range(np.uintp(c0), np.uintp(c1)):
        plane = c * np.uintp(height * width)
        for j in range(alpha):
            for k in range(alpha):
                into = (j * alpha + k) * tiles
                for ty in range(np.uintp(b - a)):
                    line = plane + (utile * (ty + np.uintp(a)) + j) * np.uintp(width) + k
                    at = into + ty * tw
                    for t in range(tw):
                        gathered[at + t] = source[line + t * utile]
        for j in range(alpha):
            for k in range(alpha):
                into = (j * alpha + k) * tiles
                started = False
                for m in range(alpha):
                    coefficient = coefficients[k * alpha + m]
                    if coefficient != 0:
                        at = (j * alpha + m) * tiles
                        if not started:
                            for t in range(tiles):
                                columns[into + t] = coefficient * gathered[at + t]
                            started = True
                        else:
                            for t in range(tiles):
                                columns[into + t] += coefficient * gathered[at + t]
        for i in range(alpha):
            for k in range(alpha):
                into = ((i * alpha + k) * count + c - np.uintp(c0) + np.uintp(into_channel)) * tiles
                started = False
                for j in range(alpha):
                    coefficient = coefficients[i * alpha + j]
                    if coefficient != 0:
                        at = (j * alpha + k) * tiles
                        if not started:
                            for t in range(tiles):
                                target[into + t] = coefficient * columns[at + t]
                            started = True
                        else:
                            for t in range(tiles):
                                target[into + t] += coefficient * columns[at + t]


@compiled(fastmath=True)
def transform_outputs(m: np.ndarray, matrix: np.ndarray, bias: np.ndarray, out: np.ndarray,
                      first: int, a: int, s: int, e: int) -> None:
    """``A^T M A`` (``matrix`` = A^T, (tile, alpha)) plus the bias of every tile of ``m``
    (alpha^2, planes, tiles: tile rows from a, tw = ``out``'s width / tile rounded up per
    row), written into rows s:e of planes ``first:first + planes`` of ``out`` (P, H, W).

    Per plane: the rows of each tile combined, then its columns (contiguous runs over the
    tiles, as in :func:`transform_inputs`), then the tiles' outputs copied into place."""
    planes, tiles = m.shape[1], np.uintp(m.shape[2])
    height, width = out.shape[1], out.shape[2]
    tile, alpha = np.uintp(matrix.shape[0]), np.uintp(matrix.shape[1])
    tw = np.uintp((width + matrix.shape[0] - 1) // matrix.shape[0])
    rows = np.empty(tile * alpha * tiles, out.dtype)
    result = np.empty(tile * tile * tiles, out.dtype)
    source, target, coefficients = m.reshape(-1), out.reshape(-1), matrix.reshape(-1)
    for f in range(np.uintp(planes)):
        for i in range(tile):
            for k in range(alpha):
                into = (i * alpha + k) * tiles
                started = False
                for j in range(alpha):
                    coefficient = coefficients[i * alpha + j]
                    if coefficient != 0:
                        at = ((j * alpha + k) * np.uintp(planes) + f) * tiles
                        if not started:
                            for t in range(tiles):
                                rows[into + t] = coefficient * source[at + t]
                            started = True
                        else:
                            for t in range(tiles):
                                rows[into + t] += coefficient * source[at + t]
        for i in range(tile):
            for k in range(tile):
                into = (i * tile + k) * tiles
                for t in range(tiles):
                    result[into + t] = bias[f]
                for j in range(alpha):
                    coefficient = coefficients[k * alpha + j]
                    if coefficient != 0:
                        at = (i * alpha + j) * tiles
                        for t in range(tiles):
                            result[into + t] += coefficient * rows[at + t]
        plane = (np.uintp(first) + f) * np.uintp(height * width)
        for row in range(np.uintp(s), np.uintp(e)):
            ty, i = row // tile - np.uintp(a), row % tile
            line = plane + row * np.uintp(width)
            for k in range(min(tile, np.uintp(width))):  # column k of every tile of the row
                at = (i * tile + k) * tiles + ty * tw
                for t in range((np.uintp(width) - k + tile - 1) // tile):
                    target[line + t * tile + k] = result[at + t]


def compile_transforms(dtype: np.dtype | type) -> None:
    """Compile :func:`transform_inputs` and :func:`transform_outputs` for ``dtype`` (or load
    them from numba's cache), with the argument types a run passes (read-only inputs): a
    session does it at construction, not in its first run."""
    def read_only(shape: tuple[int, ...]) -> np.ndarray:
        array = np.zeros(shape, dtype)
        array.flags.writeable = False
        return array

    tile = F2.tile
    transform_inputs.dispatcher(read_only((1, 4, 4)), read_only((4, 4)), np.empty((16, 1, 1), dtype),
                                0, 1, 0, 0, 1, tile)
    transform_outputs.dispatcher(read_only((16, 1, 1)), read_only((2, 4)), read_only((1,)),
                                 np.empty((1, 2, 2), dtype), 0, 0, 0, 2)
