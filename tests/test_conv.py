"""Conv: ONNX semantics against the reference, every configuration against the reference
configuration, the schemas, and the calibration callback.

Tolerances follow the bound stated in ``onnx_light.kernels.conv.numerics`` (:func:`error_bound`):
two results that sum the same ``K = C/group * prod(kernel)`` products in different orders
differ by at most ``2 (K + 2) u (|W| * |X| + |B|)``, ``u`` the unit roundoff of the compute
type (float32 for float16 and bfloat16), plus one unit in the last place of a narrower
output type.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import conv
from onnx_light.kernels import register as register_library
from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.kernels.conv.channel_blocked import vector_lanes
from onnx_light.kernels.conv.config import DEPTHWISE_COST
from onnx_light.parallel import BLAS, ThreadPool
from onnx_light.tuning.calibration import Budget
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.processor import execution_descriptor
from onnx_light.tuning.registry import KernelTuningRegistry

T = TensorProto
DTYPES = {T.FLOAT: np.float32, T.DOUBLE: np.float64, T.FLOAT16: np.float16,
          T.BFLOAT16: ml_dtypes.bfloat16}

# (X shape, W shape, attributes): 1-D, 2-D and 3-D; pads, auto_pad, strides, dilations, groups.
CASES = [
    ((1, 3, 10, 11), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 9, 9), (6, 2, 3, 3), {"pads": [1, 0, 2, 1], "strides": [2, 1], "group": 2}),
    ((1, 6, 8, 8), (6, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 6}),
    ((2, 6, 8, 7), (12, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 6, "strides": [2, 2]}),
    ((1, 8, 7, 7), (5, 8, 1, 1), {}),
    ((2, 8, 7, 5), (6, 4, 1, 1), {"group": 2}),
    ((1, 8, 9, 9), (6, 8, 1, 1), {"strides": [2, 2]}),
    ((1, 3, 12, 12), (4, 3, 3, 3), {"dilations": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 12, 11), (4, 3, 3, 2), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 3, 12, 11), (4, 3, 4, 2), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 12, 11), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [1, 2]}),
    ((1, 2, 9, 9), (3, 2, 3, 3), {"kernel_shape": [3, 3], "dilations": [1, 2], "pads": [0, 2, 1, 0]}),
    ((1, 3, 20), (4, 3, 5), {"pads": [2, 1], "strides": [2]}),
    ((2, 4, 16), (4, 1, 3), {"pads": [1, 1], "group": 4, "dilations": [2]}),
    ((1, 3, 9), (2, 3, 1), {}),
    ((1, 2, 5, 6, 7), (3, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 0], "dilations": [1, 2, 1]}),
    ((1, 2, 5, 6, 7), (4, 1, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1], "group": 2}),
    ((1, 4, 4, 5, 6), (4, 1, 2, 2, 2), {"strides": [2, 1, 2], "group": 4, "auto_pad": "SAME_UPPER"}),
    ((1, 3, 30, 30), (8, 3, 11, 11), {"strides": [4, 4]}),
]
CASE_IDS = [f"{len(x) - 2}d-{i}" for i, (x, _, _) in enumerate(CASES)]


@pytest.fixture(scope="module")
def pools():
    with ThreadPool(1) as one, ThreadPool(2) as two:
        yield {1: one, 2: two}


def _model(attributes, element_type, bias):
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    node = helper.make_node("Conv", inputs, ["y"], **attributes)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info(n, element_type, None)
                                               for n in inputs],
                              [helper.make_tensor_value_info("y", element_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def _reference(x, w, b, attributes):
    feeds = {"x": x, "w": w} | ({"b": b} if b is not None else {})
    element_type = helper.np_dtype_to_tensor_dtype(x.dtype)
    return ReferenceEvaluator(_model(attributes, element_type, b is not None)).run(None, feeds)[0]


def _kernel(attributes, element_type=T.FLOAT, values=None, pool=None, bias=True, opset=22):
    inputs = 3 if bias else 2
    ctx = NodeContext("conv", "Conv", "", opset, attributes, (element_type,) * inputs, (element_type,),
                      inputs, 1)
    kernel = conv.ConvKernel(ctx)
    kernel.bind(pool if pool is not None else ThreadPool(1)).configure(values)
    return kernel


def _inputs(x_shape, w_shape, dtype, rng, bias=True):
    x = rng.uniform(-1, 1, x_shape).astype(np.float32).astype(dtype)
    w = rng.uniform(-1, 1, w_shape).astype(np.float32).astype(dtype)
    b = rng.uniform(-1, 1, w_shape[0]).astype(np.float32).astype(dtype) if bias else None
    return x, w, b


def _window_attributes(attributes):
    return {k: v for k, v in attributes.items() if k != "group"}


def _assert_within(got, expected, bound):
    assert got.shape == expected.shape
    error = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    worst = np.argmax(error - bound)
    assert np.all(error <= bound), (f"error {error.flat[worst]} above bound {bound.flat[worst]} "
                                    f"(max error {error.max()})")


@pytest.mark.parametrize(("x_shape", "w_shape", "attributes"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_reference_evaluator(x_shape, w_shape, attributes, bias):
    rng = np.random.default_rng(1)
    x, w, b = _inputs(x_shape, w_shape, np.float32, rng, bias)
    expected = _reference(x, w, b, attributes)
    inputs = (x, w, b) if bias else (x, w)
    got = _kernel(attributes, bias=bias).run(*inputs)[0]
    assert got.dtype == np.float32
    bound = conv.error_bound(x, w, b, group=attributes.get("group", 1), **_window_attributes(attributes))
    _assert_within(got, expected, bound)


@pytest.mark.parametrize("element_type", [T.DOUBLE, T.FLOAT16, T.BFLOAT16],
                         ids=["double", "float16", "bfloat16"])
@pytest.mark.parametrize(("x_shape", "w_shape", "attributes"), CASES[:6] + CASES[12:13],
                         ids=CASE_IDS[:6] + CASE_IDS[12:13])
def test_other_types(x_shape, w_shape, attributes, element_type):
    """double computes in double; float16 and bfloat16 in float32, rounded once."""
    dtype = DTYPES[element_type]
    rng = np.random.default_rng(2)
    x, w, b = _inputs(x_shape, w_shape, dtype, rng)
    wide = np.float64 if element_type == T.DOUBLE else np.float32
    expected = _reference(x.astype(wide), w.astype(wide), b.astype(wide), attributes)
    got = _kernel(attributes, element_type).run(x, w, b)[0]
    assert got.dtype == dtype
    bound = conv.error_bound(x, w, b, group=attributes.get("group", 1), compute_dtype=wide,
                             output_dtype=dtype, reference=expected, **_window_attributes(attributes))
    _assert_within(got, expected, bound)


def _configurations():
    """Every algorithm and split, small and large blocks, serial and parallel."""
    block_sizes = (64, 1 << 21)
    defaults = dict(conv.conv_schema(T.FLOAT).defaults)
    names = (conv.ALGORITHM, conv.SPLIT, conv.BLOCK_BYTES, conv.MINIMUM_FLOPS)
    return [{**defaults, **dict(zip(names, values, strict=True))}
            for values in itertools.product(conv.ALGORITHMS, conv.SPLITS, block_sizes, (1, 1 << 62))]


@pytest.mark.parametrize(("x_shape", "w_shape", "attributes"), CASES, ids=CASE_IDS)
def test_every_configuration_matches_the_reference_configuration(pools, x_shape, w_shape, attributes):
    rng = np.random.default_rng(3)
    x, w, b = _inputs(x_shape, w_shape, np.float32, rng)
    reference = _kernel(attributes, values=conv.REFERENCE, pool=pools[1]).run(x, w, b)[0]
    bound = conv.error_bound(x, w, b, group=attributes.get("group", 1), **_window_attributes(attributes))
    for values in _configurations():
        for threads in (1, 2):
            kernel = _kernel(attributes, values=values, pool=pools[threads])
            got = kernel.run(x, w, b)[0]
            assert got.dtype == reference.dtype, values
            _assert_within(got, reference, bound)


def test_configurations_with_float16_and_batches(pools):
    rng = np.random.default_rng(4)
    attributes = {"pads": [1, 1, 1, 1], "group": 2}
    x, w, b = _inputs((3, 4, 9, 8), (6, 2, 3, 3), np.float16, rng)
    reference = _kernel(attributes, T.FLOAT16, conv.REFERENCE, pools[1]).run(x, w, b)[0]
    bound = conv.error_bound(x, w, b, group=2, compute_dtype=np.float32, output_dtype=np.float16,
                             reference=reference, pads=[1, 1, 1, 1])
    for values in _configurations():
        got = _kernel(attributes, T.FLOAT16, values, pools[2]).run(x, w, b)[0]
        _assert_within(got, reference, bound)


def test_auto_choices():
    """``auto`` picks the specialised algorithm where it applies, im2col elsewhere."""
    def choice(x_shape, w_shape, attributes, values=None):
        return _kernel(attributes, values=values).problem(x_shape, w_shape).algorithm

    assert choice((1, 8, 7, 7), (4, 8, 1, 1), {}) == "direct_1x1"
    assert choice((1, 8, 5, 5), (100, 8, 1, 1), {}) == "direct_1x1"  # per_filter: only if forced
    assert choice((1, 8, 5, 5), (100, 4, 1, 1), {"group": 2}) == "direct_1x1"
    assert choice((1, 8, 7, 7), (4, 8, 1, 1), {"strides": [2, 2]}) == "im2col"
    depthwise = {"group": 8, "pads": [1, 1, 1, 1]}
    # float32 with AVX-512 or AVX2: the channel-blocked kernel (test_conv_channel_blocked.py)
    assert choice((1, 8, 7, 7), (8, 1, 3, 3), depthwise) == (
        "depthwise_blocked" if vector_lanes() else "depthwise")
    assert choice((1, 8, 7, 7), (8, 1, 3, 3), depthwise, {conv.BLOCKED_OUTPUTS: 0}) == "depthwise"
    assert choice((1, 8, 7, 7), (16, 1, 3, 3), {**depthwise, "strides": [2, 2]}) == "depthwise"
    assert choice((1, 8, 20), (8, 1, 5), {"group": 8}) == "depthwise"  # 1-D
    assert choice((1, 8, 4, 5, 6), (8, 1, 3, 3, 3), {"group": 8}) == "im2col_wide"  # 3-D
    batched = {conv.AUTO_DEPTHWISE: "im2col_wide"}
    assert choice((1, 8, 7, 7), (8, 1, 3, 3), depthwise, batched) == "im2col_wide"
    assert choice((1, 8, 7, 7), (8, 1, 3, 3), {**depthwise, "strides": [2, 2]}, batched) == "im2col"
    assert choice((1, 8, 28, 28), (8, 1, 3, 3), depthwise, batched) == "im2col_wide"
    assert choice((1, 8, 7, 7), (8, 1, 3, 3), {"group": 8}, {conv.ALGORITHM: "depthwise"}) == "depthwise"
    assert choice((1, 8, 4, 5, 6), (8, 1, 3, 3, 3), {"group": 8},
                  {conv.ALGORITHM: "depthwise"}) == "im2col"  # 3-D: does not apply
    assert choice((1, 8, 56, 56), (4, 8, 3, 3), {"pads": [1, 1, 1, 1]}) == "shifted"  # 4 <= 8 / 2
    assert choice((1, 8, 56, 56), (5, 8, 3, 3), {"pads": [1, 1, 1, 1]}) == "im2col_wide"  # 5 > 8 / 2
    assert choice((1, 8, 27, 27), (4, 8, 3, 3), {"pads": [1, 1, 1, 1]}) == "im2col_wide"  # 729 < 784
    assert choice((1, 8, 56, 56), (4, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [1, 2]}) == "im2col"
    assert choice((1, 4, 20), (2, 4, 3), {}, {conv.ALGORITHM: "shifted"}) == "im2col"  # 1-D
    assert choice((1, 8, 7, 7), (4, 8, 3, 3), {"pads": [1, 1, 1, 1]}) == "im2col"  # 9/7 wide
    assert choice((1, 3, 20), (4, 3, 5), {}) == "im2col"
    # forced where it does not apply: im2col
    forced = {conv.ALGORITHM: "direct_1x1"}
    assert choice((1, 8, 7, 7), (4, 8, 3, 3), {}, forced) == "im2col"
    assert choice((1, 8, 7, 7), (4, 8, 3, 3), {}, {conv.ALGORITHM: "depthwise"}) == "im2col"


def test_parallel_plans(pools):
    def plan(x_shape, w_shape, attributes, split, threads=2, minimum=1, algorithm="auto"):
        values = {conv.SPLIT: split, conv.MINIMUM_FLOPS: minimum, conv.ALGORITHM: algorithm}
        return _kernel(attributes, values=values, pool=pools[threads]).problem(x_shape, w_shape).plan

    assert plan((1, 8, 7, 7), (4, 8, 3, 3), {}, "auto", threads=1) == "serial"
    assert plan((1, 8, 7, 7), (4, 8, 3, 3), {}, "auto", minimum=1 << 40) == "serial"
    assert plan((1, 8, 7, 7), (4, 8, 3, 3), {}, "auto") == "output_rows"
    assert plan((4, 8, 7, 7), (4, 8, 3, 3), {}, "auto") == "batch_and_groups"
    assert plan((1, 8, 7, 7), (8, 1, 3, 3), {"group": 8}, "auto", algorithm="im2col_wide") \
        == "batch_and_groups"
    assert plan((1, 64, 7, 7), (128, 64, 3, 3), {}, "auto") == "filters"  # 128 filters, 25 outputs
    # a strided 1x1 convolution (im2col) with more filters than outputs: the filters
    assert plan((1, 16, 28, 28), (256, 16, 1, 1), {"strides": [2, 2]}, "auto") == "filters"
    assert plan((1, 16, 28, 28), (128, 16, 1, 1), {"strides": [2, 2]}, "auto") == "output_rows"
    assert plan((1, 8, 7, 7), (4, 8, 3, 3), {}, "batch_and_groups") == "output_rows"  # one pair
    assert plan((2, 8, 1, 1), (4, 8, 1, 1), {}, "output_rows") == "filters"  # one row
    assert plan((2, 8, 1, 1), (1, 8, 1, 1), {}, "output_rows") == "batch_and_groups"  # one filter
    assert plan((1, 8, 1, 1), (1, 8, 1, 1), {}, "output_rows") == "blas"
    assert plan((1, 8, 4, 7, 7), (8, 1, 3, 3, 3), {"group": 8}, "filters") == "filters"  # 3-D: im2col
    # the compiled depthwise and stem kernels split inside their call, whatever the split,
    # from parallel.region_flops multiply-adds (x DEPTHWISE_COST for depthwise ones) on
    for algorithm, w_shape, attributes in (("depthwise", (8, 1, 3, 3), {"group": 8}),
                                           ("filters_blocked", (8, 3, 3, 3), {})):
        x_shape = (1, w_shape[1] * attributes.get("group", 1), 7, 7)
        flops = 8 * 25 * w_shape[1] * 9 * (DEPTHWISE_COST if w_shape[1] == 1 else 1)
        for split, region, expected in (("filters", 1, "region"), ("auto", flops, "region"),
                                        ("auto", flops + 1, "serial"), ("blas", 1, "serial")):
            values = {conv.ALGORITHM: algorithm, conv.SPLIT: split, conv.REGION_FLOPS: region}
            assert _kernel(attributes, values=values, pool=pools[2]).problem(x_shape, w_shape).plan \
                == expected
            assert _kernel(attributes, values=values, pool=pools[1]).problem(x_shape, w_shape).plan \
                == "serial"
    assert plan((1, 8, 7, 7), (4, 8, 3, 3), {}, "filters") == "filters"
    assert plan((1, 8, 7, 7), (4, 8, 3, 3), {}, "blas") == "blas"


@pytest.mark.parametrize(("x_shape", "w_shape", "attributes"), [
    ((1, 8, 7, 7), (5, 8, 1, 1), {}),
    ((2, 8, 7, 5), (6, 4, 1, 1), {"group": 2}),
    ((1, 6, 3, 3), (40, 6, 1, 1), {}),  # more filters than positions: the filters split
])
def test_a_prologue_gives_what_the_mapped_input_gives(pools, x_shape, w_shape, attributes):
    """Every configuration with a prologue (per-channel affine + Relu on the input) gives what
    the same configuration gives on the mapped input: within the bound (per_filter's 1-row
    products round by the input's layout, which the prologue makes contiguous), bit for bit
    with the portable values."""
    rng = np.random.default_rng(5)
    x, w, b = _inputs(x_shape, w_shape, np.float32, rng)
    channels = x_shape[1]
    multiplier, offset = rng.uniform(-2, 2, channels), rng.uniform(-1, 1, channels)

    def relu(a):
        np.maximum(a, 0, out=a)

    prologue = conv.Prologue(multiplier, offset, relu)
    shape = (1, channels) + (1,) * (len(x_shape) - 2)
    mapped = x * multiplier.astype(np.float32).reshape(shape) + offset.astype(np.float32).reshape(shape)
    relu(mapped)
    np.testing.assert_array_equal(prologue.whole(x), mapped)
    assert _kernel(attributes).accepts_prologue(w_shape)
    bound = conv.error_bound(mapped, w, b, group=attributes.get("group", 1))
    for values in _configurations():
        for threads in (1, 2):
            plain = _kernel(attributes, values=values, pool=pools[threads])
            fused = _kernel(attributes, values=values, pool=pools[threads])
            fused.prologue = prologue
            _assert_within(fused.run(x, w, b)[0], plain.run(mapped, w, b)[0], bound)
    for threads in (1, 2):
        fused = _kernel(attributes, pool=pools[threads])
        fused.prologue = prologue
        np.testing.assert_array_equal(fused.run(x, w, b)[0],
                                      _kernel(attributes, pool=pools[threads]).run(mapped, w, b)[0])
    # a scalar parameter broadcasts over the channels
    scalar = conv.Prologue(np.array([2.0]), np.array([-0.5]), None)
    fused = _kernel(attributes, pool=pools[2])
    fused.prologue = scalar
    np.testing.assert_array_equal(fused.run(x, w, b)[0], _kernel(attributes, pool=pools[2]).run(
        x * np.float32(2.0) + np.float32(-0.5), w, b)[0])


def test_only_1x1_unit_stride_unpadded_convolutions_accept_a_prologue():
    assert _kernel({}).accepts_prologue((4, 8, 1, 1))
    assert _kernel({"auto_pad": "SAME_UPPER"}).accepts_prologue((4, 8, 1, 1))
    assert not _kernel({}).accepts_prologue((4, 8, 3, 3))
    assert not _kernel({"strides": [2, 2]}).accepts_prologue((4, 8, 1, 1))
    assert not _kernel({"pads": [0, 0, 1, 1]}).accepts_prologue((4, 8, 1, 1))


def _equal_filters(filters=200, kernel_size=1):
    rng = np.random.default_rng(8)
    x = (rng.uniform(0, 1e6, (1, 96, 6, 6))).astype(np.float32)
    w = np.tile(rng.uniform(0, 1, (1, 96, kernel_size, kernel_size)).astype(np.float32),
                (filters, 1, 1, 1))
    return x, w


def _channels_equal(out, channels=slice(None)):
    part = out[:, channels]
    return np.array_equal(part, np.broadcast_to(part[:, :1], part.shape))


def test_equal_filters_give_bitwise_equal_channels_with_per_filter(pools):
    """Forced per_filter: equal filters give equal channels even with non-constant weights."""
    x, w = _equal_filters()
    b = np.zeros(200, np.float32)
    for split in conv.SPLITS:
        for threads in (1, 2):
            values = {conv.ALGORITHM: "per_filter", conv.SPLIT: split, conv.MINIMUM_FLOPS: 1}
            kernel = _kernel({}, values=values, pool=pools[threads])
            assert kernel.problem(x.shape, w.shape).algorithm == "per_filter"
            assert _channels_equal(kernel.run(x, w, b)[0]), (split, threads)


@pytest.mark.parametrize("kernel_size", [1, 3])
def test_constant_equal_filters_are_computed_once(pools, kernel_size):
    """What ONNX's light SqueezeNet needs: its last 1x1 convolution has 1000 equal filters and
    a softmax of logits near 1e10 follows, so one last-bit difference changes the output. A
    kernel specialized for constant weights computes each distinct filter once."""
    x, w = _equal_filters(kernel_size=kernel_size)
    w[150:] *= 2  # two distinct filters: channels 0-149 and 150-199
    b = np.linspace(-1, 1, 200).astype(np.float32)
    attributes = {"pads": [kernel_size // 2] * 4}
    for threads in (1, 2):
        kernel = _kernel(attributes, values={conv.MINIMUM_FLOPS: 1}, pool=pools[threads])
        plain = kernel.run(x, w, None)[0]  # one blocked product: channels may differ in the last bit
        special = kernel.specialize([None, w, b])
        assert special is not None and kernel.specialize([None, None, b]) is None
        out = special.run(x, w, None)[0]
        assert _channels_equal(out, slice(0, 150)) and _channels_equal(out, slice(150, 200))
        np.testing.assert_allclose(out, plain, rtol=1e-5)
        with_bias = special.run(x, w, b)[0]
        np.testing.assert_array_equal(with_bias, out + b.reshape(-1, 1, 1))
        other = w.copy()  # other weights than the constant ones: the general path
        np.testing.assert_array_equal(special.run(x, other, None)[0], plain)
    distinct = np.random.default_rng(1).standard_normal(w.shape).astype(np.float32)
    special = _kernel(attributes).specialize([None, distinct, None])  # 3x3: kept for winograd
    assert special is None or special._distinct is None


@pytest.mark.parametrize(("x_shape", "w_shape", "attributes"),
                         [CASES[0], CASES[1], CASES[2], CASES[4], CASES[13], CASES[16]],
                         ids=[CASE_IDS[i] for i in (0, 1, 2, 4, 13, 16)])
def test_a_residual_is_added_to_every_block_before_the_epilogue(pools, x_shape, w_shape, attributes):
    """Every configuration with a residual input gives exactly the convolution plus the
    residual, then the activation: the same one addition per element, block by block."""
    rng = np.random.default_rng(6)
    x, w, b = _inputs(x_shape, w_shape, np.float32, rng)

    def relu(a):
        np.maximum(a, 0, out=a)

    shape = _kernel(attributes, pool=pools[1]).run(x, w, b)[0].shape
    residual = rng.uniform(-1, 1, shape).astype(np.float32)
    winograd_too = [{**values, conv.ALGORITHM: "winograd"} for values in _configurations()[:4]]
    for values in _configurations() + winograd_too:
        for threads in (1, 2):
            plain = _kernel(attributes, values=values, pool=pools[threads])
            expected = plain.run(x, w, b)[0] + residual
            relu(expected)
            fused = _kernel(attributes, values=values, pool=pools[threads])
            fused.residual, fused.epilogue = True, relu
            np.testing.assert_array_equal(fused.run(x, w, b, residual)[0], expected)


def test_a_residual_with_equal_filters_and_its_errors(pools):
    x, w = _equal_filters(filters=8)
    b = np.linspace(-1, 1, 8).astype(np.float32)
    kernel = _kernel({}, pool=pools[2])
    kernel.residual = True
    special = kernel.specialize([None, w, b])
    assert special is not None and special._distinct is not None
    residual = np.random.default_rng(2).uniform(-1, 1, (1, 8, 6, 6)).astype(np.float32)
    plain = _kernel({}, pool=pools[2]).specialize([None, w, b])
    np.testing.assert_array_equal(special.run(x, w, b, residual)[0],
                                  plain.run(x, w, b)[0] + residual)
    with pytest.raises(KernelError, match="needs the residual input"):
        kernel.run(x, w, b)
    with pytest.raises(KernelError, match=r"residual must have the output's shape \[1, 8, 6, 6\]"):
        kernel.run(x, w, b, residual[:, :4])


def test_blas_threads_never_exceed_the_pool(pools, monkeypatch):
    requested = []
    original = BLAS.limit

    def spy(num_threads):
        requested.append(num_threads)
        return original(num_threads)

    monkeypatch.setattr(BLAS, "limit", spy)
    rng = np.random.default_rng(5)
    x, w, b = _inputs((1, 8, 12, 12), (8, 8, 3, 3), np.float32, rng)
    for threads in (1, 2):
        for split in conv.SPLITS:
            _kernel({"pads": [1, 1, 1, 1]}, values={conv.SPLIT: split, conv.MINIMUM_FLOPS: 1},
                    pool=pools[threads]).run(x, w, b)
            assert requested and max(requested) <= threads
            requested.clear()
    _kernel({}, values={conv.SPLIT: "blas", conv.MINIMUM_FLOPS: 1}, pool=pools[2]).run(x, w, b)
    assert requested == [2]


def test_run_keeps_no_state(pools):
    """configure decides everything; run reads the configuration and changes nothing."""
    kernel = _kernel({"pads": [1, 1, 1, 1]}, values={conv.MINIMUM_FLOPS: 1}, pool=pools[2])
    before = dict(vars(kernel))
    rng = np.random.default_rng(6)
    kernel.run(*_inputs((1, 4, 9, 9), (4, 4, 3, 3), np.float32, rng))
    assert vars(kernel) == before
    assert isinstance(kernel.config, conv.ConvConfig)


def test_inputs_are_not_modified():
    rng = np.random.default_rng(7)
    x, w, b = _inputs((1, 4, 6, 6), (4, 1, 3, 3), np.float32, rng)
    for array in (x, w, b):
        array.flags.writeable = False
    for algorithm in conv.ALGORITHMS:
        _kernel({"group": 4, "pads": [1, 1, 1, 1]}, values={conv.ALGORITHM: algorithm}).run(x, w, b)


def test_empty_batch_and_output():
    kernel = _kernel({})
    out = kernel.run(np.zeros((0, 3, 5, 5), np.float32), np.zeros((2, 3, 3, 3), np.float32),
                     np.zeros(2, np.float32))[0]
    assert out.shape == (0, 2, 3, 3)


@pytest.mark.parametrize(("x_shape", "w_shape", "attributes", "message"), [
    ((1, 4, 5, 5), (2, 3, 3, 3), {}, "channels"),
    ((1, 4, 5, 5), (3, 2, 3, 3), {"group": 2}, "groups"),
    ((1, 4, 5), (2, 4, 3, 3), {}, "rank"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"kernel_shape": [2, 2]}, "kernel_shape"),
    ((1, 4, 5, 5), (2, 4, 3, 3), {"strides": [1]}, "strides"),
    ((1, 4, 2, 2), (2, 4, 3, 3), {}, "does not fit"),
])
def test_shape_errors_name_the_node(x_shape, w_shape, attributes, message):
    kernel = _kernel(attributes, bias=False)
    with pytest.raises(KernelError, match=message):
        kernel.run(np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32))


def test_attribute_and_type_errors():
    with pytest.raises(KernelError, match="auto_pad"):
        _kernel({"auto_pad": "SAME"})
    with pytest.raises(KernelError, match="group"):
        _kernel({"group": 0})
    with pytest.raises(KernelError, match=r"Conv-11 \(opset 11\) does not take element type bfloat16"):
        _kernel({}, T.BFLOAT16, opset=11)
    kernel = _kernel({})
    with pytest.raises(KernelError, match="B must have shape"):
        kernel.run(np.zeros((1, 2, 3, 3), np.float32), np.zeros((2, 2, 1, 1), np.float32),
                   np.zeros(3, np.float32))


def test_schemas_and_configuration_validation():
    keys = [schema.key for schema in conv.tuning_schemas()]
    assert sorted(keys) == sorted(KernelTuningKey("onnx_light", "Conv", "portable", t, tuning_abi=9)
                                  for t in conv.CONV_TYPES)
    schema = conv.conv_schema(T.FLOAT)
    assert dict(schema.defaults) == {conv.ALGORITHM: "auto", conv.BLOCK_BYTES: 1 << 24,
                                     conv.SPLIT: "auto", conv.MINIMUM_FLOPS: 1 << 22,
                                     conv.WINOGRAD_CHANNELS: 256, conv.WINOGRAD_OUTPUTS: 784,
                                     conv.LARGE_TILE_CHANNELS: 64, conv.LARGE_TILE_OUTPUTS: 3136,
                                     conv.AUTO_DEPTHWISE: "depthwise",
                                     conv.BLOCKED_OUTPUTS: 3136,
                                     conv.FILTERS_BLOCKED_TAPS: 75,
                                     conv.POINTWISE_PRODUCT: "blas",
                                     conv.POINTWISE_MINIMUM_FLOPS: 1 << 23,
                                     conv.POINTWISE_TRANSPOSED: 0, conv.POINTWISE_ROWS: 0,
                                     conv.REGION_FLOPS: 1 << 23,
                                     conv.COLUMNS_CHANNELS: 16,
                                     conv.COLUMNS_TILE: 1 << 16,
                                     conv.UNITS_COLUMNS: 0}
    schema.validate(conv.REFERENCE)
    for values in _configurations():
        schema.validate(values)
    kernel = _kernel({})
    with pytest.raises(KernelError, match="algorithm"):
        kernel.bind(ThreadPool(1)).configure({conv.ALGORITHM: "fft"})
    with pytest.raises(KernelError, match="unknown"):
        kernel.bind(ThreadPool(1)).configure({"parallel.mode": "blas"})
    with pytest.raises(KernelError, match="minimum"):
        kernel.bind(ThreadPool(1)).configure({conv.BLOCK_BYTES: 0})
    with pytest.raises(ValueError, match="no Conv schema"):
        conv.conv_schema(T.INT32)


def test_library_registers_conv_schemas_and_callbacks():
    registry = KernelTuningRegistry()
    register_library(registry)
    snapshot = registry.snapshot()
    for schema in conv.tuning_schemas():
        assert snapshot.schema(schema.key) == schema
        assert snapshot.callback(schema.key).func is conv.calibrate_conv


def test_tune_kernels_proposes_conv_for_calibration(tmp_path):
    """``tune-kernels --apply`` covers Conv: its keys are missing and calibratable."""
    from onnx_light import propose_kernel_tuning_updates

    proposal = propose_kernel_tuning_updates("Conv", path=tmp_path / "cache.txt", num_threads=2)
    assert sorted(proposal["missing_calibratable"]) == sorted(str(s.key) for s in conv.tuning_schemas())
    assert proposal["missing_schema_only"] == []


SMALL_CORPUS = (
    conv.CorpusCase("tiny_3x3", "test", 4, (10, 10), 6, (3, 3), pads=(1, 1, 1, 1)),
    conv.CorpusCase("tiny_depthwise", "test", 6, (9, 9), 6, (3, 3), (2, 2), (1, 1, 1, 1), group=6),
    conv.CorpusCase("tiny_1x1", "test", 8, (7, 7), 4, (1, 1)),
)


class FakeTimer:
    """Time advances only when read: every configuration looks equally fast."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-3
        return self.now


def test_calibration_validates_and_keeps_portable_without_a_gain():
    key = conv.conv_schema(T.FLOAT).key
    descriptor = execution_descriptor(1)
    result = conv.calibrate_conv(conv.DECLARATIONS[0], key, descriptor, Budget(60.0, 1 << 30, 1),
                                 timer=FakeTimer(), corpus=SMALL_CORPUS)
    assert result.portable_kept
    assert result.values == dict(conv.conv_schema(T.FLOAT).defaults)
    cases = {m.case for m in result.measurements}
    assert cases == {case.name for case in SMALL_CORPUS}
    assert len(result.measurements) == len(SMALL_CORPUS) * len(conv.candidate_grid())
    assert "corpus of 3 convolutions" in result.diagnostics[0]


def test_calibration_within_a_tiny_budget_keeps_portable():
    key = conv.conv_schema(T.FLOAT16).key
    result = conv.calibrate_conv(conv.DECLARATIONS[0], key, execution_descriptor(1),
                                 Budget(1e-9, 1 << 30, 1), corpus=SMALL_CORPUS)
    assert result.portable_kept
    assert any("not covered" in d for d in result.diagnostics)


def test_calibration_problem_checks_the_bound():
    problem = conv.ConvCalibrationProblem(T.FLOAT, ThreadPool(1), SMALL_CORPUS)
    inputs = problem.make_inputs("tiny_3x3")
    reference = problem.run(conv.REFERENCE, inputs)
    assert problem.same_output(reference, problem.run(dict(conv.conv_schema(T.FLOAT).defaults), inputs))
    wrong = (reference[0] + 1e-3, reference[1])
    assert not problem.same_output(reference, wrong)
    assert problem.work("tiny_3x3") == 6 * 100 * 4 * 9
    assert problem.input_bytes("tiny_3x3") > 0


def test_corpus_comes_from_the_real_models():
    names = {case.name for case in conv.CORPUS}
    assert {"resnet50_stem_7x7s2", "shufflenet_depthwise", "alexnet_11x11s4", "vgg19_3x3_14x14"} <= names
    for case in conv.CORPUS:
        assert case.flops > 0
        assert case.window().output[0] > 0


def test_filters_with_equal_bit_sums_but_different_values_are_not_merged():
    """The grouping by bit sums is only a first pass: a permuted filter has the same sum."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    permuted = base.reshape(-1)[::-1].reshape(base.shape)
    w = np.concatenate([base, base, permuted])
    kernel = _kernel({"pads": [1, 1, 1, 1]})
    assert kernel.specialize([None, w, None]) is None


@pytest.mark.parametrize("threads", [1, 2])
def test_the_settled_direct_calls_give_the_general_paths_values(threads):
    """A session's settled pointwise (with a residual and a Relu, and on 1x1 planes) and
    depthwise convolutions take their call bound at settle (``_direct``): the values of the
    general path, bit for bit."""
    from onnx import numpy_helper

    from onnx_light.runtime import RuntimeSession

    rng = np.random.default_rng(31)

    def weights(name, shape):
        return numpy_helper.from_array(rng.uniform(-1, 1, shape).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=6, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["d", "wp", "bp"], ["p"]),
             helper.make_node("Add", ["p", "x"], ["r"]), helper.make_node("Relu", ["r"], ["y"]),
             helper.make_node("GlobalAveragePool", ["y"], ["g"]),
             helper.make_node("Conv", ["g", "wv"], ["v"]), helper.make_node("Neg", ["v"], ["z"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6, "h", "w"])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "z")],
        [weights("wd", [6, 1, 3, 3]), weights("bd", [6]), weights("wp", [6, 6, 1, 1]),
         weights("bp", [6]), weights("wv", [5, 6, 1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 9
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 7
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    session = RuntimeSession(model, num_threads=threads)
    convs = [kernel for kernel, _, _ in session._steps if isinstance(kernel, conv.ConvKernel)]
    assert len(convs) == 3 and all(kernel._direct is not None for kernel in convs)
    x = rng.standard_normal((2, 6, 9, 7)).astype(np.float32)
    got = session.run(None, {"x": x})
    for kernel in convs:
        kernel._direct = None
    expected = session.run(None, {"x": x})
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    reference = ReferenceEvaluator(model).run(None, {"x": x})
    for a, b in zip(got, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
