"""Compiled softmax over the last axis of float32 rows, with an optional scale and additive mask.

:func:`softmax_rows` computes, for each row ``x`` of a (rows, length) float32 array,
``softmax(y)`` with ``y = scale * x + mask_row`` rounded once to float32 (a fused
multiply-add: the graph's Mul and Add round twice): the row's maximum, the exponentials of
the exact differences from it (:func:`exp_difference`, float32 arithmetic, within 1.4 float32
units of the exact value), their sum in float64 (vectorized, reassociated: one order for every
row) and the quotients in float64, each rounded once into the float32 output: **within 2
float32 units in the last place of the float64 softmax of y** (tests/test_compiled_softmax.py),
denormal outputs included. With no mask and a scale of 1 (the Softmax node), or a power of
two, y is x's row exactly. ``mask`` holds the distinct mask rows and ``mask_rows`` the mask
row of each row (a broadcast mask, (batch, 1, q, k) against (batch, heads, q, k) scores, is
not copied per head); an empty ``mask_rows`` means no mask.

The loops compute in float32 lanes, 512-bit vectors where the processor has them
(:func:`.compiled.wide_vectors`): 16 lanes where a float64 computation has 4 in LLVM's
default 256-bit vectors.

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

from .compiled import compiled, prange, wide_vectors
from .compiled_elementwise import numba_threads
from .float32_math import LN2_HI32, LN2_LO32, LOG2E32, exp32_reduced, float_bits

__all__ = ["MASK_NONE", "NO_MASK", "SoftmaxRows", "exp_difference", "mask_layout", "softmax_packed_rows",
           "softmax_rows", "softmax_rows_parallel"]

#: The mask argument of the compiled rows when there is none.
NO_MASK = np.zeros((1, 1), np.float32)
MASK_NONE = np.zeros(0, np.int64)

_ZERO = np.float32(0.0)
_ROUND = np.float32(12582912.0)  # 1.5 * 2^23: adding and subtracting it rounds to an integer
# Differences below this give 0: e^-104 is below half of float32's smallest denormal, and so
# is its quotient by the row's sum (at least 1).
_FLOOR = np.float32(-104.0)
# Exponentials are computed times 2^64 (and so is their sum): e^d 2^64 stays a normal float32
# down to d = -104, so no denormal is ever an operand (this processor computes those 20-100
# times slower); only outputs that are themselves denormal are rounded into that range.
_BIAS = 127 + 64


@compiled(fastmath={"contract"})
def exp_difference(a: np.float32, b: np.float32) -> np.float32:
    """2^64 exp(a - b) for float32 ``a`` and ``b``, a - b <= 0 or NaN: the difference split
    exactly into its float32 rounding and that rounding's error (TwoSum: no error of the
    rounded difference, which grows with it, reaches the exponential), ``2^n e^r`` with ``r``
    reduced to |r| <= ln 2 / 2 (Cody and Waite's two-part ln 2: the product with the high
    part is exact and so is its subtraction, by Sterbenz's lemma; the low part's and the
    error's additions round once each, 2^-26 relative of e^r at most), ``e^r`` by
    :func:`.float32_math.exp32_reduced` (0.9 units), ``2^(n + 64)`` built in the exponent
    bits. Within 1.4 float32 units in the last place (2^-24 relative) of the exact value; 0
    for differences below -104 (-inf too), NaN for NaN."""
    d = a - b
    ap = d + b
    bp = d - ap
    err = (a - ap) - (b + bp)
    u = d if d > _FLOOR else _FLOOR  # NaN -> _FLOOR: n stays an integer in range
    n = (u * LOG2E32 + _ROUND) - _ROUND
    r = ((d - n * LN2_HI32) - n * LN2_LO32) + err
    e = exp32_reduced(r) * float_bits((np.int32(n) + _BIAS) << 23)
    return _ZERO if d < _FLOOR else e  # NaN stays NaN


@compiled(fastmath={"contract"})
def softmax_rows(x: np.ndarray, out: np.ndarray, scale: float, mask: np.ndarray,
                 mask_rows: np.ndarray, start: int, stop: int) -> None:
    """out[r] = softmax(scale * x[r] + mask[mask_rows[r]]) for rows start..stop of the 2-D
    float32 arrays ``x`` and ``out`` (no mask when ``mask_rows`` is empty; ``x`` may be
    ``out``)."""
    _softmax(x, out, scale, mask, mask_rows, start, stop, np.empty((0, 0, 1), np.float32))


@compiled(fastmath={"contract"})
def softmax_packed_rows(x: np.ndarray, scale: float, mask: np.ndarray, mask_rows: np.ndarray,
                        start: int, stop: int, packed: np.ndarray) -> None:
    """:func:`softmax_rows` of rows start..stop of ``x`` (whose rows it overwrites), row
    ``start + i`` written into ``packed[i // MR, :, i % MR]`` (``packed`` (blocks, length,
    MR), MR its last axis): the layout in which the packed products read their left operand
    (:func:`.packed_gemm.panels_over_rows`), without a copy of the probabilities. The same
    values as :func:`softmax_rows`."""
    _softmax(x, x, scale, mask, mask_rows, start, stop, packed)


@compiled(fastmath={"contract"})
def _softmax(x: np.ndarray, out: np.ndarray, scale: float, mask: np.ndarray, mask_rows: np.ndarray,
             start: int, stop: int, packed: np.ndarray) -> None:
    """:func:`softmax_rows`, the quotients of row r written into ``packed`` as
    :func:`softmax_packed_rows` says when it has rows (``out`` then holds the
    exponentials), else into ``out[r]``."""
    wide_vectors()
    length = x.shape[1]
    masked = mask_rows.shape[0] > 0
    packing = packed.shape[0] > 0
    height = packed.shape[2]
    s = np.float32(scale)
    y = np.empty(length, np.float32)
    keys = y.view(np.int32)
    for r in range(start, stop):
        row = x[r]
        if masked:
            mask_row = mask[mask_rows[r]]
            for i in range(length):
                y[i] = s * row[i] + mask_row[i]  # one rounding (a fused multiply-add)
        else:
            for i in range(length):
                y[i] = s * row[i]
        top = _row_maximum(keys, length)
        target = out[r]
        for i in range(length):
            target[i] = exp_difference(y[i], top)  # -inf - -inf, inf - inf: NaN, as in numpy
        inverse = 1.0 / _row_total(target, length)
        if packing:
            block, lane = (r - start) // height, (r - start) % height
            for i in range(length):
                packed[block, i, lane] = np.float64(target[i]) * inverse  # rounded once
        else:
            for i in range(length):
                target[i] = np.float64(target[i]) * inverse  # rounded once


@compiled
def _row_maximum(keys: np.ndarray, length: int) -> np.float32:
    """The largest of the float32 values whose bits are keys[:length] (int32): each key's
    magnitude bits flipped when negative orders the keys as the floats, so that the maximum
    is an integer one, which LLVM vectorizes without reassociating floats. A NaN is either
    the maximum or skipped: both give a NaN row in :func:`softmax_rows`."""
    wide_vectors()
    top = np.int32(-2147483648)
    for i in range(length):
        k = keys[i]
        k ^= (k >> np.int32(31)) & np.int32(0x7FFFFFFF)
        top = k if k > top else top
    return float_bits(top ^ ((top >> np.int32(31)) & np.int32(0x7FFFFFFF)))


@compiled(fastmath={"contract", "reassoc"})
def _row_total(e: np.ndarray, length: int) -> float:
    """The sum of the float32 e[:length] in float64, in the order LLVM's vectorized loop adds
    it (reassociation only: the same order for every row; NaN and infinities propagate)."""
    wide_vectors()
    total = 0.0
    for i in range(length):
        total += np.float64(e[i])
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
        mask2 = NO_MASK if mask is None else mask.reshape(-1, length)
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
        cases = ((NO_MASK, MASK_NONE), (NO_MASK, np.zeros(2, np.int64)), (frozen, np.zeros(2, np.int64)))
        parallel = self.threads > 1 and numba_threads(self.threads)
        for mask, rows in cases:
            softmax_rows.dispatcher(x, x.copy(), 1.0, mask, rows, 0, 2)
            if parallel:
                softmax_rows_parallel.dispatcher(x, x.copy(), 1.0, mask, rows, 2)
