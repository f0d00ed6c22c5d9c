"""Fused scaled dot-product attention against the unfused graph and onnxruntime.

Usage: python benchmarks/attention_fusion.py [--rounds N] [--threads 1 2] [--cases bert vit ...]
       python benchmarks/attention_fusion.py --softmax [--rounds N] [--threads 1 2]

Each case is the attention exporters write for one layer (Transposes of Q, K and V, MatMul,
Mul by 1/sqrt(size), Add of a (batch, 1, 1, keys) mask where the model has one, Softmax,
MatMul) at a zoo model's shape. The first table gives the median time per run of an
onnx_light session (the pattern fused into one FusedAttention step), of one with fusion off,
and of onnxruntime with the same intra-op thread count, interleaved in one process, with the
largest difference between onnx_light's output and onnxruntime's. The second table times the
FusedAttention kernel alone, with BLAS's products (``attention.minimum_flops`` out of reach)
against its compiled tasks (the threshold at 1: one compiled call at one thread, one region
of numba's threads at more), to place that threshold.

``--softmax`` times the softmax alone on the scores of :data:`SOFTMAX_CASES`: the compiled
rows (``SoftmaxRows``, serial) against a one-node onnxruntime Softmax session, interleaved,
in ns per element.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnx
from _common import interleaved, load_average, onnxruntime_session
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.compiled_softmax import SoftmaxRows
from onnx_light.kernels.fused_attention import FusedAttention
from onnx_light.kernels.reductions import ATTENTION_MINIMUM_FLOPS
from onnx_light.parallel import get_pool
from onnx_light.runtime.session import RuntimeSession

F = TensorProto.FLOAT
# name: (batch, heads, tokens, head size, masked)
CASES = {
    "bert": (2, 4, 32, 64, True),
    "gpt2": (1, 4, 64, 64, True),
    "vit": (1, 4, 197, 64, False),
    "wav2vec2": (1, 4, 49, 64, False),
    "bert-base 128": (2, 12, 128, 64, True),
}

# name: scores shape (batch, heads, queries, keys)
SOFTMAX_CASES = {
    "vit (1 x 4 heads, 197)": (1, 4, 197, 197),
    "vit-base (1 x 12, 197)": (1, 12, 197, 197),
    "bert (2 x 4, 32)": (2, 4, 32, 32),
    "bert-base 128 (2 x 12, 128)": (2, 12, 128, 128),
}


def model(batch: int, heads: int, tokens: int, size: int, masked: bool) -> onnx.ModelProto:
    shape = [batch, tokens, heads, size]
    inputs = [helper.make_tensor_value_info(n, F, shape) for n in "qkv"]
    nodes = [helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["qt", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "c"], ["scaled"])]
    scores = "scaled"
    if masked:
        inputs.append(helper.make_tensor_value_info("mask", F, [batch, 1, 1, tokens]))
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"]))
        scores = "masked"
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["y"])]
    scale = numpy_helper.from_array(np.array(size ** -0.5, np.float32), "c")
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("y", F, None)],
                              initializer=[scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds(batch: int, heads: int, tokens: int, size: int, masked: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal((batch, tokens, heads, size)).astype(np.float32) for n in "qkv"}
    if masked:
        mask = np.zeros((batch, 1, 1, tokens), np.float32)
        mask[..., tokens * 3 // 4:] = np.finfo(np.float32).min
        values["mask"] = mask
    return values


def softmax_table(rounds: int, threads: int) -> None:
    """The compiled softmax rows against onnxruntime's Softmax node, one table."""
    groups = {}
    for name, shape in SOFTMAX_CASES.items():
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 4
        out = np.empty_like(x)
        graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
                                  [helper.make_tensor_value_info("x", F, shape)],
                                  [helper.make_tensor_value_info("y", F, shape)])
        ort = onnxruntime_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                                  threads)
        rows = SoftmaxRows(1, 1 << 62)
        rows.compile()
        groups[name] = {"compiled": lambda r=rows, x=x, o=out: r(x, o),
                        "onnxruntime": lambda s=ort, x=x: s.run(None, {"x": x})}
    medians = interleaved(groups, rounds, 0.02)
    print(f"\nSoftmax rows, onnxruntime at {threads} thread(s), load average {load_average()}\n")
    print("| scores | compiled us | ns/element | onnxruntime us | compiled/ort |")
    print("|---|---|---|---|---|")
    for name, t in medians.items():
        c, o = t["compiled"] * 1e6, t["onnxruntime"] * 1e6
        elements = int(np.prod(SOFTMAX_CASES[name]))
        print(f"| {name} | {c:.1f} | {c * 1e3 / elements:.2f} | {o:.1f} | {c / o:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--softmax", action="store_true", help="time the softmax rows alone")
    args = parser.parse_args()
    print(f"float32, load average {load_average()}, cpus {os.cpu_count()}")
    if args.softmax:
        for threads in args.threads:
            softmax_table(args.rounds, threads)
        return
    for threads in args.threads:
        groups, differences, kernels = {}, {}, {}
        for name in args.cases:
            m, feed = model(*CASES[name]), feeds(*CASES[name])
            ours = RuntimeSession(m, num_threads=threads)
            plain = RuntimeSession(m, num_threads=threads, fuse=False)
            ort = onnxruntime_session(m, threads)
            differences[name] = float(np.max(np.abs(ours.run(None, feed)[0] - ort.run(None, feed)[0])))
            groups[name] = {"fused": lambda s=ours, f=feed: s.run(None, f),
                            "unfused": lambda s=plain, f=feed: s.run(None, f),
                            "onnxruntime": lambda s=ort, f=feed: s.run(None, f)}
            (step,) = [s for s in ours._plan if isinstance(getattr(s.run, "__self__", None), FusedAttention)]
            kernels[name] = (step.run.__self__, [feed[n] for n in ("q", "k", "v", "mask") if n in feed])
        medians = interleaved(groups, args.rounds, 0.02)
        print(f"\n{threads} thread(s), load average {load_average()}\n")
        print("| case | fused us | unfused us | onnxruntime us | fused/ort | unfused/fused | max diff |")
        print("|---|---|---|---|---|---|---|")
        for name, t in medians.items():
            f, u, o = t["fused"] * 1e6, t["unfused"] * 1e6, t["onnxruntime"] * 1e6
            print(f"| {name} | {f:.1f} | {u:.1f} | {o:.1f} | {f / o:.2f} | {u / f:.2f} | "
                  f"{differences[name]:.2g} |")
        groups = {}
        for name, (kernel, inputs) in kernels.items():
            blas, tasks = (kernel.variant(softmax=kernel.softmax.variant()).bind(get_pool(threads))
                           for _ in range(2))
            blas.configure({ATTENTION_MINIMUM_FLOPS: 1 << 62})
            tasks.configure({ATTENTION_MINIMUM_FLOPS: 1})
            groups[name] = {"blas": (lambda k=blas, x=inputs: k.run(*x), True),
                            "tasks": (lambda k=tasks, x=inputs: k.run(*x), True)}
        medians = interleaved(groups, args.rounds, 0.02)
        print(f"\nFusedAttention kernel, {threads} thread(s), load average {load_average()}\n")
        print("| case | multiply-adds | BLAS products us | compiled tasks us | tasks/BLAS |")
        print("|---|---|---|---|---|")
        for name, t in medians.items():
            batch, heads, tokens, size, _ = CASES[name]
            flops = batch * heads * tokens * tokens * 2 * size
            b, c = t["blas"] * 1e6, t["tasks"] * 1e6
            print(f"| {name} | {flops / 1e6:.1f} M | {b:.1f} | {c:.1f} | {c / b:.2f} |")


if __name__ == "__main__":
    main()
