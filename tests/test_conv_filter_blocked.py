"""Conv's filter-blocked kernel for full convolutions with few input channels
(``filters_blocked``, onnx_light/kernels/conv/filter_blocked.py: a CNN's stem) against the ONNX
reference within the bound of ``onnx_light.kernels.conv.numerics``, on random shapes (filters
not a multiple of the lanes, planes of 1 to 40, kernels 1 to 7, strides, pads), with its fused
epilogues, at one and two threads (the same bits, split by images or by output rows)."""

from __future__ import annotations

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
from onnx_light.kernels.conv import filter_blocked
from onnx_light.kernels.conv.channel_blocked import vector_lanes
from onnx_light.parallel import ThreadPool

pytestmark = pytest.mark.skipif(not vector_lanes(),
                                reason="the filter-blocked kernel needs AVX-512 or AVX2 with FMA")
T = TensorProto
FORCED = {conv.ALGORITHM: "filters_blocked", conv.REGION_FLOPS: 1}


@pytest.fixture(scope="module")
def pools():
    with ThreadPool(1) as one, ThreadPool(2) as two:
        yield {1: one, 2: two}


def _kernel(attributes, pool, values=FORCED, dtype=T.FLOAT):
    ctx = NodeContext("stem", "Conv", "", 22, attributes, (dtype,) * 3, (dtype,), 3, 1)
    kernel = conv.ConvKernel(ctx).bind(pool)
    kernel.configure(values)
    return kernel


def _reference(x, w, b, attributes):
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attributes)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info(n, T.FLOAT, None)
                                               for n in ("x", "w", "b")],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    return ReferenceEvaluator(model).run(None, {"x": x, "w": w, "b": b})[0]


@st.composite
def stem_cases(draw):
    """(x shape, w shape, attributes): 2-D, 1 to 4 input channels, 1 to 40 filters, planes of
    1 to 40 rows and 1 to 90 columns (rows of 24 outputs and more at stride 2: the columns'
    intrinsic), kernels of 1 to 7 per axis, strides 1 to 3, pads 0 to 3."""
    channels, filters = draw(st.integers(1, 4)), draw(st.integers(1, 40))
    kernel = [draw(st.sampled_from([1, 3, 5, 7])) for _ in range(2)]
    strides = [draw(st.sampled_from([1, 2, 2, 3])) for _ in range(2)]
    pads = [draw(st.integers(0, min(3, k - 1 if k > 1 else 0))) for k in kernel * 2]
    size = [draw(st.integers(max(1, k - p - q), limit))
            for k, p, q, limit in zip(kernel, pads[:2], pads[2:], (40, 90), strict=True)]
    attributes = {"strides": strides, "pads": pads}
    return (draw(st.integers(1, 2)), channels, *size), (filters, channels, *kernel), attributes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=stem_cases(), seed=st.integers(0, 2**16))
def test_matches_the_reference_evaluator(pools, case, seed):
    """Within the bound; the same bits on one and two threads."""
    x_shape, w_shape, attributes = case
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, x_shape).astype(np.float32)
    w = rng.uniform(-1, 1, w_shape).astype(np.float32)
    b = rng.uniform(-1, 1, w_shape[0]).astype(np.float32)
    one = _kernel(attributes, pools[1])
    assert one.problem(x.shape, w.shape).algorithm == "filters_blocked"
    got = one.run(x, w, b)[0]
    error = np.abs(got.astype(np.float64) - _reference(x, w, b, attributes))
    assert np.all(error <= conv.error_bound(x, w, b, **attributes))
    np.testing.assert_array_equal(_kernel(attributes, pools[2]).run(x, w, b)[0], got)


def test_bands_and_row_splits_give_the_same_bits(pools, monkeypatch):
    """A 224 x 224 stem (one image: two threads split its output rows) computed by bands of
    a few rows gives the bits of one band holding every row."""
    rng = np.random.default_rng(5)
    attributes = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    x = rng.uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)
    w = rng.uniform(-1, 1, (20, 3, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 20).astype(np.float32)
    two = _kernel(attributes, pools[2])
    assert two.problem(x.shape, w.shape).plan == "region"
    got = two.run(x, w, b)[0]
    monkeypatch.setattr(filter_blocked, "TILE_BYTES", 1 << 40)
    np.testing.assert_array_equal(_kernel(attributes, pools[1]).run(x, w, b)[0], got)
    error = np.abs(got.astype(np.float64) - _reference(x, w, b, attributes))
    assert np.all(error <= conv.error_bound(x, w, b, **attributes))


@pytest.mark.parametrize("stride", [1, 2])
def test_rows_by_columns_give_the_bits_of_positions(pools, stride):
    """Rows of at least 24 outputs (computed by columns, L/2 filters at a time, a row's last
    columns overlapping) give the bits of the same outputs in a narrower plane (computed by
    positions, L filters at a time): the same sums in the same order. 13 filters: a block
    and a half-block short."""
    rng = np.random.default_rng(9 + stride)
    attributes = {"strides": [stride, stride], "pads": [1, 2, 1, 2]}
    x = rng.uniform(-1, 1, (1, 3, 9, 61 * stride)).astype(np.float32)
    w = rng.uniform(-1, 1, (13, 3, 3, 5)).astype(np.float32)
    b = rng.uniform(-1, 1, 13).astype(np.float32)
    kernel = _kernel(attributes, pools[1])
    wide = kernel.run(x, w, b)[0]
    narrow = kernel.run(np.ascontiguousarray(x[..., :20]), w, b)[0]
    assert wide.shape[-1] >= 24 > narrow.shape[-1]
    inside = (20 + 2 - 5) // stride + 1 - 1  # outputs whose windows end before column 20
    np.testing.assert_array_equal(wide[..., :inside], narrow[..., :inside])
    error = np.abs(wide.astype(np.float64) - _reference(x, w, b, attributes))
    assert np.all(error <= conv.error_bound(x, w, b, **attributes))


@pytest.mark.parametrize("threads", [1, 2])
def test_bands_of_one_row_read_the_padding_as_zeros(pools, monkeypatch, threads):
    """With bands of one output row (a tiny tile), the bands at the bottom read the padding
    rows as zeros, not the input rows an earlier band held in the tile; two images."""
    monkeypatch.setattr(filter_blocked, "TILE_BYTES", 1)
    rng = np.random.default_rng(6)
    attributes = {"strides": [1, 1], "pads": [2, 1, 3, 2]}
    x = rng.uniform(-1, 1, (2, 3, 17, 11)).astype(np.float32)
    w = rng.uniform(-1, 1, (10, 3, 5, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 10).astype(np.float32)
    got = _kernel(attributes, pools[threads]).run(x, w, b)[0]
    error = np.abs(got.astype(np.float64) - _reference(x, w, b, attributes))
    assert np.all(error <= conv.error_bound(x, w, b, **attributes))


@pytest.mark.parametrize("epilogue", ["relu6", "HardSwish", "HardSigmoid", "Swish", "residual"])
def test_fused_epilogues(pools, epilogue):
    """A fused clamp and a compiled activation (inside the kernel) and a residual with Relu
    (after it, on bands of rows) give the plain convolution finished alike, bitwise."""
    rng = np.random.default_rng(8)
    attributes = {"pads": [1, 1, 1, 1], "strides": [2, 2]}
    x = rng.uniform(-4, 4, (1, 3, 96, 80)).astype(np.float32)
    w = rng.uniform(-1, 1, (16, 3, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 16).astype(np.float32)
    assert_fused_epilogue_matches(_kernel(attributes, pools[2]), x, w, b, epilogue, rng)


@pytest.mark.parametrize("op_type", ["HardSwish", "HardSigmoid"])
@pytest.mark.parametrize("width", [30, 100])  # by positions; by columns
def test_gates_in_registers_keep_nan_and_infinities(pools, op_type, width):
    """HardSwish and HardSigmoid computed in registers give the bits of the compiled
    activation applied after, NaN and infinities included."""
    rng = np.random.default_rng(13)
    attributes = {"pads": [1, 1, 1, 1], "strides": [2, 2]}
    x = rng.uniform(-8, 8, (1, 3, 20, width)).astype(np.float32)
    x.flat[rng.choice(x.size, 30, replace=False)] = [np.nan, np.inf, -np.inf] * 10
    w = rng.uniform(-1, 1, (12, 3, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 12).astype(np.float32)
    plain = _kernel(attributes, pools[1])
    activation = in_place(op_type, {"alpha": 0.25, "beta": 0.4}, lambda block: None)
    expected = plain.run(x, w, b)[0]
    activation(expected)
    got = plain.variant(epilogue=activation).run(x, w, b)[0]
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(got).any()


def test_auto_computes_stems_and_arranges_their_weights(pools):
    """``auto`` picks ``filters_blocked`` for float32 2-D convolutions with at most three input
    channels and ``filters_blocked.maximum_taps`` taps (75; not 1x1), arranges constant
    weights once, and keeps im2col for the others and with 0."""
    rng = np.random.default_rng(4)
    attributes = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    w = rng.uniform(-1, 1, (24, 3, 3, 3)).astype(np.float32)
    kernel = _kernel(attributes, pools[1], values=None)
    assert kernel.problem((1, 3, 32, 32), w.shape).algorithm == "filters_blocked"
    special = kernel.specialize([None, w, None])
    assert special is not None and special._blocked.weights is w
    x = rng.uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
    b = rng.uniform(-1, 1, 24).astype(np.float32)
    np.testing.assert_array_equal(special.run(x, w, b)[0], kernel.run(x, w.copy(), b)[0])
    assert kernel.problem((1, 4, 32, 32), (24, 4, 3, 3)).algorithm == "im2col"
    assert kernel.problem((1, 3, 32, 32), (24, 3, 5, 5)).algorithm == "filters_blocked"
    assert kernel.problem((1, 3, 32, 32), (24, 3, 7, 7)).algorithm == "im2col"  # ResNet's stem
    never = _kernel(attributes, pools[1], values={conv.FILTERS_BLOCKED_TAPS: 0})
    assert never.problem((1, 3, 32, 32), w.shape).algorithm == "im2col"
    assert never.specialize([None, w, None]) is None
    assert _kernel({}, pools[1], values=None).problem((1, 3, 8, 8), (24, 3, 1, 1)).algorithm == "direct_1x1"
    dilated = _kernel(dict(attributes, dilations=[2, 2]), pools[1], values=None)
    assert dilated.problem((1, 3, 32, 32), w.shape).algorithm == "im2col"
    double = _kernel(attributes, pools[1], values=None, dtype=T.DOUBLE)
    assert double.problem((1, 3, 32, 32), w.shape).algorithm == "im2col"


def _epilogued(kernel, epilogue):
    """``kernel`` with a fused clamp (Relu6), a compiled activation, or a numpy epilogue."""
    if epilogue == "relu6":
        return kernel.variant(epilogue=lambda block: np.clip(block, 0, 6, out=block), clamp=(0.0, 6.0))
    if epilogue == "tanh":  # no compiled form: on the finished blocks
        return kernel.variant(epilogue=lambda block: np.tanh(block, out=block))
    if epilogue is not None:
        return kernel.variant(epilogue=in_place(epilogue, {}, lambda block: None))
    return kernel


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("epilogue", [None, "relu6", "HardSwish", "tanh"])
@pytest.mark.parametrize("shape", [(1, 3, 16, 16), (2, 3, 40, 52), (1, 2, 9, 7)],
                         ids=["positions", "columns", "two-channels"])
def test_the_settled_direct_call_gives_the_general_paths_bits(pools, threads, epilogue, shape):
    """A settled stem with constant weights and bias takes its call bound at settle
    (``_direct``: ``FiltersCall.bind``, its compiled entry): the general path's bits, with a
    fused clamp, a compiled activation or a numpy epilogue, at one thread and at two (plan
    ``region``), new or into a given buffer; a run changes no state of the kernel."""
    rng = np.random.default_rng(8)
    attributes = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    w = rng.uniform(-1, 1, (20, shape[1], 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 20).astype(np.float32)
    kernel = _epilogued(_kernel(attributes, pools[threads], values={conv.REGION_FLOPS: 1}), epilogue)
    settled = kernel.specialize([None, w, b]).settle([shape, w.shape])
    assert settled._settled.problem.algorithm == "filters_blocked"
    assert settled._settled.problem.plan == ("region" if threads == 2 else "serial")
    assert settled._direct is not None and settled._direct.w is w and settled._direct.b is b
    general = settled.variant()  # a copy: its runs go the general way
    x = rng.uniform(-3, 3, shape).astype(np.float32)
    state = {name: id(value) for name, value in vars(settled).items()}
    got = settled.run(x, w, b)[0]
    given = np.empty_like(got)
    assert settled._run((x, w, b), given)[0] is given
    assert {name: id(value) for name, value in vars(settled).items()} == state
    expected = general.run(x, w, b)[0]
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(given, expected)
    np.testing.assert_array_equal(settled.run(x, w.copy(), b)[0], expected)  # other weights
