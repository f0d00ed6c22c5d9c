"""Derivation of :mod:`.math_functions`' erf coefficients in decimal arithmetic (tests only).

Kept apart from the run-time module so that importing the kernels does not import
:mod:`decimal`; ``tests/test_elementwise.py`` checks that the derivation reproduces the
shipped coefficients.
"""

from __future__ import annotations

import decimal
from decimal import Decimal

from .math_functions import CHEBYSHEV_DEGREE, SERIES_TERMS, SPLIT, K

__all__ = ["derive_coefficients"]

_PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899")


def _erf_power_series(x: Decimal, sqrt_pi: Decimal) -> Decimal:
    """erf(x) = 2/sqrt(pi) exp(-x^2) sum_n (2x^2)^n x / (1*3*...*(2n+1)): positive terms only."""
    x2 = 2 * x * x
    term = x
    total = Decimal(0)
    n = 0
    while True:
        total += term
        n += 1
        term = term * x2 / (2 * n + 1)
        if term < total * Decimal(10) ** -(decimal.getcontext().prec + 2):
            break
    return 2 / sqrt_pi * (-(x * x)).exp() * total


def _g_continued_fraction(x: Decimal, sqrt_pi: Decimal, depth: int) -> Decimal:
    """x exp(x^2) erfc(x) from erfc(x) = exp(-x^2)/sqrt(pi) / (x + (1/2)/(x + (2/2)/(x + ...)))."""
    tail = x
    for k in range(depth, 0, -1):
        tail = x + Decimal(k) / 2 / tail
    return x / (sqrt_pi * tail)


def _g(x: Decimal, sqrt_pi: Decimal) -> Decimal:
    if x <= 4:
        return x * (x * x).exp() * (1 - _erf_power_series(x, sqrt_pi))
    value = _g_continued_fraction(x, sqrt_pi, 400)
    check = _g_continued_fraction(x, sqrt_pi, 800)
    if abs(value - check) > Decimal(10) ** -30:
        raise ArithmeticError(f"continued fraction not converged at x={x}")
    return value


def _cos(theta: Decimal) -> Decimal:
    """cos(theta) for 0 <= theta <= pi by its Maclaurin series."""
    term = Decimal(1)
    total = Decimal(1)
    n = 0
    eps = Decimal(10) ** -(decimal.getcontext().prec + 2)
    while abs(term) > eps:
        n += 2
        term = -term * theta * theta / (n * (n - 1))
        total += term
    return total


def derive_coefficients(digits: int = 60) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Recompute (SERIES, CHEBYSHEV) in decimal arithmetic, each rounded once to float64."""
    with decimal.localcontext() as ctx:
        ctx.prec = digits
        sqrt_pi = _PI.sqrt()
        series = []
        factorial = Decimal(1)
        for n in range(SERIES_TERMS):
            if n:
                factorial *= n
            series.append((-1) ** n * 2 / (sqrt_pi * factorial * (2 * n + 1)))
        n = CHEBYSHEV_DEGREE
        t_low = (Decimal(SPLIT) - Decimal(K)) / (Decimal(SPLIT) + Decimal(K))
        nodes = [_cos(_PI * (2 * k + 1) / (2 * (n + 1))) for k in range(n + 1)]
        values = []
        for s in nodes:
            t = (t_low + 1) / 2 + (1 - t_low) / 2 * s
            x = Decimal(K) * (1 + t) / (1 - t)
            values.append(_g(x, sqrt_pi))
        # c_j = 2/(n+1) sum_k g(s_k) T_j(s_k), T_j by the three-term recurrence.
        sums = [Decimal(0)] * (n + 1)
        for s, value in zip(nodes, values, strict=True):
            t_prev, t_cur = Decimal(1), s
            sums[0] += value
            for j in range(1, n + 1):
                sums[j] += value * t_cur
                t_prev, t_cur = t_cur, 2 * s * t_cur - t_prev
        chebyshev = [total * 2 / (n + 1) for total in sums]
        chebyshev[0] /= 2
        return tuple(float(c) for c in series), tuple(float(c) for c in chebyshev)
