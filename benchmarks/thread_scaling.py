"""One and two threads side by side: ONNX's light CNNs (random weights) in onnx_light and
onnxruntime at 1 and 2 threads, all four sessions timed in the same interleaved rounds.

On a shared machine the scaling figure t2 / t1 moves with what other programs do on the
other core, so the table gives the fastest run, the 20th percentile and the median of each
session, and each ratio at all three. ``--fixed-halves`` adds the 2-thread onnx_light session
with Conv's split plans run as ``parallel_for`` (each thread its fixed block) instead of
chunked regions (``ThreadPool.parallel_chunks``), switched between runs of one session.
Each timed run follows 0.1 s of untimed runs of the same session; the order of the sessions
rotates every round. Results: docs/real-models.md ("Two threads on CNNs").

Run: ``python benchmarks/thread_scaling.py [--models resnet50 ...] [--rounds 31]
[--fixed-halves]``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np
import onnx
import real_models

from onnx_light.kernels.conv import algorithms, blocks
from onnx_light.parallel import ThreadPool
from onnx_light.runtime.session import RuntimeSession

MODELS = ("resnet50", "densenet121", "inception_v1", "squeezenet")
WARM_S = 0.1


def _fixed_halves(pool: ThreadPool, n: int, fn: Callable[[int, int], None], threads: int) -> None:
    pool.parallel_for(n, fn, max_blocks=threads)


def _use_split(split: Callable[..., None]) -> None:
    blocks.split = algorithms.split = split


def measure(name: str, rounds: int, fixed_halves: bool) -> tuple[dict[str, list[float]], list[float]]:
    """Seconds per timed run of each session, and the 1-minute load average after each round."""
    model = real_models.with_random_weights(onnx.load(real_models.model_path(name)))
    input_name, x = real_models.model_input(model)
    feeds = {input_name: x}
    sessions = {"onnx_light 1": RuntimeSession(model, num_threads=1),
                "onnx_light 2": RuntimeSession(model, num_threads=2),
                "onnxruntime 1": real_models.onnxruntime_session(model, 1),
                "onnxruntime 2": real_models.onnxruntime_session(model, 2)}
    chunked = blocks.split
    splits = {"onnx_light 2": chunked}
    if fixed_halves:
        sessions["onnx_light 2, fixed halves"] = sessions["onnx_light 2"]
        splits["onnx_light 2, fixed halves"] = _fixed_halves
    times: dict[str, list[float]] = {key: [] for key in sessions}
    loads = []
    keys = list(sessions)
    try:
        for r in range(rounds):
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                session = sessions[key]
                if key in splits:
                    _use_split(splits[key])
                end = time.perf_counter() + WARM_S
                while time.perf_counter() < end:
                    session.run(None, feeds)
                started = time.perf_counter()
                session.run(None, feeds)
                times[key].append(time.perf_counter() - started)
            loads.append(os.getloadavg()[0])
    finally:
        _use_split(chunked)
    return times, loads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=real_models.MODELS)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--fixed-halves", action="store_true",
                        help="add onnx_light at 2 threads with Conv's fixed-block regions")
    args = parser.parse_args(argv)
    for name in args.models:
        times, loads = measure(name, args.rounds, args.fixed_halves)
        print(f"\n{name}: {args.rounds} rounds, load average {min(loads):.1f}-{max(loads):.1f}\n")
        print("| session | fastest (ms) | 20th percentile (ms) | median (ms) | t2 / t1: fastest "
              "| 20th pct | median |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        stats = {key: [1e3 * float(f(v)) for f in (np.min, lambda a: np.percentile(a, 20), np.median)]
                 for key, v in times.items()}
        for key, row in stats.items():
            ratios = ["", "", ""]
            if not key.endswith(" 1"):
                base = stats["onnxruntime 1" if key.startswith("onnxruntime") else "onnx_light 1"]
                ratios = [f"{a / b:.2f}" for a, b in zip(row, base, strict=True)]
            print("| " + " | ".join([key, *(f"{v:.1f}" for v in row), *ratios]) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
