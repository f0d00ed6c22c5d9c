"""Serial versus parallel elementwise kernels: where does the parallel path start to pay?

Usage: python benchmarks/elementwise_crossover.py [--repeats N] [--min-exp 10] [--max-exp 22]
                                                   [--sample-ms 0.5] [--cases NAME ...]

For each case (Abs, Add with equal shapes and with a scalar, Not, Relu, Mul, Exp, Sigmoid on
float32 and, where ONNX allows it, int32) and each size 2**min_exp .. 2**max_exp, times
``kernel.run`` (output allocation included, as in a session) on three kernels of the same
node: forced serial (``parallel.minimum_elements`` = 2**62), forced parallel on a 2-thread
pool, and forced parallel on an ``os.cpu_count()``-thread pool. The three are measured
interleaved, round by round (the order rotating every round), so machine noise hits them
alike; the pools are rebuilt every round so that many placements of the worker threads are
sampled. Each sample times enough calls to last ``--sample-ms``; the table shows medians.

The crossover of a case is the smallest size from which the parallel path wins (median
ratio serial / parallel > 1) at that size and at every larger size measured.
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

from onnx_light.kernels.base import NodeContext, numpy_dtype
from onnx_light.kernels.elementwise import KERNELS, MINIMUM_ELEMENTS, OPS
from onnx_light.parallel import ThreadPool
from onnx_light.tuning.keys import element_type_name

SERIAL = {MINIMUM_ELEMENTS: 2**62}
PARALLEL = {MINIMUM_ELEMENTS: 1}
COST = {op.op_type: op.cost for op in OPS}


@dataclass(frozen=True)
class Case:
    """One benchmarked node: op, element type and how its inputs are shaped."""

    op: str
    element_type: int
    layout: str  # "unary", "equal" (two inputs of the same shape) or "scalar" (second is 0-d)

    @property
    def name(self) -> str:
        return f"{self.op}/{element_type_name(self.element_type)}/{self.layout}"

    def inputs(self, size: int) -> list[np.ndarray]:
        rng = np.random.default_rng(size)
        dtype = numpy_dtype(self.element_type)

        def make(shape: tuple[int, ...]) -> np.ndarray:
            if self.element_type == T.BOOL:
                return rng.random(shape) < 0.5
            if dtype.kind in "iu":
                return rng.integers(-1000, 1000, size=shape).astype(dtype)
            return rng.standard_normal(shape).astype(dtype)

        if self.layout == "unary":
            return [make((size,))]
        return [make((size,)), make((size,) if self.layout == "equal" else ())]


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


def build(case: Case) -> object:
    versions = KERNELS[case.op]
    count = 1 if case.layout == "unary" else 2
    ctx = NodeContext(name=case.name, op_type=case.op, domain="", opset=max(versions),
                      input_types=(case.element_type,) * count, num_inputs=count)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21, help="interleaved rounds")
    parser.add_argument("--min-exp", type=int, default=10)
    parser.add_argument("--max-exp", type=int, default=22)
    parser.add_argument("--sample-ms", type=float, default=0.5,
                        help="minimum duration of one timed sample")
    parser.add_argument("--cases", nargs="*", help="only cases whose name contains one of these")
    args = parser.parse_args(argv)

    cpus = os.cpu_count() or 1
    thread_counts = {"serial": 1, "2 blocks": 2, f"cpu_count={cpus} blocks": cpus}
    sizes = [1 << e for e in range(args.min_exp, args.max_exp + 1)]
    cases = [c for c in CASES if not args.cases or any(s in c.name for s in args.cases)]
    started = time.perf_counter()

    # results[case][size][variant] -> seconds per call, one entry per round
    results: dict[str, dict[int, dict[str, list[float]]]] = {}
    for case in cases:
        kernels = {variant: build(case) for variant in thread_counts}
        per_size = results.setdefault(case.name, {})
        for size in sizes:
            inputs = case.inputs(size)
            # Calls per sample, from the serial time of a call.
            with ThreadPool(1) as pool:
                kernels["serial"].configure(SERIAL, pool)
                once = time_calls(lambda k=kernels["serial"], xs=inputs: k.run(*xs), 3)
            count = max(1, int(args.sample_ms * 1e-3 / max(once, 1e-7)))
            samples: dict[str, list[float]] = {v: [] for v in thread_counts}
            for round_index in range(args.repeats):
                pools = {v: ThreadPool(n) for v, n in thread_counts.items()}
                for variant, kernel in kernels.items():
                    kernel.configure(SERIAL if variant == "serial" else PARALLEL, pools[variant])
                order = list(thread_counts)
                shift = round_index % len(order)
                order = order[shift:] + order[:shift]
                for variant in order:
                    kernel = kernels[variant]
                    kernel.run(*inputs)  # warm: threads started, pages touched
                    samples[variant].append(time_calls(lambda k=kernel, xs=inputs: k.run(*xs), count))
                for pool in pools.values():
                    pool.close()
            serial_out = kernels["serial"].run(*inputs)[0]
            for variant in thread_counts:
                if variant == "serial":
                    continue
                with ThreadPool(thread_counts[variant]) as pool:
                    kernels[variant].configure(PARALLEL, pool)
                    parallel_out = kernels[variant].run(*inputs)[0]
                if not np.array_equal(serial_out.view(np.uint8), parallel_out.view(np.uint8)):
                    raise AssertionError(f"{case.name} {size}: {variant} differs from serial")
            per_size[size] = samples
        print(f"measured {case.name} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)

    parallel_variants = [v for v in thread_counts if v != "serial"]
    print(f"{datetime.date.today().isoformat()}: python {platform.python_version()}, "
          f"numpy {np.__version__}, {platform.machine()}, os.cpu_count()={cpus}, "
          f"repeats={args.repeats}, sample >= {args.sample_ms} ms, "
          f"{time.perf_counter() - started:.0f} s")
    print()
    print("Median time of one `kernel.run` (us) and serial / parallel (> 1: parallel wins).")
    print()
    header = " | ".join(f"{v} (us) | serial / {v}" for v in parallel_variants)
    print(f"| case | elements | serial (us) | {header} |")
    print("|---|---:|---:|" + "---:|---:|" * len(parallel_variants))
    summary = []
    for case in cases:
        per_size = results[case.name]
        ratios: dict[str, list[float]] = {v: [] for v in parallel_variants}
        for size in sizes:
            medians = {v: statistics.median(per_size[size][v]) for v in thread_counts}
            cells = []
            for v in parallel_variants:
                ratio = medians["serial"] / medians[v]
                ratios[v].append(ratio)
                cells.append(f"{medians[v] * 1e6:.1f} | {ratio:.2f}")
            print(f"| {case.name} | 2^{size.bit_length() - 1} | {medians['serial'] * 1e6:.1f} | "
                  + " | ".join(cells) + " |")
        summary.append((case, {v: crossover(sizes, ratios[v]) for v in parallel_variants}))
    print()
    print("Crossover: smallest size from which parallel wins at that size and all larger ones.")
    print()
    print("| case | cost class | " + " | ".join(f"crossover, {v}" for v in parallel_variants) + " |")
    print("|---|---|" + "---:|" * len(parallel_variants))
    for case, found in summary:
        cells = [("none" if found[v] is None else f"2^{found[v].bit_length() - 1}")
                 for v in parallel_variants]
        print(f"| {case.name} | {COST[case.op]} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
