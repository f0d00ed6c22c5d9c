"""Pooling, LRN and normalization kernels against ``onnx.reference.ReferenceEvaluator``.

MaxPool (values and indices) is exact. AveragePool, GlobalAveragePool, LRN and the
normalizations compute in float32 (float64 for double) in a different order than the
reference: they are compared with a relative tolerance of a few float32 ulps times the
number of terms combined, stated per test. The parallel paths of these kernels make the
same numpy calls on disjoint planes as the serial path, so they must match it bit for bit.
"""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import normalization, pooling
from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.parallel import ThreadPool
from onnx_light.runtime import RuntimeSession

T = TensorProto
F32_EPS = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def pools():
    with ThreadPool(1) as one, ThreadPool(2) as two:
        yield {1: one, 2: two}


def _reference(op_type, inputs, attributes, opset=22, outputs=1, element_type=T.FLOAT):
    names = [f"i{k}" for k in range(len(inputs))]
    out_names = [f"o{k}" for k in range(outputs)]
    node = helper.make_node(op_type, names, out_names, **attributes)
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), None)
                        for n, x in zip(names, inputs, strict=True)],
        [helper.make_tensor_value_info(n, element_type if k == 0 else T.UNDEFINED, None)
         for k, n in enumerate(out_names)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs, strict=True)))


def _run(kernel_class, op_type, inputs, attributes, opset=22, outputs=1, pool=None):
    element_type = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    ctx = NodeContext("node", op_type, "", opset, attributes, (element_type,) * len(inputs),
                      (element_type,) * outputs, len(inputs), outputs)
    kernel = kernel_class(ctx)
    kernel.bind(pool if pool is not None else ThreadPool(1))
    return kernel.run(*inputs)


def _assert_close(got, expected, terms):
    """Within ``4 (terms + 1)`` float32 ulps of the larger magnitude (relative)."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape
    tolerance = 4 * (terms + 1) * F32_EPS * np.maximum(np.abs(expected), 1e-30)
    np.testing.assert_array_less(np.abs(got - expected), tolerance + 1e-37)


# ------------------------------------------------------------------ an independent oracle


def _brute_pool(x, attributes, kind, storage_order=0):
    """Pooling by loops over output positions, written from the ONNX operator spec.

    Returns the values and, for ``"max"``, the flat indices (first maximum in row-major
    window order; ``storage_order`` 1 numbers the spatial axes column-major).
    """
    spatial = x.shape[2:]
    rank = len(spatial)
    kernel = attributes["kernel_shape"]
    strides = attributes.get("strides", [1] * rank)
    dilations = attributes.get("dilations", [1] * rank)
    pads = list(attributes.get("pads", [0] * 2 * rank))
    auto_pad = attributes.get("auto_pad", "NOTSET")
    ceil_mode = attributes.get("ceil_mode", 0)
    include_pad = attributes.get("count_include_pad", 0)
    output = []
    for i in range(rank):
        extent = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + extent - spatial[i])
            small, large = total // 2, total - total // 2
            pads[i], pads[i + rank] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        elif auto_pad == "VALID":
            pads[i] = pads[i + rank] = 0
        span = spatial[i] + pads[i] + pads[i + rank] - extent
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            pass
        elif ceil_mode:
            out = -(-span // strides[i]) + 1
            if (out - 1) * strides[i] >= spatial[i] + pads[i]:
                out -= 1
        else:
            out = span // strides[i] + 1
        output.append(out)
    values = np.zeros((*x.shape[:2], *output), np.float64)
    indices = np.zeros(values.shape, np.int64)
    plane = int(np.prod(spatial))
    for n, c, *o in itertools.product(*(range(d) for d in values.shape)):
        taps, count = [], 0
        for k in itertools.product(*(range(d) for d in kernel)):
            p = [o[i] * strides[i] - pads[i] + k[i] * dilations[i] for i in range(rank)]
            inside = all(0 <= p[i] < spatial[i] for i in range(rank))
            padded = all(-pads[i] <= p[i] < spatial[i] + pads[i + rank] for i in range(rank))
            count += 1 if (inside or (include_pad and padded)) else 0
            if inside:
                taps.append((float(x[(n, c, *p)]), p))
        if kind == "max":
            best = max(taps, key=lambda t: t[0])  # max() keeps the first of equal maxima
            values[(n, c, *o)] = best[0]
            order = range(rank) if storage_order == 0 else range(rank - 1, -1, -1)
            flat = 0
            for i in order:
                flat = flat * spatial[i] + best[1][i]
            indices[(n, c, *o)] = (n * x.shape[1] + c) * plane + flat
        else:
            values[(n, c, *o)] = sum(t[0] for t in taps) / count
    return values, indices


# ------------------------------------------------------------------ MaxPool

MAXPOOL_CASES = [
    ((1, 2, 9), {"kernel_shape": [3]}),
    ((2, 3, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "dilations": [2]}),
    ((1, 2, 8, 9), {"kernel_shape": [3, 3]}),
    ((2, 3, 8, 9), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1]}),
    ((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [1, 2]}),
    ((1, 2, 9, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 8), {"kernel_shape": [2, 3], "strides": [2, 1], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 9, 8), {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 0]}),
    ((1, 1, 6, 6, 6), {"kernel_shape": [2, 2, 2], "dilations": [2, 2, 2], "ceil_mode": 1}),
]
# onnx 1.23's reference pads SAME_LOWER windows like SAME_UPPER for MaxPool (the node test data
# and onnxruntime put the larger half first, as the operator spec says).
REFERENCE_DISAGREES = {8}


@pytest.mark.parametrize("case", range(len(MAXPOOL_CASES)))
def test_maxpool(case, pools):
    shape, attributes = MAXPOOL_CASES[case]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    expected = _brute_pool(x, attributes, "max")[0].astype(np.float32)
    if case not in REFERENCE_DISAGREES:
        np.testing.assert_array_equal(_reference("MaxPool", [x], attributes)[0], expected)
    for threads in (1, 2):
        got = _run(pooling.MaxPool, "MaxPool", [x], attributes, pool=pools[threads])[0]
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("case", range(len(MAXPOOL_CASES)))
@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices(case, storage_order, pools):
    """Against the oracle (onnx 1.23's reference maps the window's argmax to wrong flat
    indices outside its dilated path; ONNX's node test data agrees with the oracle)."""
    shape, attributes = MAXPOOL_CASES[case]
    rng = np.random.default_rng(1)
    x = rng.integers(-3, 4, shape).astype(np.float32)  # many ties: the first maximum wins
    attributes = dict(attributes, storage_order=storage_order)
    values, indices = _brute_pool(x, attributes, "max", storage_order)
    for threads in (1, 2):
        got_values, got_indices = _run(pooling.MaxPool, "MaxPool", [x], attributes, outputs=2,
                                       pool=pools[threads])
        np.testing.assert_array_equal(got_values, values.astype(np.float32))
        np.testing.assert_array_equal(got_indices, indices)
        assert got_indices.dtype == np.int64


def test_maxpool_indices_point_at_the_maximum():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    attributes = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 2]}
    values, indices = _run(pooling.MaxPool, "MaxPool", [x], attributes, outputs=2)
    np.testing.assert_array_equal(x.reshape(-1)[indices], values)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16, np.float64, ml_dtypes.bfloat16])
def test_maxpool_types(dtype):
    rng = np.random.default_rng(3)
    x = rng.integers(0 if dtype == np.uint8 else -100, 100, (1, 2, 7, 7)).astype(dtype)
    attributes = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    got = _run(pooling.MaxPool, "MaxPool", [x], attributes)[0]
    expected = _reference("MaxPool", [x.astype(np.float32)], attributes)[0].astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.astype(np.float32), expected.astype(np.float32))


def test_maxpool_large_is_split_bit_exactly(pools):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    attributes = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    serial = _run(pooling.MaxPool, "MaxPool", [x], attributes, outputs=2, pool=pools[1])
    parallel = _run(pooling.MaxPool, "MaxPool", [x], attributes, outputs=2, pool=pools[2])
    for a, b in zip(serial, parallel, strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ AveragePool

AVERAGE_CASES = [
    ((1, 2, 9), {"kernel_shape": [3]}),
    ((1, 2, 9), {"kernel_shape": [3], "pads": [1, 2], "count_include_pad": 1}),
    ((2, 3, 8, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((2, 3, 8, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1],
                    "count_include_pad": 1}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1],
                    "count_include_pad": 1}),
    ((1, 2, 9, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "count_include_pad": 1}),
    ((1, 2, 9, 8), {"kernel_shape": [3, 3], "auto_pad": "VALID"}),
    ((1, 2, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 0]}),
    ((1, 2, 7, 7), {"kernel_shape": [7, 7]}),
]


@pytest.mark.parametrize(("shape", "attributes"), AVERAGE_CASES)
def test_averagepool(shape, attributes, pools):
    rng = np.random.default_rng(5)
    x = rng.uniform(0.5, 1.5, shape).astype(np.float32)  # positive: relative error is meaningful
    expected = _brute_pool(x, attributes, "average")[0]
    terms = int(np.prod(attributes["kernel_shape"]))
    _assert_close(_reference("AveragePool", [x], attributes)[0], expected, terms)
    for threads in (1, 2):
        got = _run(pooling.AveragePool, "AveragePool", [x], attributes, pool=pools[threads])[0]
        assert got.dtype == np.float32
        _assert_close(got, expected, terms)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_averagepool_types(dtype):
    rng = np.random.default_rng(6)
    x = rng.uniform(0.5, 1.5, (1, 2, 6, 6)).astype(dtype)
    attributes = {"kernel_shape": [2, 2], "strides": [2, 2]}
    got = _run(pooling.AveragePool, "AveragePool", [x], attributes)[0]
    expected = _reference("AveragePool", [x.astype(np.float64)], attributes, element_type=T.DOUBLE)[0]
    assert got.dtype == dtype
    ulp = float(ml_dtypes.finfo(dtype).eps)
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=ulp, atol=0)


def test_averagepool_large_is_split_bit_exactly(pools):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 32, 56, 56)).astype(np.float32)
    attributes = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    serial = _run(pooling.AveragePool, "AveragePool", [x], attributes, pool=pools[1])[0]
    parallel = _run(pooling.AveragePool, "AveragePool", [x], attributes, pool=pools[2])[0]
    np.testing.assert_array_equal(serial, parallel)


def test_pool_errors():
    with pytest.raises(KernelError, match="kernel_shape is required"):
        _run(pooling.MaxPool, "MaxPool", [np.zeros((1, 1, 4, 4), np.float32)], {})
    with pytest.raises(KernelError, match="storage_order"):
        _run(pooling.MaxPool, "MaxPool", [np.zeros((1, 1, 4, 4), np.float32)],
             {"kernel_shape": [2, 2], "storage_order": 2})
    with pytest.raises(KernelError, match="strides"):
        _run(pooling.AveragePool, "AveragePool", [np.zeros((1, 1, 4, 4), np.float32)],
             {"kernel_shape": [2, 2], "strides": [1]})
    with pytest.raises(KernelError, match="does not take element type int8"):
        _run(pooling.AveragePool, "AveragePool", [np.zeros((1, 1, 4, 4), np.int8)],
             {"kernel_shape": [2, 2]})


# ------------------------------------------------------------------ global pools and LRN


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 7, 7), (1, 2, 3, 4, 5)])
def test_global_pools(shape):
    """Against numpy in float64 (onnx 1.23's reference keeps the wrong axes outside 4-D)."""
    rng = np.random.default_rng(8)
    x = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    axes = tuple(range(2, len(shape)))
    got = _run(pooling.GlobalAveragePool, "GlobalAveragePool", [x], {})[0]
    _assert_close(got, x.astype(np.float64).mean(axis=axes, keepdims=True), int(np.prod(shape[2:])))
    got = _run(pooling.GlobalMaxPool, "GlobalMaxPool", [x], {})[0]
    np.testing.assert_array_equal(got, x.max(axis=axes, keepdims=True))
    if len(shape) == 4:
        _assert_close(got, _reference("GlobalMaxPool", [x], {})[0], 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_average_pool_is_the_mean_rounded_once(dtype):
    """The compiled mean (float64 sums) of float planes, a view and NaN and infinities
    included: the float64 mean rounded once to the input's type."""
    rng = np.random.default_rng(10)
    x = rng.uniform(-2, 2, (2, 40, 9, 14)).astype(dtype)[:, ::2]  # not contiguous
    x[0, 0, 0, 0], x[0, 1, 2, 3], x[1, 2, 0, 0], x[1, 2, 1, 1] = np.nan, np.inf, np.inf, -np.inf
    got = _run(pooling.GlobalAveragePool, "GlobalAveragePool", [x], {})[0]
    with np.errstate(invalid="ignore"):  # inf - inf: NaN
        expected = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    assert got.dtype == dtype and got.shape == expected.shape
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(got[~finite], expected[~finite].astype(dtype))
    # one rounding to the type, plus float64 sums in another order than numpy's
    terms = x.shape[2] * x.shape[3]
    magnitude = np.abs(x.astype(np.float64)).mean(axis=(2, 3), keepdims=True)
    bound = (np.spacing(np.abs(expected).astype(dtype)).astype(np.float64)
             + terms * np.finfo(np.float64).eps * magnitude)
    np.testing.assert_array_less(np.abs(got[finite] - expected[finite]), bound[finite])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 7, 7), (1, 2, 3, 4, 5), (3, 1, 1, 1)])
def test_a_prepared_global_average_pool_writes_the_run_values_into_its_buffer(dtype, shape):
    element_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    kernel = pooling.GlobalAveragePool(NodeContext("node", "GlobalAveragePool", "", 22, {}, (element_type,),
                                                   (element_type,), 1, 1)).bind(ThreadPool(1))
    prepared = kernel.prepare([(shape, np.dtype(dtype))])
    assert prepared.shape == (*shape[:2], *(1,) * (len(shape) - 2)) and prepared.dtype == dtype
    x = np.random.default_rng(12).uniform(-2, 2, shape).astype(dtype)
    for writeable in (True, False):  # a step's output, a feed
        x.flags.writeable = writeable
        out = np.full(prepared.shape, np.nan, dtype)
        prepared.compute(x, out=out)
        np.testing.assert_array_equal(out, kernel.run(x)[0])
    assert kernel.prepare([((1, 3), np.dtype(dtype))]) is None  # no planes: run's own error
    assert kernel.prepare([((1, 3, 0), np.dtype(dtype))]) is None
    assert kernel.prepare([(shape, np.dtype(np.float16))]) is None


@settings(deadline=None, derandomize=True, max_examples=40)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=4), st.integers(1, 4), st.booleans(),
       st.sampled_from([np.float32, np.float64]))
def test_reduce_mean_over_trailing_axes_is_the_mean_rounded_once(shape, reduced, keepdims, dtype):
    """ReduceMean over trailing axes (the compiled rows of GlobalAveragePool, in any order of
    the axes): the float64 mean rounded to the type, within the bound above; other axes take
    numpy's path, within float32 tolerances of the same mean."""
    from onnx_light.kernels import reductions

    reduced = min(reduced, len(shape))
    rng = np.random.default_rng(len(shape) * 10 + reduced)
    x = rng.uniform(-2, 2, shape).astype(dtype)
    for axes in (list(range(len(shape) - reduced, len(shape)))[::-1], [0]):
        ctx = NodeContext("node", "ReduceMean", "", 13, {"axes": axes, "keepdims": int(keepdims)},
                          (helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),) * 1,
                          (helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),), 1, 1)
        (got,) = reductions.ReduceMean(ctx).run(x)
        expected = x.astype(np.float64).mean(axis=tuple(axes), keepdims=keepdims)
        assert got.dtype == dtype and got.shape == expected.shape
        terms = math.prod(shape[a] for a in axes)
        magnitude = np.abs(x.astype(np.float64)).mean(axis=tuple(axes), keepdims=keepdims)
        bound = (np.spacing(np.abs(expected).astype(dtype)).astype(np.float64)
                 + terms * np.finfo(dtype if axes == [0] else np.float64).eps * magnitude)
        assert np.all(np.abs(got - expected) <= bound)


@pytest.mark.parametrize(("shape", "attributes"), [
    ((1, 8, 5, 5), {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}),
    ((2, 5, 3, 4), {"size": 3}),
    ((1, 7, 6), {"size": 4, "alpha": 0.5, "beta": 0.3, "bias": 2.0}),
    ((1, 6, 2, 3, 4), {"size": 2, "alpha": 1e-3, "beta": 1.0}),
])
def test_lrn(shape, attributes, pools):
    """Against the spec's formula in float64 (onnx 1.23's reference loops over the batch axis
    instead of the channels; ONNX's node tests, which pass, were generated correctly)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape).astype(np.float32)
    size = attributes["size"]
    alpha, beta, bias = (float(np.float32(attributes.get(name, default)))
                         for name, default in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    wide = x.astype(np.float64)
    square_sum = np.zeros_like(wide)
    for c in range(shape[1]):
        low, high = max(0, c - (size - 1) // 2), min(shape[1] - 1, c + -(-(size - 1) // 2))
        square_sum[:, c] = np.sum(wide[:, low:high + 1] ** 2, axis=1)
    expected = wide / (bias + alpha / size * square_sum) ** beta
    got = _run(pooling.LRN, "LRN", [x], attributes, opset=13, pool=pools[1])[0]
    _assert_close(got, expected, size + 8)  # the sum's terms, then power and product


def test_lrn_large_is_split_bit_exactly(pools):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, 96, 54, 54)).astype(np.float32)
    attributes = {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}
    serial = _run(pooling.LRN, "LRN", [x], attributes, opset=13, pool=pools[1])[0]
    parallel = _run(pooling.LRN, "LRN", [x], attributes, opset=13, pool=pools[2])[0]
    np.testing.assert_array_equal(serial, parallel)


# ------------------------------------------------------------------ normalization


def _bn_inputs(shape, rng, dtype=np.float32, parameter_shape=None):
    channels = parameter_shape or (shape[1],)
    x = rng.standard_normal(shape).astype(dtype)
    scale = rng.uniform(0.5, 1.5, channels).astype(dtype)
    bias = rng.standard_normal(channels).astype(dtype)
    mean = rng.standard_normal(channels).astype(dtype)
    var = rng.uniform(0.5, 1.5, channels).astype(dtype)
    return [x, scale, bias, mean, var]


EPSILON = float(np.float32(1e-5))  # ONNX float attributes are float32


def _bn_expected(x, scale, bias, mean, var, epsilon=EPSILON):
    shape = (1, -1) + (1,) * (x.ndim - 2) if scale.ndim == 1 else (1, *scale.shape)
    f = [np.asarray(v, np.float64).reshape(shape) for v in (scale, bias, mean, var)]
    return (x.astype(np.float64) - f[2]) / np.sqrt(f[3] + epsilon) * f[0] + f[1]


@pytest.mark.parametrize("opset", [6, 7, 9, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (2, 4, 5, 6), (1, 3, 2, 3, 4)])
def test_batchnorm_inference(opset, shape, pools):
    """Against the formula in float64 (the reference evaluator fills in the default momentum
    and so runs versions 6 to 9 in training mode)."""
    rng = np.random.default_rng(11)
    inputs = _bn_inputs(shape, rng)
    attributes = {"epsilon": 1e-3}
    expected = _bn_expected(*inputs, epsilon=float(np.float32(1e-3)))
    if opset >= 14:
        np.testing.assert_allclose(_reference("BatchNormalization", inputs, attributes, opset=opset)[0],
                                   expected, rtol=8 * F32_EPS, atol=8 * F32_EPS)
    for threads in (1, 2):
        got = _run(normalization.BatchNormalization, "BatchNormalization", inputs, attributes,
                   opset=opset, pool=pools[threads])[0]
        np.testing.assert_allclose(got, expected, rtol=8 * F32_EPS, atol=8 * F32_EPS)


def test_batchnorm_opset1_consumed_inputs_and_spatial_0():
    rng = np.random.default_rng(12)
    inputs = _bn_inputs((2, 3, 4, 5), rng)
    got = _run(normalization.BatchNormalization, "BatchNormalization", inputs,
               {"consumed_inputs": [0, 0, 0, 1, 1], "is_test": 1}, opset=1)[0]
    np.testing.assert_allclose(got, _bn_expected(*inputs), rtol=8 * F32_EPS, atol=8 * F32_EPS)
    per_activation = _bn_inputs((2, 3, 4, 5), rng, parameter_shape=(3, 4, 5))
    got = _run(normalization.BatchNormalization, "BatchNormalization", per_activation,
               {"spatial": 0}, opset=7)[0]
    np.testing.assert_allclose(got, _bn_expected(*per_activation), rtol=8 * F32_EPS, atol=8 * F32_EPS)


def test_batchnorm_through_a_session_at_opset_1():
    rng = np.random.default_rng(13)
    x, scale, bias, mean, var = _bn_inputs((1, 3, 4, 4), rng)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                            consumed_inputs=[0, 0, 0, 1, 1], is_test=1)
    initializers = [helper.make_tensor(n, T.FLOAT, a.shape, a.reshape(-1).tolist())
                    for n, a in (("s", scale), ("b", bias), ("m", mean), ("v", var))]
    graph_inputs = [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 4, 4])] + [
        helper.make_tensor_value_info(n, T.FLOAT, [3]) for n in "sbmv"]  # IR 3: initializers too
    graph = helper.make_graph([node], "bn", graph_inputs,
                              [helper.make_tensor_value_info("y", T.FLOAT, [1, 3, 4, 4])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 1)])
    model.ir_version = 3
    got = RuntimeSession(model, num_threads=1).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, _bn_expected(x, scale, bias, mean, var), rtol=8 * F32_EPS,
                               atol=8 * F32_EPS)


def test_batchnorm_training_mode():
    rng = np.random.default_rng(14)
    inputs = _bn_inputs((3, 4, 5, 2), rng)
    attributes = {"training_mode": 1, "momentum": 0.8, "epsilon": 1e-4}
    expected = _reference("BatchNormalization", inputs, attributes, opset=15, outputs=3)
    got = _run(normalization.BatchNormalization, "BatchNormalization", inputs, attributes, opset=15,
               outputs=3)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, ml_dtypes.bfloat16])
def test_batchnorm_types(dtype):
    rng = np.random.default_rng(15)
    inputs = _bn_inputs((1, 3, 4, 4), rng, dtype)
    got = _run(normalization.BatchNormalization, "BatchNormalization", inputs, {}, opset=15)[0]
    assert got.dtype == dtype
    ulp = float(ml_dtypes.finfo(dtype).eps)
    np.testing.assert_allclose(got.astype(np.float64), _bn_expected(*inputs), rtol=2 * ulp,
                               atol=4 * ulp)


def test_batchnorm_errors():
    rng = np.random.default_rng(16)
    inputs = _bn_inputs((1, 3, 4), rng)
    with pytest.raises(KernelError, match="one per channel"):
        _run(normalization.BatchNormalization, "BatchNormalization",
             [inputs[0], *(v[:2] for v in inputs[1:])], {}, opset=15)
    with pytest.raises(KernelError, match="opset 14"):
        _run(normalization.BatchNormalization, "BatchNormalization", inputs, {}, opset=9, outputs=5)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 3, 5), (2, 2, 2, 3, 4)])
def test_instance_normalization(shape):
    rng = np.random.default_rng(17)
    x = rng.standard_normal(shape).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, shape[1]).astype(np.float32)
    bias = rng.standard_normal(shape[1]).astype(np.float32)
    expected = _reference("InstanceNormalization", [x, scale, bias], {"epsilon": 1e-3})[0]
    got = _run(normalization.InstanceNormalization, "InstanceNormalization", [x, scale, bias],
               {"epsilon": 1e-3})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [-1, 1, 0, -2])
def test_layer_normalization(axis):
    rng = np.random.default_rng(18)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    normalized = x.shape[axis % 3:]
    scale = rng.uniform(0.5, 1.5, normalized).astype(np.float32)
    bias = rng.standard_normal(normalized).astype(np.float32)
    attributes = {"axis": axis, "epsilon": 1e-3}
    expected = _reference("LayerNormalization", [x, scale, bias], attributes, opset=17, outputs=3)
    got = _run(normalization.LayerNormalization, "LayerNormalization", [x, scale, bias], attributes,
               opset=17, outputs=3)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _lists(low, high, size):
    return st.lists(st.integers(low, high), min_size=size, max_size=size)


@settings(deadline=None, derandomize=True, max_examples=60)
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 11), st.integers(1, 80), _lists(1, 4, 2),
       _lists(1, 3, 2), _lists(1, 2, 2), _lists(0, 2, 4), st.integers(0, 1),
       st.sampled_from([np.float32, np.float64, np.int8, np.uint8]))
def test_compiled_maxpool_equals_the_numpy_passes(n, c, h, w, kernel, strides, dilations, pads, ceil_mode,
                                                  dtype):
    """The compiled 2-D MaxPool against the separable numpy passes on the padded input (its
    former path), bitwise, NaN and infinities included, bytes at their extremes; rows up to 80
    wide, so that stride 2 takes the deinterleaving blocks of 32- and 64-byte vectors (16 or
    32 float32 columns, 64 or 128 bytes) and their ends."""
    pads = [min(p, (k - 1) * d) for p, k, d in zip(pads, kernel * 2, dilations * 2, strict=True)]
    attributes = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads,
                  "ceil_mode": ceil_mode}
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    assume(all(size + pads[i] + pads[i + 2] >= extents[i] for i, size in enumerate((h, w))))
    rng = np.random.default_rng(n * 1000 + h * 10 + w)
    if np.dtype(dtype).kind == "f":
        x = rng.standard_normal((n, c, h, w)).astype(dtype)
        x.reshape(-1)[rng.integers(0, x.size, 6)] = [np.nan, np.inf, -np.inf, np.nan, -np.inf, np.nan]
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max + 1, (n, c, h, w)).astype(dtype)
        x.reshape(-1)[rng.integers(0, x.size, 2)] = [info.min, info.max]
    kernel_object = pooling.MaxPool(NodeContext("pool", "MaxPool", "", 12, attributes,
                                                (T.FLOAT,), (T.FLOAT,), 1, 1))
    window = kernel_object.window(x)
    expected = np.empty((n * c, *window.output), dtype)
    padded = pooling.pad_spatial(x, window, pooling._lowest(x.dtype))
    pooling._separable(padded.reshape(n * c, *padded.shape[2:]), window, np.maximum, expected)
    for threads in (1, 2):
        with ThreadPool(threads) as pool:
            got = _run(pooling.MaxPool, "MaxPool", [x], attributes, opset=12, pool=pool)[0]
        np.testing.assert_array_equal(got.reshape(expected.shape), expected)
