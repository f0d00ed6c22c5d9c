"""Conv's channel-blocked depthwise kernel (``depthwise_blocked``,
onnx_light/kernels/conv/channel_blocked.py) against the ONNX reference within the bound of
``onnx_light.kernels.conv.numerics``, on random shapes (channels not a multiple of 16, planes
of 1 to 30, kernels 1 to 7, strides, pads), with its fused epilogues, NaN and infinities, at
one and two threads (the same bits)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conv_epilogues import assert_fused_epilogue_matches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import conv
from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.compiled_activations import in_place
from onnx_light.kernels.conv import channel_blocked
from onnx_light.kernels.conv.channel_blocked import blocked_weights, vector_lanes
from onnx_light.parallel import ThreadPool

pytestmark = pytest.mark.skipif(not vector_lanes(),
                                reason="the channel-blocked kernel needs AVX-512 or AVX2 with FMA")
T = TensorProto
FORCED = {conv.ALGORITHM: "depthwise_blocked", conv.REGION_FLOPS: 1}


@pytest.fixture(scope="module")
def pools():
    with ThreadPool(1) as one, ThreadPool(2) as two:
        yield {1: one, 2: two}


def _kernel(attributes, pool, values=FORCED, bias=True):
    inputs = 3 if bias else 2
    ctx = NodeContext("dw", "Conv", "", 22, attributes, (T.FLOAT,) * inputs, (T.FLOAT,), inputs, 1)
    kernel = conv.ConvKernel(ctx).bind(pool)
    kernel.configure(values)
    return kernel


def _reference(x, w, b, attributes):
    inputs = ["x", "w", "b"] if b is not None else ["x", "w"]
    node = helper.make_node("Conv", inputs, ["y"], **attributes)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info(n, T.FLOAT, None)
                                               for n in inputs],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    feeds = {"x": x, "w": w} | ({"b": b} if b is not None else {})
    return ReferenceEvaluator(model).run(None, feeds)[0]


def _bound(x, w, b, attributes):
    window = {k: v for k, v in attributes.items() if k != "group"}
    return conv.error_bound(x, w, b, group=attributes["group"], **window)


@st.composite
def blocked_cases(draw):
    """(x shape, w shape, attributes): 2-D, any channel count (mostly not a multiple of 16),
    planes of 1 to 30, kernels of 1 to 7 per axis, strides 1 to 3, pads 0 to 3."""
    channels = draw(st.integers(2, 40))
    kernel = [draw(st.sampled_from([1, 3, 5, 7])) for _ in range(2)]
    strides = [draw(st.sampled_from([1, 2, 2, 3])) for _ in range(2)]
    pads = [draw(st.integers(0, min(3, k - 1 if k > 1 else 0))) for k in kernel * 2]
    size = [draw(st.integers(max(1, k - p - q), 30))
            for k, p, q in zip(kernel, pads[:2], pads[2:], strict=True)]
    attributes = {"group": channels, "strides": strides, "pads": pads}
    return (draw(st.integers(1, 2)), channels, *size), (channels, 1, *kernel), attributes


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=blocked_cases(), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_matches_the_reference_evaluator(pools, case, bias, seed):
    """Within the bound, the same bits on one and two threads, and not in X's memory."""
    x_shape, w_shape, attributes = case
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, x_shape).astype(np.float32)
    w = rng.uniform(-1, 1, w_shape).astype(np.float32)
    b = rng.uniform(-1, 1, w_shape[0]).astype(np.float32) if bias else None
    inputs = (x, w, b) if bias else (x, w)
    one = _kernel(attributes, pools[1], bias=bias)
    assert one.problem(x.shape, w.shape).algorithm == "depthwise_blocked"
    got = one.run(*inputs)[0]
    error = np.abs(got.astype(np.float64) - _reference(x, w, b, attributes))
    assert np.all(error <= _bound(x, w, b, attributes))
    two = _kernel(attributes, pools[2], bias=bias)
    assert two.problem(x.shape, w.shape).plan == "region"  # both threads inside the call
    np.testing.assert_array_equal(two.run(*inputs)[0], got)
    assert not np.shares_memory(got, x)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=blocked_cases(), budget=st.sampled_from([1, 4096, 1 << 14]), seed=st.integers(0, 2**16))
def test_bands_give_the_bits_of_the_whole_plane(pools, case, budget, seed):
    """Bands of output rows (their input rows' tile within ``BAND_BYTES``: one row, a few, or
    every row where the plane is narrower than the lanes) give the bits of the whole plane's
    tile, at one and two threads."""
    x_shape, w_shape, attributes = case
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, x_shape).astype(np.float32)
    w = rng.uniform(-1, 1, w_shape).astype(np.float32)
    b = rng.uniform(-1, 1, w_shape[0]).astype(np.float32)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(channel_blocked, "BAND_BYTES", 1 << 40)
        whole = _kernel(attributes, pools[1]).run(x, w, b)[0]
        patch.setattr(channel_blocked, "BAND_BYTES", budget)
        for threads in (1, 2):
            np.testing.assert_array_equal(_kernel(attributes, pools[threads]).run(x, w, b)[0], whole)


def test_band_rows():
    """Whole planes below the budget or narrower than the lanes; else the rows whose tile
    fits (at least one, and L positions), never every row."""
    lanes = vector_lanes()
    row = 113 * lanes * 4  # a tile row of 112 padded on one side
    budget = channel_blocked.BAND_BYTES
    assert channel_blocked.band_rows((14, 14), (14, 14), (3, 3), (1, 1), (16, 16)) == 0
    assert channel_blocked.band_rows((112, 112), (56, 56), (3, 3), (2, 2), (113, 113)) \
        == (budget // row - 3) // 2 + 1
    assert channel_blocked.band_rows((300, 4), (300, 4), (3, 3), (1, 1), (302, 6)) == 0
    assert channel_blocked.band_rows((4000, 5000), (4000, 5000), (3, 3), (1, 1), (4002, 5002)) == 1
    assert channel_blocked.band_rows((2000, 3), (2000, 1), (3, 3), (1, 1), (2002, 5)) == 0


def _region_in_a_fork(queue, x, w, b, attributes) -> None:
    with ThreadPool(2) as pool:
        queue.put(_kernel(attributes, pool).run(x, w, b)[0].tobytes())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_fork_after_a_region_computes_on_one_thread(pools):
    """The child of a process that ran the kernel's region (GNU OpenMP does not survive fork)
    computes on one thread, the same bits, instead of hanging in its first region."""
    import multiprocessing

    rng = np.random.default_rng(6)
    attributes = {"group": 40, "pads": [1, 1, 1, 1]}
    x = rng.uniform(-1, 1, (1, 40, 20, 20)).astype(np.float32)
    w = rng.uniform(-1, 1, (40, 1, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 40).astype(np.float32)
    two = _kernel(attributes, pools[2])
    assert two.problem(x.shape, w.shape).plan == "region"
    expected = two.run(x, w, b)[0].tobytes()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_region_in_a_fork, args=(queue, x, w, b, attributes))
    child.start()
    result = queue.get(timeout=120)
    child.join(timeout=30)
    assert result == expected and child.exitcode == 0


def test_nan_and_infinities_propagate(pools):
    """A NaN reaches every output whose window holds it, an infinity makes its outputs
    infinite (or NaN where a zero weight or an opposite infinity meets it), as the reference."""
    rng = np.random.default_rng(3)
    attributes = {"group": 19, "strides": [2, 1], "pads": [1, 2, 1, 2]}
    x = rng.uniform(-1, 1, (1, 19, 9, 11)).astype(np.float32)
    x[0, 2, 4, 5], x[0, 17, 0, 0], x[0, 17, 8, 10] = np.nan, np.inf, -np.inf
    w = rng.uniform(0.5, 1, (19, 1, 3, 5)).astype(np.float32)
    w[5, 0, 1, 1] = np.inf
    b = rng.uniform(-1, 1, 19).astype(np.float32)
    got = _kernel(attributes, pools[2]).run(x, w, b)[0]
    with np.errstate(invalid="ignore"):  # inf - inf, inf * 0
        expected = _reference(x, w, b, attributes)
        bound = _bound(x, w, b, attributes)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(expected)], expected[~finite & ~np.isnan(expected)])
    assert np.isnan(got).any() and np.isinf(got).any()
    error = np.abs(got[finite].astype(np.float64) - expected[finite])
    assert np.all(error <= bound[finite])


@pytest.mark.parametrize("epilogue", ["relu6", "Swish", "HardSwish", "HardSigmoid", "residual"])
def test_fused_epilogues(pools, epilogue):
    """A fused clamp and a compiled activation (inside the kernel: HardSwish and HardSigmoid
    in registers, before the sums are stored) and a residual with Relu (after it, on blocks
    of channels) give the plain convolution finished alike, bitwise."""
    rng = np.random.default_rng(8)
    attributes = {"group": 200, "pads": [2, 2, 2, 2], "strides": [2, 2]}
    x = rng.uniform(-4, 4, (2, 200, 28, 28)).astype(np.float32)
    w = rng.uniform(-1, 1, (200, 1, 5, 5)).astype(np.float32)
    b = rng.uniform(-1, 1, 200).astype(np.float32)
    assert_fused_epilogue_matches(_kernel(attributes, pools[2]), x, w, b, epilogue, rng)


@pytest.mark.parametrize("op_type", ["HardSwish", "HardSigmoid"])
@pytest.mark.parametrize("size", [28, 112])  # one tile; bands
def test_gates_in_registers_keep_nan_and_infinities(pools, op_type, size):
    """HardSwish and HardSigmoid computed in registers give the bits of the compiled
    activation applied after, NaN and infinities included."""
    rng = np.random.default_rng(12)
    attributes = {"group": 11, "pads": [1, 1, 1, 1], "strides": [2, 1]}
    x = rng.uniform(-8, 8, (1, 11, size, size)).astype(np.float32)
    x.flat[rng.choice(x.size, 60, replace=False)] = [np.nan, np.inf, -np.inf] * 20
    w = rng.uniform(-1, 1, (11, 1, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 11).astype(np.float32)
    plain = _kernel(attributes, pools[1])
    activation = in_place(op_type, {"alpha": 0.25, "beta": 0.4}, lambda block: None)
    expected = plain.run(x, w, b)[0]
    activation(expected)
    got = plain.variant(epilogue=activation).run(x, w, b)[0]
    np.testing.assert_array_equal(got, expected)
    assert (np.isnan(got).any() and np.isinf(got).any()) or op_type == "HardSigmoid"


def test_weights_arranged_once_at_construction(pools):
    """``specialize`` arranges constant weights into blocks of the processor's lanes (zeros
    past C); runs with them give the bits of runs that arrange the weights themselves."""
    rng = np.random.default_rng(4)
    w = rng.uniform(-1, 1, (20, 1, 3, 3)).astype(np.float32)
    arranged = blocked_weights(w)
    lanes = vector_lanes()
    assert lanes in (8, 16) and arranged.shape == (-(-20 // lanes), 9, lanes)
    np.testing.assert_array_equal(arranged[19 // lanes, :, 19 % lanes], w[19].reshape(-1))
    assert not arranged[19 // lanes, :, 19 % lanes + 1:].any()
    attributes = {"group": 20, "pads": [1, 1, 1, 1]}
    kernel = _kernel(attributes, pools[1], values=None)
    special = kernel.specialize([None, w, None])
    assert special is not None and special._blocked.weights is w
    x = rng.uniform(-1, 1, (1, 20, 14, 14)).astype(np.float32)
    b = rng.uniform(-1, 1, 20).astype(np.float32)
    assert special.problem(x.shape, w.shape).algorithm == "depthwise_blocked"
    np.testing.assert_array_equal(special.run(x, w, b)[0], kernel.run(x, w.copy(), b)[0])


def test_auto_follows_the_crossover(pools):
    """``auto`` computes float32 depthwise convolutions channel-blocked up to
    ``depthwise.blocked_outputs`` output positions, per channel above it and with 0, and
    never those it does not apply to (dilated, float64)."""
    attributes = {"group": 32, "pads": [1, 1, 1, 1]}

    def algorithm(values, x_shape=(1, 32, 28, 28), attrs=attributes):
        return _kernel(attrs, pools[1], values=values).problem(x_shape, (32, 1, 3, 3)).algorithm

    assert algorithm({conv.BLOCKED_OUTPUTS: 784}) == "depthwise_blocked"
    assert algorithm({conv.BLOCKED_OUTPUTS: 783}) == "depthwise"
    assert algorithm({conv.BLOCKED_OUTPUTS: 0}) == "depthwise"
    dilated = dict(attributes, dilations=[2, 2], pads=[2, 2, 2, 2])
    assert algorithm({conv.BLOCKED_OUTPUTS: 1 << 20}, attrs=dilated) == "depthwise"
    ctx = NodeContext("dw", "Conv", "", 22, attributes, (T.DOUBLE,) * 2, (T.DOUBLE,), 2, 1)
    double = conv.ConvKernel(ctx).bind(pools[1])
    double.configure({conv.BLOCKED_OUTPUTS: 1 << 20})
    assert double.problem((1, 32, 28, 28), (32, 1, 3, 3)).algorithm == "depthwise"


def test_calibration_searches_the_crossover(monkeypatch):
    """With a clock on which the channel-blocked kernel is slow, the calibration keeps a
    configuration that computes the small depthwise case without it."""
    from onnx_light.kernels.conv import channel_blocked
    from onnx_light.tuning.calibration import Budget
    from onnx_light.tuning.processor import execution_descriptor

    clock = [0.0]
    run = channel_blocked.BlockedCall.run  # the algorithm's blocks and the direct path call it

    def slow_run(self, *arguments):
        clock[0] += 1.0
        run(self, *arguments)

    def timer():
        clock[0] += 1e-3
        return clock[0]

    monkeypatch.setattr(channel_blocked.BlockedCall, "run", slow_run)
    corpus = (conv.CorpusCase("tiny_depthwise", "test", 20, (7, 7), 20, (3, 3), pads=(1, 1, 1, 1),
                              group=20),)
    result = conv.calibrate_conv(conv.DECLARATIONS[0], conv.conv_schema(T.FLOAT).key,
                                 execution_descriptor(1), Budget(120.0, 1 << 30, 1), timer=timer,
                                 corpus=corpus)
    assert not result.portable_kept
    values = result.values
    assert (values[conv.BLOCKED_OUTPUTS] < 49 or values[conv.AUTO_DEPTHWISE] == "im2col_wide"
            or values[conv.ALGORITHM] == "im2col")


class _ShufflingBuilder:
    """The one builder method ``_transpose`` calls, on numpy vectors: LLVM's shufflevector."""

    @staticmethod
    def shuffle_vector(a, b, mask):
        return np.concatenate([a, b])[[m.constant for m in mask.constant]]


@pytest.mark.parametrize("lanes", [8, 16])
def test_the_in_register_transpose_of_either_width(lanes):
    """The butterfly transpose of L vectors of L lanes (8 with AVX2, 16 with AVX-512: the
    shuffles of both, whichever this processor runs) moves lane j of vector i to lane i of
    vector j."""
    from onnx_light.kernels.conv.channel_blocked import _transpose

    rows = np.arange(lanes * lanes).reshape(lanes, lanes)
    got = _transpose(_ShufflingBuilder(), list(rows))
    np.testing.assert_array_equal(np.array(got), rows.T)
