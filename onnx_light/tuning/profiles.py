"""Processor profiles: selectors, specificity, and ambiguity between profiles.

A kernel library ships values for processors it knows. Each profile has a
selector (an exact processor, a processor list, a microarchitecture or an
instruction set), an optional thread-count range and a priority. A selector
answers two questions about a processor: does it match, and if it does, how
specific is the match (its *rank*). Resolution picks the highest
``(rank, priority)``; registration rejects two profiles that could tie.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import archspec.cpu

from .keys import KernelTuningKey
from .processor.vendors import vendor_name
from .schema import Value

__all__ = [
    "SOURCES",
    "ExactProcessor",
    "InstructionSet",
    "Match",
    "Microarchitecture",
    "ProcessorList",
    "ProcessorProfile",
    "Selector",
    "profile_from_dict",
    "profiles_may_tie",
    "selector_from_dict",
]

# Resolution sources, most specific first (the spec's precedence).
PUBLISHED = "published_profile"
EXACT_PROCESSOR = "exact_processor_profile"
PROCESSOR_LIST = "processor_list_profile"
MICROARCHITECTURE = "microarchitecture_profile"
INSTRUCTION_SET = "instruction_set_profile"
PORTABLE_DEFAULT = "portable_default"
SOURCES = (PUBLISHED, EXACT_PROCESSOR, PROCESSOR_LIST, MICROARCHITECTURE, INSTRUCTION_SET,
           PORTABLE_DEFAULT)

# Precedence levels; processor lists and microarchitectures share one.
_LEVEL = {EXACT_PROCESSOR: 3, PROCESSOR_LIST: 2, MICROARCHITECTURE: 2, INSTRUCTION_SET: 1}

class CpuLike(Protocol):
    """What selectors read of a processor (see ``processor.CpuDescriptor``)."""

    vendor: str
    family: int | None
    model: int | None
    microarchitecture: str
    features: frozenset[str]


Rank = tuple[int, int]


@dataclass(frozen=True)
class Match:
    """Whether a selector covers a processor: the rank of a match, or why it does not match.

    Higher ranks are more specific. Build one with :meth:`ranked` or :meth:`refused`.
    """

    rank: Rank | None
    reason: str = ""

    def __post_init__(self) -> None:
        if (self.rank is None) == (not self.reason):
            raise ValueError("a match has either a rank or a reason, not both or neither")

    @classmethod
    def ranked(cls, level: int, order: int) -> Match:
        """A match at precedence ``level``, ordered by ``order`` within it."""
        return cls((level, order))

    @classmethod
    def refused(cls, reason: str) -> Match:
        """No match, and the sentence that says why."""
        return cls(None, reason)

    @property
    def applies(self) -> bool:
        """True for a match."""
        return self.rank is not None


class Selector(Protocol):
    """Decides whether a processor is covered, and how specifically."""

    source: str

    def match(self, cpu: CpuLike) -> Match:
        """The rank of a match, or a sentence saying why it does not match."""
        ...

    def describe(self) -> str:
        """A short readable form."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        ...


def _norm_vendor(vendor: str) -> str:
    if not isinstance(vendor, str) or not vendor:
        raise ValueError(f"vendor must be a non-empty string, got {vendor!r}")
    return vendor.lower()


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


@dataclass(frozen=True)
class ExactProcessor:
    """One processor model: vendor, family and model."""

    vendor: str
    family: int
    model: int
    source = EXACT_PROCESSOR

    def __post_init__(self) -> None:
        object.__setattr__(self, "vendor", _norm_vendor(self.vendor))
        _check_int("family", self.family)
        _check_int("model", self.model)

    def match(self, cpu: CpuLike) -> Match:
        seen = (cpu.vendor, cpu.family, cpu.model)
        if seen == (self.vendor, self.family, self.model):
            return Match.ranked(_LEVEL[self.source], 0)
        return Match.refused(
            f"processor is {seen[0]} family {seen[1]} model {seen[2]}, not {self.describe()}")

    def describe(self) -> str:
        return f"{self.vendor} family {self.family} model {self.model}"

    def to_dict(self) -> dict[str, Any]:
        return {"exact_processor": {"vendor": self.vendor, "family": self.family,
                                    "model": self.model}}


@dataclass(frozen=True)
class ProcessorList:
    """Several models of one vendor and family."""

    vendor: str
    family: int
    models: frozenset[int]
    source = PROCESSOR_LIST

    def __post_init__(self) -> None:
        object.__setattr__(self, "vendor", _norm_vendor(self.vendor))
        _check_int("family", self.family)
        models = frozenset(_check_int("model", m) for m in self.models)
        if not models:
            raise ValueError("a processor list needs at least one model")
        object.__setattr__(self, "models", models)

    def match(self, cpu: CpuLike) -> Match:
        if cpu.vendor == self.vendor and cpu.family == self.family and cpu.model in self.models:
            return Match.ranked(_LEVEL[self.source], 0)
        return Match.refused(f"processor is {cpu.vendor} family {cpu.family} model {cpu.model}, "
                             f"not in {self.describe()}")

    def describe(self) -> str:
        return f"{self.vendor} family {self.family} models {sorted(self.models)}"

    def to_dict(self) -> dict[str, Any]:
        return {"processor_list": {"vendor": self.vendor, "family": self.family,
                                   "models": sorted(self.models)}}


@functools.cache
def ancestor_distances(name: str) -> Mapping[str, int]:
    """Shortest distance from archspec target ``name`` to itself and each ancestor."""
    distances = {name: 0}
    frontier = [name]
    while frontier:
        following = []
        for current in frontier:
            target = archspec.cpu.TARGETS.get(current)
            for parent in target.parents if target is not None else ():
                if parent.name not in distances:
                    distances[parent.name] = distances[current] + 1
                    following.append(parent.name)
        frontier = following
    return MappingProxyType(distances)


@dataclass(frozen=True)
class Microarchitecture:
    """An archspec microarchitecture, and optionally the later ones descending from it.

    A descendant matches ranked below an exact match, and nearer descendants
    rank above farther ones.
    """

    name: str
    include_descendants: bool = True
    source = MICROARCHITECTURE

    def __post_init__(self) -> None:
        if self.name not in archspec.cpu.TARGETS:
            raise ValueError(f"unknown microarchitecture {self.name!r} (not an archspec target)")

    def match(self, cpu: CpuLike) -> Match:
        distance = ancestor_distances(cpu.microarchitecture).get(self.name)
        if distance == 0 or (distance is not None and self.include_descendants):
            return Match.ranked(_LEVEL[self.source], -distance)
        if distance is not None:
            return Match.refused(
                f"{cpu.microarchitecture} descends from {self.name}, but descendants are excluded")
        return Match.refused(
            f"microarchitecture {cpu.microarchitecture} is not {self.name} nor descends from it")

    @property
    def vendor(self) -> str | None:
        """Canonical vendor of the target, or None for generic targets."""
        return vendor_name(archspec.cpu.TARGETS[self.name].vendor)

    def describe(self) -> str:
        return self.name + (" and descendants" if self.include_descendants else "")

    def to_dict(self) -> dict[str, Any]:
        return {"microarchitecture": {"name": self.name,
                                      "include_descendants": self.include_descendants}}


@dataclass(frozen=True)
class InstructionSet:
    """Processors having every ``required`` feature and none of the ``excluded`` ones.

    More required features rank as more specific.
    """

    required: frozenset[str]
    excluded: frozenset[str] = frozenset()
    source = INSTRUCTION_SET

    def __post_init__(self) -> None:
        required, excluded = frozenset(self.required), frozenset(self.excluded)
        if isinstance(self.required, str) or isinstance(self.excluded, str):
            raise TypeError("required and excluded must be collections of feature names")
        if not required:
            raise ValueError("an instruction-set profile needs at least one required feature")
        if required & excluded:
            raise ValueError(f"features both required and excluded: {sorted(required & excluded)}")
        object.__setattr__(self, "required", required)
        object.__setattr__(self, "excluded", excluded)

    def match(self, cpu: CpuLike) -> Match:
        missing = sorted(self.required - cpu.features)
        present = sorted(self.excluded & cpu.features)
        if not missing and not present:
            return Match.ranked(_LEVEL[self.source], len(self.required))
        reasons = []
        if missing:
            reasons.append(f"lacks {', '.join(missing)}")
        if present:
            reasons.append(f"has excluded {', '.join(present)}")
        return Match.refused("processor " + " and ".join(reasons))

    def describe(self) -> str:
        text = "+".join(sorted(self.required))
        return text + ("".join(f" -{f}" for f in sorted(self.excluded)))

    def to_dict(self) -> dict[str, Any]:
        return {"instruction_set": {"required": sorted(self.required),
                                    "excluded": sorted(self.excluded)}}


@dataclass(frozen=True)
class ProcessorProfile:
    """Values a kernel library ships for one key on the processors a selector covers.

    ``values`` may be partial: the rest comes from the portable defaults.
    ``threads`` is an inclusive ``(min, max)`` range or None for any count. ``provenance``
    says how the values were obtained (for a profile file: when, on which versions, the
    measurements; :mod:`onnx_light.tuning.profile_files`), ``origin`` where the profile was
    read (``file.json#3``); neither takes part in comparisons.
    """

    key: KernelTuningKey
    selector: ExactProcessor | ProcessorList | Microarchitecture | InstructionSet
    values: Mapping[str, Value]
    threads: tuple[int, int] | None = None
    priority: int = 0
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.key, KernelTuningKey):
            raise TypeError(f"profile key must be a KernelTuningKey, got {type(self.key).__name__}")
        if not hasattr(self.selector, "match"):
            raise TypeError(f"{self.key}: not a selector: {self.selector!r}")
        if self.threads is not None:
            low, high = self.threads
            if isinstance(low, bool) or isinstance(high, bool) or not (
                isinstance(low, int) and isinstance(high, int) and 1 <= low <= high
            ):
                raise ValueError(f"{self.key}: threads must be (min, max) with 1 <= min <= max, "
                                 f"got {self.threads!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise TypeError(f"{self.key}: priority must be an int, got {self.priority!r}")
        if not isinstance(self.provenance, Mapping):
            raise TypeError(f"{self.key}: provenance must be a mapping, got {self.provenance!r}")
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        object.__setattr__(self, "provenance", MappingProxyType(dict(self.provenance)))

    @property
    def source(self) -> str:
        """The resolution source this profile reports."""
        return self.selector.source

    def match(self, cpu: CpuLike, num_threads: int) -> Match:
        """Rank for this processor and thread count, or why it does not apply."""
        if self.threads is not None and not self.threads[0] <= num_threads <= self.threads[1]:
            return Match.refused(
                f"{num_threads} threads outside the range {self.threads[0]}..{self.threads[1]}")
        return self.selector.match(cpu)

    def describe(self) -> str:
        threads = "" if self.threads is None else f" threads {self.threads[0]}..{self.threads[1]}"
        return f"{self.source} [{self.selector.describe()}]{threads} priority {self.priority}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": str(self.key),
            "selector": self.selector.to_dict(),
            "values": dict(self.values),
            "threads": list(self.threads) if self.threads else None,
            "priority": self.priority,
            "provenance": dict(self.provenance),
        }


def _threads_overlap(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    low_a, high_a = a or (1, 2**63)
    low_b, high_b = b or (1, 2**63)
    return max(low_a, low_b) <= min(high_a, high_b)


def _microarchitectures_may_tie(a: Microarchitecture, b: Microarchitecture) -> bool:
    if a.name == b.name:
        return True
    if not (a.include_descendants and b.include_descendants):
        return False
    # A processor descending from both at the same distance would see a tie.
    for target in archspec.cpu.TARGETS:
        distances = ancestor_distances(target)
        if a.name in distances and distances.get(a.name) == distances.get(b.name):
            return True
    return False


def _selectors_may_tie(a: Selector, b: Selector) -> bool:
    if _LEVEL[a.source] != _LEVEL[b.source]:
        return False
    if isinstance(a, ExactProcessor) and isinstance(b, ExactProcessor):
        return a == b
    if isinstance(a, ProcessorList) and isinstance(b, ProcessorList):
        return (a.vendor, a.family) == (b.vendor, b.family) and bool(a.models & b.models)
    if isinstance(a, Microarchitecture) and isinstance(b, Microarchitecture):
        return _microarchitectures_may_tie(a, b)
    if isinstance(a, InstructionSet) and isinstance(b, InstructionSet):
        return len(a.required) == len(b.required) and not (
            a.required & b.excluded or b.required & a.excluded
        )
    # A processor list against a microarchitecture: they tie only on an exact
    # microarchitecture match of the same vendor (a generic target: any vendor).
    listed, arch = (a, b) if isinstance(a, ProcessorList) else (b, a)
    assert isinstance(listed, ProcessorList) and isinstance(arch, Microarchitecture)
    return arch.vendor in (None, listed.vendor)


def profiles_may_tie(a: ProcessorProfile, b: ProcessorProfile) -> bool:
    """True when some processor and thread count could rank ``a`` and ``b`` equally."""
    return (
        a.key == b.key
        and a.priority == b.priority
        and _threads_overlap(a.threads, b.threads)
        and _selectors_may_tie(a.selector, b.selector)
    )


_SELECTORS = {
    "exact_processor": (ExactProcessor, {"vendor", "family", "model"}),
    "processor_list": (ProcessorList, {"vendor", "family", "models"}),
    "microarchitecture": (Microarchitecture, {"name", "include_descendants"}),
    "instruction_set": (InstructionSet, {"required", "excluded"}),
}


def selector_from_dict(data: Mapping[str, Any]) -> Selector:
    """The inverse of ``Selector.to_dict``: ``{"microarchitecture": {"name": "zen3"}}``."""
    if not isinstance(data, Mapping) or len(data) != 1:
        raise ValueError(f"a selector is an object with exactly one of {sorted(_SELECTORS)}, "
                         f"got {data!r}")
    (kind, fields), = data.items()
    if kind not in _SELECTORS:
        raise ValueError(f"unknown selector {kind!r}; valid: {sorted(_SELECTORS)}")
    cls, allowed = _SELECTORS[kind]
    if not isinstance(fields, Mapping):
        raise ValueError(f"selector {kind!r} needs an object, got {fields!r}")
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ValueError(f"selector {kind!r}: unknown field(s) {unknown}; valid: {sorted(allowed)}")
    arguments = dict(fields)
    for name in ("models", "required", "excluded"):
        if name in arguments:
            if not isinstance(arguments[name], list):
                raise ValueError(f"selector {kind!r}: {name} must be a list")
            arguments[name] = frozenset(arguments[name])
    try:
        return cls(**arguments)
    except TypeError as exc:
        raise ValueError(f"selector {kind!r}: {exc}") from None


def profile_from_dict(data: Mapping[str, Any], origin: str = "") -> ProcessorProfile:
    """A profile from its data form (see ``ProcessorProfile.to_dict``)."""
    allowed = {"key", "selector", "values", "threads", "priority", "provenance"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"{origin}: unknown profile field(s) {unknown}; valid: {sorted(allowed)}")
    threads = data.get("threads")
    return ProcessorProfile(
        key=KernelTuningKey.parse(data["key"]),
        selector=selector_from_dict(data["selector"]),
        values=data["values"],
        threads=tuple(threads) if threads is not None else None,
        priority=data.get("priority", 0),
        provenance=data.get("provenance", {}),
        origin=origin,
    )
