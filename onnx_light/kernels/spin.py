"""Bounded busy-waiting in compiled code, for the intra-op pool's hot regions (docs/parallel.md).

On a virtual machine whose idle processor halts at once, waking a thread that sleeps on a
lock costs 20-60 us, more than half of a 64x256x256 product. While a session runs, the pool's
workers and its caller therefore wait for each other by reading a shared counter in a loop,
for a bounded time, before they sleep on their locks. The loop is compiled and ``nogil``, so
a waiting thread leaves the GIL to the thread it waits for. It reads the counter with an
atomic acquire load (the compiler cannot hoist it out of the loop), pauses between reads
(``pause`` on x86, which lets the other hyperthread run and saves power) and bounds the wait
by the processor's cycle counter (:func:`cycles_per_second` converts microseconds).
"""

from __future__ import annotations

import functools
import time
from types import ModuleType
from typing import Any

import numpy as np

from .compiled import CompiledIntrinsic, compiled, load_numba

__all__ = ["claim", "cycles", "cycles_per_second", "end_of_tasks", "keep_awake", "pause", "spin_loop",
           "spin_while"]


@functools.cache
def _build(numba: ModuleType) -> dict[str, Any]:
    """The intrinsics ``load_acquire(flags, index)``, ``claim(counter, index)`` (``counter[index]``
    before adding 1 to it, one sequentially consistent atomic read-modify-write: threads
    sharing a counter each get another value), ``pause()`` and ``cycles()``."""
    from llvmlite import binding, ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    x86 = binding.get_process_triple().startswith(("x86_64", "i386", "i686"))

    @intrinsic
    def load_acquire(typingctx: Any, flags: Any, index: Any) -> Any:
        if not isinstance(flags, types.Array) or flags.dtype != types.int64:
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            array = context.make_array(signature.args[0])(context, builder, args[0])
            return builder.load_atomic(builder.gep(array.data, [args[1]]), "acquire", 8)
        return types.int64(flags, types.intp), codegen

    @intrinsic
    def claim(typingctx: Any, counter: Any, index: Any) -> Any:
        if not isinstance(counter, types.Array) or counter.dtype != types.int64:
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            array = context.make_array(signature.args[0])(context, builder, args[0])
            return builder.atomic_rmw("add", builder.gep(array.data, [args[1]]),
                                      ir.Constant(ir.IntType(64), 1), "seq_cst")
        return types.int64(counter, types.intp), codegen

    @intrinsic
    def pause(typingctx: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            if x86:
                function = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
                builder.call(function, [])
            return context.get_dummy_value()
        return types.void(), codegen

    @intrinsic
    def cycles(typingctx: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            function = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.IntType(64), []), "llvm.readcyclecounter")
            return builder.call(function, [])
        return types.int64(), codegen

    return {"load_acquire": load_acquire, "claim": claim, "pause": pause, "cycles": cycles}


_load_acquire = CompiledIntrinsic(lambda numba: _build(numba)["load_acquire"], "load_acquire")
#: ``claim(counter, index)`` in a compiled kernel: the next task for the calling thread.
claim = CompiledIntrinsic(lambda numba: _build(numba)["claim"], "claim")
#: ``pause()`` and ``cycles()`` in a compiled kernel: a spin-wait hint and the cycle counter.
pause = _pause = CompiledIntrinsic(lambda numba: _build(numba)["pause"], "pause")
cycles = _cycles = CompiledIntrinsic(lambda numba: _build(numba)["cycles"], "cycles")


@compiled
def spin_while(flags: np.ndarray, index: int, value: int, hot: int, limit: int, gap: int,
               settle: int) -> int:
    """Wait while ``flags[index] == value`` and ``flags[hot] != 0``, for at most ``limit``
    cycles, and only while no two reads of the counter are more than ``gap`` cycles apart
    (a longer gap: the thread lost its processor to another task, and spinning would only
    take it again from the busy machine); the value of ``flags[index]`` last read (``value``
    when the wait ended otherwise). A changed value is returned ``settle`` cycles after it
    was seen (time for the thread that changed it to leave the GIL)."""
    start = last = _cycles()
    while True:
        current = _load_acquire(flags, index)
        now = _cycles()
        if current != value:
            while _cycles() - now < settle:
                _pause()
            return current
        if _load_acquire(flags, hot) == 0 or now - start > limit or now - last > gap:
            return current
        last = now
        _pause()


@compiled
def keep_awake(flags: np.ndarray, awake: int, tail: int) -> None:
    """Busy-wait while ``flags[awake] != 0`` and for ``tail`` cycles after it drops to 0
    (spinning on as soon as it rises again): what keeps a processor from halting while a
    session runs (:meth:`onnx_light.parallel.ThreadPool.hot`)."""
    last = _cycles()
    while True:
        now = _cycles()
        if _load_acquire(flags, awake) != 0:
            last = now
        elif now - last > tail:
            return
        _pause()


@compiled
def end_of_tasks(state: np.ndarray, thread: int, threads: int, wait: tuple[int, int]) -> None:
    """The end of a region whose ``threads`` threads claim their tasks from ``state[0]``:
    each other thread counts itself done in ``state[1]``; thread 0, the one that started the
    region, waits for them by reading that counter rather than asleep at the region's end
    (waking it costs tens of microseconds), for at most ``wait[0]`` cycles and only while no
    two reads are more than ``wait[1]`` apart (a longer gap: it lost its processor, the
    machine is busy)."""
    if thread != 0:
        claim(state, 1)
        return
    start = last = _cycles()
    while _load_acquire(state, 1) < threads - 1:
        now = _cycles()
        if now - start > wait[0] or now - last > wait[1]:
            return
        last = now
        _pause()


@compiled
def _read_cycles() -> int:
    return _cycles()


@functools.cache
def cycles_per_second() -> float:
    """The cycle counter's rate, measured once against ``time.perf_counter`` over 5 ms; 0.0
    where numba does not load or the counter does not advance (then nothing spins)."""
    try:
        load_numba()
        read = _read_cycles.dispatcher
        read()
    except ImportError:
        return 0.0
    started, first = time.perf_counter(), read()
    time.sleep(0.005)
    rate = (read() - first) / (time.perf_counter() - started)
    return rate if rate > 1e6 else 0.0


@functools.cache
def spin_loop() -> tuple[Any, float, Any] | None:
    """What :meth:`onnx_light.parallel.ThreadPool.hot` spins with: the compiled
    :func:`spin_while`, the cycle counter's rate and the compiled :func:`keep_awake`, or None
    where nothing can spin. Both loops are compiled (or loaded from the disk cache) here, so
    that a thread spinning for the first time does not compile for tens of milliseconds."""
    rate = cycles_per_second()
    if rate <= 0:
        return None
    spin, keep = spin_while.dispatcher, keep_awake.dispatcher
    flags = np.zeros(2, np.int64)
    spin(flags, 0, 1, 1, 0, 0, 0)  # returns at once: flags[0] != 1
    keep(flags, 1, 0)  # returns at once: flags[1] == 0
    return spin, rate, keep
