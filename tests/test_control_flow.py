"""If, Loop, Scan and sequences: a model shaped like exporters write them, against onnxruntime;
bodies that read outer values, share the session's kernels and hand over arrays of their own;
errors that name the node and the graph.

ONNX's node test cases for these operators run in tests/test_backend.py.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from _control_flow_model import SIZES, accumulating_loop, exported_model, rnn_scan
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.test.loader import load_model_tests

from onnx_light.runtime import InvalidInputError, RuntimeSession, UnsupportedOperatorError
from onnx_light.runtime.subgraphs import free_names

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
OPSET = 17
BATCH, FEATURES, HIDDEN = SIZES
STEPS = 5


def _info(name: str, element_type: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, element_type, shape)


def _constant(name: str, values, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def _model(nodes, inputs, outputs, initializers=(), opset=OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _onnxruntime(model: onnx.ModelProto):
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("num_threads", [1, 2])
def test_an_exported_model_with_scan_loop_and_if_matches_onnxruntime(num_threads):
    model = exported_model()
    ours, theirs = RuntimeSession(model, num_threads=num_threads), _onnxruntime(model)
    rng = np.random.default_rng(0)
    for shift in (0.5, -0.5):  # the head's If takes each branch
        x = (rng.standard_normal((BATCH, STEPS, FEATURES)) + shift).astype(np.float32)
        expected = theirs.run(None, {"x": x})
        got = ours.run(None, {"x": x})
        for name, a, b in zip(["h_last", "states", "acc", "totals", "y"], got, expected, strict=True):
            assert a.shape == b.shape, name
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_model_torch_exported_with_loop_and_if_matches_onnxruntime():
    """tests/data/torch_control_flow.onnx (tools/export_torch_control_flow.py): a scripted
    recurrence over the time axis (Loop) and an If on its sum, as torch's exporter writes
    them; every time length, none included, and both branches."""
    model = onnx.load(str(Path(__file__).parent / "data" / "torch_control_flow.onnx"))
    assert {"Loop", "If"} <= {node.op_type for node in model.graph.node}
    ours, theirs = RuntimeSession(model), _onnxruntime(model)
    rng = np.random.default_rng(0)
    branches = set()
    for batch, steps in [(2, 5), (3, 1), (1, 7), (2, 0), (4, 3), (1, 2), (2, 9)]:
        x = rng.standard_normal((batch, steps, 8)).astype(np.float32)
        expected, got = theirs.run(None, {"x": x}), ours.run(None, {"x": x})
        for a, b in zip(got, expected, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        branches.add(bool(got[1].sum() > 0))
    assert branches == {True, False}


def test_the_rnn_scan_is_the_recurrence():
    """The Scan's outputs against the recurrence written out in numpy."""
    model = exported_model()
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = np.random.default_rng(1).standard_normal((BATCH, STEPS, FEATURES)).astype(np.float32)
    h_last, states, *_ = RuntimeSession(model).run(None, {"x": x})
    h = np.zeros((BATCH, HIDDEN), np.float32)
    for t in range(STEPS):
        h = np.tanh(x[:, t] @ weights["Wx"] + h @ weights["Wh"] + weights["b"])
        np.testing.assert_allclose(states[:, t], h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_last, h, rtol=1e-5, atol=1e-6)


def test_bodies_run_the_sessions_configured_kernels_on_its_pool():
    session = RuntimeSession(exported_model(), num_threads=2)
    loop = next(step for step in session._plan if getattr(step, "node", "") == "accumulate")
    body = loop.run.__self__.bodies["body"]
    kernels = [run.__self__ for run, *_ in body.steps]
    assert all(kernel.pool is session._pool and kernel.num_threads == 2 for kernel in kernels)
    inner_if = next(kernel for kernel in kernels if kernel.ctx.name == "odd_or_even")
    assert set(inner_if.bodies) == {"then_branch", "else_branch"}
    assert set(inner_if.outer_names) == {"state_i", "decay", "acc_in"}
    # the body's products are tuned from the session's one snapshot, with the top-level ones
    report = {entry["node"]: entry for entry in session.tuning_report()}
    assert {"input_product", "state_product"} <= set(report)
    assert {entry["generation"] for entry in report.values()} == {session.generation}


def test_the_outer_values_of_a_graph_are_what_it_reads_and_does_not_define():
    loop = accumulating_loop()
    assert free_names(loop.attribute[0].g) == ("states", "decay")
    scan = rnn_scan()
    assert free_names(scan.attribute[0].g) == ("Wx", "Wh", "b")


def _pass_through_models():
    """Graphs whose outputs are feeds as they are, through control flow."""
    x = _info("x", F, [3])
    returns_outer = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["x_as_is"])], "then", [], [_info("x_as_is", F, [3])]
    )
    negates = helper.make_graph([helper.make_node("Neg", ["x"], ["n"])], "else", [], [_info("n", F, [3])])
    yield (
        "an If branch that returns an outer value",
        _model(
            [helper.make_node("If", ["c"], ["y"], then_branch=returns_outer, else_branch=negates)],
            [_info("c", B, []), x],
            [_info("y", F, [3])],
        ),
        {"c": np.array(True)},
    )
    carries = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [_info("i", I64, []), _info("c_in", B, []), _info("v", F, [3])],
        [_info("c_out", B, []), _info("v", F, [3])],
    )
    for trips in (0, 3):
        yield (
            f"a Loop of {trips} trips that carries a value unchanged",
            _model(
                [helper.make_node("Loop", ["m", "", "x"], ["y"], body=carries)],
                [_info("m", I64, []), x],
                [_info("y", F, [3])],
            ),
            {"m": np.array(trips)},
        )
    scan_body = helper.make_graph([], "body", [_info("s", F, [3]), _info("e", F, [])], [_info("s", F, [3])])
    yield (
        "a Scan whose state passes through",
        _model(
            [helper.make_node("Scan", ["x", "seq"], ["y"], body=scan_body, num_scan_inputs=1)],
            [x, _info("seq", F, [4])],
            [_info("y", F, [3])],
        ),
        {"seq": np.zeros(4, np.float32)},
    )


@pytest.mark.parametrize(
    ("what", "model", "feeds"), [pytest.param(*case, id=case[0]) for case in _pass_through_models()]
)
def test_outputs_that_pass_a_feed_through_are_copies(what, model, feeds):
    x = np.array([1, 2, 3], np.float32)
    (y,) = RuntimeSession(model).run(None, {**feeds, "x": x})
    np.testing.assert_array_equal(y, x)
    assert y.flags.writeable and not np.shares_memory(y, x)


def _failing_loop() -> onnx.ModelProto:
    inner = helper.make_graph(
        [helper.make_node("Reshape", ["v", "bad_shape"], ["r"], name="bad_reshape")],
        "then",
        [],
        [_info("r", F, None)],
    )
    keep = helper.make_graph(
        [helper.make_node("Identity", ["v"], ["same"])], "else", [], [_info("same", F, None)]
    )
    body = helper.make_graph(
        [
            helper.make_node("If", ["c_in"], ["w"], name="inner_if", then_branch=inner, else_branch=keep),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [_info("i", I64, []), _info("c_in", B, []), _info("v", F, [4])],
        [_info("c_out", B, []), _info("w", F, None)],
    )
    return _model(
        [helper.make_node("Loop", ["m", "c", "x"], ["y"], name="outer_loop", body=body)],
        [_info("m", I64, []), _info("c", B, []), _info("x", F, [4])],
        [_info("y", F, None)],
        [_constant("bad_shape", [3], np.int64)],
    )


def test_an_error_in_a_body_names_the_node_and_every_graph_around_it():
    session = RuntimeSession(_failing_loop())
    feeds = {"m": np.array(2), "x": np.zeros(4, np.float32)}
    np.testing.assert_array_equal(
        session.run(None, {**feeds, "c": np.array(False)})[0], np.zeros(4)
    )  # cond false: no iteration
    with pytest.raises(ValueError) as info:
        session.run(None, {**feeds, "c": np.array(True)})
    message = str(info.value)
    assert "'bad_reshape' (Reshape)" in message
    assert "graph 'then_branch' of node 'inner_if' (If)" in message
    assert "graph 'body' of node 'outer_loop' (Loop)" in message


def test_the_node_hook_sees_every_step_of_the_bodies_and_may_stop_the_run():
    session = RuntimeSession(exported_model())
    x = np.random.default_rng(1).standard_normal((BATCH, STEPS, FEATURES)).astype(np.float32)
    calls = []

    def hook(name, op_type):
        calls.append((name, op_type))
        return lambda: calls.append("done")

    expected = session.run(None, {"x": x})
    got = session.run(None, {"x": x}, node_hook=hook)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    assert calls.count(("step_state", "Gather")) == STEPS  # once per iteration of the Loop body
    assert calls.count(("odd_or_even", "If")) == STEPS
    # the branches' nodes: Sub on the odd steps, Add (the even branch) on the others
    assert calls.count("done") == len(calls) / 2
    loop = calls.index(("accumulate", "Loop"))
    assert calls[loop + 1] == ("step_state", "Gather")  # the body runs inside the Loop's step

    class Stop(Exception):
        pass

    seen = []

    def stop_in_the_third_iteration(name, op_type):
        seen.append(name)
        if seen.count("step_state") == 3:
            raise Stop(name)

    with pytest.raises(Stop, match="step_state"):  # raised as it is, not wrapped by the Loop
        session.run(None, {"x": x}, node_hook=stop_in_the_third_iteration)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected[0])


def _profiled_nodes(module, tmp_path, name):
    options = module.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / name)
    session = module.InferenceSession(
        exported_model().SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    session.run(None, {"x": np.zeros((BATCH, STEPS, FEATURES), np.float32)})
    events = json.loads(Path(session.end_profiling()).read_text())
    return [e["name"] for e in events if e["cat"] == "Node"]


def test_a_profile_lists_the_bodies_nodes_as_onnxruntimes_does(tmp_path):
    import onnx_light

    ort = pytest.importorskip("onnxruntime")
    ours = _profiled_nodes(onnx_light, tmp_path, "ours")
    theirs = _profiled_nodes(ort, tmp_path, "theirs")
    in_bodies = {"step_state_kernel_time", "odd_or_even_kernel_time"}  # the named body nodes
    assert in_bodies <= set(theirs) and in_bodies <= set(ours)
    assert ours.count("step_state_kernel_time") == STEPS


def test_an_unsupported_operator_in_a_body_is_listed_with_the_top_level_ones():
    body = helper.make_graph(
        [
            helper.make_node("InBody", ["v"], ["w"], domain="example.unknown"),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [_info("i", I64, []), _info("c_in", B, []), _info("v", F, [4])],
        [_info("c_out", B, []), _info("w", F, [4])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Loop", ["m", "", "x"], ["y"], body=body),
            helper.make_node("AtTop", ["y"], ["z"], domain="example.unknown"),
        ],
        "g",
        [_info("m", I64, []), _info("x", F, [4])],
        [_info("z", F, [4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("example.unknown", 1)]
    )
    with pytest.raises(UnsupportedOperatorError) as info:
        RuntimeSession(model)
    assert {op.op_type for op in info.value.operators} == {"InBody", "AtTop"}


def test_a_loop_of_constants_is_folded_at_construction():
    count = helper.make_graph(
        [
            helper.make_node("Add", ["v_in", "step"], ["v_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [_info("i", I64, []), _info("c_in", B, []), _info("v_in", F, [2])],
        [_info("c_out", B, []), _info("v_out", F, [2]), _info("v_out", F, [2])],
    )
    model = _model(
        [
            helper.make_node("Loop", ["m", "", "v0"], ["v", "trace"], body=count),
            helper.make_node("Add", ["v", "x"], ["y"]),
        ],
        [_info("x", F, [2])],
        [_info("y", F, [2]), _info("trace", F, [3, 2])],
        [_constant("m", 3, np.int64), _constant("v0", [0, 1]), _constant("step", 1.0)],
    )
    x = np.array([10, 20], np.float32)
    folded, unfolded = RuntimeSession(model), RuntimeSession(model, fold=False)
    assert folded.folded_nodes == 1 and unfolded.folded_nodes == 0
    for session in (folded, unfolded):
        y, trace = session.run(None, {"x": x})
        np.testing.assert_array_equal(y, [13, 24])
        np.testing.assert_array_equal(trace, [[1, 2], [2, 3], [3, 4]])


def test_a_loop_of_constants_that_draws_random_numbers_is_left_to_the_runs():
    drop = helper.make_graph(
        [
            helper.make_node("Dropout", ["v_in", "ratio", "training"], ["v_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [_info("i", I64, []), _info("c_in", B, []), _info("v_in", F, [64])],
        [_info("c_out", B, []), _info("v_out", F, [64])],
        initializer=[_constant("ratio", 0.5), _constant("training", True, np.bool_)],
    )
    model = _model(
        [helper.make_node("Loop", ["m", "", "v0"], ["v"], body=drop)],
        [],
        [_info("v", F, [64])],
        [_constant("m", 1, np.int64), _constant("v0", np.ones(64))],
    )
    session = RuntimeSession(model)
    assert session.folded_nodes == 0
    first, second = session.run(None, {})[0], session.run(None, {})[0]
    assert set(np.unique(first)) <= {0.0, 2.0} and not np.array_equal(first, second)


def _sequence_model() -> onnx.ModelProto:
    sequence = helper.make_tensor_sequence_value_info
    return _model(
        [
            helper.make_node("SequenceInsert", ["s", "x"], ["t"]),
            helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=0),
        ],
        [sequence("s", F, [None]), _info("x", F, [None])],
        [sequence("t", F, None), _info("y", F, [None])],
    )


def test_sequence_feeds_are_checked_and_outputs_hold_copies():
    session = RuntimeSession(_sequence_model())
    assert [arg.type for arg in session.get_inputs()] == ["seq(tensor(float))", "tensor(float)"]
    a, x = np.array([1, 2], np.float32), np.array([3], np.float32)
    t, y = session.run(None, {"s": [a], "x": x})
    np.testing.assert_array_equal(y, [1, 2, 3])
    assert len(t) == 2 and not any(np.shares_memory(v, f) for v in t for f in (a, x))
    with pytest.raises(InvalidInputError, match="input 's': expected a sequence"):
        session.run(None, {"s": a, "x": x})
    with pytest.raises(InvalidInputError, match="input 's': expected element type"):
        session.run(None, {"s": [a.astype(np.int64)], "x": x})


def test_a_loop_carrying_an_optional_sequence_matches_onnxs_expected_outputs():
    """test_loop16_seq_none, which onnx's runner cannot compare (tests/test_backend.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = next(c for c in load_model_tests(kind="node") if c.name == "test_loop16_seq_none")
    ((inputs, (expected,)),) = case.data_sets
    session = RuntimeSession(case.model)
    (got,) = session.run(None, dict(zip([i.name for i in session.get_inputs()], inputs, strict=True)))
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_a_node_refused_in_a_body_is_named_with_the_graph_at_construction():
    state = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["s_out"])],
        "state",
        [_info("s", F, [2])],
        [_info("s_out", F, [2])],
    )
    body = helper.make_graph(
        [
            helper.make_node("Scan", ["v"], ["w"], name="no_scan_inputs", body=state, num_scan_inputs=0),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [_info("i", I64, []), _info("c_in", B, []), _info("v", F, [2])],
        [_info("c_out", B, []), _info("w", F, [2])],
    )
    model = _model(
        [helper.make_node("Loop", ["m", "", "x"], ["y"], name="outer_loop", body=body)],
        [_info("m", I64, []), _info("x", F, [2])],
        [_info("y", F, [2])],
    )
    with pytest.raises(
        ValueError,
        match=r"node 'no_scan_inputs' \(Scan\): attribute "
        r"'num_scan_inputs' must be 1 or more, got 0, in graph "
        r"'body' of node 'outer_loop' \(Loop\)",
    ):
        RuntimeSession(model)


@pytest.mark.parametrize(
    ("op", "position", "message"),
    [
        ("SequenceAt", 2, "position 2 is out of range for a sequence of 2 element(s) (valid: -2 to 1)"),
        ("SequenceErase", -3, "position -3 is out of range for a sequence of 2 element(s)"),
    ],
)
def test_a_position_outside_the_sequence_is_the_nodes_error(op, position, message):
    sequence = helper.make_tensor_sequence_value_info
    output = _info("y", F, None) if op == "SequenceAt" else sequence("y", F, None)
    model = _model(
        [
            helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
            helper.make_node(op, ["s", "p"], ["y"], name="pick"),
        ],
        [_info("a", F, [1]), _info("b", F, [1]), _info("p", I64, [])],
        [output],
    )
    session = RuntimeSession(model)
    feeds = {"a": np.ones(1, np.float32), "b": np.zeros(1, np.float32)}
    session.run(None, {**feeds, "p": np.array(1)})
    with pytest.raises(ValueError, match=re.escape(f"node 'pick' ({op}): {message}")):
        session.run(None, {**feeds, "p": np.array(position)})
