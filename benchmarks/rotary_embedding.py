"""RotaryEmbedding on float32 heads: numpy's ``run`` against the compiled pass ``prepare``
gives (:mod:`onnx_light.kernels.compiled_rotary`), interleaved in one process, thread CPU time
per call (robust under load), for the LLaMA zoo model's query and key shapes.

    PYTHONPATH=. python benchmarks/rotary_embedding.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from onnx import TensorProto

from onnx_light.kernels.attention import RotaryEmbedding
from onnx_light.kernels.base import NodeContext

SHAPES = ((1, 8, 64, 32), (1, 2, 64, 32), (2, 4, 32, 64))


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Thread CPU seconds per call over ``calls`` calls."""
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls


def compare(shape: tuple[int, ...], rounds: int, calls: int) -> tuple[float, float]:
    """Median thread CPU microseconds per call of numpy's run and of the compiled pass."""
    f = TensorProto.FLOAT
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    angles = rng.random((shape[0], shape[2], shape[3] // 2)) * 6
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    kernel = RotaryEmbedding(NodeContext("rotary", "RotaryEmbedding", "", 23, {}, (f,) * 3, (f,), 3, 1))
    prepared = kernel.prepare([(a.shape, a.dtype) for a in (x, cos, sin)])
    out = np.empty(shape, np.float32)
    functions = {"run": lambda: kernel.run(x, cos, sin),
                 "compiled": lambda: prepared.compute(x, cos, sin, out=out)}
    times: dict[str, list[float]] = {name: [] for name in functions}
    for index in range(rounds):
        for name in list(functions)[index % 2:] + list(functions)[:index % 2]:
            times[name].append(per_call(functions[name], calls))
    run, compiled = (statistics.median(times[n]) * 1e6 for n in ("run", "compiled"))
    return run, compiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    print(f"load average (1 min) at start {os.getloadavg()[0]:.2f}\n")
    print("| X shape | numpy run us | compiled us | ratio |\n|---|---:|---:|---:|")
    for shape in SHAPES:
        run, compiled = compare(shape, args.rounds, args.calls)
        print(f"| {shape} | {run:.1f} | {compiled:.1f} | {compiled / run:.2f} |")
    print(f"\nload average (1 min) at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
