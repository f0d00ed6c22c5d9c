"""Dispatch: (domain, op type, opset, element type) -> kernel class, from the kernel
library's declarations.

The declarations map ``op_type`` to a
:class:`~onnx_light.kernels.declaration.KernelDeclaration`; the version in force is the
highest ``since_version`` not above the model's opset, as ONNX's own versioning rules say,
and the node's element type must be one that version of the kernel takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..kernels.base import Kernel, NodeContext
from ..kernels.declaration import KernelDeclaration

__all__ = ["ONNX_DOMAINS", "UnsupportedOperator", "UnsupportedOperatorError", "find_kernel"]

ONNX_DOMAINS = frozenset({"", "ai.onnx"})
Declarations = Mapping[str, KernelDeclaration]


@dataclass(frozen=True)
class UnsupportedOperator:
    """One operator a model uses that onnx_light cannot run, and why."""

    domain: str
    op_type: str
    opset: int | None
    reason: str

    def __str__(self) -> str:
        domain = self.domain or "ai.onnx"
        return f"{domain}::{self.op_type} (opset {self.opset}): {self.reason}"


class UnsupportedOperatorError(ValueError):
    """A model uses operators onnx_light cannot run; lists every one of them."""

    def __init__(self, operators: list[UnsupportedOperator]) -> None:
        self.operators = operators
        lines = "\n  ".join(str(op) for op in operators)
        super().__init__(f"the model uses {len(operators)} unsupported operator(s):\n  {lines}")


def find_kernel(declarations: Declarations, domain: str, op_type: str, opset: int | None,
                ctx: NodeContext | None = None,
                since_version: int | None = None) -> type[Kernel] | UnsupportedOperator:
    """The kernel class for an operator at an opset, or why there is none.

    With the node's context the element type is checked too, and with ``since_version`` (the
    operator's version at the opset, from the onnx that checked the model) a version newer
    than the kernel's is refused; without them only the operator and the opset are, enough
    to tell whether a model's operators are implemented at all.
    """
    if domain not in ONNX_DOMAINS:
        return UnsupportedOperator(domain, op_type, opset, f"domain {domain!r} is not supported")
    if opset is None:
        return UnsupportedOperator(domain, op_type, opset, "the model imports no opset for the domain")
    declaration = declarations.get(op_type)
    if declaration is None:
        return UnsupportedOperator(domain, op_type, opset, "operator not implemented")
    element_type = None if ctx is None else declaration.kernel.element_type_of(ctx)
    reason = declaration.refusal(opset, element_type, since_version)
    if reason is not None:
        return UnsupportedOperator(domain, op_type, opset, reason)
    return declaration.kernel
