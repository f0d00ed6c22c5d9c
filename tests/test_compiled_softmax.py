"""The compiled float32 Softmax (kernels/compiled_softmax.py) against float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.compiled_softmax import EXP_POLYNOMIAL, SoftmaxRows, exp_shifted, mask_layout
from onnx_light.kernels.reductions import MINIMUM_ELEMENTS, Softmax
from onnx_light.parallel import get_pool
from onnx_light.tuning.keys import ElementType as T

# Each output is the float64 softmax up to the polynomial exp's relative error (2e-9) twice
# (the entry and the sum), rounded once: within one float32 unit in the last place of the
# float64 softmax rounded to float32.
ULP = float(np.finfo(np.float32).eps)
EXP_ERROR = 2e-9


def ulps(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Units in the last place of float32 between non-negative float32 arrays (denormals
    included: consecutive float32 values differ by one in their bits)."""
    return np.abs(actual.view(np.int32).astype(np.int64) - expected.view(np.int32).astype(np.int64))


def reference(x: np.ndarray, axis: int = -1, scale: float = 1.0,
              mask: np.ndarray | None = None) -> np.ndarray:
    y = x.astype(np.float64) * scale
    if mask is not None:
        y = y + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(y - np.max(y, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


def kernel(opset: int = 13, axis: int | None = None, threads: int = 1, minimum: int = 1 << 62) -> Softmax:
    attributes = {} if axis is None else {"axis": axis}
    ctx = NodeContext("softmax", "Softmax", "", opset, attributes, (T.FLOAT,), (T.FLOAT,), 1, 1)
    k = Softmax(ctx).bind(get_pool(threads) if threads > 1 else None)
    k.configure({MINIMUM_ELEMENTS: minimum})
    return k


def close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=2 * ULP, atol=1e-45)


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=4), data=st.data(),
       spread=st.sampled_from([1.0, 30.0]))
def test_any_axis_against_float64(shape, data, spread):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = (np.random.default_rng(len(shape) * 31 + axis).standard_normal(shape) * spread).astype(np.float32)
    close(kernel(axis=axis).run(x)[0], reference(x, axis))


def test_before_opset_13_the_rows_are_everything_from_the_axis_on():
    x = np.random.default_rng(1).standard_normal((2, 3, 5)).astype(np.float32)
    expected = reference(x.reshape(2, 15)).reshape(x.shape)
    close(kernel(opset=11, axis=1).run(x)[0], expected)


def test_special_values_propagate_as_numpy_has_them():
    x = np.zeros((5, 4), np.float32)
    x[0, 1] = np.nan  # NaN anywhere: the row is NaN
    x[1, 2] = np.inf  # +inf: inf - inf is NaN
    x[2, :] = -np.inf  # only -inf: -inf - -inf is NaN
    x[3, 1:] = -np.inf  # a finite maximum: exp(-inf) = 0
    out = kernel().run(x)[0]
    assert np.isnan(out[:3]).all()
    assert out[3].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert out[4].tolist() == [0.25] * 4


@pytest.mark.parametrize("threads", [2, 3])
def test_serial_and_parallel_rows_are_bit_identical(threads):
    x = np.random.default_rng(2).standard_normal((7, 33, 17)).astype(np.float32)
    serial = kernel().run(x)[0]
    parallel = kernel(threads=threads, minimum=1).run(x)[0]
    assert serial.tobytes() == parallel.tobytes()


def test_prepared_writes_the_run_values_into_the_buffer():
    x = np.random.default_rng(3).standard_normal((4, 6, 10)).astype(np.float32)
    k = kernel()
    prepared = k.prepare([(x.shape, np.dtype(np.float32))])
    out = np.empty(prepared.shape, prepared.dtype)
    prepared.compute(x, out=out)
    assert out.tobytes() == k.run(x)[0].tobytes()
    assert kernel(axis=0).prepare([(x.shape, np.dtype(np.float32))]) is None  # not the last axis


def test_float64_keeps_numpy():
    x = np.random.default_rng(4).standard_normal((3, 5))
    ctx = NodeContext("softmax", "Softmax", "", 13, {}, (T.DOUBLE,), (T.DOUBLE,), 1, 1)
    out = Softmax(ctx).run(x)[0]
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, reference(x), rtol=1e-15)


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 6), (1, 1, 5, 6), (5, 6), (6,), (2, 3, 5, 6)])
def test_scale_and_broadcast_mask(mask_shape):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    mask = np.where(rng.random(mask_shape) < 0.3, np.float32(-np.inf), np.float32(0))
    mask[..., 0] = np.finfo(np.float32).min  # large negatives as transformers write them
    rows = mask_layout(mask.shape, x.shape)
    out = np.empty_like(x)
    SoftmaxRows(1, 1 << 62)(x, out, 0.125, np.ascontiguousarray(mask), rows)
    close(out, reference(x, scale=0.125, mask=mask))


def test_mask_layout_refuses_masks_that_do_not_broadcast_to_the_scores():
    assert mask_layout((3, 6), (2, 5, 6)) is None  # 3 against 5
    assert mask_layout((2, 1, 6), (1, 6)) is None  # would enlarge the scores
    assert mask_layout((5, 1), (5, 6)) is None  # not along the last axis
    assert mask_layout((1, 6), (2, 6)).tolist() == [0, 0]


@pytest.mark.parametrize(("opset", "shape"), [(13, (0, 4)), (13, (3, 0)), (11, (2, 0, 3))])
def test_empty_tensors(opset, shape):
    x = np.zeros(shape, np.float32)
    k = kernel(opset=opset, axis=1)
    assert k.run(x)[0].shape == shape
    assert k.prepare([(shape, np.dtype(np.float32))]) is None


def test_exp_polynomial_error_is_as_stated():
    r = np.linspace(-np.log(2) / 2, np.log(2) / 2, 100_001)
    error = np.max(np.abs(np.polynomial.polynomial.polyval(r, EXP_POLYNOMIAL) / np.exp(r) - 1))
    assert 1e-9 < error < 1.9e-9


def test_exp_over_the_whole_range_of_differences():
    rng = np.random.default_rng(6)
    d = np.concatenate([-rng.random(50_000) * 750,  # everything from 1 down to 0 in float64
                        -87 - rng.random(20_000) * 17,  # float32's denormals and its last nonzero
                        -rng.random(20_000) * 2, -np.arange(1100.0),  # near 0 and every integer
                        [0.0, -0.0, -np.inf, np.nan, -5e-324, -708.0, -708.5, -745.2, -1e308]])
    e = np.empty_like(d)
    exp_shifted.dispatcher(d + 1.5, 1.5, e, d.size, np.empty(d.size, np.int64))
    assert np.isnan(e[-6]) and not np.isnan(e[:-6]).any()
    d, e = d[:-6], e[:-6]
    with np.errstate(under="ignore"):
        exact = np.exp(d)
    normal = d > -104
    assert np.max(np.abs(e[normal] / exact[normal] - 1)) < EXP_ERROR
    assert (e[~normal] < 2.0 ** -150).all() and (e[~normal] > 2.0 ** -1022).all() and (e >= 0).all()
    assert ulps(e.astype(np.float32), exact.astype(np.float32)).max() <= 1
    assert (e[d < -104].astype(np.float32) == 0).all()


@pytest.mark.parametrize("shape", [(4, 197), (3, 32), (2, 7), (1, 1000)])
def test_rows_within_one_float32_unit_of_the_float64_softmax(shape):
    rng = np.random.default_rng(shape[1])
    x = (rng.standard_normal(shape) * 20).astype(np.float32)
    x[0, : shape[1] // 2] = -np.inf
    x[-1, 0] = 100.0  # the other entries of that row are denormal or 0 in float32
    out = np.empty_like(x)
    SoftmaxRows(1, 1 << 62)(x, out)
    expected = reference(x).astype(np.float32)
    assert ulps(out, expected).max() <= 1
