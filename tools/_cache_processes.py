"""Processes that update and read one kernel tuning cache at once, and a writer killed with
SIGKILL at random moments: the functions run in child processes (they must be importable,
hence a module) and the harnesses that start them and check the file afterwards.

Used by ``tools/cache_stress.py`` and the reliability tests.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

from _cache_fuzzing import MIN_ELEMENTS, cache_bytes

from onnx_light.tuning.cache import CacheEntry, CacheStatus, LineOutcome, read_cache, update_cache
from onnx_light.tuning.cache_lock import cache_lock
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.processor import CpuExecutionDescriptor

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
            if cache.status != CacheStatus.OK or any(line.error for line in cache.lines):
                problems.append(f"{cache.status}: {cache.diagnostics[:2]}")
            report = onnx_light.inspect_kernel_tuning_cache(path)
            if report["status"] != CacheStatus.OK or any(
                    p["outcome"] == LineOutcome.INVALID for p in report["profiles"]):
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
    if report["status"] != CacheStatus.OK:
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
    if read_cache(path).status != CacheStatus.OK:
        outcome["problems"].append("the file does not parse after the final update")
    return outcome

