"""Dispatch: (domain, op type, opset, element type) -> kernel class, from the kernel
library's declarations.

The declarations map ``(domain, op_type)`` to a
:class:`~onnx_light.kernels.declaration.KernelDeclaration` (the default domain is ``''``,
which a model may also spell ``'ai.onnx'``); the version in force is the highest
``since_version`` not above the opset the model imports for the node's domain, as ONNX's own
versioning rules say, and the node's element type must be one that version of the kernel takes.
:func:`dispatch_graph` is the first step of a session's construction: one kernel per node,
built from its context (attributes, element types), or every unsupported operator at once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx

from ..kernels import DECLARATIONS, contrib
from ..kernels.base import Kernel, NodeContext
from ..kernels.declaration import KernelDeclaration, declarations_by_op
from .loading import tensor_array, tensor_element_type
from .subgraphs import attach_subgraphs

__all__ = ["CONTRIB_DOMAIN", "ONNX_DOMAINS", "SUPPORTED_DOMAINS", "UnsupportedOperator",
           "UnsupportedOperatorError", "canonical_domain", "declaration_table", "dispatch_graph",
           "dispatch_node", "find_kernel"]

#: The domains ONNX defines whose operators onnx_light implements (``''`` and ``'ai.onnx'``
#: both name the default domain).
ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
#: onnxruntime's domain of the operators its quantizer and transformer optimizer write
#: (``kernels/contrib``); onnx defines no schemas for them, and each is at version 1.
CONTRIB_DOMAIN = contrib.DOMAIN
#: Every domain whose operators onnx_light implements.
SUPPORTED_DOMAINS = ONNX_DOMAINS | {CONTRIB_DOMAIN}
Declarations = Mapping[tuple[str, str], KernelDeclaration]


def canonical_domain(domain: str) -> str:
    """A node's domain as the declarations name it: ``'ai.onnx'`` is the default domain ``''``."""
    return "" if domain == "ai.onnx" else domain


@dataclass(frozen=True)
class UnsupportedOperator:
    """One operator a model uses that onnx_light cannot run, and why."""

    domain: str
    op_type: str
    opset: int | None
    reason: str
    node: str | None = field(default=None, compare=False)  # the first node found using it

    def __str__(self) -> str:
        domain = self.domain or "ai.onnx"
        node = "" if self.node is None else f" (node {self.node!r})"
        return f"{domain}::{self.op_type} (opset {self.opset}): {self.reason}{node}"


class UnsupportedOperatorError(ValueError):
    """A model uses operators onnx_light cannot run; lists every one of them."""

    def __init__(self, operators: list[UnsupportedOperator]) -> None:
        self.operators = operators
        lines = "\n  ".join(str(op) for op in operators)
        super().__init__(f"the model uses {len(operators)} unsupported operator(s):\n  {lines}")


def find_kernel(declarations: Declarations, domain: str, op_type: str, opset: int | None,
                ctx: NodeContext | None = None,
                since_version: int | None = None, node: str | None = None
                ) -> type[Kernel] | UnsupportedOperator:
    """The kernel class for an operator of a domain at the opset the model imports for that
    domain, or why there is none (naming ``node``, or the context's node).

    With the node's context the element type is checked too, and with ``since_version`` (the
    operator's version at the opset, from the onnx that checked the model) a version newer
    than the kernel's is refused; without them only the operator and the opset are, enough
    to tell whether a model's operators are implemented at all.
    """
    node = node if ctx is None else ctx.name
    if domain not in SUPPORTED_DOMAINS:
        return UnsupportedOperator(domain, op_type, opset, f"domain {domain!r} is not supported "
                                   f"(supported: {sorted(SUPPORTED_DOMAINS)})", node)
    if opset is None:
        return UnsupportedOperator(domain, op_type, opset,
                                   "the model imports no opset for the domain", node)
    declaration = declarations.get((canonical_domain(domain), op_type))
    if declaration is None:
        return UnsupportedOperator(domain, op_type, opset, "operator not implemented", node)
    element_type = None if ctx is None else declaration.kernel.element_type_of(ctx)
    reason = declaration.refusal(opset, element_type, since_version)
    if reason is not None:
        return UnsupportedOperator(domain, op_type, opset, reason, node)
    return declaration.kernel


@functools.cache
def _since_version(domain: str, op_type: str, opset: int) -> int | None:
    """The version of an ONNX operator of ``domain`` in force at ``opset``, as the installed
    onnx defines it; None for an operator it does not know, and for the contrib domain's
    (onnx has no schemas for them)."""
    if domain not in ONNX_DOMAINS:
        return None
    try:
        return onnx.defs.get_schema(op_type, opset, canonical_domain(domain)).since_version
    except onnx.defs.SchemaError:
        return None


def _attribute_value(attribute: onnx.AttributeProto) -> Any:
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return tensor_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    if isinstance(value, list) and value and isinstance(value[0], onnx.TensorProto):
        return [tensor_array(v) for v in value]
    return value


def dispatch_node(node: onnx.NodeProto, index: int, opsets: Mapping[str, int],
                  types: Mapping[str, onnx.TypeProto],
                  declarations: Declarations) -> Kernel | UnsupportedOperator:
    """One node's kernel (``index``: the node's place in its graph, for a name), built from its
    context (attributes, and element types from ``types``), or why there is none."""
    domain = node.domain or ""
    opset = opsets.get(domain)
    ctx = None if opset is None or domain not in SUPPORTED_DOMAINS else NodeContext(
        name=node.name or f"{node.op_type}_{index}",
        op_type=node.op_type,
        domain=node.domain,
        opset=opset,
        attributes={a.name: _attribute_value(a) for a in node.attribute},
        input_types=tuple(tensor_element_type(types.get(n)) if n else None for n in node.input),
        output_types=tuple(tensor_element_type(types.get(n)) if n else None for n in node.output),
        num_inputs=len(node.input),
        num_outputs=len(node.output),
        omitted_inputs=frozenset(i for i, name in enumerate(node.input) if not name),
    )
    found = find_kernel(declarations, domain, node.op_type, opset, ctx,
                        None if ctx is None else _since_version(domain, node.op_type, opset),
                        node=node.name or f"{node.op_type}_{index}")
    return found if isinstance(found, UnsupportedOperator) else found(ctx)


def dispatch_graph(graph: onnx.GraphProto, inferred: onnx.GraphProto, opsets: Mapping[str, int],
                   types: Mapping[str, onnx.TypeProto], declarations: Declarations
                   ) -> tuple[list[Kernel], list[Kernel]]:
    """One kernel per node of ``graph``, in order, and the kernels of the graphs inside its
    control-flow nodes, built and attached as nested plans (``runtime/subgraphs.py``, from
    ``inferred``: the graph with its inner graphs' inferred types); raises
    :class:`UnsupportedOperatorError` listing every operator no declaration runs, in a body too."""
    dispatch = functools.partial(dispatch_node, declarations=declarations)
    kernels: list[Kernel] = []
    nested: list[Kernel] = []
    unsupported: list[UnsupportedOperator] = []
    for index, node in enumerate(graph.node):
        found = dispatch(node, index, opsets, types)
        if isinstance(found, UnsupportedOperator):
            if found not in unsupported:
                unsupported.append(found)
            continue
        kernels.append(found)
        nested += attach_subgraphs(found, inferred.node[index], types, opsets, dispatch,
                                   unsupported)
    if unsupported:
        raise UnsupportedOperatorError(unsupported)
    return kernels, nested


def declaration_table(declarations: Mapping[Any, KernelDeclaration] | Iterable[KernelDeclaration]
                      | None) -> Declarations:
    """The session's dispatch table: ours by default, else the given mapping (keyed by
    ``(domain, op_type)`` as ``kernels.DECLARATIONS`` is, or by ``op_type`` alone for the
    default domain) or declarations, by domain and operator (one declared twice is an error)."""
    if declarations is None:
        return DECLARATIONS
    if isinstance(declarations, Mapping):
        table = {}
        for key, value in declarations.items():
            expected = key if isinstance(key, tuple) else ("", key)
            if not isinstance(value, KernelDeclaration) or (value.domain, value.op_type) != expected:
                raise TypeError(f"declarations[{key!r}] must be the KernelDeclaration of "
                                f"{expected[0] + '::' if expected[0] else ''}{expected[1]}, got {value!r}")
            table[expected] = value
        return table
    if isinstance(declarations, (str, bytes)) or not isinstance(declarations, Iterable):
        raise TypeError(f"declarations must be a mapping (domain, op_type) -> KernelDeclaration "
                        f"or KernelDeclarations, got {type(declarations).__name__}")
    listed = list(declarations)
    wrong = [d for d in listed if not isinstance(d, KernelDeclaration)]
    if wrong:
        raise TypeError(f"declarations must be KernelDeclarations, got {wrong[0]!r}")
    return declarations_by_op(listed)
