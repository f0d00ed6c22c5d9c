"""The Gemm kernels' parallel plans side by side, and the cost of an empty compiled region.

Usage: OMP_WAIT_POLICY=... python benchmarks/gemm_regions.py [--shapes 64x256x256 256x768x768]
                                                            [--rounds 15] [--calls 20]

OpenMP reads its wait policy when numba first starts its threads, so the policy is chosen by
the environment of the process (``onnx_light.kernels.compiled`` sets ``PASSIVE`` unless
``OMP_WAIT_POLICY`` is set; ``GOMP_SPINCOUNT`` changes libgomp's spinning); run the script
once per policy to compare them.

1. Per shape (float MatMul, M x K x N, random operands), the kernel at 2 threads inside
   ``BLAS.scope(1)`` as a session runs it, rounds interleaved, median and fastest of the
   rounds (each round ``--calls`` calls): ``serial`` (one BLAS call), ``tiles`` (one tile per
   thread), ``split`` (the pool).
2. An empty 2-thread ``prange`` region of numba called back to back, after 0.5 ms and after
   5 ms of idleness (300 calls each), and the CPU time the process used in the 0.2 s after.
3. Per shape, one thread: numpy's BLAS against a compiled i-k-j product (the loop along a row
   of B vectorised by LLVM, ``fastmath={"contract"}`` for fused multiply-adds, no
   reassociation), in GFLOP/s: why the tiles plan calls BLAS instead of a compiled product.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from _common import load_average
from onnx import TensorProto as T

from onnx_light.kernels import gemm
from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.compiled import compiled
from onnx_light.parallel import BLAS, get_pool

PLANS = {
    "serial": {gemm.MINIMUM_FLOPS: 1 << 62},
    "tiles": {gemm.MODE: "tiles", gemm.MINIMUM_FLOPS: 1},
    "split": {gemm.MODE: "split", gemm.MINIMUM_FLOPS: 1},
}
prange = range  # numba's own in main(), before the region compiles


@compiled(parallel=True)
def empty_region(x):
    """Two iterations, one per thread: the cost of a region and nothing else."""
    for i in prange(2):
        x[i] += 1.0


@compiled(fastmath={"contract"})
def compiled_product(a, b, out):
    """``out = a @ b`` by rows: for each row of A, the rows of B scaled and added."""
    m, k = a.shape
    n = b.shape[1]
    for i in range(m):
        for j in range(n):
            out[i, j] = 0.0
        for p in range(k):
            scale = a[i, p]
            for j in range(n):
                out[i, j] += scale * b[p, j]


def _blas_product(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.matmul(a, b, out=out)


def kernel(values: dict[str, object]) -> gemm.MatMulKernel:
    ctx = NodeContext("bench", "MatMul", "", 13, {}, (T.FLOAT, T.FLOAT), (T.FLOAT,), 2, 1)
    found = gemm.MatMulKernel(ctx).bind(get_pool(2))
    found.configure(values)
    return found


def plans(shape: tuple[int, int, int], rounds: int, calls: int) -> dict[str, list[float]]:
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    kernels = {name: kernel(values) for name, values in PLANS.items()}
    times: dict[str, list[float]] = {name: [] for name in kernels}
    with BLAS.scope(1):
        for found in kernels.values():
            found.run(a, b)
        for _ in range(rounds):
            for name, found in kernels.items():
                started = time.perf_counter()
                for _ in range(calls):
                    found.run(a, b)
                times[name].append((time.perf_counter() - started) / calls)
    return times


def cpu_seconds() -> float:
    return sum(os.times()[:2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["64x256x256", "256x768x768"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args(argv)
    policy = os.environ.get("OMP_WAIT_POLICY") or "PASSIVE (onnx_light's)"
    if "GOMP_SPINCOUNT" in os.environ:
        policy += f", GOMP_SPINCOUNT={os.environ['GOMP_SPINCOUNT']}"
    print(f"OpenMP wait policy: {policy}; load average {load_average()}")
    print("\n| shape | " + " | ".join(PLANS) + " |\n|---" * 1 + "|---" * len(PLANS) + "|")
    for text in args.shapes:
        shape = tuple(int(part) for part in text.split("x"))
        times = plans(shape, args.rounds, args.calls)  # type: ignore[arg-type]
        cells = [f"{np.median(t) * 1e6:.0f} / {min(t) * 1e6:.0f}" for t in times.values()]
        print(f"| {text} | " + " | ".join(cells) + " |")
    from onnx_light.kernels.compiled import load_numba

    globals()["prange"] = load_numba().prange
    x = np.zeros(2)
    region = empty_region.dispatcher
    load_numba().set_num_threads(2)
    region(x)
    print("\n| idle before | median us | 90th percentile us |\n|---|---|---|")
    for gap in (0.0, 0.0005, 0.005):
        taken = []
        for _ in range(300):
            if gap:
                time.sleep(gap)
            started = time.perf_counter()
            region(x)
            taken.append(time.perf_counter() - started)
        print(f"| {gap * 1e3:g} ms | {np.median(taken) * 1e6:.1f} | {np.percentile(taken, 90) * 1e6:.1f} |")
    before = cpu_seconds()
    time.sleep(0.2)
    print(f"\nCPU used in the 0.2 s after the last region: {(cpu_seconds() - before) * 1e3:.0f} ms; "
          f"load average {load_average()}")
    print("\n| shape | numpy BLAS, 1 thread | compiled loop |\n|---|---|---|")
    loop = compiled_product.dispatcher
    for text in args.shapes:
        m, k, n = (int(part) for part in text.split("x"))
        rng = np.random.default_rng(1)
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        out = np.empty((m, n), np.float32)
        loop(a, b, out)
        times: dict[str, list[float]] = {"numpy": [], "loop": []}
        with BLAS.scope(1):
            for _ in range(args.rounds):
                for name, call in (("numpy", _blas_product), ("loop", loop)):
                    started = time.perf_counter()
                    for _ in range(args.calls):
                        call(a, b, out)
                    times[name].append((time.perf_counter() - started) / args.calls)
        flops = 2 * m * k * n / 1e9
        print(f"| {text} | {flops / min(times['numpy']):.1f} | {flops / min(times['loop']):.1f} |")
    print(f"(GFLOP/s of the fastest round; load average {load_average()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
