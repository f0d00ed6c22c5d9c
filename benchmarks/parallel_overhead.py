"""Dispatch overhead of onnx_light.parallel.ThreadPool versus concurrent.futures.

Usage: python benchmarks/parallel_overhead.py [--repeats N] [--inner K]

Prints markdown tables of the median round-trip time of an empty parallel region (2 blocks,
os.cpu_count() blocks, and 4 blocks if different) for the onnx_light pool and for a
ThreadPoolExecutor doing the same work (submit blocks-1 no-op tasks, run one inline, wait),
plus np.abs on 2**20 float32 values serial versus 2 blocks. All cases are measured
interleaved, round by round, in the same run so machine noise hits them alike.
"""

import argparse
import datetime
import functools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnx_light.parallel import ThreadPool


def _noop(start: int, stop: int) -> None:
    pass


def _executor_region(executor: ThreadPoolExecutor, blocks: int) -> Callable[[], None]:
    def run() -> None:
        futures = [executor.submit(_noop, i, i + 1) for i in range(1, blocks)]
        _noop(0, 1)
        for future in futures:
            future.result()

    return run


def _pool_region(pool: ThreadPool, blocks: int) -> Callable[[], None]:
    parallel_for = pool.parallel_for

    def run() -> None:
        parallel_for(blocks, _noop)

    return run


def _time_calls(fn: Callable[[], None], count: int, into: list[float]) -> float:
    """Append per-call wall times (ns) to ``into``; return process CPU ns per call."""
    clock = time.perf_counter_ns
    cpu0 = time.process_time_ns()
    for _ in range(count):
        t0 = clock()
        fn()
        into.append(clock() - t0)
    return (time.process_time_ns() - cpu0) / count


def _pin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})  # 0 = the calling thread on Linux


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="interleaved rounds")
    parser.add_argument("--inner", type=int, default=200, help="timed calls per case per round")
    parser.add_argument(
        "--pin",
        choices=["same", "cross"],
        help="Linux only: measure 2 blocks with the caller on CPU 0 and the worker on CPU 0 "
        "(same) or CPU 1 (cross), to separate the OS wake-up cost from thread placement",
    )
    args = parser.parse_args(argv)

    cpus = os.cpu_count() or 1
    sizes = [2] if args.pin else sorted({2, max(cpus, 2), 4})
    worker_cpu = {"same": 0, "cross": 1}.get(args.pin or "", -1)
    if args.pin:
        _pin(0)
    xs = {e: np.random.default_rng(e).standard_normal(1 << e).astype(np.float32) for e in (20, 22)}
    outs = {e: np.empty_like(x) for e, x in xs.items()}

    def abs_block(e: int) -> Callable[[int, int], None]:
        x, out = xs[e], outs[e]

        def block(start: int, stop: int) -> None:
            np.abs(x[start:stop], out=out[start:stop])

        return block

    samples: dict[str, list[float]] = {}
    cpu_ns: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        # Fresh threads every round: where the OS places a worker relative to the caller
        # (same CPU or not) changes the wake-up cost a lot, so sample many placements.
        pools = {k: ThreadPool(k) for k in sizes}
        executors = {k: ThreadPoolExecutor(max_workers=k - 1) for k in sizes}
        cases: dict[str, Callable[[], None]] = {}
        for k in sizes:
            cases[f"pool/{k}"] = _pool_region(pools[k], k)
            cases[f"tpe/{k}"] = _executor_region(executors[k], k)
        for e in xs:
            x, out, block = xs[e], outs[e], abs_block(e)
            cases[f"abs{e}/serial"] = functools.partial(np.abs, x, out=out)
            cases[f"abs{e}/pool2"] = functools.partial(
                pools[2].parallel_for, x.size, block, max_blocks=2
            )
        if args.pin:
            pools[2].parallel_for(2, lambda start, stop: _pin(worker_cpu) if start else None)
            executors[2].submit(_pin, worker_cpu).result()
        for fn in cases.values():  # start the threads, warm caches and page faults
            _time_calls(fn, 5, [])
        for name, fn in cases.items():
            inner = max(args.inner // 10, 5) if name.startswith("abs") else args.inner
            cpu = _time_calls(fn, inner, samples.setdefault(name, []))
            cpu_ns.setdefault(name, []).append(cpu)
        for pool in pools.values():
            pool.close()
        for executor in executors.values():
            executor.shutdown()
    for e in xs:
        np.testing.assert_array_equal(outs[e], np.abs(xs[e]))

    def med_us(name: str) -> float:
        return statistics.median(samples[name]) / 1e3

    def cpu_us(name: str) -> float:
        return statistics.median(cpu_ns[name]) / 1e3

    print(f"{datetime.date.today().isoformat()}: python {platform.python_version()}, "
          f"numpy {np.__version__}, os.cpu_count()={cpus}, repeats={args.repeats}, "
          f"inner={args.inner}, pin={args.pin or 'no'}")
    print()
    print("Median wall time of one call (us); in brackets: process CPU time per call (us, all "
          "threads).")
    print()
    print("| empty region, blocks | onnx_light ThreadPool | ThreadPoolExecutor "
          "| executor / pool (wall) | executor / pool (CPU) |")
    print("|---:|---:|---:|---:|---:|")
    for k in sizes:
        p, t = f"pool/{k}", f"tpe/{k}"
        print(f"| {k} | {med_us(p):.1f} [{cpu_us(p):.1f}] | {med_us(t):.1f} [{cpu_us(t):.1f}] "
              f"| {med_us(t) / med_us(p):.2f}x | {cpu_us(t) / cpu_us(p):.2f}x |")
    print()
    print("| workload | serial (us) | parallel_for, 2 blocks (us) | speedup |")
    print("|---|---:|---:|---:|")
    for e in xs:
        serial_us, par_us = med_us(f"abs{e}/serial"), med_us(f"abs{e}/pool2")
        print(f"| np.abs, 2^{e} float32, out= | {serial_us:.1f} | {par_us:.1f} "
              f"| {serial_us / par_us:.2f}x |")


if __name__ == "__main__":
    main()
