"""``pointwise.rows_positions``: the 1x1 product with the weights packed once as the packed
micro-kernel's rows and the input's rows read in place as its panels
(``conv/pointwise_rows.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_conv_pointwise import (
    _check_settled_product,
    _kernel,
    _random_case,
    _settled,
    packed_only,
)

from onnx_light.kernels import conv
from onnx_light.kernels.conv import pointwise, pointwise_rows
from onnx_light.parallel import ThreadPool


@pytest.fixture(scope="module")
def pools():
    with ThreadPool(1) as one, ThreadPool(2) as two:
        yield {1: one, 2: two}


@packed_only
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channels=st.integers(1, 300), filters=st.one_of(st.integers(1, 40), st.integers(120, 150)),
       height=st.integers(1, 23), width=st.integers(2, 29), batch=st.integers(1, 2), bias=st.booleans(),
       residual=st.booleans(), clamp=st.sampled_from([None, (0.0, 6.0)]), seed=st.integers(0, 2**16))
def test_rows_products_are_within_the_bound_and_the_same_bits_at_two_threads(
        pools, monkeypatch, channels, filters, height, width, batch, bias, residual, clamp, seed):
    """``pointwise.rows_positions`` (float32, constant weights): each element within
    conv.numerics's bound of the float64 convolution (plus one rounding for the residual's
    addition), whole and part panels of positions (planes up to 667, several tiles), whole
    and part blocks of filters; the bound call's bits and the unbound one's, the same bits at
    two threads sharing its units (tiles of positions), and the rows product is what ran."""
    case = _random_case(seed, batch, channels, height, width, filters, bias, residual, clamp)
    _check_settled_product(pools, monkeypatch, case, residual, clamp,
                           {conv.POINTWISE_ROWS: 2, conv.POINTWISE_TRANSPOSED: 1000,
                            conv.POINTWISE_MINIMUM_FLOPS: 1},
                           pointwise_rows, "pointwise_rows")


@packed_only
def test_rows_products_propagate_nan_and_infinities_and_leave_other_planes(pools):
    """NaN and infinities propagate through the rows product (in a whole panel and in the
    packed part panel); a plane smaller than ``pointwise.rows_positions``, weights fed at run
    time, and a 1x1 plane keep their own products (the same bits as without the value)."""
    rng = np.random.default_rng(6)
    w = rng.uniform(-1, 1, (20, 9, 1, 1)).astype(np.float32)
    x = rng.uniform(-1, 1, (1, 9, 9, 9)).astype(np.float32)
    x[0, 2, 0, 4] = np.nan  # position 4: a whole panel
    x[0, 5, 8, 8] = np.inf  # position 80: the part panel
    x[0, 6, 8, 7] = -np.inf
    values = {conv.POINTWISE_ROWS: 81}
    got = _settled(pools[1], w, None, x.shape, values).run(x, w)[0]
    with np.errstate(invalid="ignore"):
        expected = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    np.testing.assert_array_equal(np.sign(got[~finite & ~np.isnan(expected)]),
                                  np.sign(expected[~finite & ~np.isnan(expected)]))
    assert np.all(np.abs(got[finite] - expected[finite]) <= conv.error_bound(x, w, None)[finite])
    for shape in ((1, 9, 8, 8), (1, 9, 1, 1)):
        other = rng.uniform(-1, 1, shape).astype(np.float32)
        np.testing.assert_array_equal(_settled(pools[1], w, None, shape, values).run(other, w)[0],
                                      _kernel(1, pools[1]).run(other, w)[0])
    fed = w * 2
    np.testing.assert_array_equal(_settled(pools[1], w, None, x.shape, values).run(x, fed)[0],
                                  _kernel(1, pools[1]).run(x, fed)[0])


def test_uses_rows_from_the_value_for_float32_only():
    """Planes of at least the value (0: never), float32 only, where the packed kernel runs."""
    available = pointwise.packed_gemm.available()
    assert pointwise_rows.uses_rows(np.float32, 196, 196) is available
    assert not pointwise_rows.uses_rows(np.float32, 195, 196)
    assert not pointwise_rows.uses_rows(np.float32, 196, 0)
    assert not pointwise_rows.uses_rows(np.float64, 196, 196)
