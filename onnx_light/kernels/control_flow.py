"""Control flow: If, Loop, Scan and SequenceMap, over bodies the runtime builds.

Each of these nodes carries graphs as attributes (``then_branch``/``else_branch``, ``body``).
The kernel holds the operator's semantics (which branch, how many iterations, what is carried
from one iteration to the next, how per-iteration outputs are stacked); running a graph is
the runtime's job: it builds each graph as a nested plan (``onnx_light.runtime.subgraphs``)
and gives the kernel callables, :class:`Body`, with :meth:`ControlFlow.attach`. So the kernel
library never imports the runtime.

A body may read values of the graphs around it (outer scope). The runtime passes those as
extra inputs of the node's step, after the node's own inputs (``ctx.num_inputs`` of them),
so the plan keeps them alive until the node has run; the kernel hands them to its bodies
unchanged. An output may be an input or an outer value as it is (a branch that returns an
outer value, a loop that carries a value unchanged): :meth:`ControlFlow.views` says so and
the runtime copies what it hands to a caller. None is tunable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from .base import Kernel, NodeContext, normalize_axis, numpy_dtype
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "Body", "ControlFlow"]

Values = list[Any]
#: A graph attribute as the runtime builds it: ``body(inputs, outer)`` -> the graph's outputs,
#: ``outer`` being the values after the node's own inputs in its step.
Body = Callable[[Sequence[Any], Sequence[Any]], Values]


class ControlFlow(Kernel):
    """A node whose graph attributes (``graphs``) run as bodies the runtime attaches."""

    graphs: ClassVar[tuple[str, ...]] = ("body",)

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.bodies: dict[str, Body] = {}
        self.outer_names: tuple[str, ...] = ()
        self._inner_op_types: frozenset[str] = frozenset()

    def attach(self, bodies: Mapping[str, Body], outer_names: Sequence[str],
               op_types: frozenset[str] = frozenset()) -> None:
        """Take the built graphs by attribute name, the outer values they read (which the
        runtime passes after the node's inputs, in this order) and the operators inside them."""
        missing = [name for name in self.graphs if name not in bodies]
        if missing:
            raise self.ctx.error(f"graph attribute(s) {missing} are missing")
        self.bodies = dict(bodies)
        self.outer_names = tuple(outer_names)
        self._inner_op_types = frozenset(op_types)

    @property
    def op_types(self) -> frozenset[str]:
        return self._inner_op_types | {self.ctx.op_type}

    def views(self) -> Sequence[Sequence[int]]:
        every = tuple(range(self.ctx.num_inputs + len(self.outer_names)))
        return (every,) * max(1, self.ctx.num_outputs)

    def _split(self, values: Sequence[Any]) -> tuple[Sequence[Any], Sequence[Any]]:
        """The node's own inputs and the outer values of a run's arguments."""
        if not self.bodies:
            raise self.ctx.error("its graphs were not built (the runtime attaches them)")
        count = self.ctx.num_inputs
        return values[:count], values[count:]

    def _call(self, name: str, inputs: Sequence[Any], outer: Sequence[Any], count: int) -> Values:
        """Run graph ``name``; it must give ``count`` outputs."""
        results = self.bodies[name](inputs, outer)
        if len(results) != count:
            raise self.ctx.error(f"graph {name!r} gives {len(results)} output(s), "
                                 f"{count} expected")
        return results

    def _flag(self, value: Any, what: str) -> bool:
        if not isinstance(value, np.ndarray) or value.size != 1:
            raise self.ctx.error(f"{what} must be a tensor of one element, "
                                 f"got {getattr(value, 'shape', type(value).__name__)}")
        return bool(value.reshape(-1)[0])

    def _empty(self, index: int) -> np.ndarray:
        """Output ``index`` as a stack of no iterations (its element type, no elements)."""
        element_type = (self.ctx.output_types[index]
                        if index < len(self.ctx.output_types) else None)
        return np.empty((0,), numpy_dtype(element_type) if element_type else np.float32)


class If(ControlFlow):
    op_type = "If"
    graphs = ("then_branch", "else_branch")

    def run(self, *values: Any) -> Values:
        (cond,), outer = self._split(values)
        branch = "then_branch" if self._flag(cond, "cond") else "else_branch"
        return self._call(branch, (), outer, self.ctx.num_outputs)


class Loop(ControlFlow):
    """``M`` iterations at most (none given: no bound) while ``cond`` holds (none: always);
    the body gets the iteration number, the condition and the carried values and gives the
    next condition, the carried values and this iteration's scan outputs, which are stacked."""

    op_type = "Loop"

    def run(self, *values: Any) -> Values:
        (trip_count, cond, *carried), outer = self._split(values)
        bound = None if trip_count is None else int(np.asarray(trip_count).reshape(-1)[0])
        keep = True if cond is None else self._flag(cond, "cond")
        scanned: list[list[Any]] = [[] for _ in range(self.ctx.num_outputs - len(carried))]
        count = 1 + len(carried) + len(scanned)
        iteration = 0
        while keep and (bound is None or iteration < bound):
            results = self._call("body", (np.array(iteration, np.int64), np.array(keep), *carried),
                                 outer, count)
            keep = self._flag(results[0], "the body's condition output")
            carried = results[1:1 + len(carried)]
            for pieces, piece in zip(scanned, results[1 + len(carried):], strict=True):
                pieces.append(piece)
            iteration += 1
        stacked = [np.stack(pieces) if pieces else self._empty(len(carried) + index)
                   for index, pieces in enumerate(scanned)]
        return [*carried, *stacked]


class Scan(ControlFlow):
    """The body runs once per slice of the scan inputs along their axes (forward, or backward
    where ``scan_input_directions`` says 1), with the state carried from one slice to the next;
    its scan outputs are stacked along ``scan_output_axes``. Scan-8 has a batch axis first and
    the scan axis second (each batch entry scanned on its own) and an optional first input,
    ``sequence_lens``, which must give the full length."""

    op_type = "Scan"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.num_scan_inputs = ctx.attribute("num_scan_inputs")
        if self.num_scan_inputs is None or self.num_scan_inputs < 1:
            raise ctx.error(f"attribute 'num_scan_inputs' must be 1 or more, "
                            f"got {self.num_scan_inputs}")
        self.batched = ctx.opset < 9
        states = ctx.num_inputs - self.num_scan_inputs - self.batched
        if states < 0:
            raise ctx.error(f"{ctx.num_inputs} input(s) cannot hold "
                            f"{self.num_scan_inputs} scan input(s)")
        scans, outputs = self.num_scan_inputs, ctx.num_outputs - states
        self.num_states = states
        self.input_axes = self._list("scan_input_axes", scans, 0)
        self.input_directions = self._list("directions" if self.batched else
                                           "scan_input_directions", scans, 0)
        self.output_axes = self._list("scan_output_axes", outputs, 0)
        self.output_directions = self._list("scan_output_directions", outputs, 0)

    def _list(self, name: str, count: int, default: int) -> list[int]:
        values = self.ctx.attribute(name)
        if values is None:
            return [default] * count
        if len(values) != count:
            raise self.ctx.error(f"attribute {name!r} has {len(values)} value(s), "
                                 f"{count} expected")
        return [int(v) for v in values]

    def run(self, *values: Any) -> Values:
        inputs, outer = self._split(values)
        if not self.batched:
            return self._scan(inputs[:self.num_states], inputs[self.num_states:], outer)
        lengths, *inputs = inputs
        states, xs = inputs[:self.num_states], inputs[self.num_states:]
        batch = xs[0].shape[0]
        if lengths is not None and np.any(np.asarray(lengths) != xs[0].shape[1]):
            raise self.ctx.error(f"sequence_lens {np.asarray(lengths).tolist()} must all be "
                                 f"the scan length {xs[0].shape[1]}")
        per_entry = [self._scan([s[b] for s in states], [x[b] for x in xs], outer)
                     for b in range(batch)]
        return [np.stack([entry[i] for entry in per_entry]) for i in range(self.ctx.num_outputs)]

    def _scan(self, states: Sequence[np.ndarray], xs: Sequence[np.ndarray],
              outer: Sequence[Any]) -> Values:
        axes = [normalize_axis(self.ctx, axis, x.ndim) for axis, x in zip(self.input_axes, xs,
                                                                          strict=True)]
        lengths = {x.shape[axis] for axis, x in zip(axes, xs, strict=True)}
        if len(lengths) != 1:
            raise self.ctx.error(f"the scan inputs have different lengths {sorted(lengths)} "
                                 "along their scan axes")
        length = lengths.pop()
        states = list(states)
        count = self.ctx.num_outputs
        scanned: list[list[Any]] = [[] for _ in range(count - len(states))]
        for step in range(length):
            slices = [x[(slice(None),) * axis + (length - 1 - step if backward else step,)]
                      for x, axis, backward in zip(xs, axes, self.input_directions, strict=True)]
            results = self._call("body", (*states, *slices), outer, count)
            states = results[:len(states)]
            for pieces, piece in zip(scanned, results[len(states):], strict=True):
                pieces.append(piece)
        stacked = []
        for index, (pieces, axis, backward) in enumerate(zip(
                scanned, self.output_axes, self.output_directions, strict=True)):
            if not pieces:
                stacked.append(self._empty(len(states) + index))
                continue
            ordered = pieces[::-1] if backward else pieces
            stacked.append(np.stack(ordered, normalize_axis(self.ctx, axis, pieces[0].ndim + 1)))
        return [*states, *stacked]


class SequenceMap(ControlFlow):
    """The body once per element of the input sequence; each additional input is passed as
    it is (a tensor) or element by element (a sequence of the same length)."""

    op_type = "SequenceMap"

    def run(self, *values: Any) -> Values:
        (sequence, *others), outer = self._split(values)
        for other in [sequence, *others]:
            if isinstance(other, list) and len(other) != len(sequence):
                raise self.ctx.error(f"the input sequences have different lengths "
                                     f"({len(sequence)} and {len(other)})")
        if not isinstance(sequence, list):
            raise self.ctx.error(f"input 0 must be a sequence, got {type(sequence).__name__}")
        mapped: list[Values] = [[] for _ in range(self.ctx.num_outputs)]
        for index, element in enumerate(sequence):
            inputs = [element, *(o[index] if isinstance(o, list) else o for o in others)]
            for outputs, result in zip(mapped, self._call("body", inputs, outer,
                                                          self.ctx.num_outputs), strict=True):
                outputs.append(result)
        return mapped


# One class serves every since-version: later versions only take more element types.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(If, (1, 11, 13, 16, 19, 21, 23, 24, 25)),
    declare(Loop, (1, 11, 13, 16, 19, 21, 23, 24, 25)),
    declare(Scan, (8, 9, 11, 16, 19, 21, 23, 24, 25)),
    declare(SequenceMap, (17,)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
