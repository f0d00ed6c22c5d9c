"""A model's session with its RotaryEmbedding and FusedAttention steps prepared (the
compiled rotation, the attention's decisions taken once), one more kind at a time, against a
session where both run their kernels' ``run``, interleaved in one process, at one thread, in
thread CPU time per run (robust under load); the outputs are checked bit for bit.

    PYTHONPATH=. python benchmarks/prepared_steps.py MODEL.onnx [--rounds 21]

(the zoo's LLaMA export: ``~/.cache/onnx_light/model-zoo/llama-*.onnx``, from
``benchmarks/model_zoo.py --models llama``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnx

from onnx_light.kernels.attention import RotaryEmbedding
from onnx_light.kernels.fused_attention import FusedAttention
from onnx_light.runtime import RuntimeSession

KINDS = (RotaryEmbedding, FusedAttention)
_NUMPY = {onnx.TensorProto.INT64: np.int64, onnx.TensorProto.FLOAT: np.float32}


def session(model: bytes, kernels: tuple[type, ...]) -> RuntimeSession:
    """A one-thread session in which ``kernels`` are not prepared."""
    saved = {k: k.prepare for k in kernels}
    for kernel in kernels:
        kernel.prepare = lambda self, inputs: None
    try:
        return RuntimeSession(model, num_threads=1)
    finally:
        for kernel, prepare in saved.items():
            kernel.prepare = prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    proto = onnx.load(args.model)
    rng = np.random.default_rng(0)
    feeds = {}
    for value in proto.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_value or 1 for d in tensor.shape.dim]
        feeds[value.name] = rng.integers(0, 100, shape).astype(_NUMPY[tensor.elem_type])
    model = proto.SerializeToString()
    sessions = {"none prepared": session(model, KINDS)}
    for count in range(1, len(KINDS) + 1):
        kinds = " + ".join(kind.__name__ for kind in KINDS[:count])
        sessions[f"{kinds} prepared"] = session(model, KINDS[count:])
    outputs = {s.run(None, feeds)[0].tobytes() for s in sessions.values()}
    print(f"load average (1 min) at start {os.getloadavg()[0]:.2f}; "
          f"outputs bit-identical: {len(outputs) == 1}\n")
    times: dict[str, list[float]] = {name: [] for name in sessions}
    names = list(sessions)
    for index in range(args.rounds):
        for name in names[index % len(names):] + names[:index % len(names)]:
            run = sessions[name].run
            run(None, feeds)
            start = time.thread_time()
            for _ in range(args.runs):
                run(None, feeds)
            times[name].append((time.thread_time() - start) / args.runs * 1e3)
    base = statistics.median(times[names[0]])
    print("| session | ms per run (thread CPU) | against none |\n|---|---:|---:|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {statistics.median(values) / base:.3f} |")
    print(f"\nload average (1 min) at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
