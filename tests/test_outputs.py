"""What a run hands back: arrays of the caller's own.

Outputs never share memory with the feeds, with the session's constants (so a caller writing
into an output cannot change a later run) or with each other, and a run never writes a feed,
as with onnxruntime. Inside the plan views stay views; only the hand-off copies, and only the
outputs the plan says may share memory (``Kernel.views``).
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import numpy as np
import onnx
import pytest
import test_backend
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.test.loader import load_model_tests

from onnx_light.runtime import RuntimeSession

F = TensorProto.FLOAT


def _info(name: str, shape, element_type: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, element_type, shape)


def _model(nodes, inputs, outputs, initializers=(), opset=13, ir_version=None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def _ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)

# (op, extra inputs (initializers), attributes, output shape, number of outputs)
VIEW_OPS = [
    ("Identity", [], {}, [2, 3, 4], 1),
    ("Reshape", [_ints("shape", [6, 4])], {}, [6, 4], 1),
    ("Flatten", [], {"axis": 1}, [2, 12], 1),
    ("Squeeze", [_ints("axes", [0])], {}, [3, 4], 1),
    ("Unsqueeze", [_ints("axes", [0])], {}, [1, 2, 3, 4], 1),
    ("Transpose", [], {"perm": [2, 0, 1]}, [4, 2, 3], 1),
    ("Slice", [_ints("starts", [1]), _ints("ends", [3]), _ints("axes", [1])], {}, [2, 2, 4], 1),
    ("Dropout", [], {}, [2, 3, 4], 1),
    ("Split", [_ints("split", [1, 1])], {"axis": 0}, [1, 3, 4], 2),
    ("ReduceSum", [_ints("axes", [])], {"noop_with_empty_axes": 1}, [2, 3, 4], 1),
]


def _view_model(op, extra, attributes, shape, count) -> onnx.ModelProto:
    x = X[:1] if op == "Squeeze" else X
    outputs = [f"y{i}" for i in range(count)]
    node = helper.make_node(op, ["x", *(t.name for t in extra)], outputs, **attributes)
    return _model([node], [_info("x", list(x.shape))], [_info(o, shape) for o in outputs], extra)


def _arrays(values) -> list[np.ndarray]:
    """The tensors of values that may be sequences (lists) or empty optionals (None)."""
    found = []
    for value in values:
        if isinstance(value, list):
            found += _arrays(value)
        elif value is not None:
            found.append(value)
    return found


def _assert_own(outputs, feeds) -> None:
    """Each output tensor (also inside a sequence) is writable and shares memory with no
    feed and no other output."""
    outputs = _arrays(outputs)
    feeds = {f"{name}[{i}]": x for name, value in feeds.items()
             for i, x in enumerate(_arrays([value]))}
    for i, y in enumerate(outputs):
        assert y.flags.writeable
        assert type(y) is np.ndarray
        for name, x in feeds.items():
            assert not np.shares_memory(y, x), f"output {i} shares memory with feed {name!r}"
        for j, other in enumerate(outputs[:i]):
            assert not np.shares_memory(y, other), f"outputs {j} and {i} share memory"


@pytest.mark.parametrize(("op", "extra", "attributes", "shape", "count"),
                         [pytest.param(*row, id=row[0]) for row in VIEW_OPS])
def test_a_view_of_a_feed_is_handed_over_as_a_copy(op, extra, attributes, shape, count):
    session = RuntimeSession(_view_model(op, extra, attributes, shape, count))
    x = (X[:1] if op == "Squeeze" else X).copy()
    before = x.copy()
    outputs = session.run(None, {"x": x})
    _assert_own(outputs, {"x": x})
    values = [y.copy() for y in outputs]
    for y in outputs:
        y[...] = -1
    np.testing.assert_array_equal(x, before)
    # the feed stays the caller's to change: the next run sees the new values
    x += 1
    for again, value in zip(session.run(None, {"x": x}), values, strict=True):
        np.testing.assert_array_equal(again, value + 1)


def test_the_issue_reproduction_and_a_graph_that_returns_its_input():
    identity = _model([helper.make_node("Identity", ["X"], ["Y"])], [_info("X", [3])],
                      [_info("Y", [3])])
    x = np.zeros(3, np.float32)
    y = RuntimeSession(identity).run(None, {"X": x})[0]
    y[0] = 7
    np.testing.assert_array_equal(x, [0, 0, 0])
    # the graph's output is its input, no node between
    passthrough = _model([helper.make_node("Relu", ["X"], ["R"])], [_info("X", [3])],
                         [_info("X", [3]), _info("R", [3])])
    x = np.array([-1, 0, 1], np.float32)
    outputs = RuntimeSession(passthrough).run(None, {"X": x})
    _assert_own(outputs, {"X": x})
    np.testing.assert_array_equal(outputs[0], x)


@pytest.mark.parametrize("op", ["Identity", "Reshape", "Transpose"])
def test_a_feed_is_never_written_by_a_run(op):
    """Feeds, and views of them, reach the kernels read-only: a kernel that wrote into its
    input fails naming its node instead of changing the caller's array."""
    relu = helper.make_node("Relu", ["v"], ["y"], name="writer")
    view = next(row for row in VIEW_OPS if row[0] == op)
    node = helper.make_node(op, ["x", *(t.name for t in view[1])], ["v"], **view[2])
    session = RuntimeSession(_model([node, relu], [_info("x", [2, 3, 4])], [_info("y", view[3])],
                                    view[1]), fuse=False)

    def in_place(v):
        np.maximum(v, 0, out=v)
        return [v]

    # (unprepared: a prepared step writes into its planned buffer, never calling run)
    session._plan = tuple(dataclasses.replace(step, run=in_place, prepared=None, checked=())
                          if step.node == "writer" else step for step in session._plan)
    x = X - 10
    with pytest.raises(RuntimeError, match=r"node 'writer' \(Relu\) failed: ValueError: .*read-only"):
        session.run(None, {"x": x})
    np.testing.assert_array_equal(x, X - 10)
    assert x.flags.writeable  # the caller's array keeps its flags


def _two_outputs_models():
    relu = helper.make_node("Relu", ["x"], ["t"])
    x, t = _info("x", [2, 3, 4]), _info("t", [2, 3, 4])
    yield "split of a computed value", _model(
        [relu, helper.make_node("Split", ["t", "split"], ["a", "b"], axis=0)], [x],
        [_info("a", [1, 3, 4]), _info("b", [1, 3, 4])], [_ints("split", [1, 1])])
    yield "identity into two outputs", _model(
        [relu, helper.make_node("Identity", ["t"], ["a"]), helper.make_node("Identity", ["t"], ["b"])],
        [x], [t, _info("a", [2, 3, 4]), _info("b", [2, 3, 4])])
    yield "an output and a view of it", _model(
        [relu, helper.make_node("Reshape", ["t", "shape"], ["r"])], [x],
        [t, _info("r", [24])], [_ints("shape", [24])])
    yield "legacy BatchNormalization listing its statistics", _model(
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "m1", "v1", "m2", "v2"],
                          is_test=1)],
        [x, _info("s", [3]), _info("b", [3]), _info("m", [3]), _info("v", [3])],
        [_info("y", [2, 3, 4])] + [_info(n, [3]) for n in ("m1", "v1", "m2", "v2")],
        [numpy_helper.from_array(np.ones(3, np.float32), "s"),
         numpy_helper.from_array(np.zeros(3, np.float32), "b")], opset=6, ir_version=3)


@pytest.mark.parametrize(("label", "model"), list(_two_outputs_models()))
def test_outputs_of_one_run_never_share_memory(label, model):
    session = RuntimeSession(model)
    feeds = {"x": X - 10}
    if len(session.get_inputs()) > 1:
        feeds |= {"m": np.zeros(3, np.float32), "v": np.ones(3, np.float32)}
    outputs = session.run(None, feeds)
    _assert_own(outputs, feeds)
    names = [o.name for o in session.get_outputs()]
    twice = session.run([names[0], names[0], *names], feeds)  # a name listed twice
    _assert_own(twice, feeds)


def test_the_plan_copies_only_what_may_share_memory():
    """A computed output is handed over as it is; a view of a feed, a constant or another
    output is copied (decided at construction)."""
    model = _model(
        [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Identity", ["t"], ["a"]),
         helper.make_node("Identity", ["x"], ["b"]), helper.make_node("Identity", ["w"], ["c"]),
         helper.make_node("Neg", ["x"], ["d"])],
        [_info("x", [4])], [_info(n, [4]) for n in "tabcd"],
        [numpy_helper.from_array(np.ones(4, np.float32), "w")])
    session = RuntimeSession(model, fuse=False)
    assert session._handoff.every == (False, True, True, True, False)
    x = np.arange(4, dtype=np.float32) - 2
    outputs = session.run(None, {"x": x})
    _assert_own(outputs, {"x": x})
    t, d = session._output_slots["t"], session._output_slots["d"]
    assert session._handoff.copies([d, t, t]) == (False, False, True)


@pytest.mark.parametrize("plan", ["folded", "unfolded"])
def test_writing_into_an_output_never_changes_the_next_run(plan):
    """Outputs that are initializers, views of them or constants the folding made."""
    nodes = [helper.make_node("Identity", ["w"], ["a"]),
             helper.make_node("Reshape", ["w", "shape"], ["b"]),
             helper.make_node("Constant", [], ["k"], value_floats=[1.0, 2.0, 3.0, 4.0]),
             helper.make_node("Transpose", ["k"], ["c"]),
             helper.make_node("Add", ["w", "x"], ["d"])]
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    inputs = [_info("x", [4])]
    if plan == "unfolded":  # IR 3: w is also an input, whose default the folding used
        inputs += [_info("w", [4]), _info("shape", [2], TensorProto.INT64)]
    model = _model(nodes, inputs, [_info("a", [4]), _info("b", [2, 2]), _info("k", [4]),
                                   _info("c", [4]), _info("d", [4])],
                   [w, _ints("shape", [2, 2])], ir_version=3 if plan == "unfolded" else None)
    session = RuntimeSession(model)
    feeds = {"x": np.ones(4, np.float32)}
    if plan == "unfolded":
        feeds["w"] = np.arange(4, dtype=np.float32)
    first = [y.copy() for y in session.run(None, feeds)]
    for _ in range(2):
        outputs = session.run(None, feeds)
        for expected, y in zip(first, outputs, strict=True):
            np.testing.assert_array_equal(y, expected)
            y[...] = 99
        _assert_own(outputs, feeds)


# Random chains of view ops (and one computing op) over a feed, any value an output:
# op -> (its constant inputs, attributes, output shape, numpy) from the input's shape.
_STEPS = {
    "Identity": lambda shape: ([], {}, shape, lambda v: v),
    "Transpose": lambda shape: ([], {}, shape[::-1], np.transpose),
    "Flatten": lambda shape: ([], {"axis": 1}, [shape[0], int(np.prod(shape[1:]))],
                              lambda v: v.reshape(v.shape[0], -1)),
    "Reshape": lambda shape: ([[-1]], {}, [int(np.prod(shape))], np.ravel),
    "Unsqueeze": lambda shape: ([[0]], {}, [1, *shape], lambda v: v[None]),
    "Slice": lambda shape: ([[0], [max(1, shape[0] - 1)]], {}, [max(1, shape[0] - 1), *shape[1:]],
                            lambda v: v[:max(1, v.shape[0] - 1)]),
    "Relu": lambda shape: ([], {}, shape, lambda v: np.maximum(v, 0)),
}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(sorted(_STEPS)), min_size=1, max_size=6),
       st.lists(st.booleans(), min_size=6, max_size=6), st.booleans(), st.booleans())
def test_random_chains_of_views_hand_over_arrays_of_their_own(ops, exposed, return_input,
                                                              read_only):
    shape, previous, nodes, outputs, initializers = [2, 3, 4], "x", [], [], []
    x = X - 5
    value, expected = x.copy(), []
    for index, op in enumerate(ops):
        constant_values, attributes, shape, numpy_op = _STEPS[op](shape)
        names = [f"c{index}_{k}" for k in range(len(constant_values))]
        initializers += [_ints(n, v) for n, v in zip(names, constant_values, strict=True)]
        nodes.append(helper.make_node(op, [previous, *names], [f"v{index}"], **attributes))
        value = numpy_op(value)
        if exposed[index] or index == len(ops) - 1:
            outputs.append(_info(f"v{index}", shape))
            expected.append(value)
        previous = f"v{index}"
    if return_input:
        outputs.append(_info("x", [2, 3, 4]))
        expected.append(x.copy())
    session = RuntimeSession(_model(nodes, [_info("x", [2, 3, 4])], outputs, initializers))
    x.flags.writeable = not read_only
    before = x.copy()
    results = session.run(None, {"x": x})
    _assert_own(results, {"x": x})
    np.testing.assert_array_equal(x, before)
    for got, want in zip(results, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def _node_cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wanted = set(test_backend.SUPPORTED_NODE_TESTS) - set(test_backend.EXCLUDED)
        return [case for case in load_model_tests(kind="node") if case.name in wanted]


def test_no_node_of_onnx_backend_suite_hands_over_a_feed_or_writes_one():
    """Every node test of ONNX's suite that onnx_light runs: the outputs share memory with no
    feed and with each other, and the feeds are unchanged."""
    checked = sequences = 0
    for case in _node_cases():
        session = RuntimeSession(case.model, num_threads=1)
        names = [i.name for i in session.get_inputs()]
        arrays = case.data_sets[0][0]
        if len(arrays) != len(names) or not all(isinstance(a, (np.ndarray, list)) for a in arrays):
            continue  # optional inputs left out, TensorProto data
        feeds = dict(zip(names, arrays, strict=True))
        before = [array.copy() for array in _arrays(arrays)]
        outputs = session.run(None, feeds)
        _assert_own(outputs, feeds)
        for array, copy in zip(_arrays(arrays), before, strict=True):
            np.testing.assert_array_equal(array, copy, err_msg=case.name)
        checked += 1
        sequences += any(isinstance(a, list) for a in arrays)
    assert checked > 900
    assert sequences > 15  # the cases that feed sequences (19 of onnx 1.23's)


def test_the_shared_memory_oracle_sees_views_of_views():
    """The oracle (``np.shares_memory``) catches what the hand-off must prevent."""
    x = np.arange(6.0)
    views = [x.reshape(2, 3), x[1:], x.reshape(3, 2).T, np.split(x, 2)[1]]
    assert all(np.shares_memory(v, x) for v in views)
    assert not any(np.shares_memory(a, b) for a, b in itertools.combinations(np.split(x, 2), 2))
