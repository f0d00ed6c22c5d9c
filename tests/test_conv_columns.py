"""Conv's column-blocked kernel for 1-D convolutions (``columns_blocked``,
onnx_light/kernels/conv/columns_blocked.py: a speech model's feature extractor and positional
convolution) against the ONNX reference within the bound of
``onnx_light.kernels.conv.numerics``, on random shapes (channels and filters per group not a
multiple of the lanes, 1 to 4 groups, kernels 1 to 12, strides 1 to 5, dilations, pads, bands
of a few columns), with its fused epilogues, at one and two threads (the same bits)."""

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
from onnx_light.kernels.conv.channel_blocked import COLUMN_VECTORS, vector_lanes
from onnx_light.parallel import ThreadPool

pytestmark = pytest.mark.skipif(not vector_lanes(),
                                reason="the column-blocked kernel needs AVX-512 or AVX2 with FMA")
T = TensorProto
FORCED = {conv.ALGORITHM: "columns_blocked", conv.REGION_FLOPS: 1}


@pytest.fixture(scope="module")
def pools():
    with ThreadPool(1) as one, ThreadPool(2) as two:
        yield {1: one, 2: two}


def _kernel(attributes, pool, values=FORCED):
    ctx = NodeContext("conv1d", "Conv", "", 22, attributes, (T.FLOAT,) * 3, (T.FLOAT,), 3, 1)
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


def _arrays(x_shape, w_shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, x_shape).astype(np.float32), rng.uniform(-1, 1, w_shape).astype(np.float32),
            rng.uniform(-1, 1, w_shape[0]).astype(np.float32))


@st.composite
def cases(draw):
    """(x shape, w shape, attributes, tile bytes): 1-D, 1 to 4 groups of 1 to 9 channels and 1
    to 20 filters, kernels 1 to 12, strides 1 to 5, dilations 1 to 3, pads 0 to 4, at least
    a chunk (3 vectors) of output columns; tiles of one chunk's columns to all of them."""
    groups = draw(st.integers(1, 4))
    channels, filters = draw(st.integers(1, 9)), draw(st.integers(1, 20))
    kernel, stride, dilation = draw(st.integers(1, 12)), draw(st.integers(1, 5)), draw(st.integers(1, 3))
    pads = [draw(st.integers(0, 4)), draw(st.integers(0, 4))]
    span = COLUMN_VECTORS * vector_lanes()
    outputs = draw(st.integers(span, 4 * span))
    length = max(1, (outputs - 1) * stride + (kernel - 1) * dilation + 1 - sum(pads))
    attributes = {"strides": [stride], "pads": pads, "dilations": [dilation], "group": groups}
    return ((draw(st.integers(1, 2)), groups * channels, length), (groups * filters, channels, kernel),
            attributes, draw(st.sampled_from([1, 1 << 10, 1 << 16])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases(), seed=st.integers(0, 2**16))
def test_matches_the_reference_evaluator(pools, case, seed):
    """Within the bound, whatever the tile's bands; the same bits on one and two threads."""
    x_shape, w_shape, attributes, tile = case
    x, w, b = _arrays(x_shape, w_shape, seed)
    values = {**FORCED, conv.COLUMNS_TILE: tile}
    one = _kernel(attributes, pools[1], values)
    problem = one.problem(x.shape, w.shape)
    if problem.window.output[0] < COLUMN_VECTORS * vector_lanes():
        assert problem.algorithm == "im2col"  # too few columns: it does not apply
        return
    assert problem.algorithm == "columns_blocked"
    got = one.run(x, w, b)[0]
    error = np.abs(got.astype(np.float64) - _reference(x, w, b, attributes))
    assert np.all(error <= conv.error_bound(x, w, b, **attributes))
    two = _kernel(attributes, pools[2], values)
    assert two.problem(x.shape, w.shape).plan == "region"
    np.testing.assert_array_equal(two.run(x, w, b)[0], got)
    np.testing.assert_array_equal(_kernel(attributes, pools[1], {**FORCED, conv.COLUMNS_TILE: 1 << 40})
                                  .run(x, w, b)[0], got)


@pytest.mark.parametrize(("x_shape", "w_shape", "attributes"), [
    ((1, 1, 16000), (128, 1, 10), {"strides": [5]}),  # wav2vec2's first convolution
    ((1, 64, 49), (64, 4, 16), {"pads": [8, 8], "group": 16}),  # its positional convolution, smaller
])
def test_the_speech_shapes(pools, x_shape, w_shape, attributes):
    """``auto`` picks ``columns_blocked`` for wav2vec2's waveform and positional convolutions
    (at most ``columns_blocked.maximum_channels`` channels per group) and im2col for its 128
    channel ones; the results are within the bound, the same bits at two threads."""
    x, w, b = _arrays(x_shape, w_shape, 3)
    auto = {conv.REGION_FLOPS: 1}
    one = _kernel(attributes, pools[1], auto)
    assert one.problem(x.shape, w.shape).algorithm == "columns_blocked"
    wide = _kernel({"strides": [2]}, pools[1], auto)
    assert wide.problem((1, 128, 799), (128, 128, 3)).algorithm == "im2col"
    depthwise = _kernel({"group": 64}, pools[1], auto)
    assert depthwise.problem((1, 64, 49), (64, 1, 16)).algorithm == "depthwise"
    got = one.run(x, w, b)[0]
    error = np.abs(got.astype(np.float64) - _reference(x, w, b, attributes))
    assert np.all(error <= conv.error_bound(x, w, b, **attributes))
    np.testing.assert_array_equal(_kernel(attributes, pools[2], auto).run(x, w, b)[0], got)
    never = _kernel(attributes, pools[1], {conv.COLUMNS_CHANNELS: 0})
    assert never.problem(x.shape, w.shape).algorithm == "im2col"


def test_constant_weights_are_arranged_once(pools):
    """With constant weights the kernel arranges them at construction (``specialize``) and
    its runs give the bits of the kernel that arranges them on each run."""
    attributes = {"strides": [2], "pads": [1, 1], "group": 2}
    x, w, b = _arrays((1, 6, 200), (10, 3, 3), 4)
    kernel = _kernel(attributes, pools[1])
    special = kernel.specialize([None, w, b])
    assert special is not None and special._blocked is not None and special._blocked.weights is w
    np.testing.assert_array_equal(special.run(x, w, b)[0], kernel.run(x, w, b)[0])


@pytest.mark.parametrize("epilogue", ["relu6", "HardSwish", "Swish", "residual"])
def test_fused_epilogues(pools, epilogue):
    """A clamp and HardSwish computed in registers, SiLU after the stored columns (which the
    overlapping last chunk writes again), a residual Add then Relu after the call: what the
    plain convolution followed by the epilogue gives, bit for bit, at both thread counts."""
    rng = np.random.default_rng(11)
    attributes = {"strides": [2], "pads": [2, 1]}
    x, w, b = _arrays((2, 5, 131), (13, 5, 4), 12)
    for threads in (1, 2):
        assert_fused_epilogue_matches(_kernel(attributes, pools[threads]), x, w, b, epilogue, rng)
