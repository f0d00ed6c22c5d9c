"""Compiled elementwise kernels and fused chains against numpy and onnxruntime.

Usage: python benchmarks/compiled_elementwise.py [--rounds N] [--threads 1 2] [--shape 2 32 1024]

For each case (one node, or a chain exporters write) at a BERT-style activation shape, prints
the median time per run of an onnx_light session with the compiled programs (the default), of
one with them off (numpy kernels, no chain fusion), and of onnxruntime with the same intra-op
thread count, measured interleaved in one process, with the ratios and the largest difference
between onnx_light's output and onnxruntime's. ``--compile-all`` runs every op a program can
compute compiled, to see where numpy is already faster (docs/elementwise.md).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from _common import interleaved, load_average, onnxruntime_session
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels import elementwise
from onnx_light.kernels.compiled_elementwise import PROGRAM_OPS
from onnx_light.kernels.normalization import LayerNormalization
from onnx_light.runtime.session import RuntimeSession

Builder = Callable[[tuple[int, ...]], tuple[list[onnx.NodeProto], list[onnx.TensorProto]]]


def _scalar(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


def _bias(shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    values = np.random.default_rng(seed).standard_normal(shape[-1]).astype(np.float32)
    return numpy_helper.from_array(values, "bias")


def _one(op_type: str, **attributes: object) -> Builder:
    def build(shape: tuple[int, ...]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
        return [helper.make_node(op_type, ["x"], ["y"], **attributes)], []
    return build


def _gelu_chain(shape: tuple[int, ...]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """PyTorch's erf GELU after a bias: Add(bias), Div(sqrt 2), Erf, Add(1), Mul(x), Mul(0.5)."""
    nodes = [helper.make_node("Add", ["x", "bias"], ["b"]),
             helper.make_node("Div", ["b", "root2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["b", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    bias = _bias(shape, 1)
    return nodes, [bias, _scalar("root2", 2 ** 0.5), _scalar("one", 1.0), _scalar("half", 0.5)]


def _gelu_tanh_chain(shape: tuple[int, ...]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    nodes = [helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("Mul", ["p", "c"], ["pc"]),
             helper.make_node("Add", ["x", "pc"], ["s"]), helper.make_node("Mul", ["s", "k"], ["u"]),
             helper.make_node("Tanh", ["u"], ["t"]), helper.make_node("Add", ["t", "one"], ["a"]),
             helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    return nodes, [_scalar("three", 3.0), _scalar("c", 0.044715), _scalar("k", (2 / np.pi) ** 0.5),
                   _scalar("one", 1.0), _scalar("half", 0.5)]


def _silu_chain(shape: tuple[int, ...]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """SiLU as exported: Sigmoid(x) * x."""
    return [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])], []


def _bias_relu(shape: tuple[int, ...]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    bias = _bias(shape, 2)
    return [helper.make_node("Add", ["x", "bias"], ["b"]), helper.make_node("Relu", ["b"], ["y"])], [bias]


def _layer_norm(shape: tuple[int, ...]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    scale = numpy_helper.from_array(np.ones(shape[-1], np.float32), "scale")
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1)
    return [node], [scale, _bias(shape, 3)]


CASES: dict[str, Builder] = {
    "Erf": _one("Erf"), "Gelu": _one("Gelu"), "Gelu tanh": _one("Gelu", approximate="tanh"),
    "Sigmoid": _one("Sigmoid"), "Tanh": _one("Tanh"), "Exp": _one("Exp"), "Relu": _one("Relu"),
    "HardSwish": _one("HardSwish"), "Mish": _one("Mish"), "Softplus": _one("Softplus"),
    "Add bias, Div, Erf, Add, Mul, Mul": _gelu_chain,
    "Pow, Mul, Add, Mul, Tanh, Add, Mul, Mul": _gelu_tanh_chain,
    "Sigmoid, Mul": _silu_chain, "Add bias, Relu": _bias_relu, "LayerNormalization": _layer_norm,
}


def model(builder: Builder, shape: tuple[int, ...]) -> onnx.ModelProto:
    nodes, initializers = builder(shape)
    x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)) for name in "xy")
    graph = helper.make_graph(nodes, "case", [x], [y], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _steps(plan: Sequence[Any]) -> Iterator[Any]:
    """The steps of a session's plan, those inside groups of branches too."""
    for item in plan:
        if hasattr(item, "branches"):
            for branch in item.branches:
                yield from _steps(branch)
        else:
            yield item


def numpy_session(m: onnx.ModelProto, threads: int) -> RuntimeSession:
    """A session with the compiled programs off: numpy kernels, no chain fusion, the numpy
    LayerNormalization."""
    saved = elementwise.COMPILED_OPS
    elementwise.COMPILED_OPS = frozenset()
    try:
        from onnx_light.runtime import fusion
        chains = fusion._fuse_chains
        fusion._fuse_chains = lambda steps, *args: list(steps)
        try:
            session = RuntimeSession(m, num_threads=threads)
        finally:
            fusion._fuse_chains = chains
        for step in _steps(session._plan):
            kernel = getattr(step.run, "__self__", None)
            if isinstance(kernel, LayerNormalization):
                kernel._compiled = lambda *arguments: None
        return session
    finally:
        elementwise.COMPILED_OPS = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shape", type=int, nargs="+", default=[2, 32, 1024])
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--compile-all", action="store_true",
                        help="run every op a program computes compiled (not only COMPILED_OPS)")
    args = parser.parse_args()
    if args.compile_all:
        elementwise.COMPILED_OPS = PROGRAM_OPS
    shape = tuple(args.shape)
    feed = {"x": (np.random.default_rng(0).standard_normal(shape) * 3).astype(np.float32)}
    print(f"shape {list(shape)}, float32, load average {load_average()}, cpus {os.cpu_count()}")
    for threads in args.threads:
        groups, differences = {}, {}
        for name in args.cases:
            m = model(CASES[name], shape)
            ours, plain, ort = RuntimeSession(m, num_threads=threads), numpy_session(m, threads), \
                onnxruntime_session(m, threads)
            differences[name] = float(np.max(np.abs(ours.run(None, feed)[0] - ort.run(None, feed)[0])))
            groups[name] = {"compiled": lambda s=ours: s.run(None, feed),
                            "numpy": lambda s=plain: s.run(None, feed),
                            "onnxruntime": lambda s=ort: s.run(None, feed)}
        medians = interleaved(groups, args.rounds, 0.02)
        print(f"\n{threads} thread(s), load average {load_average()}\n")
        print("| case | compiled us | numpy us | onnxruntime us | compiled/ort | numpy/compiled | max diff |")
        print("|---|---|---|---|---|---|---|")
        for name, t in medians.items():
            c, n, o = t["compiled"] * 1e6, t["numpy"] * 1e6, t["onnxruntime"] * 1e6
            print(f"| {name} | {c:.1f} | {n:.1f} | {o:.1f} | {c / o:.2f} | {n / c:.2f} | "
                  f"{differences[name]:.2g} |")


if __name__ == "__main__":
    main()
