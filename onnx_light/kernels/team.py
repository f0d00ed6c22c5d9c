"""A native team: worker threads that wait for a parallel region in compiled code and run
their share of it there, without returning to Python (docs/parallel.md, "The native team").

A numba ``prange`` region on this machine's OpenMP layer (passive waits) costs 62-81 us when
the machine is quiet, because its sleeping worker sits on a processor that halts at once, and
the pool's workers return to Python (the GIL) for their blocks. While a session runs, a team
worker instead spins on a shared region counter in a ``nogil`` compiled loop (an atomic load,
``pause``, bounded by the cycle counter) and calls the region's task function itself, a
C-callable function (numba's ``cfunc``) whose address the region publishes with an int64 block
of arguments. A worker that finds itself preempted (more than the gap between two reads of the
cycle counter), that has spun its bound, or whose scope ended sleeps on a futex instead, so
that a loaded machine gets a pool that sleeps, and no thread spins after a run.

The shared state is an int64 array laid out here; the layer above
(:class:`onnx_light.parallel.Team`) creates it and writes the scopes in force, the stop flag and
the spins' bounds where :func:`team_loop`'s :class:`~onnx_light.parallel.TeamSlots` say. A region
(:func:`team_region`, called by a compiled kernel with its task function's address):

1. takes the team (a compare-and-swap on :data:`BUSY`; a caller that finds it taken, by a
   session in another Python thread, runs every task itself);
2. writes the task function and the arguments' address, then one word :data:`NEXT` that holds
   the region's number, its task count and the next task to claim, then the region's number
   in :data:`GENERATION` (a sequentially consistent store), and wakes the sleeping workers;
3. claims tasks like the workers do, one compare-and-swap of :data:`NEXT` each: a worker that
   read an older region's number claims nothing from this one, so a late worker never runs a
   task twice or with another region's arguments;
4. waits (spinning for at most ``WAIT`` cycles, then on a futex) until :data:`FINISHED`
   counts every task.

Every task runs exactly once, on whichever thread claimed it; a kernel whose tasks compute
disjoint parts of its output in a fixed order gives the same bits however they were shared.
Linux only (``futex``), on x86-64 and AArch64 (:func:`available`).
"""

from __future__ import annotations

import ctypes
import functools
import platform
import sys
from types import ModuleType
from typing import Any

import numpy as np

from ..parallel import TeamLoop, TeamSlots
from .compiled import CompiledFunction, CompiledIntrinsic, _calling_dispatchers, compiled, load_numba
from .spin import cycles as _cycles
from .spin import cycles_per_second
from .spin import pause as _pause

__all__ = ["BUSY", "MAX_TASKS", "STATE_SLOTS", "TaskFunction", "add", "available", "carray",
           "float32_pointer", "int64_pointer", "load", "task_function", "team_loop", "team_region",
           "team_wake", "team_worker"]

# Slots of the state array, each on a cache line of its own where threads write it.
GENERATION = 0  # the last region published (the workers' futex word: its low 32 bits)
# written by the layer above (parallel.Team, TeamSlots): the scopes in force, the stop flag, the
# cycles a worker spins without a region, the gap that means preempted, the caller's spin
ACTIVE, STOP, LIMIT, GAP, WAIT = 8, 9, 10, 11, 12
TASK = 16  # the region's task function (address)
ARGUMENTS = 17  # the address of the region's int64 argument block
NEXT = 24  # (region number << 32) | (tasks << 16) | next task
FINISHED = 32  # tasks finished in the current region (the caller's futex word)
WAITING = 33  # 1 while the caller sleeps on FINISHED
SLEEPERS = 40  # workers asleep on GENERATION
BUSY = 48  # 1 while a caller holds the team
#: The length of the state array.
STATE_SLOTS = 56
#: The most tasks one region holds (16 bits of :data:`NEXT`); a kernel with more runs alone.
MAX_TASKS = (1 << 16) - 1

# Linux's system call numbers and futex operations (private to the process).
_SYSCALLS = {"x86_64": (202, 24), "aarch64": (98, 124)}  # futex, sched_yield
_FUTEX_WAIT, _FUTEX_WAKE = 128, 129
_MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
_FUTEX, _YIELD = _SYSCALLS.get(_MACHINE, (0, 0))


@functools.cache
def _build(numba: ModuleType) -> dict[str, Any]:
    """The intrinsics: ``call_task(function, arguments, task)`` (calls the C function at
    address ``function`` with two int64), ``syscall(address, number, a, b, c, d)`` (libc's
    variadic ``syscall`` at ``address``), ``load``/``store``/``add``/``swap_if`` (sequentially
    consistent atomics on an int64 array's element), and ``float32_pointer``/
    ``int64_pointer`` (an address as a typed pointer, for numba's ``carray``)."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    i64 = ir.IntType(64)

    def element(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.gep(array.data, [args[1]])

    def int64_array(value: Any) -> bool:
        return isinstance(value, types.Array) and value.dtype == types.int64

    @intrinsic
    def call_task(typingctx: Any, function: Any, arguments: Any, task: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            kind = ir.FunctionType(ir.VoidType(), [i64, i64])
            target = builder.inttoptr(args[0], kind.as_pointer())
            builder.call(target, [args[1], args[2]])
            return context.get_dummy_value()
        return types.void(types.int64, types.int64, types.int64), codegen

    @intrinsic
    def syscall(typingctx: Any, address: Any, number: Any, a: Any, b: Any, c: Any, d: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            kind = ir.FunctionType(i64, [i64], var_arg=True)
            return builder.call(builder.inttoptr(args[0], kind.as_pointer()), list(args[1:]))
        return types.int64(*[types.int64] * 6), codegen

    @intrinsic
    def load(typingctx: Any, state: Any, index: Any) -> Any:
        if not int64_array(state):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.load_atomic(element(context, builder, signature, args), "seq_cst", 8)
        return types.int64(state, types.intp), codegen

    @intrinsic
    def store(typingctx: Any, state: Any, index: Any, value: Any) -> Any:
        if not int64_array(state):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            builder.store_atomic(args[2], element(context, builder, signature, args), "seq_cst", 8)
            return context.get_dummy_value()
        return types.void(state, types.intp, types.int64), codegen

    @intrinsic
    def add(typingctx: Any, state: Any, index: Any, value: Any) -> Any:
        if not int64_array(state):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.atomic_rmw("add", element(context, builder, signature, args), args[2], "seq_cst")
        return types.int64(state, types.intp, types.int64), codegen

    @intrinsic
    def swap_if(typingctx: Any, state: Any, index: Any, expected: Any, value: Any) -> Any:
        if not int64_array(state):
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            pair = builder.cmpxchg(element(context, builder, signature, args), args[2], args[3],
                                   "seq_cst", "seq_cst")
            return builder.extract_value(pair, 0)
        return types.int64(state, types.intp, types.int64, types.int64), codegen

    def pointer(target: Any) -> Any:
        @intrinsic
        def as_pointer(typingctx: Any, address: Any) -> Any:
            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
            return types.CPointer(target)(types.int64), codegen
        return as_pointer

    return {"call_task": call_task, "syscall": syscall, "load": load, "store": store, "add": add,
            "swap_if": swap_if, "float32_pointer": pointer(types.float32),
            "int64_pointer": pointer(types.int64)}


def _intrinsic(name: str) -> CompiledIntrinsic:
    return CompiledIntrinsic(lambda numba: _build(numba)[name], name)


_call_task, _syscall, _store, _swap_if = (
    _intrinsic(name) for name in ("call_task", "syscall", "store", "swap_if"))
#: ``load(state, index)`` and ``add(state, index, value)`` in a compiled function: a
#: sequentially consistent atomic load of an int64 array's element, and an atomic addition
#: returning the element's value before it.
load = _load = _intrinsic("load")
add = _add = _intrinsic("add")
#: ``float32_pointer(address)`` and ``int64_pointer(address)`` in a task function: an address
#: of the argument block as a pointer for :data:`carray`.
float32_pointer, int64_pointer = _intrinsic("float32_pointer"), _intrinsic("int64_pointer")
#: numba's ``carray(pointer, shape)`` in a task function: an array over memory it does not own.
carray = CompiledIntrinsic(lambda numba: numba.carray, "carray")


@compiled(inline="always")
def _futex(system: int, state: np.ndarray, index: int, operation: int, value: int) -> None:
    """``futex(&state[index], operation, value)`` on the slot's low 32 bits (little-endian);
    no timeout: a wait ends when the word differs from ``value`` or a wake-up comes."""
    _syscall(system, _FUTEX, state.ctypes.data + 8 * index, operation, value & 0xFFFFFFFF, 0)


@compiled
def _claim_tasks(state: np.ndarray, region: int, function: int, arguments: int, system: int) -> None:
    """Claim and run tasks of region number ``region`` until none is left (or another region
    replaced it), counting each in :data:`FINISHED` and waking a caller asleep on it."""
    tag = region & 0x7FFFFFFF
    while True:
        word = _load(state, NEXT)
        task = word & 0xFFFF
        if (word >> 32) != tag or task >= (word >> 16) & 0xFFFF:
            return
        if _swap_if(state, NEXT, word, word + 1) != word:
            continue
        _call_task(function, arguments, task)
        _add(state, FINISHED, 1)
        if _load(state, WAITING) != 0:
            _futex(system, state, FINISHED, _FUTEX_WAKE, 0x7FFFFFFF)


@compiled
def team_worker(state: np.ndarray, system: int) -> None:
    """A team worker's life, from its thread's start to ``STOP``: wait for a region
    (spinning while a scope is in force, for at most ``LIMIT`` cycles without news and
    only while no two reads are more than ``GAP`` cycles apart; asleep on the futex of
    :data:`GENERATION` otherwise), then claim and run its tasks. A spinning worker yields its
    processor every half gap (``sched_yield``, which returns at once when no other thread
    waits for it): a thread woken there (numba's OpenMP worker, the pool's, another program's)
    runs within that time instead of after the spinner's time slice, and the spinner, finding
    the gap, sleeps."""
    seen = _load(state, GENERATION)
    while _load(state, STOP) == 0:
        limit, gap = _load(state, LIMIT), _load(state, GAP)
        start = last = yielded = _cycles()
        while True:
            current = _load(state, GENERATION)
            if current != seen or _load(state, STOP) != 0:
                break
            now = _cycles()
            if _load(state, ACTIVE) <= 0 or now - start > limit or now - last > gap:
                _add(state, SLEEPERS, 1)
                if _load(state, GENERATION) == seen and _load(state, STOP) == 0:
                    _futex(system, state, GENERATION, _FUTEX_WAIT, seen)
                _add(state, SLEEPERS, -1)
                start = last = yielded = _cycles()
                continue
            last = now
            if now - yielded > gap >> 1:
                _syscall(system, _YIELD, 0, 0, 0, 0)
                yielded = now
            _pause()
        if current != seen:
            seen = current
            _claim_tasks(state, current, _load(state, TASK), _load(state, ARGUMENTS), system)


@compiled
def team_wake(state: np.ndarray, system: int) -> None:
    """Wake every worker asleep on :data:`GENERATION` (they spin again while a scope is in
    force, and return after ``STOP``). The count moves on as if a region of no task had been
    published, so that a worker between its last look and its futex wait does not sleep
    through the wake-up (its claims of that region's tasks find none)."""
    _add(state, GENERATION, 1)
    _futex(system, state, GENERATION, _FUTEX_WAKE, 0x7FFFFFFF)


@compiled
def team_region(state: np.ndarray, system: int, function: int, arguments: int, tasks: int) -> None:
    """Run ``function(arguments, task)`` for task = 0..tasks-1, each once, on the calling
    thread and the team's workers (module docstring); returns when every task is done. A
    caller that finds the team taken, or a region of more than :data:`MAX_TASKS` tasks, runs
    them all itself."""
    if tasks <= 0:
        return
    if tasks > MAX_TASKS or _swap_if(state, BUSY, 0, 1) != 0:
        for task in range(tasks):
            _call_task(function, arguments, task)
        return
    region = _load(state, GENERATION) + 1
    _store(state, TASK, function)
    _store(state, ARGUMENTS, arguments)
    _store(state, FINISHED, 0)
    _store(state, WAITING, 0)
    _store(state, NEXT, ((region & 0x7FFFFFFF) << 32) | (tasks << 16))
    _store(state, GENERATION, region)
    if _load(state, SLEEPERS) > 0:
        _futex(system, state, GENERATION, _FUTEX_WAKE, 0x7FFFFFFF)
    _claim_tasks(state, region, function, arguments, system)
    limit, gap = _load(state, WAIT), _load(state, GAP)
    start = last = _cycles()
    while _load(state, FINISHED) < tasks:
        now = _cycles()
        if now - start > limit or now - last > gap:
            _store(state, WAITING, 1)
            while True:
                finished = _load(state, FINISHED)
                if finished >= tasks:
                    break
                _futex(system, state, FINISHED, _FUTEX_WAIT, finished)
            break
        last = now
        _pause()
    _store(state, BUSY, 0)


class TaskFunction:
    """A compiled function ``task(arguments, task)`` (two int64: the address of the region's
    int64 argument block and the task's number) made C-callable (numba's ``cfunc``) on first
    use: :attr:`address` is what a region publishes. Its body reads its arguments with
    :data:`int64_pointer`, :data:`float32_pointer` and :data:`carray`, and must not raise (no
    Python code runs on a team worker)."""

    def __init__(self, function: Any) -> None:
        self.function = function
        functools.update_wrapper(self, function)

    @functools.cached_property
    def address(self) -> int:
        """The function's address in this process (compiles or loads it from the disk cache)."""
        numba = load_numba()
        signature = numba.types.void(numba.types.int64, numba.types.int64)
        options = {key: value for key, value in CompiledFunction(self.function, {}).options.items()
                   if key in ("cache", "error_model", "boundscheck")}
        return numba.cfunc(signature, **options)(_calling_dispatchers(self.function)).address


def task_function(function: Any) -> TaskFunction:
    """Mark ``function(arguments, task)`` as a team region's task (:class:`TaskFunction`)."""
    return TaskFunction(function)


@functools.cache
def _syscall_address() -> int:
    return ctypes.cast(ctypes.CDLL(None).syscall, ctypes.c_void_p).value or 0


def available() -> bool:
    """Whether a team can run here: Linux on x86-64 or AArch64, numba loads and the cycle
    counter advances."""
    if not sys.platform.startswith("linux") or _MACHINE not in _SYSCALLS:
        return False
    try:
        return cycles_per_second() > 0 and _syscall_address() != 0
    except (ImportError, OSError):
        return False


@functools.cache
def team_loop() -> TeamLoop | None:
    """What :meth:`onnx_light.parallel.ThreadPool.hot` starts a team with: the compiled
    :func:`team_worker` and :func:`team_wake`, libc's ``syscall`` address, the cycle counter's
    rate and the state's layout; None where no team can run (:func:`available`). The loops
    are compiled (or loaded from the disk cache) here, not in a run."""
    if not available():
        return None
    worker, wake, system = team_worker.dispatcher, team_wake.dispatcher, _syscall_address()
    state = np.zeros(STATE_SLOTS, np.int64)
    state[STOP] = 1
    worker(state, system)  # returns at once: stopped
    wake(state, system)
    region = team_region.dispatcher
    region(state, system, 0, 0, 0)  # no tasks: returns at once
    return TeamLoop(worker, wake, system, cycles_per_second(),
                    TeamSlots(STATE_SLOTS, GENERATION, ACTIVE, STOP, LIMIT, GAP, WAIT))
