"""Squeeze-and-excitation gates fused into one step (runtime/se_fusion.py,
kernels/squeeze_excite.py): the fused session against the unfused one, bit for bit, and the
cases the pattern leaves alone."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.base import KernelError
from onnx_light.kernels.conv.pointwise import pointwise_vector
from onnx_light.kernels.squeeze_excite import SqueezeExcite, gate_layer
from onnx_light.runtime import RuntimeSession, fusion

TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def _gate_model(channels, reduced, x_shape, act="Relu", gate="HardSigmoid", dtype=np.float32,
                outputs=("y",), rng=None, pads=0, extra=()):
    """x -> GlobalAveragePool -> Conv 1x1 -> act -> Conv 1x1 -> gate -> Mul with x -> y."""
    rng = rng or np.random.default_rng(3)

    def tensor(name, shape):
        return numpy_helper.from_array(rng.uniform(-1, 1, shape).astype(dtype), name)

    init = [tensor("w1", [reduced, channels, 1, 1]), tensor("b1", [reduced]),
            tensor("w2", [channels, reduced, 1, 1]), tensor("b2", [channels])]
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["f1"], pads=[pads] * 4)]
    if act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["f1"], ["g1"]), helper.make_node("Mul", ["f1", "g1"], ["a"])]
    elif act is not None:
        nodes.append(helper.make_node(act, ["f1"], ["a"]))
    nodes.append(helper.make_node("Conv", ["a" if act else "f1", "w2", "b2"], ["f2"]))
    if gate is not None:
        nodes.append(helper.make_node(gate, ["f2"], ["s"]))
    nodes.append(helper.make_node("Mul", ["x", "s" if gate else "f2"], ["y"]))
    nodes += list(extra)
    element = TYPES[dtype]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", element, list(x_shape))],
                              [helper.make_tensor_value_info(name, element, None) for name in outputs],
                              initializer=init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _gates(session):
    return [kernel for kernel, _, _ in session._steps if isinstance(kernel, SqueezeExcite)]


def _compare(model, x, threads=1, fused_gates=1):
    """The session with the gate fused gives the values of the one with every other fusion
    but this one, bit for bit, and those of the unfused graph within the compiled
    activations' bound (Sigmoid's 4 units in the last place: kernels/compiled_activations.py)."""
    fused = RuntimeSession(model, num_threads=threads)
    with mock.patch.object(fusion, "fuse_squeeze_excite", lambda steps, *_: list(steps)):
        others = RuntimeSession(model, num_threads=threads)
    plain = RuntimeSession(model, num_threads=threads, fuse=False)
    assert len(_gates(fused)) == fused_gates and not _gates(others)
    for _ in range(2):  # the prepared plan, twice (its buffers reused)
        got = fused.run(None, {"x": x})
        for a, b, c in zip(got, others.run(None, {"x": x}), plain.run(None, {"x": x}), strict=True):
            np.testing.assert_array_equal(a, b)
            bound = 8 * np.finfo(a.dtype).eps * (np.abs(c) + np.abs(c).max())
            np.testing.assert_array_less(np.abs(a - c), bound + np.finfo(a.dtype).tiny)
    return fused


@pytest.mark.parametrize(("act", "gate"), [("Relu", "HardSigmoid"), ("SiLU", "Sigmoid"),
                                           (None, None), ("Relu", "HardSwish")])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_gate_is_one_step_with_the_unfused_values(act, gate, threads):
    x = np.random.default_rng(1).standard_normal((2, 24, 7, 5)).astype(np.float32)
    fused = _compare(_gate_model(24, 6, x.shape, act, gate), x, threads)
    # the pool, both convolutions and their activations are one step, the Mul another
    assert len(fused._steps) == 2


def test_double_with_a_clamp_is_fused_and_exact():
    x = np.random.default_rng(2).standard_normal((1, 5, 3, 4))
    _compare(_gate_model(5, 3, x.shape, "Relu", None, dtype=np.float64), x)


@settings(deadline=None, derandomize=True, max_examples=20)
@given(st.integers(1, 40), st.integers(1, 9), st.integers(1, 3), st.integers(1, 9), st.integers(1, 9),
       st.sampled_from([("Relu", "HardSigmoid"), ("SiLU", "Sigmoid")]), st.integers(0, 2**31))
def test_random_shapes(channels, reduced, batch, height, width, pair, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((batch, channels, height, width)) * 4).astype(np.float32)
    x.reshape(-1)[:1] = -0.0
    _compare(_gate_model(channels, reduced, x.shape, *pair, rng=rng), x)


def test_one_dimensional_planes():
    rng = np.random.default_rng(4)
    model = _gate_model(6, 2, (1, 6, 9), rng=rng)
    for name in ("w1", "w2"):  # 1-D convolutions: weights (M, C, 1), no pads
        tensor = next(t for t in model.graph.initializer if t.name == name)
        tensor.dims[:] = list(tensor.dims[:3])
    for node in model.graph.node:
        if node.op_type == "Conv":
            del node.attribute[:]
    _compare(model, rng.standard_normal((1, 6, 9)).astype(np.float32))


@pytest.mark.parametrize("case", ["pool_read_again", "hidden_is_an_output", "padded", "leaky",
                                  "gate_is_an_output"])
def test_what_the_pattern_leaves_alone(case):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 4, 4)).astype(np.float32)
    arguments: dict = {"rng": rng}
    gates = 0
    if case == "pool_read_again":
        arguments["extra"] = [helper.make_node("Neg", ["p"], ["r"])]
        arguments["outputs"] = ("y", "r")
    elif case == "hidden_is_an_output":
        arguments["outputs"] = ("y", "f1")
        arguments["act"] = None
    elif case == "padded":  # a padded 1x1 convolution of 1x1 planes grows them
        arguments["pads"] = 1
        x = rng.standard_normal((1, 8, 1, 1)).astype(np.float32)
    elif case == "leaky":  # an activation the compiled finishing does not apply
        arguments["act"] = "LeakyRelu"
    else:  # the gate itself may be read by anything: it is the fused step's output
        arguments["outputs"] = ("y", "s")
        gates = 1
    if case == "padded":
        model = _gate_model(8, 4, x.shape, **arguments)
        model.graph.node[-1].input[:] = ["s", "s"]  # the Mul of planes of other sizes
    else:
        model = _gate_model(8, 4, x.shape, **arguments)
    _compare(model, x, fused_gates=gates)


def test_other_shapes_run_and_bad_ones_name_the_node():
    model = _gate_model(8, 4, ("n", 8, "h", "w"))
    session = RuntimeSession(model)
    (gate,) = _gates(session)
    plain = RuntimeSession(model, fuse=False)
    for shape in [(1, 8, 3, 3), (3, 8, 1, 6), (0, 8, 2, 2)]:
        x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])
    x = np.ones((1, 8, 3, 3), np.float32)
    (out,) = gate.run(x[:, :, ::2, ::2])  # a view: made contiguous first
    assert out.shape == (1, 8, 1, 1) and not np.shares_memory(out, x)
    with pytest.raises(KernelError, match=r"SqueezeExcite.*X must have shape \(N, 8, D1, \.\.\.\)"):
        gate.run(np.ones((1, 7, 3, 3), np.float32))
    # empty planes: NaN means, as numpy's mean gives them (with its warning) to the unfused steps
    (empty,) = gate.run(np.ones((2, 8, 0, 3), np.float32))
    assert empty.shape == (2, 8, 1, 1) and np.isnan(empty).all()


@pytest.mark.parametrize(("shape", "filters", "scaled"), [((1, 16, 2, 3), 16, "x"), ((2, 16, 1, 2), 3, "x"),
                                                          ((1, 4, 8, 8), 4, "w"), ((3, 5, 6, 6), 2, "w")])
def test_the_projection_scales_the_smaller_operand(shape, filters, scaled):
    """The fused Mul scales X when it is the smaller (the unfused products, bit for bit), else
    the weights' input channels (one more rounding per term)."""
    rng = np.random.default_rng(7)
    model = _gate_model(shape[1], 3, shape, rng=rng)
    model.graph.node[-1].output[:] = ["m"]
    model.graph.node.append(helper.make_node("Conv", ["m", "wp"], ["y"]))
    model.graph.initializer.append(numpy_helper.from_array(
        rng.uniform(-1, 1, (filters, shape[1], 1, 1)).astype(np.float32), "wp"))
    x = rng.standard_normal(shape).astype(np.float32)
    fused = RuntimeSession(model)
    projection = fused._steps[-1][0]
    assert projection.channel_scale and len(fused._steps) == 2
    got, expected = fused.run(None, {"x": x})[0], RuntimeSession(model, fuse=False).run(None, {"x": x})[0]
    if scaled == "x":
        np.testing.assert_array_equal(got, expected)
    else:
        bound = 4 * np.finfo(np.float32).eps * (shape[1] + 2) * (np.abs(expected).max() + 1)
        np.testing.assert_allclose(got, expected, rtol=0, atol=bound)


@pytest.mark.parametrize("code", [-1, 0, 1, 2, 3])
@pytest.mark.parametrize(("batch", "filters", "depth"), [(1, 1152, 48), (2, 7, 33), (1, 1, 1)])
def test_a_gate_layer_is_the_pointwise_vector_product_bit_for_bit(code, batch, filters, depth):
    rng = np.random.default_rng(code + 10)
    weights = rng.standard_normal(filters * depth).astype(np.float32)
    source = (rng.standard_normal(batch * depth) * 30).astype(np.float32)
    source[:4] = [np.nan, -0.0, np.inf, -np.inf][:source.size]
    bias = rng.standard_normal(filters).astype(np.float32)
    empty = np.empty(0, np.float32)
    got, expected = (np.empty(batch * filters, np.float32) for _ in range(2))
    for b in (bias, empty):
        with np.errstate(all="ignore"):
            gate_layer(weights, source, got, batch, filters, depth, b, -3.0, 5.0, code, 0.9, 0.4)
            pointwise_vector(weights, source, expected, batch, filters, depth, b, empty, -3.0, 5.0,
                             code, 0.9, 0.4)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("scale", [np.ones((1, 3, 1, 1), np.float32), np.ones((1, 8, 2, 1), np.float32),
                                   np.ones((1, 8, 1, 1), np.float64), np.ones((2, 8, 1, 1), np.float32),
                                   np.ones((1, 8, 1), np.float32)])
def test_a_channel_scale_of_another_shape_or_type_is_refused(scale):
    model = _gate_model(8, 2, (1, 8, 3, 3))
    model.graph.node[-1].output[:] = ["m"]
    model.graph.node.append(helper.make_node("Conv", ["m", "w1"], ["y"]))  # reads the 8 channels
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((2, 8, 1, 1), np.float32), "w1"))
    projection = RuntimeSession(model)._steps[-1][0]
    assert projection.channel_scale
    x, w = np.ones((1, 8, 3, 3), np.float32), np.ones((2, 8, 1, 1), np.float32)
    with pytest.raises(KernelError, match=r"channel scale must have shape \[1, 8, 1, 1\]"):
        projection.run(x, w, None, None, scale)
