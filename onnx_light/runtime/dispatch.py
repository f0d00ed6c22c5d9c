"""Dispatch: (domain, op type, opset) -> kernel class, from the kernel library's table.

The table maps ``op_type -> {since_version: class}``; the kernel chosen is the
one with the highest ``since_version`` not above the model's opset, as ONNX's
own versioning rules say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..kernels.base import Kernel

__all__ = ["ONNX_DOMAINS", "UnsupportedOperator", "UnsupportedOperatorError", "find_kernel"]

ONNX_DOMAINS = frozenset({"", "ai.onnx"})
KernelTable = Mapping[str, Mapping[int, type[Kernel]]]


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


def find_kernel(table: KernelTable, domain: str, op_type: str,
                opset: int | None) -> type[Kernel] | UnsupportedOperator:
    """The kernel class for an operator at an opset, or why there is none."""
    if domain not in ONNX_DOMAINS:
        return UnsupportedOperator(domain, op_type, opset, f"domain {domain!r} is not supported")
    if opset is None:
        return UnsupportedOperator(domain, op_type, opset, "the model imports no opset for the domain")
    versions = table.get(op_type)
    if not versions:
        return UnsupportedOperator(domain, op_type, opset, "operator not implemented")
    eligible = [v for v in versions if v <= opset]
    if not eligible:
        return UnsupportedOperator(
            domain, op_type, opset,
            f"implemented from opset {min(versions)} on, the model uses opset {opset}")
    return versions[max(eligible)]
