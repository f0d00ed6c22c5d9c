"""The compiled in-place activations (``activate_run``) on every run length around the vector
width, from unaligned starts: the hard ones bitwise numpy's operations, the sigmoid ones
within the module's stated 4 units in the last place; nothing outside the run written."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_light.kernels.compiled_activations import ACTIVATIONS, activate_run

RNG = np.random.default_rng(16)
LENGTHS = [*range(34), 63, 255, 257, 1001, 3137]
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -100.0, 100.0, -87.5, 3.0, -3.0, 2.9999998,
                    -86.9, 1e-40, -1e-40], np.float32)
CASES = [("Sigmoid", 1.0, 0.0), ("Swish", 1.0, 0.0), ("Swish", 0.7, 0.0),
         ("HardSigmoid", 0.2, 0.5), ("HardSigmoid", 0.3, -0.1),
         ("HardSwish", float(np.float32(1 / 6)), 0.5)]


def _values(n: int) -> np.ndarray:
    """n values over the activations' interesting range, the special ones spread among them."""
    x = (RNG.standard_normal(n) * 6).astype(np.float32)
    if n:
        at = RNG.choice(n, size=min(n, len(SPECIAL)), replace=False)
        x[at] = SPECIAL[:len(at)]
    return x


def _expected(op: str, x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """numpy's float32 operations for the hard activations; float64's sigmoid rounded once
    (times x in float32, as Sigmoid then Mul give it) for the others."""
    a, b = np.float32(alpha), np.float32(beta)
    with np.errstate(all="ignore"):
        if op in ("Sigmoid", "Swish"):
            gate = (1.0 / (1.0 + np.exp(-(a * x).astype(np.float64)))).astype(np.float32)
            return gate if op == "Sigmoid" else x * gate
        h = np.maximum(np.minimum(x * a + b, np.float32(1.0)), np.float32(0.0))
        return h if op == "HardSigmoid" else h * x


def _assert_within_4_ulps(got: np.ndarray, expected: np.ndarray) -> None:
    """Within 4 float32 units of ``expected``, or of 0 below the smallest normal float32 times
    |x| (where the compiled exponential flushes to 0); NaN and infinities equal."""
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(got[~finite], expected[~finite])
    bound = np.maximum(4 * np.spacing(np.abs(expected[finite])), 128 * np.finfo(np.float32).tiny)
    error = np.abs(got[finite].astype(np.float64) - expected[finite].astype(np.float64))
    assert np.all(error <= bound), f"{np.max(error / bound) * 4} ulps"


@pytest.mark.parametrize(("op", "alpha", "beta"), CASES, ids=[f"{op}-{alpha:.2f}" for op, alpha, _ in CASES])
@pytest.mark.parametrize("start", [0, 1, 3, 5])
def test_activate_run_on_every_length_from_unaligned_starts(op: str, alpha: float, beta: float,
                                                           start: int) -> None:
    for n in LENGTHS:
        x = _values(n)
        base = np.full(start + n + 9, 7.0, np.float32)
        base[start:start + n] = x
        with np.errstate(all="ignore"):
            activate_run(base, np.uintp(start), np.uintp(n), ACTIVATIONS[op], alpha, beta)
        got, expected = base[start:start + n], _expected(op, x, alpha, beta)
        assert np.all(base[:start] == 7.0) and np.all(base[start + n:] == 7.0), (op, n)
        if op.startswith("Hard"):
            np.testing.assert_array_equal(got.view(np.int32), expected.view(np.int32), err_msg=f"n={n}")
        else:
            _assert_within_4_ulps(got, expected)
            np.testing.assert_array_equal(np.signbit(got[got == 0]), np.signbit(expected[got == 0]))
