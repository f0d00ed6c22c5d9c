"""The compiled in-place activations (fused epilogues) per value, at the block sizes of tiles.

Usage: python benchmarks/activation_epilogues.py [--rounds N] [--values V] [--against FILE]

For each activation code of ``compiled_activations`` and each block (a run of n contiguous
values, as a depthwise or stem convolution finishes a plane, or a 256-column tile of a wider
output), prints the median thread CPU time per value of ``_activate_rows`` applying it in
place over about ``--values`` values of such blocks (in L2, as a producer leaves them; one
thread; the call's own cost, about a microsecond, is included). The data is refreshed
(untimed) before every call. ``--against`` also times another copy of
``compiled_activations.py`` (``git show main:onnx_light/kernels/compiled_activations.py``),
interleaved with this one round after round, and prints the ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
from _common import load_average

from onnx_light.kernels import compiled_activations

#: (name, values per block, stride between blocks in values).
BLOCKS = ((49, 49, "7x7 plane"), (196, 196, "14x14 plane"), (784, 784, "28x28 plane"),
          (3136, 3136, "56x56 plane"), (12544, 12544, "112x112 plane"),
          (256, 784, "256-column tile, rows 784 apart"))
CODES = {"Sigmoid": (1.0, 0.0), "Swish": (1.0, 0.0), "HardSigmoid": (0.2, 0.5),
         "HardSwish": (float(np.float32(1 / 6)), 0.5)}


def _load_copy(path: Path) -> ModuleType:
    """``compiled_activations.py`` at ``path`` imported as a sibling module of ours (its
    relative imports resolved in ``onnx_light.kernels``)."""
    name = "onnx_light.kernels._compiled_activations_against"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _seconds_per_value(run, fresh: np.ndarray, buffer: np.ndarray, calls: int, values: int) -> float:
    """Thread CPU seconds per value of ``calls`` calls of ``run``, ``buffer`` refreshed before each."""
    total = 0
    for _ in range(calls):
        np.copyto(buffer, fresh)
        start = time.thread_time_ns()
        run()
        total += time.thread_time_ns() - start
    return total * 1e-9 / (calls * values)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20, help="timed calls per sample")
    parser.add_argument("--values", type=int, default=25_088, help="values per call (about)")
    parser.add_argument("--against", type=Path, help="another compiled_activations.py to time too")
    args = parser.parse_args(argv)
    modules = {"this": compiled_activations}
    if args.against is not None:
        modules["against"] = _load_copy(args.against)
    rng = np.random.default_rng(0)
    cases = []
    for n, stride, label in BLOCKS:
        rows = max(1, args.values // n)
        fresh = (rng.standard_normal(rows * stride) * 4).astype(np.float32)
        buffer = fresh.copy()
        for op, (alpha, beta) in CODES.items():
            code = compiled_activations.ACTIVATIONS[op]
            runs = {}
            for name, module in modules.items():
                rows_kernel = module._activate_rows.dispatcher
                runs[name] = (lambda k=rows_kernel, x=buffer, r=rows, s=stride, n=n, c=code, a=alpha,
                              b=beta: k(x, (1, r, n), (0, s), c, a, b))
                runs[name]()  # compile (or load from the cache)
            cases.append((op, label, n, rows * n, fresh, buffer, runs))
    load_start = load_average()
    samples: dict[tuple[str, str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for op, label, _, values, fresh, buffer, runs in cases:
            names = list(runs)
            names = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in names:
                samples.setdefault((op, label, name), []).append(
                    _seconds_per_value(runs[name], fresh, buffer, args.calls, values))
    load_end = load_average()
    print(f"load average {load_start} -> {load_end}; {args.rounds} rounds x {args.calls} calls, "
          f"thread CPU time, 1 thread; ns per value")
    header = "| activation | block | values per call | " + " | ".join(modules)
    header += " | this / against |" if len(modules) > 1 else " |"
    print(header)
    print("|" + " --- |" * (header.count("|") - 1))
    for op, label, _, values, *_ in cases:
        medians = {name: statistics.median(samples[op, label, name]) * 1e9 for name in modules}
        cells = " | ".join(f"{medians[name]:.3f}" for name in modules)
        ratio = f" | {medians['this'] / medians['against']:.2f} |" if len(modules) > 1 else " |"
        print(f"| {op} | {label} | {values} | {cells}{ratio}")


if __name__ == "__main__":
    main()
