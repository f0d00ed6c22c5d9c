"""Shared by the reliability tests (``test_reliability.py``, ``test_bad_input.py``) and the
scripts under ``tools/`` (``cache_fuzz.py``, ``cache_stress.py``, ``model_fuzz.py``).

Four parts:

* a small model (Add + Relu + MatMul) with its numpy reference, to check that a session
  still computes the right thing whatever the cache holds;
* a corpus of cache lines for this machine, mutations of cache files, and the oracle that
  says which entries must still load after a mutation;
* the functions run in other processes by the concurrency and crash tests (they must be
  importable, hence this module);
* mutations of ONNX models and a worker process that runs them one by one, so that a crash
  or a hang of one case is seen and counted instead of ending the run.

Everything is deterministic given a seed, so any failing case can be replayed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnx_light.tuning.cache import HEADER, CacheEntry, read_cache, update_cache
from onnx_light.tuning.cache_lock import cache_lock
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.processor import CpuExecutionDescriptor

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
MIN_ELEMENTS = "parallel.minimum_elements"
LIGHT_MODELS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

# --------------------------------------------------------------------------------------------
# The small model: y = Relu(x + b) @ w
# --------------------------------------------------------------------------------------------

ROWS, INNER, COLUMNS = 64, 48, 24


def small_model() -> onnx.ModelProto:
    """Add + Relu + MatMul on float, every node tunable, with initializers b and w."""
    rng = np.random.default_rng(7)
    b = rng.standard_normal(INNER).astype(np.float32)
    w = rng.standard_normal((INNER, COLUMNS)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w"], ["y"], name="matmul")]
    graph = helper.make_graph(
        nodes, "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, INNER])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, COLUMNS])],
        initializer=[onnx.numpy_helper.from_array(b, "b"), onnx.numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def small_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((ROWS, INNER)).astype(np.float32)}


def small_expected(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    """The numpy reference of :func:`small_model`."""
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    return np.maximum(feeds["x"] + inits["b"], 0) @ inits["w"]


def check_small_session(num_threads: int = 2, model: onnx.ModelProto | None = None) -> str | None:
    """Build a session of the small model on the process-wide registry and run it; returns
    what went wrong, or None when the output matches the reference."""
    from onnx_light import RuntimeSession

    model = small_model() if model is None else model
    feeds = small_feeds()
    try:
        (y,) = RuntimeSession(model, num_threads=num_threads).run(None, feeds)
    except Exception as exc:
        return f"session failed: {type(exc).__name__}: {exc}"
    expected = small_expected(model, feeds)
    if y.shape != expected.shape or y.dtype != np.float32:
        return f"session output has shape {y.shape} dtype {y.dtype}"
    if not np.allclose(y, expected, rtol=1e-5, atol=1e-5):
        return f"session output differs from the reference by {np.abs(y - expected).max()}"
    return None


# --------------------------------------------------------------------------------------------
# Cache files: a corpus of valid lines, mutations, and the oracle
# --------------------------------------------------------------------------------------------

ADD = KernelTuningKey("onnx_light", "Add", "portable", "float")
RELU = KernelTuningKey("onnx_light", "Relu", "portable", "float")
MATMUL = KernelTuningKey("onnx_light", "MatMul", "portable", "float")
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
                                       "split.minimum_rows": threads}, FIXED_PROVENANCE),
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


VERSION_HEADERS = ("onnx_light-kernel-tuning-cache 0", "onnx_light-kernel-tuning-cache 2",
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
        if report["status"] not in ("ok", "missing") and not report["diagnostics"]:
            problems.append(f"status {report['status']} without diagnostics")
        for entry in report["entries"]:
            if entry["outcome"] == "invalid" and not any(
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
                entry["outcome"] == "invalid" for entry in report["entries"])
        for number in sorted(must_load):
            if outcomes.get(number) != "loaded":
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


# --------------------------------------------------------------------------------------------
# Processes that update and read one cache at once
# --------------------------------------------------------------------------------------------

SHARED_THREADS = 7777  # with Add: the one identity every writer updates
OWN_KERNELS = ("Add", "Relu", "Abs", "Sub")  # writers' own identities span several keys


def own_kernel(worker: int, index: int) -> str:
    return OWN_KERNELS[(worker + index // 2) % len(OWN_KERNELS)]


def distinct_threads(worker: int, index: int) -> int:
    """The thread count that makes writer ``worker``'s update ``index`` its own identity."""
    return 10_000 + worker * 1000 + index


def update_value(worker: int, index: int) -> int:
    return 1 + worker * 1000 + index


def stress_writer(path: str, worker: int, updates: int, results: Any) -> None:
    """Through the public API, alternately update an identity of this writer's own (one of
    several keys, a new thread count each time) and the identity shared by every writer (Add
    at 7777 threads). Reports, for the shared updates, (value, start, end) on the
    system-wide monotonic clock."""
    import onnx_light

    shared = []
    errors = []
    for index in range(updates):
        own = index % 2 == 0
        kernel = own_kernel(worker, index) if own else "Add"
        threads = distinct_threads(worker, index) if own else SHARED_THREADS
        value = update_value(worker, index)
        started = time.monotonic_ns()
        try:
            onnx_light.set_kernel_tuning_parameters(kernel, "float", {MIN_ELEMENTS: value},
                                                    path=path, num_threads=threads)
        except Exception as exc:
            errors.append(f"writer {worker} update {index}: {type(exc).__name__}: {exc}")
            continue
        if not own:
            shared.append((value, started, time.monotonic_ns()))
    results.put(("writer", worker, shared, errors))


def stress_reader(path: str, stop: Any, results: Any) -> None:
    """Read the cache in a loop (raw parse and the public inspect) until ``stop`` is set;
    every read must parse completely."""
    import onnx_light

    reads, problems = 0, []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        finished = stop.is_set()
        try:
            cache = read_cache(Path(path))
            if cache.status != "ok" or any(line.error for line in cache.lines):
                problems.append(f"{cache.status}: {cache.diagnostics[:2]}")
            report = onnx_light.inspect_kernel_tuning_cache(path)
            if report["status"] != "ok" or any(p["outcome"] == "invalid" for p in report["profiles"]):
                problems.append(f"inspect: {report['status']}: {report['diagnostics'][:2]}")
        except Exception as exc:
            problems.append(f"{type(exc).__name__}: {exc}")
        reads += 1
        if finished:
            break
    results.put(("reader", reads, problems))


def run_stress(path: Path, writers: int, updates: int, readers: int,
               timeout: float = 600) -> dict[str, Any]:
    """Run ``writers`` writer and ``readers`` reader processes on ``path`` and check the
    result. Returns the counts and every problem found (``losses`` among them)."""
    import multiprocessing

    import onnx_light

    path.write_bytes(cache_bytes([]))  # readers need a file from the start
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    reader_processes = [context.Process(target=stress_reader, args=(str(path), stop, results))
                        for _ in range(readers)]
    writer_processes = [context.Process(target=stress_writer, args=(str(path), w, updates, results))
                        for w in range(writers)]
    started = time.monotonic()
    for process in reader_processes + writer_processes:
        process.start()
    messages = [results.get(timeout=timeout) for _ in writer_processes]
    stop.set()
    messages += [results.get(timeout=timeout) for _ in reader_processes]
    for process in reader_processes + writer_processes:
        process.join(timeout=60)
    elapsed = time.monotonic() - started
    problems = [f"process exit code {p.exitcode}" for p in reader_processes + writer_processes
                if p.exitcode != 0]
    shared: list[tuple[int, int, int]] = []
    reads = 0
    for message in messages:
        if message[0] == "writer":
            shared += message[2]
            problems += message[3]
        else:
            reads += message[1]
            problems += [f"reader: {p}" for p in message[2]]
    report = onnx_light.inspect_kernel_tuning_cache(path)
    found = {(p["key"].split("/")[1], p["descriptor"]["num_threads"]): p["values"][MIN_ELEMENTS]
             for p in report["profiles"]}
    if report["status"] != "ok":
        problems.append(f"final file {report['status']}: {report['diagnostics'][:3]}")
    losses = 0
    for worker in range(writers):
        for index in range(0, updates, 2):
            identity = (own_kernel(worker, index), distinct_threads(worker, index))
            if found.get(identity) != update_value(worker, index):
                losses += 1
                problems.append(f"update {index} of writer {worker} lost")
    if shared:
        final = found.get(("Add", SHARED_THREADS))
        winner = [s for s in shared if s[0] == final]
        latest_start = max(start for _, start, _ in shared)
        if not winner:
            losses += 1
            problems.append(f"the shared identity holds {final}, which no writer wrote")
        elif winner[0][2] < latest_start:
            losses += 1
            problems.append("the shared identity holds an update that ended before another began")
    leftovers = sorted(p.name for p in path.parent.iterdir() if p.name.endswith(".tmp"))
    if leftovers:
        problems.append(f"temporary files left: {leftovers}")
    return {"processes": writers + readers, "writers": writers, "readers": readers,
            "updates": writers * updates, "shared_updates": len(shared),
            "keys": len({p["key"] for p in report["profiles"]}), "reads": reads,
            "losses": losses, "entries": len(report["profiles"]), "seconds": round(elapsed, 2),
            "problems": problems}


# --------------------------------------------------------------------------------------------
# A writer killed with SIGKILL at random moments
# --------------------------------------------------------------------------------------------

VICTIM_KEY = KernelTuningKey("reltest", "Victim", "portable", "float")


def victim_descriptor() -> CpuExecutionDescriptor:
    return CpuExecutionDescriptor.from_dict({
        "cpu": {"architecture": "x86_64", "vendor": "test", "family": 1, "model": 1, "stepping": 1,
                "microarchitecture": "victim", "features": [], "cache_line": 64, "l1d": None,
                "l2": None, "l3": None, "physical_cores": 1, "logical_cores": 1},
        "num_threads": 1})


def padding_lines(count: int) -> list[str]:
    """Other entries, kept verbatim by every update (they make a write take longer)."""
    where = victim_descriptor()
    return [CacheEntry(KernelTuningKey("reltest", f"Pad{i}", "portable", "float"), where,
                       {"v": i, "text": "x" * 100}, {"origin": "test"}).to_line()
            for i in range(count)]


def victim_line(version: int) -> str:
    return CacheEntry(VICTIM_KEY, victim_descriptor(), {"v": version}, {"origin": "test"}).to_line()


def version_bytes(padding: list[str], version: int) -> bytes:
    """The complete file after the victim's update ``version`` (0: before any)."""
    lines = padding if version == 0 else [*padding, victim_line(version)]
    return cache_bytes(lines)


def crash_victim(path: str, done: Any, started: Any) -> None:
    """Update the cache forever, version after version; ``done`` holds the last version whose
    update returned. Meant to be killed."""
    started.value = 1
    while True:
        version = done.value + 1
        update_cache(Path(path), [CacheEntry(VICTIM_KEY, victim_descriptor(), {"v": version},
                                             {"origin": "test"})])
        done.value = version


def lock_holder(path: str, held: Any) -> None:
    """Take the cache's lock and keep it until killed."""
    with cache_lock(Path(path), timeout=60):
        held.value = 1
        time.sleep(600)


def lock_is_free(lock_path: Path) -> bool:
    """Whether a non-blocking flock on the lock file succeeds now (released at once)."""
    import fcntl

    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def update_seconds(folder: Path, pad: list[str]) -> float:
    """How long one victim update takes on a file with ``pad`` (median of three)."""
    scratch = folder / "timing.txt"
    scratch.write_bytes(version_bytes(pad, 0))
    times = []
    for version in (1, 2, 3):
        started = time.perf_counter()
        update_cache(scratch, [CacheEntry(VICTIM_KEY, victim_descriptor(), {"v": version}, {})])
        times.append(time.perf_counter() - started)
    for leftover in (scratch, Path(str(scratch) + ".lock")):
        leftover.unlink()
    return sorted(times)[1]


def kill_writers(path: Path, kills: int, padding: int, window_s: float | None,
                 seed: int) -> dict[str, Any]:
    """Start a victim writer ``kills`` times and SIGKILL it after a random delay (up to
    ``window_s``, by default three update durations, so kills land in every phase of the
    first updates); after each kill the file must be exactly the last complete version or
    the next one, and the lock must be free at once. Processes come from a fork server, so
    each start costs milliseconds."""
    import multiprocessing

    rng = random.Random(seed)
    pad = padding_lines(padding)
    one_update = update_seconds(path.parent, pad)
    window_s = 3 * one_update if window_s is None else window_s
    path.write_bytes(version_bytes(pad, 0))
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["onnx_light.tuning.cache", "filelock"])
    done = context.Value("q", 0, lock=False)
    outcome = {"kills": 0, "old": 0, "new": 0, "partial_or_other": 0, "lock_held_after_kill": 0,
               "kills_leaving_a_temporary": 0, "temporaries_left": 0, "versions_written": 0,
               "update_seconds": round(one_update, 4), "window_seconds": round(window_s, 4),
               "problems": []}
    lock = Path(str(path) + ".lock")
    for round_number in range(kills):
        started = context.Value("b", 0, lock=False)
        victim = context.Process(target=crash_victim, args=(str(path), done, started))
        victim.start()
        deadline = time.monotonic() + 30
        while not started.value and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, window_s))
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=30)
        outcome["kills"] += 1
        last = done.value
        data = path.read_bytes()
        if data == version_bytes(pad, last):
            outcome["old"] += 1
        elif data == version_bytes(pad, last + 1):
            outcome["new"] += 1
        else:
            outcome["partial_or_other"] += 1
            outcome["problems"].append(f"round {round_number}: {len(data)} bytes, neither version "
                                       f"{last} nor {last + 1}")
        if lock.exists() and not lock_is_free(lock):
            outcome["lock_held_after_kill"] += 1
            outcome["problems"].append(f"round {round_number}: lock still held after the kill")
        if list(path.parent.glob(f".{path.name}.*.tmp")):
            outcome["kills_leaving_a_temporary"] += 1
    # a later writer is never blocked: it completes well within the lock timeout
    begun = time.monotonic()
    update_cache(path, [CacheEntry(VICTIM_KEY, victim_descriptor(), {"v": -1}, {"origin": "test"})])
    outcome["final_update_seconds"] = round(time.monotonic() - begun, 3)
    outcome["temporaries_left"] = len(list(path.parent.glob(f".{path.name}.*.tmp")))
    if outcome["temporaries_left"]:
        outcome["problems"].append(f"{outcome['temporaries_left']} temporary files left behind")
    outcome["versions_written"] = done.value
    if read_cache(path).status != "ok":
        outcome["problems"].append("the file does not parse after the final update")
    return outcome


# --------------------------------------------------------------------------------------------
# Models: mutations, and a worker process that runs them one at a time
# --------------------------------------------------------------------------------------------

def light_model_paths() -> list[Path]:
    return sorted(LIGHT_MODELS.glob("*.onnx"))


def model_source(name: str) -> bytes:
    """The bytes of model ``name``: ``small`` or a light model's file stem."""
    if name == "small":
        return small_model().SerializeToString()
    return (LIGHT_MODELS / f"{name}.onnx").read_bytes()


def _random_node(rng: random.Random, model: onnx.ModelProto) -> onnx.NodeProto | None:
    nodes = list(model.graph.node)
    return rng.choice(nodes) if nodes else None


def _field_mutation(rng: random.Random, model: onnx.ModelProto) -> str:
    """Change one field of a parsed model; returns what was done."""
    graph = model.graph
    node = _random_node(rng, model)
    choice = rng.randrange(16)
    if choice == 0 and node is not None:
        node.op_type = rng.choice(["Relu", "Add", "MatMul", "Conv", "Softmax", "Reshape", "Gemm",
                                   "NoSuchOp", "", "Loop", "If", "Concat", "Transpose", "Identity"])
        return f"op_type of {node.name or node.output[0]} -> {node.op_type}"
    if choice == 1 and node is not None:
        graph.node.remove(node)
        return "node removed"
    if choice == 2 and len(graph.node) > 1:
        i, j = rng.randrange(len(graph.node)), rng.randrange(len(graph.node))
        a, b = onnx.NodeProto(), onnx.NodeProto()
        a.CopyFrom(graph.node[i])
        b.CopyFrom(graph.node[j])
        graph.node[i].CopyFrom(b)
        graph.node[j].CopyFrom(a)
        return "two nodes swapped"
    if choice == 3 and node is not None and node.input:
        names = [n for other in graph.node for n in other.output] + [i.name for i in graph.input]
        index = rng.randrange(len(node.input))
        node.input[index] = rng.choice([*names, "", "missing_value"])
        return f"input {index} of a node rewired to {node.input[index]!r}"
    if choice == 4 and node is not None and node.attribute:
        attribute = rng.choice(node.attribute)
        value = rng.choice([0, -1, 1, 2, 3, 7, 2**31, -(2**40), 10**6])
        if attribute.type == onnx.AttributeProto.INT:
            attribute.i = value
        elif attribute.type == onnx.AttributeProto.INTS and attribute.ints:
            attribute.ints[rng.randrange(len(attribute.ints))] = value
        elif attribute.type == onnx.AttributeProto.FLOAT:
            attribute.f = rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e30])
        elif attribute.type == onnx.AttributeProto.STRING:
            attribute.s = rng.choice([b"", b"NOTSET", b"SAME_UPPER", b"garbage", b"\xff"])
        else:
            attribute.name = "no_such_attribute"
        return f"attribute {attribute.name} changed"
    if choice == 5 and node is not None:
        node.attribute.add().CopyFrom(helper.make_attribute("no_such_attribute", 1))
        return "unknown attribute added"
    if choice == 6 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        if tensor.dims:
            tensor.dims[rng.randrange(len(tensor.dims))] = rng.choice([0, 1, 3, 10**6, -1])
        return f"dims of initializer {tensor.name} changed"
    if choice == 7 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        graph.initializer.remove(tensor)
        return f"initializer {tensor.name} removed"
    if choice == 8 and graph.input:
        info = rng.choice(graph.input)
        info.type.tensor_type.elem_type = rng.choice([0, 2, 6, 7, 8, 9, 10, 11, 16, 99])
        return f"element type of input {info.name} -> {info.type.tensor_type.elem_type}"
    if choice == 9 and graph.input:
        dims = rng.choice(graph.input).type.tensor_type.shape.dim
        if dims:
            dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 2, 5, 10**5])
        return "an input dimension changed"
    if choice == 10 and model.opset_import:
        model.opset_import[0].version = rng.choice([0, 1, 6, 9, 13, 22, 10**6])
        return f"opset -> {model.opset_import[0].version}"
    if choice == 11 and node is not None:
        node.domain = rng.choice(["com.example", "ai.onnx.ml", "ai.onnx", "\u00e9"])
        return f"domain -> {node.domain}"
    if choice == 12 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        if tensor.raw_data:
            tensor.raw_data = tensor.raw_data[:rng.randrange(len(tensor.raw_data) + 1)]
            return f"raw data of {tensor.name} truncated"
    if choice == 13 and node is not None:
        graph.node.append(onnx.NodeProto())
        graph.node[-1].CopyFrom(node)
        return "a node duplicated"
    if choice in (14, 15) and graph.initializer:
        tensor = rng.choice(graph.initializer)
        try:
            values = onnx.numpy_helper.to_array(tensor).copy()
        except ValueError:  # an earlier mutation broke it already
            values = np.zeros(0)
        if values.size and values.dtype.kind in "iuf":
            flat = values.reshape(-1)
            candidates = [0, 1, 2, 3, 7, -1, 255, 2**31 - 1] if values.dtype.kind in "iu" else [
                0.0, -1.0, 1e30, float("nan"), float("inf"), -0.0]
            if values.dtype.kind == "u":
                candidates = [c for c in candidates if c >= 0]
            flat[rng.randrange(flat.size)] = rng.choice(candidates)
            tensor.CopyFrom(onnx.numpy_helper.from_array(values, tensor.name))
            return f"a value of initializer {tensor.name} changed"
    model.ir_version = rng.choice([0, 1, 3, 7, 10, 11, 99])
    return f"ir_version -> {model.ir_version}"


def mutate_model(data: bytes, seed: int) -> tuple[bytes, str]:
    """One mutation of a serialized model: bytes (flips, overwrites, truncation, insertion)
    or a field of the parsed model. Returns the new bytes and a description."""
    rng = random.Random(seed)
    if rng.random() < 0.4:
        kind = rng.choice(["flip_bits", "overwrite_bytes", "truncate", "insert"])
        if kind == "insert":
            position = rng.randrange(len(data) + 1)
            return data[:position] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) \
                + data[position:], "bytes inserted"
        return MUTATIONS[kind](rng, data), kind
    model = onnx.load_from_string(data)
    done = [_field_mutation(rng, model) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    return model.SerializeToString(), "; ".join(done)


def _feeds_for(session: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    from onnx_light.kernels.base import numpy_dtype
    from onnx_light.tuning.keys import element_type_code

    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in (arg.shape or [])]
        if int(np.prod(shape, dtype=np.int64)) > 1 << 24:
            raise ValueError(f"input {arg.name} of shape {shape} is too large for the fuzzer")
        try:
            dtype = numpy_dtype(element_type_code(arg.type))
        except (ValueError, TypeError, KeyError):
            dtype = np.dtype(np.float32)
        if dtype.kind == "O":
            feeds[arg.name] = np.full(shape, "a", dtype=object)
        elif dtype.kind == "b":
            feeds[arg.name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            feeds[arg.name] = rng.integers(0, 3, size=shape).astype(dtype)
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def classify_model(data: bytes) -> tuple[str, str]:
    """Build and run one (possibly broken) model; returns (outcome, message). The outcome is
    ``"ran"``, or ``"<stage>: <ErrorType>"`` with stage ``construction`` or ``run``, with
    `` (MemoryError)`` appended when a node ran out of memory (the runtime wraps it in a
    RuntimeError naming the node) and `` (unexpected)`` when the error is neither that nor a
    ValueError or TypeError, or has no message."""
    from onnx_light import RuntimeSession

    stage = "construction"
    try:
        session = RuntimeSession(data, num_threads=2)
        stage = "run"
        session.run(None, _feeds_for(session, np.random.default_rng(0)))
    except Exception as exc:
        outcome = f"{stage}: {type(exc).__name__}"
        if isinstance(exc.__cause__, MemoryError):  # a node's output is too large
            outcome += " (MemoryError)"
        elif not isinstance(exc, (ValueError, TypeError)) or not str(exc).strip():
            outcome += " (unexpected)"
        return outcome, str(exc)[:300]
    return "ran", ""


def model_worker() -> None:
    """Read cases ``{"model": name, "seed": n}`` (one JSON per line) from stdin; for each,
    write ``{"outcome": ..., "detail": ...}`` on stdout. The address space is limited so a
    mutated shape cannot take the machine's memory: allocations past it raise MemoryError."""
    import resource

    limit = int(os.environ.get("RELIABILITY_MEMORY_LIMIT", str(4 << 30)))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sources: dict[str, bytes] = {}
    out = sys.stdout
    for line in sys.stdin:
        case = json.loads(line)
        if case["model"] not in sources:
            sources[case["model"]] = model_source(case["model"])
        try:
            data, detail = (mutate_model(sources[case["model"]], case["seed"]) if case["seed"] >= 0
                            else (sources[case["model"]], "original"))
        except Exception as exc:  # a bug of the mutator, not of onnx_light
            out.write(json.dumps({"outcome": "mutation failed", "detail": repr(exc)}) + "\n")
            out.flush()
            continue
        try:
            outcome, message = classify_model(data)
        except MemoryError as exc:
            outcome, message = "MemoryError", str(exc)[:300]
        out.write(json.dumps({"outcome": outcome, "detail": detail, "message": message}) + "\n")
        out.flush()


class ModelWorker:
    """A subprocess running :func:`model_worker`; restarted after a crash or a timeout."""

    def __init__(self, timeout_s: float, nice: int = 0) -> None:
        self.timeout_s = timeout_s
        self.nice = nice
        self.process: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        code = "import reliability_helpers as h; h.model_worker()"
        command = [sys.executable, "-c", code]
        if self.nice:
            command = ["nice", "-n", str(self.nice), *command]
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(TESTS), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1"}
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=environment, cwd=ROOT)

    def run(self, model: str, seed: int) -> dict[str, str]:
        """One case; the outcome also says ``crash (signal N)`` or ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps({"model": model, "seed": seed}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        if not ready:
            self.close()
            return {"outcome": "timeout", "detail": f"no answer within {self.timeout_s} s"}
        code = self.process.wait(timeout=30)
        self.close()
        return {"outcome": f"crash (exit {code})", "detail": "the worker died"}

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            self.process = None
