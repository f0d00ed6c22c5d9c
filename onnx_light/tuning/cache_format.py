"""The kernel tuning cache's file format: entries, lines, and parsing a file's bytes.

A header line ``onnx_light-kernel-tuning-cache 2`` then one JSON object per line
(``docs/cache-format.md``); files of version 1 (whose entries lack ``measured_under``) are
read too. Parsing never raises: each damaged line becomes a diagnostic
naming its number, and blank, comment and short lines are told apart with numpy a window at
a time, so a file of millions of damaged lines costs a scan. Reading, loading and updating
the file are :mod:`onnx_light.tuning.cache`'s.
"""

from __future__ import annotations

import enum
import functools
import heapq
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .keys import KernelTuningKey
from .processor import CpuExecutionDescriptor
from .schema import Value

FORMAT_NAME = "onnx_light-kernel-tuning-cache"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 2 added each entry's ``measured_under``
HEADER = f"{FORMAT_NAME} {FORMAT_VERSION}"
LISTED_LINES = 100  # lines named one by one in diagnostics and reports; the rest are counted


class _Text(str, enum.Enum):
    """An enum whose members are their text: JSON, reports and f-strings show the value."""

    def __str__(self) -> str:
        return self.value


class CacheStatus(_Text):
    """What reading a cache path found."""

    MISSING = "missing"
    OK = "ok"
    DAMAGED = "damaged"  # some lines unusable
    FOREIGN = "foreign"  # no header
    UNSUPPORTED_VERSION = "unsupported_version"
    UNREADABLE = "unreadable"


class LineOutcome(_Text):
    """What loading did with one line of a cache."""

    LOADED = "loaded"
    INCOMPATIBLE = "incompatible"  # another processor
    STALE = "stale"  # another tuning ABI of a registered key, or measured under other versions
    INVALID = "invalid"
    UNKNOWN_KEY = "unknown_key"
    DUPLICATE = "duplicate"  # superseded by a later line of the same identity


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True)
class CacheEntry:
    """One profile to persist: key, execution descriptor, complete values, provenance, and
    the versions it was measured under (:func:`onnx_light.tuning.identity.identity`; None for
    an entry of format 1, which did not record them)."""

    key: KernelTuningKey
    descriptor: CpuExecutionDescriptor
    values: Mapping[str, Value]
    provenance: Mapping[str, Any] = field(default_factory=dict)
    measured_under: Mapping[str, Any] | None = None

    def identity(self) -> tuple[str, str]:
        """What makes two entries the same profile: the key and the descriptor."""
        return (str(self.key), _canonical(self.descriptor.to_dict()))

    def to_line(self) -> str:
        """The entry as one line of the file (no newline)."""
        record = {"key": str(self.key), "descriptor": self.descriptor.to_dict(),
                  "values": dict(self.values), "provenance": dict(self.provenance)}
        if self.measured_under is not None:
            record["measured_under"] = dict(self.measured_under)
        return json.dumps(record, separators=(",", ":"), allow_nan=False)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


@dataclass(frozen=True)
class CacheLine:
    """One entry line as read: its number, raw text and identity, or the error that makes it
    no entry (then ``text`` is empty: damaged lines are reported, never carried over).
    ``problem`` is what :func:`check_fields` found wrong with an entry's fields."""

    number: int
    text: str
    identity: tuple[str, str] | None
    error: str | None
    problem: str | None = None

    @classmethod
    def parse(cls, number: int, text: str) -> CacheLine:
        """Parse a line into its identity; never raises."""
        try:
            record = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            return cls(number, "", None, f"not a JSON object: {exc}")
        if not isinstance(record, dict):
            return cls(number, "", None, "not a JSON object")
        key, descriptor = record.get("key"), record.get("descriptor")
        if not isinstance(key, str) or not isinstance(descriptor, dict):
            return cls(number, "", None, "needs a string 'key' and an object 'descriptor'")
        try:
            identity = (key, _canonical(descriptor))
        except (ValueError, RecursionError) as exc:  # e.g. 1e400 parses as inf
            return cls(number, "", None, f"bad descriptor: {exc}")
        try:
            check_fields(record)
        except ValueError as exc:
            return cls(number, text, identity, None, str(exc))
        return cls(number, text, identity, None)

    @property
    def record(self) -> Mapping[str, Any] | None:
        """The parsed line (parsed again on each use: only lines that matter are)."""
        return None if self.error is not None else json.loads(self.text)

    def entry(self) -> CacheEntry:
        """The typed entry; ``ValueError`` naming what is wrong."""
        if self.identity is None:
            raise ValueError(self.error)
        record = json.loads(self.text)
        check_fields(record)
        values, origin = record.get("values"), record.get("provenance", {})
        key = KernelTuningKey.parse(record["key"])
        try:
            descriptor = _descriptor(self.identity[1])
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"bad descriptor: {exc}") from None
        return CacheEntry(key, descriptor, values, origin, record.get("measured_under"))


def check_fields(record: Mapping[str, Any]) -> None:
    """``ValueError`` unless the entry has only known fields, of the right kinds."""
    unknown = sorted(set(record) - {"key", "descriptor", "values", "provenance", "measured_under"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}")
    if not isinstance(record.get("values"), dict):
        raise ValueError("'values' must be an object")
    for name in ("provenance", "measured_under"):
        if not isinstance(record.get(name, {}), dict):
            raise ValueError(f"{name!r} must be an object")


@functools.lru_cache(maxsize=256)
def _descriptor(canonical: str) -> CpuExecutionDescriptor:
    """The (immutable) descriptor of a canonical descriptor text, validated once per text: the
    entries of a cache share a few descriptors, and validating one is most of an entry's load."""
    return CpuExecutionDescriptor.from_dict(json.loads(canonical))


@dataclass
class CacheFile:
    """What was read from a cache path, and its :class:`CacheStatus`.

    ``lines`` holds every entry line and the first :data:`LISTED_LINES` damaged ones;
    ``damaged`` counts all damaged lines; ``comments`` are the ``#`` lines with their numbers,
    which an update carries over.
    """

    path: Path
    status: CacheStatus
    format_version: int | None = None
    lines: list[CacheLine] = field(default_factory=list)
    diagnostics: list[str] = field(default_factory=list)
    ownership: list[str] = field(default_factory=list)
    comments: list[tuple[int, str]] = field(default_factory=list)
    damaged: int = 0

    @property
    def exists(self) -> bool:
        return self.status != CacheStatus.MISSING


# A line shorter than this cannot hold an identity ('{"key":"","descriptor":{}}'), so it is
# damaged unless blank or a comment. Blank, comment and short lines are told apart with numpy,
# a window of the file at a time; past the first LISTED_LINES damaged lines, short ones are
# only counted: a file of millions of short lines costs a scan, not an object per line.
# Comments past MAX_COMMENTS count as damaged lines (an update backs the file up).
MIN_ENTRY_BYTES = 26
MAX_COMMENTS = 10_000
_WINDOW_BYTES = 1 << 20
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[list(b" \t\n\r\v\f")] = True


def parse_cache_bytes(path: Path, data: bytes) -> CacheFile:
    """Parse the bytes of a cache file (see :func:`read_cache`)."""
    first_end = data.find(b"\n")
    first_end = len(data) if first_end < 0 else first_end
    header = data[:first_end].decode("utf-8", "replace").strip()
    if not header.startswith(FORMAT_NAME + " "):
        reason = "empty file" if not data.strip() else f"not a kernel tuning cache ({header[:60]!r})"
        return CacheFile(path, CacheStatus.FOREIGN, diagnostics=[f"{path}:1: {reason}"])
    version_text = header[len(FORMAT_NAME) + 1 :].strip()
    readable = {str(version): version for version in READABLE_VERSIONS}
    if version_text not in readable:
        return CacheFile(path, CacheStatus.UNSUPPORTED_VERSION, diagnostics=[
            f"{path}:1: format version {version_text!r}; this onnx_light reads "
            f"{', '.join(readable)}"])
    version = readable[version_text]
    diagnostics = [] if version == FORMAT_VERSION else [
        f"{path}:1: format version {version}: its entries do not record the versions they were "
        f"measured under, so they load unchecked; recalibrating records them (the next update "
        f"writes version {FORMAT_VERSION})"]
    parser = _LineParser(CacheFile(path, CacheStatus.OK, version, diagnostics=diagnostics))
    position, number = first_end + 1, 2  # the start of line ``number``
    while position < len(data):
        stop = _window_end(data, position)
        number += parser.window(data, position, stop, number)
        position = stop + 1
    return parser.finish()


def _window_end(data: bytes, position: int) -> int:
    """Where the window of whole lines starting at ``position`` ends (a newline, or the end
    of the data): about _WINDOW_BYTES on, further for a longer line."""
    end = position + _WINDOW_BYTES
    if end >= len(data):
        return len(data)
    stop = data.rfind(b"\n", position, end)
    if stop < 0:
        stop = data.find(b"\n", end)
    return len(data) if stop < 0 else stop


class _LineParser:
    """Collects the lines of one file: entries, comments, and damaged lines (the first
    :data:`LISTED_LINES` parsed and named, the others counted)."""

    def __init__(self, result: CacheFile) -> None:
        self.result = result
        self.entries: list[CacheLine] = []
        self.broken: list[CacheLine] = []
        self.damaged = 0

    def window(self, data: bytes, start: int, stop: int, number: int) -> int:
        """Parse the lines of ``data[start:stop]``, the first numbered ``number``; returns
        how many lines there were."""
        window = np.frombuffer(data, np.uint8, count=stop - start, offset=start)
        ends = np.append(np.flatnonzero(window == 10), stop - start)
        starts = np.concatenate(([0], ends[:-1] + 1))
        solid = np.append(np.flatnonzero(~_WHITESPACE[window]), stop - start)
        first = solid[np.searchsorted(solid, starts)]  # each line's first non-blank byte
        used = first < ends
        comment = used & (np.append(window, 0)[first] == ord("#"))
        entry = used & ~comment & (ends - starts >= MIN_ENTRY_BYTES)
        comments = np.flatnonzero(comment)
        kept = comments[:max(MAX_COMMENTS - len(self.result.comments), 0)]
        for index in np.union1d(kept, np.flatnonzero(entry)).tolist():
            self.line(number + index, data[start + starts[index]:start + ends[index]])
        too_many = f"more than {MAX_COMMENTS} comment lines"
        for lines, comments_over in ((np.flatnonzero(used & ~comment & ~entry), False),
                                     (comments[len(kept):], True)):
            listed = lines[:max(LISTED_LINES - len(self.broken), 0)].tolist()
            for index in listed:
                if comments_over:
                    self._damaged(CacheLine(number + index, "", None, too_many))
                else:
                    self.line(number + index, data[start + starts[index]:start + ends[index]])
            self.damaged += len(lines) - len(listed)
        return len(ends)

    def line(self, number: int, raw: bytes) -> None:
        """A comment, an entry or a damaged line."""
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            self._damaged(CacheLine(number, "", None, "not UTF-8 text"))
            return
        if not text:
            return
        if text.startswith("#"):
            self.result.comments.append((number, text))
            return
        line = CacheLine.parse(number, text)
        if line.error is None:
            self.entries.append(line)
        else:
            self._damaged(line)

    def _damaged(self, line: CacheLine) -> None:
        self.damaged += 1
        if len(self.broken) < LISTED_LINES:
            self.broken.append(line)

    def finish(self) -> CacheFile:
        result = self.result
        self.broken.sort(key=lambda line: line.number)
        result.lines = list(heapq.merge(self.entries, self.broken, key=lambda line: line.number))
        result.comments.sort()
        result.damaged = self.damaged
        if self.damaged:
            result.status = CacheStatus.DAMAGED
            path = result.path
            result.diagnostics += [f"{path}:{line.number}: {line.error}" for line in self.broken]
            if self.damaged > len(self.broken):
                result.diagnostics.append(
                    f"{path}: {self.damaged - len(self.broken)} more damaged lines not listed")
        return result
