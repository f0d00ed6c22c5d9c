"""The memory plan and the bound plan: prepared steps write into buffers reused by lifetime,
with the values the kernels' own run gives, and no output ever shares a reused buffer."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light.runtime import RuntimeSession
from onnx_light.runtime.arena import plan_memory

F32 = np.dtype(np.float32)
SPEC = ((1, 8), F32)


def test_buffers_are_shared_by_values_whose_lifetimes_do_not_overlap():
    # 1 = f(0), 2 = g(1), 3 = h(2), 4 = k(3): 1 is free once 2 is made, so 3 takes its buffer
    writes = [(0, 1, SPEC), (1, 2, SPEC), (2, 3, SPEC), (3, 4, SPEC)]
    reads = [[0], [1], [2], [3]]
    plan = plan_memory(writes, reads, {}, outputs={4})
    assert plan.assignment == {1: 0, 2: 1, 3: 0}
    assert len(plan.buffers) == 2 and plan.nbytes == 2 * 32


def test_a_view_keeps_its_buffer_busy_and_other_specs_get_their_own():
    # 5 is a view of 1 read at position 3: 1's buffer is busy until then
    writes = [(0, 1, SPEC), (1, 2, SPEC), (2, 3, SPEC), (3, 6, ((8,), F32))]
    reads = [[0], [1], [2], [5, 3]]
    plan = plan_memory(writes, reads, {5: frozenset({1})}, outputs=())
    assert len({plan.assignment[s] for s in (1, 2, 3)}) == 3
    assert plan.buffers[plan.assignment[6]] == ((8,), F32)


def _chain(view_output: bool = False):
    """x -> Add C -> Relu -> MatMul W -> Add x -> (Reshape) y: every step preparable."""
    rng = np.random.default_rng(3)
    c = numpy_helper.from_array(rng.standard_normal((1, 8)).astype(np.float32), "C")
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W")
    shape = numpy_helper.from_array(np.array([8], np.int64), "shape")
    nodes = [helper.make_node("Add", ["x", "C"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("MatMul", ["b", "W"], ["m"]),
             helper.make_node("Add", ["m", "x"], ["s" if view_output else "y"])]
    if view_output:
        nodes.append(helper.make_node("Reshape", ["s", "shape"], ["y"]))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8] if view_output else [1, 8])],
        [c, w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(seed: int):
    return {"x": np.random.default_rng(seed).standard_normal((1, 8)).astype(np.float32)}


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("view_output", [False, True])
def test_the_bound_plan_gives_the_walks_values_and_outputs_of_the_callers_own(fuse, view_output):
    session = RuntimeSession(_chain(view_output), num_threads=1, fuse=fuse)
    prepared = [item for item in session._plan if item.prepared is not None]
    assert len(prepared) == len(session._plan) - view_output  # the Reshape runs as it is
    assert session.arena_bytes > 0
    first = session.run(None, _feeds(0))[0]
    kept = first.copy()
    for seed in (1, 2):
        bound = session.run(None, _feeds(seed))[0]
        walked = session.run(None, _feeds(seed), node_hook=lambda name, op: None)[0]
        assert bound.tobytes() == walked.tobytes()
    np.testing.assert_array_equal(first, kept)  # later runs reused no memory the caller holds
    reference = RuntimeSession(_chain(view_output), num_threads=1, fuse=False, fold=False)
    np.testing.assert_allclose(first, reference.run(None, _feeds(0))[0], rtol=1e-6, atol=1e-6)


def test_a_feed_that_is_not_contiguous_is_read_as_its_values():
    session = RuntimeSession(_chain(), num_threads=1)
    wide = np.random.default_rng(4).standard_normal((1, 16)).astype(np.float32)
    strided = wide[:, ::2]
    assert not strided.flags.c_contiguous
    got = session.run(None, {"x": strided})[0]
    np.testing.assert_array_equal(got, session.run(None, {"x": strided.copy()})[0])
    np.testing.assert_array_equal(wide, np.random.default_rng(4).standard_normal((1, 16)).astype(np.float32))


def test_concurrent_runs_take_buffers_of_their_own():
    session = RuntimeSession(_chain(), num_threads=1)
    expected = {seed: session.run(None, _feeds(seed))[0] for seed in range(4)}
    problems: list[str] = []
    start = threading.Barrier(4)

    def work(seed: int) -> None:
        start.wait()
        for _ in range(200):
            got = session.run(None, _feeds(seed))[0]
            if got.tobytes() != expected[seed].tobytes():
                problems.append(f"seed {seed}: {got} != {expected[seed]}")
                return

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []


def test_a_symbolic_input_leaves_the_steps_to_their_kernels():
    model = _chain()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    session = RuntimeSession(model, num_threads=1, fuse=False)
    assert all(item.prepared is None for item in session._plan)
    x = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    assert session.run(None, {"x": x})[0].shape == (3, 8)


def _after_unprepared_steps(batch: int | str = 2):
    """Steps the memory plan cannot prepare (Transpose's view, Concat, ReduceSum), each
    followed by preparable ones whose input specs only shape inference gives."""
    c = numpy_helper.from_array(np.linspace(-1, 1, 4, dtype=np.float32), "C")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Add", ["t", "C"], ["a"]),  # reads a view: copied into scratch
             helper.make_node("Relu", ["a"], ["r"]),  # reads a's output: into its buffer
             helper.make_node("Transpose", ["r"], ["u"], perm=[0, 2, 1]),
             helper.make_node("Sigmoid", ["u"], ["s"]),
             helper.make_node("Add", ["s", "x"], ["y"]),
             helper.make_node("Concat", ["x", "x"], ["z"], axis=0),
             helper.make_node("Mul", ["z", "z"], ["m"]),
             helper.make_node("Neg", ["m"], ["n"]),
             helper.make_node("ReduceSum", ["n", "axes"], ["k"], keepdims=1),
             helper.make_node("Abs", ["k"], ["e"]), helper.make_node("Exp", ["e"], ["w"])]
    graph = helper.make_graph(
        nodes, "after", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 3]),
         helper.make_tensor_value_info("n", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 4, 3])], [c, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("fuse", [True, False])
def test_steps_after_unprepared_ones_write_into_buffers_checked_every_run(fuse):
    session = RuntimeSession(_after_unprepared_steps(), num_threads=1, fuse=fuse)
    checked = [item for item in session._plan if item.checked]
    assert checked and all(item.prepared is not None for item in checked)
    assert session.arena_bytes > 0
    reference = RuntimeSession(_after_unprepared_steps(), num_threads=1, fuse=False, fold=False)
    feeds = [{"x": np.random.default_rng(seed).standard_normal((2, 4, 3)).astype(np.float32)}
             for seed in range(3)]
    first = session.run(None, feeds[0])
    kept = [output.copy() for output in first]
    for feed in feeds:  # two runs in a row: the second reuses the buffers, never the outputs
        bound = session.run(None, feed)
        walked = session.run(None, feed, node_hook=lambda name, op: None)
        for got, walk, want in zip(bound, walked, reference.run(None, feed), strict=True):
            assert got.tobytes() == walk.tobytes()
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert len({id(output.base if output.base is not None else output) for output in bound}) == 3
    for output, copy in zip(first, kept, strict=True):
        np.testing.assert_array_equal(output, copy)


def test_a_second_input_shape_runs_the_steps_whose_inputs_it_changes():
    session = RuntimeSession(_after_unprepared_steps("batch"), num_threads=1)
    reference = RuntimeSession(_after_unprepared_steps("batch"), num_threads=1, fuse=False, fold=False)
    prepared = [item for item in session._plan if item.prepared is not None]
    assert prepared and all(item.checked for item in prepared)  # after ReduceSum's [1, 4, 3]
    for batch in (2, 5, 2):
        feed = {"x": np.random.default_rng(batch).standard_normal((batch, 4, 3)).astype(np.float32)}
        got = session.run(None, feed)
        assert [output.shape for output in got] == [(batch, 4, 3), (2 * batch, 4, 3), (1, 4, 3)]
        for output, want in zip(got, reference.run(None, feed), strict=True):
            np.testing.assert_allclose(output, want, rtol=1e-6, atol=1e-6)


def test_a_conv_writes_into_its_buffer_the_values_its_run_gives():
    rng = np.random.default_rng(6)
    w = numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Sigmoid", ["t"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 5, 3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = RuntimeSession(model, num_threads=1)
    assert [item.op_type for item in session._plan if item.prepared is not None] == ["Conv", "Sigmoid"]
    feeds = [{"x": rng.standard_normal((1, 2, 5, 5)).astype(np.float32)} for _ in range(2)]
    first = session.run(None, feeds[0])[0]
    kept = first.copy()
    for feed in feeds:
        bound = session.run(None, feed)[0]
        walked = session.run(None, feed, node_hook=lambda name, op: None)[0]
        assert bound.tobytes() == walked.tobytes()
    np.testing.assert_array_equal(first, kept)
