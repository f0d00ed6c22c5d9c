"""One-node MatMul sessions with constant float32 weights: onnx_light with the weights packed
(``kernels/packed_gemm.py``), onnx_light with packing off (BLAS and the pool's split plans) and
onnxruntime (``_common.onnxruntime_session``: its pool does not spin), at one and two threads,
sampled in interleaved rounds; medians in microseconds.

    PYTHONPATH=. python benchmarks/packed_products.py [--rounds 7] [--threads 1 2] [--shapes 197x768x768]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from unittest import mock

import numpy as np
import onnx
from _common import onnxruntime_session
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels import packed_gemm
from onnx_light.runtime import RuntimeSession

SHAPES = [(64, 256, 1024), (197, 256, 1024), (197, 1024, 256), (197, 768, 3072), (197, 3072, 768),
          (3136, 256, 256), (4096, 1024, 1024)]


def _model(m: int, k: int, n: int, rng: np.random.Generator) -> bytes:
    w = rng.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def _time(fn: Callable[[], object], budget: float = 0.05) -> float:
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget:
            return elapsed / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shapes", nargs="+", metavar="MxKxN", help="default: SHAPES")
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes] if args.shapes else SHAPES
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()}")
    print("| M x K x N | threads | packed (us) | BLAS (us) | onnxruntime (us) | packed / ort | BLAS / ort |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m, k, n in shapes:
        model = _model(m, k, n, rng)
        a = rng.standard_normal((m, k)).astype(np.float32)
        for threads in args.threads:
            packed = RuntimeSession(model, num_threads=threads)
            with mock.patch.object(packed_gemm, "available", lambda: False):
                blas = RuntimeSession(model, num_threads=threads)
            ort = onnxruntime_session(onnx.load_from_string(model), threads)
            assert packed._steps[0][0]._packed is not None and blas._steps[0][0]._packed is None
            feeds = {"a": a}
            runs = {"packed": lambda s=packed, f=feeds: s.run(None, f),
                    "blas": lambda s=blas, f=feeds: s.run(None, f),
                    "ort": lambda s=ort, f=feeds: s.run(None, f)}
            samples: dict[str, list[float]] = {name: [] for name in runs}
            for r in range(args.rounds):
                names = list(runs)
                for name in names[r % 3:] + names[:r % 3]:
                    samples[name].append(_time(runs[name]))
            med = {name: statistics.median(v) for name, v in samples.items()}
            print(f"| {m} x {k} x {n} | {threads} | {med['packed']:.0f} | {med['blas']:.0f} | "
                  f"{med['ort']:.0f} | {med['packed'] / med['ort']:.2f} | {med['blas'] / med['ort']:.2f} |",
                  flush=True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
