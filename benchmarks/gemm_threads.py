"""MatMul and Gemm at the shapes real models have, at 1 and 2 threads, against onnxruntime.

Usage: python benchmarks/gemm_threads.py [--threads 1 2] [--rounds 7] [--sample-ms 20]
                                         [--only CLASS,...] [--modes portable,split,...]

Each shape class is a one-node model (MatMul, or Gemm with its bias) whose weights are
initializers with seeded random values, as exported transformers and CNN heads have them:
a transformer's projections and feed-forward products (batch 2 x sequence 32 or 128, hidden
256 or 768, intermediate 4x), its attention products over heads (QK^T, AV), and a CNN's final
Gemm. Per class and thread count one process times, interleaved round by round
(``_common.interleaved``: rotating order, an untimed call before each sample, rounds disturbed
by other processes taken again):

* ``numpy``: ``numpy.matmul`` on the same operands with that many BLAS threads;
* ``onnx_light`` sessions with the portable defaults and with each ``--modes`` setting of
  ``parallel.mode`` and ``parallel.minimum_flops`` published for Gemm and MatMul float
  (``serial`` never splits; ``split`` at 2^25 is the portable default);
* onnxruntime with ``intra_op_num_threads`` equal to ours (no spinning, see ``_common``).

GFLOP/s counts 2*M*N*K per product. ``ratio`` is onnx_light's portable time over
onnxruntime's at the same thread count; ``2t/1t`` each one's time at 2 threads over its time
at 1. After each run the script also reports the CPU time the process's threads used in the
0.2 s that followed (``after`` in ms; threads left spinning show here).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import threadpoolctl
from _common import interleaved, load_average, onnxruntime_session
from onnx import TensorProto, helper, numpy_helper

from onnx_light import kernels
from onnx_light.kernels import gemm
from onnx_light.parallel import BLAS
from onnx_light.runtime.session import RuntimeSession
from onnx_light.tuning.api import set_kernel_tuning_parameters
from onnx_light.tuning.registry import KernelTuningRegistry

BLAS_SPIN_S = 0.15  # OpenBLAS's threads spin this long after a multi-threaded call


@dataclass(frozen=True)
class Shape:
    """One shape class: ``a`` is fed, ``b`` (and Gemm's bias) are initializers."""

    name: str
    op: str
    a: tuple[int, ...]
    b: tuple[int, ...]
    trans_b: bool = False

    @property
    def products(self) -> tuple[int, int, int, int]:
        """(batch, M, K, N)."""
        k = self.a[-1]
        n = self.b[-2] if self.trans_b else self.b[-1]
        batch = math.prod(np.broadcast_shapes(self.a[:-2], self.b[:-2]))
        return batch, self.a[-2], k, n

    @property
    def flops(self) -> int:
        batch, m, k, n = self.products
        return 2 * batch * m * k * n


SHAPES = (
    Shape("qkv 2x32 h256", "MatMul", (2, 32, 256), (256, 256)),
    Shape("ffn up 2x32 h256", "MatMul", (2, 32, 256), (256, 1024)),
    Shape("ffn down 2x32 h256", "MatMul", (2, 32, 1024), (1024, 256)),
    Shape("qkv 2x128 h768", "MatMul", (2, 128, 768), (768, 768)),
    Shape("ffn up 2x128 h768", "MatMul", (2, 128, 768), (768, 3072)),
    Shape("ffn down 2x128 h768", "MatMul", (2, 128, 3072), (3072, 768)),
    Shape("linear 64x768 transB", "Gemm", (64, 768), (768, 768), trans_b=True),
    Shape("QK^T 2x4 heads 32x64", "MatMul", (2, 4, 32, 64), (2, 4, 64, 32)),
    Shape("AV 2x4 heads 32x64", "MatMul", (2, 4, 32, 32), (2, 4, 32, 64)),
    Shape("QK^T 2x12 heads 128x64", "MatMul", (2, 12, 128, 64), (2, 12, 64, 128)),
    Shape("AV 2x12 heads 128x64", "MatMul", (2, 12, 128, 128), (2, 12, 128, 64)),
    Shape("cnn head 1x2048x1000", "Gemm", (1, 2048), (1000, 2048), trans_b=True),
)


def model(shape: Shape, rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray]:
    """The one-node model of ``shape`` and a feed for it."""
    a = rng.standard_normal(shape.a).astype(np.float32)
    _, m, _, n = shape.products
    initializers = [numpy_helper.from_array(rng.standard_normal(shape.b).astype(np.float32), "B")]
    inputs = ["A", "B"]
    attributes = {}
    if shape.op == "Gemm":
        initializers.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "C"))
        inputs.append("C")
        attributes = {"transB": int(shape.trans_b)}
    out_shape = [*np.broadcast_shapes(shape.a[:-2], shape.b[:-2]), m, n]
    graph = helper.make_graph(
        [helper.make_node(shape.op, inputs, ["Y"], **attributes)], shape.name,
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, list(shape.a))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, out_shape)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), a


def registry(values: dict[str, object] | None, threads: int) -> KernelTuningRegistry:
    """The portable registry, with ``values`` published for Gemm and MatMul float here."""
    found = KernelTuningRegistry()
    kernels.register(found)
    for op in ("Gemm", "MatMul") if values else ():
        set_kernel_tuning_parameters(op, TensorProto.FLOAT, values, num_threads=threads,
                                     persist=False, registry=found)
    return found


MODES: dict[str, dict[str, object] | None] = {
    "portable": None,
    "split": {gemm.MODE: "split", gemm.MINIMUM_FLOPS: 1 << 25},
    "split 2^20": {gemm.MODE: "split", gemm.MINIMUM_FLOPS: 1 << 20},
    "blas 2^20": {gemm.MODE: "blas", gemm.MINIMUM_FLOPS: 1 << 20},
    "tiles 2^18": {gemm.MODE: "tiles", gemm.MINIMUM_FLOPS: 1 << 18},
    "tiles 2^20": {gemm.MODE: "tiles", gemm.MINIMUM_FLOPS: 1 << 20},
    "serial": {gemm.MINIMUM_FLOPS: 1 << 62},
}


def thread_seconds() -> float:
    """CPU seconds used so far by every thread of this process."""
    return sum(os.times()[:2])


def after_run(fn: Callable[[], object]) -> float:
    """CPU milliseconds the process used in the 0.2 s after one call of ``fn``."""
    fn()
    before = thread_seconds()
    time.sleep(0.2)
    return (thread_seconds() - before) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sample-ms", type=float, default=20.0)
    parser.add_argument("--only", default=None, help="comma-separated substrings of class names")
    parser.add_argument("--modes", default="serial,tiles 2^20",
                        help=f"comma-separated, of {sorted(MODES)}")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m and m != "portable"]
    shapes = [s for s in SHAPES if args.only is None
              or any(part in s.name for part in args.only.split(","))]
    blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    print("BLAS:", [(i["internal_api"], i["version"], i["threading_layer"], i["architecture"])
                    for i in blas])
    print(f"load average before: {load_average()}; {args.rounds} rounds, "
          f"{args.sample_ms:g} ms samples; median us per run (GFLOP/s)")
    rng = np.random.default_rng(0)
    results: dict[tuple[str, int], dict[str, float]] = {}
    after: dict[tuple[str, int], dict[str, float]] = {}
    for shape in shapes:
        onnx_model, a = model(shape, rng)
        b = numpy_helper.to_array(onnx_model.graph.initializer[0])
        b = b.T if shape.trans_b else b
        feeds = {"A": a}
        groups = {}
        for threads in args.threads:
            ours = {name: RuntimeSession(onnx_model, num_threads=threads,
                                         registry=registry(MODES[name], threads))
                    for name in ("portable", *modes)}
            peer = onnxruntime_session(onnx_model, threads)

            def numpy_call(a=a, b=b, threads=threads) -> None:
                with BLAS.scope(threads):
                    np.matmul(a, b)

            group = {"numpy": numpy_call, "onnxruntime": lambda p=peer, f=feeds: p.run(None, f)}
            for name, session in ours.items():
                group[name] = lambda s=session, f=feeds: s.run(None, f)
            groups[shape.name, threads] = group
            after[shape.name, threads] = {name: after_run(fn) for name, fn in group.items()}
        results.update(interleaved(groups, args.rounds, args.sample_ms / 1e3,
                                   settle={"numpy": BLAS_SPIN_S}))
    names = ["numpy", "portable", *modes, "onnxruntime"]
    print()
    print("| class | threads | " + " | ".join(names) + " | ratio | CPU ms after (portable/ort) |")
    print("|---" * (len(names) + 4) + "|")
    for shape in shapes:
        for threads in args.threads:
            row = results[shape.name, threads]
            cells = [f"{row[n] * 1e6:.0f} ({shape.flops / row[n] / 1e9:.0f})" for n in names]
            spin = after[shape.name, threads]
            print(f"| {shape.name} | {threads} | " + " | ".join(cells)
                  + f" | {row['portable'] / row['onnxruntime']:.2f} | "
                  f"{spin['portable']:.0f}/{spin['onnxruntime']:.0f} |")
    if len(args.threads) == 2:
        one, two = args.threads
        print()
        print(f"| class | onnx_light {two}t/{one}t | onnxruntime {two}t/{one}t | numpy {two}t/{one}t |")
        print("|---|---|---|---|")
        for shape in shapes:
            r1, r2 = results[shape.name, one], results[shape.name, two]
            print(f"| {shape.name} | {r2['portable'] / r1['portable']:.2f} | "
                  f"{r2['onnxruntime'] / r1['onnxruntime']:.2f} | {r2['numpy'] / r1['numpy']:.2f} |")
    print(f"\nload average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
