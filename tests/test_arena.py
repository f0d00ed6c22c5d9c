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
