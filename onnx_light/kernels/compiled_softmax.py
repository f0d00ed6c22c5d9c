"""Compiled softmax over the last axis of float32 rows, with an optional scale and additive mask.

:func:`softmax_rows` computes, for each row ``x`` of a (rows, length) float32 array,
``softmax(scale * x + mask_row)`` along the row: the scaled and masked row, its maximum, the
exponentials of the shifted row (:func:`exp_shifted`, a vectorized polynomial exp accurate to
float32, not float64: relative error under 2e-9), their sum (vectorized, reassociated: one
order for every row) and the quotients, in float64 and rounded once into the float32 output: within one
float32 unit in the last place of the float64 softmax rounded to float32. ``mask`` holds the
distinct mask rows and ``mask_rows`` the mask row of each row (a broadcast mask, (batch, 1, q,
k) against (batch, heads, q, k) scores, is not copied per head); an empty ``mask_rows`` means
no mask.

NaN and infinities propagate as numpy's softmax has them: a row holding NaN or +inf is all
NaN, and a row of -inf only (every key masked with -inf) is all NaN too, since its maximum
minus itself is NaN; with a finite maximum, -inf entries come out 0. No fast-math
flag but floating-point contraction (fused multiply-adds) and, for the sum, reassociation
is used.

:func:`softmax_rows_parallel` splits the rows over numba's threads (``prange``).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .compiled import compiled, prange
from .compiled_elementwise import numba_threads

__all__ = ["EXP_POLYNOMIAL", "MASK_NONE", "SoftmaxRows", "exp_shifted", "mask_layout", "softmax_rows",
           "softmax_rows_parallel"]

_NO_MASK = np.zeros((1, 1), np.float32)
MASK_NONE = np.zeros(0, np.int64)

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_ROUND = 6755399441055744.0  # 1.5 * 2^52: adding and subtracting it rounds to an integer
# Differences are clamped here: e^-104 is below half of float32's smallest denormal, so it and
# its quotient by the row's sum (at least 1) round to 0, as e^d does below it; a lower clamp let
# masked entries (e^-708) make float64 denormal quotients, 20-100 times slower to compute.
_FLOOR = -104.0
# e^r on |r| <= ln 2 / 2: the polynomial of degree 6 fitted by least squares in relative terms
# at 400 Chebyshev nodes (numpy's polyfit weighted by e^-r); relative error 1.9e-9, 0.016 of a
# float32 unit in the last place (tests recompute it).
EXP_POLYNOMIAL = (1.000000000592492, 1.0000000361472858, 0.49999991487949647, 0.1666642073469246,
                  0.04166835870788223, 0.008374779754900911, 0.0013829408729353712)


@compiled(fastmath={"contract"})
def exp_shifted(y: np.ndarray, top: float, out: np.ndarray, m: int, bits: np.ndarray) -> None:
    """out[:m] = exp(y[:m] - top) to float32's accuracy, for differences <= 0 or NaN (``top``
    is the row's maximum): 2^n e^r with |r| <= ln 2 / 2, e^r by :data:`EXP_POLYNOMIAL`, 2^n
    built in the exponent bits (``bits``, an int64 scratch row). Differences below
    :data:`_FLOOR` (-inf included) give e^-104, 0 once rounded to float32; NaN gives NaN."""
    c = EXP_POLYNOMIAL
    scale = bits.view(np.float64)
    for i in range(m):
        d = y[i] - top
        u = d if d > _FLOOR else _FLOOR  # NaN -> _FLOOR: n stays an integer in range
        v = _FLOOR if d < _FLOOR else d  # NaN stays NaN and reaches the output through r
        n = (u * _LOG2E + _ROUND) - _ROUND
        bits[i] = (np.int64(n) + 1023) << 52
        r = v - n * _LN2  # |n| <= 1022: the rounding of ln 2 moves r by under 3e-14
        p = c[6]
        p = p * r + c[5]
        p = p * r + c[4]
        p = p * r + c[3]
        p = p * r + c[2]
        p = p * r + c[1]
        p = p * r + c[0]
        out[i] = p * scale[i]


@compiled(fastmath={"contract"})
def softmax_rows(x: np.ndarray, out: np.ndarray, scale: float, mask: np.ndarray,
                 mask_rows: np.ndarray, start: int, stop: int) -> None:
    """out[r] = softmax(scale * x[r] + mask[mask_rows[r]]) for rows start..stop of the 2-D
    float32 arrays ``x`` and ``out`` (no mask when ``mask_rows`` is empty)."""
    length = x.shape[1]
    masked = mask_rows.shape[0] > 0
    y = np.empty(length)
    e = np.empty(length)
    bits = np.empty(length, np.int64)
    for r in range(start, stop):
        row = x[r]
        if masked:
            mask_row = mask[mask_rows[r]]
            for i in range(length):
                y[i] = scale * np.float64(row[i]) + np.float64(mask_row[i])
        else:
            for i in range(length):
                y[i] = scale * np.float64(row[i])
        top = _row_maximum(y, length)
        exp_shifted(y, top, e, length, bits)  # -inf - -inf and inf - inf are NaN, as in numpy
        inverse = 1.0 / _row_total(e, length)
        target = out[r]
        for i in range(length):
            target[i] = e[i] * inverse


@compiled(fastmath={"contract"})
def _row_maximum(y: np.ndarray, length: int) -> float:
    """The largest of y[:length], NaN skipped: eight running maxima (independent chains that
    LLVM can put in vector lanes without reassociating anything)."""
    octets = length // 8 * 8
    t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = -math.inf
    for i in range(0, octets, 8):
        t0 = y[i] if y[i] > t0 else t0
        t1 = y[i + 1] if y[i + 1] > t1 else t1
        t2 = y[i + 2] if y[i + 2] > t2 else t2
        t3 = y[i + 3] if y[i + 3] > t3 else t3
        t4 = y[i + 4] if y[i + 4] > t4 else t4
        t5 = y[i + 5] if y[i + 5] > t5 else t5
        t6 = y[i + 6] if y[i + 6] > t6 else t6
        t7 = y[i + 7] if y[i + 7] > t7 else t7
    for i in range(octets, length):
        t0 = y[i] if y[i] > t0 else t0
    return max(max(max(t0, t1), max(t2, t3)), max(max(t4, t5), max(t6, t7)))


@compiled(fastmath={"contract", "reassoc"})
def _row_total(e: np.ndarray, length: int) -> float:
    """The sum of e[:length] in the order LLVM's vectorized loop adds it (reassociation only:
    the same order for every row; NaN and infinities propagate)."""
    total = 0.0
    for i in range(length):
        total += e[i]
    return total


@compiled(parallel=True)
def softmax_rows_parallel(x: np.ndarray, out: np.ndarray, scale: float, mask: np.ndarray,
                          mask_rows: np.ndarray, threads: int) -> None:
    """:func:`softmax_rows` over all rows, split in ``threads`` contiguous ranges run by
    numba's threads (the caller has set their count)."""
    rows = x.shape[0]
    for t in prange(threads):
        softmax_rows(x, out, scale, mask, mask_rows, t * rows // threads, (t + 1) * rows // threads)


@functools.lru_cache(maxsize=256)
def mask_layout(mask_shape: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray | None:
    """For scores of ``shape`` (..., length) and a mask of ``mask_shape`` that broadcasts to
    it (without enlarging it) and whose last axis is ``length``: the mask row of each score
    row (int64, shared by the calls with these shapes: not to be written); None when the mask
    does not broadcast that way."""
    if len(mask_shape) > len(shape) or not shape or not mask_shape or mask_shape[-1] != shape[-1]:
        return None
    padded = (1,) * (len(shape) - len(mask_shape)) + mask_shape
    if any(m not in (1, s) for m, s in zip(padded, shape, strict=True)):
        return None
    rows = np.arange(math.prod(padded[:-1]), dtype=np.int64).reshape(padded[:-1])
    return np.ascontiguousarray(np.broadcast_to(rows, shape[:-1])).reshape(-1)


class SoftmaxRows:
    """Runs the compiled softmax on float32 arrays, serial or over numba's threads."""

    def __init__(self, threads: int, minimum_elements: int) -> None:
        self.threads = threads
        self.minimum_elements = minimum_elements

    def __call__(self, x: np.ndarray, out: np.ndarray, scale: float = 1.0,
                 mask: np.ndarray | None = None, mask_rows: np.ndarray = MASK_NONE) -> None:
        """``out = softmax(scale * x + mask)`` along the last axis; x and out C-contiguous
        float32 of one shape, ``mask`` C-contiguous float32 rows of the last axis's length
        picked by ``mask_rows`` (:func:`mask_layout`)."""
        length = x.shape[-1] if x.ndim else 1
        if x.size == 0 or length == 0:
            return
        x2 = x.reshape(-1, length)
        out2 = out.reshape(-1, length)
        mask2 = _NO_MASK if mask is None else mask.reshape(-1, length)
        if (self.threads > 1 and x.size >= self.minimum_elements and x2.shape[0] > 1
                and numba_threads(self.threads)):
            softmax_rows_parallel.dispatcher(x2, out2, scale, mask2, mask_rows,
                                             min(self.threads, x2.shape[0]))
        else:
            softmax_rows.dispatcher(x2, out2, scale, mask2, mask_rows, 0, x2.shape[0])

    def compile(self) -> None:
        """Compile (or load from numba's disk cache) what a call runs: without a mask, and
        with a writable or a read-only one (a constant's; numba types them apart)."""
        x = np.zeros((2, 1), np.float32)
        frozen = np.zeros((1, 1), np.float32)
        frozen.flags.writeable = False
        cases = ((_NO_MASK, MASK_NONE), (_NO_MASK, np.zeros(2, np.int64)), (frozen, np.zeros(2, np.int64)))
        parallel = self.threads > 1 and numba_threads(self.threads)
        for mask, rows in cases:
            softmax_rows.dispatcher(x, x.copy(), 1.0, mask, rows, 0, 2)
            if parallel:
                softmax_rows_parallel.dispatcher(x, x.copy(), 1.0, mask, rows, 2)
