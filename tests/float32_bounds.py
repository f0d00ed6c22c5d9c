"""The accuracy bound of float32 GELU (``onnx_light.kernels.float32_math``), shared by tests."""

from __future__ import annotations

import numpy as np


def _ulp32(values: np.ndarray) -> np.ndarray:
    """float32's unit in the last place at each (float64) value, subnormals included."""
    exponent = np.frexp(np.asarray(values, np.float64))[1]
    return np.ldexp(1.0, np.maximum(exponent - 24, -149))


def assert_within_gelu32_bound(actual: np.ndarray, expected: np.ndarray, argument: np.ndarray) -> None:
    """``actual`` (float32) within ``2 ulp(expected) + 1 ulp(argument)`` of ``expected`` (the
    float64 GELU of the float32 ``argument``); NaN where it is NaN, infinities and zeros
    exact (a zero's sign too, where the argument is a zero)."""
    expected = np.asarray(expected, np.float64)
    actual = np.asarray(actual)
    assert actual.dtype == np.float32
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan)
    exact = ~nan & (np.isinf(expected) | (argument == 0))
    np.testing.assert_array_equal(actual[exact], expected[exact].astype(np.float32))
    np.testing.assert_array_equal(np.signbit(actual[exact]), np.signbit(expected[exact]))
    finite = ~nan & ~exact
    bound = 2 * _ulp32(expected[finite]) + _ulp32(argument[finite])
    error = np.abs(actual[finite].astype(np.float64) - expected[finite])
    worst = int(np.argmax(error / bound)) if error.size else 0
    assert np.all(error <= bound), (argument[finite][worst], actual[finite][worst], expected[finite][worst])


U32 = 2.0 ** -24  # float32's unit roundoff


def assert_within_layer_norm32_bound(y: np.ndarray, mean: np.ndarray, inverse: np.ndarray, x: np.ndarray,
                                     scale: np.ndarray, bias: np.ndarray | None, epsilon: float) -> None:
    """float32 LayerNormalization of the rows of the 2-D float32 ``x`` (``y``, ``mean``,
    ``inverse``) against float64 (mu, inv, y64), per row of n values with S = mean |x|:

    * the mean within ``a = (n + 2) u S`` of mu (u = 2^-24: float32's sum of n terms);
    * InvStdDev within ``2 rho`` of inv relatively, ``rho = (n + 10) u / 2 + (a inv)^2``;
    * ``|y - y64| <= 2 |scale| inv (|x - mu| rho + a) + 2 u |y64|``

    (twice the first-order error of the sums, the centring and the three roundings of the
    output), for rows whose float32 sum of squares does not overflow."""
    data = x.astype(np.float64)
    n = data.shape[1]
    mu = data.mean(axis=1, keepdims=True)
    inv = 1 / np.sqrt(((data - mu) ** 2).mean(axis=1, keepdims=True) + epsilon)
    y64 = (data - mu) * inv * scale.astype(np.float64) + (0 if bias is None else bias.astype(np.float64))
    a = (n + 2) * U32 * np.abs(data).mean(axis=1, keepdims=True)
    rho = (n + 10) * U32 / 2 + (a * inv) ** 2
    assert np.all(np.abs(mean.reshape(mu.shape) - mu) <= a)
    assert np.all(np.abs(inverse.reshape(inv.shape) - inv) <= 2 * rho * inv)
    bound = 2 * np.abs(scale) * inv * (np.abs(data - mu) * rho + a) + 2 * U32 * np.abs(y64)
    error = np.abs(y.astype(np.float64) - y64)
    worst = np.unravel_index(int(np.argmax(error - bound)), error.shape)
    assert np.all(error <= bound), (worst, error[worst], bound[worst])
