"""ThreadPool.hot: regions whose threads spin between regions while a run is in progress."""

import os
import threading
import time

import numpy as np
import onnx
import pytest
from forked import assert_child_succeeds
from onnx import TensorProto, helper, numpy_helper

from onnx_light import parallel
from onnx_light.kernels.spin import spin_loop
from onnx_light.parallel import ThreadPool, get_pool
from onnx_light.runtime import RuntimeSession

LOOP = spin_loop()
pytestmark = pytest.mark.skipif(LOOP is None, reason="nothing can spin here")


def thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds ``thread`` has used."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def workers_cpu(pool: ThreadPool) -> float:
    return sum(thread_cpu(thread) for thread in pool._core.threads)


def hot_flag(pool: ThreadPool) -> int:
    return int(pool._core.flags[parallel._HOT])


@pytest.mark.parametrize("num_threads", [2, 3])
@pytest.mark.parametrize("spin_us", [20.0, 5000.0])
def test_hot_regions_run_every_block_once(num_threads: int, spin_us: float) -> None:
    """Static and chunked regions, back to back and after pauses longer than the spin, compute
    what a serial loop does (a short spin makes threads fall asleep between regions)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(4099)
    with ThreadPool(num_threads) as pool, pool.hot(spin_us, LOOP):
        assert hot_flag(pool) == 1
        for round_ in range(300):
            y = np.full_like(x, np.nan)

            def block(start: int, stop: int, y: np.ndarray = y) -> None:
                np.multiply(x[start:stop], 2.0, out=y[start:stop])

            if round_ % 2:
                pool.parallel_chunks(x.size, block, 2 + round_ % 5)
            else:
                pool.parallel_for(x.size, block, max_blocks=1 + round_ % num_threads)
            np.testing.assert_array_equal(y, 2.0 * x)
            if round_ % 50 == 0:
                time.sleep(0.002)


def test_hot_region_errors_propagate() -> None:
    def fail(start: int, stop: int) -> None:
        if start > 0:
            raise ValueError(f"block {start}")

    with ThreadPool(2) as pool, pool.hot(1000.0, LOOP):
        for _ in range(20):
            with pytest.raises(ValueError, match="block"):
                pool.parallel_for(10, fail)
            with pytest.raises(ValueError, match="block"):
                pool.parallel_chunks(10, fail, 4)
        seen: list[int] = []
        pool.parallel_for(10, lambda start, stop: seen.append(start))
        assert sorted(seen) == [0, 5]


def test_overlapping_scopes_keep_the_pool_hot_until_the_last_ends() -> None:
    with ThreadPool(2) as pool:
        first, second = pool.hot(100.0, LOOP), pool.hot(100.0, LOOP)
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)
        assert hot_flag(pool) == 1
        second.__exit__(None, None, None)
        assert hot_flag(pool) == 0
        with pool.hot(0.0, LOOP):  # no spin asked for
            assert hot_flag(pool) == 0
    with ThreadPool(1) as pool, pool.hot(100.0, LOOP):  # no workers
        pool.parallel_for(4, lambda start, stop: None)


def test_no_thread_spins_after_the_scope() -> None:
    """After a hot scope whose spin would last 200 ms, the workers use no processor time."""
    with ThreadPool(2) as pool:
        with pool.hot(200_000.0, LOOP):
            for _ in range(10):
                pool.parallel_for(2, lambda start, stop: None)
        assert hot_flag(pool) == 0
        time.sleep(0.005)  # a spinning worker sees the flag within microseconds
        before = workers_cpu(pool)
        time.sleep(0.1)
        assert workers_cpu(pool) - before < 0.005


def awake_cpu(pool: ThreadPool) -> float:
    return sum(thread_cpu(thread) for thread in pool._core.awake_threads)


needs_idle_priority = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="needs SCHED_IDLE")


@needs_idle_priority
@pytest.mark.parametrize("num_threads", [2, 3])
def test_awake_scope_spins_at_idle_priority_and_stops_after_it(num_threads: int) -> None:
    """One idle-priority spinner per worker, busy during the scope, asleep soon after it."""
    with ThreadPool(num_threads) as pool:
        x = np.arange(1000.0)
        y = np.empty_like(x)
        with pool.hot(0.0, LOOP, awake_us=100.0):
            assert int(pool._core.flags[parallel._AWAKE]) == 1
            assert hot_flag(pool) == 0  # no spin asked of the pool's own threads
            threads = pool._core.awake_threads
            assert len(threads) == num_threads - 1
            assert all(pool._core.awake_running)
            for _ in range(50):
                pool.parallel_chunks(x.size, lambda a, b: np.negative(x[a:b], out=y[a:b]), 4)
                np.testing.assert_array_equal(y, -x)
            # at the idle priority a spinner may wait long on a busy machine: allow seconds
            deadline = time.monotonic() + 10.0
            while awake_cpu(pool) < 0.001 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert awake_cpu(pool) >= 0.001
            assert all(os.sched_getscheduler(thread.native_id) == os.SCHED_IDLE for thread in threads)
        assert int(pool._core.flags[parallel._AWAKE]) == 0
        deadline = time.monotonic() + 10.0  # a preempted spinner stops as soon as it runs
        while any(pool._core.awake_running) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(pool._core.awake_running)
        before = awake_cpu(pool)
        time.sleep(0.1)
        assert awake_cpu(pool) - before < 0.005
        with pool.hot(0.0, LOOP, awake_us=100.0):  # the same spinners, woken again
            assert pool._core.awake_threads == threads
        core = pool._core
    for thread in core.awake_threads:  # closing the pool ends them
        thread.join(5)
        assert not thread.is_alive()


@needs_idle_priority
def test_overlapping_awake_scopes_keep_spinning_until_the_last_ends() -> None:
    with ThreadPool(2) as pool:
        first, second = pool.hot(0.0, LOOP, 50.0), pool.hot(100.0, LOOP, 50.0)
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)
        assert int(pool._core.flags[parallel._AWAKE]) == 1
        second.__exit__(None, None, None)
        assert int(pool._core.flags[parallel._AWAKE]) == 0
        assert hot_flag(pool) == 0
    with ThreadPool(1) as pool, pool.hot(0.0, LOOP, 100.0):  # no workers, nothing to keep awake
        pool.parallel_for(4, lambda start, stop: None)


def test_concurrent_hot_callers() -> None:
    """Two threads running hot regions on one pool: each gets its own blocks' results."""
    pool = ThreadPool(2)

    def caller(seed: int) -> None:
        x = np.random.default_rng(seed).standard_normal(1000)
        with pool.hot(500.0, LOOP):
            for _ in range(200):
                y = np.empty_like(x)
                pool.parallel_chunks(x.size, lambda a, b, y=y: np.negative(x[a:b], out=y[a:b]), 4)
                np.testing.assert_array_equal(y, -x)

    run_concurrently(caller, range(2), 30)
    pool.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork with threads
def test_hot_pool_works_in_forked_child() -> None:
    pool = get_pool(2)
    with pool.hot(1000.0, LOOP):
        pool.parallel_for(2, lambda start, stop: None)
        pid = os.fork()
        if pid == 0:  # child: a fresh core, cold until a scope of its own
            code = 1
            try:
                with pool.hot(1000.0, LOOP):
                    seen: list[int] = []
                    for _ in range(20):
                        pool.parallel_chunks(10, lambda start, stop: seen.append(start), 2)
                    if sorted(set(seen)) == [0, 5] and len(seen) == 40:
                        code = 0
            finally:
                os._exit(code)
    assert_child_succeeds(pid)


def test_a_session_run_leaves_nothing_spinning() -> None:
    """A two-thread session's run makes its pool hot and leaves it cold."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    session = RuntimeSession(model, num_threads=2)
    session.spin_us = 200_000.0
    session.awake_us = 100.0
    x = np.ones((64, 64), np.float32)
    session.run(None, {"x": x})
    pool = session._pool
    assert hot_flag(pool) == 0
    assert int(pool._core.flags[parallel._AWAKE]) == 0
    team = pool._core.team  # None where no kernel loaded numba
    assert team is None or int(team.state[team.slots.active]) == 0  # the native team's scope too
    everyone = [*pool._core.threads, *pool._core.awake_threads, *(team.threads if team else ())]
    time.sleep(0.005)
    before = sum(map(thread_cpu, everyone))
    time.sleep(0.1)
    assert sum(map(thread_cpu, everyone)) - before < 0.005


def run_concurrently(function, arguments, timeout: float) -> None:
    """``function(argument)`` in one Python thread per argument, all at once; each thread's
    exception is raised here, and every thread has ended within ``timeout`` seconds."""
    errors: list[BaseException] = []

    def guarded(argument) -> None:
        try:
            function(argument)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(argument,)) for argument in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if errors:
        raise errors[0]
    assert not any(thread.is_alive() for thread in threads)
