"""Cache files for fuzzing: a corpus of valid lines for this machine, mutations of a file's
bytes, and the oracle that says which entries must still load after a mutation.

Everything is deterministic given a seed, so any failing case can be replayed. Used by
``tools/cache_fuzz.py``, ``tools/_cache_processes.py`` and the reliability tests.
"""

from __future__ import annotations

import json
import pickle
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from _small_model import check_small_session

from onnx_light.tuning.cache import HEADER, CacheEntry, CacheStatus, LineOutcome
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.processor import CpuExecutionDescriptor

MIN_ELEMENTS = "parallel.minimum_elements"

ADD = KernelTuningKey("onnx_light", "Add", "portable", "float")
RELU = KernelTuningKey("onnx_light", "Relu", "portable", "float")
MATMUL = KernelTuningKey("onnx_light", "MatMul", "portable", "float", tuning_abi=2)
MATMUL_MODES = ("blas", "split_rows", "split_columns", "split")
CORPUS_THREADS = (1, 2, 3, 4)
FIXED_PROVENANCE = {"origin": "manual", "created": "2026-01-01T00:00:00+00:00", "onnx_light": "test"}


def corpus_entries(local: CpuExecutionDescriptor) -> list[CacheEntry]:
    """Entries for this processor at 1-4 threads, with values that force the parallel paths
    of the small model's kernels (small thresholds), so a session exercises them."""
    entries = []
    for threads in CORPUS_THREADS:
        where = CpuExecutionDescriptor(local.cpu, threads)
        entries += [
            CacheEntry(ADD, where, {MIN_ELEMENTS: threads + 1}, FIXED_PROVENANCE),
            CacheEntry(RELU, where, {MIN_ELEMENTS: 7 * threads}, FIXED_PROVENANCE),
            CacheEntry(MATMUL, where, {"parallel.minimum_flops": threads,
                                       "parallel.mode": MATMUL_MODES[threads % 4],
                                       "split.minimum_rows": threads,
                                       "weights.product": "packed"}, FIXED_PROVENANCE),
        ]
    return entries


def corpus_lines(local: CpuExecutionDescriptor) -> tuple[list[str], list[str]]:
    """(every line of a valid cache file after the header, the lines that must load here).

    Besides the loadable entries: one for another processor and one of an unknown library,
    both kept but not loaded."""
    good = [entry.to_line() for entry in corpus_entries(local)]
    other = local.to_dict()
    other["cpu"] = {**other["cpu"], "vendor": "elsewhere", "microarchitecture": "not_this_one"}
    foreign = json.dumps({"key": str(ADD), "descriptor": other, "values": {MIN_ELEMENTS: 9},
                          "provenance": FIXED_PROVENANCE}, separators=(",", ":"))
    stranger = json.dumps({"key": "otherlib/Conv/fast[float]@cpu#3", "descriptor": local.to_dict(),
                           "values": {"x": 1}, "provenance": {}}, separators=(",", ":"))
    lines = [*good[:6], foreign, *good[6:], stranger]
    return lines, good


def cache_bytes(lines: Iterable[str]) -> bytes:
    return ("\n".join([HEADER, *lines]) + "\n").encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def line_identity(text: str) -> tuple[str, str] | None:
    """The identity (key, canonical descriptor) a loader gives a line, or None when the line
    cannot have one. Written independently of cache.py: it is the oracle."""
    try:
        record = json.loads(text, parse_constant=_reject_constant)
        if not isinstance(record, dict):
            return None
        key, descriptor = record.get("key"), record.get("descriptor")
        if not isinstance(key, str) or not isinstance(descriptor, dict):
            return None
        return key, json.dumps(descriptor, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (ValueError, RecursionError, TypeError):
        return None


def lines_that_must_load(good: Iterable[str], data: bytes) -> set[int]:
    """Line numbers (1-based) of ``data`` that must load: an untouched good line, under an
    intact header, not superseded by a later line of the same identity."""
    raw = data.split(b"\n")
    if raw[0].rstrip(b"\r") != HEADER.encode():
        return set()
    good = set(good)
    texts: dict[int, str] = {}
    for number, line in enumerate(raw[1:], start=2):
        try:
            text = line.decode("utf-8").strip()
        except UnicodeDecodeError:
            continue
        if text and not text.startswith("#"):
            texts[number] = text
    last: dict[tuple[str, str], int] = {}
    for number, text in texts.items():
        identity = line_identity(text)
        if identity is not None:
            last[identity] = number
    return {number for number, text in texts.items()
            if text in good and last.get(line_identity(text)) == number}


# Mutations: each takes a random generator and the file's bytes and returns new bytes.

def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _entry_positions(lines: list[bytes]) -> list[int]:
    return [i for i, line in enumerate(lines) if i > 0 and line.strip()] or [0]


def truncate(rng: random.Random, data: bytes) -> bytes:
    return data[:rng.randrange(len(data) + 1)]


def flip_bits(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def overwrite_bytes(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if out:
            start = rng.randrange(len(out))
            out[start:start + rng.randint(1, 16)] = bytes(rng.randrange(256) for _ in range(16))
    return bytes(out)


def swap_lines(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    if len(lines) > 1:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    return b"\n".join(lines)


def duplicate_line(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    lines.insert(rng.randrange(1, len(lines) + 1), lines[rng.randrange(len(lines))])
    return b"\n".join(lines)


def delete_line(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    del lines[rng.randrange(len(lines))]
    return b"\n".join(lines)


def _edit_record(rng: random.Random, data: bytes,
                 edit: Callable[[random.Random, dict], None]) -> bytes:
    """Parse one random entry line, apply ``edit`` to its JSON object, write it back."""
    lines = _lines(data)
    index = rng.choice(_entry_positions(lines))
    try:
        record = json.loads(lines[index])
    except (ValueError, RecursionError):
        return flip_bits(rng, data)
    if not isinstance(record, dict):
        return flip_bits(rng, data)
    edit(rng, record)
    lines[index] = json.dumps(record, separators=(",", ":"), allow_nan=True).encode()
    return b"\n".join(lines)


def _paths(record: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a JSON object."""
    found = [prefix] if prefix else []
    if isinstance(record, dict):
        for key, value in record.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(record, list):
        for index, value in enumerate(record):
            found += _paths(value, (*prefix, index))
    return found


def _set(record: Any, path: tuple, value: Any) -> None:
    for part in path[:-1]:
        record = record[part]
    record[path[-1]] = value


HUGE_NUMBERS = ("9" * 19, "9" * 400, "9" * 5000, "-" + "9" * 30, "1e400", "-1e400", "1e-400",
                "18446744073709551616", "9223372036854775808", "-9223372036854775809", "0", "-1",
                "1.5", "4.0")


def huge_number(rng: random.Random, data: bytes) -> bytes:
    """A number token replaced by a huge, tiny, negative or fractional one."""
    lines = _lines(data)
    index = rng.choice(_entry_positions(lines))
    line = lines[index].decode("utf-8", "replace")
    digits = [i for i, c in enumerate(line) if c.isdigit() and (i == 0 or not line[i - 1].isdigit())]
    if not digits:
        return flip_bits(rng, data)
    start = rng.choice(digits)
    end = start
    while end < len(line) and line[end].isdigit():
        end += 1
    lines[index] = (line[:start] + rng.choice(HUGE_NUMBERS) + line[end:]).encode()
    return b"\n".join(lines)


def not_a_number(rng: random.Random, data: bytes) -> bytes:
    """A value replaced by NaN or an infinity (invalid JSON, which Python accepts)."""
    def edit(rng: random.Random, record: dict) -> None:
        _set(record, rng.choice(_paths(record)), rng.choice([float("nan"), float("inf"),
                                                             float("-inf")]))
    return _edit_record(rng, data, edit)


WRONG_TYPES: tuple[Any, ...] = ("5", [5], {"a": 5}, None, True, False, 5.5, -1, 0, "", [], {},
                                "x" * 1000, [[[]]], 2**70)


def wrong_type(rng: random.Random, data: bytes) -> bytes:
    def edit(rng: random.Random, record: dict) -> None:
        _set(record, rng.choice(_paths(record)), rng.choice(WRONG_TYPES))
    return _edit_record(rng, data, edit)


def unknown_field(rng: random.Random, data: bytes) -> bytes:
    def edit(rng: random.Random, record: dict) -> None:
        targets = [record] + [v for v in (record.get("descriptor"), record.get("values"),
                                          record.get("provenance")) if isinstance(v, dict)]
        if isinstance(record.get("descriptor"), dict) and isinstance(record["descriptor"].get("cpu"), dict):
            targets.append(record["descriptor"]["cpu"])
        rng.choice(targets)[rng.choice(["extra", "colour", "__class__", "parallel.x", ""])] = 1
    return _edit_record(rng, data, edit)


def remove_field(rng: random.Random, data: bytes) -> bytes:
    def edit(rng: random.Random, record: dict) -> None:
        path = rng.choice(_paths(record))
        parent = record
        for part in path[:-1]:
            parent = parent[part]
        del parent[path[-1]]
    return _edit_record(rng, data, edit)


VERSION_HEADERS = ("onnx_light-kernel-tuning-cache 0", "onnx_light-kernel-tuning-cache 3",
                   "onnx_light-kernel-tuning-cache 999", "onnx_light-kernel-tuning-cache 1.0",
                   "onnx_light-kernel-tuning-cache", "onnx_light-kernel-tuning-cache one",
                   "onnx_light-kernel-tuning-cache -1", "ONNX_LIGHT-KERNEL-TUNING-CACHE 1",
                   "onnx_light-kernel-tuning-cache 1 extra", "kernel-tuning-cache 1", "")


def wrong_version(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    lines[0] = rng.choice(VERSION_HEADERS).encode()
    return b"\n".join(lines)


INVALID_UTF8 = (b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80",
                b"\x80", b"\xc0\xaf")


def non_utf8(rng: random.Random, data: bytes) -> bytes:
    position = rng.randrange(len(data) + 1)
    return data[:position] + rng.choice(INVALID_UTF8) + data[position:]


def _payloads() -> list[bytes]:
    """Lines that are code, not data: they must stay invalid lines and never run."""
    return [
        b"__import__('os').system('touch /tmp/onnx_light_pwned')",
        b"exec(\"open('/tmp/onnx_light_pwned', 'w')\")",
        pickle.dumps({"key": "onnx_light/Add/portable[float]@cpu#1"}),
        b"!!python/object/apply:os.system ['touch /tmp/onnx_light_pwned']",
        b'{"key": {"__class__": "os.system"}, "descriptor": {"__reduce__": ["os.system", ["id"]]}}',
        b"\x00" * 64,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
        b"x" * 1_000_000,
        b"\r\r\r",
        b"# a comment line",
        b"{}",
    ]


def insert_garbage_line(rng: random.Random, data: bytes) -> bytes:
    lines = _lines(data)
    lines.insert(rng.randrange(1, len(lines) + 1), rng.choice(_payloads()))
    return b"\n".join(lines)


def empty(rng: random.Random, data: bytes) -> bytes:
    return rng.choice([b"", b"\n", b" ", b"\n\n\n", HEADER.encode(), HEADER.encode() + b"\n"])


def line_endings(rng: random.Random, data: bytes) -> bytes:
    """CRLF, lone CR, trailing spaces or NUL bytes in random places."""
    choice = rng.randrange(4)
    if choice == 0:
        return data.replace(b"\n", b"\r\n")
    if choice == 1:
        return data.replace(b"\n", b"\r")
    lines = _lines(data)
    index = rng.randrange(len(lines))
    lines[index] += b"   \t" if choice == 2 else b"\x00"
    return b"\n".join(lines)


MUTATIONS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "truncate": truncate,
    "flip_bits": flip_bits,
    "overwrite_bytes": overwrite_bytes,
    "swap_lines": swap_lines,
    "duplicate_line": duplicate_line,
    "delete_line": delete_line,
    "huge_number": huge_number,
    "not_a_number": not_a_number,
    "wrong_type": wrong_type,
    "unknown_field": unknown_field,
    "remove_field": remove_field,
    "wrong_version": wrong_version,
    "non_utf8": non_utf8,
    "garbage_line": insert_garbage_line,
    "empty": empty,
    "line_endings": line_endings,
}


def mutate(data: bytes, seed: int, count: int = 1, kinds: Iterable[str] | None = None,
           ) -> tuple[bytes, list[str]]:
    """Apply ``count`` random mutations (of ``kinds``, default all); returns the bytes and
    the names applied."""
    rng = random.Random(seed)
    names = sorted(MUTATIONS if kinds is None else kinds)
    applied = []
    for _ in range(count):
        name = rng.choice(names)
        data = MUTATIONS[name](rng, data)
        applied.append(name)
    return data, applied


def check_cache_file(path: Path, good: Iterable[str], num_threads: int = 2,
                     stats: dict[str, Any] | None = None) -> list[str]:
    """The corruption oracle for one file at ``path``. Returns every broken promise:

    ``load_kernel_tuning_cache`` and ``inspect_kernel_tuning_cache`` do not raise and return
    JSON; a damaged file has diagnostics, one naming each invalid line; every line of
    :func:`lines_that_must_load` loads; a session of the small model gives correct outputs.
    The process-wide registry's published profiles are dropped before and after. ``stats``,
    when given, counts the file statuses and the lines checked.
    """
    from onnx_light import default_registry, inspect_kernel_tuning_cache, load_kernel_tuning_cache

    registry = default_registry()
    registry.forget()
    problems: list[str] = []
    try:
        try:
            report = load_kernel_tuning_cache(path, num_threads=num_threads)
            json.dumps(report)
        except Exception as exc:
            return [f"load raised {type(exc).__name__}: {exc}"]
        if report["status"] not in (CacheStatus.OK, CacheStatus.MISSING) and not report["diagnostics"]:
            problems.append(f"status {report['status']} without diagnostics")
        for entry in report["entries"]:
            if entry["outcome"] == LineOutcome.INVALID and not any(
                    d.startswith(f"{path}:{entry['line']}: ") for d in report["diagnostics"]):
                problems.append(f"invalid line {entry['line']} not in the diagnostics")
        data = path.read_bytes() if path.is_file() else b""
        outcomes = {entry["line"]: entry["outcome"] for entry in report["entries"]}
        must_load = lines_that_must_load(good, data)
        if stats is not None:
            statuses = stats.setdefault("status", {})
            statuses[report["status"]] = statuses.get(report["status"], 0) + 1
            stats["lines_that_must_load"] = stats.get("lines_that_must_load", 0) + len(must_load)
            stats["lines_loaded"] = stats.get("lines_loaded", 0) + report["loaded"]
            stats["invalid_lines_reported"] = stats.get("invalid_lines_reported", 0) + sum(
                entry["outcome"] == LineOutcome.INVALID for entry in report["entries"])
        for number in sorted(must_load):
            if outcomes.get(number) != LineOutcome.LOADED:
                problems.append(f"untouched line {number} did not load: {outcomes.get(number)}")
        try:
            json.dumps(inspect_kernel_tuning_cache(path, num_threads=num_threads))
        except Exception as exc:
            problems.append(f"inspect raised {type(exc).__name__}: {exc}")
        session_problem = check_small_session(num_threads)
        if session_problem:
            problems.append(session_problem)
    finally:
        registry.forget()
    return problems

