"""Special functions numpy lacks, vectorised: :func:`erf` and :func:`erfc` in float64.

Both are built from two approximations derived here from the mathematics, in three ranges
of ``a = |x|``:

* ``a < 0.5``: the Maclaurin series ``erf(x) = x * sum_n c_n x**(2n)`` with
  ``c_n = 2/sqrt(pi) * (-1)**n / (n! (2n + 1))``, truncated after
  :data:`SERIES_TERMS` terms (the first omitted term is below ``6e-18`` relative).
* ``a >= 0.5``: ``erfc(a) = exp(-a*a) * g(a) / a`` where ``g(a) = a * exp(a*a) * erfc(a)`` is
  smooth, lies in ``[0.32, 1/sqrt(pi)]`` and tends to ``1/sqrt(pi)`` as ``a`` grows. With
  ``t = (a - K) / (a + K)`` the half line ``[0.5, inf)`` maps onto ``[(0.5 - K) / (0.5 + K), 1)``,
  where ``g`` is analytic up to ``t = 1`` (the map used by Schonfelder's Chebyshev
  expansions of the error function). ``g`` is replaced by its Chebyshev interpolant of
  degree :data:`CHEBYSHEV_DEGREE` in ``t`` (relative error below ``2e-17``), evaluated
  with Clenshaw's recurrence. ``exp(-a*a)`` is evaluated as ``exp(-h*h) * exp(-(a-h)(a+h))``
  with ``h = a`` truncated to 4 fractional bits, so that ``h*h`` is exact and the rounding of
  ``a*a`` does not cost ``a*a`` ulps of relative accuracy.
* ``erf(x) = sign(x) (1 - erfc(|x|))`` for ``a >= 0.5``; ``erf`` is exactly ``+-1`` in float64
  from ``a >= 6`` on, ``erfc`` underflows to 0 from ``a >= 27.3`` on.

The coefficients below are the output of :func:`.erf_derivation.derive_coefficients`, which
recomputes them
with :mod:`decimal` at 60 significant digits (power series of ``erf`` for ``a <= 4``,
Laplace's continued fraction of ``erfc`` beyond); a test checks that both agree.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CHEBYSHEV_DEGREE", "SERIES_TERMS", "erf", "erfc"]

SERIES_TERMS = 12
CHEBYSHEV_DEGREE = 22
# The map t = (a - K) / (a + K) and the interval [T_LOW, 1) of t it covers for a >= SPLIT.
SPLIT = 0.5
K = 4.0
T_LOW = (SPLIT - K) / (SPLIT + K)
ERF_IS_ONE = 6.0  # erfc(6) ~ 2.2e-17 < 2**-54: 1 - erfc rounds to 1 from here on
ERFC_IS_ZERO = 28.0  # exp(-28*28) underflows below the smallest subnormal

# c_n of erf(x) / x = sum_n c_n x**(2n), n = 0 .. SERIES_TERMS - 1.
SERIES = (
    1.1283791670955126,
    -0.37612638903183754,
    0.11283791670955126,
    -0.026866170645131252,
    0.005223977625442188,
    -0.0008548327023450853,
    0.00012055332981789664,
    -1.492565035840625e-05,
    1.6462114365889248e-06,
    -1.6365844691234924e-07,
    1.4807192815879218e-08,
    -1.2290555301717928e-09,
)

# Chebyshev coefficients of g on s = (2t - (T_LOW + 1)) / (1 - T_LOW) in [-1, 1] (the first one
# already halved): g = sum_j CHEBYSHEV[j] T_j(s).
CHEBYSHEV = (
    0.5038841025492574,
    0.09989075381102669,
    -0.05805857540482043,
    0.025397660775200937,
    -0.009088803452689467,
    0.00273374169766208,
    -0.0006941321852750504,
    0.0001469448206109839,
    -2.5022670171966118e-05,
    3.1249516733906402e-06,
    -1.9776502131888328e-07,
    -1.9761357809331007e-08,
    6.818021674652349e-09,
    -5.89722935282319e-10,
    -6.655580657471198e-11,
    2.0992346598906277e-11,
    -6.892745950347036e-13,
    -4.4649742854376604e-13,
    5.577766932351544e-14,
    7.591433510569228e-15,
    -2.0370093976175565e-15,
    -9.828069455066129e-17,
    6.66537728866014e-17,
)


def _series(x: np.ndarray) -> np.ndarray:
    """erf(x) for |x| < SPLIT (a new array)."""
    t = x * x
    acc = np.full_like(x, SERIES[-1])
    for c in SERIES[-2::-1]:
        acc *= t
        acc += c
    acc *= x
    return acc


def _erfc_positive(a: np.ndarray) -> np.ndarray:
    """erfc(a) for finite SPLIT <= a < ERFC_IS_ZERO (a new array)."""
    t = (a - K) / (a + K)
    s2 = t * (4.0 / (1.0 - T_LOW))
    s2 -= 2.0 * (T_LOW + 1.0) / (1.0 - T_LOW)  # 2s
    b1 = np.full_like(a, CHEBYSHEV[-1])
    b2 = np.zeros_like(a)
    tmp = np.empty_like(a)
    for c in CHEBYSHEV[-2:0:-1]:
        np.multiply(s2, b1, out=tmp)
        tmp -= b2
        tmp += c
        b1, b2, tmp = tmp, b1, b2
    # g = c0 + s*b1 - b2
    np.multiply(s2, b1, out=tmp)
    tmp *= 0.5
    tmp -= b2
    tmp += CHEBYSHEV[0]
    h = np.floor(a * 16.0)
    h *= 1.0 / 16.0
    d = (a - h) * (a + h)
    np.negative(d, out=d)
    np.exp(d, out=d)
    np.multiply(h, h, out=h)
    np.negative(h, out=h)
    np.exp(h, out=h)
    h *= d
    h *= tmp
    h /= a
    return h


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The error function of a float64 array, elementwise (``out`` may be ``x``)."""
    x = np.asarray(x, dtype=np.float64)
    if out is None:
        out = np.empty_like(x)
    a = np.abs(x)
    small = a < SPLIT
    large = a >= ERF_IS_ONE
    middle = ~(small | large)  # NaN falls here and stays NaN
    # Gather every range before writing: out may be x.
    x_small, x_middle, x_large = x[small], x[middle], x[large]
    out[small] = _series(x_small)
    r = _erfc_positive(np.abs(x_middle))
    np.subtract(1.0, r, out=r)
    out[middle] = np.copysign(r, x_middle)
    out[large] = np.sign(x_large)
    return out


def erfc(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The complementary error function ``1 - erf(x)`` of a float64 array, elementwise."""
    x = np.asarray(x, dtype=np.float64)
    if out is None:
        out = np.empty_like(x)
    a = np.abs(x)
    small = a < SPLIT
    large = a >= ERFC_IS_ZERO
    middle = ~(small | large)
    x_small, x_middle, x_large = x[small], x[middle], x[large]
    r = _series(x_small)
    np.subtract(1.0, r, out=r)
    out[small] = r
    r = _erfc_positive(np.abs(x_middle))
    negative = x_middle < 0
    np.subtract(2.0, r, out=r, where=negative)
    out[middle] = r
    out[large] = np.where(x_large < 0, 2.0, 0.0)
    return out
