"""Conv's compiled ``depthwise`` algorithm against the ONNX reference and onnxruntime, within
the bound of ``onnx_light.kernels.conv.numerics`` (:func:`error_bound`), on random shapes,
strides, pads, dilations and channel multipliers, 1-D and 2-D, every element type Conv takes."""

from __future__ import annotations

from unittest import mock

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import conv
from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.kernels.compiled_activations import in_place
from onnx_light.kernels.conv.depthwise import depthwise_channels, plane_layout
from onnx_light.parallel import ThreadPool

T = TensorProto
FORCED = {conv.ALGORITHM: "depthwise", conv.REGION_FLOPS: 1}


@pytest.fixture(scope="module")
def pools():
    with ThreadPool(1) as one, ThreadPool(2) as two:
        yield {1: one, 2: two}


def _model(attributes, element_type, bias, opset=22):
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    node = helper.make_node("Conv", inputs, ["y"], **attributes)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info(n, element_type, None)
                                               for n in inputs],
                              [helper.make_tensor_value_info("y", element_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(x, w, b):
    return {"x": x, "w": w} | ({"b": b} if b is not None else {})


def _kernel(attributes, pool, element_type=T.FLOAT, values=FORCED, bias=True):
    inputs = 3 if bias else 2
    ctx = NodeContext("dw", "Conv", "", 22, attributes, (element_type,) * inputs, (element_type,),
                      inputs, 1)
    kernel = conv.ConvKernel(ctx).bind(pool)
    kernel.configure(values)
    return kernel


def _bound(x, w, b, attributes, **types):
    window = {k: v for k, v in attributes.items() if k != "group"}
    return conv.error_bound(x, w, b, group=attributes["group"], **types, **window)


def _assert_within(got, expected, bound):
    assert got.shape == expected.shape
    error = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    assert np.all(error <= bound), f"max error {error.max()}, bound there {bound.flat[np.argmax(error)]}"


@st.composite
def depthwise_cases(draw):
    """(x shape, w shape, attributes): 1-D or 2-D, kernel widths of 1, 3, 5 or 7 (each width is
    one compiled version), any kernel height, strides, dilations, pads and multiplier."""
    rank = draw(st.sampled_from([1, 2]))
    channels = draw(st.integers(2, 6))
    multiplier = draw(st.sampled_from([1, 1, 2]))
    kernel = ([draw(st.integers(1, 7))] if rank == 2 else []) + [draw(st.sampled_from([1, 3, 5, 7]))]
    strides = [draw(st.integers(1, 3)) for _ in kernel]
    dilations = [draw(st.integers(1, 2)) for _ in kernel]
    pads = [draw(st.integers(0, 3)) for _ in range(2 * rank)]
    size = [draw(st.integers(max(1, (k - 1) * d + 1 - p - q), 20))
            for k, d, p, q in zip(kernel, dilations, pads[:rank], pads[rank:], strict=True)]
    attributes = {"group": channels, "strides": strides, "dilations": dilations, "pads": pads}
    batch = draw(st.integers(1, 2))
    return (batch, channels, *size), (channels * multiplier, 1, *kernel), attributes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=depthwise_cases(), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_matches_the_reference_evaluator(pools, case, bias, seed):
    """Random geometries, 1 and 2 threads: within the bound, and the same bits either way."""
    x_shape, w_shape, attributes = case
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, x_shape).astype(np.float32)
    w = rng.uniform(-1, 1, w_shape).astype(np.float32)
    b = rng.uniform(-1, 1, w_shape[0]).astype(np.float32) if bias else None
    inputs = (x, w, b) if bias else (x, w)
    expected = ReferenceEvaluator(_model(attributes, T.FLOAT, bias)).run(None, _feeds(x, w, b))[0]
    one = _kernel(attributes, pools[1], bias=bias)
    assert one.problem(x.shape, w.shape).algorithm == "depthwise"
    got = one.run(*inputs)[0]
    _assert_within(got, expected, _bound(x, w, b, attributes))
    two = _kernel(attributes, pools[2], bias=bias)
    assert two.problem(x.shape, w.shape).plan == "region"  # both threads inside the call
    np.testing.assert_array_equal(two.run(*inputs)[0], got)
    assert not np.shares_memory(got, x)


# MobileNetV2's depthwise convolutions (torchvision, 224x224) and 5x5 / 7x7 ones (EfficientNet,
# ConvNeXt), scaled down in channels to keep the test quick.
MOBILE_SHAPES = [
    ((1, 32, 112, 112), 3, 1), ((1, 24, 112, 112), 3, 2), ((1, 36, 56, 56), 3, 1),
    ((1, 48, 28, 28), 3, 1), ((1, 96, 14, 14), 3, 1), ((1, 144, 14, 14), 3, 2), ((1, 240, 7, 7), 3, 1),
    ((1, 24, 28, 28), 5, 1), ((1, 24, 28, 28), 5, 2), ((2, 16, 14, 14), 7, 1), ((1, 16, 14, 14), 7, 2),
]


@pytest.mark.parametrize(("x_shape", "kernel_size", "stride"), MOBILE_SHAPES,
                         ids=[f"{s[1]}x{s[2]}-k{k}s{t}" for s, k, t in MOBILE_SHAPES])
def test_matches_onnxruntime_at_mobile_shapes(pools, x_shape, kernel_size, stride):
    channels = x_shape[1]
    pad = kernel_size // 2
    attributes = {"group": channels, "strides": [stride, stride], "pads": [pad] * 4}
    rng = np.random.default_rng(kernel_size * 10 + stride)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal((channels, 1, kernel_size, kernel_size)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    session = ort.InferenceSession(_model(attributes, T.FLOAT, True, opset=17).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    expected = session.run(None, _feeds(x, w, b))[0]
    # the portable configuration chooses a compiled kernel for these
    kernel = _kernel(attributes, pools[2], values=None)
    assert kernel.problem(x.shape, w.shape).algorithm in ("depthwise", "depthwise_blocked")
    got = kernel.run(x, w, b)[0]
    # onnxruntime's own rounding is in the bound as well: twice it covers both
    _assert_within(got, expected, 2 * _bound(x, w, b, attributes))


@pytest.mark.parametrize("element_type", [T.DOUBLE, T.FLOAT16, T.BFLOAT16],
                         ids=["double", "float16", "bfloat16"])
@pytest.mark.parametrize("attributes", [
    {"group": 4, "pads": [1, 2, 1, 0], "strides": [2, 1]},
    {"group": 4, "dilations": [2, 2], "pads": [2, 2, 2, 2]},
], ids=["strided", "dilated"])
def test_other_types(pools, element_type, attributes):
    """double computes in double; float16 and bfloat16 in float32, rounded once."""
    dtype = {T.DOUBLE: np.float64, T.FLOAT16: np.float16, T.BFLOAT16: ml_dtypes.bfloat16}[element_type]
    wide = np.float64 if element_type == T.DOUBLE else np.float32
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (2, 4, 11, 10)).astype(dtype)
    w = rng.uniform(-1, 1, (8, 1, 3, 3)).astype(dtype)
    b = rng.uniform(-1, 1, 8).astype(dtype)
    expected = ReferenceEvaluator(_model(attributes, T.DOUBLE, True)).run(
        None, _feeds(*(a.astype(np.float64) for a in (x, w, b))))[0]
    got = _kernel(attributes, pools[2], element_type).run(x, w, b)[0]
    assert got.dtype == dtype
    _assert_within(got, expected, _bound(x, w, b, attributes, compute_dtype=wide, output_dtype=dtype,
                                         reference=expected))


def test_the_clamp_is_the_clipped_result():
    """The kernel's clamp bounds (a fused Relu6) give the unclamped result clipped."""
    rng = np.random.default_rng(6)
    x = rng.uniform(-4, 4, (3, 9, 9)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 3).astype(np.float32)
    layout = plane_layout((9, 9), (9, 9), (3, 3), (1, 1), (1, 1), (1, 1))
    free, clamped = np.empty((3, 9, 9), np.float32), np.empty((3, 9, 9), np.float32)
    depthwise_channels(x, w, b, free, 0, 3, 1, (1, 1), (1, 1), *layout, -np.inf, np.inf)
    depthwise_channels(x, w, b, clamped, 0, 3, 1, (1, 1), (1, 1), *layout, 0.0, 6.0)
    assert free.min() < 0 and free.max() > 6  # the inputs reach both bounds
    np.testing.assert_array_equal(clamped, np.clip(free, 0, 6))


def test_an_epilogue_and_a_residual_reach_every_block(pools):
    """A fused Relu and residual applied by blocks of channels (several blocks here) give
    the plain convolution plus the residual, then Relu."""
    rng = np.random.default_rng(7)
    attributes = {"group": 64, "pads": [1, 1, 1, 1]}
    x = rng.uniform(-1, 1, (2, 64, 40, 40)).astype(np.float32)
    w = rng.uniform(-1, 1, (64, 1, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 64).astype(np.float32)
    residual = rng.uniform(-1, 1, (2, 64, 40, 40)).astype(np.float32)
    plain = _kernel(attributes, pools[2]).run(x, w, b)[0]

    def relu(block):
        np.maximum(block, 0, out=block)

    fused = _kernel(attributes, pools[2]).variant(epilogue=relu, residual=True)
    got = fused.run(x, w, b, residual)[0]
    np.testing.assert_array_equal(got, np.maximum(plain + residual, 0))


def test_constant_weights_compile_at_construction(pools):
    """``specialize`` (session construction) compiles the kernel for the weights' type and
    width: the first run then needs no compilation, whether its arrays are writable (a
    caller's) or read-only (a session's feeds and constants)."""
    attributes = {"group": 3, "pads": [0, 3, 0, 3]}
    w = np.ones((3, 1, 1, 7), np.float64)
    kernel = _kernel(attributes, pools[1], T.DOUBLE)
    kernel.specialize([None, w, None])
    signatures = set(depthwise_channels.dispatcher.signatures)
    assert any(s[0].dtype.name == "float64" and len(s[-3]) == 7 for s in signatures)
    x = np.ones((1, 3, 4, 5))
    kernel.run(x, w, np.zeros(3))
    x.flags.writeable = w.flags.writeable = False
    kernel.run(x, w, np.zeros(3))
    assert set(depthwise_channels.dispatcher.signatures) == signatures


def test_calibration_turns_the_compiled_kernel_off_where_it_is_slower(monkeypatch):
    """With a clock on which the compiled kernel is slow, the calibration validates the
    candidates and keeps one that computes the depthwise case without it."""
    from onnx_light.kernels.conv import channel_blocked, depthwise
    from onnx_light.tuning.calibration import Budget
    from onnx_light.tuning.processor import execution_descriptor

    clock = [0.0]

    def slowed(run):
        def slow_run(self, *arguments):
            clock[0] += 1.0
            run(self, *arguments)
        return slow_run

    def timer():
        clock[0] += 1e-3
        return clock[0]

    # both the algorithm objects' blocks and the kernel's direct path run through the calls
    for call in (depthwise.DepthwiseCall, channel_blocked.BlockedCall):
        monkeypatch.setattr(call, "run", slowed(call.run))
    corpus = (conv.CorpusCase("tiny_depthwise", "test", 6, (9, 9), 6, (3, 3), pads=(1, 1, 1, 1),
                              group=6),)
    result = conv.calibrate_conv(conv.DECLARATIONS[0], conv.conv_schema(T.FLOAT).key,
                                 execution_descriptor(1), Budget(120.0, 1 << 30, 1), timer=timer,
                                 corpus=corpus)
    assert not result.portable_kept
    assert result.values[conv.AUTO_DEPTHWISE] == "im2col_wide" or result.values[conv.ALGORITHM] == "im2col"


def test_without_vector_lanes_the_per_channel_kernel_computes_float32(pools, monkeypatch):
    """Where the processor has neither AVX-512 nor AVX2 with FMA the channel-blocked kernel
    does not apply: ``auto`` keeps the per-channel one (and its results) whatever
    ``depthwise.blocked_outputs``."""
    from onnx_light.kernels.conv import channel_blocked

    monkeypatch.setattr(channel_blocked, "vector_lanes", lambda: 0)
    attributes = {"group": 23, "pads": [1, 1, 1, 1], "strides": [2, 2]}
    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, (1, 23, 13, 11)).astype(np.float32)  # a shape no other test decides
    w = rng.uniform(-1, 1, (23, 1, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 23).astype(np.float32)
    kernel = _kernel(attributes, pools[1], values={conv.BLOCKED_OUTPUTS: 1 << 20})
    assert kernel.problem(x.shape, w.shape).algorithm == "depthwise"
    assert kernel.specialize([None, w, None]) is None  # no weights arranged, nothing compiled
    expected = ReferenceEvaluator(_model(attributes, T.FLOAT, True)).run(None, _feeds(x, w, b))[0]
    _assert_within(kernel.run(x, w, b)[0], expected, _bound(x, w, b, attributes))


# ---------------------------------------------------------------- the direct path

def _general(kernel, *inputs):
    """``kernel``'s output through the general path (the algorithm object and the plan)."""
    with mock.patch.object(conv.ConvKernel, "_run_depthwise", lambda *arguments: None):
        return kernel.run(*inputs)[0]


@st.composite
def direct_cases(draw):
    """(x shape, w shape, attributes, algorithm, type): 2-D (or 1-D for ``depthwise``), one
    filter per group, kernels of 3, 5 or 7, strides 1 or 2, any pads."""
    algorithm = draw(st.sampled_from(["depthwise", "depthwise_blocked"]))
    blocked = algorithm == "depthwise_blocked"
    rank = 2 if blocked else draw(st.sampled_from([1, 2]))
    kernel = draw(st.sampled_from([3, 5, 7]))
    strides = [draw(st.integers(1, 2)) for _ in range(rank)]
    pads = [draw(st.integers(0, kernel // 2)) for _ in range(2 * rank)]
    size = [draw(st.integers(max(1, kernel - p - q), 24))
            for p, q in zip(pads[:rank], pads[rank:], strict=True)]
    channels = draw(st.integers(2, 20))
    dtype = np.float32 if blocked else draw(st.sampled_from([np.float32, np.float64]))
    attributes = {"group": channels, "strides": strides, "pads": pads}
    return ((draw(st.integers(1, 2)), channels, *size), (channels, 1, *[kernel] * rank), attributes,
            algorithm, dtype)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=direct_cases(), bias=st.booleans(),
       epilogue=st.sampled_from([None, "relu6", "HardSwish", "Sigmoid", "tanh"]),
       threads=st.sampled_from([1, 2]), constant=st.booleans(), seed=st.integers(0, 2**16))
def test_the_direct_path_gives_the_general_paths_bits(pools, case, bias, epilogue, threads, constant,
                                                      seed):
    """``_run_depthwise`` (the call object, no algorithm object) against the general path:
    the same bits, with or without bias, a fused clamp, a compiled activation or a numpy
    epilogue, at 1 and 2 threads (plan ``region``), constant weights or not, and for a second
    weight set of the same shape (the remembered operands follow the arrays)."""
    x_shape, w_shape, attributes, algorithm, dtype = case
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, x_shape).astype(dtype)
    weights = [rng.uniform(-1, 1, w_shape).astype(dtype) for _ in range(2)]
    b = rng.uniform(-1, 1, w_shape[0]).astype(dtype) if bias else None
    element_type = T.FLOAT if dtype == np.float32 else T.DOUBLE
    kernel = _kernel(attributes, pools[threads], element_type,
                     values={conv.ALGORITHM: algorithm, conv.REGION_FLOPS: 1}, bias=bias)
    if constant:
        kernel = kernel.specialize([None, weights[0], b]) or kernel
    if epilogue == "relu6":
        kernel = kernel.variant(epilogue=lambda block: np.clip(block, 0, 6, out=block), clamp=(0.0, 6.0))
    elif epilogue == "tanh":  # an epilogue with no compiled form: on the finished blocks
        kernel = kernel.variant(epilogue=lambda block: np.tanh(block, out=block))
    elif epilogue is not None:
        kernel = kernel.variant(epilogue=in_place(epilogue, {}, lambda block: None))
    problem = kernel.problem(x.shape, w_shape)
    assert problem.algorithm == algorithm
    assert problem.plan == ("region" if threads == 2 else "serial")
    inputs = (b,) if bias else ()
    for w in weights:
        got = kernel.run(x, w, *inputs)[0]
        assert kernel._depthwise_call[0] is problem  # the direct path ran
        np.testing.assert_array_equal(got, _general(kernel, x, w, *inputs))
        assert got.dtype == dtype


@pytest.mark.parametrize("algorithm", ["depthwise", "depthwise_blocked"])
@pytest.mark.parametrize(("inputs", "message"), [
    (lambda x, w, b: (x, w, b[:3]), "B must have shape"),
    (lambda x, w, b: (x[:, :4], w, b), "channels"),
    (lambda x, w, b: (x, w.astype(np.float64), b), "same type"),
    (lambda x, w, b: (x.astype(np.int32), w.astype(np.int32), b.astype(np.int32)), "floating point"),
    (lambda x, w, b: (x[..., None], w, b), "rank"),
], ids=["bias", "channels", "types", "integers", "rank"])
def test_the_direct_path_keeps_the_errors(pools, algorithm, inputs, message):
    """Bad inputs get the general path's errors, whether or not the direct path may run."""
    rng = np.random.default_rng(11)
    x = rng.uniform(-1, 1, (1, 8, 9, 9)).astype(np.float32)
    w = rng.uniform(-1, 1, (8, 1, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 8).astype(np.float32)
    kernel = _kernel({"group": 8, "pads": [1, 1, 1, 1]}, pools[2],
                     values={conv.ALGORITHM: algorithm, conv.REGION_FLOPS: 1})
    kernel.run(x, w, b)  # the direct path's call and operands remembered
    with pytest.raises(KernelError, match=message) as direct:
        kernel.run(*inputs(x, w, b))
    with pytest.raises(KernelError) as general:
        _general(kernel, *inputs(x, w, b))
    assert str(direct.value) == str(general.value)
    fused = kernel.variant(residual=True, epilogue=lambda block: np.maximum(block, 0, out=block))
    with pytest.raises(KernelError, match="residual"):
        fused.run(x, w, b, np.zeros((1, 8, 9, 8), np.float32))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("epilogue", [None, "relu6", "HardSwish", "tanh"])
@pytest.mark.parametrize(("algorithm", "shape"), [("depthwise_blocked", (2, 12, 9, 7)),
                                                  ("depthwise", (2, 12, 9, 7)),
                                                  ("depthwise", (1, 6, 11))])
def test_the_settled_direct_call_gives_the_general_paths_bits(pools, threads, epilogue, algorithm,
                                                              shape):
    """A settled depthwise convolution with constant weights and bias takes its call bound at
    settle (``_direct``: the call object's ``bind``, its compiled entry): the general path's
    bits, with a fused clamp, a compiled activation or a numpy epilogue, at one thread and at
    two (plan ``region``), new or into a given buffer; a run changes no state of the kernel."""
    rng = np.random.default_rng(9)
    channels, rank = shape[1], len(shape) - 2
    attributes = {"group": channels, "strides": [2] * rank, "pads": [1] * (2 * rank)}
    w = rng.uniform(-1, 1, (channels, 1, *[3] * rank)).astype(np.float32)
    b = rng.uniform(-1, 1, channels).astype(np.float32)
    kernel = _kernel(attributes, pools[threads], values={conv.ALGORITHM: algorithm, conv.REGION_FLOPS: 1})
    if epilogue == "relu6":
        kernel = kernel.variant(epilogue=lambda block: np.clip(block, 0, 6, out=block), clamp=(0.0, 6.0))
    elif epilogue == "tanh":  # an epilogue with no compiled form: on the finished blocks
        kernel = kernel.variant(epilogue=lambda block: np.tanh(block, out=block))
    elif epilogue is not None:
        kernel = kernel.variant(epilogue=in_place(epilogue, {}, lambda block: None))
    settled = (kernel.specialize([None, w, b]) or kernel).settle([shape, w.shape])
    assert settled._settled.problem.algorithm == algorithm
    assert settled._settled.problem.plan == ("region" if threads == 2 else "serial")
    assert settled._direct is not None
    general = settled.variant()  # a copy: its runs go the general way
    x = rng.uniform(-3, 3, shape).astype(np.float32)
    state = {name: id(value) for name, value in vars(settled).items()}
    got = settled.run(x, w, b)[0]
    given = np.empty_like(got)
    assert settled._run((x, w, b), given)[0] is given
    assert {name: id(value) for name, value in vars(settled).items()} == state
    expected = _general(general, x, w, b)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(given, expected)
