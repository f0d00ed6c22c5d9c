"""float32 GELU (``kernels/float32_math.py``) against float64: a dense sweep, every float32
around the erf polynomials' split, hypothesis over all float32 bit patterns, and the fit
that produced the coefficients."""

from __future__ import annotations

import math

import numpy as np
import pytest
from float32_bounds import assert_within_gelu32_bound
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.polynomial import chebyshev, polynomial

from onnx_light.kernels import compiled_elementwise as ce
from onnx_light.kernels import float32_math as fm
from onnx_light.kernels.math_functions import erfc

FORMS = {"none": ce.GELU, "tanh": ce.GELU_TANH}


def _gelu64(form: str, t: np.ndarray) -> np.ndarray:
    """GELU of float32 ``t`` in float64 (erfc for the erf form: no cancellation for t < 0)."""
    t = t.astype(np.float64)
    with np.errstate(all="ignore"):
        if form == "none":
            return np.where(np.isinf(t) & (t < 0), np.nan, 0.5 * t * erfc(-t * math.sqrt(0.5)))
        u = math.sqrt(2 / math.pi) * (t + 0.044715 * t * t * t)
        return t / (1.0 + np.exp(-2.0 * u))


def _run(form: str, t: np.ndarray) -> np.ndarray:
    program = ce.single_op("Gelu", 1, {"approximate": form})
    assert program is not None and program._gelu_form == (FORMS[form], False)
    return program.run([t.reshape(1, -1)]).reshape(-1)


def _every_float32(low: float, high: float) -> np.ndarray:
    """Every float32 in [low, high], 0 < low < high, with its negative."""
    first, last = np.array([low, high], np.float32).view(np.int32)
    positive = np.arange(first, last + 1, dtype=np.int32).view(np.float32)
    return np.concatenate([positive, -positive])


@pytest.mark.parametrize("form", ["none", "tanh"])
def test_dense_sweep_within_bound(form: str) -> None:
    """Every 128th float32 from 2^-30 to 2^7 and every float32 where erf's argument crosses
    its split (t = 1.25 sqrt 2) or its limit, both signs, and the special values."""
    split = fm.ERF_SPLIT * math.sqrt(2)
    limit = fm.ERF_LIMIT * math.sqrt(2)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-45, -1e-45], np.float32)
    t = np.concatenate([_every_float32(2.0 ** -30, 128.0)[::128], _every_float32(split - 0.01, split + 0.01),
                        _every_float32(limit - 0.01, limit + 0.01), special])
    assert_within_gelu32_bound(_run(form, t), _gelu64(form, t), t)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 300), elements=st.floats(width=32)),
       st.sampled_from(["none", "tanh"]))
def test_any_float32_within_bound(t: np.ndarray, form: str) -> None:
    assert_within_gelu32_bound(_run(form, t), _gelu64(form, t), t)


def test_refit_gives_the_shipped_coefficients() -> None:
    """The coefficients are the weighted least-squares fits on 3000 Chebyshev nodes that the
    module's docstring describes, rounded to float32."""
    s = np.cos(np.pi * (np.arange(3000) + 0.5) / 3000)
    split, limit = fm.ERF_SPLIT, fm.ERF_LIMIT
    a = np.sqrt((s + 1) / 2) * split
    ratio = np.array([math.erf(v) for v in a]) / np.where(a == 0, 1, a) - 1
    small = polynomial.polyfit(a * a, ratio, 8, w=np.maximum(a, 0.05))
    middle, half = (limit + split) / 2, (limit - split) / 2
    large = chebyshev.cheb2poly(chebyshev.chebfit(s, [math.erfc(v) for v in middle + half * s], 12))
    r = s * math.log(2) / 2
    exp = polynomial.polyfit(r, np.exp(r), 6, w=np.exp(-r))
    for fitted, shipped in ((small, fm.ERF_SMALL), (large, fm.ERF_LARGE), (exp, fm.EXP_POLYNOMIAL)):
        np.testing.assert_allclose(np.float32(fitted), np.float32(shipped), rtol=1e-6, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 10), st.integers(1, 21), st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_rows_four_lanes_match_one_value_at_a_time(rows: int, width: int, with_bias: bool, tanh: bool,
                                                   seed: int) -> None:
    """gelu_rows runs four rows together (the ``_lanes`` functions), then each last row's four
    quarters together and its last values one by one, adding -0.0 where there is no bias:
    bit for bit what gelu32 and gelu_tanh32 give one value at a time, special values included."""
    rng = np.random.default_rng(seed)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -1e-45, 1.7677, -5.55, -11.0], np.float32)
    x = np.where(rng.random((rows, width)) < 0.3, rng.choice(special, (rows, width)),
                 rng.standard_normal((rows, width)) * 4).astype(np.float32)
    bias = rng.choice(np.append(special, np.float32(0.5)), width).astype(np.float32)
    out = np.empty_like(x)
    ce.gelu_rows(x, bias, with_bias, tanh, out)
    one = fm.gelu_tanh32 if tanh else fm.gelu32
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, 3e38 + 3e38
        argument = x + bias if with_bias else x
    expected = np.array([one(v) for v in argument.reshape(-1)], np.float32).reshape(x.shape)
    np.testing.assert_array_equal(out.view(np.int32), expected.view(np.int32))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 10), st.integers(1, 21), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_channel_rows_four_lanes_match_one_value_at_a_time(rows: int, width: int, channels: int,
                                                           seed: int) -> None:
    """gelu_channel_rows (GELU of a per-channel affine) runs four rows together: bit for bit
    gelu32 of the affine (product and sum rounded apart) one value at a time."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, width)) * 4).astype(np.float32)
    x.reshape(-1)[:3] = [np.nan, -0.0, np.inf][:x.size]
    scale, shift = (rng.standard_normal(channels).astype(np.float32) for _ in range(2))
    out = np.empty_like(x)
    ce.gelu_channel_rows(x, scale, shift, out)
    expected = np.array([[fm.gelu32(np.float32(np.float32(v * scale[r % channels]) + shift[r % channels]))
                          for v in x[r]] for r in range(rows)], np.float32)
    np.testing.assert_array_equal(out.view(np.int32), expected.view(np.int32))
