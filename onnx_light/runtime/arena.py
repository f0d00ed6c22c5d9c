"""The memory plan: buffers that the plan's prepared steps write into, reused by lifetime.

A prepared step (:meth:`~onnx_light.kernels.base.Kernel.prepare`: inputs of fixed shapes and
types) writes its one output into a buffer instead of allocating it. Two values share a
buffer when they have the same shape and type and their lifetimes do not overlap: a value
lives from the step that writes it to the last step that reads it or any value that may be
a view of it (``Kernel.views``), so a buffer is never written while a view of its previous
value is still read, and never one of the inputs of the step that writes it. Graph outputs
get no buffer (the caller keeps them); the hand-off copies any output that may share memory
with a buffer. Each concurrent run takes its own set of buffers (:class:`Arenas`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from ..kernels.base import TensorSpec
from ..kernels.packed_gemm import aligned_empty
from .plan import Step

__all__ = ["Arenas", "MemoryPlan", "plan_memory", "prepare_steps"]


def prepare_steps(plan: Sequence[Any], specs: Mapping[int, TensorSpec],
                  inferred: Mapping[int, TensorSpec] | None = None
                  ) -> tuple[tuple[Any, ...], list[tuple[int, int, TensorSpec]]]:
    """The plan with its steps prepared (``Kernel.prepare``) where every input's spec is
    known, and the values they write as (position, slot, spec). ``specs``: the slots fixed
    for every run (contiguous constants, feeds whose type and shape the run checks); a
    prepared step's output is fixed in turn. ``inferred``: the specs shape inference gives
    the outputs of steps that are not prepared (a Conv's, a Transpose's view): a step
    reading one, or the output of a step that does, is prepared with that input checked
    on every run (``Step.checked``), and a scratch buffer (a write at the step's position
    to a negative slot) into which a run copies a view of that spec (a transposed
    activation) instead of allocating the copy. Steps inside :class:`Branches` items run as they are
    (their branches run side by side, so their buffers could not be shared)."""
    specs, inferred = dict(specs), inferred or {}
    unchecked: set[int] = set()
    items, writes = [], []
    for position, item in enumerate(plan):
        if (type(item) is Step and len(item.outputs) == 1 and item.outputs[0] is not None
                and all(s is not None and s in specs for s in item.inputs)):
            prepared = item.kernel.prepare([specs[s] for s in item.inputs])
            if prepared is not None:
                checked = []
                for index, s in enumerate(item.inputs):
                    if s in unchecked:  # with a scratch buffer for a view's values
                        scratch = -1 - len(writes)  # a slot of no value: none is negative
                        writes.append((position, scratch, specs[s]))
                        checked.append((index, specs[s], scratch))
                item = dataclasses.replace(item, prepared=prepared, checked=tuple(checked))
                spec = (tuple(prepared.shape), np.dtype(prepared.dtype))
                specs[item.outputs[0]] = spec
                writes.append((position, item.outputs[0], spec))
                if checked:
                    unchecked.add(item.outputs[0])
                items.append(item)
                continue
        if type(item) is Step:
            for s in item.outputs:
                if s is not None and s in inferred and s not in specs:
                    specs[s] = inferred[s]
                    unchecked.add(s)
        items.append(item)
    return tuple(items), writes


@dataclass(frozen=True)
class MemoryPlan:
    """``buffers``: the spec of each buffer; ``assignment``: slot -> the buffer it is written
    into."""

    buffers: tuple[TensorSpec, ...]
    assignment: Mapping[int, int]

    def allocate(self) -> list[np.ndarray]:
        """One set of buffers (a run's arena), numbers starting on a 64-byte boundary: a
        product whose threads write neighbouring columns of the same rows then shares no
        cache line between two tasks where the rows are multiples of 64 bytes (BERT's
        64 x 256 x 1024 packed product at 2 threads: 244 -> 210 us; docs/model-zoo.md,
        "Encoders")."""
        return [aligned_empty(shape, dtype) if dtype.kind in "biufc" else np.empty(shape, dtype)
                for shape, dtype in self.buffers]

    @property
    def nbytes(self) -> int:
        """The bytes of one arena."""
        return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in self.buffers)


def plan_memory(writes: Sequence[tuple[int, int, TensorSpec]], reads: Sequence[Sequence[int]],
                roots: Mapping[int, frozenset[int]], outputs: Collection[int]) -> MemoryPlan:
    """Buffers for the values ``writes`` lists as (position in the plan, slot, spec), in plan
    order, but the graph's ``outputs``; ``reads[p]``: the slots the plan's item at position
    ``p`` reads; ``roots``: the slots whose memory each value may share (a view's roots
    include what it views)."""
    writes = [write for write in writes if write[1] not in outputs]
    end: dict[int, int] = {}
    written = {slot for _, slot, _ in writes}
    for position, slots in enumerate(reads):
        for read in slots:
            for root in roots.get(read, frozenset((read,))):
                if root in written:
                    end[root] = position
    buffers: list[TensorSpec] = []
    busy_until: list[int] = []
    assignment: dict[int, int] = {}
    for position, slot, (shape, dtype) in writes:
        spec = (tuple(shape), np.dtype(dtype))
        free = next((index for index, candidate in enumerate(buffers)
                     if candidate == spec and busy_until[index] < position), None)
        if free is None:
            buffers.append(spec)
            busy_until.append(position)
            free = len(buffers) - 1
        busy_until[free] = max(position, end.get(slot, position))
        assignment[slot] = free
    return MemoryPlan(tuple(buffers), assignment)


T = TypeVar("T")


class Arenas(Generic[T]):
    """A free list of per-run states built by ``build`` (a plan bound to one set of
    buffers): a run takes one, or builds a new one when other runs hold every one, and gives
    it back when done (list operations are atomic: no lock)."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._free: list[T] = []

    def take(self) -> T:
        """A state no other run holds."""
        try:
            return self._free.pop()
        except IndexError:
            return self._build()

    def give(self, arena: T) -> None:
        """Return a state taken by :meth:`take`."""
        self._free.append(arena)
