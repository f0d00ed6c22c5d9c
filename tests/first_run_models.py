"""Small models of the patterns whose compiled kernels a session compiles at construction, and
a script that reports, for each at 1 and 2 threads, the compile seconds a fresh process spent
inside the first ``session.run`` (test_first_run.py runs it in a subprocess, so that no
dispatcher compiled in the test process can hide a lazy compile)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper
from test_attention_fusion import attention_model

F = TensorProto.FLOAT
Model = tuple[ModelProto, dict[str, np.ndarray]]


def _model(nodes: list, inputs: dict[str, tuple[int, ...]], constants: dict[str, np.ndarray],
           opsets: tuple[tuple[str, int], ...] = (("", 17),), element: int = F) -> ModelProto:
    graph = helper.make_graph(
        nodes, "first_run", [helper.make_tensor_value_info(n, element, list(s)) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", element if nodes[-1].op_type != "QuantizeLinear" else F, None)],
        initializer=[numpy_helper.from_array(v, n) for n, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _gelu(x: str, y: str, prefix: str) -> list:
    """GELU(x) as the exporters decompose it: x * 0.5 * (1 + erf(x / sqrt 2))."""
    return [helper.make_node("Div", [x, "sqrt2"], [f"{prefix}d"]),
            helper.make_node("Erf", [f"{prefix}d"], [f"{prefix}e"]),
            helper.make_node("Add", [f"{prefix}e", "one"], [f"{prefix}a"]),
            helper.make_node("Mul", [x, f"{prefix}a"], [f"{prefix}m"]),
            helper.make_node("Mul", [f"{prefix}m", "half"], [y])]


_GELU_CONSTANTS = {"sqrt2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
                   "half": np.array(0.5, np.float32)}


def layer_norm(rng: np.random.Generator) -> Model:
    x = rng.standard_normal((8, 64)).astype(np.float32)
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1)]
    return _model(nodes, {"x": x.shape}, {"gamma": rng.random(64, np.float32),
                                          "beta": rng.random(64, np.float32)}), {"x": x}


def gelu_chain(rng: np.random.Generator) -> Model:
    """Bias + GELU over enough elements for the parallel path at 2 threads."""
    x = rng.standard_normal((256, 1024)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "bias"], ["b"]), *_gelu("b", "y", "g")]
    return _model(nodes, {"x": x.shape}, {"bias": rng.random(1024, np.float32), **_GELU_CONSTANTS}), {"x": x}


def rms_norm(rng: np.random.Generator) -> Model:
    """The LLaMA exporters' RMSNorm: x * (1 / sqrt(mean(x^2) + eps)) * w."""
    x = rng.standard_normal((1, 8, 64)).astype(np.float32)
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]),
             helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
             helper.make_node("Add", ["m", "eps"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"]),
             helper.make_node("Div", ["one", "s"], ["r"]), helper.make_node("Mul", ["x", "r"], ["n"]),
             helper.make_node("Mul", ["w", "n"], ["y"])]
    constants = {"two": np.array(2.0, np.float32), "axes": np.array([-1], np.int64),
                 "eps": np.array(1e-6, np.float32), "one": np.array(1.0, np.float32),
                 "w": rng.random(64, np.float32)}
    return _model(nodes, {"x": x.shape}, constants, (("", 18),)), {"x": x}


def attention(rng: np.random.Generator) -> Model:
    model = attention_model(1, 4, 64, 64, 32, mask_shape=(1, 1, 64, 64))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    return model, feeds


def instance_norm_gelu(rng: np.random.Generator) -> Model:
    """wav2vec2's feature encoder: InstanceNorm (GroupNorm of one channel per group), the
    per-channel affine, GELU."""
    x = rng.standard_normal((1, 16, 400)).astype(np.float32)
    nodes = [helper.make_node("InstanceNormalization", ["x", "ones", "zeros"], ["i"], epsilon=1e-5),
             helper.make_node("Mul", ["i", "scale"], ["s"]), helper.make_node("Add", ["s", "shift"], ["t"]),
             *_gelu("t", "y", "g")]
    constants = {"ones": np.ones(16, np.float32), "zeros": np.zeros(16, np.float32),
                 "scale": rng.random((16, 1), np.float32), "shift": rng.random((16, 1), np.float32),
                 **_GELU_CONSTANTS}
    return _model(nodes, {"x": x.shape}, constants), {"x": x}


def depthwise(rng: np.random.Generator) -> Model:
    """MobileNetV2's depthwise 3x3 with bias and ReLU6."""
    x = rng.standard_normal((1, 64, 28, 28)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=64, kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "low", "high"], ["y"])]
    constants = {"w": rng.standard_normal((64, 1, 3, 3)).astype(np.float32), "b": rng.random(64, np.float32),
                 "low": np.array(0.0, np.float32), "high": np.array(6.0, np.float32)}
    return _model(nodes, {"x": x.shape}, constants), {"x": x}


def quantized(rng: np.random.Generator) -> Model:
    """QuantizeLinear, QLinearConv, QLinearAdd (residual), a QLinearConv of few output
    positions (the swapped product, written transposed), QLinearGlobalAveragePool,
    DequantizeLinear: MobileNetV2-int8's and ResNet-50-int8's int8 steps."""
    x = rng.standard_normal((1, 16, 14, 14)).astype(np.float32)
    u8 = np.uint8
    constants = {"xs": np.array(0.05, np.float32), "xz": np.array(128, u8),
                 "w": rng.integers(0, 255, (16, 16, 3, 3), dtype=np.uint8), "ws": np.array(0.01, np.float32),
                 "wz": np.array(128, u8), "b": rng.integers(-100, 100, 16, dtype=np.int32),
                 "cs": np.array(0.1, np.float32), "cz": np.array(120, u8),
                 "as": np.array(0.12, np.float32), "az": np.array(125, u8),
                 "ps": np.array(0.1, np.float32), "pz": np.array(126, u8),
                 "v": rng.integers(0, 255, (32, 16, 3, 3), dtype=np.uint8), "vb": np.zeros(32, np.int32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["q"]),
             helper.make_node("QLinearConv", ["q", "xs", "xz", "w", "ws", "wz", "cs", "cz", "b"], ["c"],
                              pads=[1, 1, 1, 1]),
             helper.make_node("QLinearAdd", ["c", "cs", "cz", "q", "xs", "xz", "as", "az"], ["a"],
                              domain="com.microsoft"),
             helper.make_node("QLinearConv", ["a", "as", "az", "v", "ws", "wz", "cs", "cz", "vb"], ["f"],
                              pads=[1, 1, 1, 1], strides=[7, 7]),
             helper.make_node("QLinearGlobalAveragePool", ["f", "cs", "cz", "ps", "pz"], ["p"],
                              domain="com.microsoft", channels_last=0),
             helper.make_node("DequantizeLinear", ["p", "ps", "pz"], ["y"])]
    return _model(nodes, {"x": x.shape}, constants, (("", 17), ("com.microsoft", 1))), {"x": x}


MODELS: dict[str, Callable[[np.random.Generator], Model]] = {
    "layer_norm": layer_norm, "gelu_chain": gelu_chain, "rms_norm": rms_norm, "attention": attention,
    "instance_norm_gelu": instance_norm_gelu, "depthwise": depthwise, "quantized": quantized}


def main() -> None:
    """Print {"name threads": compile seconds inside the first run} as JSON."""
    from onnx_light.kernels.compiled import process_compile_seconds
    from onnx_light.runtime import RuntimeSession

    moved = {}
    for name, build in MODELS.items():
        model, feeds = build(np.random.default_rng(0))
        for threads in (1, 2):
            session = RuntimeSession(model.SerializeToString(), num_threads=threads)
            before = process_compile_seconds()
            session.run(None, feeds)
            moved[f"{name} {threads}"] = process_compile_seconds() - before
    print(json.dumps(moved))


if __name__ == "__main__":
    sys.exit(main())
