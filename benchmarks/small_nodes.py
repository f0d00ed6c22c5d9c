"""The time of a small node: onnx_light against onnxruntime, per node of a chain of tiny ones.

Each case is a chain of ``--nodes`` copies of one small block (a 1x1 convolution with its
Relu, a 3x3 depthwise convolution, a squeeze-and-excitation block with the 1x1 convolution
its gate scales: MobileNetV3's), whose arithmetic is a few hundred multiply-adds, and the same
chain of one block; the time per block is the difference of the two runs' times divided by
the blocks added: what a session spends on one more such block, mostly the time around the
compiled calls. One thread; both runtimes timed interleaved in one process
(``_common.interleaved``: wall time of whole runs, under the bench lock), or with ``--cpu``
in the calling thread's CPU time (``conv_pointwise_packed.cpu_samples``: both runtimes run on
the calling thread at one thread; far less disturbed by the other programs of a shared
machine than wall time).

Run: ``python benchmarks/small_nodes.py [--nodes 17] [--rounds 15] [--cpu]``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import _common
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx_light.runtime.session import RuntimeSession

F = TensorProto.FLOAT


def _tensor(rng: np.random.Generator, name: str, shape: Sequence[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(rng.uniform(-0.5, 0.5, shape).astype(np.float32), name)


def _pointwise(i: int, x: str, y: str, rng: np.random.Generator, channels: int) -> tuple[list, list]:
    nodes = [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"]),
             helper.make_node("Relu", [f"c{i}"], [y])]
    return nodes, [_tensor(rng, f"w{i}", [channels, channels, 1, 1]), _tensor(rng, f"b{i}", [channels])]


def _depthwise(i: int, x: str, y: str, rng: np.random.Generator, channels: int) -> tuple[list, list]:
    nodes = [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [y], group=channels, pads=[1] * 4)]
    return nodes, [_tensor(rng, f"w{i}", [channels, 1, 3, 3]), _tensor(rng, f"b{i}", [channels])]


def _squeeze_excite(i: int, x: str, y: str, rng: np.random.Generator, channels: int) -> tuple[list, list]:
    reduced = max(1, channels // 4)
    nodes = [helper.make_node("GlobalAveragePool", [x], [f"p{i}"]),
             helper.make_node("Conv", [f"p{i}", f"w1_{i}", f"b1_{i}"], [f"f{i}"]),
             helper.make_node("Relu", [f"f{i}"], [f"a{i}"]),
             helper.make_node("Conv", [f"a{i}", f"w2_{i}", f"b2_{i}"], [f"g{i}"]),
             helper.make_node("HardSigmoid", [f"g{i}"], [f"s{i}"]),
             helper.make_node("Mul", [x, f"s{i}"], [f"m{i}"]),
             helper.make_node("Conv", [f"m{i}", f"w3_{i}"], [y])]
    return nodes, [_tensor(rng, f"w1_{i}", [reduced, channels, 1, 1]), _tensor(rng, f"b1_{i}", [reduced]),
                   _tensor(rng, f"w2_{i}", [channels, reduced, 1, 1]), _tensor(rng, f"b2_{i}", [channels]),
                   _tensor(rng, f"w3_{i}", [channels, channels, 1, 1])]


CASES: dict[str, tuple[Callable[..., tuple[list, list]], tuple[int, ...], str]] = {
    "pointwise 8 -> 8, 4x4, + Relu": (_pointwise, (1, 8, 4, 4), "Conv + Relu"),
    "depthwise 3x3, 8 x 8x8": (_depthwise, (1, 8, 8, 8), "Conv"),
    "squeeze-and-excitation 16, 7x7": (_squeeze_excite, (1, 16, 7, 7),
                                       "GlobalAveragePool, Conv + Relu, Conv, HardSigmoid, Mul, Conv"),
}


def chain(block: Callable[..., tuple[list, list]], shape: tuple[int, ...], count: int) -> onnx.ModelProto:
    """``count`` blocks one after the other from input x to output y."""
    rng = np.random.default_rng(0)
    nodes, initializers = [], []
    for i in range(count):
        made, weights = block(i, "x" if i == 0 else f"y{i - 1}", "y" if i == count - 1 else f"y{i}", rng,
                              shape[1])
        nodes += made
        initializers += weights
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F, list(shape))],
                              [helper.make_tensor_value_info("y", F, list(shape))], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def measure(name: str, count: int, rounds: int, cpu: bool = False) -> list:
    block, shape, ops = CASES[name]
    feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    functions = {}
    steps = {}
    for blocks in (1, count):
        model = chain(block, shape, blocks)
        ours = RuntimeSession(model.SerializeToString(), num_threads=1)
        theirs = _common.onnxruntime_session(model, 1)
        steps[blocks] = len(ours._steps)
        functions[f"ours {blocks}"] = _common.looped(lambda s=ours: s.run(None, feeds), 0.02)
        functions[f"ort {blocks}"] = _common.looped(lambda s=theirs: s.run(None, feeds), 0.02)
    loops = {key: loop for key, (loop, _) in functions.items()}
    if cpu:
        from conv_pointwise_packed import cpu_samples

        samples = cpu_samples(list(loops.values()), rounds)
        medians = {key: float(np.median(s)) for key, s in zip(loops, samples, strict=True)}
    else:
        medians = _common.interleaved({name: loops}, rounds, 0.02)[name]
    per = {key: medians[key] / functions[key][1] for key in loops}
    ours_us = (per[f"ours {count}"] - per["ours 1"]) / (count - 1) * 1e6
    theirs_us = (per[f"ort {count}"] - per["ort 1"]) / (count - 1) * 1e6
    step_count = (steps[count] - steps[1]) / (count - 1)
    return [name, ops, f"{step_count:.0f}", f"{ours_us:.1f}", f"{theirs_us:.1f}",
            f"{ours_us / theirs_us:.2f}"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=17, help="blocks in the long chain")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cpu", action="store_true", help="thread CPU time instead of wall time")
    args = parser.parse_args(argv)
    if args.nodes < 2:
        parser.error("--nodes must be at least 2")
    print(f"load average (1 min) at start {_common.load_average():.2f}  ")
    rows = [measure(name, args.nodes, args.rounds, args.cpu) for name in CASES]
    clock = "thread CPU time" if args.cpu else "wall time"
    print("\n" + _common.Table(f"## Time per block, one thread ({args.nodes} blocks against 1, {clock})",
                               ["block", "nodes", "onnx_light steps", "onnx_light us", "onnxruntime us",
                                "ratio"], rows).markdown())
    print(f"\nload average (1 min) at end {_common.load_average():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
