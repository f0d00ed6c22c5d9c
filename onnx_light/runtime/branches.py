"""Independent branches of a plan, run side by side on the session's pool.

Networks such as Inception and GoogLeNet fork a value into branches of a few convolutions that
meet again at a Concat. On a small machine each of those convolutions gains little from being
split across threads (a pool region costs tens of microseconds to hand over, and half a small
product runs slower per multiply-add than the whole), so running whole branches on different
threads, each convolution on one thread, is faster: one handoff per fork instead of one per
convolution.

:func:`group_branches` cuts a plan (a topological order of steps) into segments: a segment
ends after a step whose output several steps read (a fork) and before a step that reads the
outputs of two of its branches (a join). Inside a segment, steps that share no value made in
the segment form one branch (a connected component). A segment with two or more branches
becomes one :class:`Branches` item when its branches, placed largest first on the
least-loaded thread, finish within ``1 / BRANCH_SPEEDUP`` of their serial time and save at least
``BRANCH_MINIMUM_WORK`` (what a handoff to the pool costs); otherwise its
steps stay in plan order and their kernels split their own work (intra-op). Work estimates
come from the kernels (:meth:`~onnx_light.kernels.base.Kernel.work`); a segment with a step
whose work is unknown stays serial.

Results do not depend on this: a kernel called inside a pool region runs the same blocks it
would run in parallel, inline, so a branch gives bitwise the outputs the plain plan gives.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..parallel import ThreadPool

__all__ = ["BRANCH_MINIMUM_WORK", "BRANCH_SPEEDUP", "Branches", "group_branches"]

# Branches run side by side only where that takes at most 1 / BRANCH_SPEEDUP of their serial
# time: the speedup splitting each convolution across two threads gave on the light models
# here (1.0-1.6x; docs/real-models.md). ResNet-50's projection blocks (the main branch 0.78
# of the work) and three of Inception v1's nine modules (0.71-0.79) stay serial under it.
BRANCH_SPEEDUP = 1.5
# ... and where that saves at least this much work (the sum less the most loaded thread's, in
# the kernels' work units: multiply-adds for products and convolutions): handing a group to
# the pool and running its branches side by side costs about a hundred microseconds here, as
# much as a few million multiply-adds. A transformer's three 64x256x256 query, key and value
# projections (4.2 M saved) ran 0.1 ms slower per group as branches than one after the other;
# Inception's groups save 16-98 M (docs/parallel.md, "Branches").
BRANCH_MINIMUM_WORK = 1 << 23


class _Step(Protocol):
    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]
    release: tuple[int, ...]


@dataclass(frozen=True)
class Branches:
    """Steps in independent branches: each branch runs its steps in order on one thread,
    the branches in any order and on any thread (largest first); ``release`` lists the
    values to free once every branch is done (those several branches read)."""

    branches: tuple[tuple[Any, ...], ...]
    release: tuple[int, ...]

    def run(self, execute: Callable[[Sequence[Any]], None], pool: ThreadPool) -> None:
        """``execute(steps)`` for every branch, ``pool.num_threads`` at a time; the first
        exception a branch raises is raised here after the others finish."""
        branches = self.branches
        claim = itertools.count().__next__  # atomic under the GIL

        def take(start: int, stop: int) -> None:
            while (index := claim()) < len(branches):
                execute(branches[index])

        pool.parallel_for(len(branches), take, max_blocks=pool.num_threads)


def _balanced(work: list[int], threads: int, speedup: float, minimum: int) -> bool:
    """Whether ``work`` (per branch), placed largest first on the least-loaded of ``threads``,
    finishes within 1 / speedup of its sum, saving at least ``minimum`` of it."""
    loads = [0] * threads
    for amount in sorted(work, reverse=True):
        loads[loads.index(min(loads))] += amount
    total = sum(work)
    return max(loads) * speedup <= total and total - max(loads) >= minimum


def _as_branches(segment: list[tuple[Any, tuple[int, int]]], work: Sequence[int | None],
                 threads: int, speedup: float, minimum: int) -> list[Any]:
    """One segment's items (``(step, (index in the plan, branch))`` pairs): a Branches when it
    pays, else its steps in plan order."""
    members: dict[int, list[tuple[Any, int]]] = {}
    for step, (index, branch) in segment:
        members.setdefault(branch, []).append((step, index))
    groups = list(members.values())
    if len(groups) < 2 or any(work[index] is None for _, (index, _) in segment):
        return [step for step, _ in segment]
    sizes = [sum(work[index] for _, index in group) for group in groups]
    if not _balanced(sizes, threads, speedup, minimum):
        return [step for step, _ in segment]
    readers: dict[int, set[int]] = {}
    for number, group in enumerate(groups):
        for step, _ in group:
            for s in step.inputs:
                if s is not None:
                    readers.setdefault(s, set()).add(number)
    shared = {s for s, numbers in readers.items() if len(numbers) > 1}
    branches = []
    for _, group in sorted(zip(sizes, groups, strict=True), key=lambda pair: -pair[0]):
        branches.append(tuple(
            dataclasses.replace(step, release=tuple(s for s in step.release if s not in shared))
            for step, _ in group))
    later = tuple(s for step, _ in segment for s in step.release if s in shared)
    return [Branches(tuple(branches), later)]


def group_branches(steps: Sequence[_Step], work: Sequence[int | None], threads: int,
                   speedup: float = BRANCH_SPEEDUP,
                   minimum_work: int | None = None) -> tuple[Any, ...]:
    """The plan ``steps`` (dataclasses with ``inputs``, ``outputs`` and ``release`` slot
    tuples, in a topological order) with the independent branches that pay grouped into
    :class:`Branches` items; ``work[i]`` estimates step i's cost (None: unknown), and a group
    must save ``minimum_work`` of it (None: :data:`BRANCH_MINIMUM_WORK`)."""
    if threads < 2:
        return tuple(steps)
    minimum = BRANCH_MINIMUM_WORK if minimum_work is None else minimum_work
    readers: dict[int, int] = {}
    for step in steps:
        for s in set(step.inputs):
            if s is not None:
                readers[s] = readers.get(s, 0) + 1
    items: list[Any] = []
    segment: list[tuple[Any, tuple[int, int]]] = []  # (step, (index, branch))
    branch_of: dict[int, int] = {}  # slot made in the segment -> the branch that made it

    def close() -> None:
        items.extend(_as_branches(segment, work, threads, speedup, minimum))
        segment.clear()
        branch_of.clear()

    for index, step in enumerate(steps):
        joined = {branch_of[s] for s in step.inputs if s in branch_of}
        if len(joined) > 1:  # a join: the branches end before it
            close()
            items.append(step)
            continue
        branch = joined.pop() if joined else len(segment)
        segment.append((step, (index, branch)))
        for s in step.outputs:
            if s is not None:
                branch_of[s] = branch
        if any(s is not None and readers.get(s, 0) > 1 for s in step.outputs):
            close()  # a fork: its readers start new branches
    close()
    return tuple(items)
