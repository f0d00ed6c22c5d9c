"""The registry: immutable generations of schemas, profiles and callbacks, and resolution.

Every change builds a new :class:`RegistrySnapshot` and swaps it in under a
lock, bumping the generation; a change that fails validation raises before the
swap and leaves the generation unchanged. Snapshots are never mutated, so a
session that captured one keeps exactly the values it resolved.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from .keys import KernelTuningKey
from .processor import CpuExecutionDescriptor
from .profiles import PORTABLE_DEFAULT, PUBLISHED, ProcessorProfile, profiles_may_tie
from .schema import KernelTuningSchema, Value, schemas_by_key

__all__ = [
    "AmbiguousProfileError",
    "KernelTuningRegistry",
    "PublishedProfile",
    "RegistrySnapshot",
    "Resolution",
    "UnknownKeyError",
    "default_registry",
]

CalibrationCallback = Callable[..., Any]
_EMPTY: Mapping = MappingProxyType({})


class UnknownKeyError(KeyError):
    """No schema is registered for a key."""

    def __init__(self, key: object, known: Iterable[KernelTuningKey] = ()) -> None:
        near = sorted(str(k) for k in known
                      if isinstance(key, KernelTuningKey) and k.kernel == key.kernel)
        hint = f"; registered for that kernel: {near}" if near else ""
        super().__init__(f"no kernel tuning schema registered for {key}{hint}")
        self.key = key

    def __str__(self) -> str:
        return self.args[0]


class AmbiguousProfileError(ValueError):
    """Two profiles of equal specificity and priority could match one processor."""


@dataclass(frozen=True)
class PublishedProfile:
    """Complete values published for one key on one exact execution descriptor.

    Published profiles come from calibration, from a manual setting or from a
    cache file; they win over every shipped processor profile.
    """

    key: KernelTuningKey
    descriptor: CpuExecutionDescriptor
    values: Mapping[str, Value]
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        object.__setattr__(self, "provenance", MappingProxyType(dict(self.provenance)))


@dataclass(frozen=True)
class Resolution:
    """Values resolved for a key, where they came from, and from which generation."""

    key: KernelTuningKey
    values: Mapping[str, Value]
    source: str
    generation: int
    profile: ProcessorProfile | PublishedProfile | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"key": str(self.key), "values": dict(self.values), "source": self.source,
                "generation": self.generation}


@dataclass(frozen=True)
class _Profiled:
    profile: ProcessorProfile
    values: Mapping[str, Value]


@dataclass(frozen=True)
class RegistrySnapshot:
    """One immutable generation of the registry."""

    generation: int
    schemas: Mapping[KernelTuningKey, KernelTuningSchema]
    callbacks: Mapping[KernelTuningKey, CalibrationCallback]
    profiles: Mapping[KernelTuningKey, tuple[_Profiled, ...]]
    published: Mapping[KernelTuningKey, Mapping[CpuExecutionDescriptor, PublishedProfile]]

    def keys(self) -> tuple[KernelTuningKey, ...]:
        """Every registered key, sorted."""
        return tuple(sorted(self.schemas))

    def schema(self, key: KernelTuningKey) -> KernelTuningSchema:
        """The schema of ``key``; :class:`UnknownKeyError` when there is none."""
        try:
            return self.schemas[key]
        except (KeyError, TypeError):
            raise UnknownKeyError(key, self.schemas) from None

    def callback(self, key: KernelTuningKey) -> CalibrationCallback | None:
        """The calibration callback of ``key``, or None for a schema-only key."""
        self.schema(key)
        return self.callbacks.get(key)

    def published_profile(self, key: KernelTuningKey,
                          descriptor: CpuExecutionDescriptor) -> PublishedProfile | None:
        """The profile published for exactly this key and descriptor, if any."""
        return self.published.get(key, _EMPTY).get(descriptor)

    def published_profiles(self) -> tuple[PublishedProfile, ...]:
        """Every published profile, by key."""
        return tuple(p for key in sorted(self.published) for p in self.published[key].values())

    def resolve(self, key: KernelTuningKey, descriptor: CpuExecutionDescriptor) -> Resolution:
        """Values for ``key`` on ``descriptor`` by the spec's precedence."""
        schema = self.schema(key)
        published = self.published_profile(key, descriptor)
        if published is not None:
            return Resolution(key, published.values, PUBLISHED, self.generation, published)
        best: tuple[Any, _Profiled] | None = None
        for entry in self.profiles.get(key, ()):
            match = entry.profile.match(descriptor.cpu, descriptor.num_threads)
            if not match.applies:
                continue
            score = (match.rank, entry.profile.priority)
            if best is None or score > best[0]:
                best = (score, entry)
        if best is not None:
            entry = best[1]
            return Resolution(key, entry.values, entry.profile.source, self.generation,
                              entry.profile)
        return Resolution(key, schema.defaults, PORTABLE_DEFAULT, self.generation)

    def explain(self, key: KernelTuningKey, descriptor: CpuExecutionDescriptor) -> dict[str, Any]:
        """Which profile wins for ``key`` on ``descriptor``, and why each other one does not.

        Never raises for a registered key; the result is JSON-serialisable.
        """
        resolution = self.resolve(key, descriptor)
        candidates: list[dict[str, Any]] = []
        for published in self.published.get(key, _EMPTY).values():
            differs = published.descriptor.differences(descriptor)
            candidates.append({
                "profile": f"{PUBLISHED} for {published.descriptor.short()}",
                "applies": not differs,
                "reason": "exact descriptor match" if not differs
                else "descriptor differs in " + ", ".join(differs),
            })
        for entry in self.profiles.get(key, ()):
            match = entry.profile.match(descriptor.cpu, descriptor.num_threads)
            candidates.append({
                "profile": entry.profile.describe(),
                "applies": match.applies,
                "reason": f"matches with rank {list(match.rank)}" if match.applies else match.reason,
            })
        winner = resolution.profile
        for candidate, profile in zip(candidates, self._candidate_profiles(key), strict=True):
            if candidate["applies"] and profile is not winner:
                candidate["applies"] = False
                candidate["reason"] += "; outranked by the winner"
        return {
            "key": str(key),
            "descriptor": descriptor.short(),
            "source": resolution.source,
            "values": dict(resolution.values),
            "winner": None if winner is None else _describe(winner),
            "candidates": candidates,
        }

    def _candidate_profiles(self, key: KernelTuningKey) -> list[Any]:
        return [*self.published.get(key, _EMPTY).values(),
                *(entry.profile for entry in self.profiles.get(key, ()))]


def _describe(profile: ProcessorProfile | PublishedProfile) -> str:
    if isinstance(profile, PublishedProfile):
        return f"{PUBLISHED} for {profile.descriptor.short()}"
    return profile.describe()


class KernelTuningRegistry:
    """Holds the current snapshot; every change publishes a new generation atomically."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot = RegistrySnapshot(0, _EMPTY, _EMPTY, _EMPTY, _EMPTY)

    def snapshot(self) -> RegistrySnapshot:
        """The current immutable generation."""
        return self._snapshot

    @property
    def generation(self) -> int:
        """The current generation number."""
        return self._snapshot.generation

    def copy(self, *, published: bool = True) -> KernelTuningRegistry:
        """A new registry starting from this one's current generation, with its schemas,
        profiles and callbacks and (unless ``published=False``) its published profiles.

        Changes to either registry do not reach the other: a read-only report can load a
        cache file into a copy without changing what this process's sessions resolve.
        """
        copied = KernelTuningRegistry()
        current = self._snapshot
        copied._snapshot = current if published else replace(current, published=_EMPTY)
        return copied

    def register(
        self,
        schemas: Iterable[KernelTuningSchema] = (),
        profiles: Iterable[ProcessorProfile] = (),
        callbacks: Mapping[KernelTuningKey, CalibrationCallback] | None = None,
    ) -> int:
        """Register a batch of schemas, processor profiles and calibration callbacks.

        All or nothing: any duplicate schema, profile for an unknown key, invalid
        values, ambiguous profile or non-callable callback raises and changes
        nothing. Returns the new generation.
        """
        new_schemas = schemas_by_key(schemas)
        profiles = tuple(profiles)
        callbacks = dict(callbacks or {})
        with self._lock:
            current = self._snapshot
            clash = sorted(str(k) for k in new_schemas if k in current.schemas)
            if clash:
                raise ValueError(f"kernel tuning schema already registered for {clash}")
            all_schemas = {**current.schemas, **new_schemas}
            all_profiles = {k: list(v) for k, v in current.profiles.items()}
            for profile in profiles:
                if not isinstance(profile, ProcessorProfile):
                    raise TypeError(f"expected a ProcessorProfile, got {type(profile).__name__}")
                schema = all_schemas.get(profile.key)
                if schema is None:
                    raise UnknownKeyError(profile.key, all_schemas)
                values = schema.update(schema.defaults, profile.values)
                existing = all_profiles.setdefault(profile.key, [])
                for other in existing:
                    if other.profile == profile or profiles_may_tie(other.profile, profile):
                        raise AmbiguousProfileError(
                            f"{profile.key}: profile {profile.describe()} could tie with "
                            f"{other.profile.describe()}; give one a different priority"
                        )
                existing.append(_Profiled(profile, MappingProxyType(values)))
            all_callbacks = dict(current.callbacks)
            for key, callback in callbacks.items():
                if key not in all_schemas:
                    raise UnknownKeyError(key, all_schemas)
                if not callable(callback):
                    raise TypeError(f"{key}: calibration callback must be callable, "
                                    f"got {type(callback).__name__}")
                if key in all_callbacks:
                    raise ValueError(f"{key}: a calibration callback is already registered")
                all_callbacks[key] = callback
            return self._swap(
                current,
                schemas=MappingProxyType(all_schemas),
                profiles=MappingProxyType({k: tuple(v) for k, v in all_profiles.items()}),
                callbacks=MappingProxyType(all_callbacks),
            )

    def publish(self, profiles: Iterable[PublishedProfile]) -> int:
        """Publish complete execution profiles in one generation, replacing same identities.

        Each profile is validated against its schema first; one bad profile
        publishes nothing. Returns the new generation.
        """
        profiles = tuple(profiles)
        with self._lock:
            current = self._snapshot
            published = {k: dict(v) for k, v in current.published.items()}
            for profile in profiles:
                if not isinstance(profile, PublishedProfile):
                    raise TypeError(f"expected a PublishedProfile, got {type(profile).__name__}")
                values = current.schema(profile.key).validate(profile.values)
                checked = PublishedProfile(profile.key, profile.descriptor, values,
                                           profile.provenance)
                published.setdefault(profile.key, {})[profile.descriptor] = checked
            return self._swap(current, published=_freeze(published))

    def forget(self, keys: Iterable[KernelTuningKey] | None = None,
               descriptor: CpuExecutionDescriptor | None = None) -> int:
        """Drop published profiles (all, or of some keys, or of one descriptor).

        Shipped processor profiles and schemas stay. Returns the new generation.
        """
        selected = None if keys is None else set(keys)
        with self._lock:
            current = self._snapshot
            published = {}
            for key, by_descriptor in current.published.items():
                kept = {d: p for d, p in by_descriptor.items()
                        if (selected is not None and key not in selected)
                        or (descriptor is not None and d != descriptor)}
                if kept:
                    published[key] = kept
            return self._swap(current, published=_freeze(published))

    def _swap(self, current: RegistrySnapshot, **changes: Any) -> int:
        fields = {
            "schemas": current.schemas, "callbacks": current.callbacks,
            "profiles": current.profiles, "published": current.published, **changes,
        }
        self._snapshot = RegistrySnapshot(generation=current.generation + 1, **fields)
        return self._snapshot.generation


def _freeze(published: dict) -> Mapping:
    return MappingProxyType({k: MappingProxyType(v) for k, v in published.items()})


_DEFAULT = KernelTuningRegistry()


def default_registry() -> KernelTuningRegistry:
    """The process-wide registry that ``import onnx_light`` fills."""
    return _DEFAULT

