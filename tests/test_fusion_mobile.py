"""Fusion of the mobile networks' activations and squeeze-and-excitation (runtime/fusion.py):
each fused graph against the unfused session and onnx's ReferenceEvaluator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import elementwise_compute
from onnx_light.kernels.base import KernelError
from onnx_light.runtime import RuntimeSession

F = TensorProto.FLOAT
RNG = np.random.default_rng(11)


def _tensor(name, shape, rng=RNG, low=-1.0, high=1.0):
    return numpy_helper.from_array(rng.uniform(low, high, shape).astype(np.float32), name)


def _model(nodes, initializers, x_shape, outputs=("y",), opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, list(x_shape))],
                              [helper.make_tensor_value_info(name, F, None) for name in outputs],
                              initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _sessions(model, threads=2):
    return (RuntimeSession(model, num_threads=threads),
            RuntimeSession(model, num_threads=threads, fuse=False))


def _check(model, x, fused_nodes, rtol=1e-5, threads=2):
    """The fused session fused ``fused_nodes`` nodes; fused, unfused and reference results
    agree."""
    fused, plain = _sessions(model, threads)
    assert (fused.fused_nodes, plain.fused_nodes) == (fused_nodes, 0)
    expected = ReferenceEvaluator(model).run(None, {"x": x})
    got, unfused = fused.run(None, {"x": x}), plain.run(None, {"x": x})
    for a, b, e in zip(got, unfused, expected, strict=True):
        atol = rtol * np.abs(e).max()  # cancellation: the error follows the largest terms
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
        np.testing.assert_allclose(b, e, rtol=rtol, atol=atol)
    return fused, got, unfused


def _conv(name, x, y, channels, filters, kernel=1, group=1, pad=0, rng=RNG):
    init = [_tensor(f"{name}_w", [filters, channels // group, kernel, kernel], rng),
            _tensor(f"{name}_b", [filters], rng)]
    node = helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], group=group,
                            pads=[pad] * 4, name=name)
    return node, init


ACTIVATIONS = [("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}), ("HardSwish", {}),
               ("LeakyRelu", {"alpha": 0.1}), ("Relu", {})]


def _assert_within_ulps(got, expected, ulps):
    """Within ``ulps`` float32 units of ``expected``, or of 0 near 0 (below the smallest normal
    float32 the compiled exponential flushes to 0); NaN and infinities equal."""
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(got[~finite], expected[~finite])  # NaN and infinities
    floor = 128 * np.finfo(np.float32).tiny  # a flushed gate times |x| <= 87
    bound = np.maximum(ulps * np.spacing(np.abs(expected[finite])), floor)
    error = np.abs(got[finite].astype(np.float64) - expected[finite].astype(np.float64))
    assert np.all(error <= bound), f"{np.max(error / bound) * ulps} ulps"


@pytest.mark.parametrize(("op", "attributes"), ACTIVATIONS, ids=[a for a, _ in ACTIVATIONS])
@pytest.mark.parametrize("group", [1, 6], ids=["dense", "depthwise"])
def test_activation_runs_as_the_conv_epilogue(op, attributes, group):
    conv, init = _conv("c", "x", "c", 6, 6, kernel=3, group=group, pad=1)
    model = _model([conv, helper.make_node(op, ["c"], ["y"], **attributes)], init, (2, 6, 9, 11))
    x = RNG.standard_normal((2, 6, 9, 11)).astype(np.float32) * 4
    fused, got, unfused = _check(model, x, fused_nodes=1)
    assert fused._plan[0].run.__self__.epilogue is not None
    if op == "Sigmoid":  # the compiled exponential
        _assert_within_ulps(got[0], unfused[0], 4)
    else:  # numpy's operations in its order, on each block
        np.testing.assert_array_equal(got[0], unfused[0])


@pytest.mark.parametrize("group", [1, 6], ids=["dense", "depthwise"])
def test_relu6_runs_as_the_conv_clamp(group):
    """Clip(0, 6) after a convolution is its clamp (the compiled depthwise kernel applies it
    as it stores): the unfused result, both bounds reached."""
    conv, init = _conv("c", "x", "c", 6, 6, kernel=3, group=group, pad=1)
    init += [numpy_helper.from_array(np.float32(bound), name) for name, bound in (("low", 0), ("high", 6))]
    model = _model([conv, helper.make_node("Clip", ["c", "low", "high"], ["y"])], init, (2, 6, 9, 11))
    x = RNG.standard_normal((2, 6, 9, 11)).astype(np.float32) * 8
    fused, got, unfused = _check(model, x, fused_nodes=1)
    assert fused._plan[0].run.__self__.clamp == (0.0, 6.0)
    assert (got[0] == 0).any() and (got[0] == 6).any()
    np.testing.assert_array_equal(got[0], unfused[0])


@pytest.mark.parametrize("gate_first", [False, True])
def test_silu_as_sigmoid_and_mul_runs_as_the_conv_epilogue(gate_first):
    conv, init = _conv("c", "x", "c", 4, 8, kernel=3, pad=1)
    mul = helper.make_node("Mul", ["s", "c"] if gate_first else ["c", "s"], ["y"])
    model = _model([conv, helper.make_node("Sigmoid", ["c"], ["s"]), mul], init, (1, 4, 12, 10))
    x = RNG.standard_normal((1, 4, 12, 10)).astype(np.float32) * 3
    _, got, unfused = _check(model, x, fused_nodes=2)
    _assert_within_ulps(got[0], unfused[0], 4)


def test_double_silu_runs_as_the_epilogue_with_numpy_bitwise():
    init = [numpy_helper.from_array(RNG.uniform(-1, 1, (4, 4, 1, 1)), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    double = TensorProto.DOUBLE
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", double, None)],
                              [helper.make_tensor_value_info("y", double, None)], initializer=init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fused, plain = _sessions(model)
    assert fused.fused_nodes == 2
    x = RNG.standard_normal((1, 4, 6, 6)) * 5
    np.testing.assert_array_equal(fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])


@pytest.mark.parametrize("case", ["x_read_again", "gate_read_again", "gate_returned"])
def test_silu_is_not_fused_when_its_values_are_read_elsewhere(case):
    conv, init = _conv("c", "x", "c", 4, 4)
    nodes = [conv, helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    outputs = ("y",)
    if case == "x_read_again":
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        outputs = ("y", "r")
    elif case == "gate_read_again":
        nodes.append(helper.make_node("Neg", ["s"], ["r"]))
        outputs = ("y", "r")
    else:
        outputs = ("y", "s")
    model = _model(nodes, init, (1, 4, 5, 5), outputs)
    x = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
    _check(model, x, fused_nodes=0)


def _squeeze_excitation(channels, reduced, out_channels, size, batch, gate, act, residual, rng):
    """MobileNetV3 / EfficientNet's block tail: x -> GlobalAveragePool -> Conv 1x1 -> act ->
    Conv 1x1 -> gate -> Mul with x -> Conv 1x1 (-> Add of the block's input)."""
    dw, init = _conv("dw", "x", "d", channels, channels, kernel=3, group=channels, pad=1, rng=rng)
    fc1, init1 = _conv("fc1", "p", "f1", channels, reduced, rng=rng)
    fc2, init2 = _conv("fc2", "a", "f2", reduced, channels, rng=rng)
    project, init3 = _conv("proj", "m", "y0" if residual else "y", channels, out_channels, rng=rng)
    nodes = [dw, helper.make_node("GlobalAveragePool", ["d"], ["p"]), fc1]
    if act == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["f1"], ["g1"]), helper.make_node("Mul", ["f1", "g1"], ["a"])]
    else:
        nodes.append(helper.make_node(act, ["f1"], ["a"]))
    nodes += [fc2, helper.make_node(gate, ["f2"], ["s"]), helper.make_node("Mul", ["d", "s"], ["m"]),
              project]
    if residual:
        nodes.append(helper.make_node("Add", ["y0", "x"], ["y"]))
    x_shape = (batch, channels, *size)
    return _model(nodes, [*init, *init1, *init2, *init3], x_shape), x_shape


@pytest.mark.parametrize(("gate", "act"), [("HardSigmoid", "Relu"), ("Sigmoid", "SiLU")],
                         ids=["mobilenet_v3", "efficientnet"])
@pytest.mark.parametrize("batch", [1, 2])
def test_squeeze_excitation_scales_inside_the_projection(gate, act, batch):
    model, x_shape = _squeeze_excitation(8, 4, 8, (7, 9), batch, gate, act, True, RNG)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    # left: depthwise, the gate (pool, fc1 + act, fc2 + gate), projection (+scale, +residual)
    fused, _, _ = _check(model, x, fused_nodes=len(model.graph.node) - 3)
    projection = fused._plan[-1].run.__self__
    assert projection.channel_scale and projection.residual
    # the weights scaled on each run are not remembered: a run changes no kernel's state
    before = [dict(vars(kernel)) for kernel, _, _ in fused._steps]
    fused.run(None, {"x": x})
    for kernel, state in zip((kernel for kernel, _, _ in fused._steps), before, strict=True):
        assert all(vars(kernel)[name] is value for name, value in state.items()), kernel.ctx.name


@settings(deadline=None, derandomize=True, max_examples=25)
@given(st.integers(1, 24), st.integers(1, 6), st.integers(1, 20), st.integers(1, 9), st.integers(2, 9),
       st.integers(1, 2), st.sampled_from(["HardSigmoid", "Sigmoid"]), st.sampled_from(["Relu", "SiLU"]),
       st.booleans(), st.integers(0, 2**31))
def test_squeeze_excitation_random_shapes(channels, reduced, out_channels, height, width, batch, gate, act,
                                          residual, seed):
    rng = np.random.default_rng(seed)
    residual = residual and out_channels == channels
    model, x_shape = _squeeze_excitation(channels, reduced, out_channels, (height, width), batch, gate,
                                         act, residual, rng)
    x = rng.standard_normal(x_shape).astype(np.float32)
    fused, plain = _sessions(model, threads=2)
    assert plain.fused_nodes == 0 and fused.fused_nodes >= 3
    got, expected = fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
    # the scale applied to the weights rounds each product's factor once more: a few units
    # in the last place of each term
    bound = 4 * np.finfo(np.float32).eps * (channels + 2) * (np.abs(expected).max() + 1)
    np.testing.assert_allclose(got, expected, rtol=0, atol=bound)


def test_a_scale_that_varies_along_space_is_not_fused():
    conv, init = _conv("c", "m", "y", 4, 4)
    model = _model([helper.make_node("Mul", ["x", "x"], ["m"]), conv], init, (1, 4, 3, 3))
    _check(model, RNG.standard_normal((1, 4, 3, 3)).astype(np.float32), fused_nodes=0)


def test_a_fused_scale_of_the_wrong_shape_is_refused_naming_the_node():
    model, _ = _squeeze_excitation(4, 2, 4, (5, 5), 1, "Sigmoid", "Relu", False, RNG)
    fused, _ = _sessions(model)
    projection = fused._plan[-1].run.__self__
    x = np.ones((1, 4, 5, 5), np.float32)
    w = np.ones((4, 4, 1, 1), np.float32)
    with pytest.raises(KernelError, match=r"proj.*channel scale must have shape \[1, 4, 1, 1\]"):
        projection.run(x, w, None, None, np.ones((1, 3, 1, 1), np.float32))


@pytest.mark.parametrize("function", ["_sigmoid", "_hard_swish"])
def test_in_place_activations_equal_their_out_of_place_results(function):
    compute = getattr(elementwise_compute, function)
    x = (RNG.standard_normal(1000) * 6).astype(np.float32)
    x[:5] = [np.nan, -np.inf, np.inf, -0.0, 0.0]
    expected = np.empty_like(x)
    with np.errstate(all="ignore"):  # inf * 0: the kernels run quietly
        compute(x, out=expected)
        compute(x, out=x)
    np.testing.assert_array_equal(x, expected)


def _special_values(shape, rng):
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    x.reshape(-1)[:9] = [np.nan, np.inf, -np.inf, -0.0, 0.0, -100, 100, -87.5, 3.0]
    return x


COMPILED = [("Sigmoid", {}, 4), ("Swish", {"alpha": 1.0}, 4), ("Swish", {"alpha": 0.7}, 4),
            ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}, 0), ("HardSigmoid", {"alpha": 0.3, "beta": 0.1}, 0),
            ("HardSwish", {}, 0)]
VIEWS = {"whole": lambda a: a, "rows": lambda a: a[:, 2:9], "planes": lambda a: a[1:4, :, 3:20],
         "strided": lambda a: a[:, :, ::2], "reversed": lambda a: a[:, ::-1], "scalar": lambda a: a[0, 0, :1]}


@pytest.mark.parametrize(("op", "attributes", "ulps"), COMPILED,
                         ids=[f"{op}-{a.get('alpha', '')}" for op, a, _ in COMPILED])
@pytest.mark.parametrize("view", list(VIEWS))
def test_compiled_activations_equal_the_nodes_in_place_functions(op, attributes, ulps, view):
    """Each compiled activation against the node's numpy function, on views of every layout
    (the strided and reversed ones take the numpy function: equal bitwise)."""
    from onnx_light.kernels.compiled_activations import in_place

    x = _special_values((5, 11, 23), RNG)
    ours, numpy_result = x.copy(), x.copy()
    model = _model([helper.make_node(op, ["x"], ["y"], **attributes)], [], x.shape, opset=24
                   if op == "Swish" else 17)
    kernel = RuntimeSession(model, num_threads=1, fuse=False)._plan[0].run.__self__
    compiled = in_place(op, attributes, lambda block: kernel._compute(block, out=block))
    with np.errstate(all="ignore"):
        compiled(VIEWS[view](ours))
        kernel._compute(VIEWS[view](numpy_result), out=VIEWS[view](numpy_result))
    if ulps == 0 or view in ("strided", "reversed"):
        np.testing.assert_array_equal(ours, numpy_result)
    else:
        _assert_within_ulps(ours, numpy_result, ulps)
