"""The prepared steps of settled convolutions (``ConvKernel.prepare``): a 1x1 convolution
whose output needs no alignment, a depthwise one and a stem write their settled call's bits
into the memory plan's buffers without ``ConvKernel._run``; other weights take the general
path."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from test_conv_pointwise import _random_case

from onnx_light.kernels.conv import kernel as conv_kernel
from onnx_light.kernels.conv import pointwise
from onnx_light.runtime.session import RuntimeSession

F = TensorProto.FLOAT


def _model(x, w, b, depthwise, stem):
    """A 1x1 Conv (bias when ``b`` is given) then Relu, then optionally a 3x3 depthwise
    Conv with its bias, and a 1x1 Conv back to X's channels (no bias); a 3 -> C stem in
    front when ``stem``."""
    rng = np.random.default_rng(5)
    channels, filters = x.shape[1], w.shape[0]
    first = "s" if stem else "x"
    nodes = [helper.make_node("Conv", [first, "w", "b"] if b is not None else [first, "w"], ["c"]),
             helper.make_node("Relu", ["c"], ["r"])]
    initializers = [numpy_helper.from_array(w, "w")]
    if b is not None:
        initializers.append(numpy_helper.from_array(b, "b"))
    source = "r"
    if depthwise:
        nodes.append(helper.make_node("Conv", ["r", "dw", "db"], ["d"], group=filters, pads=[1] * 4))
        depthwise_w = rng.uniform(-1, 1, (filters, 1, 3, 3)).astype(np.float32)
        initializers += [numpy_helper.from_array(depthwise_w, "dw"),
                         numpy_helper.from_array(rng.uniform(-1, 1, filters).astype(np.float32), "db")]
        source = "d"
    nodes.append(helper.make_node("Conv", [source, "pw"], ["y"]))
    initializers.append(numpy_helper.from_array(
        rng.uniform(-1, 1, (channels, filters, 1, 1)).astype(np.float32), "pw"))
    shape = list(x.shape)
    if stem:
        nodes.insert(0, helper.make_node("Conv", ["x", "sw"], ["s"], pads=[1] * 4))
        initializers.append(numpy_helper.from_array(
            rng.uniform(-1, 1, (channels, 3, 3, 3)).astype(np.float32), "sw"))
        shape[1] = 3
    graph = helper.make_graph(nodes, "steps", [helper.make_tensor_value_info("x", F, shape)],
                              [helper.make_tensor_value_info("y", F, None),
                               helper.make_tensor_value_info("r", F, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv_steps(session):
    return [item for item in session._plan if item.op_type == "Conv"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channels=st.integers(1, 24), filters=st.integers(1, 20), height=st.integers(1, 6),
       width=st.integers(1, 7), bias=st.booleans(), depthwise=st.booleans(),
       seed=st.integers(0, 2**16))
def test_prepared_small_convolutions_skip_run_and_give_its_bits(monkeypatch, channels, filters, height,
                                                                width, bias, depthwise, seed):
    """Small 1x1 convolutions (outputs below ``ALIGNED_OUTPUT_BYTES``) and a depthwise one
    between them are prepared steps that a bound run computes without ``ConvKernel._run``:
    the bits of the unbound run (each kernel's ``run``), the first within conv.numerics's
    bound of the float64 product."""
    inputs, expected, bound = _random_case(seed, 1, channels, height, width, filters, bias, False, None)
    x, w, b = inputs
    session = RuntimeSession(_model(x, w, b, depthwise, False).SerializeToString(), num_threads=1)
    steps = _conv_steps(session)
    assert all(item.prepared is not None for item in steps)
    reference = session.run(None, {"x": x}, node_hook=lambda name, op_type: None)  # kernel.run
    with monkeypatch.context() as patch:
        for item in steps:
            patch.setattr(item.kernel, "_run", None)  # the prepared call alone runs
        got = session.run(None, {"x": x})
        again = session.run(None, {"x": x})
    for a, b_, c in zip(got, again, reference, strict=True):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b_, c)
    assert np.all(np.abs(got[1] - np.maximum(expected, 0)) <= bound)


def test_a_stem_is_prepared_and_skips_run(monkeypatch):
    """A 3 -> 8 stem (``filters_blocked``) before the 1x1 and depthwise ones: prepared, its
    bound call into the buffer, the unbound run's bits."""
    inputs, _, _ = _random_case(3, 1, 8, 6, 6, 8, True, False, None)
    x = np.random.default_rng(4).uniform(-1, 1, (1, 3, 6, 6)).astype(np.float32)
    session = RuntimeSession(_model(inputs[0], inputs[1], inputs[2], True, True).SerializeToString(),
                             num_threads=1)
    steps = _conv_steps(session)
    assert len(steps) == 4 and all(item.prepared is not None for item in steps)
    reference = session.run(None, {"x": x}, node_hook=lambda name, op_type: None)
    with monkeypatch.context() as patch:
        for item in steps:
            patch.setattr(item.kernel, "_run", None)
        got = session.run(None, {"x": x})
    for a, c in zip(got, reference, strict=True):
        np.testing.assert_array_equal(a, c)


def test_other_weights_and_large_outputs_take_the_general_path(monkeypatch):
    """The prepared call given weights other than the settled constants runs ``_run`` (the
    general path's bits); a 1x1 convolution whose bound call aligns its output is not
    prepared."""
    inputs, _, _ = _random_case(7, 1, 8, 4, 4, 8, True, False, None)
    x, w, b = inputs
    session = RuntimeSession(_model(x, w, b, False, False).SerializeToString(), num_threads=1)
    item = _conv_steps(session)[0]
    other = np.ascontiguousarray(w[::-1])
    out = np.empty(item.prepared.shape, np.float32)
    calls = []
    run = item.kernel._run
    monkeypatch.setattr(item.kernel, "_run", lambda *a: calls.append(1) or run(*a))
    item.prepared.compute(x, other, b, out=out)
    assert calls
    np.testing.assert_array_equal(out, item.kernel.run(x, other, b)[0])
    large = np.zeros((1, 8, 16, 16), np.float32)
    assert large.nbytes >= pointwise.ALIGNED_OUTPUT_BYTES
    session = RuntimeSession(_model(large, w, b, False, False).SerializeToString(), num_threads=1)
    assert all(item.prepared is None for item in _conv_steps(session))


def test_a_kernel_with_a_fused_residual_is_not_prepared():
    """A kernel with a fused residual is not prepared (its ``_Direct.into`` takes none)."""
    inputs, _, _ = _random_case(9, 1, 8, 4, 4, 8, True, False, None)
    session = RuntimeSession(_model(inputs[0], inputs[1], inputs[2], False, False).SerializeToString(),
                             num_threads=1)
    kernel = _conv_steps(session)[0].kernel
    assert isinstance(kernel, conv_kernel.ConvKernel)
    kernel.residual = True
    specs = [((1, 8, 4, 4), np.dtype(np.float32)), ((8, 8, 1, 1), np.dtype(np.float32))]
    assert kernel.prepare(specs) is None
