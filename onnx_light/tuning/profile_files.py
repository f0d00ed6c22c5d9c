"""Processor profile files: the data a kernel library ships, or an organisation installs, for
the processors it measured (``docs/kernel-tuning.md``, "Processor profiles as data").

A file is one JSON object::

    {"format": "onnx_light-processor-profiles", "version": 1,
     "provenance": {"machine": {<CpuDescriptor>}, "command": "...", "notes": "..."},
     "profiles": [{"key": "onnx_light/Add/portable[float]@cpu#1",
                   "selector": {"microarchitecture": {"name": "icelake",
                                                       "include_descendants": true}},
                   "threads": [2, 2], "revision": 1, "values": {...},
                   "provenance": {"measured": "2026-12-02T02:30:00+00:00",
                                  "measured_under": {"onnx_light": "0.1.0", ...},
                                  "measurements": {"count": 14, "median_spread": 0.03, ...}}}]}

``profile-file.schema.json`` next to this module is its JSON Schema (the tests validate the
shipped files with it); loading checks the same rules itself, without jsonschema, and names
the file and the field of the first problem. A profile whose key is not registered (another
library, another tuning ABI) or whose ``revision`` is not its kernel's is skipped and reported
(``stale``); a file whose profiles the registry rejects (bad values, ambiguity) is skipped as
a whole. Nothing here raises at import for what a file contains.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .cache import _atomic_write
from .keys import KernelTuningKey
from .processor import CpuDescriptor, CpuExecutionDescriptor
from .profiles import (
    ExactProcessor,
    InstructionSet,
    Microarchitecture,
    ProcessorProfile,
    selector_from_dict,
)
from .registry import KernelTuningRegistry

__all__ = [
    "FORMAT",
    "ORGANISATION_PRIORITY",
    "PROFILES_ENV",
    "SELECTOR_KINDS",
    "ProfileFile",
    "ProfileFileError",
    "export_profiles",
    "organisation_profile_paths",
    "parse_profile_file",
    "read_profile_text",
    "register_profile_files",
    "selector_for",
]

FORMAT = "onnx_light-processor-profiles"
VERSION = 1
#: Folders of an organisation's profile files, separated by ``os.pathsep``.
PROFILES_ENV = "ONNX_LIGHT_KERNEL_PROFILES"
#: Added to the priority of an organisation's profiles: of two profiles equally specific, the
#: organisation's (measured on its own machines) wins over the library's shipped one.
ORGANISATION_PRIORITY = 1000
SELECTOR_KINDS = ("exact", "microarchitecture", "isa")
MAX_FILE_BYTES = 16 * 1024 * 1024

_TOP = {"format", "version", "provenance", "profiles"}
_FILE_PROVENANCE = {"machine": dict, "command": str, "notes": str}
_PROFILE = {"key", "selector", "threads", "revision", "values", "priority", "provenance"}
_REQUIRED_PROFILE = {"key", "selector", "threads", "revision", "values", "provenance"}


class ProfileFileError(ValueError):
    """A profile file that breaks the format; the message names the file and the field."""


@dataclass(frozen=True)
class ProfileFile:
    """A parsed profile file: its name, its provenance and its profiles with their revisions."""

    name: str
    provenance: Mapping[str, Any]
    profiles: tuple[tuple[ProcessorProfile, int], ...] = field(default=())


def _fail(name: str, where: str, message: str) -> ProfileFileError:
    return ProfileFileError(f"{name}: {where}: {message}" if where else f"{name}: {message}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_profile_file(name: str, text: str, *, priority: int = 0,
                       provenance: Mapping[str, Any] | None = None) -> ProfileFile:
    """Parse and check the JSON ``text`` of file ``name``; :class:`ProfileFileError` names the
    file and the first field that breaks the format. ``priority`` is added to each profile's,
    ``provenance`` to each profile's provenance (with its ``revision``)."""
    try:
        data = json.loads(text, parse_constant=lambda c: _reject(name, c))
    except ValueError as exc:
        if isinstance(exc, ProfileFileError):
            raise
        raise _fail(name, "", f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _fail(name, "", "must be a JSON object")
    _check_fields(name, "", data, _TOP, _TOP)
    if data["format"] != FORMAT:
        raise _fail(name, "format", f"must be {FORMAT!r}, got {data['format']!r}")
    if data["version"] != VERSION or not _is_int(data["version"]):
        raise _fail(name, "version", f"this onnx_light reads version {VERSION}, got "
                                     f"{data['version']!r}")
    extra, file_provenance = provenance, data["provenance"]
    if not isinstance(file_provenance, dict):
        raise _fail(name, "provenance", "must be an object")
    _check_fields(name, "provenance", file_provenance, set(_FILE_PROVENANCE), {"machine"})
    for key, kind in _FILE_PROVENANCE.items():
        if key in file_provenance and not isinstance(file_provenance[key], kind):
            raise _fail(name, f"provenance.{key}", f"must be a{'n object' if kind is dict else ' string'}")
    try:
        CpuDescriptor.from_dict(file_provenance["machine"])
    except ValueError as exc:
        raise _fail(name, "provenance.machine", str(exc)) from None
    if not isinstance(data["profiles"], list):
        raise _fail(name, "profiles", "must be a list")
    selectors: dict[str, Any] = {}  # a file repeats a few selectors: each is checked once
    profiles = tuple(_profile(name, f"profiles[{index}]", item, selectors, priority,
                              extra or {})
                     for index, item in enumerate(data["profiles"]))
    return ProfileFile(name, file_provenance, profiles)


def _reject(name: str, constant: str) -> Any:
    raise _fail(name, "", f"{constant} is not allowed")


def _check_fields(name: str, where: str, data: Mapping[str, Any], allowed: set[str],
                  required: set[str]) -> None:
    prefix = f"{where}." if where else ""
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise _fail(name, f"{prefix}{unknown[0]}", f"unknown field; valid: {sorted(allowed)}")
    missing = sorted(required - set(data))
    if missing:
        raise _fail(name, f"{prefix}{missing[0]}", "missing")


def _profile(name: str, where: str, item: Any, selectors: dict[str, Any], priority: int,
             extra: Mapping[str, Any]) -> tuple[ProcessorProfile, int]:
    if not isinstance(item, dict):
        raise _fail(name, where, "must be an object")
    _check_fields(name, where, item, _PROFILE, _REQUIRED_PROFILE)
    revision = item["revision"]
    if not _is_int(revision) or revision < 1:
        raise _fail(name, f"{where}.revision", f"must be an int >= 1, got {revision!r}")
    threads = item["threads"]
    if threads is not None and not (isinstance(threads, list) and len(threads) == 2
                                    and all(_is_int(t) for t in threads)):
        raise _fail(name, f"{where}.threads", f"must be [min, max] or null, got {threads!r}")
    for key, kind in (("values", dict), ("provenance", dict), ("key", str), ("selector", dict)):
        if not isinstance(item[key], kind):
            raise _fail(name, f"{where}.{key}", f"must be a{'n object' if kind is dict else ' string'}")
    for parameter, value in item["values"].items():
        if not isinstance(value, (bool, int, float, str)):
            raise _fail(name, f"{where}.values.{parameter}", f"must be a JSON scalar, got {value!r}")
    if "priority" in item and not _is_int(item["priority"]):
        raise _fail(name, f"{where}.priority", f"must be an int, got {item['priority']!r}")
    try:
        key = KernelTuningKey.parse(item["key"])
    except ValueError as exc:
        raise _fail(name, f"{where}.key", str(exc)) from None
    text = repr(item["selector"])  # files written by onnx_light repeat it verbatim
    try:
        if text not in selectors:
            selectors[text] = selector_from_dict(item["selector"])
    except (ValueError, TypeError) as exc:
        raise _fail(name, f"{where}.selector", str(exc)) from None
    try:
        profile = ProcessorProfile(key, selectors[text], item["values"],
                                   tuple(threads) if threads is not None else None,
                                   item.get("priority", 0) + priority,
                                   {**item["provenance"], "revision": revision, **extra},
                                   f"{name}#{where}")
    except (ValueError, TypeError) as exc:
        raise _fail(name, where, str(exc)) from None
    return profile, revision


def register_profile_files(registry: KernelTuningRegistry, files: Iterable[tuple[str, str]], *,
                           priority: int = 0, source: str = "shipped") -> list[dict[str, Any]]:
    """Register the profiles of each ``(name, text)`` file, one batch per file, adding
    ``priority`` to each profile's and recording the ``file`` and its ``source`` (shipped,
    organisation) in its provenance; never raises for what a file contains.

    Returns one report per file: ``registered`` (a count), ``skipped`` (each profile not
    registered, with its ``outcome``: ``stale`` or ``unknown_key``, and the reason) and
    ``error`` (why the whole file was not registered, or None).
    """
    reports = []
    for name, text in files:
        report: dict[str, Any] = {"file": name, "registered": 0, "skipped": [], "error": None}
        reports.append(report)
        try:
            parsed = parse_profile_file(name, text, priority=priority,
                                        provenance={"file": name, "source": source})
        except ProfileFileError as exc:
            report["error"] = str(exc)
            continue
        schemas = registry.snapshot().schemas
        usable = []
        for profile, revision in parsed.profiles:
            skipped = _why_not_usable(profile, revision, schemas)
            if skipped:
                report["skipped"].append({"profile": profile.origin, "key": str(profile.key),
                                          **skipped})
                continue
            usable.append(profile)
        try:
            registry.register(profiles=usable)
        except (ValueError, TypeError, KeyError) as exc:
            report["error"] = f"{name}: not registered: {str(exc).strip(chr(39))}"
            continue
        report["registered"] = len(usable)
    return reports


def _why_not_usable(profile: ProcessorProfile, revision: int,
                    schemas: Mapping[KernelTuningKey, Any]) -> dict[str, str] | None:
    schema = schemas.get(profile.key)
    if schema is None:
        abis = sorted(k.tuning_abi for k in schemas if replace(k, tuning_abi=profile.key.tuning_abi)
                      == profile.key)
        if abis:
            return {"outcome": "stale",
                    "reason": f"tuning ABI {profile.key.tuning_abi}; registered ABI {abis}"}
        return {"outcome": "unknown_key", "reason": "no schema registered"}
    if revision != schema.revision:
        return {"outcome": "stale",
                "reason": f"measured on kernel revision {revision}; the kernel is at "
                          f"revision {schema.revision}"}
    return None


def organisation_profile_paths() -> list[Path]:
    """The ``*.json`` files of the folders ``$ONNX_LIGHT_KERNEL_PROFILES`` names, each
    folder's in name order (a missing folder has none)."""
    paths: list[Path] = []
    for folder in filter(None, os.environ.get(PROFILES_ENV, "").split(os.pathsep)):
        try:
            paths += sorted(p for p in Path(folder).expanduser().iterdir()
                            if p.suffix == ".json" and p.is_file())
        except OSError:
            continue
    return paths


def read_profile_text(path: Path) -> str:
    """The text of a profile file; ``ProfileFileError`` naming it when it cannot be read."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ProfileFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileFileError(f"{path}: cannot be read: {exc}") from None


def selector_for(kind: str, cpu: CpuDescriptor) -> ExactProcessor | Microarchitecture | InstructionSet:
    """The selector of ``kind`` (:data:`SELECTOR_KINDS`) that covers ``cpu``."""
    if kind == "exact":
        if cpu.family is None or cpu.model is None:
            raise ValueError(f"this processor ({cpu.short()}) has no known family and model: "
                             "use --selector microarchitecture or isa")
        return ExactProcessor(cpu.vendor, cpu.family, cpu.model)
    if kind == "microarchitecture":
        return Microarchitecture(cpu.microarchitecture)
    if kind == "isa":
        if not cpu.features:
            raise ValueError(f"this processor ({cpu.short()}) has no known features: use "
                             "--selector exact or microarchitecture")
        return InstructionSet(cpu.features)
    raise ValueError(f"selector must be one of {', '.join(SELECTOR_KINDS)}, got {kind!r}")


def export_profiles(path: str | os.PathLike[str], kind: str, descriptor: CpuExecutionDescriptor,
                    entries: Iterable[Mapping[str, Any]], *, command: str = "",
                    notes: str = "") -> dict[str, Any]:
    """Write (or update) the profile file at ``path`` with one profile per entry, for the
    processors selector ``kind`` covers at ``descriptor``'s thread count.

    ``entries`` are this machine's cache entries as dicts (``key``, ``values``,
    ``provenance``, ``measured_under``) with their kernel's ``revision``. An
    existing file measured on this processor keeps its other profiles (other keys or thread
    counts); one measured on another processor is refused, so that a file's provenance stays
    true. The file is replaced atomically.
    """
    target = Path(path).expanduser()
    selector = selector_for(kind, descriptor.cpu)
    threads = [descriptor.num_threads, descriptor.num_threads]
    machine = descriptor.cpu.to_dict()
    kept: list[dict[str, Any]] = []
    if target.exists():
        existing = parse_profile_file(str(target), read_profile_text(target))
        if CpuDescriptor.from_dict(existing.provenance["machine"]) != descriptor.cpu:
            raise ProfileFileError(f"{target}: its profiles were measured on another processor "
                                   f"({CpuDescriptor.from_dict(existing.provenance['machine']).short()}): "
                                   "export to another file")
        kept = [{**p.to_dict(), "revision": revision, "provenance": {
            k: v for k, v in p.provenance.items() if k != "revision"}}
            for p, revision in existing.profiles]
        notes = existing.provenance.get("notes") or notes  # a shipped file's notes are edited
    new = [{
        "key": entry["key"], "selector": selector.to_dict(), "threads": threads,
        "revision": entry["revision"], "values": dict(entry["values"]), "priority": 0,
        "provenance": {**_profile_provenance(entry)},
    } for entry in entries]
    replaced = {(p["key"], json.dumps(p["selector"], sort_keys=True), tuple(p["threads"]))
                for p in new}
    profiles = [p for p in kept if (p["key"], json.dumps(p["selector"], sort_keys=True),
                                    tuple(p["threads"] or ())) not in replaced] + new
    profiles.sort(key=lambda p: (p["key"], p["threads"] or [0, 0]))
    provenance = {"machine": machine, "command": command, "notes": notes}
    data = {"format": FORMAT, "version": VERSION, "provenance": provenance, "profiles": profiles}
    text = json.dumps(data, indent=1, allow_nan=False) + "\n"
    parse_profile_file(str(target), text)  # what is written must read back
    target.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(target, text, None)
    return {"path": str(target), "selector": selector.describe(), "threads": threads,
            "written": len(new), "kept": len(profiles) - len(new)}


def _profile_provenance(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A cache entry's provenance as a profile's: origin, date, versions, evidence."""
    source = dict(entry.get("provenance") or {})
    provenance = {"origin": source.get("origin", "unknown"),
                  "measured": source.get("created") or datetime.datetime.now(
                      datetime.timezone.utc).replace(microsecond=0).isoformat(),
                  "measured_under": dict(entry.get("measured_under") or {})}
    for name in ("crossover", "portable_kept", "measurements"):
        if name in source:
            provenance[name] = source[name]
    return provenance
