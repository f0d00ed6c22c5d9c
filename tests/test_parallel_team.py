"""The native team (kernels/team.py, ThreadPool.hot's team): regions whose tasks the caller and
spinning workers run in compiled code."""

import os
import time
from unittest import mock

import numpy as np
import onnx
import pytest
from forked import assert_child_succeeds
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from test_parallel_hot import run_concurrently

from onnx_light.kernels import packed_gemm, team
from onnx_light.kernels.compiled_elementwise import numba_threads
from onnx_light.kernels.spin import claim, cycles, cycles_per_second, pause
from onnx_light.kernels.team import add, carray, int64_pointer, load, task_function, team_loop
from onnx_light.parallel import ThreadPool, current_team, get_pool
from onnx_light.runtime import RuntimeSession

LOOP = team_loop()
TEAM_POOL = get_pool(2)
pytestmark = pytest.mark.skipif(LOOP is None, reason="no native team here")


@task_function
def count_task(arguments: int, task: int) -> None:
    """Adds 1 to ``counts[task]`` (arguments: the address of counts, their number)."""
    values = carray(int64_pointer(arguments), 2)
    claim(carray(int64_pointer(values[0]), values[1]), task)


@task_function
def meeting_task(arguments: int, task: int) -> None:
    """The first task to start waits (at most ``values[1]`` cycles) for a second one to start;
    if it does, ``met[1]`` counts it: two tasks ran at once, on two threads."""
    values = carray(int64_pointer(arguments), 2)
    met = carray(int64_pointer(values[0]), 2)
    if add(met, 0, 1) != 0:
        return
    start = cycles()
    while load(met, 0) < 2 and cycles() - start < values[1]:
        pause()
    if load(met, 0) >= 2:
        add(met, 1, 1)


def count_region(state: np.ndarray, tasks: int) -> np.ndarray:
    """Runs a region of ``tasks`` counting tasks on the team of ``state``: the counts."""
    counts = np.zeros(max(tasks, 1), np.int64)
    arguments = np.array([counts.ctypes.data, counts.size], np.int64)
    team.team_region(state, LOOP.system, count_task.address, arguments.ctypes.data, tasks)
    return counts[:tasks]


def team_cpu(pool: ThreadPool) -> float:
    return sum(time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
               for thread in pool._core.team.threads)


@pytest.mark.parametrize("num_threads", [2, 3])
@pytest.mark.parametrize("team_us", [20.0, 5000.0])
def test_every_task_runs_exactly_once(num_threads: int, team_us: float) -> None:
    """Back to back and after pauses longer than the spin (the workers asleep on the futex)."""
    with ThreadPool(num_threads) as pool, pool.hot(0.0, None, 0.0, LOOP, team_us):
        found = current_team()
        assert found is not None and len(found.threads) == num_threads - 1
        for round_ in range(400):
            tasks = (0, 1, 2, 3, 7, 64, 1000)[round_ % 7]
            np.testing.assert_array_equal(count_region(found.state, tasks), np.ones(tasks, np.int64))
            if round_ % 50 == 0:
                time.sleep(0.002)
        assert found.state[found.slots.active] == 1
    assert current_team() is None
    assert found.state[found.slots.active] == 0


def test_a_worker_runs_tasks_beside_the_caller() -> None:
    """Some region has two of its tasks running at once (a worker took one); a loaded machine
    may take the worker's processor for a while, hence many tries."""
    met = np.zeros(2, np.int64)
    arguments = np.array([met.ctypes.data, int(cycles_per_second() * 2e-3)], np.int64)
    with ThreadPool(2) as pool, pool.hot(0.0, None, 0.0, LOOP, 5000.0):
        state = current_team().state
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            met[:] = 0
            team.team_region(state, LOOP.system, meeting_task.address, arguments.ctypes.data, 2)
            if met[1]:
                break
    assert met[1] == 1


def test_no_team_thread_spins_after_the_scope() -> None:
    with ThreadPool(2) as pool:
        with pool.hot(0.0, None, 0.0, LOOP, 200_000.0):
            for _ in range(10):
                count_region(current_team().state, 4)
        time.sleep(0.005)  # a spinning worker reads the scope count within microseconds
        before = team_cpu(pool)
        time.sleep(0.1)
        assert team_cpu(pool) - before < 0.005
        threads = pool._core.team.threads
    for thread in threads:  # closing the pool ends them
        thread.join(5)
        assert not thread.is_alive()


def test_no_team_without_workers_a_loop_or_a_scope() -> None:
    assert current_team() is None
    with ThreadPool(1) as pool, pool.hot(0.0, None, 0.0, LOOP, 1000.0):
        assert current_team() is None
    with ThreadPool(2) as pool:
        with pool.hot(0.0, None, 0.0, None, 1000.0), pool.hot(0.0, None, 0.0, LOOP, 0.0):
            assert current_team() is None
        with pool.hot(0.0, None, 0.0, LOOP, 1000.0):
            outer = current_team()
            with pool.hot(0.0, None, 0.0, LOOP, 1000.0):  # nested: the same team, counted twice
                assert current_team() is outer and outer.state[outer.slots.active] == 2
            assert current_team() is outer and outer.state[outer.slots.active] == 1
        assert current_team() is None


def failing_worker(state: np.ndarray, system: int) -> None:
    raise RuntimeError("no team here")


def test_a_failed_worker_leaves_no_team() -> None:
    loop = LOOP._replace(worker=failing_worker)
    with ThreadPool(2) as pool:
        with pool.hot(0.0, None, 0.0, loop, 1000.0):
            found = pool._core.team
            found.threads[0].join(5)
            assert found.broken and isinstance(found.error, RuntimeError)
            assert current_team() is None
            # a region published on it anyway (before the failure was seen) runs on the caller
            np.testing.assert_array_equal(count_region(found.state, 9), np.ones(9, np.int64))
        with pool.hot(0.0, None, 0.0, loop, 1000.0):
            assert current_team() is None


def test_concurrent_callers_share_one_team() -> None:
    """Two Python threads in scopes of one pool: a caller that finds the team taken runs its
    tasks itself; every region counts each task once."""
    pool = ThreadPool(2)

    def caller(seed: int) -> None:
        with pool.hot(0.0, None, 0.0, LOOP, 1000.0):
            state = current_team().state
            for round_ in range(300):
                tasks = 1 + (seed + round_) % 40
                np.testing.assert_array_equal(count_region(state, tasks), np.ones(tasks, np.int64))

    run_concurrently(caller, range(2), 60)
    pool.close()


needs_packed = pytest.mark.skipif(not packed_gemm.available(), reason="packed products need AVX2+FMA")


@needs_packed
@pytest.mark.parametrize(("m", "k", "n"), [(1, 7, 3), (6, 16, 16), (7, 33, 70), (64, 256, 256),
                                           (200, 64, 1000), (1300, 600, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_products_on_the_team_give_the_serial_bits(m: int, k: int, n: int, bias: bool) -> None:
    rng = np.random.default_rng(m * k + n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed = packed_gemm.PackedWeights(w, rng.standard_normal(n).astype(np.float32) if bias else None)
    packed.block = max(packed.rows, packed.block // 3 // packed.rows * packed.rows)  # several blocks
    packed.compile(threads=2)
    a = rng.standard_normal((2, m, k)).astype(np.float32)
    serial = packed.multiply(a)
    assert numba_threads(2)
    assert np.array_equal(packed.multiply(a, threads=2), serial)  # outside a scope: numba's region
    with ThreadPool(2) as pool, pool.hot(0.0, None, 0.0, LOOP, 1000.0):
        for _ in range(20):
            assert np.array_equal(packed.multiply(a, threads=2), serial)
        out = np.full((2, m, n), np.nan, np.float32)
        assert packed.multiply(a, out, threads=2) is out
        assert np.array_equal(out, serial)


@needs_packed
@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 300), k=st.integers(1, 300), n=st.integers(1, 300), block=st.integers(1, 8),
       group=st.integers(0, 4))
def test_packed_products_on_the_team_give_the_serial_bits_at_any_shape(m: int, k: int, n: int, block: int,
                                                                         group: int) -> None:
    """Any shape, blocks of rows and panels per task (``TASK_WORK`` from 2^16 to 2^20)."""
    rng = np.random.default_rng(m + 301 * k + 90601 * n)
    packed = packed_gemm.PackedWeights(rng.standard_normal((k, n)).astype(np.float32),
                                       rng.standard_normal(n).astype(np.float32))
    packed.block = packed.rows * block
    a = rng.standard_normal((m, k)).astype(np.float32)
    serial = packed.multiply(a)
    scope = TEAM_POOL.hot(0.0, None, 0.0, LOOP, 1000.0)
    with mock.patch.object(packed_gemm, "TASK_WORK", 1 << (16 + group)), scope:
        assert np.array_equal(packed.multiply(a, threads=2), serial)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork with threads
def test_forked_child_has_no_team_until_it_starts_one() -> None:
    pool = get_pool(2)
    with pool.hot(0.0, None, 0.0, LOOP, 1000.0):
        count_region(current_team().state, 4)
        pid = os.fork()
        if pid == 0:  # child: the inherited team has no threads
            code = 1
            try:
                if current_team() is None:
                    pool.parallel_for(2, lambda start, stop: None)  # a fresh core
                    with pool.hot(0.0, None, 0.0, LOOP, 1000.0):
                        fresh = current_team()
                        if fresh is not None and all(
                                (count_region(fresh.state, 30) == 1).all() for _ in range(20)):
                            code = 0
            finally:
                os._exit(code)
    assert_child_succeeds(pid)


def product_model(k: int = 256, n: int = 256) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((k, n)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@needs_packed
def test_sessions_in_two_threads_give_one_threads_bits_and_leave_nothing_spinning() -> None:
    """Two 2-thread sessions run at once in two Python threads (sharing the pool and its team)
    give the one-thread session's outputs, and no team thread spins after their runs."""
    model = product_model()
    x = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)
    expected = RuntimeSession(model, num_threads=1).run(None, {"x": x})[0]
    sessions = [RuntimeSession(model, num_threads=2) for _ in range(2)]  # 2^25: split

    def run(session: RuntimeSession) -> None:
        for _ in range(30):
            assert np.array_equal(session.run(None, {"x": x})[0], expected)

    run_concurrently(run, sessions, 60)
    pool = sessions[0]._pool
    found = pool._core.team
    assert found.state[found.slots.active] == 0
    assert found.state[found.slots.regions] > 0  # regions were published on the team
    time.sleep(0.005)
    before = team_cpu(pool)
    time.sleep(0.1)
    assert team_cpu(pool) - before < 0.005


def test_a_team_left_unused_by_a_run_sleeps_through_the_next() -> None:
    """A scope that published no region leaves the workers asleep at the next one's start (a
    session whose kernels do not use the team); a region wakes them and marks the team used."""
    with ThreadPool(2) as pool:
        with pool.hot(0.0, None, 0.0, LOOP, 200_000.0):
            found = current_team()
        assert not found.used
        with pool.hot(0.0, None, 0.0, LOOP, 200_000.0):
            time.sleep(0.005)
            before = team_cpu(pool)
            time.sleep(0.05)
            assert team_cpu(pool) - before < 0.005
            np.testing.assert_array_equal(count_region(found.state, 5), np.ones(5, np.int64))
        assert found.used


def test_closing_pools_ends_their_team_threads() -> None:
    """Pools closed right after a scope (workers spinning, going to sleep or asleep) end their
    team threads."""
    threads = []
    for round_ in range(30):
        with ThreadPool(2) as pool:
            with pool.hot(0.0, None, 0.0, LOOP, 50.0 * (1 + round_ % 3)):
                if round_ % 2:
                    count_region(current_team().state, 3)
            threads += pool._core.team.threads
    for thread in threads:
        thread.join(5)
    assert not any(thread.is_alive() for thread in threads)
