"""The compute functions of the elementwise ops: ``compute(*blocks, out=block, **attributes)``.

Each writes its result into the preallocated output block ``out``; the op rows of
:data:`onnx_light.kernels.elementwise.OPS` (and of ``activations.py`` and ``bitwise.py``)
name them, and the elementwise machinery calls them on whole arrays or on blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from . import math_functions

CONSTANT_ROW = 1 << 14  # elements of the constant rows that max / min compare with
SCALAR_BELOW = 256  # smaller inputs compare with a scalar (the rows' setup is a few us)


@functools.lru_cache(maxsize=64)
def _constant_row(dtype: np.dtype, text: str, value: Any) -> np.ndarray:
    """A read-only row of ``value`` (keyed by its repr, which tells -0.0 and NaN apart)."""
    row = np.full(CONSTANT_ROW, value, dtype)
    row.flags.writeable = False
    return row


def _against_constant(ufunc: np.ufunc, x: np.ndarray, value: Any, out: np.ndarray) -> None:
    """``ufunc(x, value, out=out)`` for a one-element ``value`` of x's type (np.maximum,
    np.minimum).

    numpy's maximum and minimum against a broadcast scalar take a strided loop much slower
    than their contiguous one (docs/elementwise.md), so the data is viewed as rows of
    :data:`CONSTANT_ROW` elements and compared with one contiguous row holding the value: the
    same operation on the same values. Below :data:`SCALAR_BELOW` elements the rows' setup
    costs more than the pass, and the value is given as a scalar of x's type.
    """
    if x.size < SCALAR_BELOW and not isinstance(value, np.ndarray):
        ufunc(x, x.dtype.type(value), out=out)
        return
    if isinstance(value, np.ndarray):
        if value.size != 1:
            ufunc(x, value, out=out)
            return
        value = value.reshape(-1)[0].item()
    row = _constant_row(x.dtype, repr(value), value)
    if x.flags.c_contiguous and out.flags.c_contiguous and x.shape == out.shape:
        flat_x, flat_out = x.reshape(-1), out.reshape(-1)
        n = flat_x.size
        whole = n - n % CONSTANT_ROW
        if whole:
            ufunc(flat_x[:whole].reshape(-1, CONSTANT_ROW), row,
                  out=flat_out[:whole].reshape(-1, CONSTANT_ROW))
        if whole < n:
            ufunc(flat_x[whole:], row[:n - whole], out=flat_out[whole:])
    elif x.ndim and x.shape[-1] <= CONSTANT_ROW:
        ufunc(x, row[:x.shape[-1]], out=out)
    else:
        ufunc(x, row[0], out=out)


_ZEROS: dict[np.dtype, np.ndarray] = {}  # a read-only 0-d zero per dtype, for small inputs


def _zero(dtype: np.dtype) -> np.ndarray:
    zero = np.zeros((), dtype)
    zero.flags.writeable = False
    return _ZEROS.setdefault(dtype, zero)


def _relu(x: np.ndarray, *, out: np.ndarray) -> None:
    if x.size < SCALAR_BELOW:  # the comparison with a 0-d zero, the fastest call for few elements
        zero = _ZEROS.get(x.dtype)
        np.maximum(x, _zero(x.dtype) if zero is None else zero, out=out)
    else:
        _against_constant(np.maximum, x, 0, out)


def relu_in_place(dtype: np.dtype) -> Callable[[np.ndarray], None]:
    """``_relu(block, out=block)`` for blocks of ``dtype``, the zero made once: the commonest
    fused epilogue, called once per step on a small tensor."""
    zero, maximum = _zero(np.dtype(dtype)), np.maximum

    def relu(block: np.ndarray) -> None:
        if block.size < SCALAR_BELOW:
            maximum(block, zero, out=block)
        else:
            _against_constant(maximum, block, 0, block)

    return relu


def _is_inf(x: np.ndarray, *, out: np.ndarray, detect_negative: int, detect_positive: int) -> None:
    np.isinf(x, out=out)
    if not detect_negative:
        np.logical_and(out, np.greater(x, 0), out=out)
    if not detect_positive:
        np.logical_and(out, np.less(x, 0), out=out)


def _erf(x: np.ndarray, *, out: np.ndarray) -> None:
    math_functions.erf(x, out=out)


def _leaky_relu(x: np.ndarray, *, out: np.ndarray, alpha: float) -> None:
    # x if x > 0 else alpha * x is max(x, alpha * x) for alpha <= 1 and min(...) above: one
    # unmasked pass (numpy's masked copy is not vectorised), the same values, NaN kept, and
    # safe in place (alpha * x is a new array).
    scaled = np.multiply(x, alpha)
    if alpha <= 1:
        np.maximum(x, scaled, out=out)
    elif alpha > 1:
        np.minimum(x, scaled, out=out)
    else:  # NaN
        np.copyto(scaled, x, where=np.greater(x, 0))
        np.copyto(out, scaled)


def _prelu(x: np.ndarray, slope: np.ndarray, *, out: np.ndarray) -> None:
    np.multiply(x, slope, out=out)
    if slope.size and bool(np.all(slope <= 1)):  # as for LeakyRelu, per element
        np.maximum(x, out, out=out)
    elif slope.size and bool(np.all(slope >= 1)):
        np.minimum(x, out, out=out)
    else:  # slopes on both sides of 1, or NaN
        np.copyto(out, x, where=np.greater(x, 0))


def _sigmoid(x: np.ndarray, *, out: np.ndarray) -> None:
    # exp(-|x|) never overflows: 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0. The
    # numerator is max(e, [x >= 0]) (e <= 1; NaN stays NaN): whole-array passes instead of a
    # divide with ``where=`` (numpy's masked loops are slow), same results.
    # Safe in place: x is read before out is written.
    e = np.abs(x)
    np.negative(e, out=e)
    np.exp(e, out=e)
    d = e + 1
    np.maximum(e, np.greater_equal(x, 0).astype(e.dtype), out=e)
    np.divide(e, d, out=out)


def _hard_sigmoid(x: np.ndarray, *, out: np.ndarray, alpha: float, beta: float) -> None:
    # safe in place: x is read by the first pass only
    np.multiply(x, alpha, out=out)
    np.add(out, beta, out=out)
    np.minimum(out, 1, out=out)
    np.maximum(out, 0, out=out)


_ONE_SIXTH = float(np.float32(1 / 6))  # HardSwish is x * HardSigmoid(x, alpha=1/6, beta=0.5)


def _hard_swish(x: np.ndarray, *, out: np.ndarray) -> None:
    # in place (out is x, as a fused epilogue calls it) the gate goes to a new array first
    gate = np.empty_like(out) if np.may_share_memory(x, out) else out
    _hard_sigmoid(x, out=gate, alpha=_ONE_SIXTH, beta=0.5)
    np.multiply(gate, x, out=out)


def _softplus(x: np.ndarray, *, out: np.ndarray) -> None:
    np.logaddexp(x, 0, out=out)


def _softsign(x: np.ndarray, *, out: np.ndarray) -> None:
    np.abs(x, out=out)
    np.add(out, 1, out=out)
    np.divide(x, out, out=out)


def _elu(x: np.ndarray, *, out: np.ndarray, alpha: float) -> None:
    np.expm1(x, out=out)
    np.multiply(out, alpha, out=out)
    np.copyto(out, x, where=np.greater(x, 0))


def _selu(x: np.ndarray, *, out: np.ndarray, alpha: float, gamma: float) -> None:
    _elu(x, out=out, alpha=alpha)
    np.multiply(out, gamma, out=out)


def _celu(x: np.ndarray, *, out: np.ndarray, alpha: float) -> None:
    np.divide(x, alpha, out=out)
    np.expm1(out, out=out)
    np.multiply(out, alpha, out=out)
    np.copyto(out, x, where=np.greater(x, 0))


_SQRT_2_OVER_PI = 0.7978845608028654  # sqrt(2 / pi)
_SQRT_HALF = 0.7071067811865476  # sqrt(1 / 2)


def _gelu(x: np.ndarray, *, out: np.ndarray, approximate: str) -> None:
    if approximate == "tanh":
        # 1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))
        np.multiply(x, x, out=out)
        np.multiply(out, x, out=out)
        np.multiply(out, 0.044715, out=out)
        np.add(out, x, out=out)
        np.multiply(out, _SQRT_2_OVER_PI, out=out)
        np.tanh(out, out=out)
        np.add(out, 1, out=out)
    else:
        # 1 + erf(x / sqrt 2) = erfc(-x / sqrt 2): no cancellation for negative x.
        np.multiply(x, -_SQRT_HALF, out=out)
        math_functions.erfc(out, out=out)
    np.multiply(out, x, out=out)
    np.multiply(out, 0.5, out=out)


def _clip(x: np.ndarray, low: np.ndarray | None = None, high: np.ndarray | None = None, *,
          out: np.ndarray, **bounds: float) -> None:
    # Before opset 11 the bounds are the attributes "min" and "max".
    low = bounds.get("min") if low is None else low
    high = bounds.get("max") if high is None else high
    if low is None and high is None:
        np.copyto(out, x)
        return
    if low is not None:
        _against_constant(np.maximum, x, low, out)
        x = out
    if high is not None:
        _against_constant(np.minimum, x, high, out)


def _div(x: np.ndarray, y: np.ndarray, *, out: np.ndarray) -> None:
    kind = out.dtype.kind
    if kind == "i":
        # Truncating division, exact: x - fmod(x, y) is a multiple of y (0 where y == 0).
        np.subtract(x, np.fmod(x, y), out=out)
        np.floor_divide(out, y, out=out)
    elif kind == "u":
        np.floor_divide(x, y, out=out)
    else:
        np.divide(x, y, out=out)


def _pow(x: np.ndarray, y: np.ndarray, *, out: np.ndarray) -> None:
    # numpy's promotion picks the loop (float64 for an integer base with a float exponent,
    # or a float32 base with an integer exponent), then the result is cast to the base type.
    np.power(x, y, out=out, casting="unsafe")


def _mod(x: np.ndarray, y: np.ndarray, *, out: np.ndarray, fmod: int) -> None:
    # fmod=1: C fmod, sign of the dividend; fmod=0: Python's %, sign of the divisor.
    (np.fmod if fmod else np.mod)(x, y, out=out)


def _fold(ufunc: np.ufunc) -> Callable[..., None]:
    """compute(*xs, out) = ufunc(...ufunc(ufunc(x0, x1), x2)..., xn), in that order."""

    def compute(*xs: np.ndarray, out: np.ndarray) -> None:
        if len(xs) == 1:
            np.copyto(out, xs[0])
            return
        ufunc(xs[0], xs[1], out=out)
        for x in xs[2:]:
            ufunc(out, x, out=out)

    compute.__name__ = f"fold_{ufunc.__name__}"
    return compute


_sum = _fold(np.add)


def _mean(*xs: np.ndarray, out: np.ndarray) -> None:
    _sum(*xs, out=out)
    np.divide(out, len(xs), out=out)


def _where(condition: np.ndarray, x: np.ndarray, y: np.ndarray, *, out: np.ndarray) -> None:
    np.copyto(out, y, casting="unsafe")
    np.copyto(out, x, where=condition, casting="unsafe")
