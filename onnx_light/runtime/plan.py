"""The plan a run walks: steps of bound kernels over integer value slots.

A step reads and writes values by slot (an index into the run's list of values) and frees
the values it reads last; :class:`Handoff` says which of the plan's outputs a run copies
before handing them to the caller (those that may share memory with a feed, a constant or
another output); :func:`work_estimates` gives the branch grouping each step's cost.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..kernels.base import Kernel, Prepared, TensorSpec

__all__ = ["Handoff", "NodeStep", "Slots", "Step", "memory_roots", "plan_steps", "static_shape",
           "work_estimates"]

Slots = tuple[int | None, ...]
#: A node of the graph as the construction steps pass it on: its kernel, input and output slots.
NodeStep = tuple[Kernel, Slots, Slots]

@dataclass(frozen=True)
class Step:
    """One step of a plan: ``run(*inputs)`` returns the outputs to store in ``outputs``;
    ``release`` lists the slots to free after it; ``kernel`` is the kernel it runs, and
    ``prepared`` its computation for fixed input specs when the memory plan gave its output
    a buffer (``runtime/arena.py``); ``checked``: the inputs (by position, with their specs
    and the slot of a scratch buffer) whose spec only shape inference vouches for, checked
    on every run before ``prepared``: a view of that spec is copied into the scratch
    buffer, another shape or type runs ``run`` instead."""

    run: Any
    inputs: Slots
    outputs: Slots
    release: tuple[int, ...]
    node: str
    op_type: str
    kernel: Kernel
    prepared: Prepared | None = None
    checked: tuple[tuple[int, TensorSpec, int], ...] = ()


def memory_roots(steps: Sequence[NodeStep]) -> dict[int, frozenset[int]]:
    """For every slot the steps make, the slots whose memory it may share: its own for a
    value made anew, those of the inputs it may view (``Kernel.views``) for a view."""
    roots: dict[int, frozenset[int]] = {}
    for kernel, inputs, made in steps:
        views = kernel.views()
        for index, s in enumerate(made):
            if s is None:
                continue
            viewed = [inputs[i] for i in (views[index] if index < len(views) else ())
                      if i < len(inputs) and inputs[i] is not None]
            roots[s] = (frozenset().union(*(roots.get(v, frozenset((v,))) for v in viewed))
                        if viewed else frozenset((s,)))
    return roots


@dataclass(frozen=True)
class Handoff:
    """Which outputs of a plan a run copies before handing them over: those that may share
    memory (``roots``: per output slot, the slots whose memory it may share) with a value the
    plan did not make (a feed, a constant) or with an output handed over before them.
    ``every``: the flags for all outputs in graph order."""

    roots: Mapping[int, frozenset[int]]
    made: frozenset[int]
    every: tuple[bool, ...]

    @classmethod
    def of(cls, steps: Sequence[NodeStep], outputs: Sequence[int],
           reused: Iterable[int] = ()) -> Handoff:
        """From the plan's steps: an output a step makes anew is its own root; one a step
        makes as a view (``Kernel.views``) has the roots of the inputs it views. ``reused``:
        slots written into buffers the memory plan reuses run to run, which a caller's
        output must never share."""
        roots = memory_roots(steps)
        made_slots = frozenset(s for _, _, made in steps for s in made
                               if s is not None) - frozenset(reused)
        output_roots = {s: roots.get(s, frozenset((s,))) for s in outputs}
        handoff = cls(output_roots, made_slots, ())
        return dataclasses.replace(handoff, every=handoff.copies(outputs))

    def copies(self, slots: Iterable[int]) -> tuple[bool, ...]:
        """For each of ``slots`` in turn, whether it must be copied."""
        seen: set[int] = set()
        flags = []
        for s in slots:
            roots = self.roots[s]
            flags.append(not roots <= self.made or not roots.isdisjoint(seen))
            seen |= roots
        return tuple(flags)



def plan_steps(steps: Sequence[NodeStep], keep: set[int]) -> tuple[Step, ...]:
    """Bound steps; each frees the values (other than ``keep``) it reads or makes last."""
    last_use: dict[int, int] = {}
    for index, (_, inputs, outputs) in enumerate(steps):
        for s in inputs:
            if s is not None:
                last_use[s] = index
        for s in outputs:
            if s is not None:
                last_use.setdefault(s, index)  # produced but never read: free at once
    release: dict[int, list[int]] = {}
    for s, last in last_use.items():
        if s not in keep:
            release.setdefault(last, []).append(s)
    return tuple(
        Step(kernel.run, inputs, outputs, tuple(release.get(index, ())), kernel.ctx.name,
             kernel.ctx.op_type, kernel)
        for index, (kernel, inputs, outputs) in enumerate(steps)
    )




def static_shape(s: int | None, known: Mapping[int, np.ndarray],
                 shapes: Mapping[int, Sequence[int | str | None]]) -> tuple[int, ...] | None:
    """A slot's shape as construction knows it: a constant's, or the inferred one (None where
    a dimension is symbolic or the slot is an omitted input)."""
    if s is None:
        return None
    if s in known:
        return known[s].shape
    dims = shapes.get(s)
    if dims is None or not all(isinstance(d, int) and d >= 0 for d in dims):
        return None
    return tuple(dims)


def work_estimates(steps: Sequence[NodeStep], known: Mapping[int, np.ndarray],
                   shapes: Mapping[int, Sequence[int | str | None]]) -> list[int | None]:
    """Each step's work estimate (``Kernel.work``) from the shapes known at construction
    (:func:`static_shape`; outputs the node leaves out are not passed)."""
    return [kernel.work([static_shape(s, known, shapes) for s in inputs],
                        [static_shape(s, known, shapes) for s in outputs if s is not None])
            for kernel, inputs, outputs in steps]
