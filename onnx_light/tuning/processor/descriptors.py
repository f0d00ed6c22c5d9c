"""The descriptors: what the kernels know about the processor and the thread count.

A :class:`CpuDescriptor` says which processor the kernels run on; a
:class:`CpuExecutionDescriptor` adds the effective thread count. Together they decide
whether tuned kernel parameters (or a cached profile) apply. Both validate their fields and
round-trip through plain dicts (the cache file stores them so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .features import is_arm

__all__ = ["UNKNOWN", "CpuDescriptor", "CpuExecutionDescriptor"]

#: The value of a string field that could not be read from the system.
UNKNOWN = "unknown"

_STR_FIELDS = ("architecture", "vendor", "microarchitecture")
_OPTIONAL_NON_NEGATIVE = ("family", "model", "stepping")
_OPTIONAL_POSITIVE = ("cache_line", "l1d", "l2", "l3", "physical_cores", "logical_cores")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_cpu_field(name: str, value: Any, prefix: str = "") -> Any:
    """Validate one CpuDescriptor field; ValueError names it as ``prefix + name``."""
    label = prefix + name
    if name in _STR_FIELDS:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{label} must be a non-empty str, got {value!r}")
    elif name in _OPTIONAL_NON_NEGATIVE:
        if value is not None and (not _is_int(value) or value < 0):
            raise ValueError(f"{label} must be None or an int >= 0, got {value!r}")
    elif name in _OPTIONAL_POSITIVE:
        if value is not None and (not _is_int(value) or value < 1):
            raise ValueError(f"{label} must be None or an int >= 1, got {value!r}")
    elif name == "features":
        if isinstance(value, str) or not isinstance(value, (set, frozenset, list, tuple)):
            raise ValueError(f"{label} must be a collection of str, got {value!r}")
        if not all(isinstance(item, str) and item for item in value):
            raise ValueError(f"{label} must contain only non-empty str, got {value!r}")
        return frozenset(value)
    return value


@dataclass(frozen=True)
class CpuDescriptor:
    """What the kernels know about the processor they run on.

    Integer fields are None when unknown; ``vendor`` and ``microarchitecture`` are
    ``"unknown"`` when unknown. ``features`` holds only names from ``KERNEL_FEATURES``
    when detected (``from_dict`` accepts any string so newer descriptors still load).
    For Arm, ``family`` is the "CPU architecture" (8), ``model`` the "CPU part" (0xd40) and
    ``stepping`` the "CPU revision"; see :func:`parse_proc_cpuinfo` for the other ISAs.
    Cache sizes are in bytes, per cache instance; core counts cover the whole machine.
    Invalid field values raise ValueError naming the field.
    """

    architecture: str
    vendor: str
    family: int | None
    model: int | None
    stepping: int | None
    microarchitecture: str
    features: frozenset[str]
    cache_line: int | None
    l1d: int | None
    l2: int | None
    l3: int | None
    physical_cores: int | None
    logical_cores: int | None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = _check_cpu_field(field.name, getattr(self, field.name))
            object.__setattr__(self, field.name, value)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict of every field (``features`` as a sorted list)."""
        result = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        result["features"] = sorted(self.features)
        return result

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CpuDescriptor:
        """Inverse of :meth:`to_dict`; strict: a missing, unknown or ill-typed field raises
        ValueError naming it."""
        return cls._from_dict(data, "")

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any], prefix: str) -> CpuDescriptor:
        if not isinstance(data, Mapping):
            raise ValueError(f"{prefix.rstrip('.') or 'cpu descriptor'} must be a dict, "
                             f"got {type(data).__name__}")
        names = [field.name for field in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise ValueError(f"unknown field {prefix}{key}")
        values = {}
        for name in names:
            if name not in data:
                raise ValueError(f"missing field {prefix}{name}")
            value = data[name]
            if name == "features" and not isinstance(value, (list, tuple)):
                raise ValueError(f"{prefix}features must be a list of str, got {value!r}")
            values[name] = _check_cpu_field(name, value, prefix)
        return cls(**values)

    def differences(self, other: CpuDescriptor) -> list[str]:
        """Names of the fields whose values differ from ``other`` (declaration order)."""
        if not isinstance(other, CpuDescriptor):
            raise TypeError(f"expected a CpuDescriptor, got {type(other).__name__}")
        return [
            field.name
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != getattr(other, field.name)
        ]

    def short(self) -> str:
        """One readable line, e.g.
        ``amd family 25 model 1 (zen3) x86_64 avx,avx2,fma,... 8 cores/16 logical``."""
        parts = [self.vendor]
        if is_arm(self.architecture):
            if self.family is not None:
                parts.append(f"armv{self.family}")
            if self.model is not None:
                parts.append(f"part {self.model:#05x}")
        else:
            if self.family is not None:
                parts.append(f"family {self.family}")
            if self.model is not None:
                parts.append(f"model {self.model}")
        parts.append(f"({self.microarchitecture})")
        parts.append(self.architecture)
        parts.append(",".join(sorted(self.features)) or "no-simd-features")
        physical = "?" if self.physical_cores is None else str(self.physical_cores)
        logical = "?" if self.logical_cores is None else str(self.logical_cores)
        parts.append(f"{physical} cores/{logical} logical")
        return " ".join(parts)


@dataclass(frozen=True)
class CpuExecutionDescriptor:
    """A processor plus the effective number of threads kernels run with."""

    cpu: CpuDescriptor
    num_threads: int

    def __post_init__(self) -> None:
        if not isinstance(self.cpu, CpuDescriptor):
            raise ValueError(f"cpu must be a CpuDescriptor, got {type(self.cpu).__name__}")
        if not _is_int(self.num_threads) or self.num_threads < 1:
            raise ValueError(f"num_threads must be an int >= 1, got {self.num_threads!r}")

    def to_dict(self) -> dict[str, Any]:
        """``{"cpu": CpuDescriptor.to_dict(), "num_threads": n}``."""
        return {"cpu": self.cpu.to_dict(), "num_threads": self.num_threads}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CpuExecutionDescriptor:
        """Inverse of :meth:`to_dict`; strict, errors name the field (``cpu.model``)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"execution descriptor must be a dict, got {type(data).__name__}")
        for key in data:
            if key not in ("cpu", "num_threads"):
                raise ValueError(f"unknown field {key}")
        for name in ("cpu", "num_threads"):
            if name not in data:
                raise ValueError(f"missing field {name}")
        cpu = CpuDescriptor._from_dict(data["cpu"], "cpu.")
        return cls(cpu=cpu, num_threads=data["num_threads"])

    def differences(self, other: CpuExecutionDescriptor) -> list[str]:
        """Names of the differing fields, e.g. ``["num_threads", "cpu.model", "cpu.features"]``.

        Used to explain why a cached profile does not apply; empty when equal.
        """
        if not isinstance(other, CpuExecutionDescriptor):
            raise TypeError(f"expected a CpuExecutionDescriptor, got {type(other).__name__}")
        result = ["num_threads"] if self.num_threads != other.num_threads else []
        return result + [f"cpu.{name}" for name in self.cpu.differences(other.cpu)]

    def short(self) -> str:
        """The processor's short line followed by the thread count."""
        return f"{self.cpu.short()}, {self.num_threads} threads"

