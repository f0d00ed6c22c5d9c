"""Concurrent partial updates of one kernel tuning cache: are any lost, is any writer starved?

Each writer process updates one parameter of one key through
``set_kernel_tuning_parameters`` (values 1, 2, 3, ... of its own range), over and over.
Writers share keys (``parallel.minimum_flops`` and ``split.minimum_rows`` of one key are
updated by two different writers) and span several keys (Gemm and MatMul, float and
double). Afterwards each writer's last value must be in the file (a partial update that
started from the values read before the lock reverted the other writer's parameter: a
lost update). The order in which updates took the
lock gives the longest run of one writer's updates while others were waiting (starvation).

Usage::

    nice -n 19 python tools/cache_contention.py --writers 8 --updates 150
    nice -n 19 python tools/cache_contention.py --writers 2 --updates 150   # the issue's case

Prints a JSON report; exit status 1 when an update was lost or a writer failed.
It imports onnx_light only: the CI test (``tests/test_reliability.py``) runs the same
harness at a smaller size.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WRITER_TARGETS = tuple((kernel, element_type, parameter)
                       for kernel, element_type in (("Gemm", "float"), ("MatMul", "float"),
                                                    ("Gemm", "double"), ("MatMul", "double"))
                       for parameter in ("parallel.minimum_flops", "split.minimum_rows"))
THREADS = 2


def target(worker: int) -> tuple[str, str, str]:
    """The (kernel, element type, parameter) writer ``worker`` updates."""
    return WRITER_TARGETS[worker % len(WRITER_TARGETS)]


def value(worker: int, index: int) -> int:
    return 1_000_000 * (worker + 1) + index


def partial_writer(path: str, worker: int, updates: int, results: Any) -> None:
    """Update this writer's parameter ``updates`` times; report the monotonic time at
    which each update returned and any error."""
    import onnx_light

    kernel, element_type, parameter = target(worker)
    finished, errors = [], []
    for index in range(updates):
        try:
            onnx_light.set_kernel_tuning_parameters(kernel, element_type,
                                                    {parameter: value(worker, index)},
                                                    path=path, num_threads=THREADS)
        except Exception as exc:  # reported, counted as a failure
            errors.append(f"writer {worker} update {index}: {type(exc).__name__}: {exc}")
            continue
        finished.append(time.monotonic_ns())
    results.put((worker, finished, errors))


def longest_streak(finished: dict[int, list[int]]) -> int:
    """The longest run of consecutive updates by one writer while every writer was
    running (from the moment each had completed one update until one had completed all)."""
    running = [times for times in finished.values() if times]
    if len(running) < 2:
        return 0
    begin, end = max(min(times) for times in running), min(max(times) for times in running)
    events = sorted((t, worker) for worker, times in finished.items() for t in times
                    if begin < t <= end)
    longest = run = 0
    previous = None
    for _, worker in events:
        run = run + 1 if worker == previous else 1
        previous = worker
        longest = max(longest, run)
    return longest


def run_partial_updates(path: Path, writers: int, updates: int,
                        timeout: float = 600) -> dict[str, Any]:
    """Run ``writers`` writer processes on ``path``; count lost updates and failures."""
    import onnx_light

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=partial_writer, args=(str(path), w, updates, results))
                 for w in range(writers)]
    started = time.monotonic()
    for process in processes:
        process.start()
    messages = [results.get(timeout=timeout) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    seconds = time.monotonic() - started
    problems = [f"writer exit code {p.exitcode}" for p in processes if p.exitcode != 0]
    finished = {}
    for worker, times, errors in messages:
        finished[worker] = times
        problems += errors
    final = {(record["kernel"], record["element_type"]): record["cached_values"]
             for record in onnx_light.kernel_tuning_parameters(
                 ["Gemm", "MatMul"], ["float", "double"], path=path, num_threads=THREADS)}
    lost = 0
    for worker in range(writers):
        kernel, element_type, parameter = target(worker)
        held = (final.get((kernel, element_type)) or {}).get(parameter)
        if held != value(worker, updates - 1):
            lost += 1
            problems.append(f"writer {worker} ({kernel} {element_type} {parameter}): the file "
                            f"holds {held}, its last update was {value(worker, updates - 1)}")
    return {"writers": writers, "updates": writers * updates,
            "keys": len({target(w)[:2] for w in range(writers)}),
            "completed": sum(len(times) for times in finished.values()), "lost": lost,
            "longest_streak": longest_streak(finished), "seconds": round(seconds, 2),
            "updates_per_second": round(writers * updates / seconds, 1), "problems": problems}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--updates", type=int, default=150, help="updates per writer")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        report = run_partial_updates(Path(folder) / "contended.txt", args.writers, args.updates)
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
