"""Fuzz the kernel tuning cache loader with mutated cache files.

Each case starts from a valid cache file for this machine (12 loadable entries for the
Add, Relu and MatMul keys at 1-4 threads, one entry of another processor and one of an
unknown library), applies 1-3 random mutations (truncation, bit flips, swapped, duplicated
and deleted lines, huge numbers, NaN, wrong types, unknown and missing fields, wrong version
headers, non-UTF-8 bytes, code and pickle lines, empty files, line endings), then checks:

* ``load_kernel_tuning_cache`` and ``inspect_kernel_tuning_cache`` do not raise;
* a damaged file has diagnostics, one naming each invalid line;
* every untouched entry (intact header, not superseded by a later line) loads;
* a session of Add + Relu + MatMul gives the reference output.

Usage::

    nice -n 19 python tools/cache_fuzz.py --cases 10000 [--seed 0] [--json out.json]

Exit status 1 when any case fails; each failure is printed with its seed and mutations so
it can be replayed with ``--replay SEED``.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import _cache_fuzzing as fuzzing

from onnx_light.tuning.processor import execution_descriptor


def run_case(folder: Path, data: bytes, good: list[str], seed: int,
             stats: dict) -> tuple[list[str], list[str]]:
    """Mutate, write, check one case; returns (mutations applied, problems)."""
    count = random.Random(seed).choice([1, 1, 2, 3])
    mutated, applied = fuzzing.mutate(data, seed, count=count)
    path = folder / "cache.txt"
    path.write_bytes(mutated)
    return applied, fuzzing.check_cache_file(path, good, stats=stats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--seed", type=int, default=0, help="seed of the first case")
    parser.add_argument("--replay", type=int, help="run the case of this seed only, verbosely")
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args(argv)
    lines, good = fuzzing.corpus_lines(execution_descriptor())
    data = fuzzing.cache_bytes(lines)
    seeds = [args.replay] if args.replay is not None else range(args.seed, args.seed + args.cases)
    by_mutation: collections.Counter[str] = collections.Counter()
    failures_by_mutation: collections.Counter[str] = collections.Counter()
    failures = []
    stats: dict = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        for seed in seeds:
            applied, problems = run_case(Path(folder), data, good, seed, stats)
            by_mutation.update(applied)
            if problems:
                failures_by_mutation.update(applied)
                failures.append({"seed": seed, "mutations": applied, "problems": problems[:5]})
                print(f"FAIL seed {seed} {applied}: {problems[:3]}", flush=True)
            elif args.replay is not None:
                print(f"seed {seed} {applied}: ok")
    summary = {
        "cases": len(seeds),
        "failures": len(failures),
        "seconds": round(time.monotonic() - started, 1),
        "file_status": dict(sorted(stats.get("status", {}).items())),
        "untouched_lines_that_had_to_load": stats.get("lines_that_must_load", 0),
        "lines_loaded": stats.get("lines_loaded", 0),
        "invalid_lines_reported": stats.get("invalid_lines_reported", 0),
        "mutations_applied": dict(sorted(by_mutation.items())),
        "failures_by_mutation": dict(sorted(failures_by_mutation.items())),
        "first_failures": failures[:20],
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "first_failures"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
