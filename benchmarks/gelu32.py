"""float32 GELU (kernels/float32_math.py) against onnxruntime's Gelu, BiasGelu and FastGelu:
speed, one thread, and accuracy against float64.

Usage: python benchmarks/gelu32.py [--rounds N] [--rows 128] [--width 3072]

Speed: the median time per call of the program the runtime's fusion makes (GELU(x),
GELU(x + bias), the tanh form with its bias) and of onnxruntime's contrib node on the same
data, interleaved in one process. Run it with ``PYTHONPATH`` at another checkout to time that
checkout's path against the same onnxruntime. Accuracy: over every 128th float32 in
+-[2^-30, 128] and every float32 near the erf polynomials' split, the largest error against
float64 GELU of the float32 argument, in units of ``2 ulp(y) + 1 ulp(t)`` (the stated bound:
at most 1) and in ulps of y for t >= 0, for onnx_light, onnxruntime's contrib nodes and
onnxruntime running the exported erf graph (Div, Erf, Add, Mul, Mul).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import onnx
from _common import interleaved, load_average, onnxruntime_session
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels import compiled_elementwise as ce
from onnx_light.kernels.math_functions import erfc


def _model(nodes: list[onnx.NodeProto], width: int, bias: bool,
           initializers: list[onnx.TensorProto] = ()) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])]
    if bias:
        inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [width]))
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", inputs, [output], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _contrib(op_type: str, width: int, bias: bool) -> onnx.ModelProto:
    names = ["x", "bias"] if bias else ["x"]
    return _model([helper.make_node(op_type, names, ["y"], domain="com.microsoft")], width, bias)


def _erf_graph(width: int) -> onnx.ModelProto:
    constants = [numpy_helper.from_array(np.array(v, np.float32), n)
                 for n, v in (("root2", math.sqrt(2)), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("Div", ["x", "root2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    return _model(nodes, width, False, constants)


def _program(code: int, bias: bool) -> ce.CompiledProgram:
    program = ce.Program()
    x = program.load(0)
    if bias:
        x = program.binary(ce.ADD, x, program.load(1))
    return program.finish(program.unary(code, x))


def _gelu64(tanh: bool, t: np.ndarray) -> np.ndarray:
    t = t.astype(np.float64)
    if tanh:
        with np.errstate(over="ignore"):  # exp(-2u) is inf for t below -20: GELU -0
            return t / (1.0 + np.exp(-2.0 * math.sqrt(2 / math.pi) * (t + 0.044715 * t * t * t)))
    return 0.5 * t * erfc(-t * math.sqrt(0.5))


def _ulp32(values: np.ndarray) -> np.ndarray:
    return np.ldexp(1.0, np.maximum(np.frexp(values.astype(np.float64))[1] - 24, -149))


def _accuracy_values() -> np.ndarray:
    bits = np.array([2.0 ** -30, 128.0], np.float32).view(np.int32)
    positive = np.arange(bits[0], bits[1] + 1, 128, dtype=np.int32).view(np.float32)
    split = np.array([1.76, 1.78], np.float32).view(np.int32)
    near = np.arange(split[0], split[1] + 1, dtype=np.int32).view(np.float32)
    values = np.concatenate([positive, near])
    return np.concatenate([values, -values])


def _errors(actual: np.ndarray, t: np.ndarray, tanh: bool) -> tuple[float, float]:
    expected = _gelu64(tanh, t)
    error = np.abs(actual.astype(np.float64) - expected)
    bound = 2 * _ulp32(expected) + _ulp32(t)
    positive = t >= 0
    return float(np.max(error / bound)), float(np.max(error[positive] / _ulp32(expected[positive])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--width", type=int, default=3072)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((args.rows, args.width)) * 2).astype(np.float32)
    bias = (rng.standard_normal(args.width) * 0.5).astype(np.float32)
    cases = {  # name: (our program, its inputs, onnxruntime model, its feed)
        "GELU(x)": (_program(ce.GELU, False), [x], _contrib("Gelu", args.width, False), {"x": x}),
        "GELU(x + bias)": (_program(ce.GELU, True), [x, bias], _contrib("BiasGelu", args.width, True),
                           {"x": x, "bias": bias}),
        "tanh GELU(x + bias)": (_program(ce.GELU_TANH, True), [x, bias],
                                _contrib("FastGelu", args.width, True), {"x": x, "bias": bias}),
    }
    groups = {}
    for name, (program, inputs, model, feed) in cases.items():
        session = onnxruntime_session(model, 1)
        groups[name] = {"onnx_light": lambda p=program, i=inputs: p.run(i),
                        "onnxruntime": lambda s=session, f=feed: s.run(None, f)}
    medians = interleaved(groups, args.rounds, 0.02)
    print(f"# GELU {args.rows} x {args.width}, one thread, {args.rounds} rounds, "
          f"load average {load_average()}")
    print("| case | onnx_light us | onnxruntime us | ratio |")
    print("|---|---:|---:|---:|")
    for name, times in medians.items():
        ours, theirs = times["onnx_light"] * 1e6, times["onnxruntime"] * 1e6
        print(f"| {name} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} |")
    t = _accuracy_values()
    rows = t.reshape(1, -1)
    def ort(model: onnx.ModelProto) -> np.ndarray:
        return onnxruntime_session(model, 1).run(None, {"x": rows})[0]

    measured = {
        "onnx_light GELU": (_program(ce.GELU, False).run([rows]), False),
        "onnx_light tanh GELU": (_program(ce.GELU_TANH, False).run([rows]), True),
        "onnxruntime Gelu": (ort(_contrib("Gelu", t.size, False)), False),
        "onnxruntime FastGelu": (ort(_contrib("FastGelu", t.size, False)), True),
        "onnxruntime erf graph": (ort(_erf_graph(t.size)), False),
    }
    print(f"\n# accuracy against float64 over {t.size} float32 values")
    print("| computation | max error / (2 ulp(y) + ulp(t)) | max ulps of y, t >= 0 |")
    print("|---|---:|---:|")
    for name, (actual, tanh) in measured.items():
        bounded, ulps = _errors(actual.reshape(-1), t, tanh)
        print(f"| {name} | {bounded:.3f} | {ulps:.2f} |")


if __name__ == "__main__":
    main()
