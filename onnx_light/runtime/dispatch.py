"""Dispatch: (domain, op type, opset, element type) -> kernel class, from the kernel
library's declarations.

The declarations map ``(domain, op_type)`` to a
:class:`~onnx_light.kernels.declaration.KernelDeclaration` (the default domain is ``''``,
which a model may also spell ``'ai.onnx'``); the version in force is the highest
``since_version`` not above the opset the model imports for the node's domain, as ONNX's own
versioning rules say, and the node's element type must be one that version of the kernel takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..kernels.base import Kernel, NodeContext
from ..kernels.declaration import KernelDeclaration

__all__ = ["ONNX_DOMAINS", "UnsupportedOperator", "UnsupportedOperatorError", "canonical_domain",
           "find_kernel"]

#: The domains ONNX defines whose operators onnx_light implements (``''`` and ``'ai.onnx'``
#: both name the default domain).
ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
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
    if domain not in ONNX_DOMAINS:
        return UnsupportedOperator(domain, op_type, opset, f"domain {domain!r} is not supported "
                                   f"(supported: {sorted(ONNX_DOMAINS)})", node)
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
