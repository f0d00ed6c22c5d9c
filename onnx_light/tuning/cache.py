"""The kernel tuning cache: a versioned text file of execution profiles.

Format (``docs/cache-format.md``): a header line ``onnx_light-kernel-tuning-cache 2``
then one JSON object per line with ``key``, ``descriptor``, ``values``, ``provenance``
and ``measured_under`` (the versions that invalidate the entry when they change). One
entry per line keeps damage local: a bad line costs that entry only. Nothing read from
the file is ever executed; values are plain JSON scalars checked against the registered
schema.

Reading never raises; writing happens under an inter-process lock, re-reads
and merges, and replaces the file atomically. The format itself (entries, lines,
parsing the bytes) is :mod:`onnx_light.tuning.cache_format`; this module reads,
classifies, loads and updates.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import errno
import functools
import itertools
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import platformdirs

from .cache_format import (
    FORMAT_VERSION,
    HEADER,
    LISTED_LINES,
    CacheEntry,
    CacheFile,
    CacheLine,
    CacheStatus,
    LineOutcome,
    _canonical,
    parse_cache_bytes,
)
from .cache_lock import cache_lock
from .identity import identity, stale_fields
from .keys import KernelTuningKey
from .processor import CpuExecutionDescriptor
from .registry import KernelTuningRegistry, PublishedProfile, RegistrySnapshot

__all__ = [
    "CACHE_ENV",
    "FORMAT_VERSION",
    "CacheEntry",
    "CacheFile",
    "CacheStatus",
    "LineOutcome",
    "default_cache_path",
    "load_into",
    "read_cache",
    "update_cache",
]

CACHE_ENV = "ONNX_LIGHT_KERNEL_TUNING_CACHE"
MAX_FILE_BYTES = 64 * 1024 * 1024
LOCK_TIMEOUT_S = 60.0
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO for reading must not wait
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


#: Statuses of a file that a write first backs up: it holds something the rewrite drops.
REWRITTEN_STATUSES = frozenset({CacheStatus.DAMAGED, CacheStatus.FOREIGN,
                                CacheStatus.UNSUPPORTED_VERSION})


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


def read_cache(path: Path) -> CacheFile:
    """Read and parse ``path``; every problem becomes a diagnostic, never an exception."""
    return _read(path)[0]


def _read(path: Path) -> tuple[CacheFile, bytes | None, os.stat_result | None]:
    """The parsed file, its bytes and its status. Only a regular file is read: a symbolic
    link is not followed (its target could be any file of the user's, which diagnostics
    and backups would disclose), a FIFO or device is not opened for reading."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return CacheFile(path, CacheStatus.MISSING), None, None
    except OSError as exc:
        if os.path.islink(path):
            return (CacheFile(path, CacheStatus.UNREADABLE, diagnostics=[_symlink_problem(path)]),
                    None, None)
        return CacheFile(path, CacheStatus.UNREADABLE,
                         diagnostics=[f"{path}: {exc.strerror or exc}"]), None, None
    info = None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return CacheFile(path, CacheStatus.UNREADABLE,
                             diagnostics=[f"{path}: not a regular file"]), None, info
        if info.st_size > MAX_FILE_BYTES:
            return CacheFile(path, CacheStatus.UNREADABLE, diagnostics=[
                f"{path}: larger than {MAX_FILE_BYTES} bytes"]), None, info
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return CacheFile(path, CacheStatus.UNREADABLE,
                         diagnostics=[f"{path}: {exc.strerror or exc}"]), None, None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        return CacheFile(path, CacheStatus.UNREADABLE,
                         diagnostics=[f"{path}: larger than {MAX_FILE_BYTES} bytes"]), None, info
    ownership = _ownership_problems(path, info)
    cache = parse_cache_bytes(path, data)
    cache.ownership = ownership
    cache.diagnostics[:0] = ownership
    return cache, data, info


def _symlink_problem(path: Path) -> str:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return (f"{path}: a symbolic link (to {target}); the cache must be a regular file: "
            "not followed")


def _ownership_problems(path: Path, info: os.stat_result) -> list[str]:
    """Say so when another user owns or may change the file (its content stays data only)."""
    if os.name != "posix":
        return []
    problems = []
    if info.st_uid != os.geteuid():
        problems.append(f"{path}: owned by another user (uid {info.st_uid})")
    if info.st_mode & 0o022:
        problems.append(f"{path}: writable by other users (mode {info.st_mode & 0o777:o})")
    return problems


@dataclass(frozen=True)
class EntryOutcome:
    """What loading did with one line."""

    line: int
    key: str | None
    outcome: LineOutcome
    reason: str
    matches_this_machine: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "key": self.key, "outcome": self.outcome,
                "reason": self.reason, "matches_this_machine": self.matches_this_machine}


def classify(cache: CacheFile, snapshot: RegistrySnapshot, local: CpuExecutionDescriptor,
             ) -> tuple[list[EntryOutcome], list[PublishedProfile]]:
    """Decide each line's outcome against the registry and this machine.

    Entries for this processor at any thread count load; the one matching the
    local thread count is flagged ``matches_this_machine``. Only those are validated in
    full: an entry for another processor is compared with this one and reported
    ``incompatible``, so that loading costs little per foreign entry. An entry for this
    processor measured under other versions (``measured_under``) is ``stale``; one that
    records none (format 1) cannot be shown stale and loads, its reason saying so.
    """
    outcomes: list[EntryOutcome] = []
    loadable: dict[tuple[str, str], tuple[int, PublishedProfile]] = {}
    last_line = {line.identity: line.number for line in cache.lines if line.identity}
    this_processor = _ProcessorMatch(local)
    identities: dict[KernelTuningKey, dict[str, Any]] = {}

    def current(key: KernelTuningKey) -> dict[str, Any]:
        if key not in identities:
            identities[key] = identity(key, snapshot.schema(key).revision)
        return identities[key]

    for line in cache.lines:
        key_text = line.identity[0] if line.identity else None
        if line.identity and last_line[line.identity] != line.number:
            outcomes.append(EntryOutcome(line.number, key_text, LineOutcome.DUPLICATE,
                                         f"superseded by line {last_line[line.identity]}"))
            continue
        outcome = _classify_line(line, snapshot, local, this_processor, current)
        if isinstance(outcome, PublishedProfile):
            matches = outcome.descriptor == local
            loadable[line.identity] = (line.number, outcome)
            reason = "matches this machine" if matches else (
                f"this processor at {outcome.descriptor.num_threads} threads")
            if outcome.provenance["measured_under"] is None:
                reason += "; measured under versions it does not record (cache format 1)"
            outcomes.append(EntryOutcome(line.number, key_text, LineOutcome.LOADED, reason, matches))
        else:
            outcomes.append(outcome)
    return outcomes, [profile for _, profile in loadable.values()]


class _ProcessorMatch:
    """Whether a canonical descriptor text is for this processor, by text comparison first
    (files written by onnx_light), then by value (hand-written ones)."""

    def __init__(self, local: CpuExecutionDescriptor) -> None:
        self.cpu = local.to_dict()["cpu"]
        self.comparable = {name: _comparable(value) for name, value in self.cpu.items()}
        self.prefix = '{"cpu":' + _canonical(self.cpu) + ',"num_threads":'

    def differences(self, canonical: str) -> list[str]:
        """The descriptor fields (other than ``num_threads``) that differ from this
        processor's, in declaration order; empty for this processor."""
        if canonical.startswith(self.prefix):
            return []
        descriptor = json.loads(canonical)
        cpu = descriptor.get("cpu")
        extra = sorted(set(descriptor) - {"cpu", "num_threads"})
        if not isinstance(cpu, dict):
            return ["cpu", *extra]
        names = [*self.cpu, *sorted(set(cpu) - set(self.cpu))]
        return [f"cpu.{name}" for name in names if cpu.get(name) != self.cpu.get(name)
                and _comparable(cpu.get(name)) != self.comparable.get(name)] + extra


def _comparable(value: Any) -> Any:
    """Lists compare as sets (feature lists in another order are the same processor)."""
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return sorted(set(value))
    return value


def _classify_line(line: CacheLine, snapshot: RegistrySnapshot, local: CpuExecutionDescriptor,
                   this_processor: _ProcessorMatch,
                   current: Callable[[KernelTuningKey], dict[str, Any]],
                   ) -> EntryOutcome | PublishedProfile:
    if line.identity is None:
        return EntryOutcome(line.number, None, LineOutcome.INVALID, str(line.error))
    key_text, descriptor_text = line.identity
    if line.problem is not None:
        return EntryOutcome(line.number, key_text, LineOutcome.INVALID, line.problem)
    try:
        key = _parse_key(key_text)
    except ValueError as exc:
        return EntryOutcome(line.number, key_text, LineOutcome.INVALID, str(exc))
    if key not in snapshot.schemas:
        abis = sorted(k.tuning_abi for k in snapshot.schemas
                      if replace(k, tuning_abi=key.tuning_abi) == key)
        if abis:
            return EntryOutcome(line.number, key_text, LineOutcome.STALE,
                                f"tuning ABI {key.tuning_abi}; registered ABI {abis}")
        return EntryOutcome(line.number, key_text, LineOutcome.UNKNOWN_KEY, "no schema registered")
    differs = this_processor.differences(descriptor_text)
    if differs:
        return EntryOutcome(line.number, key_text, LineOutcome.INCOMPATIBLE,
                            "processor differs in " + ", ".join(differs))
    try:
        entry = line.entry()
    except ValueError as exc:
        return EntryOutcome(line.number, key_text, LineOutcome.INVALID, str(exc))
    differs = [d for d in entry.descriptor.differences(local) if d != "num_threads"]
    if differs:  # equal as JSON, different once validated (e.g. a float family)
        return EntryOutcome(line.number, key_text, LineOutcome.INCOMPATIBLE,
                            "processor differs in " + ", ".join(differs))
    changed = [] if entry.measured_under is None else stale_fields(entry.measured_under,
                                                                   current(entry.key))
    if changed:
        return EntryOutcome(line.number, key_text, LineOutcome.STALE,
                            "measured under other versions: " + ", ".join(changed))
    try:
        values = snapshot.schema(entry.key).validate(entry.values)
    except (ValueError, TypeError, KeyError) as exc:
        return EntryOutcome(line.number, key_text, LineOutcome.INVALID, str(exc).strip("'\""))
    return PublishedProfile(entry.key, entry.descriptor, values,
                            {**entry.provenance, "cache_line": line.number,
                             "measured_under": entry.measured_under})


@functools.lru_cache(maxsize=1024)
def _parse_key(text: str) -> KernelTuningKey:
    return KernelTuningKey.parse(text)


def summarise(diagnostics: Iterable[tuple[str, str]], path: Path) -> list[str]:
    """``(outcome, diagnostic)`` pairs as diagnostics: the first :data:`LISTED_LINES`, then
    one line counting the rest by outcome."""
    listed: list[str] = []
    unlisted: collections.Counter[str] = collections.Counter()
    for outcome, diagnostic in diagnostics:
        if len(listed) < LISTED_LINES:
            listed.append(diagnostic)
        else:
            unlisted[outcome] += 1
    if unlisted:
        listed.append(f"{path}: {sum(unlisted.values())} more entries not listed ("
                      + ", ".join(f"{n} {outcome}" for outcome, n in sorted(unlisted.items()))
                      + ")")
    return listed


def load_into(registry: KernelTuningRegistry, path: Path,
              local: CpuExecutionDescriptor) -> dict[str, Any]:
    """Publish the compatible profiles of ``path`` in one new generation; never raises
    for file content. Returns the per-entry outcomes (every loaded one, the first
    :data:`LISTED_LINES` of each other outcome), their counts and the generation."""
    cache = read_cache(path)
    outcomes, profiles = classify(cache, registry.snapshot(), local)
    generation = registry.publish(profiles) if profiles else registry.generation
    cache.diagnostics += summarise(
        ((o.outcome, f"{path}:{o.line}: {o.outcome}: {o.reason}") for o in outcomes
         if o.outcome not in (LineOutcome.LOADED, LineOutcome.DUPLICATE) and o.key is not None), path)
    counts = outcome_counts(cache, outcomes)
    return {
        "path": str(path),
        "status": cache.status,
        "format_version": cache.format_version,
        "entries": [o.to_dict() for o in listed_outcomes(outcomes)],
        "counts": counts,
        "loaded": counts.get(LineOutcome.LOADED, 0),
        "ownership": cache.ownership,
        "diagnostics": cache.diagnostics,
        "generation": generation,
    }


def listed_outcomes(outcomes: Iterable[EntryOutcome]) -> list[EntryOutcome]:
    """Every loaded outcome and the first :data:`LISTED_LINES` of each other kind."""
    seen: collections.Counter[str] = collections.Counter()
    listed = []
    for outcome in outcomes:
        seen[outcome.outcome] += 1
        if outcome.outcome == LineOutcome.LOADED or seen[outcome.outcome] <= LISTED_LINES:
            listed.append(outcome)
    return listed


def outcome_counts(cache: CacheFile, outcomes: Iterable[EntryOutcome]) -> dict[str, int]:
    """How many lines had each outcome, damaged lines that were not listed included."""
    counts = collections.Counter(o.outcome for o in outcomes)
    counts[LineOutcome.INVALID] += cache.damaged - sum(line.error is not None for line in cache.lines)
    return {outcome: n for outcome, n in sorted(counts.items()) if n}


EntriesOrMerge = Iterable[CacheEntry] | Callable[[CacheFile], Iterable[CacheEntry]]


def update_cache(path: Path, entries: EntriesOrMerge,
                 remove: Iterable[tuple[str, str]] = ()) -> dict[str, Any]:
    """Merge ``entries`` into the file at ``path`` under an inter-process lock.

    ``entries`` may be a function of the file as read under the lock (a partial update
    computes its complete values from the entry then in the file, so that concurrent
    updates of other parameters are not reverted). Re-reads the file under the lock,
    replaces entries of the same identity, keeps every other entry and comment verbatim
    (other processors, thread counts, unknown libraries), writes a temporary file in the
    same folder with the file's mode (a new file: 0o644 less the umask), fsyncs it,
    replaces the file atomically and fsyncs the folder. A file that cannot be parsed
    entirely is first copied to a backup next to it, never more readable than the file.

    Only a regular file of the user's that the user may write is replaced: a symbolic
    link, another user's file, a read-only file or a file that cannot be read raise
    ``OSError`` naming the cache and leave it alone, as does every failed write.
    Removing from a file that does not exist writes nothing.
    """
    if callable(entries):
        merge = entries
    else:
        fixed = list(entries)
        merge = lambda _current: fixed  # noqa: E731
    removed = set(remove)
    _check_replaceable(path, writable=False)  # before the lock file is made next to a link
    if not callable(entries) and not fixed and not os.path.lexists(path):
        return {"path": str(path), "written": 0, "replaced": 0, "kept": 0, "removed": 0,
                "backup": None, "diagnostics": []}
    with cache_lock(path, LOCK_TIMEOUT_S):
        _check_replaceable(path)
        current, data, info = _read(path)
        if current.status == CacheStatus.UNREADABLE and os.path.lexists(path):
            raise OSError(f"kernel tuning cache {path} cannot be read, so it is not replaced: "
                          + "; ".join(current.diagnostics))
        new_lines = {entry.identity(): entry.to_line() for entry in merge(current)}
        backup = None
        if current.status in REWRITTEN_STATUSES:
            backup = _naming_the_cache(path, "backed up", _backup, path, data, info)
        kept = [(line.number, line.text) for line in current.lines
                if line.identity is not None
                and line.identity not in new_lines and line.identity not in removed]
        replaced = sum(1 for line in current.lines if line.identity in new_lines)
        body = [text for _, text in sorted(kept + current.comments)]
        _remove_stale_temporaries(path)
        mode = None if info is None else stat.S_IMODE(info.st_mode) & ~0o022
        _naming_the_cache(path, "written", _atomic_write, path,
                           "\n".join([HEADER, *body, *new_lines.values()]) + "\n", mode)
    return {
        "path": str(path),
        "written": len(new_lines),
        "replaced": replaced,
        "kept": len(kept),
        "comments": len(current.comments),
        "removed": sum(1 for line in current.lines if line.identity in removed),
        "backup": None if backup is None else str(backup),
        "diagnostics": current.diagnostics,
    }


def _check_replaceable(path: Path, writable: bool = True) -> None:
    """Raise ``OSError`` naming the cache unless ``path`` is absent or a regular file of
    the user's (with its owner's write permission, when ``writable``)."""
    try:
        info = os.lstat(path)
    except OSError:  # absent, or no folder to hold it: creating the lock file says why
        return
    if stat.S_ISLNK(info.st_mode):
        raise OSError(errno.ELOOP, f"kernel tuning cache {path} is a symbolic link (to "
                      f"{os.readlink(path)}); onnx_light only replaces a regular file: pass "
                      "the path of the file itself, or remove the link")
    if not stat.S_ISREG(info.st_mode):
        raise OSError(errno.EISDIR if stat.S_ISDIR(info.st_mode) else errno.EINVAL,  # the
                      f"kernel tuning cache {path} exists and is not a regular file")  # kind
    if os.name == "posix" and info.st_uid != os.geteuid():
        raise PermissionError(errno.EPERM, f"kernel tuning cache {path} belongs to another "
                              f"user (uid {info.st_uid}), so it is not replaced: pass a path "
                              "of your own")
    if writable and not info.st_mode & stat.S_IWUSR:
        raise PermissionError(errno.EACCES, f"kernel tuning cache {path} is read-only (mode "
                              f"{stat.S_IMODE(info.st_mode):o}), so it is not replaced: make it "
                              f"writable (chmod u+w {path}) to update it, or pass another path")


def _naming_the_cache(path: Path, what: str, write: Callable[..., Any], *args: Any) -> Any:
    """Run ``write``; an ``OSError`` (a full disk, a file too large, an immutable file or
    folder) becomes one of the same kind that names the cache, not a temporary file."""
    try:
        return write(*args)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if what != "written" and exc.filename:
            reason += f": {exc.filename}"
        message = f"kernel tuning cache {path} cannot be {what} ({reason})"
        raise (OSError(exc.errno, message) if exc.errno else OSError(message)) from exc


def _backup(path: Path, data: bytes, info: os.stat_result) -> Path:
    """Write ``data`` (the damaged file) to a new ``<path>.bad-<UTC timestamp>``: created
    exclusively, never through a symbolic link, no more readable than the file itself and
    never writable by other users."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    backup = path.with_name(f"{path.name}.bad-{stamp}")
    mode = stat.S_IMODE(info.st_mode) & 0o644
    fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(fd, mode)  # the umask may only have removed bits; keep no more than these
        handle.write(data)
    return backup


def _remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files of writers killed mid-write. Writers create them only while
    holding the lock, which the caller holds, so any that exist are stale."""
    import glob  # on first write only

    for stale in path.parent.glob(f".{glob.escape(path.name)}.{'?' * 8}.tmp"):
        with contextlib.suppress(OSError):
            stale.unlink()


def _temporary_names() -> Iterator[str]:
    """Random 8-character names for temporary files."""
    while True:
        yield os.urandom(4).hex()


def _atomic_write(path: Path, text: str, mode: int | None) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file (created exclusively, without
    following links, with ``mode``, or 0o644 less the umask), fsync, rename, fsync of the
    folder."""
    for name in itertools.islice(_temporary_names(), 100):
        temporary = path.parent / f".{path.name}.{name}.tmp"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
                         0o644)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no unused temporary file name", str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            if mode is not None:
                os.fchmod(fd, mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
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
