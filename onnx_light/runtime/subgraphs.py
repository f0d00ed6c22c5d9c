"""Subgraphs: the graphs of If, Loop, Scan and SequenceMap nodes, run as nested plans.

The session asks :func:`attach_subgraphs` for each node it dispatches. For a control-flow
kernel (:class:`~onnx_light.kernels.control_flow.ControlFlow`) it dispatches every node of
each graph attribute the way the session dispatches its own (the same function, so the same
operators, opsets and element types are taken and refused; an unsupported operator in a body
is listed with the top-level ones), recursively for control flow inside a body, and returns
the kernels it built: the session configures them with its own, from its one registry
snapshot, bound to its pool, so a body runs the parent's tuned kernels with the parent's
thread count. Each graph becomes a :class:`Subgraph`, a callable plan the kernel runs once
per branch taken or iteration.

A graph may read values of the graphs around it (outer scope: :func:`free_names`). The node
lists them after its own inputs (``ControlFlow.outer_names``); the session gives them slots
in its plan like any input, so they stay alive until the node has run and the plan's
dependencies (folding, fusion, branches) see them. A nested plan writes each run's values to
a list of its own, so one body may run on several threads at once; an error names the node,
the graph attribute and the control-flow node around it, at every level. A run's node hook
(``RuntimeSession.run(node_hook=...)``) is called around every step of a body too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..kernels.base import Kernel, KernelError, NodeContext
from ..kernels.control_flow import ControlFlow
from .execution import HookError, body_hook

if TYPE_CHECKING:  # dispatch imports this module
    from .dispatch import UnsupportedOperator

__all__ = ["Subgraph", "attach_subgraphs", "free_names", "op_types", "outer_names"]

#: The session's dispatch of one node: ``(node, index in its graph, opsets, value types)``.
Dispatch = Callable[
    [onnx.NodeProto, int, Mapping[str, int], Mapping[str, onnx.TypeProto]], "Kernel | UnsupportedOperator"
]


def free_names(graph: onnx.GraphProto) -> tuple[str, ...]:
    """The names ``graph`` (with the graphs inside it) reads but does not define: the outer
    values it needs, in the order it first reads them."""
    defined = {info.name for info in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    read: dict[str, None] = {}
    for node in graph.node:
        inner = (
            name
            for attribute in node.attribute
            if attribute.type == onnx.AttributeProto.GRAPH
            for name in free_names(attribute.g)
        )
        for name in (*node.input, *inner):
            if name and name not in defined:
                read[name] = None
        defined.update(name for name in node.output if name)
    read.update((info.name, None) for info in graph.output if info.name not in defined)
    return tuple(read)


def op_types(node: onnx.NodeProto) -> frozenset[str]:
    """The operators of a node and of the nodes of every graph inside it (what folding asks:
    a Loop whose body draws random numbers is not deterministic)."""
    found = {node.op_type}
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            for inner in attribute.g.node:
                found |= op_types(inner)
    return frozenset(found)


def outer_names(kernel: Kernel) -> tuple[str, ...]:
    """The outer values a node's graphs read, which its step takes after the node's inputs."""
    return kernel.outer_names if isinstance(kernel, ControlFlow) else ()


# A nested plan's step: (bound run, input slots, output slots, node name, op type). Slot -2
# holds None for every omitted input, slot -1 takes every omitted output.
_Step = tuple[Callable[..., Sequence[Any]], tuple[int, ...], tuple[int, ...], str, str]
_ABSENT, _DISCARDED = -2, -1


@dataclass(frozen=True)
class Subgraph:
    """One graph attribute as a plan: ``subgraph(inputs, outer)`` runs it on the graph's
    inputs and the node's outer values and returns the graph's outputs."""

    where: str  # "graph 'body' of node 'loop' (Loop)"
    template: tuple[Any, ...]  # a run's values before it starts: constants, then None, None
    input_slots: tuple[int, ...]
    outer_slots: tuple[tuple[int, int], ...]  # (position among the outer values, slot)
    steps: tuple[_Step, ...]
    output_slots: tuple[int, ...]

    def __call__(self, inputs: Sequence[Any], outer: Sequence[Any]) -> list[Any]:
        if len(inputs) != len(self.input_slots):
            raise KernelError(f"{self.where} takes {len(self.input_slots)} input(s), {len(inputs)} given")
        values = list(self.template)
        for s, value in zip(self.input_slots, inputs, strict=True):
            values[s] = value
        for position, s in self.outer_slots:
            values[s] = outer[position]
        hook = body_hook()
        for run, step_inputs, step_outputs, node, op_type in self.steps:
            done = None if hook is None else self._hook(hook, node, op_type)
            try:
                results = run(*[values[s] for s in step_inputs])
            except HookError:
                raise
            except KernelError as exc:
                raise KernelError(f"{exc}, in {self.where}") from exc
            except Exception as exc:
                raise KernelError(
                    f"node {node!r} ({op_type}) in {self.where} failed: "
                    f"{type(exc).__name__}: {str(exc) or '(no message)'}"
                ) from exc
            if done is not None:
                done()
            for s, result in zip(step_outputs, results, strict=False):
                values[s] = result
        return [values[s] for s in self.output_slots]

    @staticmethod
    def _hook(hook: Callable[[str, str], Any], node: str, op_type: str) -> Any:
        try:
            return hook(node, op_type)
        except Exception as exc:  # raised as it is by the execute around
            raise HookError(exc) from exc


def _graph_types(graph: onnx.GraphProto) -> dict[str, onnx.TypeProto]:
    """The declared and inferred types of a graph's own values, by name."""
    types = {t.name: onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)) for t in graph.initializer}
    types.update((info.name, info.type) for info in (*graph.value_info, *graph.input, *graph.output))
    return types


def _build(
    graph: onnx.GraphProto,
    attribute: str,
    owner: NodeContext,
    outer: Sequence[str],
    types: Mapping[str, onnx.TypeProto],
    opsets: Mapping[str, int],
    dispatch: Dispatch,
    unsupported: list[UnsupportedOperator],
    built: list[Kernel],
) -> Subgraph | None:
    """One graph as a :class:`Subgraph` (None when an operator in it is unsupported)."""
    where = f"graph {attribute!r} of node {owner.name!r} ({owner.op_type})"
    local_types = {**types, **_graph_types(graph)}
    slots: dict[str, int] = {}

    def slot(name: str) -> int:
        return slots.setdefault(name, len(slots))

    constants: dict[int, np.ndarray] = {}
    for initializer in graph.initializer:
        array = numpy_helper.to_array(initializer)
        array.flags.writeable = False  # kernels must never change shared data
        constants[slot(initializer.name)] = array
    input_slots = tuple(slot(info.name) for info in graph.input)
    reads = set(free_names(graph))
    outer_slots = tuple((position, slot(name)) for position, name in enumerate(outer) if name in reads)
    steps, complete = [], True
    for index, node in enumerate(graph.node):
        try:
            found = dispatch(node, index, opsets, local_types)
            nested = (
                attach_subgraphs(found, node, local_types, opsets, dispatch, unsupported)
                if isinstance(found, Kernel)
                else []
            )
        except KernelError as exc:  # a node the kernel refuses (its attributes, say)
            raise KernelError(f"{exc}, in {where}") from None
        if not isinstance(found, Kernel):  # an UnsupportedOperator
            if found not in unsupported:
                unsupported.append(found)
            complete = False
            continue
        built += [found, *nested]
        inputs = tuple(slot(name) if name else _ABSENT for name in (*node.input, *outer_names(found)))
        outputs = tuple(slot(name) if name else _DISCARDED for name in node.output)
        steps.append((found.run, inputs, outputs, found.ctx.name, found.ctx.op_type))
    if not complete:
        return None
    missing = [info.name for info in graph.output if info.name not in slots]
    if missing:
        raise KernelError(f"outputs {missing} of {where} are produced by no node")
    template = [None] * (len(slots) + 2)  # the last two: _ABSENT and _DISCARDED
    for s, array in constants.items():
        template[s] = array
    return Subgraph(
        where,
        tuple(template),
        input_slots,
        outer_slots,
        tuple(steps),
        tuple(slots[info.name] for info in graph.output),
    )


def attach_subgraphs(
    kernel: Kernel,
    node: onnx.NodeProto,
    types: Mapping[str, onnx.TypeProto],
    opsets: Mapping[str, int],
    dispatch: Dispatch,
    unsupported: list[UnsupportedOperator],
) -> list[Kernel]:
    """Build the graphs of ``kernel``'s node (``node`` with its graphs' inferred value types)
    and attach them; returns the kernels of every graph inside, for the session to configure
    (none for a node without graphs). Unsupported operators are added to ``unsupported``.

    ``types``: the types of the values the node's graph defines and sees (its outer scope).
    """
    if not isinstance(kernel, ControlFlow):
        return []
    graphs = [a for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
    outer = tuple(dict.fromkeys(name for a in graphs for name in free_names(a.g)))
    built: list[Kernel] = []
    bodies = {
        a.name: _build(a.g, a.name, kernel.ctx, outer, types, opsets, dispatch, unsupported, built)
        for a in graphs
    }
    if all(body is not None for body in bodies.values()):
        kernel.attach(bodies, outer, op_types(node))
    return built
