"""Serial versus parallel elementwise kernels: where does the parallel path start to pay?

Usage: python benchmarks/elementwise_crossover.py [--repeats N] [--min-exp 10] [--max-exp 22]
                                                   [--sample-ms 1] [--cases NAME ...] [--extended]

For each case (Abs, Add with equal shapes and with a scalar, Not, Relu, Mul, Exp, Sigmoid on
float32 and, where ONNX allows it, int32) and each size 2**min_exp .. 2**max_exp, times
``kernel.run`` (output allocation included, as in a session) on three kernels of the same
node: forced serial (``parallel.minimum_elements`` = 2**62), forced parallel on a 2-thread
pool, and forced parallel on an ``os.cpu_count()``-thread pool.

Everything is interleaved: each round visits every case and size once and times the three
variants back to back (their order rotating every round), so machine noise hits them alike
and every (case, size) is sampled across the whole run. Pools are rebuilt every round so
that many placements of the worker threads are sampled. A sample times enough calls to
last ``--sample-ms``. Before checking timings, every parallel output is compared bit for bit
with the serial one.

The table gives medians (and their ratio, > 1: parallel wins) and the ratio of the best
samples. The crossover of a case is the smallest size from which parallel wins at that size
and at every larger size measured; it is given from the medians and from the best samples.
On a shared machine the medians include the rounds in which other processes held the
cores; the best samples approximate the machine with its cores free. The "headroom" probe
(printed first) measures how much of a second core was available: the speedup of a purely
compute-bound numpy call split in two blocks, sampled through the run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto as T

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnx_light.kernels.base import Kernel, NodeContext, numpy_dtype
from onnx_light.kernels.elementwise import KERNELS, MINIMUM_ELEMENTS, OPS, cost_class
from onnx_light.parallel import ThreadPool
from onnx_light.tuning.keys import element_type_name

SERIAL = {MINIMUM_ELEMENTS: 2**62}
PARALLEL = {MINIMUM_ELEMENTS: 1}
OP = {op.op_type: op for op in OPS}


@dataclass(frozen=True)
class Case:
    """One benchmarked node: op, element type and how its inputs are shaped."""

    op: str
    element_type: int
    layout: str  # "unary", "equal" (two inputs of the same shape) or "scalar" (second is 0-d)

    @property
    def name(self) -> str:
        return f"{self.op}/{element_type_name(self.element_type)}/{self.layout}"

    @property
    def num_inputs(self) -> int:
        return 1 if self.layout == "unary" else 2

    @property
    def cost_class(self) -> str:
        return cost_class(OP[self.op], self.element_type)

    def threshold_elements(self, threshold: int) -> int:
        """A class threshold in elements: cheap ones are in bytes of the element type."""
        if self.cost_class == "cheap":
            return max(1, threshold // numpy_dtype(self.element_type).itemsize)
        return threshold


CASES = [
    Case("Abs", T.FLOAT, "unary"), Case("Abs", T.INT32, "unary"),
    Case("Add", T.FLOAT, "equal"), Case("Add", T.INT32, "equal"),
    Case("Add", T.FLOAT, "scalar"), Case("Add", T.INT32, "scalar"),
    Case("Not", T.BOOL, "unary"),
    Case("Relu", T.FLOAT, "unary"), Case("Relu", T.INT32, "unary"),
    Case("Mul", T.FLOAT, "equal"), Case("Mul", T.INT32, "equal"),
    Case("Exp", T.FLOAT, "unary"),
    Case("Sigmoid", T.FLOAT, "unary"),
]
# --extended: other element types, to see whether the default should depend on them.
EXTENDED_CASES = [
    Case("Abs", T.INT8, "unary"), Case("Add", T.DOUBLE, "equal"), Case("Add", T.FLOAT16, "equal"),
    Case("Add", T.BFLOAT16, "equal"), Case("Exp", T.DOUBLE, "unary"),
    Case("Exp", T.BFLOAT16, "unary"), Case("Sigmoid", T.FLOAT16, "unary"),
]


class Inputs:
    """Deterministic inputs, shared between cases of the same element type and size."""

    def __init__(self) -> None:
        self._cache: dict[tuple[int, int, int], np.ndarray] = {}

    def array(self, element_type: int, shape: tuple[int, ...], index: int) -> np.ndarray:
        size = int(np.prod(shape))
        key = (element_type, size, index)
        if key not in self._cache:
            rng = np.random.default_rng([element_type, size, index])
            dtype = numpy_dtype(element_type)
            if element_type == T.BOOL:
                value = rng.random(size) < 0.5
            elif dtype.kind in "iu":
                value = rng.integers(-1000, 1000, size=size).astype(dtype)
            else:
                value = rng.standard_normal(size).astype(dtype)
            self._cache[key] = value
        return self._cache[key].reshape(shape)

    def for_case(self, case: Case, size: int) -> list[np.ndarray]:
        first = self.array(case.element_type, (size,), 0)
        if case.layout == "unary":
            return [first]
        return [first, self.array(case.element_type, (size,) if case.layout == "equal" else (), 1)]


def build(case: Case) -> Kernel:
    versions = KERNELS[case.op]
    ctx = NodeContext(name=case.name, op_type=case.op, domain="", opset=max(versions),
                      input_types=(case.element_type,) * case.num_inputs,
                      num_inputs=case.num_inputs)
    return versions[max(versions)](ctx)


def time_calls(fn: Callable[[], object], count: int) -> float:
    """Seconds per call over ``count`` calls."""
    clock = time.perf_counter
    start = clock()
    for _ in range(count):
        fn()
    return (clock() - start) / count


def crossover(sizes: list[int], ratios: list[float]) -> int | None:
    """Smallest size from which the ratio stays above 1 up to the largest size."""
    found = None
    for size, ratio in zip(reversed(sizes), reversed(ratios), strict=True):
        if ratio <= 1.0:
            break
        found = size
    return found


def headroom(pool: ThreadPool) -> float:
    """Speedup of a compute-bound numpy call (sin of 2**18 float64) split in two blocks."""
    x = np.linspace(0.0, 100.0, 1 << 18)
    out = np.empty_like(x)

    def block(start: int, stop: int) -> None:
        np.sin(x[start:stop], out=out[start:stop])

    def serial() -> None:
        np.sin(x, out=out)

    def parallel() -> None:
        pool.parallel_for(x.size, block, max_blocks=2)

    serial(), parallel()  # warm: pages touched, workers awake
    times = {serial: [], parallel: []}
    for _ in range(3):
        for fn in times:
            times[fn].append(time_calls(fn, 1))
    return min(times[serial]) / min(times[parallel])


def power_label(size: int | None) -> str:
    return "none" if size is None else f"2^{size.bit_length() - 1}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=31, help="interleaved rounds")
    parser.add_argument("--min-exp", type=int, default=10)
    parser.add_argument("--max-exp", type=int, default=22)
    parser.add_argument("--sample-ms", type=float, default=1.0,
                        help="minimum duration of one timed sample")
    parser.add_argument("--cases", nargs="*", help="only cases whose name contains one of these")
    parser.add_argument("--extended", action="store_true",
                        help="also int8, float64, float16 and bfloat16 cases")
    args = parser.parse_args(argv)

    cpus = os.cpu_count() or 1
    thread_counts = {"serial": 1, "2 blocks": 2, f"{cpus} blocks (cpu_count)": cpus}
    parallel_variants = [v for v in thread_counts if v != "serial"]
    sizes = [1 << e for e in range(args.min_exp, args.max_exp + 1)]
    cases = [c for c in [*CASES, *(EXTENDED_CASES if args.extended else [])]
             if not args.cases or any(s in c.name for s in args.cases)]
    started = time.perf_counter()
    load_before = os.getloadavg()
    inputs = Inputs()
    kernels = {(case.name, v): build(case) for case in cases for v in thread_counts}

    # Check the outputs and size the samples (calls per sample from the serial time).
    counts: dict[tuple[str, int], int] = {}
    with ThreadPool(1) as one, ThreadPool(2) as two, ThreadPool(cpus) as every:
        pools = {"serial": one, parallel_variants[0]: two, parallel_variants[1]: every}
        for case in cases:
            for size in sizes:
                xs = inputs.for_case(case, size)
                outputs = []
                for variant, pool in pools.items():
                    kernel = kernels[case.name, variant]
                    kernel.bind(pool).configure(SERIAL if variant == "serial" else PARALLEL)
                    outputs.append(kernel.run(*xs)[0])
                for variant, out in zip(parallel_variants, outputs[1:], strict=True):
                    if not np.array_equal(outputs[0].view(np.uint8), out.view(np.uint8)):
                        raise AssertionError(f"{case.name} 2^{size.bit_length() - 1}: "
                                             f"{variant} differs from serial")
                once = time_calls(lambda k=kernels[case.name, "serial"], xs=xs: k.run(*xs), 3)
                counts[case.name, size] = max(1, int(args.sample_ms * 1e-3 / max(once, 1e-7)))

    samples: dict[tuple[str, int, str], list[float]] = {}
    probes: list[float] = []
    for round_index in range(args.repeats):
        pools = {v: ThreadPool(n) for v, n in thread_counts.items()}
        for variant, pool in pools.items():
            for case in cases:
                kernels[case.name, variant].bind(pool).configure(SERIAL if variant == "serial" else PARALLEL)
        probes.append(headroom(pools[parallel_variants[0]]))
        shift = round_index % len(thread_counts)
        order = [*thread_counts][shift:] + [*thread_counts][:shift]
        for case in cases:
            for size in sizes:
                xs = inputs.for_case(case, size)
                count = counts[case.name, size]
                for variant in order:
                    kernel = kernels[case.name, variant]
                    kernel.run(*xs)  # warm: workers awake, output pages recycled
                    samples.setdefault((case.name, size, variant), []).append(
                        time_calls(lambda k=kernel, xs=xs: k.run(*xs), count))
        for pool in pools.values():
            pool.close()
        print(f"round {round_index + 1}/{args.repeats} ({time.perf_counter() - started:.0f} s)",
              file=sys.stderr)

    load_after = os.getloadavg()
    print(f"{datetime.datetime.now().isoformat(timespec='minutes')}: python "
          f"{platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
          f"os.cpu_count()={cpus}, repeats={args.repeats}, sample >= {args.sample_ms} ms, "
          f"{time.perf_counter() - started:.0f} s")
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
          f"headroom of a second core: median {statistics.median(probes):.2f}x, "
          f"best {max(probes):.2f}x, worst {min(probes):.2f}x (2.00x: a free second core)")
    print()
    print("Time of one `kernel.run` in us: median (best); serial / parallel of the medians "
          "(of the best samples). > 1: parallel wins.")
    print()
    header = " | ".join(f"{v}, us | serial / {v}" for v in parallel_variants)
    print(f"| case | elements | serial, us | {header} |")
    print("|---|---:|---:|" + "---:|---:|" * len(parallel_variants))
    summary = []
    for case in cases:
        median_ratios: dict[str, list[float]] = {v: [] for v in parallel_variants}
        best_ratios: dict[str, list[float]] = {v: [] for v in parallel_variants}
        for size in sizes:
            med = {v: statistics.median(samples[case.name, size, v]) for v in thread_counts}
            best = {v: min(samples[case.name, size, v]) for v in thread_counts}
            cells = []
            for v in parallel_variants:
                median_ratios[v].append(med["serial"] / med[v])
                best_ratios[v].append(best["serial"] / best[v])
                cells.append(f"{med[v] * 1e6:.1f} ({best[v] * 1e6:.1f}) | "
                             f"{median_ratios[v][-1]:.2f} ({best_ratios[v][-1]:.2f})")
            print(f"| {case.name} | 2^{size.bit_length() - 1} | {med['serial'] * 1e6:.1f} "
                  f"({best['serial'] * 1e6:.1f}) | " + " | ".join(cells) + " |")
        summary.append((case, {v: (crossover(sizes, median_ratios[v]),
                                   crossover(sizes, best_ratios[v])) for v in parallel_variants}))
    print()
    print("Crossover: smallest size from which parallel wins at that size and every larger one, "
          "from the medians (from the best samples).")
    print()
    print("| case | cost class | " + " | ".join(f"crossover, {v}" for v in parallel_variants) + " |")
    print("|---|---|" + "---:|" * len(parallel_variants))
    for case, found in summary:
        cells = [f"{power_label(found[v][0])} ({power_label(found[v][1])})"
                 for v in parallel_variants]
        print(f"| {case.name} | {case.cost_class} | " + " | ".join(cells) + " |")
    print_policies(cases, sizes, samples, parallel_variants[-1])
    return 0


def print_policies(cases: list[Case], sizes: list[int],
                   samples: dict[tuple[str, int, str], list[float]], variant: str) -> None:
    """Per cost class, what one threshold for the whole class costs against always taking the
    faster path, from the medians and from the best samples (``variant`` is the parallel path).

    The medians include the rounds in which other processes held the cores, the best samples
    approximate free cores; the balanced choice minimises the mean of the two.
    """
    print()
    print(f"One threshold per cost class ({variant}): geometric mean over the class's cases and "
          "sizes of the slowdown of serial below / parallel from the threshold, against the "
          "faster path at each size; from the medians and from the best samples; worst "
          "slowdown in brackets. Cheap ops: threshold in bytes of the element type, expensive "
          "ops: in elements.")
    print()
    print("| cost class | threshold | slowdown, medians | slowdown, best samples | mean of both |")
    print("|---|---:|---:|---:|---:|")
    for cls in ("cheap", "expensive"):
        members = [c for c in cases if c.cost_class == cls]
        if not members:
            continue
        unit = 1 if cls == "expensive" else 4  # bytes of float32: thresholds line up with sizes
        candidates = [size * unit for size in sizes] + [sizes[-1] * unit * 2]
        rows = []
        for threshold in candidates:
            result = []
            for pick in (statistics.median, min):
                slowdowns = []
                for case in members:
                    limit = case.threshold_elements(threshold)
                    for size in sizes:
                        serial = pick(samples[case.name, size, "serial"])
                        parallel = pick(samples[case.name, size, variant])
                        slowdowns.append((parallel if size >= limit else serial)
                                         / min(serial, parallel))
                result.append((float(np.exp(np.mean(np.log(slowdowns)))), max(slowdowns)))
            rows.append((threshold, result, (result[0][0] + result[1][0]) / 2))
        best = min(rows, key=lambda row: row[2])[0]
        for threshold, ((median_mean, median_worst), (best_mean, best_worst)), both in rows:
            label = f"2^{threshold.bit_length() - 1}" + (" bytes" if cls == "cheap" else "")
            mark = " **balanced**" if threshold == best else ""
            print(f"| {cls} | {label} | {median_mean:.3f} ({median_worst:.2f}) | "
                  f"{best_mean:.3f} ({best_worst:.2f}) | {both:.3f}{mark} |")


if __name__ == "__main__":
    sys.exit(main())
