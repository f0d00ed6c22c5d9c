"""Running a plan over a run's list of values (one entry per slot).

:func:`execute` walks the plan's steps, calling a node hook around each when one is given,
and around each step of the bodies that control-flow steps run (:func:`body_hook` gives the
hook to :class:`~onnx_light.runtime.subgraphs.Subgraph`, which runs on the same thread);
:func:`bind_plan` turns the plan, once per set of buffers, into a list of prebound callables
(a prepared step writes into its buffer, any other calls ``kernel.run``), which
:func:`run_bound` calls in order: the steady-state path, with no per-step work beyond the
calls themselves.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from ..kernels.base import KernelError, Prepared, quiet
from ..parallel import ThreadPool
from .branches import Branches
from .plan import Step

__all__ = ["BoundPlan", "HookError", "NodeHook", "bind_plan", "body_hook", "execute", "run_bound"]

# Called before each step of a run with the node's name and op type; may return a callable to
# call once the step is done.
NodeHook = Callable[[str, str], Callable[[], None] | None]
#: One item of a plan bound to a run's buffers: called with the run's values.
BoundCall = Callable[[list[Any]], None]
BoundPlan = tuple[Sequence[Any], tuple[BoundCall, ...]]


_running = threading.local()


class HookError(Exception):
    """What a node hook raised before a step of a body (a terminated run, say), carried out
    of the steps around it, which would otherwise wrap it, and raised as it is by
    :func:`execute`."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def body_hook() -> NodeHook | None:
    """The hook of the :func:`execute` running on this thread, for the bodies its steps run."""
    return getattr(_running, "hook", None)


def _failure(step: Step, exc: Exception) -> RuntimeError:
    return RuntimeError(
        f"node {step.node!r} ({step.op_type}) failed: {type(exc).__name__}: {str(exc) or '(no message)'}"
    )


def execute(plan: Sequence[Any], values: list[Any], pool: ThreadPool, hook: NodeHook | None = None) -> None:
    """Run ``plan``'s steps in order, each writing its outputs into ``values`` and freeing
    the values it reads last; a :class:`Branches` item runs its branches on the pool."""
    outer, _running.hook = body_hook(), hook
    try:
        _execute(plan, values, pool, hook)
    except HookError as carried:
        raise carried.error from None
    finally:
        _running.hook = outer


def _execute(plan: Sequence[Any], values: list[Any], pool: ThreadPool, hook: NodeHook | None) -> None:
    for step in plan:
        if type(step) is Branches:
            step.run(functools.partial(_execute_branch, values=values, pool=pool, hook=hook), pool)
            for s in step.release:
                values[s] = None
            continue
        done = None if hook is None else hook(step.node, step.op_type)
        arguments = [None if s is None else values[s] for s in step.inputs]
        try:
            results = step.run(*arguments)
        except (KernelError, HookError):
            raise
        except Exception as exc:
            raise _failure(step, exc) from exc
        if done is not None:
            done()
        for s, result in zip(step.outputs, results, strict=False):
            if s is not None:
                values[s] = result
        for s in step.release:
            values[s] = None


def _execute_branch(steps: Sequence[Any], values: list[Any], pool: ThreadPool, hook: NodeHook | None) -> None:
    """One branch, on whichever pool thread took it; numpy's error state is per thread,
    so the branch sets it there too (its kernels then skip their own)."""
    with quiet():
        execute(steps, values, pool, hook)


def bind_plan(
    plan: Sequence[Any],
    buffers: Sequence[np.ndarray],
    assignment: Mapping[int, int],
    none_slot: int,
    pool: ThreadPool,
) -> BoundPlan:
    """The plan's items as callables over a run's values: a prepared step (``Step.prepared``)
    computes into its buffer (``assignment``: slot -> index in ``buffers``) or, for a graph
    output, into a new array; any other step calls its kernel. ``none_slot``: a slot that
    always holds None, read for an omitted input."""
    reused = frozenset(assignment)
    return plan, tuple(_bound(item, buffers, assignment, reused, none_slot, pool) for item in plan)


def _bound(
    item: Any,
    buffers: Sequence[np.ndarray],
    assignment: Mapping[int, int],
    reused: Collection[int],
    none_slot: int,
    pool: ThreadPool,
) -> BoundCall:
    if type(item) is Branches:

        def branches(values: list[Any]) -> None:
            item.run(functools.partial(_execute_branch, values=values, pool=pool, hook=None), pool)
            for s in item.release:
                values[s] = None

        return branches
    inputs = tuple(none_slot if s is None else s for s in item.inputs)
    release = tuple(s for s in item.release if s not in reused)
    run, outputs = item.run, tuple((i, s) for i, s in enumerate(item.outputs) if s is not None)
    prepared = item.prepared
    if prepared is None:
        return _unprepared_call(run, inputs, outputs, release)
    call = _prepared_call(item, prepared, inputs, buffers, assignment)
    if item.checked:  # inputs only shape inference vouches for: check them, else run
        call = _checked_call(item, inputs, buffers, assignment,
                             _unprepared_call(run, inputs, outputs, ()))
    if not release:
        return call
    written = call

    def call_and_release(values: list[Any]) -> None:
        written(values)
        for s in release:
            values[s] = None

    return call_and_release


def _unprepared_call(run: Callable[..., Sequence[Any]], inputs: tuple[int, ...],
                     outputs: tuple[tuple[int, int], ...], release: tuple[int, ...]
                     ) -> Callable[[list[Any]], None]:
    """A step's ``kernel.run`` over the run's values, storing the outputs it returns and
    freeing the slots of ``release``; one output of one to three inputs (most steps: a
    convolution reads three) without the loops over slots."""
    if len(outputs) == 1 and outputs[0][0] == 0 and len(inputs) in (1, 2, 3):
        output = outputs[0][1]
        if len(inputs) == 1:
            (a,) = inputs

            def one(values: list[Any]) -> None:
                results = run(values[a])
                if results:
                    values[output] = results[0]
                for s in release:
                    values[s] = None

            return one
        if len(inputs) == 2:
            a, b = inputs

            def two(values: list[Any]) -> None:
                results = run(values[a], values[b])
                if results:
                    values[output] = results[0]
                for s in release:
                    values[s] = None

            return two
        a, b, c = inputs

        def three(values: list[Any]) -> None:
            results = run(values[a], values[b], values[c])
            if results:
                values[output] = results[0]
            for s in release:
                values[s] = None

        return three

    def unprepared(values: list[Any]) -> None:
        results = run(*[values[s] for s in inputs])
        for i, s in outputs:
            if i < len(results):
                values[s] = results[i]
        for s in release:
            values[s] = None

    return unprepared


def _checked_call(item: Step, inputs: tuple[int, ...], buffers: Sequence[np.ndarray],
                  assignment: Mapping[int, int], unprepared: Callable[[list[Any]], None]
                  ) -> Callable[[list[Any]], None]:
    """A prepared step whose ``checked`` inputs are checked on every run: a view of the
    spec is copied into its scratch buffer, another shape or type runs the kernel."""
    prepared, (output,) = item.prepared, item.outputs
    assert prepared is not None
    compute, shape, dtype = prepared.compute, prepared.shape, prepared.dtype
    target = buffers[assignment[output]] if output in assignment else None
    checks = tuple((index, spec_shape, spec_dtype, buffers[assignment[scratch]])
                   for index, (spec_shape, spec_dtype), scratch in item.checked)

    def checked(values: list[Any]) -> None:
        operands = [values[s] for s in inputs]
        for index, spec_shape, spec_dtype, scratch in checks:
            value = operands[index]
            if value.shape != spec_shape or value.dtype != spec_dtype:
                unprepared(values)
                return
            if not value.flags.c_contiguous:
                np.copyto(scratch, value)
                operands[index] = scratch
        out = np.empty(shape, dtype) if target is None else target
        compute(*operands, out=out)
        values[output] = out

    return checked


def _prepared_call(item: Step, prepared: Prepared, inputs: tuple[int, ...],
                   buffers: Sequence[np.ndarray], assignment: Mapping[int, int]
                   ) -> Callable[[list[Any]], None]:
    """A prepared step's call: it computes into its buffer, or a new array for an output
    the caller keeps."""
    compute, (output,) = prepared.compute, item.outputs
    if output in assignment:
        buffer = buffers[assignment[output]]
        if len(inputs) == 1:
            (a,) = inputs

            def call(values: list[Any]) -> None:
                compute(values[a], out=buffer)
                values[output] = buffer
        elif len(inputs) == 2:
            a, b = inputs

            def call(values: list[Any]) -> None:
                compute(values[a], values[b], out=buffer)
                values[output] = buffer
        elif len(inputs) == 3:  # a convolution with its bias
            a, b, c = inputs

            def call(values: list[Any]) -> None:
                compute(values[a], values[b], values[c], out=buffer)
                values[output] = buffer
        else:

            def call(values: list[Any]) -> None:
                compute(*[values[s] for s in inputs], out=buffer)
                values[output] = buffer
        return call
    shape, dtype = prepared.shape, prepared.dtype  # a graph output: the caller keeps it

    def fresh(values: list[Any]) -> None:
        out = np.empty(shape, dtype)
        compute(*[values[s] for s in inputs], out=out)
        values[output] = out

    return fresh


def run_bound(bound: BoundPlan, values: list[Any]) -> None:
    """Call a bound plan's items in order; an exception names the node that raised it."""
    plan, calls = bound
    call = None
    try:
        for call in calls:
            call(values)
    except KernelError:
        raise
    except Exception as exc:
        item = plan[calls.index(call)]  # each item's call is a closure of its own
        if type(item) is Branches:  # its branches name their node already
            raise
        raise _failure(item, exc) from exc
