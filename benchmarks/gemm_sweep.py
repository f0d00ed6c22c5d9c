"""Gemm/MatMul sweep: every execution plan of the kernels over a corpus of shapes, and numpy.

Usage: python benchmarks/gemm_sweep.py [--seconds-per-shape S] [--threads T] [--only float,double,...]
                                       [--max-wait S] [--max-load CORES]

For each shape of the corpus (small, skinny, square, tall and wide, transposed, batched, and
shapes from real models, in float, double, float16, bfloat16, int32 and int64) the script
times, interleaved round by round so machine noise hits them alike, the median of:

* ``numpy``: ``numpy.matmul`` on the same operands with the default BLAS thread count;
* ``serial``: the kernel's forced-serial path (one BLAS call limited to one BLAS thread);
* ``blas``: one BLAS call with T BLAS threads;
* ``split_rows`` / ``split_columns`` / ``split_batch``: the output split across a T-thread
  pool, one single-threaded BLAS call per block (where the shape allows that split).

The kernels run inside ``BLAS.scope(1)``, as a runtime would hold it around a whole run.

Two effects of a shared 2-core machine are handled explicitly:

* After a multi-threaded call OpenBLAS's worker threads spin for about 0.1 s (its
  THREAD_TIMEOUT) and take a core from the pool. Each measurement therefore has two
  interleaved phases: first serial and the split plans (BLAS single-threaded), then numpy,
  ``blas`` and serial again; the ratio of the two serial medians is printed as ``drift``.
  Before each shape the script sleeps at least 0.2 s, which also lets those workers go idle.
* Other processes (other people's tests) steal cores. /proc/stat gives the cores they used
  while a shape was measured ("other load"); before each shape the script waits, up to
  ``--max-wait`` seconds in all, for that to fall under ``--max-load``, and shapes measured
  above it are left out of the scoring.

Because a portable default must also behave on a busy machine, every shape is measured twice:
quiet, then contended, with a busy-looping child process (started stopped, resumed only for
that part with SIGCONT, stopped again with SIGSTOP, killed at the end) taking one core.

A configuration (threshold, mode, minimum rows) only chooses among those plans, and with the
block boundaries fixed by ``(size, threads)`` the chosen plan runs exactly the measured code,
so the script scores every configuration of a grid from the same measurements: for each shape
it asks the kernel's own ``plan()`` which plan the configuration picks and divides that plan's
time by the best plan's time under the same condition. It ranks the configurations of each
group of element types by the geometric means of those ratios, quiet and contended, putting
last those that are more than ``FRAGILE`` (3) times slower than the best plan on some shape
under either condition: a portable default must not have cliffs. That ranking is the portable
defaults' evidence (docs/gemm.md). ``--save`` keeps the measurements as JSON and ``--replay``
prints the tables again from them, with the kernel's current ``plan()`` and defaults.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import threadpoolctl
from onnx import TensorProto

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnx_light.kernels import gemm
from onnx_light.kernels.base import NodeContext
from onnx_light.parallel import ThreadPool

T = TensorProto
DTYPES = {T.FLOAT: np.float32, T.DOUBLE: np.float64, T.FLOAT16: np.float16,
          T.BFLOAT16: ml_dtypes.bfloat16, T.INT32: np.int32, T.INT64: np.int64}
NAMES = {T.FLOAT: "float", T.DOUBLE: "double", T.FLOAT16: "float16", T.BFLOAT16: "bfloat16",
         T.INT32: "int32", T.INT64: "int64"}
PLANS = ("serial", "blas", "split_rows", "split_columns", "split_batch")
NEVER = 1 << 62
FRAGILE = 3.0  # a configuration this much slower than the best plan on some shape ranks last


@dataclass(frozen=True)
class Case:
    label: str
    m: int
    k: int
    n: int
    element_type: int = T.FLOAT
    trans_a: bool = False
    trans_b: bool = False
    batch: tuple[int, ...] = ()
    shared_b: bool = False  # batched A times one (K, N) B, as in a transformer's projections

    @property
    def flops(self) -> int:
        return math.prod(self.batch) * self.m * self.n * self.k


def blas_lines() -> list[str]:
    """One markdown line per BLAS library numpy loaded: implementation, version, threading
    layer, architecture, thread count, file, and OPENBLAS_CORETYPE."""
    return [f"BLAS: {info.get('internal_api')} {info.get('version')} ({info.get('threading_layer')}, "
            f"{info.get('architecture')}, {info.get('num_threads')} threads), "
            f"{Path(info.get('filepath', '')).name}; OPENBLAS_CORETYPE="
            f"{os.environ.get('OPENBLAS_CORETYPE', '(unset)')}  "
            for info in threadpoolctl.threadpool_info() if info.get("user_api") == "blas"]


def corpus() -> list[Case]:
    cases = [Case(f"{s}x{s}x{s}", s, s, s) for s in (8, 16, 32, 64, 96)]
    cases += [Case(f"{s}x{s}x{s}", s, s, s) for s in (128, 192, 256, 384, 512, 768, 1024)]
    cases += [
        Case("1x256x256", 1, 256, 256), Case("1x1024x1024", 1, 1024, 1024),
        Case("256x256x1", 256, 256, 1), Case("1024x1024x1", 1024, 1024, 1),
        Case("8x512x512", 8, 512, 512), Case("16x1024x256", 16, 1024, 256),
        Case("4x256x1024", 4, 256, 1024), Case("32x64x32", 32, 64, 32),
        Case("4096x64x64", 4096, 64, 64), Case("64x64x4096", 64, 64, 4096),
        Case("2048x256x32", 2048, 256, 32), Case("32x256x2048", 32, 256, 2048),
        Case("512x512x512 tA", 512, 512, 512, trans_a=True),
        Case("512x512x512 tB", 512, 512, 512, trans_b=True),
        Case("512x512x512 tAtB", 512, 512, 512, trans_a=True, trans_b=True),
        Case("128x1024x64 tB", 128, 1024, 64, trans_b=True),
        Case("fc 1x2048x1000 tB", 1, 2048, 1000, trans_b=True),
        Case("fc 1x9216x4096 tB", 1, 9216, 4096, trans_b=True),
        Case("fc 8x4096x4096 tB", 8, 4096, 4096, trans_b=True),
        Case("im2col 64x3136x576", 64, 3136, 576),
        Case("im2col 64x576x3136", 64, 576, 3136),
        Case("im2col 3136x576x64", 3136, 576, 64),
        Case("b12 128x64x128", 128, 64, 128, batch=(12,)),
        Case("b8 64x64x64", 64, 64, 64, batch=(8,)),
        Case("b2x3 32x32x32", 32, 32, 32, batch=(2, 3)),
        Case("b4 128x768x768 shared B", 128, 768, 768, batch=(4,), shared_b=True),
    ]
    for element_type in (T.DOUBLE, T.FLOAT16, T.BFLOAT16):
        cases += [Case(f"{s}x{s}x{s}", s, s, s, element_type) for s in (64, 128, 256, 512)]
        cases += [Case("fc 1x2048x1000 tB", 1, 2048, 1000, element_type, trans_b=True),
                  Case("im2col 64x576x3136", 64, 576, 3136, element_type)]
    for element_type in (T.INT32, T.INT64):
        cases += [Case(f"{s}x{s}x{s}", s, s, s, element_type) for s in (16, 32, 64, 96, 128, 192)]
        cases += [Case("1x256x256", 1, 256, 256, element_type),
                  Case("b8 32x32x32", 32, 32, 32, element_type, batch=(8,))]
    return cases


def _inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    dtype = DTYPES[case.element_type]
    a_shape = (*case.batch, case.k, case.m) if case.trans_a else (*case.batch, case.m, case.k)
    b_shape = (case.n, case.k) if case.trans_b else (case.k, case.n)
    if not case.shared_b:
        b_shape = (*case.batch, *b_shape)
    if np.dtype(dtype).kind in "iu":
        return (rng.integers(-8, 8, a_shape).astype(dtype), rng.integers(-8, 8, b_shape).astype(dtype))
    return (rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype))


def _kernel(case: Case, values: dict, pool: ThreadPool) -> gemm._ProductKernel:
    element_type = case.element_type
    if case.batch:
        ctx = NodeContext("sweep", "MatMul", "", 13, {}, (element_type,) * 2, (element_type,), 2, 1)
        kernel: gemm._ProductKernel = gemm.MatMulKernel(ctx)
    else:
        attributes = {"transA": int(case.trans_a), "transB": int(case.trans_b)}
        ctx = NodeContext("sweep", "Gemm", "", 13, attributes, (element_type,) * 2, (element_type,), 2, 1)
        kernel = gemm.GemmKernel(ctx)
    kernel.bind(pool).configure(values)
    return kernel


def _forced(case: Case, plan: str, pool: ThreadPool) -> gemm._ProductKernel | None:
    """A kernel whose configuration makes it take ``plan`` on this case, or None if none does."""
    integer = np.dtype(DTYPES[case.element_type]).kind in "iu"
    if plan == "serial":
        values = {gemm.MINIMUM_FLOPS: NEVER, gemm.MODE: "split", gemm.MINIMUM_ROWS: 1}
    elif plan == "blas":
        if integer:
            return None
        values = {gemm.MINIMUM_FLOPS: 1, gemm.MODE: "blas", gemm.MINIMUM_ROWS: 1}
    else:
        mode = "split_columns" if plan == "split_columns" else "split_rows"
        values = {gemm.MINIMUM_FLOPS: 1, gemm.MODE: mode, gemm.MINIMUM_ROWS: 1}
    kernel = _kernel(case, values, pool)
    if kernel.plan(case.m, case.n, case.k, case.batch) != plan:
        return None
    return kernel


def _sample(fn: Callable[[], object], inner: int, scoped: bool) -> float:
    """Seconds per call over ``inner`` calls."""
    clock = time.perf_counter
    if scoped:
        with gemm.BLAS.scope(1):
            start = clock()
            for _ in range(inner):
                fn()
            return (clock() - start) / inner
    start = clock()
    for _ in range(inner):
        fn()
    return (clock() - start) / inner


class LoadMonitor:
    """CPU time other processes use, in cores, from /proc/stat (None where it does not exist)."""

    def __init__(self) -> None:
        self.available = os.path.exists("/proc/stat")
        self.ticks = os.sysconf("SC_CLK_TCK") if self.available else 100

    def _read(self) -> tuple[float, float, float]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:9]]
        busy = sum(fields) - fields[3] - fields[4]  # everything but idle and iowait
        own = os.times()
        return time.perf_counter(), busy / self.ticks, own.user + own.system

    def start(self) -> tuple[float, float, float] | None:
        return self._read() if self.available else None

    def foreign(self, since: tuple[float, float, float] | None) -> float | None:
        """Average cores used by other processes since ``start()``."""
        if since is None:
            return None
        now = self._read()
        wall = max(now[0] - since[0], 1e-6)
        return max(0.0, ((now[1] - since[1]) - (now[2] - since[2])) / wall)

    def wait_quiet(self, budget: list[float], limit: float = 0.3, window: float = 0.2) -> None:
        """Sleep in ``window`` steps until others use less than ``limit`` cores or budget[0] runs out.

        Always sleeps one window: that also lets a multi-threaded BLAS's spinning workers go idle.
        """
        while True:
            mark = self.start()
            time.sleep(window)
            load = self.foreign(mark)
            if load is None or load < limit or budget[0] <= 0:
                return
            budget[0] -= window


def _rounds(runs: dict[str, tuple[Callable[[], object], bool]], inner: int, seconds: float,
            samples: dict[str, list[float]]) -> None:
    """Interleaved rounds (the order rotates each round) until ``seconds`` are spent (7 to 61)."""
    per_round = sum(_sample(fn, inner, scoped) * inner for fn, scoped in runs.values())
    rounds = max(7, min(61, int(seconds / max(per_round, 1e-9))))
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn, scoped = runs[name]
            samples.setdefault(name, []).append(_sample(fn, inner, scoped))


class Competitor:
    """A busy-looping child process standing in for another process on the machine.

    It is started stopped (SIGSTOP) and only runs between :meth:`resume` and :meth:`pause`.
    """

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        if hasattr(signal, "SIGSTOP"):
            self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)

    def pause(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def measure(case: Case, pool: ThreadPool, seconds: float, rng: np.random.Generator,
            monitor: LoadMonitor, competitor: Competitor) -> dict[str, Any]:
    """Median seconds per call of numpy and of every plan the case allows, quiet and contended.

    Returns ``quiet`` and ``contended`` (plan -> seconds), the cores other processes used during
    the quiet measurement (``load``) and the quiet ``drift`` of the serial plan between phases.
    """
    a, b = _inputs(case, rng)
    a_used = np.swapaxes(a, -1, -2) if case.trans_a else a
    b_used = np.swapaxes(b, -1, -2) if case.trans_b else b
    compute = gemm._compute_dtype(a.dtype)
    if compute != a.dtype:  # numpy's own narrow-float matmul is a scalar loop; compare with the fair cast
        def numpy_fn() -> object:
            return np.matmul(a_used.astype(compute), b_used.astype(compute)).astype(a.dtype)
    else:
        def numpy_fn() -> object:
            return np.matmul(a_used, b_used)
    runs: dict[str, tuple[Callable[[], object], bool]] = {"numpy": (numpy_fn, False)}
    reference = np.asarray(numpy_fn(), dtype=np.float64)
    scale = float(np.abs(reference).max()) or 1.0
    for plan in PLANS:
        kernel = _forced(case, plan, pool)
        if kernel is not None:
            def call(run: Callable = kernel.run) -> object:
                return run(a, b)

            runs[plan] = (call, True)
            with gemm.BLAS.scope(1):
                got = np.asarray(call()[0], dtype=np.float64)
            if not np.allclose(got, reference, rtol=0, atol=1e-2 * scale):
                raise AssertionError(f"{case.label}: plan {plan} disagrees with numpy")
    # Calls per sample: enough that one sample lasts about a millisecond.
    single = min(_sample(fn, 1, scoped) for fn, scoped in runs.values())
    inner = max(1, min(500, int(1e-3 / max(single, 1e-7))))
    # Phase 1: the plans that keep BLAS single-threaded. Phase 2: multi-threaded BLAS (numpy and
    # "blas"), whose spinning workers would otherwise steal a core from the pool in phase 1.
    single_threaded = {n: r for n, r in runs.items() if n not in ("numpy", "blas")}
    multi_threaded = {n: r for n, r in runs.items() if n in ("numpy", "blas")}
    multi_threaded["serial again"] = runs["serial"]

    def phases(budget: float) -> dict[str, float]:
        samples: dict[str, list[float]] = {}
        _rounds(single_threaded, inner, budget * 0.6, samples)
        _rounds(multi_threaded, inner, budget * 0.4, samples)
        return {name: statistics.median(values) for name, values in samples.items()}

    mark = monitor.start()
    quiet = phases(seconds * 0.55)
    load = monitor.foreign(mark)
    time.sleep(0.15)  # let BLAS's spinning workers go idle
    competitor.resume()
    try:
        contended = phases(seconds * 0.45)
    finally:
        competitor.pause()
    drift = quiet.pop("serial again") / quiet["serial"]
    contended.pop("serial again")
    return {"quiet": quiet, "contended": contended, "load": load, "drift": drift}


def _group(element_type: int) -> str:
    return "integer" if element_type in (T.INT32, T.INT64) else NAMES[element_type]


def choices(cases: list[Case], pool: ThreadPool, values: dict) -> tuple[str, ...]:
    """The plan ``values`` picks for each case (asked of the kernel itself)."""
    return tuple(_kernel(case, values, pool).plan(case.m, case.n, case.k, case.batch) for case in cases)


def score(plans: tuple[str, ...], times: list[dict[str, float]]) -> tuple[float, float]:
    """Geometric mean and worst of (time of the chosen plan) / (best plan's time)."""
    ratios = [measured[plan] / min(t for name, t in measured.items() if name != "numpy")
              for plan, measured in zip(plans, times, strict=True)]
    return math.exp(statistics.fmean(math.log(r) for r in ratios)), max(ratios)


def grid(integer: bool) -> list[dict]:
    thresholds = [1 << p for p in range(10, 27)] + [NEVER]
    modes = gemm.INTEGER_MODES if integer else gemm.MODES
    return [{gemm.MINIMUM_FLOPS: t, gemm.MODE: mode, gemm.MINIMUM_ROWS: rows}
            for mode, rows, t in itertools.product(modes, (1, 2, 4, 8, 16, 32, 64), thresholds)]


def _flops(value: int) -> str:
    return "never" if value == NEVER else f"2^{value.bit_length() - 1}"


def _span(values: list[int], fmt: Callable[[int], str] = str) -> str:
    low, high = min(values), max(values)
    return fmt(low) if low == high else f"{fmt(low)} .. {fmt(high)}"


def print_scores(group: str, cases: list[Case], results: list[dict[str, Any]], pool: ThreadPool) -> None:
    """Configurations of the grid ranked by the geometric mean of their quiet and contended scores.

    Configurations that pick the same plan for every case score the same: they are one row,
    listing their modes and the ranges of minimum_rows and thresholds (not every combination
    in the ranges need belong to the row).
    """
    quiet = [r["quiet"] for r in results]
    contended = [r["contended"] for r in results]
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for values in grid(group == "integer"):
        plans = choices(cases, pool, values)
        row = rows.get(plans)
        if row is None:
            q, q_worst = score(plans, quiet)
            c, c_worst = score(plans, contended)
            row = rows[plans] = {"modes": [], "rows": [], "flops": [], "scores": (q, q_worst, c, c_worst)}
        if values[gemm.MODE] not in row["modes"]:
            row["modes"].append(values[gemm.MODE])
        row["rows"].append(values[gemm.MINIMUM_ROWS])
        row["flops"].append(values[gemm.MINIMUM_FLOPS])
    def rank(row: dict[str, Any]) -> tuple[bool, float]:
        q, q_worst, c, c_worst = row["scores"]
        return (max(q_worst, c_worst) > FRAGILE, math.sqrt(q * c))

    ranked = sorted(rows.values(), key=rank)
    print(f"\n{group}: configurations by sqrt(quiet x contended) geometric mean of time / best plan "
          f"over {len(cases)} shapes; those {FRAGILE:g}x slower than the best plan somewhere come last\n")
    print("| mode | minimum_rows | minimum_flops | quiet | quiet worst | contended | contended worst |")
    print("|---|---|---|---|---|---|---|")
    for row in ranked[:10]:
        q, q_worst, c, c_worst = row["scores"]
        print(f"| {', '.join(row['modes'])} | {_span(row['rows'])} | {_span(row['flops'], _flops)} | "
              f"{q:.3f} | {q_worst:.2f} | {c:.3f} | {c_worst:.2f} |")
    defaults = dict(gemm.gemm_schema("Gemm", cases[0].element_type).defaults)
    plans = choices(cases, pool, defaults)
    q, q_worst, c, c_worst = rows[plans]["scores"] if plans in rows else (*score(plans, quiet),
                                                                          *score(plans, contended))
    print(f"| **default** {defaults[gemm.MODE]} | {defaults[gemm.MINIMUM_ROWS]} | "
          f"{_flops(defaults[gemm.MINIMUM_FLOPS])} | {q:.3f} | {q_worst:.2f} | {c:.3f} | {c_worst:.2f} |")


def _fmt_time(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.1f}" if us < 100 else f"{us:.0f}"


def print_times(title: str, cases: list[Case], results: list[dict[str, Any]], which: str,
                pool: ThreadPool) -> None:
    print(f"\n{title}\n")
    header = ["type", "shape (MxKxN)", "numpy", *PLANS, "best", "GFLOP/s", "default", "default/best"]
    if which == "quiet":
        header += ["other load", "drift"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for case, result in zip(cases, results, strict=True):
        measured = result[which]
        plans = {p: t for p, t in measured.items() if p != "numpy"}
        best = min(plans, key=plans.__getitem__)
        gflops = 2 * case.flops / plans[best] / 1e9
        default = _kernel(case, None, pool).plan(case.m, case.n, case.k, case.batch)
        cells = [NAMES[case.element_type], case.label, _fmt_time(measured["numpy"])]
        cells += [_fmt_time(measured[p]) if p in measured else "-" for p in PLANS]
        cells += [best, f"{gflops:.1f}", default, f"{measured[default] / plans[best]:.2f}"]
        if which == "quiet":
            load = result["load"]
            cells += ["?" if load is None else f"{load:.2f}", f"{result['drift']:.2f}"]
        print("| " + " | ".join(cells) + " |")


def _measure_all(cases: list[Case], pool: ThreadPool, args: argparse.Namespace) -> tuple[str, list]:
    """Measure every case; returns the report's header (machine, BLAS, timing) and the results."""
    rng = np.random.default_rng(0)
    monitor = LoadMonitor()
    competitor = Competitor()
    started = time.perf_counter()
    lines = [f"# Gemm/MatMul sweep, {datetime.date.today().isoformat()}", "",
             f"command: python {' '.join(sys.argv)}  ",
             f"python {platform.python_version()}, numpy {np.__version__}, threads {args.threads}, "
             f"cpu_count {os.cpu_count()}  "]
    lines += blas_lines()
    wait_budget = [args.max_wait]
    results = []
    try:
        for case in cases:
            monitor.wait_quiet(wait_budget)
            results.append(measure(case, pool, args.seconds_per_shape, rng, monitor, competitor))
    finally:
        competitor.close()
    elapsed = time.perf_counter() - started
    lines += ["", f"{elapsed:.0f} s in all, {args.max_wait - wait_budget[0]:.0f} s of it waiting for "
              "other processes. Median microseconds per call; GFLOP/s of the best plan; 'default': the "
              "plan the portable defaults pick."]
    return "\n".join(lines), results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds-per-shape", type=float, default=1.2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--max-wait", type=float, default=30.0,
                        help="seconds in all to wait for other processes to go quiet before shapes")
    parser.add_argument("--max-load", type=float, default=0.3,
                        help="shapes measured while other processes used more cores are not scored")
    parser.add_argument("--save", help="also write the measurements to this JSON file")
    parser.add_argument("--replay", nargs="+", metavar="JSON",
                        help="print the tables from files written by --save instead of measuring (the "
                             "'default' columns use the current defaults; a later file's shapes "
                             "replace an earlier one's)")
    parser.add_argument("--only", default="", help="comma-separated groups: float,double,float16,"
                                                   "bfloat16,integer")
    args = parser.parse_args(argv)
    only = {g.strip() for g in args.only.split(",") if g.strip()}
    cases = [c for c in corpus() if not only or _group(c.element_type) in only]
    pool = ThreadPool(args.threads)
    if args.replay:
        labels = {(NAMES[c.element_type], c.label): c for c in corpus()}
        by_case: dict[tuple[str, str], dict[str, Any]] = {}
        for path in args.replay:
            with open(path) as file:
                saved = json.load(file)
            print(saved["header"] + "\n")
            by_case.update({tuple(r["case"]): r for r in saved["results"]})
        order = [key for key in labels if key in by_case]
        cases = [labels[key] for key in order]
        results = [by_case[key] for key in order]
    else:
        header, results = _measure_all(cases, pool, args)
        print(header)
        if args.save:
            with open(args.save, "w") as file:
                records = [{**r, "case": [NAMES[c.element_type], c.label]}
                           for c, r in zip(cases, results, strict=True)]
                json.dump({"header": header, "results": records}, file, indent=1)
    print_times("Quiet ('other load': cores other processes used meanwhile; 'drift': the serial plan's "
                "time in the second phase / the first)", cases, results, "quiet", pool)
    print_times("Contended (one busy-looping competitor process)", cases, results, "contended", pool)
    noisy = {i for i, r in enumerate(results) if r["load"] is not None and r["load"] > args.max_load}
    if noisy:
        print(f"\nnot scored (other processes used more than {args.max_load} cores during the quiet "
              "measurement): " + ", ".join(f"{NAMES[cases[i].element_type]} {cases[i].label}"
                                           for i in sorted(noisy)))
    groups: dict[str, list[int]] = {}
    for i, case in enumerate(cases):
        if i not in noisy:
            groups.setdefault(_group(case.element_type), []).append(i)
    for group, indices in groups.items():
        print_scores(group, [cases[i] for i in indices], [results[i] for i in indices], pool)
    pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
