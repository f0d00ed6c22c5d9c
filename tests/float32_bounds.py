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
