"""Conv's winograd algorithm: the F(2x2, 3x3) arithmetic, when auto picks it, the constant
filter transform, and its error bound; with the shifted algorithm on random shapes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T

from onnx_light.kernels import conv
from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.conv import winograd
from onnx_light.parallel import ThreadPool

FORCED = {conv.ALGORITHM: "winograd"}
# thresholds that let the tests' 128-channel, 14x14 convolutions use winograd under auto
LOW = {conv.WINOGRAD_CHANNELS: 128, conv.WINOGRAD_OUTPUTS: 196}


def _kernel(attributes, values=None, threads=1, element_type=T.FLOAT):
    ctx = NodeContext("conv", "Conv", "", 22, attributes, (element_type,) * 3, (element_type,), 3, 1)
    kernel = conv.ConvKernel(ctx)
    kernel.bind(ThreadPool(threads)).configure(values)
    return kernel


def _inputs(x_shape, w_shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, x_shape).astype(dtype), rng.uniform(-1, 1, w_shape).astype(dtype),
            rng.uniform(-1, 1, w_shape[0]).astype(dtype))


def test_one_tile_is_the_correlation_exactly():
    """A^T [(G g G^T) * (B^T d B)] A is the 2x2 valid correlation of a 4x4 tile (float64)."""
    rng = np.random.default_rng(0)
    d = rng.integers(-8, 8, (1, 4, 4)).astype(np.float64)
    g = rng.integers(-8, 8, (1, 3, 3)).astype(np.float64)
    v = winograd.transform_inputs(d, (1, 1), np.empty((4, 4, 1, 1, 1)), np.empty((4, 1, 1, 4)))
    u = winograd.transform_filters(g, np.float64)  # (16, 1)
    m = (u.reshape(16, 1) * v.reshape(16, 1)).reshape(4, 4, 1, 1, 1)
    y = winograd.transform_outputs(m, np.empty((1, 1, 2, 1, 2)), np.empty((2, 4, 1, 1, 1)))
    expected = [[np.sum(d[0, i:i + 3, j:j + 3] * g[0]) for j in range(2)] for i in range(2)]
    np.testing.assert_array_equal(y.reshape(2, 2), expected)


def test_combine_takes_only_unit_coefficients():
    out = np.empty(3)
    terms = [np.ones(3), np.full(3, 2.0)]
    np.testing.assert_array_equal(winograd.combine([1, -1], terms, out), [-1, -1, -1])
    np.testing.assert_array_equal(winograd.combine([0, 0], terms, out), [0, 0, 0])
    with pytest.raises(ValueError, match=r"coefficient 0\.5"):
        winograd.combine([0.5, 1], terms, out)


@pytest.mark.parametrize(("x_shape", "w_shape", "attributes"), [
    ((1, 5, 9, 9), (4, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 8, 11), (6, 2, 3, 3), {"pads": [0, 2, 1, 0], "group": 2}),  # odd output, groups
    ((1, 3, 3, 3), (2, 3, 3, 3), {}),  # one output
    ((1, 3, 6, 7), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER"}),
    ((1, 6, 7, 7), (6, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 6}),  # depthwise
])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_the_reference_configuration_within_the_bound(x_shape, w_shape, attributes, threads):
    x, w, b = _inputs(x_shape, w_shape)
    reference = _kernel(attributes, conv.REFERENCE).run(x, w, b)[0]
    window = {k: v for k, v in attributes.items() if k != "group"}
    bound = conv.error_bound(x, w, b, group=attributes.get("group", 1), **window)
    for split in conv.SPLITS:
        for block_bytes in (1, 1 << 24):  # one tile row per block, or all of them
            values = {**FORCED, conv.SPLIT: split, conv.BLOCK_BYTES: block_bytes, conv.MINIMUM_FLOPS: 1}
            kernel = _kernel(attributes, values, threads)
            assert kernel.problem(x.shape, w.shape).algorithm == "winograd"
            got = kernel.run(x, w, b)[0]
            assert np.all(np.abs(got.astype(np.float64) - reference) <= bound), (split, block_bytes)


@pytest.mark.parametrize(("element_type", "dtype"), [(T.DOUBLE, np.float64), (T.FLOAT16, np.float16)])
def test_other_types(element_type, dtype):
    x, w, b = _inputs((1, 4, 7, 6), (3, 4, 3, 3), dtype)
    reference = _kernel({"pads": [1, 1, 1, 1]}, conv.REFERENCE, element_type=element_type).run(x, w, b)[0]
    got = _kernel({"pads": [1, 1, 1, 1]}, FORCED, element_type=element_type).run(x, w, b)[0]
    assert got.dtype == dtype
    compute = np.float64 if dtype == np.float64 else np.float32
    bound = conv.error_bound(x, w, b, compute_dtype=compute, output_dtype=dtype, reference=reference,
                             pads=[1, 1, 1, 1])
    assert np.all(np.abs(got.astype(np.float64) - reference.astype(np.float64)) <= bound)


def test_the_bound_is_tight_enough_to_catch_a_wrong_transform(monkeypatch):
    """The bound is a rounding bound: one wrong entry in B^T is far outside it."""
    x, w, b = _inputs((1, 8, 10, 10), (8, 8, 3, 3))
    reference = _kernel({}, conv.REFERENCE).run(x, w, b)[0]
    bound = conv.error_bound(x, w, b)
    assert np.all(np.abs(_kernel({}, FORCED).run(x, w, b)[0] - reference) <= bound)
    wrong = winograd.INPUT.copy()
    wrong[1, 2] = -1
    monkeypatch.setattr(winograd, "INPUT", wrong)
    assert not np.all(np.abs(_kernel({}, FORCED).run(x, w, b)[0] - reference) <= bound)


def test_auto_uses_winograd_within_its_thresholds():
    def choice(x_shape, w_shape, attributes=None, values=LOW):
        attributes = {"pads": [1, 1, 1, 1]} if attributes is None else attributes
        return _kernel(attributes, values).problem(x_shape, w_shape, transformed=True).algorithm

    # the portable thresholds: 256 channels and filters, 28x28 outputs
    assert choice((1, 256, 28, 28), (256, 256, 3, 3), values=None) == "winograd"
    assert choice((1, 256, 27, 27), (256, 256, 3, 3), values=None) == "im2col_wide"
    assert choice((1, 256, 28, 28), (192, 256, 3, 3), values=None) == "im2col_wide"
    assert choice((1, 128, 14, 14), (128, 128, 3, 3)) == "winograd"  # 196 outputs, 128 channels
    assert choice((1, 128, 13, 13), (128, 128, 3, 3)) == "im2col_wide"  # 169 outputs
    assert choice((1, 64, 56, 56), (128, 64, 3, 3)) == "im2col_wide"  # 64 input channels
    assert choice((1, 128, 56, 56), (96, 128, 3, 3)) == "im2col_wide"  # 96 filters
    assert choice((1, 256, 28, 28), (256, 128, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}) == "winograd"
    assert choice((1, 256, 28, 28), (256, 64, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}) == "im2col_wide"
    lower = {conv.WINOGRAD_CHANNELS: 64, conv.WINOGRAD_OUTPUTS: 100}
    assert choice((1, 64, 10, 10), (64, 64, 3, 3), values=lower) == "winograd"
    for attributes in ({"strides": [2, 2]}, {"dilations": [2, 2]}):
        assert choice((1, 128, 32, 32), (128, 128, 3, 3), attributes) != "winograd"
        assert choice((1, 8, 9, 9), (4, 8, 3, 3), attributes, FORCED) == "im2col"
    assert choice((1, 128, 32, 32), (128, 128, 5, 5)) != "winograd"
    assert choice((1, 4, 20), (4, 4, 3), {}, FORCED) == "im2col"  # 1-D
    assert choice((1, 4, 6, 6, 6), (4, 4, 3, 3, 3), {}, FORCED) == "im2col"  # 3-D


def test_auto_uses_winograd_only_with_transformed_weights():
    """Weights that are not constant would be transformed on every call: auto keeps im2col."""
    x, w, _ = _inputs((1, 128, 14, 14), (128, 128, 3, 3))
    kernel = _kernel({"pads": [1, 1, 1, 1]}, LOW)
    assert kernel.problem(x.shape, w.shape).algorithm == "im2col_wide"
    special = kernel.specialize([None, w, None])
    assert special.problem(x.shape, w.shape, transformed=True).algorithm == "winograd"
    assert _kernel({"pads": [1, 1, 1, 1]}, FORCED).problem(x.shape, w.shape).algorithm == "winograd"


def test_constant_weights_are_transformed_once():
    x, w, b = _inputs((1, 128, 14, 14), (128, 128, 3, 3))
    kernel = _kernel({"pads": [1, 1, 1, 1]}, {**LOW, conv.MINIMUM_FLOPS: 1}, threads=2)
    forced = _kernel({"pads": [1, 1, 1, 1]}, {**FORCED, conv.MINIMUM_FLOPS: 1}, threads=2)
    special = kernel.specialize([None, w, b])
    assert special is not None and special._winograd[0] is w
    np.testing.assert_array_equal(special._winograd[1], winograd.transform_filters(
        w.reshape(1, 128, 128, 3, 3), np.float32))
    # the same arithmetic as winograd with the transform made on the call
    np.testing.assert_array_equal(special.run(x, w, b)[0], forced.run(x, w, b)[0])
    bound = conv.error_bound(x, w, b, pads=[1, 1, 1, 1])
    assert np.all(np.abs(special.run(x, w, b)[0] - kernel.run(x, w, b)[0]) <= 2 * bound)
    other = np.ascontiguousarray(w[::-1])  # not the constant: im2col, as without specializing
    np.testing.assert_array_equal(special.run(x, other, b)[0], kernel.run(x, other, b)[0])
    # nothing to keep: too few channels for auto, another algorithm forced, not 3x3 stride 1
    assert _kernel({"pads": [1, 1, 1, 1]}, LOW).specialize([None, w[:, :64], None]) is None
    assert _kernel({"pads": [1, 1, 1, 1]}).specialize([None, w, None]) is None  # 128 < 256
    assert _kernel({}, {conv.ALGORITHM: "im2col"}).specialize([None, w, None]) is None
    assert _kernel({"strides": [2, 2]}).specialize([None, w, None]) is None
    assert _kernel({}, FORCED).specialize([None, w[:4, :4], None]) is not None


def test_fused_epilogue_applies_to_every_block():
    x, w, b = _inputs((1, 4, 9, 9), (4, 4, 3, 3))
    expected = np.maximum(_kernel({"pads": [1, 1, 1, 1]}, FORCED).run(x, w, b)[0], 0)
    kernel = _kernel({"pads": [1, 1, 1, 1]}, {**FORCED, conv.BLOCK_BYTES: 1})
    kernel.epilogue = lambda block: np.maximum(block, 0, out=block)
    np.testing.assert_array_equal(kernel.run(x, w, b)[0], expected)


def test_a_session_with_constant_weights_uses_winograd_and_matches_the_reference():
    """Conv (constant 256x256 3x3 weights, 28x28) + BatchNormalization + Relu: the session folds
    the normalization into the weights, keeps their transform and computes with winograd."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from onnx_light.runtime import RuntimeSession

    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (1, 256, 28, 28)).astype(np.float32)
    w = rng.uniform(-0.1, 0.1, (256, 256, 3, 3)).astype(np.float32)
    scale, bias, mean = (rng.uniform(0.5, 1.5, 256).astype(np.float32) for _ in range(3))
    variance = rng.uniform(0.5, 1.5, 256).astype(np.float32)
    initializers = [numpy_helper.from_array(a, n) for a, n in
                    ((w, "w"), (scale, "s"), (bias, "b"), (mean, "m"), (variance, "v"))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", T.FLOAT, x.shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    session = RuntimeSession(model, num_threads=2)
    kernels = [step.run.__self__ for step in session._plan]
    conv_kernel = next(k for k in kernels if isinstance(k, conv.ConvKernel))
    assert conv_kernel._winograd is not None
    assert conv_kernel.problem(x.shape, w.shape, transformed=True).algorithm == "winograd"
    got = session.run(None, {"x": x})[0]
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    folded = conv_kernel._winograd[0]
    bound = conv.error_bound(x, folded, None, pads=[1, 1, 1, 1])
    # the folded weights and the normalization round a few more times than the bound counts
    assert np.all(np.abs(got - expected) <= bound + 1e-5 * np.abs(expected))


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 2), groups=st.integers(1, 3), channels=st.integers(1, 4),
       filters=st.integers(1, 4), height=st.integers(1, 9), width=st.integers(1, 9),
       pads=st.lists(st.integers(0, 2), min_size=4, max_size=4),
       algorithm=st.sampled_from(["winograd", "shifted"]), threads=st.sampled_from([1, 2]),
       block_bytes=st.sampled_from([1, 1 << 24]), seed=st.integers(0, 2 ** 16))
def test_random_convolutions_match_the_reference_within_the_bound(
        batch, groups, channels, filters, height, width, pads, algorithm, threads, block_bytes, seed):
    """winograd and shifted against the reference configuration on random shapes, paddings,
    groups and blocks (odd and one-element outputs included)."""
    height, width = height + 2, width + 2  # a 3x3 window fits before padding
    x, w, b = _inputs((batch, groups * channels, height, width), (groups * filters, channels, 3, 3),
                      seed=seed)
    attributes = {"pads": pads, "group": groups}
    values = {conv.ALGORITHM: algorithm, conv.BLOCK_BYTES: block_bytes, conv.MINIMUM_FLOPS: 1}
    kernel = _kernel(attributes, values, threads)
    assert kernel.problem(x.shape, w.shape).algorithm == algorithm
    got = kernel.run(x, w, b)[0]
    reference = _kernel(attributes, conv.REFERENCE).run(x, w, b)[0]
    bound = conv.error_bound(x, w, b, group=groups, pads=pads)
    assert np.all(np.abs(got.astype(np.float64) - reference) <= bound)
