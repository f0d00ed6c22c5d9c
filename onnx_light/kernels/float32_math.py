"""GELU computed in float32: erf and exp as float32 polynomials, branch-free so that LLVM
vectorizes a loop over them (8 float32 lanes in a 256-bit vector, where float64 has 4).

:func:`gelu32` and :func:`gelu_tanh32` stay within ``2 ulp(y) + 1 ulp(t)`` of the float64
GELU of their float32 argument ``t`` (``y`` the float64 result rounded to float32): two units
in the last place of the result plus the change one unit of the argument makes, the form of
error onnxruntime's float32 Gelu has too (docs/elementwise.md measures both). For x < 0,
``1 + erf`` cancels, so the error there is absolute, not relative.

The coefficients were fitted here in float64 (numpy's weighted least squares on 3000
Chebyshev nodes, ``tests/test_float32_math.py`` refits them) and rounded to float32:

* ``|a| < ERF_SPLIT``: ``erf(a) = a + a r(a^2)``, ``r`` of degree 8 fitting ``erf(a)/a - 1``
  (the last step one fused multiply-add on a value below 0.4, so its rounding is small);
* ``ERF_SPLIT <= |a| < ERF_LIMIT``: ``erf(a) = 1 - q((a - mid) / half)``, ``q`` of degree 12
  fitting ``erfc`` (Chebyshev fit, converted to powers);
* ``|a| >= ERF_LIMIT``: erf rounds to +-1 in float32.
* ``exp(w) = 2^n e^r``, ``|r| <= ln 2 / 2``, ``e^r`` of degree 6 (relative error 0.9 ulp).

Both are written as steps that :func:`gelu32_lanes` and :func:`gelu_tanh32_lanes` also run on
four values at once, one step on all four before the next, with the same values bit for bit:
a loop over one value is one long dependency chain per vector, which AVX2 processors do not
overlap enough (docs/elementwise.md, "AVX2").
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import numpy as np

from .compiled import CompiledIntrinsic, compiled

__all__ = ["ERF_LARGE", "ERF_LIMIT", "ERF_SMALL", "ERF_SPLIT", "EXP_POLYNOMIAL", "LN2_HI32", "LN2_LO32",
           "LOG2E32", "erf32", "exp32", "exp32_reduced", "float_bits", "gelu32", "gelu32_lanes",
           "gelu_tanh32", "gelu_tanh32_lanes"]

_f = np.float32
ERF_SPLIT = 1.25
ERF_LIMIT = 3.925
_MID = (ERF_LIMIT + ERF_SPLIT) / 2
_HALF = (ERF_LIMIT - ERF_SPLIT) / 2
ERF_SMALL = (
    0.12837916612625122, -0.37612637877464294, 0.1128377765417099, -0.02686542086303234,
    0.00522184744477272, -0.0008512578788213432, 0.00011687862570397556, -1.2618943401321303e-05,
    8.002995741662744e-07)
ERF_LARGE = (
    0.0002529248595237732, -0.0018664305098354816, 0.006460539996623993, -0.013800404965877533,
    0.0200098417699337, -0.02023306116461754, 0.013893229886889458, -0.005324662197381258,
    -0.000978717114776373, 0.0029431015718728304, -0.0013691129861399531, -0.0002684456412680447,
    0.000281246320810169)
EXP_POLYNOMIAL = (
    1.0, 1.0, 0.49999991059303284, 0.1666642129421234, 0.0416683591902256, 0.008374771103262901,
    0.0013829420786350965)

_S = tuple(_f(c) for c in ERF_SMALL)
_L = tuple(_f(c) for c in ERF_LARGE)
_E = tuple(_f(c) for c in EXP_POLYNOMIAL)
_SPLIT32, _LIMIT32 = _f(ERF_SPLIT), _f(ERF_LIMIT)
_MID32, _INV_HALF32 = _f(_MID), _f(1.0 / _HALF)
_ONE, _HALF32, _ZERO = _f(1.0), _f(0.5), _f(0.0)
_SQRT_HALF32 = _f(0.7071067811865476)
LOG2E32 = _f(1.4426950408889634)
LN2_HI32 = _f(0.693145751953125)  # 16 significant bits: n * LN2_HI32 is exact for |n| < 256
LN2_LO32 = _f(0.6931471805599453 - 0.693145751953125)
_EXP_LOW, _EXP_HIGH = _f(-87.0), _f(88.0)
_INF32 = _f(np.inf)
_TANH_K1 = _f(-2.0 * 0.7978845608028654)  # -2 sqrt(2/pi)
_TANH_K3 = _f(-2.0 * 0.7978845608028654 * 0.044715)


@functools.cache
def _build_float_bits(numba: ModuleType) -> Any:
    """The intrinsic reinterpreting an integer's low 32 bits as a float32 (built when numba
    loads)."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def float_bits(typingctx: Any, word: Any) -> Any:
        if not isinstance(word, types.Integer):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            low = builder.trunc(args[0], ir.IntType(32)) if word.bitwidth > 32 else args[0]
            return builder.bitcast(low, ir.FloatType())
        return types.float32(word), codegen

    return float_bits


float_bits = CompiledIntrinsic(_build_float_bits, "float_bits")


@compiled(fastmath={"contract"})
def _erf_small(a: np.float32) -> np.float32:
    """erf(a) = a + a r(a^2) for 0 <= a < ERF_SPLIT."""
    z = a * a
    p = _S[8]
    p = p * z + _S[7]
    p = p * z + _S[6]
    p = p * z + _S[5]
    p = p * z + _S[4]
    p = p * z + _S[3]
    p = p * z + _S[2]
    p = p * z + _S[1]
    p = p * z + _S[0]
    return a * p + a


@compiled(fastmath={"contract"})
def _erf_large(a: np.float32) -> np.float32:
    """erf(a) = 1 - q((a - mid) / half) for ERF_SPLIT <= a < ERF_LIMIT."""
    t = (a - _MID32) * _INV_HALF32
    q = _L[12]
    q = q * t + _L[11]
    q = q * t + _L[10]
    q = q * t + _L[9]
    q = q * t + _L[8]
    q = q * t + _L[7]
    q = q * t + _L[6]
    q = q * t + _L[5]
    q = q * t + _L[4]
    q = q * t + _L[3]
    q = q * t + _L[2]
    q = q * t + _L[1]
    q = q * t + _L[0]
    return _ONE - q


@compiled
def _erf_select(v: np.float32, small: np.float32, large: np.float32) -> np.float32:
    """erf(v) from the two branches' values at |v|."""
    a = abs(v)
    r = small if a < _SPLIT32 else large
    r = r if a < _LIMIT32 else _ONE
    return r if v >= _ZERO else -r


@compiled(fastmath={"contract"})
def erf32(v: np.float32) -> np.float32:
    """erf(v) in float32 (a NaN v gives a number: callers keep NaN themselves)."""
    a = abs(v)
    return _erf_select(v, _erf_small(a), _erf_large(a))


@compiled(fastmath={"contract"})
def exp32_reduced(r: np.float32) -> np.float32:
    """e^r in float32 for |r| <= ln 2 / 2 (:data:`EXP_POLYNOMIAL`, relative error 0.9 ulp)."""
    p = _E[6]
    p = p * r + _E[5]
    p = p * r + _E[4]
    p = p * r + _E[3]
    p = p * r + _E[2]
    p = p * r + _E[1]
    return p * r + _E[0]


@compiled(fastmath={"contract"})
def _exp_reduce(w: np.float32) -> tuple[np.float32, np.float32]:
    """(r, n) with exp(w) = 2^n e^r, |r| <= ln 2 / 2, w clamped to [-87, 88] first."""
    v = w if w < _EXP_HIGH else _EXP_HIGH
    v = v if v > _EXP_LOW else _EXP_LOW
    n = np.floor(v * LOG2E32 + _HALF32)
    return v - n * LN2_HI32 - n * LN2_LO32, n


@compiled
def _exp_scale(w: np.float32, p: np.float32, n: np.float32) -> np.float32:
    """exp(w) from e^r (``p``) and n of :func:`_exp_reduce`: inf above 88, NaN for NaN."""
    e = p * float_bits((np.int32(n) + 127) << 23)
    e = e if w <= _EXP_HIGH else _INF32
    return e if w == w else w


@compiled(fastmath={"contract"})
def exp32(w: np.float32) -> np.float32:
    """exp(w) in float32: 0 far below -87 (2^-126 at most), inf above 88, NaN for NaN."""
    r, n = _exp_reduce(w)
    return _exp_scale(w, exp32_reduced(r), n)


@compiled
def _gelu_erf(t: np.float32, e: np.float32) -> np.float32:
    """t (1 + e) / 2 for e = erf(t / sqrt 2), NaN and signed zeros kept."""
    g = _HALF32 * t * (_ONE + e)
    return g if t == t else t


@compiled(fastmath={"contract"})
def _tanh_exponent(t: np.float32) -> np.float32:
    """-2 sqrt(2/pi) (t + 0.044715 t^3), the exponent of the tanh form."""
    return t * (_TANH_K1 + _TANH_K3 * (t * t))


@compiled
def _gelu_tanh(t: np.float32, e: np.float32) -> np.float32:
    """t / (1 + e) for e = exp(tanh exponent)."""
    return t / (_ONE + e)


@compiled(fastmath={"contract"})
def gelu32(t: np.float32) -> np.float32:
    """t (1 + erf(t / sqrt 2)) / 2 in float32, NaN and signed zeros kept."""
    return _gelu_erf(t, erf32(t * _SQRT_HALF32))


@compiled(fastmath={"contract"})
def gelu_tanh32(t: np.float32) -> np.float32:
    """t (1 + tanh(sqrt(2/pi) (t + 0.044715 t^3))) / 2 = t / (1 + exp(-2u)) in float32."""
    return _gelu_tanh(t, exp32(_tanh_exponent(t)))


# The same steps on four independent values, one step on all four before the next: each
# value is a chain of 30 to 40 dependent operations, and LLVM vectorizes a loop over one
# value without interleaving iterations (a large loop body), so one chain at a time left
# AVX2's pipelines idle (docs/elementwise.md, "AVX2"). The values are those of gelu32 and
# gelu_tanh32, bit for bit.

@compiled(fastmath={"contract"}, inline="always")
def gelu32_lanes(t0: np.float32, t1: np.float32, t2: np.float32,
                 t3: np.float32) -> tuple[np.float32, np.float32, np.float32, np.float32]:
    """:func:`gelu32` of four values."""
    v0, v1, v2, v3 = t0 * _SQRT_HALF32, t1 * _SQRT_HALF32, t2 * _SQRT_HALF32, t3 * _SQRT_HALF32
    a0, a1, a2, a3 = abs(v0), abs(v1), abs(v2), abs(v3)
    s0, s1, s2, s3 = _erf_small(a0), _erf_small(a1), _erf_small(a2), _erf_small(a3)
    l0, l1, l2, l3 = _erf_large(a0), _erf_large(a1), _erf_large(a2), _erf_large(a3)
    e0, e1 = _erf_select(v0, s0, l0), _erf_select(v1, s1, l1)
    e2, e3 = _erf_select(v2, s2, l2), _erf_select(v3, s3, l3)
    return _gelu_erf(t0, e0), _gelu_erf(t1, e1), _gelu_erf(t2, e2), _gelu_erf(t3, e3)


@compiled(fastmath={"contract"}, inline="always")
def gelu_tanh32_lanes(t0: np.float32, t1: np.float32, t2: np.float32,
                      t3: np.float32) -> tuple[np.float32, np.float32, np.float32, np.float32]:
    """:func:`gelu_tanh32` of four values."""
    w0, w1, w2, w3 = _tanh_exponent(t0), _tanh_exponent(t1), _tanh_exponent(t2), _tanh_exponent(t3)
    (r0, n0), (r1, n1) = _exp_reduce(w0), _exp_reduce(w1)
    (r2, n2), (r3, n3) = _exp_reduce(w2), _exp_reduce(w3)
    p0, p1, p2, p3 = exp32_reduced(r0), exp32_reduced(r1), exp32_reduced(r2), exp32_reduced(r3)
    e0, e1 = _exp_scale(w0, p0, n0), _exp_scale(w1, p1, n1)
    e2, e3 = _exp_scale(w2, p2, n2), _exp_scale(w3, p3, n3)
    return _gelu_tanh(t0, e0), _gelu_tanh(t1, e1), _gelu_tanh(t2, e2), _gelu_tanh(t3, e3)
