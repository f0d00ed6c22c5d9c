"""Tests for onnx_light.parallel (fast; no timing assertions)."""

import gc
import itertools
import os
import threading
import time
import traceback

import numpy as np
import pytest
import threadpoolctl
from forked import assert_child_succeeds

from onnx_light.parallel import BLAS, ThreadPool, get_pool


def record_blocks(pool: ThreadPool, n: int, **kwargs: object) -> list[tuple[int, int, int]]:
    """Run an instrumented region; return (start, stop, thread id) per block, sorted."""
    seen: list[tuple[int, int, int]] = []

    def fn(start: int, stop: int) -> None:
        seen.append((start, stop, threading.get_ident()))

    pool.parallel_for(n, fn, **kwargs)
    return sorted(seen)


def check_partition(blocks: list[tuple[int, int, int]], n: int, expected_count: int) -> None:
    assert len(blocks) == expected_count
    if n == 0:
        return
    assert blocks[0][0] == 0
    assert blocks[-1][1] == n
    for (_, stop, _), (start, _, _) in itertools.pairwise(blocks):
        assert stop == start  # contiguous, no overlap, no gap
    sizes = [stop - start for start, stop, _ in blocks]
    assert min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1  # near-equal


@pytest.fixture
def pool4():
    with ThreadPool(4) as pool:
        yield pool


@pytest.mark.parametrize("num_threads", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 10, 64, 1001])
def test_blocks_cover_range_once(num_threads: int, n: int) -> None:
    with ThreadPool(num_threads) as pool:
        blocks = record_blocks(pool, n)
    check_partition(blocks, n, min(num_threads, n))


def test_n_smaller_than_thread_count(pool4: ThreadPool) -> None:
    blocks = record_blocks(pool4, 3)
    check_partition(blocks, 3, 3)
    assert [(a, b) for a, b, _ in blocks] == [(0, 1), (1, 2), (2, 3)]


def test_n_zero_does_nothing(pool4: ThreadPool) -> None:
    assert record_blocks(pool4, 0) == []


def test_negative_n_rejected(pool4: ThreadPool) -> None:
    with pytest.raises(ValueError, match="n must be"):
        pool4.parallel_for(-1, lambda a, b: None)


def test_numpy_integer_n(pool4: ThreadPool) -> None:
    check_partition(record_blocks(pool4, np.int64(9)), 9, 4)


def test_max_blocks(pool4: ThreadPool) -> None:
    blocks = record_blocks(pool4, 100, max_blocks=2)
    assert [(a, b) for a, b, _ in blocks] == [(0, 50), (50, 100)]
    check_partition(record_blocks(pool4, 100, max_blocks=10), 100, 4)
    one = record_blocks(pool4, 100, max_blocks=1)
    assert one == [(0, 100, threading.get_ident())]
    for bad, exc in [(0, ValueError), (-2, ValueError), (True, TypeError), (2.0, TypeError)]:
        with pytest.raises(exc, match="max_blocks"):
            pool4.parallel_for(10, lambda a, b: None, max_blocks=bad)


def test_single_thread_runs_inline_on_caller() -> None:
    me = threading.get_ident()
    with ThreadPool(1) as pool:
        assert pool.num_threads == 1
        assert record_blocks(pool, 50) == [(0, 50, me)]


def test_single_block_runs_inline_on_caller(pool4: ThreadPool) -> None:
    assert record_blocks(pool4, 1) == [(0, 1, threading.get_ident())]


@pytest.mark.timeout(10)
def test_blocks_run_concurrently_on_distinct_threads() -> None:
    with ThreadPool(3) as pool:
        barrier = threading.Barrier(3, timeout=5)  # only passes if all 3 blocks run at once
        idents: dict[int, int] = {}

        def fn(start: int, stop: int) -> None:
            idents[start] = threading.get_ident()
            barrier.wait()

        pool.parallel_for(3, fn)
    assert len(set(idents.values())) == 3
    assert idents[0] == threading.get_ident()  # the caller runs block 0


def test_work_is_done(pool4: ThreadPool) -> None:
    x = np.arange(10_000, dtype=np.float32) - 5000
    out = np.empty_like(x)
    pool4.parallel_for(x.size, lambda a, b: np.abs(x[a:b], out=out[a:b]))
    np.testing.assert_array_equal(out, np.abs(x))


def boom(start: int, stop: int) -> None:
    raise ValueError(f"boom in block {start}")


@pytest.mark.parametrize("bad_start", [0, 2])  # 0 = caller's block, 2 = a worker's block
def test_exception_propagates_after_all_blocks(pool4: ThreadPool, bad_start: int) -> None:
    ran: list[int] = []

    def fn(start: int, stop: int) -> None:
        if start == bad_start:
            boom(start, stop)
        time.sleep(0.01)
        ran.append(start)

    with pytest.raises(ValueError, match=f"boom in block {bad_start}") as info:
        pool4.parallel_for(4, fn)
    assert sorted(ran) == sorted({0, 1, 2, 3} - {bad_start})  # the others all finished
    names = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "boom" in names  # original traceback kept
    # the pool stays usable
    check_partition(record_blocks(pool4, 10), 10, 4)


def test_every_block_raising(pool4: ThreadPool) -> None:
    with pytest.raises(ValueError, match="boom in block"):
        pool4.parallel_for(8, boom)
    check_partition(record_blocks(pool4, 8), 8, 4)


@pytest.mark.timeout(10)
def test_nested_calls_run_serially_inline() -> None:
    with ThreadPool(2) as pool:
        inner: list[tuple[int, int, int, int]] = []  # (outer start, start, stop, thread)

        def outer(start: int, stop: int) -> None:
            def inner_fn(a: int, b: int) -> None:
                inner.append((start, a, b, threading.get_ident()))

            me = threading.get_ident()
            pool.parallel_for(10, inner_fn)
            get_pool(3).parallel_for(10, inner_fn)  # nested in another pool: inline too
            assert all(t == me for s, _, _, t in inner if s == start)

        pool.parallel_for(2, outer)
    for outer_start in (0, 1):
        mine = [(a, b) for s, a, b, _ in inner if s == outer_start]
        assert mine == [(0, 5), (5, 10), (0, 4), (4, 7), (7, 10)]  # same blocks, in order


@pytest.mark.timeout(10)
def test_nested_exception_propagates(pool4: ThreadPool) -> None:
    def outer(start: int, stop: int) -> None:
        pool4.parallel_for(4, boom)

    with pytest.raises(ValueError, match="boom in block 0"):
        pool4.parallel_for(4, outer)
    check_partition(record_blocks(pool4, 4), 4, 4)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("num_threads", [2, 4])
def test_concurrent_callers(num_threads: int) -> None:
    pool = ThreadPool(num_threads)
    errors: list[BaseException] = []

    def caller(seed: int) -> None:
        try:
            for i in range(200):
                n = 1 + (seed * 31 + i * 7) % 50
                hits = np.zeros(n, dtype=np.int64)

                def fn(start: int, stop: int, hits: np.ndarray = hits) -> None:
                    hits[start:stop] += 1

                pool.parallel_for(n, fn)
                assert (hits == 1).all()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pool.close()
    assert not errors, errors


@pytest.mark.timeout(10)
def test_busy_pool_runs_second_caller_inline(pool4: ThreadPool) -> None:
    release = threading.Event()
    started = threading.Event()

    def slow(start: int, stop: int) -> None:
        if start == 0:
            started.set()
        release.wait(5)

    holder = threading.Thread(target=pool4.parallel_for, args=(4, slow))
    holder.start()
    try:
        assert started.wait(5)
        # The pool is busy: this call must not wait for it, and runs every block right here.
        blocks = record_blocks(pool4, 8)
        check_partition(blocks, 8, 4)
        assert {t for _, _, t in blocks} == {threading.get_ident()}
        assert holder.is_alive()
    finally:
        release.set()
        holder.join()


@pytest.mark.timeout(10)
def test_single_block_region_does_not_block_nesting(pool4: ThreadPool) -> None:
    inner: list[tuple[int, int, int]] = []

    def outer(start: int, stop: int) -> None:
        inner.extend(record_blocks(pool4, 8))

    pool4.parallel_for(1, outer)  # one block: inline, workers idle, so nesting may use them
    check_partition(sorted(inner), 8, 4)
    assert len({t for _, _, t in inner}) > 1


def test_get_pool_shares_pools() -> None:
    assert get_pool(2) is get_pool(2)
    assert get_pool(3) is not get_pool(2)
    assert get_pool(3).num_threads == 3
    check_partition(record_blocks(get_pool(2), 9), 9, 2)


def test_get_pool_replaces_closed_pool() -> None:
    old = get_pool(5)
    old.close()
    new = get_pool(5)
    assert new is not old
    check_partition(record_blocks(new, 9), 9, 5)


def _enter_blas_scope(num_threads: object) -> None:
    with BLAS.scope(num_threads):  # type: ignore[arg-type]
        pass


@pytest.mark.parametrize("factory", [ThreadPool, get_pool, _enter_blas_scope])
@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-1, ValueError), (True, TypeError),
                                      (1.5, TypeError), ("2", TypeError)])
def test_invalid_num_threads(factory, bad: object, exc: type) -> None:
    with pytest.raises(exc, match="num_threads"):
        factory(bad)


def _blas_thread_counts() -> list[int]:
    return [info["num_threads"] for info in threadpoolctl.threadpool_info()
            if info["user_api"] == "blas"]


def test_blas_scope_sets_and_restores() -> None:
    np.dot(np.ones((4, 4)), np.ones((4, 4)))  # make sure the BLAS library is loaded
    before = _blas_thread_counts()
    if not before:
        pytest.skip("no BLAS library visible to threadpoolctl")
    with BLAS.scope(1):
        assert _blas_thread_counts() == [1] * len(before)
        assert BLAS.get() == (1,) * len(before)
        with BLAS.scope(2):
            assert _blas_thread_counts() == [2] * len(before)
        assert _blas_thread_counts() == [1] * len(before)
    assert _blas_thread_counts() == before



def test_blas_limited_restores_on_errors_and_none_leaves_the_count() -> None:
    np.dot(np.ones((4, 4)), np.ones((4, 4)))
    before = _blas_thread_counts()
    if not before:
        pytest.skip("no BLAS library visible to threadpoolctl")
    with BLAS.scope(2):
        with BLAS.limited(None):
            assert _blas_thread_counts() == [2] * len(before)
        with pytest.raises(ZeroDivisionError), BLAS.limited(1):
            assert _blas_thread_counts() == [1] * len(before)
            1 / 0  # noqa: B018
        assert _blas_thread_counts() == [2] * len(before)
    assert _blas_thread_counts() == before

def workers_of(pool: ThreadPool) -> list[threading.Thread]:
    prefix = f"onnx_light-pool{pool.num_threads}-{id(pool):x}-"
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def test_close_idempotent_and_stops_workers() -> None:
    pool = ThreadPool(3)
    workers = workers_of(pool)
    assert len(workers) == 2
    assert all(t.daemon for t in workers)
    record_blocks(pool, 6)
    pool.close()
    pool.close()
    assert not any(t.is_alive() for t in workers)  # close joins the workers
    with pytest.raises(RuntimeError, match="closed"):
        pool.parallel_for(6, lambda a, b: None)
    with pytest.raises(RuntimeError, match="closed"):
        pool.parallel_for(0, lambda a, b: None)
    assert "closed" in repr(pool)


def test_context_manager_closes() -> None:
    with ThreadPool(2) as pool:
        record_blocks(pool, 4)
    with pytest.raises(RuntimeError, match="closed"):
        pool.parallel_for(4, lambda a, b: None)


@pytest.mark.timeout(10)
def test_close_inside_own_region_refused(pool4: ThreadPool) -> None:
    def fn(start: int, stop: int) -> None:
        pool4.close()

    with pytest.raises(RuntimeError, match="inside"):
        pool4.parallel_for(4, fn)
    check_partition(record_blocks(pool4, 4), 4, 4)


@pytest.mark.timeout(10)
def test_garbage_collected_pool_stops_workers() -> None:
    pool = ThreadPool(3)
    record_blocks(pool, 3)
    workers = workers_of(pool)
    assert len(workers) == 2
    del pool
    gc.collect()
    for t in workers:
        t.join(timeout=5)
        assert not t.is_alive()


@pytest.mark.timeout(10)
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12+: fork with threads
def test_pool_works_in_forked_child() -> None:
    pool = get_pool(2)
    record_blocks(pool, 2)  # workers running before the fork
    pid = os.fork()
    if pid == 0:  # child: workers did not survive the fork and must be restarted
        code = 1
        try:
            blocks = record_blocks(pool, 10)
            if [(a, b) for a, b, _ in blocks] == [(0, 5), (5, 10)] and len(
                {t for _, _, t in blocks}
            ) == 2:
                code = 0
        finally:
            os._exit(code)
    assert_child_succeeds(pid)


def test_a_lone_openblas_is_limited_through_its_own_functions() -> None:
    from onnx_light.parallel import BlasThreads, _raw_openblas

    np.dot(np.ones((4, 4)), np.ones((4, 4)))
    numpy_blas = [lib for lib in threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers
                  if lib.internal_api == "openblas" and lib.threading_layer != "openmp"
                  and "numpy" in lib.filepath]
    if not numpy_blas:
        pytest.skip("numpy does not use a pthreads OpenBLAS here")
    (lib,) = numpy_blas
    blas = BlasThreads()
    blas._libraries, blas._raw = (lib,), _raw_openblas((lib,))  # as _controllers makes them for it alone
    assert blas._raw is not None
    before = lib.get_num_threads()
    target = 1 if before != 1 else 2
    previous = blas.limit(target)
    try:
        assert previous is not None and previous.previous == (before,)
        assert lib.get_num_threads() == target
        assert blas.limit(target) is None  # nothing to change
    finally:
        blas.restore(previous)
    assert lib.get_num_threads() == before
    assert _raw_openblas((lib, lib)) is None  # two libraries: threadpoolctl's calls
# ---------------------------------------------------------------- chunked regions


def record_chunks(pool: ThreadPool, n: int, chunks: int) -> list[tuple[int, int, int]]:
    seen: list[tuple[int, int, int]] = []
    pool.parallel_chunks(n, lambda start, stop: seen.append((start, stop, threading.get_ident())), chunks)
    return sorted(seen)


@pytest.mark.parametrize("num_threads", [1, 2, 4])
@pytest.mark.parametrize(("n", "chunks"), [(0, 3), (1, 4), (5, 2), (7, 7), (10, 4), (1001, 8), (3, 9)])
def test_chunks_are_parallel_for_blocks_run_once(num_threads: int, n: int, chunks: int) -> None:
    with ThreadPool(num_threads) as pool:
        got = [(a, b) for a, b, _ in record_chunks(pool, n, chunks)]
        check_partition([(a, b, 0) for a, b in got], n, min(n, chunks))
        # parallel_for's blocks of the same count: the same values either way
        assert got == sorted((a, b) for a, b in _block_list(n, min(n, chunks)))


def _block_list(n: int, count: int) -> list[tuple[int, int]]:
    with ThreadPool(count or 1) as pool:
        seen: list[tuple[int, int]] = []
        if n:
            pool.parallel_for(n, lambda a, b: seen.append((a, b)), max_blocks=count)
        return seen


def test_a_worker_that_never_wakes_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller claims every chunk itself and returns without waiting for the worker."""
    from onnx_light import parallel

    with ThreadPool(2) as pool:
        with monkeypatch.context() as patch:
            patch.setattr(parallel._Core, "wake_workers", lambda self, count: None)
            seen: list[tuple[int, int, int]] = []
            thread = threading.Thread(target=lambda: seen.extend(record_chunks(pool, 12, 4)))
            thread.start()
            thread.join(5)
            assert not thread.is_alive()
        check_partition(seen, 12, 4)
        assert {t for _, _, t in seen} == {thread.ident}
        check_partition(record_blocks(pool, 10), 10, 2)  # the worker still answers


def test_a_busy_pool_runs_a_second_callers_chunks_inline() -> None:
    with ThreadPool(2) as pool:
        started, release = threading.Event(), threading.Event()

        def busy(start: int, stop: int) -> None:
            if start == 1:
                started.set()
                release.wait(5)

        thread = threading.Thread(target=pool.parallel_for, args=(2, busy))
        thread.start()
        started.wait(5)
        seen = record_chunks(pool, 8, 4)
        release.set()
        thread.join(5)
        check_partition(seen, 8, 4)
        assert {t for _, _, t in seen} == {threading.get_ident()}


def test_chunk_errors_propagate_after_all_chunks() -> None:
    with ThreadPool(2) as pool:
        ran: list[int] = []

        def fn(start: int, stop: int) -> None:
            ran.append(start)
            if start == 3:
                raise ValueError("chunk 3")

        with pytest.raises(ValueError, match="chunk 3"):
            pool.parallel_chunks(10, fn, 10)
        assert sorted(ran) == list(range(10))
        check_partition(record_chunks(pool, 10, 5), 10, 5)  # usable afterwards


def test_static_and_chunked_regions_interleave_and_close() -> None:
    pool = ThreadPool(3)
    x = np.arange(30_000, dtype=np.float64)
    out = np.empty_like(x)
    for round_ in range(200):  # late wake-ups of chunked regions meet the next regions
        if round_ % 2:
            pool.parallel_chunks(x.size, lambda a, b: np.negative(x[a:b], out=out[a:b]), 5)
        else:
            pool.parallel_for(x.size, lambda a, b: np.negative(x[a:b], out=out[a:b]), max_blocks=2)
        np.testing.assert_array_equal(out, -x)
        out[:] = 0
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.parallel_chunks(4, lambda a, b: None, 2)


def test_nested_chunked_region_runs_inline() -> None:
    with ThreadPool(2) as pool:
        inner: list[tuple[int, int]] = []

        def outer(start: int, stop: int) -> None:
            pool.parallel_chunks(4, lambda a, b, s=start: inner.append((s, threading.get_ident())), 2)

        pool.parallel_for(2, outer)
        assert len(inner) == 4


@pytest.mark.parametrize("chunks", [0, -1, 1.5, True])
def test_invalid_chunks(chunks: object) -> None:
    with ThreadPool(2) as pool, pytest.raises(ValueError, match="chunks"):
        pool.parallel_chunks(4, lambda a, b: None, chunks)  # type: ignore[arg-type]


def test_blas_limits_ending_out_of_order_restore_the_first_count() -> None:
    """Overlapping limits (two sessions in two threads) may end in any order: the count in
    force is the latest one still held, and the last to end restores what the first found."""
    from onnx_light.parallel import BlasThreads

    blas = BlasThreads()
    before = blas.get()
    if not before or before[0] is None or before[0] < 2 or blas.per_thread:
        pytest.skip("needs a process-wide BLAS library running more than one thread")
    first = blas.limit(1)
    second = blas.limit(3)
    assert first is not None and second is not None
    try:
        blas.restore(first)
        assert blas.get() == (3,) * len(before)
    finally:
        blas.restore(second)
    assert blas.get() == before
    inner = blas.limit(1)
    nested = blas.limit(3)
    blas.restore(nested)
    assert blas.get() == (1,) * len(before)  # nested in the same thread: back to the outer limit
    blas.restore(inner)
    assert blas.get() == before
