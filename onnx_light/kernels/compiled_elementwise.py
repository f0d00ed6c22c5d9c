"""Compiled elementwise programs: float32 elementwise work in one pass over memory.

A :class:`Program` is a straight-line list of instructions over registers (rows of
:data:`BLOCK` float64 values): load an input, apply an operation, store the result. One
compiled interpreter, :func:`run_program`, runs any program over a range of the output, one
block of :data:`BLOCK` elements at a time, every instruction a loop over the block that LLVM
vectorizes; :func:`run_program_parallel` splits the output over numba's threads (``prange``)
with the caller's thread count. A single op (Erf, Gelu, Sigmoid, ...) is a program of three
instructions, a fused chain of elementwise nodes (``runtime/fusion.py``) a longer one: both
compile the same two functions, once per process and cached on disk.

The values are float32 in memory and float64 in the registers: each intermediate of a chain
keeps float64's precision, the output is rounded once. The transcendental functions are
written here as polynomials (numba's scalar ``math`` calls do not vectorize without Intel's
SVML), accurate to well under a float32 unit in the last place (docs/elementwise.md) but not
to float64's: the programs take float32 data only. NaN and infinities propagate as ONNX says;
signed zeros are kept.

Inputs broadcast in four ways (:func:`broadcast`): the whole output, one element, a trailing
block of the output's shape repeated (a bias along the last axes), or a block of the output's
dimensions each element repeated over the axes after it (a per-channel value over planes).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .compiled import compiled, max_threads, prange, read_only, use_threads, wide_vectors
from .float32_math import gelu32, gelu32_lanes, gelu_tanh32, gelu_tanh32_lanes

__all__ = ["BLOCK", "FUSION_WORTH", "MAX_INPUTS", "PROGRAM_OPS", "CompiledProgram", "Program", "broadcast",
           "emit", "exp_row", "numba_threads", "run_program", "run_program_parallel", "single_op"]

BLOCK = 1024  # elements per register row: a program's registers stay in the L2 cache
MAX_INPUTS = 4

# Operation codes. An instruction is a row (code, destination, a, b) of register indices;
# CONST's ``a`` is the constant's index. Register k < MAX_INPUTS holds input k.
CONST, STORE = 0, 2
NEG, ABS, EXP, ERF, TANH, SIGMOID, RELU, SQRT, RECIPROCAL, GELU, GELU_TANH, MISH, HARD_SWISH = \
    range(10, 23)
ADD, SUB, MUL, DIV, MAX, MIN, LEAKY = range(40, 47)
UNARY_CODES = frozenset(range(10, 23))
BINARY_CODES = frozenset(range(40, 47))

_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238  # ln 2 in 32 significant bits: n * _LN2_HI is exact
_LN2_LO = 1.9082149292705877e-10
_SQRT_HALF = 0.7071067811865476
_SQRT_2_OVER_PI = 0.7978845608028654
_ERF_LIMIT = 3.95  # erf(x) rounds to 1 in float32 from here on
_ERF_SCALE = 2.0 / (_ERF_LIMIT * _ERF_LIMIT)
# erf(a) / a for a in [0, _ERF_LIMIT] as a polynomial in u = 2 a^2 / _ERF_LIMIT^2 - 1: the
# least-squares Chebyshev fit of degree 22 at 200 Chebyshev nodes (numpy.polynomial's chebfit
# of math.erf, converted to powers by cheb2poly); maximum error 3e-13 (tests recompute it).
ERF_POLYNOMIAL = (
    0.35800076959385285, -0.17876950537121955, 0.1331765549637536, -0.10863859450488052,
    0.09049139610263691, -0.07431601512232087, 0.05885740950188848, -0.04432707551725815,
    0.0314870062970372, -0.02100963787397359, 0.013149757807730606, -0.007721498784171965,
    0.004260949165282079, -0.0022168145517320876, 0.0010860399284609884, -0.0004972231032114904,
    0.00021867601793510282, -9.787978918635905e-05, 3.857114999090909e-05, -9.901222238678072e-06,
    3.7015881698228222e-06, -3.162165296941547e-06, 1.0269731915835707e-06)


@compiled(fastmath={"contract"})
def exp_row(x: np.ndarray, out: np.ndarray, m: int, sign: float, bits: np.ndarray) -> None:
    """out[:m] = exp(sign * x[:m]): 2^n e^r with |r| <= ln 2 / 2, e^r by its Taylor series
    to r^11, 2^n built in the exponent bits (``bits``, an int64 scratch row); x is not out."""
    scale = bits.view(np.float64)
    for i in range(m):
        w = sign * x[i]
        v = w if w < 709.0 else 709.0
        v = v if v > -708.0 else -708.0
        n = math.floor(v * _LOG2E + 0.5)
        bits[i] = (np.int64(n) + 1023) << 52
        r = v - n * _LN2_HI - n * _LN2_LO
        p = 2.505210838544172e-08
        p = p * r + 2.755731922398589e-07
        p = p * r + 2.7557319223985893e-06
        p = p * r + 2.48015873015873e-05
        p = p * r + 0.0001984126984126984
        p = p * r + 0.001388888888888889
        p = p * r + 0.008333333333333333
        p = p * r + 0.041666666666666664
        p = p * r + 0.16666666666666666
        p = p * r + 0.5
        p = p * r + 1.0
        p = p * r + 1.0
        p = p if w < 709.78 else math.inf
        p = p if w > -708.3 else 0.0  # below 2^-1022: float32 has rounded to 0 long before
        out[i] = p if w == w else w
    for i in range(m):
        out[i] *= scale[i]


@compiled(fastmath={"contract"})
def _erf(v: float) -> float:
    """erf(v) for a v that is not NaN (inlined into the loops that call it)."""
    c = ERF_POLYNOMIAL
    a = abs(v)
    a = a if a < _ERF_LIMIT else _ERF_LIMIT
    u = a * a * _ERF_SCALE - 1.0
    u2 = u * u
    u4 = u2 * u2
    # Four independent Horner chains in u^4 (Estrin's split): a quarter of one chain's
    # latency, which bounds a single chain's speed.
    q0 = c[20]
    q1 = c[21]
    q2 = c[22]
    q3 = c[19]
    q0 = q0 * u4 + c[16]
    q1 = q1 * u4 + c[17]
    q2 = q2 * u4 + c[18]
    q3 = q3 * u4 + c[15]
    q0 = q0 * u4 + c[12]
    q1 = q1 * u4 + c[13]
    q2 = q2 * u4 + c[14]
    q3 = q3 * u4 + c[11]
    q0 = q0 * u4 + c[8]
    q1 = q1 * u4 + c[9]
    q2 = q2 * u4 + c[10]
    q3 = q3 * u4 + c[7]
    q0 = q0 * u4 + c[4]
    q1 = q1 * u4 + c[5]
    q2 = q2 * u4 + c[6]
    q3 = q3 * u4 + c[3]
    q0 = q0 * u4 + c[0]
    q1 = q1 * u4 + c[1]
    q2 = q2 * u4 + c[2]
    p = q0 + u * q1 + u2 * (q2 + u * q3)
    r = p * a if a < _ERF_LIMIT else 1.0
    return math.copysign(r, v)


@compiled(fastmath={"contract"})
def _erf_row(x: np.ndarray, out: np.ndarray, m: int, scale: float) -> None:
    """out[:m] = erf(scale * x[:m])."""
    for i in range(m):
        v = scale * x[i]
        out[i] = _erf(v) if v == v else v


@compiled(fastmath={"contract"})
def _gelu_lanes(x0: np.ndarray, x1: np.ndarray, x2: np.ndarray, x3: np.ndarray, b0: np.ndarray,
                b1: np.ndarray, b2: np.ndarray, b3: np.ndarray, o0: np.ndarray, o1: np.ndarray,
                o2: np.ndarray, o3: np.ndarray, tanh: bool) -> None:
    """ok[i] = GELU(xk[i] + bk[i]) for k = 0..3, four values per step (the ``_lanes``
    functions): four independent chains in each vectorized iteration."""
    if tanh:
        for i in range(o0.shape[0]):
            o0[i], o1[i], o2[i], o3[i] = gelu_tanh32_lanes(x0[i] + b0[i], x1[i] + b1[i], x2[i] + b2[i],
                                                           x3[i] + b3[i])
    else:
        for i in range(o0.shape[0]):
            o0[i], o1[i], o2[i], o3[i] = gelu32_lanes(x0[i] + b0[i], x1[i] + b1[i], x2[i] + b2[i],
                                                      x3[i] + b3[i])


@compiled(fastmath={"contract"})
def gelu_rows(x: np.ndarray, bias: np.ndarray, with_bias: bool, tanh: bool, out: np.ndarray) -> None:
    """out[r] = GELU(x[r] + bias) (or GELU(x[r])), the erf form or the ``tanh`` form, for the
    rows of the 2-D float32 ``x`` and ``out``, ``bias`` one row: one loop in float32
    (:mod:`.float32_math`, within 2 ulp of the result plus 1 ulp of the argument of the
    interpreter's float64 values; the sum rounded to float32), 512-bit vectors where the
    processor has them. Four rows at a time go through the loop together (:func:`_gelu_lanes`),
    and the last rows' four quarters, their last few values one at a time; without a bias,
    -0.0 is added, which leaves every float32 as it is."""
    wide_vectors()
    rows, length = x.shape
    if not with_bias:
        bias = np.full(length, np.float32(-0.0))
    for r in range(0, rows - 3, 4):
        _gelu_lanes(x[r], x[r + 1], x[r + 2], x[r + 3], bias, bias, bias, bias,
                    out[r], out[r + 1], out[r + 2], out[r + 3], tanh)
    q = length // 4
    b0, b1, b2, b3, bt = bias[:q], bias[q:2 * q], bias[2 * q:3 * q], bias[3 * q:4 * q], bias[4 * q:]
    for r in range(rows - rows % 4, rows):
        row, target = x[r], out[r]
        _gelu_lanes(row[:q], row[q:2 * q], row[2 * q:3 * q], row[3 * q:4 * q], b0, b1, b2, b3,
                    target[:q], target[q:2 * q], target[2 * q:3 * q], target[3 * q:4 * q], tanh)
        xt, ot = row[4 * q:], target[4 * q:]
        for i in range(length - 4 * q):
            ot[i] = gelu_tanh32(xt[i] + bt[i]) if tanh else gelu32(xt[i] + bt[i])


@compiled
def _gelu_part(row: np.ndarray, bias: np.ndarray, with_bias: bool, tanh: bool, target: np.ndarray,
               start: int, stop: int) -> None:
    """target[start:stop] = GELU(row[start:stop] (+ bias[start:stop])) by :func:`gelu_rows`
    on that part of one row."""
    n = stop - start
    part = bias[start:stop] if with_bias else bias
    gelu_rows(row[start:stop].reshape((1, n)), part, with_bias, tanh, target[start:stop].reshape((1, n)))


@compiled
def _gelu_span(x: np.ndarray, bias: np.ndarray, with_bias: bool, tanh: bool, out: np.ndarray,
               start: int, stop: int) -> None:
    """:func:`gelu_rows` over the elements ``start`` to ``stop`` of the C-order rows of ``x``
    and ``out``: the end of a row, whole rows, the start of a row."""
    length = x.shape[1]
    r = start // length
    if start > r * length:
        end = min(length, start - r * length + stop - start)
        _gelu_part(x[r], bias, with_bias, tanh, out[r], start - r * length, end)
        start += end - (start - r * length)
        r += 1
    full = (stop - start) // length
    if full > 0:
        gelu_rows(x[r:r + full], bias, with_bias, tanh, out[r:r + full])
        start += full * length
        r += full
    if start < stop:
        _gelu_part(x[r], bias, with_bias, tanh, out[r], 0, stop - start)


@compiled(parallel=True)
def gelu_rows_parallel(x: np.ndarray, bias: np.ndarray, with_bias: bool, tanh: bool, out: np.ndarray,
                       threads: int) -> None:
    """:func:`gelu_rows` split in ``threads`` ranges run by numba's threads (the caller has set
    their count): ranges of whole rows when there are at least four per thread, else near-equal
    ranges of elements (whole multiples of 64), so that one long row splits too; the same values,
    whichever thread computes them (every value is computed alone, :mod:`.float32_math`)."""
    rows, length = x.shape
    size = rows * length
    for t in prange(threads):
        if rows >= 4 * threads:
            start = t * rows // threads * length
            stop = (t + 1) * rows // threads * length
        else:
            start = t * size // threads // 64 * 64
            stop = size if t == threads - 1 else (t + 1) * size // threads // 64 * 64
        if start < stop:
            _gelu_span(x, bias, with_bias, tanh, out, start, stop)


@compiled
def _affine(x: float, scale: float, shift: float) -> float:
    """x * scale + shift, two roundings (no contraction), as the graph's Mul and Add."""
    return x * scale + shift


@compiled
def gelu_channel_rows(x: np.ndarray, scale: np.ndarray, shift: np.ndarray, out: np.ndarray) -> None:
    """out[r] = GELU(x[r] * scale[r % C] + shift[r % C]) (erf form) for the rows of the 2-D
    float32 ``x`` and ``out``, ``scale`` and ``shift`` C float32 values (a per-channel affine
    over planes): the affine in float32 as the Mul and Add nodes round it, then GELU in
    float32 (:mod:`.float32_math`: within 2 ulp of the result plus 1 ulp of the argument),
    512-bit vectors where the processor has them; four rows per step (:func:`.gelu32_lanes`),
    the last rows one value at a time, the same values."""
    wide_vectors()
    channels = scale.shape[0]
    rows = x.shape[0]
    for r in range(0, rows - 3, 4):
        x0, x1, x2, x3 = x[r], x[r + 1], x[r + 2], x[r + 3]
        o0, o1, o2, o3 = out[r], out[r + 1], out[r + 2], out[r + 3]
        c0, c1, c2, c3 = r % channels, (r + 1) % channels, (r + 2) % channels, (r + 3) % channels
        a0, a1, a2, a3 = scale[c0], scale[c1], scale[c2], scale[c3]
        b0, b1, b2, b3 = shift[c0], shift[c1], shift[c2], shift[c3]
        for i in range(o0.shape[0]):
            o0[i], o1[i], o2[i], o3[i] = gelu32_lanes(_affine(x0[i], a0, b0), _affine(x1[i], a1, b1),
                                                      _affine(x2[i], a2, b2), _affine(x3[i], a3, b3))
    for r in range(rows - rows % 4, rows):
        row, target = x[r], out[r]
        a = scale[r % channels]
        b = shift[r % channels]
        for i in range(row.shape[0]):
            target[i] = gelu32(_affine(row[i], a, b))


@compiled(fastmath={"contract"})
def _unary_row(code: int, x: np.ndarray, out: np.ndarray, m: int, work: np.ndarray,
               bits: np.ndarray) -> None:
    """out[:m] = f(x[:m]) for the unary operation ``code`` (``work``: a scratch row; an
    exponential of ``out`` into itself would not vectorize, LLVM cannot rule out overlap)."""
    if code == NEG:
        for i in range(m):
            out[i] = -x[i]
    elif code == ABS:
        for i in range(m):
            out[i] = abs(x[i])
    elif code == EXP:
        exp_row(x, out, m, 1.0, bits)
    elif code == ERF:
        _erf_row(x, out, m, 1.0)
    elif code == TANH:  # sign(x) (1 - e) / (1 + e), e = exp(-2|x|); x (1 - x^2 / 3) where tiny
        for i in range(m):
            work[i] = abs(x[i])
        exp_row(work, out, m, -2.0, bits)
        for i in range(m):
            v = x[i]
            e = out[i]
            t = math.copysign((1.0 - e) / (1.0 + e), v)
            small = v * (1.0 - v * v / 3.0)
            out[i] = small if abs(v) < 1e-4 else t
    elif code == SIGMOID:  # 1 / (1 + e) or e / (1 + e), e = exp(-|x|) never overflows
        for i in range(m):
            work[i] = abs(x[i])
        exp_row(work, out, m, -1.0, bits)
        for i in range(m):
            e = out[i]
            numerator = 1.0 if x[i] >= 0 else e
            out[i] = numerator / (1.0 + e)
    elif code == RELU:  # numpy's maximum(x, 0): NaN kept, 0 for -0
        for i in range(m):
            v = x[i]
            out[i] = v if v > 0 or v != v else 0.0
    elif code == SQRT:
        for i in range(m):
            out[i] = math.sqrt(x[i]) if x[i] >= 0 else math.nan
    elif code == RECIPROCAL:
        for i in range(m):
            out[i] = 1.0 / x[i]
    elif code == GELU:  # x (1 + erf(x / sqrt 2)) / 2
        _erf_row(x, out, m, _SQRT_HALF)
        for i in range(m):
            out[i] = 0.5 * x[i] * (1.0 + out[i])
    elif code == GELU_TANH:  # x (1 + tanh(u)) / 2 = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
        for i in range(m):
            v = x[i]
            work[i] = -2.0 * _SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)
        exp_row(work, out, m, 1.0, bits)
        for i in range(m):
            out[i] = x[i] / (1.0 + out[i])
    elif code == MISH:  # x tanh(log(1 + e)) = x (e^2 + 2e) / (e^2 + 2e + 2), e = exp(x)
        exp_row(x, out, m, 1.0, bits)
        for i in range(m):
            v = x[i]
            e = out[i]
            q = e * (e + 2.0)
            out[i] = v * (q / (q + 2.0)) if v < 20.0 else v
    elif code == HARD_SWISH:  # x max(0, min(1, x / 6 + 1/2)), NaN kept
        for i in range(m):
            v = x[i]
            h = v / 6.0 + 0.5
            h = h if h < 1.0 else 1.0
            h = h if h > 0.0 else 0.0
            out[i] = v * h if v == v else v


@compiled(fastmath={"contract"})
def _binary_row(code: int, a: np.ndarray, b: np.ndarray, out: np.ndarray, m: int) -> None:
    """out[:m] = a[:m] (op) b[:m] for the binary operation ``code`` (numpy's semantics)."""
    if code == ADD:
        for i in range(m):
            out[i] = a[i] + b[i]
    elif code == SUB:
        for i in range(m):
            out[i] = a[i] - b[i]
    elif code == MUL:
        for i in range(m):
            out[i] = a[i] * b[i]
    elif code == DIV:
        for i in range(m):
            out[i] = a[i] / b[i]
    elif code == MAX:  # np.maximum: NaN propagates from either side, b where equal (zeros)
        for i in range(m):
            x, y = a[i], b[i]
            out[i] = x if x > y or x != x else y
    elif code == MIN:
        for i in range(m):
            x, y = a[i], b[i]
            out[i] = x if x < y or x != x else y
    elif code == LEAKY:  # x if x > 0 else slope * x (PRelu, LeakyRelu)
        for i in range(m):
            x = a[i]
            out[i] = x if x > 0 else x * b[i]


@compiled
def _load_row(source: np.ndarray, length: int, repeat: int, start: int, row: np.ndarray,
              m: int) -> None:
    """row[:m] = output elements start..start+m of ``source`` broadcast: element ``i`` of the
    output reads ``source[(i // repeat) % length]``."""
    if length == 1:
        value = np.float64(source[0])
        for i in range(m):
            row[i] = value
        return
    if repeat > 1:  # runs of one value (a per-channel constant over a plane)
        i = 0
        while i < m:
            position = start + i
            count = min(m - i, repeat - position % repeat)
            value = np.float64(source[(position // repeat) % length])
            target = row[i:i + count]
            for q in range(count):
                target[q] = value
            i += count
        return
    # Indexing slices by the loop counter alone (not ``offset + i``) lets LLVM vectorize
    # the copies: it cannot prove a sum of two counters non-negative, and numba's negative
    # index wraparound then stays in the loop.
    offset = start % length
    if offset + m <= length:
        part = source[offset:offset + m]
        for i in range(m):
            row[i] = part[i]
        return
    i = 0
    while i < m:
        count = min(m - i, length - offset)
        part = source[offset:offset + count]
        target = row[i:i + count]
        for q in range(count):
            target[q] = part[q]
        i += count
        offset = 0


@compiled(fastmath={"contract"})
def run_program(code: np.ndarray, constants: np.ndarray, x0: np.ndarray, x1: np.ndarray,
                x2: np.ndarray, x3: np.ndarray, periods: np.ndarray, registers: int,
                out: np.ndarray, start: int, stop: int) -> None:
    """Run the program ``code`` over out[start:stop] (1-D float32 arrays; input ``k``, in
    register ``k``, is broadcast as ``periods[k]`` = (length, repeat) says, :func:`broadcast`;
    lengths of 0 mark unused inputs), one block at a time."""
    rows = np.empty((registers, BLOCK))
    work = np.empty(BLOCK)
    bits = np.empty(BLOCK, np.int64)
    count = code.shape[0]
    for j in range(count):
        if code[j, 0] == CONST:
            rows[code[j, 1], :] = constants[code[j, 2]]
    for first in range(start, stop, BLOCK):
        m = min(BLOCK, stop - first)
        # Each input is loaded by its own call: choosing the array by index costs more than
        # the load itself (docs/elementwise.md).
        if periods[0, 0]:
            _load_row(x0, periods[0, 0], periods[0, 1], first, rows[0], m)
        if periods[1, 0]:
            _load_row(x1, periods[1, 0], periods[1, 1], first, rows[1], m)
        if periods[2, 0]:
            _load_row(x2, periods[2, 0], periods[2, 1], first, rows[2], m)
        if periods[3, 0]:
            _load_row(x3, periods[3, 0], periods[3, 1], first, rows[3], m)
        for j in range(count):
            op = code[j, 0]
            destination = rows[code[j, 1]]
            if op == STORE:
                target = out[first:first + m]
                for i in range(m):
                    target[i] = destination[i]
            elif op >= 40:
                _binary_row(op, rows[code[j, 2]], rows[code[j, 3]], destination, m)
            elif op >= 10:
                _unary_row(op, rows[code[j, 2]], destination, m, work, bits)


@compiled(parallel=True)
def run_program_parallel(code: np.ndarray, constants: np.ndarray, x0: np.ndarray,
                         x1: np.ndarray, x2: np.ndarray, x3: np.ndarray, periods: np.ndarray,
                         registers: int, out: np.ndarray, threads: int) -> None:
    """:func:`run_program` over the whole output, split in ``threads`` ranges of whole blocks
    run by numba's threads (the caller has set their count to ``threads``)."""
    blocks = (out.size + BLOCK - 1) // BLOCK
    for t in prange(threads):
        start = t * blocks // threads * BLOCK
        stop = min((t + 1) * blocks // threads * BLOCK, out.size)
        if start < stop:
            run_program(code, constants, x0, x1, x2, x3, periods, registers, out, start, stop)


def broadcast(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, int] | None:
    """How an input of ``shape`` broadcasts to a C-order output of ``out_shape``, as (length,
    repeat): output element ``i`` reads the input's element ``(i // repeat) % length``. Its
    nonunit dimensions must be one contiguous run of the output's dimensions (the whole output,
    a bias along the last axes, one element, a per-channel value over planes: shape (C, 1)
    over (N, C, T)); None otherwise."""
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    if not dims:
        return 1, 1
    if len(dims) > len(out_shape):
        return None
    tail = list(out_shape[len(out_shape) - len(dims):])
    core = len(dims)
    while core and dims[core - 1] == 1:
        core -= 1
    if dims[:core] != tail[:core]:
        return None
    return math.prod(dims), math.prod(tail[core:])


class _Regions:
    """Whether this process has run a numba parallel region, and may run one."""

    started = False
    allowed = True


def _after_fork_in_child() -> None:
    # GNU OpenMP does not survive fork: a child of a process that ran a region would hang in
    # its first one, so it computes serially (the same values).
    if _Regions.started:
        _Regions.allowed = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def numba_threads(threads: int) -> bool:
    """Give the calling thread's next numba regions ``threads`` threads (numba keeps the
    count per thread; at most the number it started with); False when this process may not
    run regions (a fork of one that did), and the caller computes serially."""
    if not _Regions.allowed:
        return False
    use_threads(min(threads, max_threads()))
    _Regions.started = True
    return True


_DUMMY = read_only(np.zeros(1, np.float32))
_FLOAT32 = np.dtype(np.float32)


@dataclass(frozen=True)
class CompiledProgram:
    """A finished program: its instruction rows, constants and register count."""

    code: np.ndarray
    constants: np.ndarray
    registers: int
    inputs: int

    def run(self, inputs: Sequence[np.ndarray], threads: int = 1,
            minimum_elements: int = 1, out: np.ndarray | None = None) -> np.ndarray | None:
        """The output for float32 ``inputs`` broadcast together: over ``threads`` numba
        threads from ``minimum_elements`` output elements on, else serial; None when an
        input's dtype or broadcast pattern is not one the programs take (the caller computes
        it another way). ``out``: a C-contiguous float32 array of the output's shape to
        write into (the memory plan's buffer), else a new one."""
        shapes = [x.shape for x in inputs]
        out_shape = np.broadcast_shapes(*shapes)
        arrays, periods = [], []
        for x in inputs:
            p = broadcast(x.shape, out_shape)
            if p is None or x.dtype != _FLOAT32:
                return None
            arrays.append(read_only(np.ascontiguousarray(x).reshape(-1)))  # one compiled form
            periods.append(p)
        arrays += [_DUMMY] * (MAX_INPUTS - len(arrays))
        periods += [(0, 1)] * (MAX_INPUTS - len(periods))
        if out is None:
            out = np.empty(out_shape, np.float32)
        flat = out.reshape(-1)
        if flat.size:
            parallel = threads > 1 and flat.size >= minimum_elements
            if self._gelu_rows(arrays, periods, out_shape, out, threads if parallel else 1) \
                    or (not parallel and self._gelu_channels(arrays, periods, out)):
                return out
            period_array = np.array(periods, np.int64)
            if parallel and numba_threads(threads):
                run_program_parallel.dispatcher(self.code, self.constants, *arrays, period_array,
                                                self.registers, flat, threads)
            else:
                run_program.dispatcher(self.code, self.constants, *arrays, period_array,
                                       self.registers, flat, 0, flat.size)
        return out

    def _gelu_rows(self, arrays: list[np.ndarray], periods: list[tuple[int, int]],
                   out_shape: tuple[int, ...], out: np.ndarray, threads: int) -> bool:
        """GELU(x) or GELU(x + bias), either form, bias along the last axis, by
        :func:`gelu_rows` (row by row in float32 instead of the interpreter's float64 blocks),
        its rows split over ``threads`` numba threads when more than one; False for any other
        program or broadcast."""
        form = self._gelu_form
        if form is None:
            return False
        code, with_bias = form
        length = out_shape[-1] if out_shape else 1
        whole, row = (out.size, 1), (length, 1)
        x = 0 if periods[0] == whole else 1 if with_bias and periods[1] == whole else None
        if x is None or (with_bias and periods[1 - x] != row):  # the sum is exact: either order
            return False
        rows = out.size // length
        operands = (arrays[x].reshape(rows, length), arrays[1 - x] if with_bias else _DUMMY,
                    with_bias, code == GELU_TANH, out.reshape(rows, length))
        if threads > 1 and numba_threads(threads):
            gelu_rows_parallel.dispatcher(*operands, threads)
        else:
            gelu_rows.dispatcher(*operands)
        return True

    def _gelu_channels(self, arrays: list[np.ndarray], periods: list[tuple[int, int]],
                       out: np.ndarray) -> bool:
        """GELU(x * scale + shift), scale and shift one value per run of the output (a
        per-channel affine over planes: shape (C, 1) over (N, C, T)), by
        :func:`gelu_channel_rows`; False for any other program or broadcast."""
        if not self._gelu_affine:
            return False
        x = 0 if periods[0] == (out.size, 1) else 1  # the product is exact in either order
        scale, shift = 1 - x, 2
        plane = periods[scale][1]
        if (periods[x] != (out.size, 1) or plane < 2 or periods[shift] != periods[scale]
                or out.size % plane):
            return False
        rows = out.size // plane
        gelu_channel_rows.dispatcher(arrays[x].reshape(rows, plane), arrays[scale], arrays[shift],
                                     out.reshape(rows, plane))
        return True

    @functools.cached_property
    def _gelu_affine(self) -> bool:
        """Whether the program is GELU(input 0 * input 1 + input 2), erf form (constants the
        folded GELU left unread do not count)."""
        rows = [tuple(int(v) for v in row) for row in self.code if row[0] != CONST]
        return (self.inputs == 3 and len(rows) == 4 and rows[0][0] == MUL and sorted(rows[0][2:]) == [0, 1]
                and rows[1][0] == ADD and sorted(rows[1][2:]) == sorted((rows[0][1], 2))
                and rows[2] == (GELU, rows[2][1], rows[1][1], 0) and rows[3] == (STORE, rows[2][1], 0, 0))

    @property
    def gelu_form(self) -> tuple[int, bool] | None:
        """(GELU or GELU_TANH, whether input 1 is added to input 0 first) for the programs
        GELU(input 0) and GELU(input 0 + input 1), else None: what a product's GELU
        epilogue takes over (``runtime/matmul_fusion.py``)."""
        return self._gelu_form

    @functools.cached_property
    def _gelu_form(self) -> tuple[int, bool] | None:
        """(GELU or GELU_TANH, whether input 1 is added to input 0 first) for the programs
        GELU(input 0) and GELU(input 0 + input 1), else None (constants the folded GELU left
        unread do not count)."""
        rows = [tuple(int(v) for v in row) for row in self.code if row[0] != CONST]
        if self.inputs == 1 and len(rows) == 2 and rows[0][0] in (GELU, GELU_TANH) \
                and rows == [(rows[0][0], rows[0][1], 0, 0), (STORE, rows[0][1], 0, 0)]:
            return rows[0][0], False
        if self.inputs == 2 and len(rows) == 3 and rows[0][0] == ADD and sorted(rows[0][2:]) == [0, 1] \
                and rows[1][0] in (GELU, GELU_TANH) and rows[1] == (rows[1][0], rows[1][1], rows[0][1], 0) \
                and rows[2] == (STORE, rows[1][1], 0, 0):
            return rows[1][0], True
        return None

    def compile(self, parallel: bool) -> None:
        """Compile (or load from numba's disk cache) what :meth:`run` calls: serially and,
        with ``parallel``, over numba's threads too (a small output stays serial)."""
        for threads in (1, 2) if parallel else (1,):
            self.run([np.zeros(1, np.float32)] * self.inputs, threads)
            if self._gelu_form is not None:
                self.run([np.zeros((2, 1), np.float32)] * self.inputs, threads)
        if self._gelu_affine:
            self.run([np.zeros((1, 2, 2), np.float32), np.ones((2, 1), np.float32),
                      np.zeros((2, 1), np.float32)])


class Program:
    """Builds a program: each method appends instructions and returns the result's register."""

    def __init__(self) -> None:
        self._rows: list[tuple[int, int, int, int]] = []
        self._constants: list[float] = []
        self._registers = MAX_INPUTS
        self._inputs = 0
        self._constant_registers: dict[str, int] = {}

    def copy(self) -> Program:
        """An independent copy (a fused chain tries each node on a copy of its program)."""
        other = Program()
        other._rows, other._constants = list(self._rows), list(self._constants)
        other._registers, other._inputs = self._registers, self._inputs
        other._constant_registers = dict(self._constant_registers)
        return other

    def _new(self) -> int:
        self._registers += 1
        return self._registers - 1

    def load(self, index: int) -> int:
        """The register holding input ``index`` (loaded once per block)."""
        if not 0 <= index < MAX_INPUTS:
            raise ValueError(f"a program takes at most {MAX_INPUTS} inputs, got input {index}")
        self._inputs = max(self._inputs, index + 1)
        return index

    def constant(self, value: float) -> int:
        """A register holding ``value`` everywhere (one per distinct value)."""
        key = repr(float(value))
        if key not in self._constant_registers:
            self._constant_registers[key] = register = self._new()
            self._rows.append((CONST, register, len(self._constants), 0))
            self._constants.append(float(value))
        return self._constant_registers[key]

    def unary(self, code: int, a: int) -> int:
        """The register of ``code`` applied to register ``a``."""
        if code not in UNARY_CODES:
            raise ValueError(f"{code} is not a unary operation code")
        register = self._new()
        self._rows.append((code, register, a, 0))
        return register

    def binary(self, code: int, a: int, b: int) -> int:
        """The register of ``a (code) b``."""
        if code not in BINARY_CODES:
            raise ValueError(f"{code} is not a binary operation code")
        register = self._new()
        self._rows.append((code, register, a, b))
        return register

    def finish(self, result: int) -> CompiledProgram:
        """The program storing register ``result`` as the output (GELU written out in
        elementary steps becomes the one GELU or GELU_TANH instruction, :func:`_fold_gelu`)."""
        rows = [*_fold_gelu(self._rows, self._constants, result), (STORE, result, 0, 0)]
        return CompiledProgram(np.array(rows, np.int64), np.array(self._constants or [0.0]),
                               self._registers, self._inputs)


Row = tuple[int, int, int, int]


def _fold_gelu(rows: list[Row], constants: list[float], result: int) -> list[Row]:
    """``rows`` with each GELU exporters write as one GELU or GELU_TANH instruction on x,
    when no other instruction reads its intermediate values: ``(1 + erf(x / sqrt 2))`` (the
    division by sqrt 2 or the product with its inverse) or ``(1 + tanh(sqrt(2 / pi) (x +
    0.044715 x^3)))``, times x and 0.5 in either order (``(x f) 0.5`` or ``(x 0.5) f``), the
    constants in float32 or float64. The constants rounded to float32 move the function's
    argument by at most 4e-8 of itself; the fused value stays within a float32 unit of the
    chain's."""
    define = {row[1]: i for i, row in enumerate(rows)}
    uses: dict[int, int] = {result: 1}
    for code, _, a, b in rows:
        if code in UNARY_CODES:
            uses[a] = uses.get(a, 0) + 1
        elif code in BINARY_CODES:
            uses[a] = uses.get(a, 0) + 1
            uses[b] = uses.get(b, 0) + 1

    def constant(register: int, value: float) -> bool:
        row = rows[define[register]] if register in define else None
        return (row is not None and row[0] == CONST
                and math.isclose(constants[row[2]], value, rel_tol=1e-7, abs_tol=0.0))

    def private(register: int, code: int) -> tuple[int, int, int] | None:
        """The row defining ``register`` (read once) if it is a ``code`` row: (index, a, b)."""
        index = define.get(register)
        if index is None or uses.get(register) != 1 or rows[index][0] != code:
            return None
        return index, rows[index][2], rows[index][3]

    def scaled(register: int, code: int, value: float) -> tuple[int, int] | None:
        """``register`` = the other operand ``code`` the constant ``value``: (index, other)."""
        found = private(register, code)
        if found is None:
            return None
        index, a, b = found
        if constant(b, value):
            return index, a
        if code == MUL and constant(a, value):
            return index, b
        return None

    def reader(register: int, code: int) -> tuple[int, int] | None:
        """The only row reading ``register``, if it is a ``code`` row: (index, other operand)."""
        if uses.get(register) != 1:
            return None
        for i, (c, _, a, b) in enumerate(rows):
            if c == code and register in (a, b):
                return i, (b if a == register else a)
        return None

    def erf_core(i: int) -> tuple[int, list[int]] | None:
        """For the ERF row ``i``: x and the rows of x / sqrt 2."""
        divided = scaled(rows[i][2], DIV, math.sqrt(2.0)) or scaled(rows[i][2], MUL, _SQRT_HALF)
        return None if divided is None else (divided[1], [divided[0]])

    def tanh_core(i: int) -> tuple[int, list[int]] | None:
        """For the TANH row ``i``: x and the rows of sqrt(2 / pi) (x + 0.044715 x x x)."""
        inner = scaled(rows[i][2], MUL, _SQRT_2_OVER_PI)
        total = private(inner[1], ADD) if inner is not None else None
        if total is None:
            return None
        for x, q in ((total[1], total[2]), (total[2], total[1])):
            cubic = scaled(q, MUL, 0.044715)
            cube = private(cubic[1], MUL) if cubic is not None else None
            if cube is None or x not in cube[1:]:
                continue
            square = private(cube[2] if cube[1] == x else cube[1], MUL)
            if square is not None and square[1] == square[2] == x:
                return x, [inner[0], total[0], cubic[0], cube[0], square[0]]
        return None

    drop: set[int] = set()
    replace: dict[int, Row] = {}
    for i, (code, core, _, _) in enumerate(rows):
        found = erf_core(i) if code == ERF else tanh_core(i) if code == TANH else None
        if found is None or uses.get(core) != 1:
            continue
        x, gone = found
        plus = reader(core, ADD)
        if plus is None or not constant(plus[1], 1.0):
            continue
        f = rows[plus[0]][1]
        times = reader(f, MUL)
        if times is None:
            continue
        g, y = rows[times[0]][1], times[1]
        half = scaled(y, MUL, 0.5)
        if y == x:  # (x f) 0.5
            outer = reader(g, MUL)
            if outer is None or not constant(outer[1], 0.5):
                continue
            last, gone = outer[0], [*gone, i, plus[0], times[0]]
        elif half is not None and half[1] == x:  # (x 0.5) f
            last, gone = times[0], [*gone, i, plus[0], half[0]]
        else:
            continue
        drop.update(gone)
        replace[last] = (GELU if code == ERF else GELU_TANH, rows[last][1], x, 0)
    return [replace.get(i, row) for i, row in enumerate(rows) if i not in drop]


_PLAIN_UNARY = {"Neg": NEG, "Abs": ABS, "Exp": EXP, "Erf": ERF, "Tanh": TANH, "Sigmoid": SIGMOID,
                "Relu": RELU, "Sqrt": SQRT, "Reciprocal": RECIPROCAL, "Mish": MISH,
                "HardSwish": HARD_SWISH}
_PLAIN_BINARY = {"Add": ADD, "Sub": SUB, "Mul": MUL, "Div": DIV, "Max": MAX, "Min": MIN,
                 "PRelu": LEAKY}
#: The elementwise ops a program can compute (one node each in a fused chain).
PROGRAM_OPS = frozenset({*_PLAIN_UNARY, *_PLAIN_BINARY, "Gelu", "Swish", "HardSigmoid",
                         "LeakyRelu", "Pow"})
#: The ops that make fusing a chain pay: numpy computes them in many passes or slowly (the
#: series of Erf, Pow's general loop); a chain of only cheap ops runs faster as numpy calls
#: (docs/elementwise.md, "Compiled kernels").
FUSION_WORTH = frozenset({"Erf", "Gelu", "Mish", "Pow"})
# Pow with these constant exponents (the decomposed LayerNorm's square, GELU-tanh's cube).
_POWERS = (1.0, 2.0, 3.0, 0.5)


def emit(program: Program, op_type: str, operands: Sequence[int],
         attributes: dict[str, float | int | str],
         constants: Sequence[np.ndarray | None] = ()) -> int | None:
    """Append one ONNX elementwise node to ``program`` (its operands' registers; the values of
    those that are constants, where known); the result's register, or None if a program
    cannot compute the node."""
    if op_type in _PLAIN_UNARY and len(operands) == 1:
        return program.unary(_PLAIN_UNARY[op_type], operands[0])
    if op_type in _PLAIN_BINARY and len(operands) == 2:
        return program.binary(_PLAIN_BINARY[op_type], operands[0], operands[1])
    if len(operands) != 1 and op_type != "Pow":
        return None
    if op_type == "Gelu":
        code = GELU_TANH if attributes.get("approximate", "none") == "tanh" else GELU
        return program.unary(code, operands[0])
    x = operands[0]
    if op_type == "Swish":  # x sigmoid(alpha x)
        scaled = program.binary(MUL, x, program.constant(float(attributes.get("alpha", 1.0))))
        return program.binary(MUL, x, program.unary(SIGMOID, scaled))
    if op_type == "LeakyRelu":
        return program.binary(LEAKY, x, program.constant(float(attributes.get("alpha", 0.01))))
    if op_type == "HardSigmoid":  # max(0, min(1, alpha x + beta))
        alpha = program.constant(float(attributes.get("alpha", 0.2)))
        beta = program.constant(float(attributes.get("beta", 0.5)))
        value = program.binary(ADD, program.binary(MUL, x, alpha), beta)
        value = program.binary(MIN, value, program.constant(1.0))
        return program.binary(MAX, value, program.constant(0.0))
    if op_type == "Pow" and len(operands) == 2 and len(constants) == 2 \
            and constants[1] is not None and constants[1].size == 1:
        exponent = float(constants[1].reshape(-1)[0])
        if exponent not in _POWERS:
            return None
        if exponent == 0.5:
            return program.unary(SQRT, x)
        result = x
        for _ in range(int(exponent) - 1):
            result = program.binary(MUL, result, x)
        return result
    return None


def single_op(op_type: str, inputs: int, attributes: dict[str, float | int | str]
              ) -> CompiledProgram | None:
    """The program of one node of ``op_type`` with ``inputs`` inputs, or None."""
    program = Program()
    result = emit(program, op_type, [program.load(i) for i in range(inputs)], attributes)
    return None if result is None else program.finish(result)
