"""The cost of one parallel region, for each way the compiled kernels could run one.

Usage: python benchmarks/parallel_regions.py [--options NAME ...] [--threads 2] [--work-us 0 100
300 500] [--samples 200] [--every-run] [--load N]

Options measured, each in a fresh child process (libgomp reads its wait policy and spin count
once, when it loads):

* ``passive``: a numba ``prange`` region on numba's OpenMP layer with ``OMP_WAIT_POLICY=PASSIVE``
  (what ``compiled.load_numba`` sets: threads sleep at once);
* ``default``: libgomp's own policy (spin for a while, then sleep);
* ``spin N``: the policy unset and ``GOMP_SPINCOUNT=N`` (spin N rounds, then sleep);
* ``active``: ``OMP_WAIT_POLICY=ACTIVE`` (threads never sleep);
* ``..., awake``: the regions inside ``ThreadPool.hot(0, loop, awake_us=100)`` (an
  idle-priority thread per worker spinning so that no processor halts; ``awake N``: N such
  threads);
* ``pool`` and ``pool, awake``: onnx_light's ThreadPool handing one block to each thread, each
  block a serial compiled (nogil) call, without and with the awake scope; ``pool, hot 200``:
  with the pool's threads spinning up to 200 us for each other (``ThreadPool.hot``'s
  ``spin_us``);
* ``team``: a region of the pool's native team (``kernels/team.py``: a task per thread, each
  storing one value, run by the caller and by workers spinning in compiled code inside
  ``ThreadPool.hot``'s team scope, ``runtime/session.py``'s ``TEAM_US``).

Each sample is one empty region after ``--work-us`` microseconds of serial work on the caller
(0: back to back), timed in batches of ten. A batch starts when no task outside this process
is runnable and counts only if none is just after it (``/proc/loadavg``, as
``benchmarks/session_threads.py`` does), unless ``--every-run``; ``--load N`` runs N busy
processes meanwhile (a loaded machine). Printed: the median microseconds per region for each
amount of work, and the CPU milliseconds the process's other threads burn in the 20 ms after
its last region (threads left spinning). Results: docs/parallel.md ("Parallel regions of the
compiled kernels").
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from hot_regions import others_runnable  # noqa: E402

from onnx_light import parallel  # noqa: E402
from onnx_light.kernels.compiled import compiled, load_numba, prange  # noqa: E402
from onnx_light.kernels.spin import spin_loop  # noqa: E402
from onnx_light.kernels.team import (  # noqa: E402
    carray,
    float32_pointer,
    int64_pointer,
    task_function,
    team_loop,
    team_region,
)
from onnx_light.runtime.session import TEAM_US  # noqa: E402

AWAKE_US = 100.0
#: Regions timed one after the other between two looks at the load (a look takes ~130 us).
BATCH = 10
# onnx_light sets OMP_WAIT_POLICY=PASSIVE unless it is set: an empty value keeps libgomp's
# default (it ignores a value it does not know).
OPTIONS = ["passive", "default", "spin 1000", "spin 10000", "spin 30000", "spin 100000",
           "active", "passive, awake", "passive, awake 2", "spin 1000, awake", "pool",
           "pool, awake", "team"]


def environment(option: str) -> dict[str, str]:
    """The environment an option's child process runs with: its first part ``passive``,
    ``default``, ``active``, ``spin N`` (any N) or ``pool`` (passive), then optionally
    ``awake`` or ``awake N`` (N spinners instead of one per worker) and ``hot US`` (the
    pool's own threads spin up to US microseconds)."""
    first, *rest = (part.strip() for part in option.split(","))
    if any(not part.startswith(("awake", "hot ")) for part in rest):
        raise SystemExit(f"unknown option {option!r}")
    if first.startswith("spin "):
        return {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": str(int(float(first.split()[1])))}
    if first in ("passive", "pool", "team"):
        return {"OMP_WAIT_POLICY": "PASSIVE"}
    if first in ("default", "active"):
        return {"OMP_WAIT_POLICY": "" if first == "default" else "ACTIVE"}
    raise SystemExit(f"unknown option {option!r}")


@compiled(parallel=True)
def _region(out: np.ndarray) -> None:
    for i in prange(out.size):
        out[i] = i


@task_function
def _task(arguments: int, task: int) -> None:
    values = carray(int64_pointer(arguments), 2)
    carray(float32_pointer(values[0]), values[1])[task] = task


@compiled
def _block(out: np.ndarray, start: int, stop: int) -> None:
    for i in range(start, stop):
        out[i] = i


def _other_threads_cpu() -> float:
    """CPU seconds used so far by this process's threads other than the calling one (the
    kernel's exact per-thread run time, ``/proc/self/task/*/schedstat``)."""
    me, total = threading.get_native_id(), 0
    for task in Path("/proc/self/task").iterdir():
        if task.name != str(me):
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_text().split()[0])
    return total * 1e-9


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _measure(option: str, threads: int, work_us: list[float], samples: int, gate: bool,
             max_seconds: float) -> dict[str, object]:
    numba = load_numba()
    numba.config.THREADING_LAYER = "omp"
    out = np.zeros(threads)
    pool = parallel.ThreadPool(threads)
    block = _block.dispatcher
    spinners = [part.split()[1:] for part in option.split(", ") if part.startswith("awake")]
    if spinners and spinners[0]:
        parallel._start_awake = functools.partial(
            lambda start, core, count, keep: start(core, int(spinners[0][0]), keep),
            parallel._start_awake)
    awake = AWAKE_US if spinners else 0.0
    hot = [float(part.split()[1]) for part in option.split(", ") if part.startswith("hot ")]
    team = team_loop() if option.startswith("team") else None
    if option.startswith("pool"):
        def run() -> None:
            pool.parallel_for(threads, lambda start, stop: block(out, start, stop))
    elif team is not None:
        values = np.zeros(threads, np.float32)
        arguments = np.array([values.ctypes.data, threads], np.int64)
        address, pointer, region = _task.address, arguments.ctypes.data, team_region.dispatcher

        def run() -> None:
            region(parallel.current_team().state, team.system, address, pointer, threads)
    else:
        region = _region.dispatcher
        numba.set_num_threads(threads)

        def run() -> None:
            region(out)
    times: dict[float, list[float]] = {work: [] for work in work_us}
    retakes = 0
    with pool.hot(hot[0] if hot else 0.0, spin_loop(), awake, team, TEAM_US):
        for _ in range(100):
            run()
        deadline = time.monotonic() + max_seconds
        while min(map(len, times.values())) < samples and time.monotonic() < deadline:
            for work in work_us:
                while gate and others_runnable() > 0 and time.monotonic() < deadline:
                    time.sleep(0.001)
                batch = []
                for _ in range(BATCH):
                    _busy(work * 1e-6)
                    started = time.perf_counter()
                    run()
                    batch.append(time.perf_counter() - started)
                if gate and others_runnable() > 0:
                    retakes += 1
                    continue
                times[work] += batch
    cpu = _other_threads_cpu()
    time.sleep(0.02)
    spinning = _other_threads_cpu() - cpu
    pool.close()
    return {"us": {str(work): statistics.median(values) * 1e6 if values else float("nan")
                   for work, values in times.items()},
            "samples": min(map(len, times.values())), "retakes": retakes,
            "cpu_after_ms": spinning * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--options", nargs="+", default=OPTIONS, metavar="OPTION")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-us", nargs="+", type=float, default=[0.0, 100.0, 300.0, 500.0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--max-seconds", type=float, default=15.0, help="per option")
    parser.add_argument("--every-run", action="store_true", help="count samples whatever the load")
    parser.add_argument("--load", type=int, default=0, help="busy processes to run meanwhile")
    parser.add_argument("--child", metavar="OPTION", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = _measure(args.child, args.threads, args.work_us, args.samples, not args.every_run,
                          args.max_seconds)
        print(json.dumps(result))
        return
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load average "
              f"{os.getloadavg()[0]:.2f} before, cpus {os.cpu_count()}, threads {args.threads}, "
              f"{args.load} busy processes, {'every sample' if args.every_run else 'quiet instants'}\n")
        works = " | ".join(f"after {work:g} us work" for work in args.work_us)
        print(f"| option | {works} | other threads' CPU ms in 20 ms after | samples | retakes |")
        print("|---|" + "---:|" * (len(args.work_us) + 3))
        for option in args.options:
            command = [sys.executable, __file__, "--child", option, "--threads", str(args.threads),
                       "--samples", str(args.samples), "--max-seconds", str(args.max_seconds),
                       "--work-us", *map(str, args.work_us)]
            if args.every_run:
                command.append("--every-run")
            child = subprocess.run(command, env={**os.environ, **environment(option)},
                                   capture_output=True, text=True, check=True)
            result = json.loads(child.stdout.strip().splitlines()[-1])
            cells = " | ".join(f"{result['us'][str(work)]:.1f}" for work in args.work_us)
            print(f"| {option} | {cells} | {result['cpu_after_ms']:.2f} | {result['samples']} | "
                  f"{result['retakes']} |", flush=True)
        print(f"\nload average {os.getloadavg()[0]:.2f} after")
    finally:
        for process in busy:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
