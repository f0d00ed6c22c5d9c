"""Operator fusion at session construction (runtime/fusion.py) and the fast Relu."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import elementwise_compute
from onnx_light.kernels.base import KernelError
from onnx_light.kernels.normalization import ChannelAffine
from onnx_light.runtime import RuntimeSession

F = TensorProto.FLOAT
C, H, W = 8, 10, 12
RNG = np.random.default_rng(7)


def _tensor(name, shape, low=-1.0, high=1.0):
    return numpy_helper.from_array(RNG.uniform(low, high, shape).astype(np.float32), name)


def _model(nodes, initializers, output="y", x_shape=(2, 4, H, W), graph_inputs_too=False, ir=8):
    x = helper.make_tensor_value_info("x", F, list(x_shape))
    inputs = [x]
    if graph_inputs_too:  # IR < 4 style: every initializer is also an overridable input
        inputs += [helper.make_tensor_value_info(t.name, F, list(t.dims)) for t in initializers]
    outputs = [helper.make_tensor_value_info(name, F, ["n", "c", "h", "w"]) for name in output.split(",")]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = ir
    return model


def _bn_params(prefix, channels=C):
    return [_tensor(f"{prefix}_s", [channels], 0.5, 1.5), _tensor(f"{prefix}_b", [channels]),
            _tensor(f"{prefix}_m", [channels]), _tensor(f"{prefix}_v", [channels], 0.5, 2.0)]


def _conv_bn_relu(extra_nodes=(), extra_init=(), last="n", bias=True):
    init = [_tensor("w", [C, 4, 3, 3]), *_bn_params("bn"), *extra_init]
    conv_inputs = ["x", "w"]
    if bias:
        init.append(_tensor("cb", [C]))
        conv_inputs.append("cb")
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["n"],
                              epsilon=1e-3, name="bn"),
             *extra_nodes,
             helper.make_node("Relu", [last], ["y"], name="relu")]
    return _model(nodes, init)


def _x(shape=(2, 4, H, W)):
    return RNG.standard_normal(shape).astype(np.float32)


def _check(model, feeds, steps, fused, rtol=1e-5, atol=1e-5):
    """The fused session has ``steps`` steps and ``fused`` fused nodes; the fused, unfused and
    reference results agree."""
    session = RuntimeSession(model, num_threads=2)
    plain = RuntimeSession(model, num_threads=2, fuse=False)
    assert (len(session._plan), session.fused_nodes) == (steps, fused)
    assert plain.fused_nodes == 0 and len(plain._plan) == len(model.graph.node)
    expected = ReferenceEvaluator(model).run(None, feeds)
    for got in (session.run(None, feeds), plain.run(None, feeds)):
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return session


@pytest.mark.parametrize("bias", [True, False])
def test_conv_batchnorm_relu_become_one_conv(bias):
    session = _check(_conv_bn_relu(bias=bias), {"x": _x()}, steps=1, fused=2)
    conv = session._plan[0].run.__self__
    assert conv.ctx.op_type == "Conv" and conv.epilogue is not None


def test_per_channel_mul_add_sub_fold_into_the_conv():
    init = [_tensor("k", [C, 1, 1], 0.5, 2.0), _tensor("a", [1, C, 1, 1]), _tensor("s", [C, 1, 1])]
    nodes = [helper.make_node("Mul", ["n", "k"], ["m"]), helper.make_node("Add", ["a", "m"], ["p"]),
             helper.make_node("Sub", ["s", "p"], ["q"])]
    _check(_conv_bn_relu(nodes, init, last="q"), {"x": _x()}, steps=1, fused=5)


def test_affine_chain_without_conv_is_one_channel_affine_step():
    init = [*_bn_params("bn", 4), _tensor("k", [4, 1, 1]), _tensor("a", [4, 1, 1])]
    nodes = [helper.make_node("BatchNormalization", ["x", "bn_s", "bn_b", "bn_m", "bn_v"], ["n"]),
             helper.make_node("Mul", ["n", "k"], ["m"]), helper.make_node("Add", ["m", "a"], ["p"]),
             helper.make_node("Relu", ["p"], ["y"])]
    session = _check(_model(nodes, init), {"x": _x()}, steps=1, fused=3)
    kernel = session._plan[0].run.__self__
    assert isinstance(kernel, ChannelAffine) and kernel.epilogue is not None


def _pre_activation(kernel=1, output="y", pads=(0, 0, 0, 0), weights_constant=True):
    """DenseNet's pre-activation: BatchNormalization and Relu, then a convolution."""
    init = [*_bn_params("bn", 4)]
    w = _tensor("w", [C, 4, kernel, kernel])
    nodes = [helper.make_node("BatchNormalization", ["x", "bn_s", "bn_b", "bn_m", "bn_v"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["y"], pads=list(pads))]
    model = _model(nodes, [*init, w] if weights_constant else init, output=output)
    if not weights_constant:
        model.graph.input.append(helper.make_tensor_value_info("w", F, list(w.dims)))
    return model, ({"x": _x()} if weights_constant else {"x": _x(), "w": numpy_helper.to_array(w)})


def test_a_pre_activation_runs_inside_the_following_1x1_conv():
    model, feeds = _pre_activation()
    session = _check(model, feeds, steps=1, fused=2)
    conv = session._plan[0].run.__self__
    assert conv.ctx.op_type == "Conv" and conv.prologue is not None
    assert conv.prologue.activation is not None
    # the unfused plan keeps the original kernel, without a prologue
    assert all(getattr(step.run.__self__, "prologue", None) is None
               for step in session._unfolded[0])


@pytest.mark.parametrize("case", ["3x3", "relu returned", "weights fed"])
def test_a_pre_activation_stays_a_step_where_the_conv_cannot_take_it(case):
    model, feeds = {
        "3x3": lambda: _pre_activation(kernel=3, pads=(1, 1, 1, 1)),
        "relu returned": lambda: _pre_activation(output="y,r"),
        "weights fed": lambda: _pre_activation(weights_constant=False),
    }[case]()
    session = _check(model, feeds, steps=2, fused=1)  # Relu still runs inside the affine step
    assert isinstance(session._plan[0].run.__self__, ChannelAffine)
    assert session._plan[1].run.__self__.prologue is None


def test_a_pre_activation_of_the_wrong_channel_count_keeps_its_clear_error():
    init = [*_bn_params("bn", 3), _tensor("w", [C, 4, 1, 1])]  # 3 parameters, 4 channels
    nodes = [helper.make_node("BatchNormalization", ["x", "bn_s", "bn_b", "bn_m", "bn_v"], ["n"],
                              name="bn"),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["y"])]
    # a symbolic channel count: shape inference cannot tell 3 from 4 here
    session = RuntimeSession(_model(nodes, init, x_shape=("n", "c", H, W)), num_threads=2)
    assert all(getattr(step.run.__self__, "prologue", None) is None for step in session._plan)
    with pytest.raises(KernelError, match=r"'bn'.*multiplier has 3 values, X has 4 channels"):
        session.run(None, {"x": _x()})


def test_a_residual_addition_and_its_relu_run_inside_the_conv():
    init = [_tensor("w", [4, 4, 3, 3]), _tensor("cb", [4])]
    nodes = [helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["s"]),  # the shortcut: the block's input
             helper.make_node("Relu", ["s"], ["y"])]
    session = _check(_model(nodes, init), {"x": _x()}, steps=1, fused=2)
    conv = session._plan[0].run.__self__
    assert conv.residual and conv.epilogue is not None
    assert session._plan[0].inputs[3] == session._feed_slots["x"]


def test_an_affine_map_after_a_residual_addition_is_not_folded_into_the_conv():
    # pre-activation blocks: the sum's BatchNormalization scales the shortcut too, so it
    # cannot go into the weights of the Conv the sum runs inside
    init = [_tensor("w", [4, 4, 3, 3]), *_bn_params("bn", 4)]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["s"]),
             helper.make_node("BatchNormalization", ["s", "bn_s", "bn_b", "bn_m", "bn_v"], ["y"])]
    session = _check(_model(nodes, init), {"x": _x()}, steps=2, fused=1)
    assert session._plan[0].run.__self__.residual


def test_an_affine_chain_after_a_conv_makes_its_weights_once():
    init = [_tensor("k", [C, 1, 1], 0.5, 2.0), _tensor("a", [1, C, 1, 1])]
    nodes = [helper.make_node("Mul", ["n", "k"], ["m"]), helper.make_node("Add", ["m", "a"], ["p"])]
    session = _check(_conv_bn_relu(nodes, init, last="p"), {"x": _x()}, steps=1, fused=4)
    # the original weights and bias, then one new pair (no pair per folded node)
    assert len(session._folded) == 2
    weights = session._folded[session._plan[0].inputs[1]]
    w = session._constants[session._slots["w"]].astype(np.float64)
    scale = (session._constants[session._slots["bn_s"]].astype(np.float64)
             / np.sqrt(session._constants[session._slots["bn_v"]].astype(np.float64) + 1e-3)
             * session._constants[session._slots["k"]].astype(np.float64).reshape(-1))
    np.testing.assert_array_equal(weights, (w * scale.reshape(-1, 1, 1, 1)).astype(np.float32))


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_a_projection_shortcut_fuses_into_the_conv_that_runs_last(order):
    # ResNet's first block of a stage: main path and projection, summed; the projection is
    # computed after the main path, so the sum can only run inside it
    init = [_tensor("w1", [4, 4, 3, 3]), _tensor("w2", [4, 4, 1, 1])]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="main"),
             helper.make_node("Conv", ["x", "w2"], ["b"], name="projection"),
             helper.make_node("Sum", list(order), ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    session = _check(_model(nodes, init), {"x": _x()}, steps=2, fused=2)
    last = session._plan[1].run.__self__
    assert last.ctx.name == "projection" and last.residual


@pytest.mark.parametrize("case", ["conv output returned", "broadcast operand"])
def test_additions_that_cannot_run_inside_the_conv(case):
    init = [_tensor("w", [4, 4, 3, 3])]
    other = "x" if case == "conv output returned" else "z"
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", other], ["y"])]
    model = _model(nodes, init, output="y,c" if case == "conv output returned" else "y")
    feeds = {"x": _x()}
    if case == "broadcast operand":
        model.graph.input.append(helper.make_tensor_value_info("z", F, [1, 4, 1, W]))
        feeds["z"] = _x((1, 4, 1, W))
    session = _check(model, feeds, steps=2, fused=0)
    assert not session._plan[0].run.__self__.residual


@pytest.mark.parametrize("constant_shape", [(1, 1, H, W), (H, W), (2, 1, 1, 1)])
def test_constants_that_vary_along_other_axes_are_not_affine(constant_shape):
    nodes = [helper.make_node("Mul", ["x", "k"], ["y"])]
    _check(_model(nodes, [_tensor("k", list(constant_shape))]), {"x": _x()}, steps=1, fused=0)


def test_a_constant_that_would_grow_the_output_is_not_affine():
    nodes = [helper.make_node("Add", ["x", "k"], ["y"])]
    _check(_model(nodes, [_tensor("k", [1, 4, 1, 1])], x_shape=(2, 1, H, W)), {"x": _x((2, 1, H, W))},
           steps=1, fused=0)


def test_a_conv_output_read_twice_or_returned_is_not_folded():
    init = [_tensor("w", [C, 4, 3, 3]), *_bn_params("bn")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["y"])]
    # c is a graph output: the Conv stays whole, the BatchNormalization becomes ChannelAffine
    session = _check(_model(nodes, init, output="y,c"), {"x": _x()}, steps=2, fused=0)
    assert isinstance(session._plan[1].run.__self__, ChannelAffine)
    nodes.append(helper.make_node("Add", ["c", "y"], ["z"]))
    _check(_model(nodes, init, output="z"), {"x": _x()}, steps=3, fused=0)


def test_training_mode_batchnorm_is_not_fused():
    init = [_tensor("w", [C, 4, 3, 3]), *_bn_params("bn")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"],
                              ["y", "mean", "var"], training_mode=1)]
    model = _model(nodes, init)
    session = RuntimeSession(model)
    assert (len(session._plan), session.fused_nodes) == (2, 0)


def test_overriding_a_folded_parameter_takes_the_unfused_plan():
    model = _model(_conv_bn_relu().graph.node, list(_conv_bn_relu().graph.initializer),
                   graph_inputs_too=True, ir=3)
    session = RuntimeSession(model, num_threads=2)
    assert session.fused_nodes == 2
    x = _x()
    scale = np.full(C, 3.0, np.float32)
    feeds = {"x": x, "bn_s": scale}
    np.testing.assert_allclose(session.run(None, feeds)[0],
                               ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(session.run(None, {"x": x})[0],
                               ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("activation", ["Relu", "Tanh", "LeakyRelu"])
def test_activations_fuse_into_elementwise_producers_bit_exactly(threads, activation):
    n = 1 << 20  # past every parallel threshold
    x = helper.make_tensor_value_info("x", F, [n])
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node(activation, ["s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", F, [n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    session = RuntimeSession(model, num_threads=threads)
    plain = RuntimeSession(model, num_threads=threads, fuse=False)
    assert (len(session._plan), len(plain._plan)) == (1, 2)
    feeds = {"x": RNG.standard_normal(n).astype(np.float32)}
    np.testing.assert_array_equal(session.run(None, feeds)[0], plain.run(None, feeds)[0])


def test_activations_that_cannot_work_in_place_are_not_fused():
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Softsign", ["s"], ["y"])]
    _check(_model(nodes, []), {"x": _x()}, steps=2, fused=0)


ROW = elementwise_compute.CONSTANT_ROW


@pytest.mark.parametrize("n", [0, 1, 7, ROW - 1, ROW, 3 * ROW + 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("ufunc, value", [(np.maximum, 0), (np.minimum, 6), (np.maximum, -2.5),
                                          (np.minimum, np.nan)])
def test_comparisons_against_a_constant_row_equal_numpy(n, dtype, ufunc, value):
    if np.dtype(dtype).kind == "i" and not float(value).is_integer():
        value = 3
    x = (RNG.standard_normal(n) * 100).astype(dtype)
    if dtype != np.int32 and n > 3:
        x[:3] = [np.nan, -np.inf, np.inf]
    expected = ufunc(x, np.asarray(value, dtype))
    out = np.empty_like(x)
    elementwise_compute._against_constant(ufunc, x, value, out)
    np.testing.assert_array_equal(out, expected)
    strided = np.repeat(x, 2)[::2]  # not contiguous
    elementwise_compute._against_constant(ufunc, strided, value, out)
    np.testing.assert_array_equal(out, expected)
    elementwise_compute._against_constant(ufunc, x, value, x)  # in place
    np.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("alpha", [0.1, 1.0, 3.0, -0.5, float("nan")])
def test_leaky_relu_without_a_mask_equals_the_masked_definition(alpha):
    x = RNG.standard_normal(1000).astype(np.float32)
    x[:4] = [np.nan, -np.inf, np.inf, -0.0]
    expected = np.where(x > 0, x, np.float32(alpha) * x)
    out = np.empty_like(x)
    elementwise_compute._leaky_relu(x, out=out, alpha=float(np.float32(alpha)))
    np.testing.assert_array_equal(out, expected)
    slope = np.full((1,), alpha, np.float32)
    elementwise_compute._prelu(x, slope, out=out)
    np.testing.assert_array_equal(out, expected)


def test_channel_affine_rejects_an_input_of_another_channel_count():
    from onnx import TensorProto as T

    from onnx_light.kernels.base import KernelError, NodeContext

    kernel = ChannelAffine(NodeContext("bn_1", "ChannelAffine", "", 15, {}, (T.FLOAT,), (T.FLOAT,), 1, 1),
                           np.ones(4), np.zeros(4))
    with pytest.raises(KernelError, match=r"node 'bn_1'.*multiplier has 4 values, X has 3 channels"):
        kernel.run(np.zeros((1, 3, 2, 2), np.float32))
    np.testing.assert_array_equal(kernel.run(np.ones((1, 4, 2, 2), np.float32))[0],
                                  np.ones((1, 4, 2, 2), np.float32))


def _conv_bn_clip(inputs, initializers):
    """Conv -> BatchNormalization -> Clip(n, *inputs) as the graph's output."""
    init = [_tensor("w", [C, 4, 3, 3]), *_bn_params("bn"), *initializers]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["n"]),
             helper.make_node("Clip", ["n", *inputs], ["y"])]
    return _model(nodes, init)


@pytest.mark.parametrize("low, high", [(0.0, 6.0), (None, 0.5), (-0.25, None)])
def test_a_clip_with_constant_bounds_runs_inside_the_conv(low, high):
    """MobileNetV2's ReLU6: Conv -> BatchNormalization -> Clip(0, 6) is one step."""
    bounds = [helper.make_tensor(name, F, [], [value]) for name, value in (("lo", low), ("hi", high))
              if value is not None]
    inputs = ["lo" if low is not None else "", "hi" if high is not None else ""]
    while inputs and inputs[-1] == "":
        inputs.pop()
    session = _check(_conv_bn_clip(inputs, bounds), {"x": 3 * _x()}, steps=1, fused=2)
    conv = session._plan[0].run.__self__
    assert conv.ctx.op_type == "Conv" and conv.epilogue is not None


def test_a_clip_whose_bounds_are_fed_is_not_fused():
    model = _conv_bn_clip(["lo"], [])
    model.graph.input.append(helper.make_tensor_value_info("lo", F, []))
    _check(model, {"x": _x(), "lo": np.float32(0.1)}, steps=2, fused=1)


SMALL = elementwise_compute.SCALAR_BELOW


@pytest.mark.parametrize("n", [0, 1, 8, SMALL - 1, SMALL, ROW + 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int8])
def test_relu_equals_numpy_below_and_above_the_small_size(n, dtype):
    x = (RNG.standard_normal(n) * 100).astype(dtype)
    if np.dtype(dtype).kind == "f" and n > 3:
        x[:4] = [np.nan, -0.0, -np.inf, np.inf]
    expected = np.maximum(x, dtype(0))
    out = np.empty_like(x)
    elementwise_compute._relu(x, out=out)
    np.testing.assert_array_equal(out, expected)
    assert np.array_equal(np.signbit(out), np.signbit(expected))  # -0.0 stays -0.0, as numpy's
    in_place = x.copy()
    elementwise_compute.relu_in_place(x.dtype)(in_place)  # as a fused epilogue runs it
    np.testing.assert_array_equal(in_place, expected)
    assert np.array_equal(np.signbit(in_place), np.signbit(expected))
    elementwise_compute._relu(x, out=x)
    np.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize("then_add", [False, True])
def test_a_per_channel_mul_is_its_products_bit_for_bit(then_add):
    """A Mul by a per-channel constant (ConvNeXt's layer scale) becomes a ChannelAffine step
    whose offset is -0.0, so that it skips the add: the Mul's products bit for bit, -0.0
    included; a following per-channel Add composes into a real offset and is added."""
    gamma = numpy_helper.from_array(np.array([1.5, -2.0, 0.0, -0.0], np.float32).reshape(4, 1, 1), "g")
    shift = numpy_helper.from_array(np.array([0.25, 0.0, -1.0, 3.0], np.float32).reshape(4, 1, 1), "s")
    nodes = [helper.make_node("Mul", ["x", "g"], ["m" if then_add else "y"])]
    if then_add:
        nodes.append(helper.make_node("Add", ["m", "s"], ["y"]))
    model = _model(nodes, [gamma, shift] if then_add else [gamma])
    x = _x()
    x.reshape(-1)[:6] = [0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45]
    session = RuntimeSession(model)
    (step,) = session._plan
    kernel = step.run.__self__
    assert isinstance(kernel, ChannelAffine) and kernel.adds_nothing is not then_add
    expected = x * numpy_helper.to_array(gamma)
    if then_add:
        expected = expected + numpy_helper.to_array(shift)
    with np.errstate(invalid="ignore"):
        got = session.run(None, {"x": x})[0]
    if then_add:  # one rounding of x * m + o in float64, as fusion states
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(got.view(np.int32), expected.view(np.int32))
