"""The kernel tuning cache: a versioned text file of execution profiles.

Format (``docs/cache-format.md``): a header line ``onnx_light-kernel-tuning-cache 1``
then one JSON object per line with ``key``, ``descriptor``, ``values`` and
``provenance``. One entry per line keeps damage local: a bad line costs that
entry only. Nothing read from the file is ever executed; values are plain JSON
scalars checked against the registered schema.

Reading never raises; writing happens under an inter-process lock, re-reads
and merges, and replaces the file atomically.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import glob
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import platformdirs

from .keys import KernelTuningKey
from .processor import CpuExecutionDescriptor
from .registry import KernelTuningRegistry, PublishedProfile, RegistrySnapshot
from .schema import Value

__all__ = [
    "CACHE_ENV",
    "FORMAT_VERSION",
    "CacheEntry",
    "CacheFile",
    "default_cache_path",
    "load_into",
    "read_cache",
    "update_cache",
]

CACHE_ENV = "ONNX_LIGHT_KERNEL_TUNING_CACHE"
FORMAT_NAME = "onnx_light-kernel-tuning-cache"
FORMAT_VERSION = 1
HEADER = f"{FORMAT_NAME} {FORMAT_VERSION}"
MAX_FILE_BYTES = 64 * 1024 * 1024
LOCK_TIMEOUT_S = 60.0
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

# Per-entry load outcomes.
LOADED, INCOMPATIBLE, STALE, INVALID, UNKNOWN_KEY, DUPLICATE = (
    "loaded", "incompatible", "stale", "invalid", "unknown_key", "duplicate")


def default_cache_path() -> Path:
    """``$ONNX_LIGHT_KERNEL_TUNING_CACHE`` or a file in the user cache directory."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("onnx_light")) / "kernel-tuning-cache.txt"


def resolve_path(path: str | os.PathLike[str] | None) -> Path:
    """An explicit ``path`` or the default; rejects non-path types with a clear error."""
    if path is None:
        return default_cache_path()
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path).expanduser()


def onnx_light_version() -> str:
    """The installed onnx_light version, for provenance."""
    from importlib import metadata  # imported when needed: 25 ms of every import otherwise

    try:
        return metadata.version("onnx_light")
    except metadata.PackageNotFoundError:
        return "unknown"


def provenance(origin: str, **details: Any) -> dict[str, Any]:
    """Provenance of a new entry: how it was made, when, by which version."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return {"origin": origin, "created": now.isoformat(), "onnx_light": onnx_light_version(),
            **details}


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class CacheEntry:
    """One profile to persist: key, execution descriptor, complete values, provenance."""

    key: KernelTuningKey
    descriptor: CpuExecutionDescriptor
    values: Mapping[str, Value]
    provenance: Mapping[str, Any] = field(default_factory=dict)

    def identity(self) -> tuple[str, str]:
        """What makes two entries the same profile: the key and the descriptor."""
        return (str(self.key), _canonical(self.descriptor.to_dict()))

    def to_line(self) -> str:
        """The entry as one line of the file (no newline)."""
        return json.dumps(
            {"key": str(self.key), "descriptor": self.descriptor.to_dict(),
             "values": dict(self.values), "provenance": dict(self.provenance)},
            separators=(",", ":"), allow_nan=False,
        )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


@dataclass(frozen=True)
class CacheLine:
    """One entry line as read: its number, raw text, identity and parsed form or error."""

    number: int
    text: str
    identity: tuple[str, str] | None
    record: Mapping[str, Any] | None
    error: str | None

    @classmethod
    def parse(cls, number: int, text: str) -> CacheLine:
        """Parse a line into its identity and record; never raises."""
        try:
            record = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            return cls(number, text, None, None, f"not a JSON object: {exc}")
        if not isinstance(record, dict):
            return cls(number, text, None, None, "not a JSON object")
        key, descriptor = record.get("key"), record.get("descriptor")
        if not isinstance(key, str) or not isinstance(descriptor, dict):
            return cls(number, text, None, None, "needs a string 'key' and an object 'descriptor'")
        try:
            identity = (key, _canonical(descriptor))
        except (ValueError, RecursionError) as exc:  # e.g. 1e400 parses as inf
            return cls(number, text, None, None, f"bad descriptor: {exc}")
        return cls(number, text, identity, record, None)

    def entry(self) -> CacheEntry:
        """The typed entry; ``ValueError`` naming what is wrong."""
        if self.record is None:
            raise ValueError(self.error)
        record = self.record
        unknown = sorted(set(record) - {"key", "descriptor", "values", "provenance"})
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}")
        values, origin = record.get("values"), record.get("provenance", {})
        if not isinstance(values, dict):
            raise ValueError("'values' must be an object")
        if not isinstance(origin, dict):
            raise ValueError("'provenance' must be an object")
        key = KernelTuningKey.parse(record["key"])
        try:
            descriptor = _descriptor(self.identity[1])
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"bad descriptor: {exc}") from None
        return CacheEntry(key, descriptor, values, origin)


@functools.lru_cache(maxsize=256)
def _descriptor(canonical: str) -> CpuExecutionDescriptor:
    """The (immutable) descriptor of a canonical descriptor text, validated once per text: the
    entries of a cache share a few descriptors, and validating one is most of an entry's load."""
    return CpuExecutionDescriptor.from_dict(json.loads(canonical))


@dataclass
class CacheFile:
    """What was read from a cache path. ``status`` is one of:

    ``missing``, ``ok``, ``damaged`` (some lines unusable), ``foreign`` (no
    header), ``unsupported_version``, ``unreadable``.
    """

    path: Path
    status: str
    format_version: int | None = None
    lines: list[CacheLine] = field(default_factory=list)
    diagnostics: list[str] = field(default_factory=list)
    ownership: list[str] = field(default_factory=list)

    @property
    def exists(self) -> bool:
        return self.status != "missing"


def read_cache(path: Path) -> CacheFile:
    """Read and parse ``path``; every problem becomes a diagnostic, never an exception."""
    try:
        if not path.exists():
            if path.is_symlink():
                return CacheFile(path, "unreadable", diagnostics=[f"{path}: dangling symlink"])
            return CacheFile(path, "missing")
        if not path.is_file():
            return CacheFile(path, "unreadable", diagnostics=[f"{path}: not a regular file"])
        if path.stat().st_size > MAX_FILE_BYTES:
            return CacheFile(path, "unreadable",
                             diagnostics=[f"{path}: larger than {MAX_FILE_BYTES} bytes"])
        data = path.read_bytes()
        ownership = _ownership_problems(path)
    except OSError as exc:
        return CacheFile(path, "unreadable", diagnostics=[f"{path}: {exc.strerror or exc}"])
    cache = parse_cache_bytes(path, data)
    cache.ownership = ownership
    cache.diagnostics[:0] = ownership
    return cache


def _ownership_problems(path: Path) -> list[str]:
    """Say so when another user owns or may change the file (its content stays data only)."""
    if os.name != "posix":
        return []
    info = path.stat()
    problems = []
    if info.st_uid != os.geteuid():
        problems.append(f"{path}: owned by another user (uid {info.st_uid})")
    if info.st_mode & 0o022:
        problems.append(f"{path}: writable by other users (mode {info.st_mode & 0o777:o})")
    return problems


def parse_cache_bytes(path: Path, data: bytes) -> CacheFile:
    """Parse the bytes of a cache file (see :func:`read_cache`)."""
    raw_lines = data.split(b"\n")
    header = raw_lines[0].decode("utf-8", "replace").strip()
    if not header.startswith(FORMAT_NAME + " "):
        reason = "empty file" if not data.strip() else f"not a kernel tuning cache ({header[:60]!r})"
        return CacheFile(path, "foreign", diagnostics=[f"{path}:1: {reason}"])
    version_text = header[len(FORMAT_NAME) + 1 :].strip()
    if version_text != str(FORMAT_VERSION):
        return CacheFile(path, "unsupported_version", diagnostics=[
            f"{path}:1: format version {version_text!r}; this onnx_light reads {FORMAT_VERSION}"])
    result = CacheFile(path, "ok", FORMAT_VERSION)
    for number, raw in enumerate(raw_lines[1:], start=2):
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            result.lines.append(CacheLine(number, "", None, None, "not UTF-8 text"))
            continue
        if text and not text.startswith("#"):
            result.lines.append(CacheLine.parse(number, text))
    for line in result.lines:
        if line.error is not None:
            result.status = "damaged"
            result.diagnostics.append(f"{path}:{line.number}: {line.error}")
    return result


@dataclass(frozen=True)
class EntryOutcome:
    """What loading did with one line."""

    line: int
    key: str | None
    outcome: str
    reason: str
    matches_this_machine: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "key": self.key, "outcome": self.outcome,
                "reason": self.reason, "matches_this_machine": self.matches_this_machine}


def classify(cache: CacheFile, snapshot: RegistrySnapshot, local: CpuExecutionDescriptor,
             ) -> tuple[list[EntryOutcome], list[PublishedProfile]]:
    """Decide each line's outcome against the registry and this machine.

    Entries for this processor at any thread count load; the one matching the
    local thread count is flagged ``matches_this_machine``.
    """
    outcomes: list[EntryOutcome] = []
    loadable: dict[tuple[str, str], tuple[int, PublishedProfile]] = {}
    last_line = {line.identity: line.number for line in cache.lines if line.identity}
    for line in cache.lines:
        key_text = line.identity[0] if line.identity else None
        if line.identity and last_line[line.identity] != line.number:
            outcomes.append(EntryOutcome(line.number, key_text, DUPLICATE,
                                         f"superseded by line {last_line[line.identity]}"))
            continue
        outcome = _classify_line(line, snapshot, local)
        if isinstance(outcome, PublishedProfile):
            matches = outcome.descriptor == local
            loadable[line.identity] = (line.number, outcome)
            reason = "matches this machine" if matches else (
                f"this processor at {outcome.descriptor.num_threads} threads")
            outcomes.append(EntryOutcome(line.number, key_text, LOADED, reason, matches))
        else:
            outcomes.append(outcome)
    return outcomes, [profile for _, profile in loadable.values()]


def _classify_line(line: CacheLine, snapshot: RegistrySnapshot,
                   local: CpuExecutionDescriptor) -> EntryOutcome | PublishedProfile:
    key_text = line.identity[0] if line.identity else None
    try:
        entry = line.entry()
    except ValueError as exc:
        return EntryOutcome(line.number, key_text, INVALID, str(exc))
    if entry.key not in snapshot.schemas:
        abis = sorted(k.tuning_abi for k in snapshot.schemas
                      if replace(k, tuning_abi=entry.key.tuning_abi) == entry.key)
        if abis:
            return EntryOutcome(line.number, key_text, STALE,
                                f"tuning ABI {entry.key.tuning_abi}; registered ABI {abis}")
        return EntryOutcome(line.number, key_text, UNKNOWN_KEY, "no schema registered")
    differs = [d for d in entry.descriptor.differences(local) if d != "num_threads"]
    if differs:
        return EntryOutcome(line.number, key_text, INCOMPATIBLE,
                            "processor differs in " + ", ".join(differs))
    try:
        values = snapshot.schema(entry.key).validate(entry.values)
    except (ValueError, TypeError, KeyError) as exc:
        return EntryOutcome(line.number, key_text, INVALID, str(exc).strip("'\""))
    return PublishedProfile(entry.key, entry.descriptor, values,
                            {**entry.provenance, "cache_line": line.number})


def load_into(registry: KernelTuningRegistry, path: Path,
              local: CpuExecutionDescriptor) -> dict[str, Any]:
    """Publish the compatible profiles of ``path`` in one new generation; never raises
    for file content. Returns the per-entry outcomes and the generation."""
    cache = read_cache(path)
    outcomes, profiles = classify(cache, registry.snapshot(), local)
    generation = registry.publish(profiles) if profiles else registry.generation
    unparsed = {line.number for line in cache.lines if line.error is not None}  # reported already
    for outcome in outcomes:
        if outcome.outcome not in (LOADED, DUPLICATE) and outcome.line not in unparsed:
            cache.diagnostics.append(f"{path}:{outcome.line}: {outcome.outcome}: {outcome.reason}")
    return {
        "path": str(path),
        "status": cache.status,
        "format_version": cache.format_version,
        "entries": [o.to_dict() for o in outcomes],
        "loaded": sum(o.outcome == LOADED for o in outcomes),
        "ownership": cache.ownership,
        "diagnostics": cache.diagnostics,
        "generation": generation,
    }


def update_cache(path: Path, entries: Iterable[CacheEntry],
                 remove: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
    """Merge ``entries`` into the file at ``path`` under an inter-process lock.

    Re-reads the file under the lock, replaces entries of the same identity,
    keeps every other entry verbatim (other processors, thread counts, unknown
    libraries), writes a temporary file in the same folder, fsyncs it, replaces
    the file atomically and fsyncs the folder. A file that cannot be parsed
    entirely is first copied to a backup next to it; an existing file that
    cannot be read at all is left alone and the update raises ``OSError``.
    Removing from a file that does not exist writes nothing.
    """
    entries = list(entries)
    new_lines = {entry.identity(): entry.to_line() for entry in entries}
    removed = set(remove)
    if path.exists() and not path.is_file():
        raise IsADirectoryError(f"kernel tuning cache {path} exists and is not a regular file")
    if not new_lines and not path.exists():
        return {"path": str(path), "written": 0, "replaced": 0, "kept": 0, "removed": 0,
                "backup": None, "diagnostics": []}
    import filelock  # imported when needed: it pulls in asyncio (15 ms of every import otherwise)

    with filelock.FileLock(_prepare_lock_file(path), timeout=LOCK_TIMEOUT_S):
        current = read_cache(path)
        if current.status == "unreadable" and path.exists():
            raise OSError(f"kernel tuning cache {path} cannot be read, so it is not replaced: "
                          + "; ".join(current.diagnostics))
        backup = None
        if current.status in ("damaged", "foreign", "unsupported_version") and path.is_file():
            backup = _backup(path)
        kept = [line.text for line in current.lines
                if line.identity is not None
                and line.identity not in new_lines and line.identity not in removed]
        replaced = sum(1 for line in current.lines if line.identity in new_lines)
        _remove_stale_temporaries(path)
        _atomic_write(path, "\n".join([HEADER, *kept, *new_lines.values()]) + "\n")
    return {
        "path": str(path),
        "written": len(new_lines),
        "replaced": replaced,
        "kept": len(kept),
        "removed": sum(1 for line in current.lines if line.identity in removed),
        "backup": None if backup is None else str(backup),
        "diagnostics": current.diagnostics,
    }


def _prepare_lock_file(path: Path) -> str:
    """Create the cache's folder and its lock file ``<path>.lock``; returns the lock's path.

    A location that cannot hold them (a regular file as folder, ``/proc``) raises
    ``OSError`` naming the cache at once, instead of a lock timeout a minute later.
    The lock file is opened without following a symbolic link.
    """
    lock = str(path) + ".lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)
    except OSError as exc:
        raise OSError(exc.errno, f"kernel tuning cache {path} cannot be written "
                                 f"({exc.strerror}: {exc.filename})") from None
    os.close(fd)
    return lock


def _backup(path: Path) -> Path:
    """Copy ``path`` to a new ``<path>.bad-<UTC timestamp>``: created exclusively, never
    through a symbolic link, never writable by other users."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    backup = path.with_name(f"{path.name}.bad-{stamp}")
    data = path.read_bytes()
    fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return backup


def _remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files of writers killed mid-write. Writers create them only while
    holding the lock, which the caller holds, so any that exist are stale."""
    for stale in path.parent.glob(f".{glob.escape(path.name)}.{'?' * 8}.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()


def _atomic_write(path: Path, text: str) -> None:
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(folder: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

