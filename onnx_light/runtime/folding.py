"""Constant folding: the deterministic nodes whose inputs are all fixed run once, at construction.

Fixed inputs are initializers and outputs of folded nodes. Initializers that are also graph
inputs (every one, in IR < 4 models) are defaults a feed may override: :class:`Folding`
records which of them each folded value depends on, so that a run feeding one takes the
plan without folding. The kernels run as dispatch built them (portable configuration, one
thread, no pool): folded values do not depend on this processor's tuning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..kernels.base import Kernel, numpy_dtype
from ..parallel import BLAS
from .plan import NodeStep

__all__ = ["FOLD_MAXIMUM_BYTES", "NONDETERMINISTIC", "Folding", "fold_constants"]

# Operators whose outputs may differ between runs with the same inputs: never folded.
NONDETERMINISTIC = frozenset({"Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform",
                              "RandomUniformLike", "Multinomial", "Bernoulli"})


# A folded value takes at most this many bytes; a node whose outputs would take more is left
# to run with every run (where running out of memory is an error naming the node). The light
# real models build their weights with ConstantOfShape: VGG-19 folds one of 392 MiB.
FOLD_MAXIMUM_BYTES = 1 << 30


def _fold(kernel: Kernel, arguments: list[np.ndarray | None],
          output_shapes: list[list[int | str | None] | None]) -> list[np.ndarray] | None:
    """A foldable node's outputs, computed now; None when they would take more than
    ``FOLD_MAXIMUM_BYTES`` (told before computing them from the kernel or from the inferred
    shapes where either knows, else measured after) or do not fit in memory."""
    itemsize = max((numpy_dtype(t).itemsize for t in kernel.ctx.output_types if t), default=8)
    elements = kernel.output_elements(arguments)
    if elements is None and all(shape is not None and all(isinstance(d, int) for d in shape)
                                for shape in output_shapes):
        elements = sum(math.prod(shape) for shape in output_shapes)
    if elements is not None and elements * itemsize > FOLD_MAXIMUM_BYTES:
        return None
    try:
        results = list(kernel.run(*arguments))
    except MemoryError:
        return None
    if any(value is None or isinstance(value, list) for value in results):
        return None  # sequences and optionals are left to the runs: only tensors are folded
    results = [np.asarray(array) for array in results]
    if sum(array.nbytes for array in results) > FOLD_MAXIMUM_BYTES:
        return None
    return results

@dataclass(frozen=True)
class Folding:
    """What folding left: the ``steps`` still to run, the ``folded`` values by slot, and for
    every fixed slot the overridable initializers it depends on (``depends``)."""

    steps: list[NodeStep]
    folded: dict[int, np.ndarray]
    depends: Mapping[int, frozenset[int]]

    def sources(self, slots: Iterable[int]) -> frozenset[int]:
        """The overridable initializers the values of ``slots`` depend on."""
        return frozenset().union(*(self.depends[s] for s in slots))


def fold_constants(steps: Sequence[NodeStep], constants: Mapping[int, np.ndarray],
                   overridable: set[int],
                   output_shapes: Callable[[Kernel], list[list[int | str | None] | None]],
                   enabled: bool = True,
                   static_shapes: Callable[[int], tuple[int, ...] | None] | None = None) -> Folding:
    """Fold ``steps`` (in graph order) over ``constants`` (initializers by slot; those in
    ``overridable`` a feed may replace); ``output_shapes(kernel)``: the inferred shapes of a
    node's outputs. A node whose outputs its inputs' shapes decide
    (``Kernel.outputs_of_shapes``: Shape, Size) is folded too when ``static_shapes(slot)``
    fixes those shapes for every run (the checked feeds' and the shapes inferred from them)
    and no initializer is overridable (a feed replacing one could change them). With
    ``enabled`` False nothing is folded."""
    depends: dict[int, frozenset[int]] = {s: frozenset((s,) if s in overridable else ())
                                          for s in constants}
    folded: dict[int, np.ndarray] = {}
    known = dict(constants)
    left: list[NodeStep] = []
    with BLAS.scope(1):
        for kernel, inputs, outputs in steps:
            fixed = all(s is None or s in depends for s in inputs)
            results = None
            if enabled and not fixed and static_shapes is not None and not overridable:
                results = kernel.outputs_of_shapes([None if s is None else static_shapes(s) for s in inputs])
                sources = frozenset()
            if results is None:
                if not enabled or not fixed or not NONDETERMINISTIC.isdisjoint(kernel.op_types):
                    left.append((kernel, inputs, outputs))
                    continue
                results = _fold(kernel, [None if s is None else known[s] for s in inputs],
                                output_shapes(kernel))
                if results is None:  # too large to keep: computed by every run instead
                    left.append((kernel, inputs, outputs))
                    continue
                sources = frozenset().union(*(depends[s] for s in inputs if s is not None))
            for s, array in zip(outputs, results, strict=False):
                if s is not None:
                    array.flags.writeable = False
                    folded[s] = known[s] = array
                    depends[s] = sources
    return Folding(left, folded, depends)
