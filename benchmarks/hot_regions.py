"""Packed float32 products split over two threads, with the pool cold and hot.

Usage: python benchmarks/hot_regions.py [--shapes 64x256x256 64x256x1024 ...]
[--spin 0 200] [--awake 0] [--regions numba team] [--rounds 10] [--calls 20] [--quiet]

For each shape ``MxKxN``, interleaved within every round: the packed product (``kernels/
packed_gemm.py``) on one thread, then split in two chunked halves on a 2-thread pool inside
``ThreadPool.hot(spin, loop, awake)`` for each ``--spin`` and ``--awake`` value (0 and 0: the
pool as it was, every handoff a sleeping thread woken; ``awake``: idle-priority threads keep
the processors from halting; ``--spin`` with no value: none of these), and for each of
``--regions`` the product's own two-thread path: ``numba``, its panels in a numba ``prange``
region (what a product does outside a session's run), ``team``, its panels as the tasks of the
pool's native team inside the scope a session enters around a run (``kernels/team.py``,
``runtime/session.py``'s ``TEAM_US``). Each timed call follows three untimed serial products of the same
shape, as a product follows other steps in a model. ``--quiet`` keeps only the calls before
and after which no task outside this process was runnable (``/proc/loadavg``'s running count
less this process's running threads; the spinning worker is one of them) and says how many
were taken again. Printed: a markdown table of median and 20th-percentile microseconds and the
median over the serial median. Results: docs/parallel.md ("Hot regions").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnx_light.kernels.compiled_elementwise import numba_threads
from onnx_light.kernels.packed_gemm import PackedWeights, available, packed_rows
from onnx_light.kernels.spin import spin_loop
from onnx_light.kernels.team import team_loop
from onnx_light.parallel import ThreadPool
from onnx_light.runtime.session import TEAM_US


def rows_on_pool(packed: PackedWeights, a: np.ndarray, out: np.ndarray, pool: ThreadPool,
                 chunks: int) -> np.ndarray:
    """``a @ W (+ bias)`` (A 2-D) with A's rows in ``chunks`` chunks of whole micro-kernel
    blocks on ``pool`` (``ThreadPool.parallel_chunks``): the packed products' split at two
    threads until 2026-12-06, when their panels went to one numba region (the same values)."""
    count, mr = a.shape[0], packed.rows
    function = packed_rows.dispatcher

    def part(start: int, stop: int) -> None:
        function(a, packed.panels, packed.layout, packed.bias, packed.with_bias, out, start * mr,
                 min(count, stop * mr), packed.block, 0, 0, packed.n)

    pool.parallel_chunks(-(-count // mr), part, chunks)
    return out


def others_runnable() -> int:
    """Runnable tasks outside this process (0 where /proc does not say)."""
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        tasks = Path("/proc/self/task")
        mine = 0
        for task in tasks.iterdir():
            with contextlib.suppress(OSError):
                mine += (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
    except OSError:
        return 0
    return running - mine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["64x256x256", "64x256x1024", "64x1024x256",
                                                        "128x768x768"])
    parser.add_argument("--spin", nargs="*", type=float, default=[0.0, 200.0])
    parser.add_argument("--regions", nargs="*", choices=["numba", "team"], default=["numba", "team"])
    parser.add_argument("--awake", nargs="+", type=float, default=[0.0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if not available():
        print("the packed products need numba and AVX-512")
        return 1
    pool = ThreadPool(2)
    retakes = 0
    print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load average "
          f"{os.getloadavg()[0]:.2f} before; rounds={args.rounds}, calls={args.calls}, "
          f"quiet={args.quiet}")
    print()
    print("| product | variant | median (us) | 20th percentile (us) | t / serial | calls |")
    print("|---|---|---:|---:|---:|---:|")
    for shape in args.shapes:
        m, k, n = (int(part) for part in shape.split("x"))
        rng = np.random.default_rng(0)
        a = rng.standard_normal((m, k)).astype(np.float32)
        packed = PackedWeights(rng.standard_normal((k, n)).astype(np.float32))
        out = np.empty((m, n), np.float32)
        expected = packed.multiply(a)
        packed.compile(threads=2)
        numba_threads(2)
        variants = {"serial": None} | {f"2 threads, spin {spin:g} us, awake {awake:g} us": (spin, awake)
                                       for spin in args.spin for awake in args.awake}
        variants |= {f"2 threads, {region} region": region for region in args.regions}
        times: dict[str, list[float]] = {key: [] for key in variants}
        for _ in range(args.rounds):
            for key, variant in variants.items():
                spin, awake = variant if isinstance(variant, tuple) else (0.0, 0.0)
                team = team_loop() if variant == "team" else None
                with pool.hot(spin, spin_loop(), awake, team, TEAM_US):
                    for _ in range(args.calls):
                        for _ in range(3):
                            packed.multiply(a, out)
                        if args.quiet and others_runnable() > 0:
                            retakes += 1
                            continue
                        started = time.perf_counter()
                        if variant is None:
                            packed.multiply(a, out)
                        elif isinstance(variant, str):
                            packed.multiply(a, out, threads=2)
                        else:
                            rows_on_pool(packed, a, out, pool, 2)
                        elapsed = time.perf_counter() - started
                        if args.quiet and others_runnable() > 0:
                            retakes += 1
                            continue
                        times[key].append(elapsed)
                np.testing.assert_array_equal(out, expected)
        serial = statistics.median(times["serial"]) if times["serial"] else float("nan")
        for key, values in times.items():
            if not values:
                print(f"| {shape} | {key} | - | - | - | 0 |")
                continue
            median = statistics.median(values)
            print(f"| {shape} | {key} | {median * 1e6:.0f} | "
                  f"{np.percentile(values, 20) * 1e6:.0f} | {median / serial:.2f} | {len(values)} |")
    print()
    print(f"load average {os.getloadavg()[0]:.2f} after; {retakes} calls taken again")
    pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
