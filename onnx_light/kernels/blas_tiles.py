"""Matrix products cut into tiles run in one compiled parallel region, each tile one
single-threaded call of numpy's own BLAS, with the bias added while the tile is in cache.

Why this and not a compiled micro-kernel or the pool: on this machine OpenBLAS computes a
64x256x256 float product at about 120 GFLOP/s on one core, a compiled loop at about 19; and
waking the intra-op pool's sleeping worker costs 80-120 us, an OpenMP region of numba 2-5 us.
So a product of a few million multiply-adds splits across threads only through a compiled
region, and each thread's share is still best left to BLAS (docs/gemm.md, "Tiled BLAS").

The BLAS function is the ``cblas_?gemm`` numpy itself links to, found through
threadpoolctl's record of the loaded library and its symbol names (OpenBLAS builds of numpy
prefix and suffix them, e.g. ``scipy_cblas_sgemm64_`` with 64-bit integers). It is checked on
a small product against numpy before first use; when none is found or the check fails,
:func:`gemm_function` returns None and the Gemm kernels keep their other plans. The caller
holds BLAS to one thread around a region (``BLAS.limited(1)``), so each call runs on the
OpenMP thread that makes it.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import threading
from typing import Any

import numpy as np

from .compiled import compiled, load_numba, max_threads, use_threads

__all__ = ["blas_operand", "gemm_function", "max_threads", "region", "tile_counts", "tiled_product",
           "use_threads"]

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_lock = threading.Lock()
prange = range  # numba's own once :func:`region` runs


def _symbol_names(prefix: str) -> list[tuple[str, type[ctypes._SimpleCData]]]:
    """Candidate names of ``cblas_<prefix>gemm`` with the integer type each implies."""
    wide, narrow = ctypes.c_int64, ctypes.c_int32
    base = f"cblas_{prefix}gemm"
    return [(f"scipy_{base}64_", wide), (f"{base}64_", wide), (f"scipy_{base}", narrow),
            (base, narrow)]


@functools.cache
def gemm_function(dtype: np.dtype) -> Any | None:
    """numpy's BLAS ``cblas_sgemm`` (float32) or ``cblas_dgemm`` (float64) as a ctypes
    function numba can call, or None when there is none or it fails the check."""
    dtype = np.dtype(dtype)
    prefix = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}.get(dtype)
    if prefix is None:
        return None
    with _lock:
        from threadpoolctl import ThreadpoolController

        scalar = ctypes.c_float if prefix == "s" else ctypes.c_double
        libraries = ThreadpoolController().select(user_api="blas").lib_controllers
        # numpy's own first: numba loads scipy's BLAS too when scipy is installed, whose
        # threads the runtime's BLAS limit does not govern once another library comes first
        for library in sorted(libraries, key=lambda library: not _numpys(library.filepath)):
            try:
                handle = ctypes.CDLL(library.filepath)
            except OSError:
                continue
            for name, integer in _symbol_names(prefix):
                if not hasattr(handle, name):
                    continue
                prototype = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                             integer, integer, integer, scalar, ctypes.c_void_p,
                                             integer, ctypes.c_void_p, integer, scalar,
                                             ctypes.c_void_p, integer)
                function = prototype((name, handle))
                if _agrees_with_numpy(function, dtype):
                    return function
    return None


def _numpys(path: str) -> bool:
    """Whether the library at ``path`` is numpy's own (in its package or its wheel's
    ``numpy.libs``)."""
    home = os.path.dirname(os.path.realpath(np.__file__))
    return os.path.realpath(path).startswith((home + os.sep, home + ".libs" + os.sep))


def _agrees_with_numpy(function: Any, dtype: np.dtype) -> bool:
    """Whether ``function`` computes a small transposed product as numpy does."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 3)).astype(dtype)  # used as A.T: (3, 5)
    b = rng.standard_normal((5, 4)).astype(dtype)
    out = np.full((3, 4), np.nan, dtype)
    function(_ROW_MAJOR, _TRANS, _NO_TRANS, 3, 4, 5, 2.0, a.ctypes.data, 3, b.ctypes.data, 4,
             0.0, out.ctypes.data, 4)
    return bool(np.allclose(out, 2.0 * (a.T @ b), rtol=1e-5, atol=1e-6))


def blas_operand(x: np.ndarray, batch: int) -> tuple[np.ndarray, int, int, bool]:
    """``x`` (``(batch or 1, rows, columns)`` after broadcasting) as BLAS sees it: the array
    to keep alive, the stride between batch items (elements, 0 when broadcast), the leading
    dimension and whether it is stored transposed. Copies only when no BLAS layout fits."""
    if x.ndim == 2:
        x = x[np.newaxis]
    item = x.itemsize
    rows, columns = x.shape[1:]
    if not x.flags.aligned or any(s % item for s in x.strides):
        x = np.ascontiguousarray(x)
    row_stride, column_stride = x.strides[1] // item, x.strides[2] // item
    if columns == 1 or (column_stride == 1 and (rows == 1 or row_stride >= columns)):
        transposed, leading = False, max(row_stride if rows > 1 else columns, columns, 1)
    elif rows == 1 or (row_stride == 1 and column_stride >= rows):
        transposed, leading = True, max(column_stride if columns > 1 else rows, rows, 1)
    else:
        x = np.ascontiguousarray(x)
        transposed, leading = False, max(columns, 1)
    batch_stride = x.strides[0] // item if x.shape[0] > 1 else 0
    if x.shape[0] not in (1, batch):
        raise ValueError(f"operand batch {x.shape[0]} does not broadcast to {batch}")
    return x, batch_stride, leading, transposed


def tile_counts(batch: int, m: int, n: int, tiles: int, minimum: int) -> tuple[int, int]:
    """How many row and column tiles each of ``batch`` products is cut into so that there
    are at least ``tiles`` in all where the sides allow (no side below ``minimum``); the
    larger side is cut first, as a split of the long side keeps each tile a wide product."""
    rows = columns = 1
    while batch * rows * columns < tiles:
        can_rows = m // (rows + 1) >= minimum
        can_columns = n // (columns + 1) >= minimum
        if can_rows and (not can_columns or math.ceil(m / rows) >= math.ceil(n / columns)):
            rows += 1
        elif can_columns:
            columns += 1
        else:
            break
    return rows, columns


@compiled(parallel=True)
def tiled_product(gemm, trans_a, trans_b, a, a_batch, lda, b, b_batch, ldb, k, alpha,
                  out, bias, tile_rows, tile_columns):
    """``out[t] = alpha * A[t] @ B[t] + bias`` for every batch item ``t`` of ``out``
    (batch, M, N, contiguous), in tiles of ``tile_rows`` x ``tile_columns`` spread over
    numba's threads (:func:`use_threads`); A and B are addresses with batch strides and leading dimensions in
    elements, ``trans_*`` 112 where stored transposed; ``bias`` is (1 or M, 1 or N), or
    (0, 0) for none."""
    batch, m, n = out.shape
    item = out.itemsize
    rows = (m + tile_rows - 1) // tile_rows
    columns = (n + tile_columns - 1) // tile_columns
    with_bias = bias.shape[0] > 0
    bias_rows = bias.shape[0] > 1
    bias_columns = bias.shape[1] > 1
    for tile in prange(batch * rows * columns):
        t = tile // (rows * columns)
        i0 = (tile // columns) % rows * tile_rows
        j0 = tile % columns * tile_columns
        i1 = min(i0 + tile_rows, m)
        j1 = min(j0 + tile_columns, n)
        a_offset = t * a_batch + (i0 if trans_a == 112 else i0 * lda)
        b_offset = t * b_batch + (j0 * ldb if trans_b == 112 else j0)
        target = out.ctypes.data + ((t * m + i0) * n + j0) * item
        gemm(101, trans_a, trans_b, i1 - i0, j1 - j0, k, alpha, a + a_offset * item, lda,
             b + b_offset * item, ldb, 0.0, target, n)
        if with_bias:
            for i in range(i0, i1):
                bi = i if bias_rows else 0
                for j in range(j0, j1):
                    out[t, i, j] += bias[bi, j if bias_columns else 0]


def region() -> Any:
    """numba's dispatcher of :func:`tiled_product`, its ``prange`` made numba's own first
    (the module holds ``range`` until then, so that importing it does not import numba)."""
    numba = load_numba()
    globals()["prange"] = numba.prange
    numba.get_num_threads()  # starts numba's threads, which the fast calls below expect
    return tiled_product.dispatcher


