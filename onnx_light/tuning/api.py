"""The public kernel tuning functions named in the spec.

Each returns JSON-serialisable dicts. They act on ``registry`` (default: the
process-wide one, :func:`~onnx_light.tuning.registry.default_registry`) and on the
cache file at ``path`` (default: :func:`default_kernel_tuning_cache_path`), so that
another kernel library uses them with its own registry exactly as ours does with
the default one. No function names a kernel library: ``library=None`` selects the
matching keys of every library in the registry.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from . import cache as cache_file
from . import calibration, profile_files
from .cache import LineOutcome
from .identity import identity
from .keys import KernelTuningKey, element_type_code
from .processor import CpuExecutionDescriptor, execution_descriptor
from .registry import (
    KernelTuningRegistry,
    PublishedProfile,
    RegistrySnapshot,
    Resolution,
    default_registry,
)

__all__ = [
    "SelectionError",
    "apply_kernel_tuning_updates",
    "calibrate_kernel_tuning",
    "default_kernel_tuning_cache_path",
    "export_kernel_tuning_profile",
    "inspect_kernel_tuning_cache",
    "kernel_tuning_parameters",
    "load_kernel_tuning_cache",
    "measurement_summary",
    "propose_kernel_tuning_updates",
    "reset_kernel_tuning_parameters",
    "select_keys",
    "set_kernel_tuning_parameters",
]

PathLike = str | os.PathLike[str]
ElementTypes = int | str | np.dtype | Iterable[int | str | np.dtype]
DURATION_SLACK_S = 1.0  # how late a callback's result may come (see _check_result)


class SelectionError(KeyError):
    """Filters that select no registered key; the message lists the valid names."""

    def __str__(self) -> str:
        return self.args[0]


def default_kernel_tuning_cache_path() -> str:
    """Where the cache lives unless a ``path`` says otherwise.

    ``$ONNX_LIGHT_KERNEL_TUNING_CACHE`` when set, else ``kernel-tuning-cache.txt``
    in the platform's user cache directory.
    """
    return str(cache_file.default_cache_path())


def _registry(registry: KernelTuningRegistry | None) -> KernelTuningRegistry:
    """``registry``, or the process-wide one when it is None."""
    if registry is None:
        return default_registry()
    if not isinstance(registry, KernelTuningRegistry):
        raise TypeError(f"registry must be a KernelTuningRegistry, got {type(registry).__name__}")
    return registry


def _as_set(value: str | Iterable[str] | None, what: str) -> set[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return {value}
    try:
        items = set(value)
    except TypeError:
        raise TypeError(f"{what} must be a string or a list of strings, "
                        f"got {type(value).__name__}") from None
    if not all(isinstance(item, str) for item in items):
        raise TypeError(f"{what} must be strings, got {sorted(map(repr, items))}")
    return items


def _element_types(value: ElementTypes | None) -> set[int] | None:
    if value is None:
        return None
    if isinstance(value, (int, str, np.dtype, type)):
        return {element_type_code(value)}
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"element type must be an int, a name, a numpy dtype or a list of them, "
                        f"got {type(value).__name__}") from None
    return {element_type_code(item) for item in items}


def select_keys(
    snapshot: RegistrySnapshot,
    kernels: str | Iterable[str] | None = None,
    element_types: ElementTypes | None = None,
    *,
    library: str | None = None,
    implementation: str | None = None,
) -> list[KernelTuningKey]:
    """Registered keys matching the filters, sorted.

    A kernel, library or implementation name that no key has raises
    ``KeyError`` listing the valid names; so does a selection left empty by a
    combination of filters.
    """
    kernel_names = _as_set(kernels, "kernel")
    types = _element_types(element_types)
    keys = snapshot.keys()
    for what, wanted in (("kernel", kernel_names), ("library", _as_set(library, "library")),
                         ("implementation", _as_set(implementation, "implementation"))):
        if wanted is None:
            continue
        known = {getattr(k, what) for k in keys}
        unknown = sorted(wanted - known)
        if unknown:
            raise SelectionError(f"unknown {what} {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        keys = tuple(k for k in keys if getattr(k, what) in wanted)
    selected = [k for k in keys if types is None or k.element_type in types]
    if not selected and keys:
        available = sorted({k.element_type_name for k in keys})
        raise SelectionError(f"no tunable kernel for the selected element type(s); "
                       f"the selected kernels have: {', '.join(available)}")
    return selected


def _cached_profiles(path: PathLike | None, snapshot: RegistrySnapshot,
                     local: CpuExecutionDescriptor) -> tuple[dict[str, Any], dict]:
    """Read the cache without publishing: its report and the valid profiles for ``local``."""
    return _profiles_in(cache_file.read_cache(cache_file.resolve_path(path)), snapshot, local)


def _profiles_in(cache: cache_file.CacheFile, snapshot: RegistrySnapshot,
                 local: CpuExecutionDescriptor) -> tuple[dict[str, Any], dict]:
    outcomes, profiles = cache_file.classify(cache, snapshot, local)
    mine = {p.key: p for p in profiles if p.descriptor == local}
    return {"cache": cache, "outcomes": outcomes}, mine


def _stale_here(state: dict[str, Any], local: CpuExecutionDescriptor) -> list[dict[str, Any]]:
    """The stale entries of the cache for exactly this processor and thread count."""
    here = cache_file.CacheEntry(KernelTuningKey("x", "x", "x", 1), local, {}).identity()[1]
    by_line = {line.number: line for line in state["cache"].lines}
    return [{"key": o.key, "line": o.line, "reason": o.reason} for o in state["outcomes"]
            if o.outcome == LineOutcome.STALE and by_line[o.line].identity[1] == here]


def _entry(key: KernelTuningKey, local: CpuExecutionDescriptor, values: Mapping[str, Any],
           origin: Mapping[str, Any], snapshot: RegistrySnapshot) -> cache_file.CacheEntry:
    """A cache entry measured (or set) now: it records the versions it depends on."""
    return cache_file.CacheEntry(key, local, values, origin,
                                 identity(key, snapshot.schema(key).revision))


def kernel_tuning_parameters(
    kernel: str | Iterable[str] | None = None,
    element_type: ElementTypes | None = None,
    *,
    library: str | None = None,
    implementation: str | None = None,
    path: PathLike | None = None,
    num_threads: int | None = None,
    registry: KernelTuningRegistry | None = None,
) -> list[dict[str, Any]]:
    """One record per selected key: schema, defaults, this machine's cached and active values."""
    local = execution_descriptor(num_threads)
    snapshot = _registry(registry).snapshot()
    keys = select_keys(snapshot, kernel, element_type, library=library,
                       implementation=implementation)
    _, cached = _cached_profiles(path, snapshot, local)
    records = []
    for key in keys:
        schema = snapshot.schema(key)
        resolution = snapshot.resolve(key, local)
        records.append({
            "key": str(key),
            "library": key.library,
            "kernel": key.kernel,
            "implementation": key.implementation,
            "element_type": key.element_type_name,
            "tuning_abi": key.tuning_abi,
            "parameters": schema.describe(),
            "defaults": dict(schema.defaults),
            "cached_values": dict(cached[key].values) if key in cached else None,
            "active_values": dict(resolution.values),
            "active_source": resolution.source,
            "active_provenance": _provenance(resolution),
            "calibratable": snapshot.callbacks.get(key) is not None,
            "generation": resolution.generation,
        })
    return records


def _provenance(resolution: Resolution) -> dict[str, Any] | None:
    """How the winning profile was made: a published one's ``origin`` (calibrated, manual,
    ...), a processor profile's file, ``source`` and measurements; None for the defaults."""
    if resolution.profile is not None:
        return dict(resolution.profile.provenance)
    return None


def inspect_kernel_tuning_cache(path: PathLike | None = None, *,
                                num_threads: int | None = None,
                                registry: KernelTuningRegistry | None = None) -> dict[str, Any]:
    """Describe a cache file without publishing anything or touching the file.

    Lists every loadable entry and the first hundred of each other outcome; ``counts``
    has the number of lines of each outcome.
    """
    local = execution_descriptor(num_threads)
    state, _ = _cached_profiles(path, _registry(registry).snapshot(), local)
    cache, outcomes = state["cache"], state["outcomes"]
    by_line = {line.number: line for line in cache.lines}
    profiles = []
    for outcome in cache_file.listed_outcomes(outcomes):
        record = by_line[outcome.line].record or {}
        profiles.append({
            "line": outcome.line,
            "key": outcome.key,
            "descriptor": record.get("descriptor"),
            "values": record.get("values"),
            "provenance": record.get("provenance"),
            "measured_under": record.get("measured_under"),
            "outcome": outcome.outcome,
            "reason": outcome.reason,
            "matches_this_machine": outcome.matches_this_machine,
        })
    diagnostics = list(cache.diagnostics) + cache_file.summarise(
        ((o.outcome, f"{cache.path}:{o.line}: {o.outcome}: {o.reason}") for o in outcomes
         if o.outcome not in (LineOutcome.LOADED, LineOutcome.DUPLICATE) and o.key is not None),
        cache.path)
    return {
        "path": str(cache.path),
        "status": cache.status,
        "format_version": cache.format_version,
        "descriptor": local.to_dict(),
        "profiles": profiles,
        "counts": cache_file.outcome_counts(cache, outcomes),
        "diagnostics": diagnostics,
    }


def load_kernel_tuning_cache(path: PathLike | None = None, *,
                             num_threads: int | None = None,
                             registry: KernelTuningRegistry | None = None) -> dict[str, Any]:
    """Publish the cache's profiles for this processor in one new generation.

    Never raises for what the file contains: a missing, unreadable or corrupt
    file yields diagnostics and leaves the portable values in force.
    """
    local = execution_descriptor(num_threads)
    return cache_file.load_into(_registry(registry), cache_file.resolve_path(path), local)


def _single_key(kernel: str, element_type: ElementTypes, library: str | None,
                implementation: str | None, snapshot: RegistrySnapshot) -> KernelTuningKey:
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a string, got {type(kernel).__name__}")
    keys = select_keys(snapshot, kernel, element_type, library=library,
                       implementation=implementation)
    if len(keys) > 1:
        raise ValueError(f"ambiguous selection: {', '.join(map(str, keys))}; "
                         "pass library=, implementation= or a single element type")
    return keys[0]


def set_kernel_tuning_parameters(
    kernel: str,
    element_type: int | str | np.dtype,
    values: Mapping[str, Any],
    *,
    library: str | None = None,
    implementation: str | None = None,
    path: PathLike | None = None,
    num_threads: int | None = None,
    persist: bool = True,
    registry: KernelTuningRegistry | None = None,
) -> dict[str, Any]:
    """Validated partial update of one key's values for this processor and thread count.

    Starts from this machine's cached profile, else from the active values,
    applies ``values``, validates the complete set, persists it to the cache
    (unless ``persist=False``) and publishes it. Invalid input raises
    (``KeyError``, ``TypeError`` or ``ValueError``) and changes neither the
    registry nor the file; so does a selection of several keys (the same kernel
    in two libraries: pass ``library=``).
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"values must be a mapping of parameter names, got {type(values).__name__}")
    registry = _registry(registry)
    snapshot = registry.snapshot()
    local = execution_descriptor(num_threads)
    key = _single_key(kernel, element_type, library, implementation, snapshot)
    schema = snapshot.schema(key)
    base = snapshot.resolve(key, local).values
    new_values = schema.update(base, values)  # invalid input raises before the file is touched
    origin = cache_file.provenance("manual")
    update = None
    if persist:
        def merged(current: cache_file.CacheFile) -> list[cache_file.CacheEntry]:
            """The update applied to this machine's entry as the file holds it under the lock."""
            nonlocal base, new_values
            _, cached = _profiles_in(current, snapshot, local)
            if key in cached:
                base = cached[key].values
                new_values = schema.update(base, values)
            return [_entry(key, local, new_values, origin, snapshot)]

        update = cache_file.update_cache(cache_file.resolve_path(path), merged)
    generation = registry.publish([PublishedProfile(key, local, new_values, origin)])
    return {"key": str(key), "previous": dict(base), "values": new_values,
            "descriptor": local.to_dict(), "generation": generation, "cache_update": update}


def reset_kernel_tuning_parameters(
    kernel: str | Iterable[str] | None = None,
    element_type: ElementTypes | None = None,
    *,
    library: str | None = None,
    implementation: str | None = None,
    path: PathLike | None = None,
    num_threads: int | None = None,
    persist: bool = True,
    registry: KernelTuningRegistry | None = None,
) -> dict[str, Any]:
    """Forget this machine's published values for the selected keys (FFTW's *forget*).

    Removes them from the registry and, with ``persist``, from the cache file,
    so the next session resolves shipped profiles or portable defaults again.
    """
    registry = _registry(registry)
    local = execution_descriptor(num_threads)
    keys = select_keys(registry.snapshot(), kernel, element_type, library=library,
                       implementation=implementation)
    update = None
    if persist:
        identities = [cache_file.CacheEntry(k, local, {}).identity() for k in keys]
        update = cache_file.update_cache(cache_file.resolve_path(path), [], remove=identities)
    generation = registry.forget(keys, local)
    return {"keys": [str(k) for k in keys], "descriptor": local.to_dict(),
            "generation": generation, "cache_update": update}


def _budget_seconds(max_duration_ms: float | None, keys: int) -> float:
    if max_duration_ms is None:
        return calibration.DEFAULT_KEY_DURATION_S * max(keys, 1)
    if isinstance(max_duration_ms, bool) or not isinstance(max_duration_ms, (int, float)) \
            or not max_duration_ms > 0:
        raise ValueError(f"max_duration_ms must be a number > 0, got {max_duration_ms!r}")
    return max_duration_ms / 1000.0


def _check_result(result: Any, key: KernelTuningKey, budget: calibration.Budget,
                  elapsed_s: float) -> None:
    """Reject what a callback returned for ``key`` unless it is that key's result and came
    in time.

    Searches check their budget between measurements, so they may overrun it by one
    measurement; a result arriving after ``max(2 * budget, budget + DURATION_SLACK_S)``
    (not counting the one-off setup the result reports, ``setup_s``) comes from a callback
    that ignored its budget and is discarded.
    """
    if not isinstance(result, calibration.CalibrationResult):
        raise calibration.CalibrationFailure(
            f"{key}: the callback returned {type(result).__name__}, not a CalibrationResult")
    if result.key != key:
        raise calibration.CalibrationFailure(f"{key}: the callback returned a result for {result.key}")
    limit = budget.max_duration_s + max(budget.max_duration_s, DURATION_SLACK_S)
    setup_s = result.setup_s if result.setup_s > 0 else 0.0
    if elapsed_s - setup_s > limit:
        setup = f", {setup_s:.3g} s of it one-off setup" if setup_s else ""
        raise calibration.CalibrationFailure(
            f"{key}: the callback ran {elapsed_s:.3g} s{setup}, past its duration budget of "
            f"{budget.max_duration_s:.3g} s (results after {limit:.3g} s are discarded)")


def _run_callbacks(
    keys: list[KernelTuningKey],
    snapshot: RegistrySnapshot,
    local: CpuExecutionDescriptor,
    max_duration_ms: float | None,
    max_memory_bytes: int | None,
    progress: Callable[[int, int, str], None] | None,
) -> dict[str, Any]:
    """Run each key's callback within its share of the budgets; collect results and failures."""
    total_s = _budget_seconds(max_duration_ms, len(keys))
    memory = calibration.DEFAULT_MEMORY_BYTES if max_memory_bytes is None else max_memory_bytes
    started = time.perf_counter()
    results, failures, skipped = [], [], []
    for index, key in enumerate(keys):
        if progress is not None:
            progress(index, len(keys), str(key))
        remaining = total_s - (time.perf_counter() - started)
        if remaining <= 0:
            skipped.append({"key": str(key), "reason": "duration budget used up before this key"})
            continue
        budget = calibration.Budget(remaining / (len(keys) - index), memory, local.num_threads)
        key_started = time.perf_counter()
        try:
            result = snapshot.callbacks[key](key, local, budget)
            _check_result(result, key, budget, time.perf_counter() - key_started)
            # A copy: the callback's own result object stays as it returned it.
            result = dataclasses.replace(result, values=snapshot.schema(key).validate(result.values))
        except Exception as exc:  # a failing callback must publish nothing
            failures.append({"key": str(key), "error": f"{type(exc).__name__}: {exc}"})
            continue
        results.append(result)
    if progress is not None:
        progress(len(keys), len(keys), "")
    return {"results": results, "failures": failures, "skipped": skipped,
            "duration_s": time.perf_counter() - started}


def measurement_summary(result: calibration.CalibrationResult) -> dict[str, Any]:
    """How many measurements a calibration took, their spreads ((p75 - p25) / median, the
    larger of the two sides; median and largest) and the best finite speedup seen: the
    evidence a cache entry or a shipped profile keeps."""
    spreads = sorted(max(getattr(m, "serial_spread", getattr(m, "portable_spread", 0.0)),
                         m.candidate_spread) for m in result.measurements)
    speedups = [m.speedup for m in result.measurements if math.isfinite(m.speedup)]
    return {
        "count": len(result.measurements),
        "median_spread": round(spreads[len(spreads) // 2], 4) if spreads else None,
        "max_spread": round(spreads[-1], 4) if spreads else None,
        "best_speedup": round(max(speedups), 4) if speedups else None,
        "duration_s": round(result.duration_s, 3),
        "load_average": None if result.load_average is None else list(result.load_average),
    }


def _publish_results(registry: KernelTuningRegistry, results: list[calibration.CalibrationResult],
                     local: CpuExecutionDescriptor, path: PathLike | None,
                     save: bool) -> tuple[int, dict[str, Any] | None]:
    """Persist (when ``save``) then publish every result in one generation."""
    origins = {id(r): cache_file.provenance("calibrated", crossover=r.crossover,
                                            portable_kept=r.portable_kept,
                                            measurements=measurement_summary(r))
               for r in results}
    update = None
    snapshot = registry.snapshot()
    if save and results:
        update = cache_file.update_cache(cache_file.resolve_path(path), [
            _entry(r.key, local, r.values, origins[id(r)], snapshot) for r in results])
    if not results:
        return registry.generation, update
    generation = registry.publish(
        [PublishedProfile(r.key, local, r.values, origins[id(r)]) for r in results])
    return generation, update


def calibrate_kernel_tuning(
    kernel: str | Iterable[str],
    element_types: ElementTypes | None = None,
    *,
    library: str | None = None,
    implementation: str | None = None,
    num_threads: int | None = None,
    max_duration_ms: float | None = None,
    max_memory_bytes: int | None = None,
    save: bool = True,
    path: PathLike | None = None,
    registry: KernelTuningRegistry | None = None,
) -> dict[str, Any]:
    """Calibrate the selected keys on this processor and thread count.

    Runs each selected key's callback; only when every one succeeds are the
    results published, in one generation, and (with ``save``) persisted to the
    cache. Schema-only keys are listed as ``unsupported``.
    """
    registry = _registry(registry)
    snapshot = registry.snapshot()
    local = execution_descriptor(num_threads)
    keys = select_keys(snapshot, kernel, element_types, library=library,
                       implementation=implementation)
    runnable = [k for k in keys if k in snapshot.callbacks]
    unsupported = [str(k) for k in keys if k not in snapshot.callbacks]
    outcome = _run_callbacks(runnable, snapshot, local, max_duration_ms, max_memory_bytes, None)
    diagnostics = [d for r in outcome["results"] for d in r.diagnostics]
    diagnostics += [f"{f['key']}: calibration failed: {f['error']}" for f in outcome["failures"]]
    if outcome["failures"]:
        diagnostics.append("a calibration failed: nothing was published or saved")
        generation, update = registry.generation, None
    else:
        generation, update = _publish_results(registry, outcome["results"], local, path, save)
    return {
        "descriptor": local.to_dict(),
        "calibrated": [] if outcome["failures"] else [r.to_dict() for r in outcome["results"]],
        "failed": outcome["failures"],
        "skipped": outcome["skipped"],
        "unsupported": unsupported,
        "diagnostics": diagnostics,
        "generation": generation,
        "cache_update": update,
        "duration_s": outcome["duration_s"],
    }


def propose_kernel_tuning_updates(
    kernels: str | Iterable[str] | None = None,
    element_types: ElementTypes | None = None,
    *,
    library: str | None = None,
    path: PathLike | None = None,
    num_threads: int | None = None,
    registry: KernelTuningRegistry | None = None,
) -> dict[str, Any]:
    """Which selected keys the cache covers for this processor and thread count (read-only).

    ``stale`` lists this machine's entries measured under other versions (see
    :mod:`onnx_light.tuning.identity`): they are not applied, so their keys are missing.

    Missing keys are split into those with a calibration callback and
    schema-only keys that need values set by hand.
    """
    snapshot = _registry(registry).snapshot()
    local = execution_descriptor(num_threads)
    keys = select_keys(snapshot, kernels, element_types, library=library)
    state, cached = _cached_profiles(path, snapshot, local)
    missing = [k for k in keys if k not in cached]
    selected = {str(k) for k in keys}
    return {
        "descriptor": local.to_dict(),
        "path": str(cache_file.resolve_path(path)),
        "covered": [str(k) for k in keys if k in cached],
        "stale": [s for s in _stale_here(state, local) if s["key"] in selected],
        "missing_calibratable": [str(k) for k in missing if k in snapshot.callbacks],
        "missing_schema_only": [
            {"key": str(k), "parameters": snapshot.schema(k).describe()}
            for k in missing if k not in snapshot.callbacks
        ],
    }


def apply_kernel_tuning_updates(
    proposal: Mapping[str, Any],
    *,
    path: PathLike | None = None,
    max_duration_ms: float | None = None,
    max_memory_bytes: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    registry: KernelTuningRegistry | None = None,
) -> dict[str, Any]:
    """Calibrate the proposal's missing calibratable keys and persist the results.

    Keys whose callback succeeded are published and saved even when another
    key failed; failures are listed with their errors. ``progress(done, total,
    key)`` is called before each key and once at the end.
    """
    if not isinstance(proposal, Mapping) or not {"descriptor", "missing_calibratable"} <= set(proposal) \
            or isinstance(proposal["missing_calibratable"], str):
        raise TypeError("proposal must be the dict returned by propose_kernel_tuning_updates")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable(done, total, key), got {type(progress).__name__}")
    descriptor = CpuExecutionDescriptor.from_dict(proposal["descriptor"])
    local = execution_descriptor(descriptor.num_threads)
    if local != descriptor:
        raise ValueError("the proposal was made for another processor: "
                         + ", ".join(descriptor.differences(local)))
    registry = _registry(registry)
    snapshot = registry.snapshot()
    keys = [KernelTuningKey.parse(text) for text in proposal["missing_calibratable"]]
    for key in keys:
        if snapshot.callback(key) is None:
            raise ValueError(f"{key} has no calibration callback")
    target = proposal.get("path") if path is None else path
    outcome = _run_callbacks(keys, snapshot, local, max_duration_ms, max_memory_bytes, progress)
    generation, update = _publish_results(registry, outcome["results"], local, target, save=True)
    failed = {f["key"] for f in outcome["failures"]} | {s["key"] for s in outcome["skipped"]}
    return {
        "descriptor": local.to_dict(),
        "applied": [r.to_dict() for r in outcome["results"]],
        "failed": outcome["failures"],
        "skipped": outcome["skipped"],
        "remaining": {
            "missing_calibratable": sorted(failed),
            "missing_schema_only": list(proposal.get("missing_schema_only", [])),
        },
        "generation": generation,
        "cache_update": update,
        "duration_s": outcome["duration_s"],
    }


def export_kernel_tuning_profile(
    output: PathLike,
    selector: str = "microarchitecture",
    kernels: str | Iterable[str] | None = None,
    element_types: ElementTypes | None = None,
    *,
    library: str | None = None,
    path: PathLike | None = None,
    num_threads: int | None = None,
    command: str = "",
    notes: str = "",
    registry: KernelTuningRegistry | None = None,
) -> dict[str, Any]:
    """Write the cache's entries for this processor and thread count (the selected keys')
    as a shippable profile file at ``output`` (:mod:`onnx_light.tuning.profile_files`).

    ``selector`` is ``"exact"`` (this vendor, family and model), ``"microarchitecture"``
    (this archspec target and its descendants) or ``"isa"`` (processors with this one's
    instruction sets). An existing file of this processor keeps its other profiles.
    ``ValueError`` when the cache holds none of the selected keys for this machine.
    """
    snapshot = _registry(registry).snapshot()
    local = execution_descriptor(num_threads)
    keys = select_keys(snapshot, kernels, element_types, library=library)
    _, cached = _cached_profiles(path, snapshot, local)
    entries = []
    for key in keys:
        if key not in cached:
            continue
        provenance = dict(cached[key].provenance)
        measured_under = provenance.pop("measured_under", None)
        provenance.pop("cache_line", None)
        entries.append({"key": str(key), "values": dict(cached[key].values),
                        "provenance": provenance, "measured_under": measured_under,
                        "revision": snapshot.schema(key).revision})
    if not entries:
        raise ValueError(f"the cache {cache_file.resolve_path(path)} holds no entry of the "
                         f"selected keys for this processor at {local.num_threads} threads: "
                         "calibrate first (tune-kernels --apply)")
    return profile_files.export_profiles(output, selector, local, entries, command=command,
                                         notes=notes)
