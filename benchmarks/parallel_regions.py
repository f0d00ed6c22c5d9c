"""The cost of one parallel region, for each way the compiled kernels could run one.

Usage: python benchmarks/parallel_regions.py [--regions N] [--idle-ms 0.5]

Options measured, each in a fresh child process (the OpenMP runtime reads its wait policy
when it loads), at 1 and 2 threads:

* ``prange omp``: a numba ``prange`` region (numba's OpenMP threading layer, libgomp's
  default wait policy: spin for a while, then sleep);
* ``prange omp passive``: the same with ``OMP_WAIT_POLICY=PASSIVE`` (threads sleep at once);
* ``prange omp spin 10k``: ``GOMP_SPINCOUNT=10000`` (a short spin, then sleep);
* ``pool + nogil``: onnx_light's ThreadPool handing one block to each thread, each block a
  call of a serial compiled (nogil) kernel;
* ``serial call``: one call of that serial compiled kernel (no region at all).

Printed: the median microseconds per region back to back and after ``--idle-ms`` of sleep,
and the CPU milliseconds the process burns in the 20 ms after its last region (threads left
spinning).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnx_light.kernels.compiled import compiled, load_numba, prange
from onnx_light.parallel import ThreadPool

# onnx_light sets OMP_WAIT_POLICY=PASSIVE unless it is set: an empty value keeps libgomp's
# default (it ignores a value it does not know).
OPTIONS = {
    "prange omp": {"OMP_WAIT_POLICY": ""},
    "prange omp passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "prange omp spin 10k": {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "10000"},
    "pool + nogil": {},
    "serial call": {},
}


@compiled(parallel=True)
def _region(out: np.ndarray) -> None:
    for i in prange(out.size):
        out[i] = i


@compiled
def _block(out: np.ndarray, start: int, stop: int) -> None:
    for i in range(start, stop):
        out[i] = i


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _measure(option: str, threads: int, regions: int, idle_s: float) -> dict[str, float]:
    numba = load_numba()
    numba.config.THREADING_LAYER = "omp"
    out = np.zeros(threads)
    pool = ThreadPool(threads)
    block = _block.dispatcher
    if option.startswith("prange"):
        region = _region.dispatcher
        numba.set_num_threads(threads)

        def run() -> None:
            region(out)
    elif option == "pool + nogil":
        def run() -> None:
            pool.parallel_for(threads, lambda start, stop: block(out, start, stop))
    else:
        def run() -> None:
            block(out, 0, threads)
    for _ in range(100):
        run()
    back_to_back, after_idle = [], []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(regions):
            run()
        back_to_back.append((time.perf_counter() - started) / regions)
    for _ in range(max(20, regions // 50)):
        time.sleep(idle_s)
        started = time.perf_counter()
        run()
        after_idle.append(time.perf_counter() - started)
    cpu = _cpu_seconds()
    time.sleep(0.02)
    spinning = _cpu_seconds() - cpu
    pool.close()
    return {"back_to_back_us": statistics.median(back_to_back) * 1e6,
            "after_idle_us": statistics.median(after_idle) * 1e6, "cpu_after_ms": spinning * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regions", type=int, default=2000)
    parser.add_argument("--idle-ms", type=float, default=0.5)
    parser.add_argument("--child", nargs=2, metavar=("OPTION", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        option, threads = args.child
        print(json.dumps(_measure(option, int(threads), args.regions, args.idle_ms / 1e3)))
        return
    print(f"load average {os.getloadavg()[0]:.2f}, cpus {os.cpu_count()}, idle {args.idle_ms} ms\n")
    print("| option | threads | back to back us | after idle us | CPU ms in 20 ms after |")
    print("|---|---|---|---|---|")
    for option, environment in OPTIONS.items():
        for threads in (1, 2):
            child = subprocess.run(
                [sys.executable, __file__, "--regions", str(args.regions), "--idle-ms",
                 str(args.idle_ms), "--child", option, str(threads)],
                env={**os.environ, **environment}, capture_output=True, text=True, check=True)
            result = json.loads(child.stdout.strip().splitlines()[-1])
            print(f"| {option} | {threads} | {result['back_to_back_us']:.2f} | "
                  f"{result['after_idle_us']:.2f} | {result['cpu_after_ms']:.2f} |")


if __name__ == "__main__":
    main()
