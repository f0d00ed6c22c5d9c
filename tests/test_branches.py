"""Independent branches run side by side (runtime/branches.py) and in sessions."""

from __future__ import annotations

import dataclasses
import random
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import KERNELS
from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.parallel import ThreadPool
from onnx_light.runtime import RuntimeSession, branches
from onnx_light.runtime.branches import Branches, group_branches
from onnx_light.runtime.plan import plan_steps

F = TensorProto.FLOAT
RNG = np.random.default_rng(11)


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    release: tuple[int, ...] = ()


def _steps(edges: list[tuple[str, tuple[int, ...], int]], keep: set[int]) -> list[Step]:
    """Steps named by ``edges`` (name, input slots, output slot), with the session's releases."""
    bound = plan_steps([(_Named(name), inputs, (output,)) for name, inputs, output in edges], keep)
    return [Step(step.node, step.inputs, step.outputs, step.release) for step in bound]


class _Named:
    """What session._plan reads of a kernel."""

    def __init__(self, name: str) -> None:
        self.ctx = type("Ctx", (), {"name": name, "op_type": "Fake"})()

    def run(self) -> None:
        """Never called: these steps are only scheduled."""


def _names(items) -> list:
    return [[[s.name for s in branch] for branch in item.branches] if isinstance(item, Branches)
            else item.name for item in items]


# slot 0 is the input; a module: 1 = stem(0), branches from 1, join 9 = concat
INCEPTION = [("stem", (0,), 1),
             ("a1", (1,), 2),
             ("b1", (1,), 3), ("b2", (3,), 4),
             ("c1", (1,), 5), ("c2", (5,), 6), ("c3", (6,), 7),
             ("d1", (1,), 8),
             ("concat", (2, 4, 7, 8), 9),
             ("head", (9,), 10)]


def test_a_fork_and_its_join_make_one_group_largest_branch_first():
    steps = _steps(INCEPTION, keep={0, 10})
    work = [5, 10, 10, 10, 10, 10, 10, 10, 1, 1]
    items = group_branches(steps, work, threads=2, minimum_work=0)
    assert _names(items) == ["stem", [["c1", "c2", "c3"], ["b1", "b2"], ["a1"], ["d1"]],
                             "concat", "head"]
    group = items[1]
    # the fork's value is read by every branch: freed after the group, by no branch
    assert group.release == (1,)
    assert all(1 not in step.release for branch in group.branches for step in branch)
    # values made and read inside one branch are still freed there
    assert 3 in group.branches[1][1].release


def test_unbalanced_unknown_or_single_threaded_plans_stay_as_they_are():
    steps = _steps(INCEPTION, keep={0, 10})
    balanced = [5, 10, 10, 10, 10, 10, 10, 10, 1, 1]
    lopsided = [5, 1, 1, 1, 100, 100, 100, 1, 1, 1]  # one branch is 0.98 of the work
    unknown = list(balanced)
    unknown[2] = None
    assert group_branches(steps, lopsided, threads=2) == tuple(steps)
    assert group_branches(steps, unknown, threads=2) == tuple(steps)
    assert group_branches(steps, balanced, threads=1) == tuple(steps)
    # the rule: side by side at most 1 / speedup of the serial time (here 90 of 130)
    assert group_branches(steps, [5, 10, 10, 10, 70, 10, 10, 10, 1, 1], threads=2,
                          minimum_work=0) == tuple(steps)
    assert isinstance(group_branches(steps, [5, 10, 10, 10, 70, 10, 10, 10, 1, 1], threads=2,
                                     speedup=1.2, minimum_work=0)[1], Branches)


def test_branches_saving_less_than_the_minimum_work_stay_serial():
    """Branches run side by side only when that saves the minimum work (a handoff to the pool
    costs about as much): three equal 4 M projections on two threads save 4 M, too little."""
    steps = _steps(INCEPTION, keep={0, 10})
    balanced = [5, 30, 15, 15, 10, 10, 10, 30, 1, 1]  # four branches of 30: 60 of 120 saved
    assert isinstance(group_branches(steps, balanced, threads=2, minimum_work=60)[1], Branches)
    assert group_branches(steps, balanced, threads=2, minimum_work=61) == tuple(steps)
    projections = [x << 20 for x in (1, 4, 4, 0, 4, 0, 0, 0, 0, 0)]  # 4 M multiply-adds each
    assert group_branches(steps, projections, threads=2, minimum_work=1 << 23) == tuple(steps)


def test_chains_and_residual_blocks_have_no_branches():
    chain = _steps([("a", (0,), 1), ("b", (1,), 2), ("c", (2,), 3)], keep={0, 3})
    assert group_branches(chain, [1, 1, 1], threads=2) == tuple(chain)
    # x -> a -> b, add(b, x): the shortcut reads x, which is no branch of work
    residual = _steps([("x", (0,), 1), ("a", (1,), 2), ("b", (2,), 3), ("add", (3, 1), 4)],
                      keep={0, 4})
    assert group_branches(residual, [1, 1, 1, 1], threads=2) == tuple(residual)


def _simulate(items, inputs: set[int], keep: set[int], rng: random.Random) -> set[int]:
    """Run ``items`` with every group's branches interleaved at random: each step must find
    its inputs made and not yet freed. Returns the values alive at the end."""
    alive = set(inputs)

    def execute(step):
        missing = [s for s in step.inputs if s is not None and s not in alive]
        assert not missing, f"{step.name} reads {missing}, not made or already freed"
        alive.update(s for s in step.outputs if s is not None)
        alive.difference_update(step.release)

    for item in items:
        if isinstance(item, Branches):
            queues = [list(branch) for branch in item.branches]
            while any(queues):
                execute(rng.choice([q for q in queues if q]).pop(0))
            alive.difference_update(item.release)
        else:
            execute(item)
    return alive


@st.composite
def _graphs(draw):
    """A random DAG in topological order: step i makes slot i + 1 from earlier slots."""
    count = draw(st.integers(2, 24))
    edges = []
    for i in range(count):
        reads = draw(st.lists(st.integers(0, i), min_size=1, max_size=3, unique=True))
        edges.append((f"s{i}", tuple(reads), i + 1))
    work = draw(st.lists(st.integers(1, 50), min_size=count, max_size=count))
    return edges, work


@settings(max_examples=200, deadline=None)
@given(_graphs(), st.integers(0, 2**32 - 1), st.sampled_from([1.0, 1.5]))
def test_any_order_of_the_branches_respects_every_dependency_and_release(graph, seed, speedup):
    edges, work = graph
    keep = {0, len(edges)}
    steps = _steps(edges, keep)
    items = group_branches(steps, work, threads=2, speedup=speedup, minimum_work=0)
    flat = [s for item in items for s in
            (sum(item.branches, ()) if isinstance(item, Branches) else (item,))]
    assert sorted(s.name for s in flat) == sorted(s.name for s in steps)
    alive = _simulate(items, {0}, keep, random.Random(seed))
    # everything but the input and the output was freed, as the plain plan does
    assert alive == _simulate(steps, {0}, keep, random.Random(seed)) == keep


def _built(op_type, attributes=None, inputs=2):
    """A kernel built for a float node of ``op_type`` (opset 17)."""
    ctx = NodeContext(op_type.lower(), op_type, "", 17, attributes or {}, (F,) * inputs, (F,),
                      inputs, 1)
    return KERNELS[op_type][max(v for v in KERNELS[op_type] if v <= 17)](ctx)


def test_work_estimates_count_multiply_adds_for_products_and_elements_otherwise():
    conv = _built("Conv", {"pads": [1, 1, 1, 1]}, 3)
    assert conv.work([(1, 8, 12, 12), (16, 8, 3, 3), (16,)], [(1, 16, 12, 12)]) == 16 * 144 * 72
    gemm = _built("Gemm", {"transA": 1}, 3)
    assert gemm.work([(64, 10), (64, 32), (32,)], [(10, 32)]) == 10 * 32 * 64
    assert _built("Gemm", {}, 3).work([(10, 64), (64, 32), None], [(10, 32)]) == 10 * 32 * 64
    assert _built("MatMul").work([(4, 10, 64), (64, 32)], [(4, 10, 32)]) == 4 * 10 * 32 * 64
    assert _built("Relu", inputs=1).work([(3, 5)], [(3, 5)]) == 15
    # unknown shapes: no estimate
    assert conv.work([(1, 8, 12, 12), None], [(1, 16, 12, 12)]) is None
    assert _built("MatMul").work([None, (64, 32)], [(10, 32)]) is None
    assert _built("Relu", inputs=1).work([(3, 5)], [None]) is None


# ---------------------------------------------------------------- sessions


def _tensor(name, shape):
    return numpy_helper.from_array(RNG.uniform(-1, 1, shape).astype(np.float32), name)


@pytest.fixture(autouse=True)
def any_work_pays(monkeypatch):
    """The test models' branches are tiny: group them whatever they save."""
    monkeypatch.setattr(branches, "BRANCH_MINIMUM_WORK", 0)


def _inception(channels=8, size=12, extra_nodes=(), extra_inputs=()):
    """An Inception-like module: four branches of convolutions and a pool, one Concat."""
    nodes = [
        helper.make_node("Conv", ["x", "w_a"], ["a"], name="a"),
        helper.make_node("Conv", ["x", "w_b1"], ["b1"], name="b1"),
        helper.make_node("Relu", ["b1"], ["b1r"], name="b1r"),
        helper.make_node("Conv", ["b1r", "w_b2"], ["b"], pads=[1, 1, 1, 1], name="b2"),
        helper.make_node("Conv", ["x", "w_c1"], ["c1"], name="c1"),
        helper.make_node("Conv", ["c1", "w_c2"], ["c"], pads=[1, 1, 1, 1], name="c2"),
        helper.make_node("MaxPool", ["x"], ["d1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="d1"),
        helper.make_node("Conv", ["d1", "w_d"], ["d"], name="d2"),
        *extra_nodes,
        helper.make_node("Concat", ["a", "b", "c", "d"], ["y"], axis=1, name="concat"),
    ]
    c = channels
    initializers = [_tensor("w_a", [c, c, 1, 1]), _tensor("w_b1", [c, c, 1, 1]),
                    _tensor("w_b2", [c, c, 3, 3]), _tensor("w_c1", [c, c, 1, 1]),
                    _tensor("w_c2", [c, c, 3, 3]), _tensor("w_d", [c, c, 1, 1])]
    inputs = [helper.make_tensor_value_info("x", F, [1, c, size, size]), *extra_inputs]
    graph = helper.make_graph(nodes, "inception", inputs,
                              [helper.make_tensor_value_info("y", F, [1, 4 * c, size, size])],
                              initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_session_runs_the_branches_side_by_side_with_the_same_results():
    model = _inception()
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    session = RuntimeSession(model, num_threads=2)
    assert session.branch_groups == 1
    assert RuntimeSession(model, num_threads=2, branches=False).branch_groups == 0
    assert RuntimeSession(model, num_threads=1).branch_groups == 0
    got = session.run(None, {"x": x})[0]
    plain = RuntimeSession(model, num_threads=2, branches=False).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, plain)
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)
    for _ in range(3):  # again, with the branches taken by other threads
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], got)
    for threads in (3, 4):  # more threads than this machine may have: the same values
        wider = RuntimeSession(model, num_threads=threads)
        assert wider.branch_groups == 1
        np.testing.assert_array_equal(wider.run(None, {"x": x})[0], RuntimeSession(
            model, num_threads=threads, branches=False).run(None, {"x": x})[0])


def test_a_node_that_leaves_an_optional_output_out_still_has_a_known_work():
    # Dropout's mask output named "": the branch's work is still known, so it is grouped
    extra = [helper.make_node("Dropout", ["a"], ["a_kept", ""], name="dropout")]
    model = _inception(extra_nodes=extra)
    model.graph.node[-1].input[0] = "a_kept"
    session = RuntimeSession(model, num_threads=2)
    assert session.branch_groups == 1
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0],
                                  RuntimeSession(model, num_threads=2, branches=False).run(
                                      None, {"x": x})[0])


def test_a_run_that_overrides_a_default_takes_the_unfolded_plan_with_its_branches():
    # IR < 4: initializers are graph inputs too, defaults a feed may override
    model = _inception()
    model.ir_version = 3
    model.graph.input.extend(helper.make_tensor_value_info(t.name, F, list(t.dims))
                             for t in model.graph.initializer)
    session = RuntimeSession(model, num_threads=2)
    assert any(isinstance(item, Branches) for item in session._unfolded[0])
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    w_a = RNG.uniform(-1, 1, (8, 8, 1, 1)).astype(np.float32)
    for feeds in ({"x": x}, {"x": x, "w_a": w_a}):
        np.testing.assert_allclose(session.run(None, feeds)[0],
                                   ReferenceEvaluator(model).run(None, feeds)[0],
                                   rtol=1e-5, atol=1e-5)


def test_two_threads_running_one_session_both_get_their_results():
    """One thread's run holds the pool; the other's finds it busy and runs its branches
    inline, one after the other."""
    model = _inception()
    session = RuntimeSession(model, num_threads=2)
    xs = [RNG.standard_normal((1, 8, 12, 12)).astype(np.float32) for _ in range(2)]
    expected = [RuntimeSession(model, num_threads=1).run(None, {"x": x})[0] for x in xs]
    results: list = [None, None]

    def work(i):
        for _ in range(5):
            results[i] = session.run(None, {"x": xs[i]})[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_error_in_a_branch_names_its_node():
    # a branch gathers channels by indices fed at run time; an index out of range fails there
    extra = [helper.make_node("Gather", ["d", "pick"], ["d_picked"], axis=1, name="bad_gather")]
    model = _inception(extra_nodes=extra,
                       extra_inputs=[helper.make_tensor_value_info("pick", TensorProto.INT64, [8])])
    model.graph.node[-1].input[3] = "d_picked"
    session = RuntimeSession(model, num_threads=2)
    assert session.branch_groups == 1
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    ok = session.run(None, {"x": x, "pick": np.arange(8)[::-1].copy()})[0]
    assert ok.shape == (1, 32, 12, 12)
    with pytest.raises((KernelError, RuntimeError), match="bad_gather"):
        session.run(None, {"x": x, "pick": np.full(8, 99, np.int64)})


def test_branches_on_other_threads_keep_numpy_quiet():
    # every branch divides by zero and takes the log of negative numbers: ONNX semantics give
    # inf and nan, and no thread may warn (numpy's error state is per thread)
    nodes = [helper.make_node("Div", ["x", "zero"], [f"q{i}"], name=f"div{i}") for i in range(4)]
    nodes += [helper.make_node("Neg", [f"q{i}"], [f"n{i}"], name=f"neg{i}") for i in range(4)]
    nodes += [helper.make_node("Log", [f"n{i}"], [f"l{i}"], name=f"log{i}") for i in range(4)]
    nodes.append(helper.make_node("Concat", [f"l{i}" for i in range(4)], ["y"], axis=0))
    graph = helper.make_graph(
        nodes, "quiet", [helper.make_tensor_value_info("x", F, [64, 64])],
        [helper.make_tensor_value_info("y", F, [256, 64])],
        initializer=[numpy_helper.from_array(np.zeros((64, 64), np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = RuntimeSession(model, num_threads=2)
    assert session.branch_groups == 1
    x = RNG.standard_normal((64, 64)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(5):
            y = session.run(None, {"x": x})[0]
    assert np.isnan(y).any() and np.isinf(y).any()


def test_branches_option_is_checked():
    with pytest.raises(TypeError, match="branches must be True or False, got int"):
        RuntimeSession(_inception(), branches=1)


def test_branches_run_on_the_pool_they_are_given():
    model = _inception()
    session = RuntimeSession(model, num_threads=2)
    group = next(item for item in session._plan if isinstance(item, Branches))
    seen = []
    with ThreadPool(2) as pool:
        group.run(lambda branch: seen.append(tuple(step.node for step in branch)), pool)
    assert sorted(seen) == sorted(tuple(step.node for step in b) for b in group.branches)
