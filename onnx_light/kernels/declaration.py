"""Kernel declarations: each kernel family stated once, for dispatch and for the tuning registry.

A :class:`KernelDeclaration` says which operator of which ONNX domain (``''``, the default
domain, or ``'ai.onnx.ml'``) a kernel class implements, under which since-versions and for
which element types at each, and, for a tunable kernel, its schema factory and calibration
callback. The library's dispatch table and :func:`~onnx_light.kernels.register` are both
derived from the declarations, so the facts cannot disagree; the kernel's tuning key is built
here, once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..tuning.keys import KernelTuningKey, element_type_name
from ..tuning.schema import KernelTuningSchema, Parameter, Validator

if TYPE_CHECKING:
    from .base import Kernel, NodeContext

__all__ = ["KernelDeclaration", "Required", "RequiredInput", "declarations_by_op", "declare",
           "dispatch_table"]

#: The parameters of a tunable kernel's schema for one element type (None: not known).
ParameterFactory = Callable[[int | None], Sequence[Parameter]]
#: ``calibrate(declaration, key, descriptor, budget)``: the registry's callback, given its kernel.
Calibrate = Callable[..., Any]


@dataclass(frozen=True)
class Required:
    """An attribute a node must set under the opsets from ``since`` to before ``before``
    (where a later version of the operator made it optional or turned it into an input)."""

    attribute: str
    before: int
    since: int = 1

    def missing(self, ctx: NodeContext) -> str | None:
        if self.since <= ctx.opset < self.before and ctx.attribute(self.attribute) is None:
            return f"attribute {self.attribute!r} is required before opset {self.before}"
        return None


@dataclass(frozen=True)
class RequiredInput:
    """An input, optional in later versions, that a node must give under the opsets from
    ``since`` to before ``before`` (Gemm's C before opset 11)."""

    index: int
    name: str
    before: int
    since: int = 1

    def missing(self, ctx: NodeContext) -> str | None:
        if self.since <= ctx.opset < self.before and not ctx.given(self.index):
            return f"input {self.name} is required before opset {self.before} (opset {ctx.opset})"
        return None


@dataclass(frozen=True, eq=False)
class KernelDeclaration:
    """One kernel family: its operator, since-versions with their element types, class,
    schema factory, calibration callback and ONNX domain (``''``: the default domain).

    ``versions`` maps each ONNX since-version the class implements to the element types it
    takes there (None: any type; the kernel checks its inputs itself). ``library`` names the
    kernel library in the tuning keys; by default the top-level package of the kernel's
    module (``onnx_light`` for ours, a user's own package for theirs). ``required``: the
    attributes and inputs some versions require (checked when a kernel is built, :meth:`missing`).
    """

    op_type: str
    kernel: type[Kernel]
    versions: Mapping[int, tuple[int, ...] | None]
    parameters: ParameterFactory | None = None
    validator: Validator | None = None
    calibrate: Calibrate | None = None
    library: str = ""
    required: tuple[Required | RequiredInput, ...] = ()
    domain: str = ""

    def __post_init__(self) -> None:
        if not self.library:
            object.__setattr__(self, "library", self.kernel.__module__.partition(".")[0])
        if not self.versions:
            raise ValueError(f"{self.op_type}: a declaration needs at least one since-version")
        if self.calibrate is not None and self.parameters is None:
            raise ValueError(f"{self.op_type}: a calibration callback needs a schema factory")
        object.__setattr__(self, "versions", MappingProxyType(dict(sorted(self.versions.items()))))

    @property
    def tunable(self) -> bool:
        """Whether the kernel has tuning schemas."""
        return self.parameters is not None

    @property
    def element_types(self) -> tuple[int, ...]:
        """Every element type some version takes, in declaration order (the tuning keys' types)."""
        seen: dict[int, None] = {}
        for types in self.versions.values():
            seen.update(dict.fromkeys(types or ()))
        return tuple(seen)

    def version(self, opset: int) -> int | None:
        """The since-version in force at ``opset`` (the newest not above it), or None."""
        usable = [v for v in self.versions if v <= opset]
        return max(usable) if usable else None

    def refusal(self, opset: int, element_type: int | None,
                since_version: int | None = None) -> str | None:
        """Why the kernel cannot run the operator at ``opset`` on ``element_type``, or None.

        ``since_version``: the operator's version at ``opset`` as the installed onnx defines
        it, when known; one newer than every declared version is refused rather than run with
        an older version's meaning.
        """
        version = self.version(opset)
        if version is None:
            return (f"{self.op_type} is implemented from opset {min(self.versions)} on, "
                    f"the model uses opset {opset}")
        if since_version is not None and since_version > version:
            return (f"{self.op_type}-{since_version} (opset {opset}) is newer than the kernel, "
                    f"which implements since-versions {list(self.versions)}")
        allowed = self.versions[version]
        if element_type is None or allowed is None or element_type in allowed:
            return None
        return (f"{self.op_type}-{version} (opset {opset}) does not take element type "
                f"{element_type_name(element_type)}; it takes "
                f"{[element_type_name(t) for t in allowed]}")

    def missing(self, ctx: NodeContext) -> str | None:
        """Which attribute or input the node's opset requires and the node does not give, or
        None."""
        for rule in self.required:
            reason = rule.missing(ctx)
            if reason is not None:
                return reason
        return None

    @functools.cache  # noqa: B019 (declarations live as long as the process)
    def key(self, element_type: int) -> KernelTuningKey:
        """The exact tuning key of this kernel for ``element_type``."""
        kernel = self.kernel
        return KernelTuningKey(self.library, self.op_type, kernel.implementation, element_type, "cpu",
                               kernel.tuning_abi)

    @functools.cache  # noqa: B019 (declarations live as long as the process)
    def schema(self, element_type: int) -> KernelTuningSchema:
        """The tuning schema of one element type the kernel takes."""
        if self.parameters is None:
            raise ValueError(f"{self.op_type} is not tunable: it has no schema")
        if element_type not in self.element_types:
            raise ValueError(f"no {self.op_type} schema for element type "
                             f"{element_type_name(element_type)}; valid: "
                             f"{[element_type_name(t) for t in self.element_types]}")
        return KernelTuningSchema(self.key(element_type), tuple(self.parameters(element_type)),
                                  self.validator, self.kernel.tuning_revision)

    def schemas(self) -> list[KernelTuningSchema]:
        """One schema per element type (none if the kernel is not tunable)."""
        return [self.schema(t) for t in self.element_types] if self.tunable else []

    def callbacks(self) -> dict[KernelTuningKey, Callable[..., Any]]:
        """The calibration callback under each of the kernel's keys."""
        if self.calibrate is None:
            return {}
        callback = functools.partial(self.calibrate, self)
        return {self.key(t): callback for t in self.element_types}


def declare(kernel: type[Kernel], versions: Iterable[int], *,
            types: tuple[int, ...] | Mapping[int, tuple[int, ...]] | None = None,
            op_type: str | None = None, parameters: ParameterFactory | None = None,
            validator: Validator | None = None, calibrate: Calibrate | None = None,
            library: str = "", required: Iterable[Required | RequiredInput] = (),
            domain: str = "") -> KernelDeclaration:
    """The one dispatch row helper: ``kernel`` declared for its since-``versions`` and bound
    to the class.

    ``types``: the element types every version takes, or where they change, a mapping
    ``since-version -> types`` in force from that version on; None leaves the types to the
    kernel. ``library``: the tuning keys' library name (default: the kernel's top-level
    package, see :class:`KernelDeclaration`); ``required``: attributes and inputs some versions require;
    ``domain``: the operator's ONNX domain (``''``: the default domain).
    """
    versions = sorted(versions)
    if isinstance(types, Mapping):
        changes = sorted(types)
        if changes[0] > versions[0]:
            raise ValueError(f"{kernel.__name__}: no element types for since-version {versions[0]}")
        by_version = {v: types[max(c for c in changes if c <= v)] for v in versions}
    else:
        by_version = dict.fromkeys(versions, types)
    declaration = KernelDeclaration(op_type or kernel.op_type, kernel, by_version, parameters,
                                    validator, calibrate, library, tuple(required), domain)
    if kernel.__dict__.get("declaration") is not None:
        raise ValueError(f"{kernel.__name__} is declared twice")
    kernel.declaration = declaration
    return declaration


def declarations_by_op(*groups: Iterable[KernelDeclaration]
                       ) -> dict[tuple[str, str], KernelDeclaration]:
    """The declarations of several modules by ``(domain, op_type)``; an operator declared
    twice is an error."""
    merged: dict[tuple[str, str], KernelDeclaration] = {}
    for group in groups:
        for declaration in group:
            operator = (declaration.domain, declaration.op_type)
            if operator in merged:
                raise ValueError(f"operator {declaration.domain or 'ai.onnx'}::"
                                 f"{declaration.op_type} is declared twice")
            merged[operator] = declaration
    return merged


def dispatch_table(declarations: Iterable[KernelDeclaration]) -> dict[str, dict[int, type[Kernel]]]:
    """``op_type -> {since_version: kernel class}`` of one domain, derived from the declarations."""
    by_op = declarations_by_op(declarations)
    domains = {domain for domain, _ in by_op}
    if len(domains) > 1:
        raise ValueError(f"a dispatch table is one domain's; the declarations span {sorted(domains)}")
    return {op_type: dict.fromkeys(d.versions, d.kernel) for (_, op_type), d in by_op.items()}
