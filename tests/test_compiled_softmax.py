"""The compiled float32 Softmax (kernels/compiled_softmax.py) against float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.compiled_softmax import SoftmaxRows, exp_difference, mask_layout
from onnx_light.kernels.reductions import MINIMUM_ELEMENTS, Softmax
from onnx_light.parallel import get_pool
from onnx_light.tuning.keys import ElementType as T

# Each output is within 2 float32 units in the last place of the float64 softmax of the
# float32 rows (the exponential's 1.4 units, the float64 sum's and quotient's rounding):
# within 2 units of the float64 softmax rounded to float32, and 2 ulps is at most 2 eps
# relative.
ULP = float(np.finfo(np.float32).eps)
EXP_ERROR = 1.4 * 2.0 ** -24


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


def _exp_differences(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    run = exp_difference.dispatcher
    return np.array([run(np.float32(p), np.float32(q)) for p, q in zip(a, b, strict=True)], np.float32)


def test_exp_of_the_exact_difference_over_the_whole_range():
    """2^64 exp(a - b) within 1.4 units (2^-24 relative) of the exact value for differences
    from 0 down to -104 (float32 differences that round, the denormal outputs' range), 0
    below and for -inf, NaN for NaN."""
    rng = np.random.default_rng(6)
    b = (rng.standard_normal(30_000) * 40).astype(np.float32)
    d = np.concatenate([-rng.random(10_000) * 104, -rng.random(10_000) * 2, -87 - rng.random(10_000) * 17])
    a = (b + d).astype(np.float32)  # the float32 difference a - b rounds: the exact one counts
    e = _exp_differences(a, b)
    exact = np.exp(a.astype(np.float64) - b.astype(np.float64)) * 2.0 ** 64
    keep = exact > 2.0 ** 64 * np.exp(-104.0)
    assert np.max(np.abs(e[keep] / exact[keep] - 1)) < EXP_ERROR
    special = _exp_differences(np.array([-np.inf, np.nan, 0.0, -3e38, 1.0, -110.0], np.float32),
                               np.array([0.0, 0.0, np.nan, 1.0, 1.0, 0.0], np.float32))
    assert special[0] == 0 and np.isnan(special[1]) and np.isnan(special[2])
    assert special[3] == 0 and special[4] == 2.0 ** 64 and special[5] == 0


@pytest.mark.parametrize("shape", [(4, 197), (3, 32), (2, 7), (1, 1000)])
def test_rows_within_two_float32_units_of_the_float64_softmax(shape):
    rng = np.random.default_rng(shape[1])
    x = (rng.standard_normal(shape) * 20).astype(np.float32)
    x[0, : shape[1] // 2] = -np.inf
    x[-1, 0] = 100.0  # the other entries of that row are denormal or 0 in float32
    out = np.empty_like(x)
    SoftmaxRows(1, 1 << 62)(x, out)
    expected = reference(x).astype(np.float32)
    assert ulps(out, expected).max() <= 2
    assert (out[-1, 1:] < np.finfo(np.float32).tiny).any()  # denormal outputs were checked


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=4), data=st.data(),
       scale=st.sampled_from([1.0, 0.125, 0.3]), spread=st.sampled_from([1.0, 8.0]))
def test_scale_and_any_broadcast_mask_against_float64(shape, data, scale, spread):
    """Any mask shape that broadcasts to the scores along their last axis; masks of 0, -inf,
    float32's lowest and -1.5: the reference is the float64 softmax of the float32 rows
    ``fl(scale x + mask)``, the kernel's within 2 float32 units of it."""
    mask_shape = [data.draw(st.sampled_from([1, n])) for n in shape[:-1]]
    mask_shape = [*mask_shape[data.draw(st.integers(0, len(mask_shape))):], shape[-1]]
    rng = np.random.default_rng(len(shape) * 7 + len(mask_shape))
    x = (rng.standard_normal(shape) * spread).astype(np.float32)
    values = np.array([0.0, 0.0, -np.inf, np.finfo(np.float32).min, -1.5], np.float32)
    mask = values[rng.integers(0, values.size, mask_shape)]
    out = np.empty_like(x)
    SoftmaxRows(1, 1 << 62)(x, out, scale, mask, mask_layout(mask.shape, x.shape))
    y = (np.float64(np.float32(scale)) * x.astype(np.float64) + mask).astype(np.float32)
    expected = reference(y).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    finite = ~np.isnan(expected)
    assert ulps(out[finite], expected[finite]).max(initial=0) <= 2
