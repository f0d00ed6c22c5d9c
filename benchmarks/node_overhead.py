"""Per-node cost of the run loop: chains of tiny nodes, onnx_light against onnxruntime.

Two chains of ``--nodes`` nodes (200 by default), each on a tiny tensor so that the kernels'
arithmetic is negligible next to what a runtime spends per node:

* ``add/relu``: Add(previous, C) and Relu alternating on 1x8 floats;
* ``matmul/add``: MatMul(previous, W) with W 8x8 and Add(previous, B) alternating on 1x8 floats.

Each chain runs in onnx_light (fused: each Relu runs inside its Add, each Add of a constant
becomes a ChannelAffine step; ``fuse=False``, every node a step; and ``fuse=False`` with a
node hook, which walks the plan calling each kernel's ``run`` instead of the bound plan's
prepared steps and buffers) and onnxruntime (same ``intra_op_num_threads``, sequential, no
spinning), all interleaved round by round in this one process. Per node: the chain's median run time
divided by its node count, and the marginal cost ``(t_N - t_1) / (N - 1)`` against a
one-node model, which leaves out the per-run cost (feed checks, the hand-off).

Run: ``python benchmarks/node_overhead.py [--nodes 200] [--threads 1] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnx
from _common import Table, interleaved, load_average, onnxruntime_session
from onnx import TensorProto, helper, numpy_helper

from onnx_light import RuntimeSession
from onnx_light.tuning.processor import execution_descriptor

ELEMENTS = 8


def chain(kind: str, nodes: int) -> onnx.ModelProto:
    """``nodes`` nodes of the ``kind`` chain (see the module docstring) on 1x8 floats."""
    rng = np.random.default_rng(0)
    c = rng.uniform(-0.5, 0.5, (1, ELEMENTS)).astype(np.float32)
    w = rng.uniform(-0.3, 0.3, (ELEMENTS, ELEMENTS)).astype(np.float32)
    initializers = [numpy_helper.from_array(c, "C"), numpy_helper.from_array(w, "W")]
    first, second = ("Add", "Relu") if kind == "add/relu" else ("MatMul", "Add")
    graph_nodes, previous = [], "X"
    for index in range(nodes):
        name = "Y" if index == nodes - 1 else f"t{index}"
        op = first if index % 2 == 0 else second
        inputs = {"Add": [previous, "C"], "Relu": [previous], "MatMul": [previous, "W"]}[op]
        graph_nodes.append(helper.make_node(op, inputs, [name], name=f"{op.lower()}{index}"))
        previous = name
    used = {name for node in graph_nodes for name in node.input}
    graph = helper.make_graph(
        graph_nodes, f"chain{nodes}",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, ELEMENTS])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, ELEMENTS])],
        [t for t in initializers if t.name in used])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sample", type=float, default=0.05, help="seconds per sample")
    args = parser.parse_args(argv)
    x = np.linspace(-1, 1, ELEMENTS, dtype=np.float32).reshape(1, ELEMENTS)
    feeds = {"X": x}
    groups: dict[str, dict[str, object]] = {}
    runtimes = ("onnx_light", "onnx_light fuse=False", "onnx_light fuse=False, walk", "onnxruntime")
    hook = lambda name, op_type: None  # noqa: E731 (a run with a hook walks the plan)
    for kind in ("add/relu", "matmul/add"):
        functions = {}
        for nodes in (1, args.nodes):
            model = chain(kind, nodes)
            sessions = {"onnx_light": RuntimeSession(model, num_threads=args.threads),
                        "onnx_light fuse=False": RuntimeSession(model, num_threads=args.threads,
                                                                fuse=False),
                        "onnxruntime": onnxruntime_session(model, args.threads)}
            expected = sessions["onnxruntime"].run(None, feeds)[0]
            for name, session in sessions.items():
                np.testing.assert_allclose(session.run(None, feeds)[0], expected, rtol=1e-5,
                                           atol=1e-6)
                functions[f"{name}/{nodes}"] = lambda s=session: s.run(None, feeds)
            unfused = sessions["onnx_light fuse=False"]
            functions[f"onnx_light fuse=False, walk/{nodes}"] = \
                lambda s=unfused: s.run(None, feeds, node_hook=hook)
        groups[kind] = functions
    medians = interleaved(groups, args.rounds, args.sample)
    n = args.nodes
    print(f"# Run-loop cost per node, {n}-node chains on 1x{ELEMENTS} float32")
    print()
    cpu = execution_descriptor(args.threads).cpu
    print(f"{cpu.vendor} {cpu.microarchitecture}, {os.cpu_count()} CPUs, {args.threads} thread(s); "
          f"load average {load_average():.2f}; {args.rounds} interleaved rounds")
    print()
    table = Table("Median run time and cost per node (us):",
                  ["chain", "runtime", "1-node run (us)", f"{n}-node run (us)", "per node (us)",
                   "marginal per node (us)", "per node / onnxruntime"],
                  ratios=("per node / onnxruntime",))
    for kind, m in medians.items():
        ort_per_node = m[f"onnxruntime/{n}"] / n
        for runtime in runtimes:
            one, many = m[f"{runtime}/1"], m[f"{runtime}/{n}"]
            table.add(kind, runtime, one * 1e6, many * 1e6, many / n * 1e6,
                      (many - one) / max(n - 1, 1) * 1e6, many / n / ort_per_node)
    print(table.markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
