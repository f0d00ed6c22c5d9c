"""Intra-op thread pool: a persistent set of worker threads behind a ``parallel_for`` entry.

Kernels split an index range into contiguous blocks and run them on the pool; numpy releases
the GIL inside its loops, so blocks that are numpy calls on disjoint slices run truly in
parallel. The per-call dispatch cost sets the size below which a kernel should stay serial, so
the hot path is kept to a handful of raw lock operations:

* ``ThreadPool(k)`` starts ``k - 1`` daemon workers; the calling thread takes one block itself.
* Each worker sleeps on its own raw ``threading.Lock`` (released by the caller to wake it).
  The caller publishes the task, wakes only as many workers as there are extra blocks, runs
  block 0, then waits on a single "done" lock that the last worker to finish releases (a
  countdown). No ``concurrent.futures``, no per-call ``Queue``/``Event``/``Condition``: the
  Event and Condition variants measured about 1.2-1.6x slower. Spinning (polling with
  ``time.sleep(0)`` / ``os.sched_yield``) was slower still under the GIL, so threads block.
  What remains is dominated by the OS waking a sleeping thread (see docs/parallel.md).
* Inside :meth:`ThreadPool.hot` (a session's run) the threads wait for each other by spinning
  first, without the GIL, in a compiled loop (:mod:`.kernels.spin`) on a shared counter, for a
  bounded time, and stop as soon as they find themselves preempted; the locks stay the only
  synchronisation. Outside it nothing spins.
* A call made while the calling thread is already executing a block of a multi-block region
  (of any pool) runs its blocks serially inline: no deadlock and no oversubscription.
* Concurrent callers: a region holds the pool's region lock, taken with a non-blocking
  acquire. A second Python thread that finds the pool busy does not wait; it runs all of its
  blocks serially inline on its own thread. Results are the same either way; this avoids
  queueing one session behind another and can never deadlock.
* :data:`BLAS` reads and sets the thread count of the BLAS library inside numpy cheaply
  (``threadpoolctl.threadpool_limits`` costs 0.4-1 ms per use here; a cached controller's
  library handles cost about 1 us to read and 12 us to change and restore). Sessions hold
  one BLAS thread around a run; a kernel that wants BLAS's own threads raises it for its
  call and restores it.

Block boundaries depend only on ``(n, num_threads, max_blocks)``, never on which thread runs
them, so a kernel gives the same results whether a region runs in parallel or inline.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
from threadpoolctl import ThreadpoolController

__all__ = ["BLAS", "BlasHold", "BlasLimit", "BlasThreads", "Team", "TeamLoop", "TeamSlots", "ThreadPool",
           "current_team", "get_pool", "in_region"]

#: A compiled spin loop (``kernels.spin.spin_while``'s dispatcher), its cycle counter's rate
#: (cycles per second) and the compiled loop that keeps a processor awake
#: (``kernels.spin.keep_awake``), which :meth:`ThreadPool.hot` is given.
SpinLoop = tuple[Callable[..., int], float, Callable[..., None]]


class TeamSlots(NamedTuple):
    """Where a native team's shared state (an int64 array of ``size``) keeps what this layer
    reads and writes: the regions published, the scopes in force (the workers spin only while
    it is above 0), whether the workers are to return, the cycles a worker spins without a
    region before it sleeps, the longest gap between two of a thread's reads of the cycle
    counter before it counts itself preempted and sleeps, and the cycles a region's caller
    spins for the tasks the workers still run before it sleeps. The layout is the compiled
    loops' (``kernels.team``), handed over with them."""

    size: int
    regions: int
    active: int
    stop: int
    limit: int
    gap: int
    wait: int


class TeamLoop(NamedTuple):
    """A native team's compiled loops (``kernels.team.team_loop()``), which
    :meth:`ThreadPool.hot` is given: the worker's loop ``worker(state, system)``,
    ``wake(state, system)`` (wakes the workers asleep), libc's ``syscall`` address, the cycle
    counter's rate and the state's layout."""

    worker: Callable[..., None]
    wake: Callable[..., None]
    system: int
    rate: float
    slots: TeamSlots


#: How long a team region's caller, done with its tasks, spins for the workers' last ones before
#: it sleeps (a task is about 11 us of work: a longer wait means a worker lost its processor).
_TEAM_WAIT_US = 100.0

_STOP = object()  # task sentinel telling workers to exit
# The shared counters a hot pool's threads spin on (int64 slots of _Core.flags): regions
# published, hot scopes in force (0 or 1), regions whose last block finished while the caller
# waited, scopes keeping the processors awake in force (0 or 1).
_GENERATION, _HOT, _FINISHED, _AWAKE = 0, 1, 2, 3

#: A spinning thread that finds this many microseconds between two of its reads was preempted
#: by another task: it stops spinning and sleeps, so that on a busy machine the pool behaves
#: as one that never spins.
_PREEMPTED_US = 20.0
#: A spinning worker that sees a region keeps spinning this many microseconds before it takes
#: the GIL, which the caller holds until its own block enters compiled code: taken earlier,
#: the worker would sleep on the GIL and cost a wake-up.
_SETTLE_US = 4.0


class _Local(threading.local):
    # The _Core whose region this thread is currently executing a block of (None outside).
    # Worker threads keep their own pool's core here for their whole life.
    active: _Core | None = None
    # The native team of the hot scope this thread is in (None outside one).
    team: Team | None = None


_tls = _Local()


class Team:
    """A pool's native team: ``num_threads - 1`` threads that live in compiled code
    (``kernels.team.team_worker``): while a scope of :meth:`ThreadPool.hot` with a team is in
    force they spin on the shared ``state`` and run the tasks of the regions that compiled
    kernels publish (``kernels.team.team_region``); otherwise they sleep on a futex. A kernel
    finds the team of the scope its thread is in with :func:`current_team`."""

    __slots__ = ("broken", "entered", "error", "scopes", "slots", "state", "system", "threads", "used",
                 "wake")

    def __init__(self, loop: TeamLoop, count: int, label: str) -> None:
        worker, self.wake, self.system, self.slots = loop.worker, loop.wake, loop.system, loop.slots
        self.state = np.zeros(self.slots.size, np.int64)
        self.scopes = 0  # scopes in force, under the core's hot_lock
        self.broken = False  # a worker's loop failed (or this is a forked child's copy)
        self.error: BaseException | None = None  # what it failed with
        # The region count when the scopes in force began, and whether the last scopes saw a
        # region: a session whose runs publish none (no kernel of its uses the team) leaves
        # the workers asleep at the start of the next run rather than spinning for nothing.
        self.entered = 0
        self.used = True
        self.threads = [threading.Thread(target=self._main, args=(worker,), name=f"{label}-team{i}",
                                         daemon=True) for i in range(count)]
        for thread in self.threads:
            thread.start()

    def _main(self, worker: Callable[..., None]) -> None:
        try:
            worker(self.state, self.system)
        except BaseException as exc:  # kept: the kernels fall back to their other parallel path
            self.error = exc
            self.broken = True

    def stop(self, join: bool) -> None:
        """Make the workers return (they may be asleep or spinning)."""
        self.state[self.slots.stop] = 1
        self.wake(self.state, self.system)
        if join:
            for thread in self.threads:
                thread.join()


def current_team() -> Team | None:
    """The native team of the hot scope the calling thread is in, None outside one (or where
    its workers failed): a compiled kernel that finds one publishes its region there instead
    of opening a numba ``prange`` region."""
    team = _tls.team
    return None if team is None or team.broken else team


class _Core:
    """State shared between a pool and its workers (kept apart so workers do not pin the pool)."""

    __slots__ = ("awake", "awake_running", "awake_tail", "awake_threads", "awake_wake",
                 "count_lock", "done", "flags", "gap", "hot", "hot_lock", "limit", "remaining",
                 "settle", "spin", "stopped", "task", "team", "threads", "wake", "woken")

    def __init__(self, num_workers: int) -> None:
        self.task: object = None
        self.remaining = 0
        self.count_lock = threading.Lock()
        self.done = threading.Lock()
        self.done.acquire()
        self.wake = [threading.Lock() for _ in range(num_workers)]
        for lock in self.wake:
            lock.acquire()
        # whether worker i has a wake-up it has not taken yet (a chunked region may end
        # before its workers wake: the next region must not release their locks again)
        self.woken = [False] * num_workers
        self.threads: list[threading.Thread] = []
        self.flags = np.zeros(4, np.int64)  # read by spinning threads without the GIL
        self.hot = 0  # hot scopes in force (ThreadPool.hot), under hot_lock
        self.hot_lock = threading.Lock()
        self.spin: Callable[..., int] | None = None  # kernels.spin.spin_while, once loaded
        self.limit = 0  # cycles a thread spins before it sleeps
        self.gap = 0  # cycles between two reads that mean the spinning thread was preempted
        self.settle = 0  # cycles a worker that saw a region waits before it takes the GIL
        # Keeping the processors awake (ThreadPool.hot's awake_us), under hot_lock: scopes in
        # force, the idle-priority spinners (started on first use), their wake locks, whether
        # each is spinning, the cycles each spins on after the last scope ends.
        self.awake = 0
        self.awake_threads: list[threading.Thread] = []
        self.awake_wake: list[threading.Lock] = []
        self.awake_running: list[bool] = []
        self.awake_tail = 0
        self.team: Team | None = None  # started by the first hot scope given a team loop
        self.stopped = False

    def wake_workers(self, count: int) -> None:
        """Wake the first ``count`` workers (those not woken already) for the published task:
        release their locks, then count the region for the workers that spin (which take a
        released lock when they see the count change)."""
        woken, wake = self.woken, self.wake
        for i in range(count):
            if not woken[i]:
                woken[i] = True
                wake[i].release()
        self.flags[_GENERATION] += 1

    def await_region(self, wake: threading.Lock) -> None:
        """Take a worker's wake-up: while the pool is hot, spin for up to :attr:`limit` cycles
        until a region is published and this worker's lock released, then sleep on it."""
        flags, spin = self.flags, self.spin
        if spin is None or not flags[_HOT]:
            wake.acquire()
            return
        # The count read before the lock is tried: a region published in between changes it.
        seen = int(flags[_GENERATION])
        while not wake.acquire(False):
            current = spin(flags, _GENERATION, seen, _HOT, self.limit, self.gap, self.settle)
            if current == seen:  # no region within the limit, or the run is over
                wake.acquire()
                return
            seen = current

    def finish(self, lock: threading.Lock) -> None:
        """Count a region finished and release the lock its caller waits on."""
        self.flags[_FINISHED] += 1
        lock.release()

    def await_finish(self, lock: threading.Lock, finished: int) -> None:
        """The caller's wait for its region's last block (``finished``: the count before the
        region): spinning, without the GIL, while the pool is hot, then on the lock. An
        interruption (KeyboardInterrupt) is raised only once the lock is taken, so that no
        late release can leak into the next region."""
        spin, flags = self.spin, self.flags
        interrupted: BaseException | None = None
        if spin is not None and flags[_HOT]:
            try:
                spin(flags, _FINISHED, finished, _HOT, self.limit, self.gap, 0)
            except BaseException as exc:
                interrupted = exc
        while True:
            try:
                lock.acquire()
                break
            except BaseException as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted


def _awake_main(core: _Core, index: int, keep: Callable[..., None]) -> None:
    """An idle-priority spinner: while a hot scope keeps the processors awake (and for
    ``core.awake_tail`` cycles after), it busy-waits so that its processor does not halt; any
    other thread that wakes up there preempts it at once (``SCHED_IDLE``)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # never spin at a normal priority (the thread stays
        return  # marked as running, so no scope wakes it again)
    wake, flags = core.awake_wake[index], core.flags
    while True:
        wake.acquire()
        while True:
            if not core.stopped:
                keep(flags, _AWAKE, core.awake_tail)
            with core.hot_lock:
                if flags[_AWAKE] and not core.stopped:
                    continue
                core.awake_running[index] = False
                if core.stopped:
                    return
                break


def _start_awake(core: _Core, count: int, keep: Callable[..., None]) -> None:
    """Start ``count`` spinners of :func:`_awake_main` (under ``core.hot_lock``), asleep."""
    for i in range(count):
        lock = threading.Lock()
        lock.acquire()
        core.awake_wake.append(lock)
        core.awake_running.append(False)
        thread = threading.Thread(target=_awake_main, args=(core, i, keep),
                                  name=f"{core.threads[0].name}-awake{i}", daemon=True)
        thread.start()
        core.awake_threads.append(thread)


class _Chunks:
    """A chunked region: contiguous chunks that whichever thread is free claims in order."""

    __slots__ = ("bounds", "claimed", "core", "done", "errors", "finished", "fn", "lock", "waiting")

    def __init__(self, core: _Core, fn: Callable[[int, int], None], bounds: list[int]) -> None:
        self.core = core
        self.fn = fn
        self.bounds = bounds
        self.claimed = itertools.count()  # next() is atomic under the GIL
        self.errors: list[BaseException] = []
        self.finished = 0
        self.lock = threading.Lock()
        self.done = threading.Lock()
        self.done.acquire()
        self.waiting = False  # the caller waits for chunks that workers still run

    def run(self) -> None:
        """Claim and run chunks until none is left; the thread finishing the last chunk wakes
        a waiting caller."""
        fn, bounds = self.fn, self.bounds
        count = len(bounds) - 1
        while (i := next(self.claimed)) < count:
            try:
                fn(bounds[i], bounds[i + 1])
            except BaseException as exc:  # re-raised in the caller
                self.errors.append(exc)
            with self.lock:
                self.finished += 1
                last = self.finished == count and self.waiting
            if last:
                self.core.finish(self.done)

    def wait(self, finished: int) -> None:
        """Return once every chunk is finished (the caller claims no more); ``finished``: the
        core's count of finished regions before this one."""
        count = len(self.bounds) - 1
        with self.lock:
            if self.finished == count:
                return
            self.waiting = True
        self.core.await_finish(self.done, finished)


def _worker_main(core: _Core, index: int) -> None:
    """Worker loop: sleep on our wake lock, run block ``index + 1`` of the published task."""
    _tls.active = core
    wake = core.wake[index]
    count_lock = core.count_lock
    while True:
        core.await_region(wake)
        core.woken[index] = False  # before reading the task: a region published later wakes us
        task = core.task
        if task is _STOP:
            return
        if task is None or type(task) is _Chunks:  # a region that may be over already
            if task is not None:
                task.run()
            del task
            continue
        fn, bounds, errors = task
        if index + 2 >= len(bounds):  # a late wake-up: this region needs fewer workers
            del task, fn, bounds, errors
            continue
        try:
            fn(bounds[index + 1], bounds[index + 2])
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)
        # Drop references before sleeping so a finished region's arrays can be freed.
        del task, fn, bounds, errors
        with count_lock:
            core.remaining -= 1
            last = core.remaining == 0
        if last:
            core.finish(core.done)


def _start_core(num_workers: int, label: str) -> _Core:
    core = _Core(num_workers)
    for i in range(num_workers):
        thread = threading.Thread(
            target=_worker_main, args=(core, i), name=f"{label}-worker{i}", daemon=True
        )
        thread.start()
        core.threads.append(thread)
    return core


def _stop_core(core: _Core, join: bool) -> None:
    core.task = _STOP
    core.wake_workers(len(core.wake))
    with core.hot_lock:
        core.stopped = True
        if core.team is not None:
            core.team.stop(join)
        core.flags[_AWAKE] = 0
        for i, running in enumerate(core.awake_running):
            if not running:
                core.awake_running[i] = True
                core.awake_wake[i].release()
    if join:
        me = threading.current_thread()
        for thread in core.threads:
            if thread is not me:
                thread.join()


def _check_num_threads(num_threads: object, name: str = "num_threads") -> int:
    if isinstance(num_threads, bool) or not isinstance(num_threads, int):
        raise TypeError(f"{name} must be an int >= 1, got {num_threads!r}")
    if num_threads < 1:
        raise ValueError(f"{name} must be >= 1, got {num_threads}")
    return num_threads


def _block_bounds(n: int, blocks: int) -> list[int]:
    """Boundaries of ``blocks`` contiguous near-equal blocks of range(n) (first ones larger)."""
    q, r = divmod(n, blocks)
    return [i * q + (i if i < r else r) for i in range(blocks + 1)]


def _run_inline(fn: Callable[[int, int], None], bounds: list[int]) -> None:
    """Run every block in order on this thread, marking it as inside a region."""
    prev = _tls.active
    if prev is None:
        _tls.active = _INLINE
    try:
        for i in range(len(bounds) - 1):
            fn(bounds[i], bounds[i + 1])
    finally:
        _tls.active = prev


_INLINE = _Core(0)  # marker for "inside a region that runs inline" (never has workers)

_all_pools: weakref.WeakSet[ThreadPool] = weakref.WeakSet()


class ThreadPool:
    """A fixed set of ``num_threads - 1`` daemon workers plus the calling thread.

    Use :meth:`parallel_for` to run ``fn(start, stop)`` over contiguous blocks of a range.
    Pools are meant to live long (see :func:`get_pool`); :meth:`close` or leaving a ``with``
    block stops the workers, and so does garbage collection of the pool.
    """

    def __init__(self, num_threads: int) -> None:
        self._num_threads = _check_num_threads(num_threads)
        self._closed = False
        self._region_lock = threading.Lock()
        self._core: _Core | None = None
        self._finalizer: weakref.finalize | None = None
        if self._num_threads > 1:
            self._start()
        _all_pools.add(self)

    def _start(self) -> None:
        label = f"onnx_light-pool{self._num_threads}-{id(self):x}"
        self._core = _start_core(self._num_threads - 1, label)
        self._finalizer = weakref.finalize(self, _stop_core, self._core, False)
        self._finalizer.atexit = False

    @property
    def num_threads(self) -> int:
        """Total threads used by a region, the calling thread included."""
        return self._num_threads

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"ThreadPool(num_threads={self._num_threads}) [{state}]"

    def parallel_for(
        self, n: int, fn: Callable[[int, int], None], *, max_blocks: int | None = None
    ) -> None:
        """Call ``fn(start, stop)`` for contiguous near-equal blocks covering ``range(n)``.

        The number of blocks is ``min(num_threads, max_blocks or num_threads, n)``. The caller
        runs block 0 itself and returns once every block is done. If blocks raise, the first
        exception raised (in time) is re-raised here, with its traceback, after all blocks
        have finished. ``n == 0`` does nothing; a single block runs inline with no handoff.
        A call made from inside a block of a running region, or while another thread holds
        this pool, runs the same blocks serially inline on the calling thread (an exception
        then stops the remaining blocks).
        """
        if self._closed:
            raise RuntimeError("parallel_for called on a closed ThreadPool")
        if type(n) is not int:
            n = operator.index(n)
        blocks = self._num_threads
        if max_blocks is not None:
            if isinstance(max_blocks, bool) or not isinstance(max_blocks, int):
                raise TypeError(f"max_blocks must be an int >= 1 or None, got {max_blocks!r}")
            if max_blocks < 1:
                raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
            if max_blocks < blocks:
                blocks = max_blocks
        if n <= blocks:
            if n <= 0:
                if n == 0:
                    return
                raise ValueError(f"n must be >= 0, got {n}")
            blocks = n
        if blocks == 1:
            fn(0, n)
            return
        bounds = _block_bounds(n, blocks)
        region_lock = self._region_lock
        if _tls.active is not None or not region_lock.acquire(False):
            _run_inline(fn, bounds)
            return
        try:
            if self._closed:  # closed while we were getting here
                raise RuntimeError("parallel_for called on a closed ThreadPool")
            core = self._core
            if core is None:  # first use in a forked child: restart the workers
                self._start()
                core = self._core
            errors = self._run_region(core, fn, bounds, blocks)
        finally:
            region_lock.release()
        if errors:
            err = errors[0]
            try:
                raise err
            finally:
                del err, errors

    @staticmethod
    def _run_region(
        core: _Core, fn: Callable[[int, int], None], bounds: list[int], blocks: int
    ) -> list[BaseException]:
        errors: list[BaseException] = []
        core.remaining = blocks - 1
        core.task = (fn, bounds, errors)
        finished = int(core.flags[_FINISHED])
        core.wake_workers(blocks - 1)
        _tls.active = core
        try:
            fn(bounds[0], bounds[1])
        except BaseException as exc:
            errors.append(exc)
        finally:
            _tls.active = None
        # Wait for the workers even if interrupted (KeyboardInterrupt): leaving early would let
        # a late "done" release leak into the next region.
        try:
            core.await_finish(core.done, finished)
        finally:
            core.task = None
        return errors

    def parallel_chunks(self, n: int, fn: Callable[[int, int], None], chunks: int) -> None:
        """Call ``fn(start, stop)`` for ``chunks`` contiguous near-equal chunks of ``range(n)``
        (at most ``n``), each run once by whichever thread claims it first, in order.

        The chunks are those of :meth:`parallel_for` with ``max_blocks=chunks``, so a kernel
        computes the same values either way; what changes is who runs them. The caller
        starts on the first chunk at once and the workers join when they wake: a worker that
        wakes late (its processor busy with another program) takes fewer chunks, none if the
        others finished them, and the caller does not wait for a worker that claimed none.
        Errors, nesting and concurrent callers behave as in :meth:`parallel_for`.
        """
        if self._closed:
            raise RuntimeError("parallel_chunks called on a closed ThreadPool")
        n = operator.index(n)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunks must be an int >= 1, got {chunks!r}")
        chunks = min(chunks, n)
        if chunks == 0:
            return
        if chunks == 1:
            fn(0, n)
            return
        bounds = _block_bounds(n, chunks)
        if self._num_threads == 1:
            _run_inline(fn, bounds)
            return
        region_lock = self._region_lock
        if _tls.active is not None or not region_lock.acquire(False):
            _run_inline(fn, bounds)
            return
        try:
            if self._closed:
                raise RuntimeError("parallel_chunks called on a closed ThreadPool")
            core = self._core
            if core is None:  # first use in a forked child: restart the workers
                self._start()
                core = self._core
            region = _Chunks(core, fn, bounds)
            core.task = region
            finished = int(core.flags[_FINISHED])
            core.wake_workers(min(self._num_threads, chunks) - 1)
            _tls.active = core
            try:
                region.run()
            finally:
                _tls.active = None
            try:  # as in _run_region: never leave with a chunk still running
                region.wait(finished)
            finally:
                core.task = None
        finally:
            region_lock.release()
        errors = region.errors
        if errors:
            err = errors[0]
            try:
                raise err
            finally:
                del err, errors

    def hot(self, spin_us: float, loop: SpinLoop | None, awake_us: float = 0.0,
            team: TeamLoop | None = None, team_us: float = 0.0) -> _HotScope:
        """A block (``with pool.hot(spin_us, loop, awake_us):``, around a whole session run) in
        which threads that wait for a region, or for a region's last block, spin for up to
        ``spin_us`` microseconds before they sleep: a woken thread costs 20-100 us on a
        virtual machine whose idle processor halts (docs/parallel.md).

        With ``awake_us > 0``, one idle-priority thread per worker (``SCHED_IDLE``) spins for
        the whole block and ``awake_us`` microseconds after it, so that no processor halts
        between regions, the pool's or numba's OpenMP regions alike; a thread woken on its
        processor preempts it at once, and on a busy machine it gets next to no processor
        time. Scopes may overlap (sessions in several threads); when the last one ends every
        spinning thread stops (the idle-priority ones after ``awake_us``) and sleeps.

        ``loop`` is the compiled loops and the cycle counter's rate (the kernel library's
        ``kernels.spin.spin_loop()``: this layer compiles nothing). Nothing spins with
        ``spin_us`` and ``awake_us`` both at most 0, in a one-thread pool or without a loop;
        nothing keeps the processors awake where threads cannot take the idle priority
        (``os.SCHED_IDLE`` is Linux's).

        With ``team`` (``kernels.team.team_loop()``) and ``team_us > 0``, the pool's native
        :class:`Team` (started on first use) spins for the block: its threads wait for the
        regions of compiled kernels in compiled code, each time for at most ``team_us``
        microseconds without a region, and sleep as soon as they find themselves preempted
        (:data:`_PREEMPTED_US`) or the last such block ends; :func:`current_team` returns it
        to the calling thread inside the block."""
        return _HotScope(self, spin_us, loop, awake_us, team, team_us)

    def close(self) -> None:
        """Stop the workers (waiting for a running region first). Idempotent."""
        if self._closed:
            return
        if self._core is not None and _tls.active is self._core:
            raise RuntimeError("cannot close a ThreadPool from inside one of its own regions")
        with self._region_lock:
            if self._closed:
                return
            self._closed = True
            core, self._core = self._core, None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            if core is not None:
                _stop_core(core, join=True)

    def __enter__(self) -> ThreadPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _HotScope:
    """The block of :meth:`ThreadPool.hot` (a class: a session enters one per run)."""

    __slots__ = ("_awake", "_awake_us", "_core", "_hot", "_loop", "_pool", "_previous", "_spin_us",
                 "_team", "_team_loop", "_team_us")

    def __init__(self, pool: ThreadPool, spin_us: float, loop: SpinLoop | None,
                 awake_us: float, team: TeamLoop | None = None, team_us: float = 0.0) -> None:
        self._pool, self._spin_us, self._loop, self._awake_us = pool, spin_us, loop, awake_us
        self._team_loop, self._team_us = team, team_us
        self._core: _Core | None = None
        self._hot = self._awake = False
        self._team: Team | None = None
        self._previous: Team | None = None

    def __enter__(self) -> None:
        core = self._pool._core
        if core is None:
            return
        spinning = self._loop is not None and (self._spin_us > 0 or self._awake_us > 0)
        teamed = self._team_loop is not None and self._team_us > 0
        if not (spinning or teamed):
            return
        hot = spinning and self._spin_us > 0
        awake = spinning and self._awake_us > 0 and hasattr(os, "SCHED_IDLE")
        team = None
        with core.hot_lock:
            if core.stopped:
                return
            if hot:
                spin, rate, _ = self._loop
                core.spin = spin
                core.limit = int(self._spin_us * 1e-6 * rate)
                core.gap = int(_PREEMPTED_US * 1e-6 * rate)
                core.settle = int(_SETTLE_US * 1e-6 * rate)
                core.hot += 1
                core.flags[_HOT] = 1
            if awake:
                if not core.awake_threads:
                    _start_awake(core, len(core.wake), self._loop[2])
                core.awake_tail = int(self._awake_us * 1e-6 * self._loop[1])
                core.awake += 1
                core.flags[_AWAKE] = 1
                for i, running in enumerate(core.awake_running):
                    if not running:
                        core.awake_running[i] = True
                        core.awake_wake[i].release()
            if teamed:
                team = _enter_team(core, self._team_loop, self._team_us)
        self._core, self._hot, self._awake, self._team = core, hot, awake, team
        if team is not None:
            self._previous, _tls.team = _tls.team, team

    def __exit__(self, *exc_info: object) -> None:
        core, self._core = self._core, None
        if core is None:
            return
        team, self._team = self._team, None
        if team is not None:
            _tls.team, self._previous = self._previous, None
        with core.hot_lock:
            if self._hot:
                core.hot -= 1
                if core.hot == 0:
                    core.flags[_HOT] = 0
            if self._awake:
                core.awake -= 1
                if core.awake == 0:
                    core.flags[_AWAKE] = 0
            if team is not None:
                team.scopes -= 1
                slots = team.slots
                team.state[slots.active] = team.scopes  # at 0 the spinning workers sleep
                if team.scopes == 0:
                    team.used = int(team.state[slots.regions]) != team.entered


def _enter_team(core: _Core, loop: TeamLoop, team_us: float) -> Team | None:
    """Count a scope in force for the core's team (started now if it has none; under
    ``core.hot_lock``) and wake its workers to spin; None where it failed."""
    team = core.team
    if team is None:
        team = core.team = Team(loop, len(core.wake), core.threads[0].name.rsplit("-", 1)[0])
    if team.broken:
        return None
    rate, state, slots = loop.rate, team.state, team.slots
    state[slots.limit] = int(team_us * 1e-6 * rate)
    state[slots.gap] = int(_PREEMPTED_US * 1e-6 * rate)
    state[slots.wait] = int(_TEAM_WAIT_US * 1e-6 * rate)
    team.scopes += 1
    state[slots.active] = team.scopes
    if team.scopes == 1:
        if team.used:  # the workers spin from now on (else from the first region)
            team.wake(state, team.system)
        team.entered = int(state[slots.regions])
    return team


_pools: dict[int, ThreadPool] = {}
_pools_lock = threading.Lock()


def get_pool(num_threads: int) -> ThreadPool:
    """Return the process-wide pool with ``num_threads`` threads, creating it on first use.

    Sessions with the same thread count share one set of workers instead of each starting
    their own. A cached pool that was closed is replaced by a fresh one.
    """
    pool = _pools.get(num_threads) if type(num_threads) is int else None
    if pool is not None and not pool._closed:
        return pool
    num_threads = _check_num_threads(num_threads)
    with _pools_lock:
        pool = _pools.get(num_threads)
        if pool is None or pool._closed:
            pool = _pools[num_threads] = ThreadPool(num_threads)
        return pool


def _after_fork_in_child() -> None:
    """Worker threads do not survive fork: give every pool fresh locks, restart lazily."""
    global _pools_lock
    _pools_lock = threading.Lock()
    for pool in list(_all_pools):
        pool._region_lock = threading.Lock()
        if pool._core is not None and pool._core.team is not None:
            pool._core.team.broken = True  # its threads are gone: the kernels' other path
        if pool._finalizer is not None:
            pool._finalizer.detach()
            pool._finalizer = None
        pool._core = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class BlasHold:
    """One limit in force, returned by :meth:`BlasThreads.limit` for its :meth:`~BlasThreads.restore`."""

    __slots__ = ("counts", "previous")

    def __init__(self, counts: tuple[int | None, ...], previous: tuple[int | None, ...]) -> None:
        self.counts = counts  # what this limit set
        self.previous = previous  # what it found (restored by a per-thread BLAS)


class BlasThreads:
    """The thread count of the BLAS libraries numpy uses, read and changed cheaply.

    Builds one ``threadpoolctl.ThreadpoolController`` on first use and keeps its BLAS library
    controllers. :meth:`limit` changes the count only when it differs and returns what to
    pass to :meth:`restore`. With no BLAS library found every method does nothing.

    A process-wide count (OpenBLAS with pthreads) is shared by every thread, so limits that
    overlap in time (two sessions running in two threads) are kept in a list under a lock
    rather than each restoring what it found: while limits are in force the count is that of
    the latest one still in force, and when the last one ends the count found by the first is
    put back, whatever order they end in. A per-thread count (an OpenMP BLAS) is each
    thread's own, and each limit restores what it found.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._libraries: tuple[Any, ...] | None = None
        self._per_thread = False
        # (get, set) of a single process-wide OpenBLAS, called directly: a run limits and
        # restores the count around every call, and threadpoolctl's wrappers cost microseconds.
        self._raw: tuple[Callable[[], int], Callable[[int], Any]] | None = None
        self._held_lock = threading.Lock()
        self._held: list[BlasHold] = []  # process-wide limits in force, oldest first
        self._saved: tuple[int | None, ...] = ()  # the counts found by the oldest of them

    def _controllers(self) -> tuple[Any, ...]:
        libraries = self._libraries
        if libraries is None:
            with self._lock:
                if self._libraries is None:
                    found = tuple(ThreadpoolController().select(user_api="blas").lib_controllers)
                    self._per_thread = any(getattr(lib, "threading_layer", "") == "openmp"
                                           for lib in found)
                    self._raw = _raw_openblas(found)
                    self._libraries = found
                libraries = self._libraries
        return libraries

    @property
    def per_thread(self) -> bool:
        """True when the limit applies to the calling thread only (OpenMP-threaded BLAS)."""
        self._controllers()
        return self._per_thread

    def get(self) -> tuple[int | None, ...]:
        """The current thread count of each BLAS library."""
        raw = self._raw
        if raw is not None:
            return (raw[0](),)
        return tuple(lib.get_num_threads() for lib in self._controllers())

    def _set(self, counts: Sequence[int | None]) -> None:
        raw = self._raw
        if raw is not None and counts[0] is not None:
            raw[1](counts[0])
            return
        for lib, count in zip(self._controllers(), counts, strict=True):
            if count is not None:
                lib.set_num_threads(count)
                # threadpoolctl >= 3.7 makes the first thread that sets an OpenBLAS limit its
                # only owner; give ownership back so other threads' limits keep working.
                release = getattr(type(lib), "clear_controlling_thread", None)
                if release is not None:
                    release()

    def limit(self, num_threads: int) -> BlasHold | None:
        """Set every BLAS library to ``num_threads`` if one differs: a hold to pass to
        :meth:`restore`, or None when nothing changed (and nothing is to be restored)."""
        if self._libraries is None:
            self._controllers()
        raw = self._raw
        if raw is not None:  # the usual case, kept short: it runs around every product
            if raw[0]() == num_threads:
                return None
        elif all(count == num_threads or count is None for count in self.get()):
            return None
        if self._per_thread:
            previous = self.get()
            hold = BlasHold((num_threads,) * len(previous), previous)
            self._set(hold.counts)
            return hold
        with self._held_lock:
            current = self.get()
            hold = BlasHold((num_threads,) * len(current), current)
            if not self._held:
                self._saved = current
            self._held.append(hold)
            self._set(hold.counts)
        return hold

    def restore(self, hold: BlasHold | None) -> None:
        """End a limit of :meth:`limit` (nothing when it changed nothing)."""
        if hold is None:
            return
        if self._per_thread:
            self._set(hold.previous)
            return
        with self._held_lock:
            held = self._held
            held.remove(hold)
            counts = held[-1].counts if held else self._saved
            if self.get() != counts:
                self._set(counts)

    def scope(self, num_threads: int) -> BlasLimit:
        """Hold ``num_threads`` BLAS threads inside the block: for a runtime, around a whole run."""
        return BlasLimit(self, _check_num_threads(num_threads))

    def limited(self, num_threads: int | None) -> BlasLimit | contextlib.nullcontext[None]:
        """:meth:`scope` for kernels: ``with BLAS.limited(n):`` holds ``n`` BLAS threads inside
        the block (None leaves the count alone), without validating ``n`` on every call."""
        return _UNCHANGED if num_threads is None else BlasLimit(self, num_threads)


def _raw_openblas(libraries: Sequence[Any]) -> tuple[Callable[[], int], Callable[[int], Any]] | None:
    """OpenBLAS's own get and set functions when it is the only BLAS library and keeps one
    process-wide pool (no OpenMP layer); None otherwise (threadpoolctl's calls are used)."""
    if len(libraries) != 1:
        return None
    (lib,) = libraries
    symbol = getattr(lib, "_get_symbol", None)
    if (getattr(lib, "internal_api", "") != "openblas" or getattr(lib, "threading_layer", "") == "openmp"
            or symbol is None):
        return None
    get, set_ = symbol("openblas_get_num_threads"), symbol("openblas_set_num_threads")
    return None if get is None or set_ is None else (get, set_)


class BlasLimit:
    """The block of :meth:`BlasThreads.scope` and :meth:`~BlasThreads.limited`: :meth:`limit`
    on entry, :meth:`restore` on exit (a class, not a generator: kernels enter one per block)."""

    __slots__ = ("_blas", "_hold", "_num_threads")

    def __init__(self, blas: BlasThreads, num_threads: int) -> None:
        self._blas = blas
        self._num_threads = num_threads
        self._hold: BlasHold | None = None

    def __enter__(self) -> None:
        self._hold = self._blas.limit(self._num_threads)

    def __exit__(self, *exc_info: object) -> None:
        self._blas.restore(self._hold)


_UNCHANGED = contextlib.nullcontext()  # reusable: it holds no state
BLAS = BlasThreads()


def in_region() -> bool:
    """Whether the calling thread is running a block of a parallel region (a pool's worker,
    or a caller inside ``parallel_for``): code there must not start threads of its own."""
    return _tls.active is not None
