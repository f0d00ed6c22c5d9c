"""Conv's winograd algorithm: the F(2x2, 3x3) and F(4x4, 3x3) arithmetic, when auto picks it
and which tiling, the constant filter transform, and its error bound; with the shifted
algorithm on random shapes."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T

from onnx_light.kernels import conv
from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.conv import winograd
from onnx_light.parallel import ThreadPool

FORCED = {conv.ALGORITHM: "winograd", conv.LARGE_TILE_OUTPUTS: conv.NEVER}  # F(2x2, 3x3)
FORCED_LARGE = {conv.ALGORITHM: "winograd", conv.LARGE_TILE_CHANNELS: 1, conv.LARGE_TILE_OUTPUTS: 1}
FORCED_TILE = {2: FORCED, 4: FORCED_LARGE}
# thresholds that let the tests' 128-channel, 14x14 convolutions use F(2x2, 3x3) under auto
LOW = {conv.WINOGRAD_CHANNELS: 128, conv.WINOGRAD_OUTPUTS: 196, conv.LARGE_TILE_OUTPUTS: conv.NEVER}


def _kernel(attributes, values=None, threads=1, element_type=T.FLOAT):
    ctx = NodeContext("conv", "Conv", "", 22, attributes, (element_type,) * 3, (element_type,), 3, 1)
    kernel = conv.ConvKernel(ctx)
    kernel.bind(ThreadPool(threads)).configure(values)
    return kernel


def _inputs(x_shape, w_shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, x_shape).astype(dtype), rng.uniform(-1, 1, w_shape).astype(dtype),
            rng.uniform(-1, 1, w_shape[0]).astype(dtype))


@pytest.mark.parametrize("tiling", [winograd.F2, winograd.F4], ids=["F2", "F4"])
def test_one_tile_is_the_correlation(tiling):
    """A^T [(G g G^T) * (B^T d B)] A is the m x m valid correlation of an (m + 2) x (m + 2)
    tile (float64, integers: exact for F(2x2, 3x3), F(4x4, 3x3)'s G has thirds and
    fifteenths), with the bias added; the compiled transforms on one tile."""
    rng = np.random.default_rng(0)
    m, alpha = tiling.tile, tiling.alpha
    d = rng.integers(-8, 8, (1, alpha, alpha)).astype(np.float64)
    g = rng.integers(-8, 8, (1, 3, 3)).astype(np.float64)
    v = np.empty((alpha * alpha, 1, 1))
    winograd.transform_inputs(d, tiling.input, v, 0, 1, 0, 0, 1, m)
    u = winograd.transform_filters(g, np.float64, tiling)  # (alpha^2, 1)
    y = np.empty((1, m, m))
    winograd.transform_outputs(u.reshape(-1, 1, 1) * v, tiling.output, np.array([0.5]), y, 0, 0, 0, m)
    expected = [[np.sum(d[0, i:i + 3, j:j + 3] * g[0]) + 0.5 for j in range(m)] for i in range(m)]
    np.testing.assert_allclose(y[0], expected, rtol=0, atol=1e-10 if m == 4 else 0)


def test_tilings_count_their_roundings():
    """The error bound's count: 2 passes of at most 2 terms and 2 of 3, plus 2 (F(2x2, 3x3));
    2 of 5 and 2 of 5, plus 2 (F(4x4, 3x3))."""
    assert (winograd.F2.roundings, winograd.F4.roundings) == (12, 22)
    assert set(winograd.TILINGS) == {2, 4}


@pytest.mark.parametrize(("x_shape", "w_shape", "attributes"), [
    ((1, 5, 9, 9), (4, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 8, 11), (6, 2, 3, 3), {"pads": [0, 2, 1, 0], "group": 2}),  # odd output, groups
    ((1, 3, 3, 3), (2, 3, 3, 3), {}),  # one output
    ((1, 3, 6, 7), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER"}),
    ((1, 6, 7, 7), (6, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 6}),  # depthwise
])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("tile", [2, 4])
def test_matches_the_reference_configuration_within_the_bound(x_shape, w_shape, attributes, threads,
                                                              tile):
    x, w, b = _inputs(x_shape, w_shape)
    reference = _kernel(attributes, conv.REFERENCE).run(x, w, b)[0]
    window = {k: v for k, v in attributes.items() if k != "group"}
    bound = conv.error_bound(x, w, b, group=attributes.get("group", 1), winograd_tiles=(tile,), **window)
    for split in conv.SPLITS:
        for block_bytes in (1, 1 << 24):  # one tile row per block, or all of them
            values = {**FORCED_TILE[tile], conv.SPLIT: split, conv.BLOCK_BYTES: block_bytes,
                      conv.MINIMUM_FLOPS: 1}
            kernel = _kernel(attributes, values, threads)
            problem = kernel.problem(x.shape, w.shape)
            assert (problem.algorithm, problem.tile) == ("winograd", tile)
            got = kernel.run(x, w, b)[0]
            assert np.all(np.abs(got.astype(np.float64) - reference) <= bound), (split, block_bytes)


@pytest.mark.parametrize(("element_type", "dtype"), [(T.DOUBLE, np.float64), (T.FLOAT16, np.float16)])
@pytest.mark.parametrize("tile", [2, 4])
def test_other_types(element_type, dtype, tile):
    x, w, b = _inputs((1, 4, 7, 6), (3, 4, 3, 3), dtype)
    reference = _kernel({"pads": [1, 1, 1, 1]}, conv.REFERENCE, element_type=element_type).run(x, w, b)[0]
    got = _kernel({"pads": [1, 1, 1, 1]}, FORCED_TILE[tile], element_type=element_type).run(x, w, b)[0]
    assert got.dtype == dtype
    compute = np.float64 if dtype == np.float64 else np.float32
    bound = conv.error_bound(x, w, b, compute_dtype=compute, output_dtype=dtype, reference=reference,
                             winograd_tiles=(tile,), pads=[1, 1, 1, 1])
    assert np.all(np.abs(got.astype(np.float64) - reference.astype(np.float64)) <= bound)


@pytest.mark.parametrize("tile", [2, 4])
def test_the_bound_is_tight_enough_to_catch_a_wrong_transform(monkeypatch, tile):
    """The bound is a rounding bound: one wrong entry in B^T is far outside it."""
    x, w, b = _inputs((1, 8, 10, 10), (8, 8, 3, 3))
    reference = _kernel({}, conv.REFERENCE).run(x, w, b)[0]
    bound = conv.error_bound(x, w, b, winograd_tiles=(tile,))
    assert np.all(np.abs(_kernel({}, FORCED_TILE[tile]).run(x, w, b)[0] - reference) <= bound)
    tiling = winograd.TILINGS[tile]
    wrong = tiling.input.copy()
    wrong[1, 2] += 1
    monkeypatch.setitem(winograd.TILINGS, tile, dataclasses.replace(tiling, input=wrong))
    assert not np.all(np.abs(_kernel({}, FORCED_TILE[tile]).run(x, w, b)[0] - reference) <= bound)


def test_float32_error_against_float64_is_within_the_stated_bound():
    """docs/conv.md states the error of each algorithm in float32 against the float64
    convolution, relative to the largest output: at most 2e-6 for F(2x2, 3x3) and 1e-5 for
    F(4x4, 3x3) on uniform random data (measured up to 1.2e-6 and 5e-6 over 64-512
    channels); im2col's is below 1e-6."""
    for channels, size in ((64, 20), (256, 8)):
        x, w, b = _inputs((1, channels, size, size), (channels, channels, 3, 3), seed=channels)
        exact = _kernel({"pads": [1, 1, 1, 1]}, conv.REFERENCE, element_type=T.DOUBLE).run(
            x.astype(np.float64), w.astype(np.float64), b.astype(np.float64))[0]
        scale = np.abs(exact).max()
        for values, stated in ((conv.REFERENCE, 1e-6), (FORCED, 2e-6), (FORCED_LARGE, 1e-5)):
            got = _kernel({"pads": [1, 1, 1, 1]}, values).run(x, w, b)[0]
            assert np.abs(got - exact).max() / scale <= stated, (channels, values)


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


def test_auto_and_forced_winograd_take_the_large_tile_within_its_thresholds():
    def decided(x_shape, w_shape, values=None, group=1):
        kernel = _kernel({"pads": [1, 1, 1, 1], "group": group}, values)
        problem = kernel.problem(x_shape, w_shape, transformed=True)
        return problem.algorithm, problem.tile

    # the portable thresholds: F(4x4, 3x3) from 64 channels and filters and 56x56 outputs,
    # whatever winograd.minimum_channels; F(2x2, 3x3) within its own thresholds
    assert decided((1, 64, 56, 56), (64, 64, 3, 3)) == ("winograd", 4)
    assert decided((1, 256, 56, 56), (256, 256, 3, 3)) == ("winograd", 4)
    assert decided((1, 256, 28, 28), (256, 256, 3, 3)) == ("winograd", 2)
    assert decided((1, 64, 55, 56), (64, 64, 3, 3)) == ("im2col_wide", 0)  # 3080 outputs
    assert decided((1, 32, 56, 56), (64, 32, 3, 3)) == ("im2col_wide", 0)  # 32 channels
    assert decided((1, 128, 56, 56), (128, 64, 3, 3), group=2) == ("winograd", 4)
    assert decided((1, 128, 56, 56), (128, 32, 3, 3), group=4) == ("im2col_wide", 0)
    never = {conv.LARGE_TILE_CHANNELS: conv.NEVER}
    assert decided((1, 256, 56, 56), (256, 256, 3, 3), never) == ("winograd", 2)
    assert decided((1, 64, 56, 56), (64, 64, 3, 3), never) == ("im2col_wide", 0)
    # forced: the large tile within the same thresholds, else the small one
    assert decided((1, 4, 56, 56), (4, 4, 3, 3), FORCED_LARGE) == ("winograd", 4)
    assert decided((1, 64, 56, 56), (64, 64, 3, 3), {conv.ALGORITHM: "winograd"}) == ("winograd", 4)
    assert decided((1, 64, 28, 28), (64, 64, 3, 3), {conv.ALGORITHM: "winograd"}) == ("winograd", 2)
    assert decided((1, 64, 56, 56), (64, 64, 3, 3), FORCED) == ("winograd", 2)


def test_auto_uses_winograd_only_with_transformed_weights():
    """Weights that are not constant would be transformed on every call: auto keeps im2col."""
    x, w, _ = _inputs((1, 128, 14, 14), (128, 128, 3, 3))
    kernel = _kernel({"pads": [1, 1, 1, 1]}, LOW)
    assert kernel.problem(x.shape, w.shape).algorithm == "im2col_wide"
    special = kernel.specialize([None, w, None])
    assert special.problem(x.shape, w.shape, transformed=True).algorithm == "winograd"
    assert _kernel({"pads": [1, 1, 1, 1]}, FORCED).problem(x.shape, w.shape).algorithm == "winograd"


@pytest.mark.parametrize("tile", [2, 4])
def test_constant_weights_are_transformed_once(tile):
    x, w, b = _inputs((1, 128, 14, 14), (128, 128, 3, 3))
    automatic = LOW if tile == 2 else {conv.LARGE_TILE_OUTPUTS: 196}
    kernel = _kernel({"pads": [1, 1, 1, 1]}, {**automatic, conv.MINIMUM_FLOPS: 1}, threads=2)
    forced = _kernel({"pads": [1, 1, 1, 1]}, {**FORCED_TILE[tile], conv.MINIMUM_FLOPS: 1}, threads=2)
    special = kernel.specialize([None, w, b])
    assert special is not None and special._winograd.weights is w
    settled = special.settle([x.shape, w.shape, b.shape])
    assert settled.decisions()["algorithm"] == "winograd" and settled._settled.problem.tile == tile
    tiling = winograd.TILINGS[tile]
    transformed = settled._winograd.filters(tiling)  # computed by settle, kept
    np.testing.assert_array_equal(transformed, winograd.transform_filters(
        w.reshape(1, 128, 128, 3, 3), np.float32, tiling))
    # the same arithmetic as winograd with the transform made on the call
    np.testing.assert_array_equal(settled.run(x, w, b)[0], forced.run(x, w, b)[0])
    assert settled._winograd.filters(tiling) is transformed
    bound = conv.error_bound(x, w, b, pads=[1, 1, 1, 1], winograd_tiles=(tile,))
    assert np.all(np.abs(special.run(x, w, b)[0] - kernel.run(x, w, b)[0]) <= 2 * bound)
    other = np.ascontiguousarray(w[::-1])  # not the constant: im2col, as without specializing
    np.testing.assert_array_equal(special.run(x, other, b)[0], kernel.run(x, other, b)[0])


def test_nothing_to_transform():
    """Too few channels for auto (either tiling), another algorithm forced, not 3x3 stride 1."""
    w = _inputs((1, 128, 14, 14), (128, 128, 3, 3))[1]
    assert _kernel({"pads": [1, 1, 1, 1]}, LOW).specialize([None, w[:, :32], None]) is None
    assert _kernel({"pads": [1, 1, 1, 1]}).specialize([None, w[:, :32], None]) is None  # 32 < 64
    assert _kernel({"pads": [1, 1, 1, 1]}).specialize([None, w, None]) is not None  # 128 >= 64
    assert _kernel({"pads": [1, 1, 1, 1]}, {conv.LARGE_TILE_CHANNELS: conv.NEVER}).specialize(
        [None, w, None]) is None  # 128 < 256
    assert _kernel({}, {conv.ALGORITHM: "im2col"}).specialize([None, w, None]) is None
    assert _kernel({"strides": [2, 2]}).specialize([None, w, None]) is None
    assert _kernel({}, FORCED).specialize([None, w[:4, :4], None]) is not None


@pytest.mark.parametrize("tile", [2, 4])
def test_fused_epilogue_applies_to_every_block(tile):
    x, w, b = _inputs((1, 4, 9, 9), (4, 4, 3, 3))
    expected = np.maximum(_kernel({"pads": [1, 1, 1, 1]}, FORCED_TILE[tile]).run(x, w, b)[0], 0)
    kernel = _kernel({"pads": [1, 1, 1, 1]}, {**FORCED_TILE[tile], conv.BLOCK_BYTES: 1})
    kernel.epilogue = lambda block: np.maximum(block, 0, out=block)
    np.testing.assert_array_equal(kernel.run(x, w, b)[0], expected)


@pytest.mark.parametrize(("channels", "size", "tile"), [(256, 28, 2), (64, 56, 4)])
def test_a_session_with_constant_weights_uses_winograd_and_matches_the_reference(channels, size, tile):
    """Conv (constant 3x3 weights) + BatchNormalization + Add (a shortcut) + Relu: the session
    folds the normalization into the weights, keeps their transform for the tiling of the
    inferred shapes and computes with winograd (F(2x2, 3x3) for 256 channels at 28x28,
    F(4x4, 3x3) for 64 at 56x56)."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from onnx_light.runtime import RuntimeSession

    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (1, channels, size, size)).astype(np.float32)
    w = rng.uniform(-0.1, 0.1, (channels, channels, 3, 3)).astype(np.float32)
    scale, bias, mean = (rng.uniform(0.5, 1.5, channels).astype(np.float32) for _ in range(3))
    variance = rng.uniform(0.5, 1.5, channels).astype(np.float32)
    initializers = [numpy_helper.from_array(a, n) for a, n in
                    ((w, "w"), (scale, "s"), (bias, "b"), (mean, "m"), (variance, "v"))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
             helper.make_node("Add", ["n", "x"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", T.FLOAT, x.shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    session = RuntimeSession(model, num_threads=2)
    kernels = [step.run.__self__ for step in session._plan]
    conv_kernel = next(k for k in kernels if isinstance(k, conv.ConvKernel))
    assert conv_kernel._winograd is not None
    assert set(conv_kernel._winograd._transforms) == {tile}  # at construction, for these shapes
    problem = conv_kernel.problem(x.shape, w.shape, transformed=True)
    assert (problem.algorithm, problem.tile) == ("winograd", tile)
    got = session.run(None, {"x": x})[0]
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    folded = conv_kernel._winograd.weights
    bound = conv.error_bound(x, folded, None, pads=[1, 1, 1, 1], winograd_tiles=(tile,))
    # the folded weights, the normalization and the shortcut round a few more times than the
    # bound counts
    assert np.all(np.abs(got - expected) <= bound + 1e-5 * (np.abs(expected) + 1))


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 2), groups=st.integers(1, 3), channels=st.integers(1, 4),
       filters=st.integers(1, 4), height=st.integers(1, 11), width=st.integers(1, 11),
       pads=st.lists(st.integers(0, 2), min_size=4, max_size=4),
       algorithm=st.sampled_from(["winograd 2", "winograd 4", "shifted"]),
       threads=st.sampled_from([1, 2]), block_bytes=st.sampled_from([1, 1 << 24]),
       bias=st.booleans(), relu=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_random_convolutions_match_the_reference_within_the_bound(
        batch, groups, channels, filters, height, width, pads, algorithm, threads, block_bytes,
        bias, relu, seed):
    """winograd (both tilings) and shifted against the reference configuration on random
    shapes, paddings, groups, batches and blocks (odd and one-element outputs included), with
    and without a bias and a fused Relu."""
    height, width = height + 2, width + 2  # a 3x3 window fits before padding
    x, w, b = _inputs((batch, groups * channels, height, width), (groups * filters, channels, 3, 3),
                      seed=seed)
    b = b if bias else None
    attributes = {"pads": pads, "group": groups}
    name, _, tile = algorithm.partition(" ")
    values = {**(FORCED_TILE[int(tile)] if tile else {conv.ALGORITHM: name}),
              conv.BLOCK_BYTES: block_bytes, conv.MINIMUM_FLOPS: 1}
    kernel = _kernel(attributes, values, threads)
    problem = kernel.problem(x.shape, w.shape)
    assert (problem.algorithm, problem.tile) == (name, int(tile or 0))
    if relu:
        kernel.epilogue = lambda block: np.maximum(block, 0, out=block)
    got = kernel.run(x, w, b)[0]
    reference = _kernel(attributes, conv.REFERENCE).run(x, w, b)[0]
    bound = conv.error_bound(x, w, b, group=groups, pads=pads, winograd_tiles=(int(tile or 2),))
    if relu:
        reference = np.maximum(reference, 0)
    assert np.all(np.abs(got.astype(np.float64) - reference) <= bound)


def test_calibration_turns_the_large_tile_off_where_it_is_slower(monkeypatch):
    """With a clock on which F(4x4, 3x3) is slow, the calibration validates the candidates and
    keeps one that computes ResNet-50's 64 x 56 x 56 convolution without it."""
    from onnx_light.kernels.conv import algorithms
    from onnx_light.tuning.calibration import Budget
    from onnx_light.tuning.processor import execution_descriptor

    clock = [0.0]
    block = algorithms._Winograd.block

    def slow_block(self, *arguments):
        if self.tiling is winograd.F4:
            clock[0] += 1.0
        block(self, *arguments)

    def timer():
        clock[0] += 1e-3
        return clock[0]

    monkeypatch.setattr(algorithms._Winograd, "block", slow_block)
    corpus = (conv.CorpusCase("resnet50_3x3", "test", 64, (56, 56), 64, (3, 3), pads=(1, 1, 1, 1)),)
    result = conv.calibrate_conv(conv.DECLARATIONS[0], conv.conv_schema(T.FLOAT).key,
                                 execution_descriptor(1), Budget(120.0, 1 << 30, 1), timer=timer,
                                 corpus=corpus)
    assert not result.portable_kept
    assert result.values[conv.LARGE_TILE_CHANNELS] == conv.NEVER or result.values[conv.ALGORITHM] == "im2col"
