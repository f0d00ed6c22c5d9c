"""RNN, GRU and LSTM kernels against ``onnx.reference.ReferenceEvaluator``.

The reference implements the directions, layouts, biases, initial states, peepholes and
``linear_before_reset``, but ignores ``sequence_lens``, ``clip``, ``input_forget`` and most
activations. Those are checked by what they mean: a batch entry with a shorter sequence is
the reference run on that entry's steps alone (zeros in Y past its end); clip and the
activations against a step-by-step numpy loop whose activation is the ONNX operator of the
same name run by the reference. The kernels compute in float32 in another order than the
reference: results agree to a few float32 ulps relative to the largest magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import recurrent
from onnx_light.kernels.base import KernelError, NodeContext

T = TensorProto
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
KERNELS = {"RNN": recurrent.RNN, "GRU": recurrent.GRU, "LSTM": recurrent.LSTM}
INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def _model(op_type, inputs, attributes, outputs, opset):
    names = [n if v is not None else "" for n, v in zip(INPUTS, inputs, strict=False)]
    out_names = [f"o{k}" for k in range(outputs)]
    node = helper.make_node(op_type, names, out_names, **attributes)
    graph = helper.make_graph(
        [node], "one",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), None)
         for n, v in zip(names, inputs, strict=False) if v is not None],
        [helper.make_tensor_value_info(n, T.FLOAT, None) for n in out_names])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _reference(op_type, inputs, attributes, outputs, opset=22):
    model = _model(op_type, inputs, attributes, outputs, opset)
    feeds = {n: v for n, v in zip(INPUTS, inputs, strict=False) if v is not None}
    return ReferenceEvaluator(model).run(None, feeds)


def _run(op_type, inputs, attributes, outputs, opset=22):
    ctx = NodeContext("rec", op_type, "", opset, attributes,
                      tuple(helper.np_dtype_to_tensor_dtype(v.dtype) if v is not None else None
                            for v in inputs), (T.FLOAT,) * outputs, len(inputs), outputs)
    return KERNELS[op_type](ctx).run(*inputs)


def _assert_close(got, expected):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected), initial=0)))
    np.testing.assert_allclose(got, expected, rtol=0, atol=64 * np.finfo(np.float32).eps * scale)


def _inputs(op_type, rng, steps, batch, width, hidden, directions, layout, *, bias=True,
            initial=True, peepholes=True, lengths=None):
    gates = GATES[op_type]

    def draw(*shape):
        return rng.uniform(-1, 1, shape).astype(np.float32)

    def state():
        return draw(batch, directions, hidden) if layout else draw(directions, batch, hidden)

    x = draw(batch, steps, width) if layout else draw(steps, batch, width)
    inputs = [x, draw(directions, gates * hidden, width), draw(directions, gates * hidden, hidden),
              draw(directions, 2 * gates * hidden) if bias else None,
              None if lengths is None else np.asarray(lengths, np.int32),
              state() if initial else None]
    if op_type == "LSTM":
        inputs += [state() if initial else None, draw(directions, 3 * hidden) if peepholes else None]
    while inputs[-1] is None:
        inputs.pop()
    return inputs


DIRECTIONS = st.sampled_from(["forward", "reverse", "bidirectional"])


@settings(deadline=None, derandomize=True, max_examples=60)
@given(st.sampled_from(sorted(GATES)), DIRECTIONS, st.integers(1, 4), st.integers(1, 3),
       st.integers(1, 4), st.integers(1, 4), st.sampled_from([0, 1]), st.booleans(), st.booleans(),
       st.booleans(), st.integers(1, 3), st.integers(0, 1000))
def test_against_reference(op_type, direction, steps, batch, width, hidden, layout, bias,
                           initial, peepholes, outputs, seed):
    outputs = min(outputs, 3 if op_type == "LSTM" else 2)
    directions = 2 if direction == "bidirectional" else 1
    inputs = _inputs(op_type, np.random.default_rng(seed), steps, batch, width, hidden,
                     directions, layout, bias=bias, initial=initial, peepholes=peepholes)
    attributes = {"direction": direction, "hidden_size": hidden, "layout": layout}
    if op_type == "GRU":
        attributes["linear_before_reset"] = seed % 2
    got = _run(op_type, inputs, attributes, outputs)
    expected = _reference(op_type, inputs, attributes, outputs)
    assert len(got) == outputs
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == np.float32
        _assert_close(g, e)


@settings(deadline=None, derandomize=True, max_examples=40)
@given(st.sampled_from(sorted(GATES)), DIRECTIONS, st.integers(1, 4), st.integers(1, 3),
       st.sampled_from([0, 1]), st.data())
def test_sequence_lens_run_each_entry_on_its_own_steps(op_type, direction, steps, batch,
                                                       layout, data):
    lengths = data.draw(st.lists(st.integers(0, steps), min_size=batch, max_size=batch))
    directions = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(steps * 10 + batch)
    inputs = _inputs(op_type, rng, steps, batch, 3, 2, directions, layout, lengths=lengths)
    attributes = {"direction": direction, "hidden_size": 2, "layout": layout}
    outputs = 3 if op_type == "LSTM" else 2
    got = [np.asarray(g) for g in _run(op_type, inputs, attributes, outputs)]
    if layout:  # compare in layout 0
        got = [got[0].transpose(1, 2, 0, 3), *(g.transpose(1, 0, 2) for g in got[1:])]
    for b, length in enumerate(lengths):
        entry = list(inputs)
        entry[4] = None
        time_axis, batch_axis = (1, 0) if layout else (0, 1)
        entry[0] = np.take(inputs[0], [b], axis=batch_axis).take(range(length), axis=time_axis)
        states = [np.take(v, [b], axis=0 if layout else 1) for v in inputs[5:7]]
        entry[5:7] = states
        assert np.all(got[0][length:, :, b] == 0)
        if length == 0:
            for g, initial in zip(got[1:], states, strict=True):
                initial = initial.transpose(1, 0, 2) if layout else initial
                np.testing.assert_array_equal(g[:, b], initial[:, 0])
            continue
        expected = _reference(op_type, entry, attributes, outputs)
        if layout:
            expected = [expected[0].transpose(1, 2, 0, 3), *(e.transpose(1, 0, 2) for e in expected[1:])]
        _assert_close(got[0][:length, :, b], expected[0][:, :, 0])
        for g, e in zip(got[1:], expected[1:], strict=True):
            _assert_close(g[:, b], e[:, 0])


def _onnx_activation(name, alpha, beta):
    """The ONNX operator ``name`` with ``alpha``/``beta`` (where set), run by the reference."""
    attributes = {k: v for k, v in (("alpha", alpha), ("beta", beta)) if v is not None}
    node = helper.make_node(name, ["x"], ["y"], **attributes)
    graph = helper.make_graph([node], "a", [helper.make_tensor_value_info("x", T.FLOAT, None)],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)])
    evaluator = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)]))
    return lambda x: evaluator.run(None, {"x": x.astype(np.float32)})[0]


ONNX_ACTIVATIONS = {"Relu": (), "Tanh": (), "Sigmoid": (), "LeakyRelu": ("alpha",),
                    "ThresholdedRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"),
                    "Elu": ("alpha",), "Softsign": (), "Softplus": ()}


@settings(deadline=None, derandomize=True, max_examples=40)
@given(st.sampled_from(sorted(ONNX_ACTIVATIONS)), st.booleans(), st.sampled_from([None, 0.3, 2.0]),
       st.integers(1, 3), st.integers(0, 100))
def test_rnn_activation_and_clip_step_by_step(name, set_parameters, clip, steps, seed):
    rng = np.random.default_rng(seed)
    inputs = _inputs("RNN", rng, steps, 2, 3, 4, 1, 0)
    attributes = {"hidden_size": 4, "activations": [name]}
    alpha = beta = None
    if set_parameters and ONNX_ACTIVATIONS[name]:
        alpha = float(rng.uniform(0.1, 0.9))
        attributes["activation_alpha"] = [alpha]
        if "beta" in ONNX_ACTIVATIONS[name]:
            beta = float(rng.uniform(0.1, 0.9))
            attributes["activation_beta"] = [beta]
    if clip is not None:
        attributes["clip"] = clip
    activation = _onnx_activation(name, alpha, beta)
    x, w, r, b, _, h = inputs
    expected = []
    h = h[0]
    for t in range(steps):
        pre = x[t] @ w[0].T + h @ r[0].T + b[0, :4] + b[0, 4:]
        if clip is not None:
            pre = np.clip(pre, -clip, clip)
        h = activation(pre)
        expected.append(h)
    y, y_h = _run("RNN", inputs, attributes, 2)
    _assert_close(y[:, 0], np.stack(expected))
    _assert_close(y_h[0], h)


@pytest.mark.parametrize("name, alpha, beta, function", [
    ("Affine", 0.5, 0.25, lambda x: 0.5 * x + 0.25),
    ("ScaledTanh", 0.5, 2.0, lambda x: 0.5 * np.tanh(2.0 * x)),
    ("scaledtanh", None, None, np.tanh),
])
def test_affine_and_scaled_tanh(name, alpha, beta, function):
    inputs = _inputs("RNN", np.random.default_rng(3), 1, 2, 3, 2, 1, 0)
    attributes = {"activations": [name]}
    if alpha is not None:
        attributes |= {"activation_alpha": [alpha], "activation_beta": [beta]}
    x, w, r, b, _, h = inputs
    expected = function(x[0] @ w[0].T + h[0] @ r[0].T + b[0, :2] + b[0, 2:])
    _assert_close(_run("RNN", inputs, attributes, 1)[0][0, 0], expected)


def test_lstm_input_forget_couples_the_forget_gate():
    inputs = _inputs("LSTM", np.random.default_rng(5), 1, 2, 3, 2, 1, 0, peepholes=False)
    x, w, r, b, _, h, c = inputs
    gates = x[0] @ w[0].T + h[0] @ r[0].T + b[0, :8] + b[0, 8:]
    i, o, _, g = (gates[:, k * 2:(k + 1) * 2] for k in range(4))
    sigmoid = _onnx_activation("Sigmoid", None, None)
    i, o = sigmoid(i), sigmoid(o)
    cell = (1 - i) * c[0] + i * np.tanh(g)
    y, y_h, y_c = _run("LSTM", inputs, {"input_forget": 1}, 3)
    np.testing.assert_array_equal(y[0], y_h)
    _assert_close(y_c[0], cell)
    _assert_close(y_h[0], o * np.tanh(cell))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_float_types_follow_float32(dtype):
    """float16 computes in float32 and rounds once; float64 computes in float64."""
    inputs = [None if v is None else v.astype(dtype)
              for v in _inputs("GRU", np.random.default_rng(7), 3, 2, 3, 2, 2, 0)]
    attributes = {"direction": "bidirectional"}
    expected = _run("GRU", [None if v is None else v.astype(np.float64) for v in inputs],
                    attributes, 2)
    got = _run("GRU", inputs, attributes, 2)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == dtype
        tolerance = float(np.finfo(np.float16).eps) if dtype == np.float16 else 1e-12
        np.testing.assert_allclose(g.astype(np.float64), e, rtol=0, atol=tolerance)


def test_older_versions_run_like_the_newest():
    inputs = _inputs("GRU", np.random.default_rng(9), 2, 2, 3, 2, 1, 0)
    newest = _run("GRU", inputs, {}, 2)
    for opset in (3, 7):
        for g, e in zip(_run("GRU", inputs, {}, 2, opset=opset), newest, strict=True):
            np.testing.assert_array_equal(g, e)


def _ctx(op_type, attributes=None, opset=22, outputs=1):
    return NodeContext("rec", op_type, "", opset, attributes or {}, (T.FLOAT,) * 3,
                       (T.FLOAT,) * outputs, 3, outputs)


@pytest.mark.parametrize("op_type, attributes, opset, outputs, message", [
    ("RNN", {"direction": "sideways"}, 22, 1, "direction must be forward, reverse or bidirectional"),
    ("GRU", {"hidden_size": 0}, 22, 1, "hidden_size must be positive"),
    ("LSTM", {"clip": -1.0}, 22, 1, "clip must be positive"),
    ("RNN", {"layout": 2}, 22, 1, "layout must be 0 or 1"),
    ("GRU", {"layout": 1}, 7, 1, "layout is an attribute from opset 14 on"),
    ("RNN", {"activations": ["Tanh", "Tanh"]}, 22, 1, "activations has 2 names, expected 1"),
    ("GRU", {"activations": ["Sigmoid", "Swish"]}, 22, 1, "unknown activation 'Swish'"),
    ("RNN", {"activation_alpha": [0.5]}, 22, 1, "activation_alpha/activation_beta have 1/0 values more"),
    ("RNN", {}, 22, 3, "has 3 outputs, at most 2"),
    ("LSTM", {}, 22, 4, "has 4 outputs, at most 3"),
])
def test_bad_attributes_name_the_node(op_type, attributes, opset, outputs, message):
    with pytest.raises(KernelError, match=f"node 'rec' \\({op_type}\\): {message}"):
        KERNELS[op_type](_ctx(op_type, attributes, opset, outputs))


def test_bad_element_type_is_refused():
    ctx = NodeContext("rec", "LSTM", "", 22, {}, (T.INT32,) * 3, (T.INT32,), 3, 1)
    with pytest.raises(KernelError, match="does not take element type int32"):
        recurrent.LSTM(ctx)


@pytest.mark.parametrize("change, message", [
    (lambda v: v.__setitem__(1, v[1][:, :-1]), r"W must have shape \[1, 8, 3\]"),
    (lambda v: v.__setitem__(2, v[2][..., None]), "X, W and R must be 3-D"),
    (lambda v: v.__setitem__(3, v[3][:, 1:]), r"B must have shape \[1, 16\]"),
    (lambda v: v.__setitem__(4, np.array([3, 1], np.int32)),
     r"sequence_lens must hold 2 lengths in \[0, 2\]"),
    (lambda v: v.__setitem__(5, v[5][:, :1]), r"initial_h must have shape \[1, 2, 2\]"),
    (lambda v: v.__setitem__(6, v[6][:, :1]), r"initial_c must have shape \[1, 2, 2\]"),
    (lambda v: v.__setitem__(7, v[7][:, 1:]), r"P must have shape \[1, 6\]"),
])
def test_bad_inputs_name_the_node(change, message):
    inputs = _inputs("LSTM", np.random.default_rng(1), 2, 2, 3, 2, 1, 0, lengths=[2, 1])
    change(inputs)
    kernel = recurrent.LSTM(_ctx("LSTM"))
    with pytest.raises(KernelError, match=f"node 'rec' \\(LSTM\\): {message}"):
        kernel.run(*inputs)


def test_hidden_size_must_match_r():
    inputs = _inputs("RNN", np.random.default_rng(1), 2, 2, 3, 2, 1, 0)
    with pytest.raises(KernelError, match="R has hidden size 2, the attribute hidden_size is 3"):
        recurrent.RNN(_ctx("RNN", {"hidden_size": 3})).run(*inputs)
