"""A whole model with the compiled kernels against the numpy kernels and onnxruntime.

Usage: python benchmarks/compiled_end_to_end.py MODEL.onnx [--threads 1 2] [--rounds 7]
[--batch 2] [--sequence 32]

MODEL is any ONNX file, e.g. one ``benchmarks/model_zoo.py --export-only --cache-dir DIR``
wrote (``DIR/bert-*.onnx``). Integer inputs get random token ids below 100, float inputs
ones; a symbolic first dimension is ``--batch`` and the others ``--sequence``. For each thread
count prints the medians of interleaved runs in one process of onnx_light (compiled programs
and chain fusion on, the default), onnx_light with them off (``compiled_elementwise.
numpy_session``) and onnxruntime, with the ratios and the largest output difference.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from _common import interleaved, load_average, onnxruntime_session
from compiled_elementwise import numpy_session

from onnx_light.runtime.session import RuntimeSession


def feeds(model: onnx.ModelProto, batch: int, sequence: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    result = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_value or (batch if axis == 0 else sequence)
                 for axis, d in enumerate(tensor.shape.dim)]
        integer = tensor.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        result[value.name] = (rng.integers(0, 100, shape) if integer else np.ones(shape)).astype(dtype)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--sequence", type=int, default=32)
    args = parser.parse_args()
    model = onnx.load(args.model)
    feed = feeds(model, args.batch, args.sequence)
    print(f"{args.model}: inputs {({k: list(v.shape) for k, v in feed.items()})}")
    print("\n| threads | compiled ms | numpy ms | onnxruntime ms | compiled/ort | numpy/compiled | "
          "fused nodes | max diff | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for threads in args.threads:
        ours, plain = RuntimeSession(model, num_threads=threads), numpy_session(model, threads)
        ort = onnxruntime_session(model, threads)
        difference = float(np.max(np.abs(ours.run(None, feed)[0] - ort.run(None, feed)[0])))
        t = interleaved({"model": {"compiled": lambda s=ours: s.run(None, feed),
                                   "numpy": lambda s=plain: s.run(None, feed),
                                   "onnxruntime": lambda s=ort: s.run(None, feed)}},
                        args.rounds, 0.1)["model"]
        c, n, o = t["compiled"] * 1e3, t["numpy"] * 1e3, t["onnxruntime"] * 1e3
        print(f"| {threads} | {c:.2f} | {n:.2f} | {o:.2f} | {c / o:.2f} | {n / c:.2f} | "
              f"{ours.fused_nodes} | {difference:.2g} | {load_average():.1f} |")


if __name__ == "__main__":
    main()
