"""Small float models built with onnx's helpers (seeded random weights) and their quantized
versions, made by onnxruntime's own quantizer: the tests' and the benchmark's int8 models.

- ``cnn``: two 3x3 convolutions with Relu, a max pool, a 1x1 convolution, a residual Add,
  global average pooling and a Gemm classifier head.
- ``transformer``: a MatMul stack shaped like an encoder layer: Q, K, V projections
  (MatMul + Add), scaled attention scores (a MatMul of two activations), the context MatMul
  (no Softmax: onnxruntime's QLinearSoftmax approximates it through a lookup table, several
  output steps from the float Softmax), an output projection and a two-layer feed-forward
  block with residual Adds. ``mlp`` is the same without the attention part.

:func:`quantize` writes the QDQ model of ``quantize_static`` (uint8 activations, int8
weights, per-channel or per-tensor, a seeded calibration reader) or the ``quantize_dynamic``
one (MatMulInteger or ConvInteger with DynamicQuantizeLinear) next to the float model.

onnxruntime's uint8 x int8 products are exact only where the processor has a byte
dot-product instruction (AVX-512 VNNI, AVX-VNNI, AMX). With AVX2 alone its kernels add each
pair of byte products in int16 with saturation, so a pair past 32767 is clipped (255 * 127 * 2
is 64770), and onnxruntime's advice for those machines is 7-bit weights (``reduce_range``),
whose pairs stay within 2 * 255 * 64 = 32640. :func:`onnxruntime_saturates` probes which
machine this is; :func:`quantize` and :func:`int8_weights` then make weights onnxruntime
computes exactly, so that comparisons with it stay bit-for-bit. onnx_light's sums are exact
everywhere (tests/test_integer_products.py checks them against int64 sums at full range).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["MODELS", "calibration_samples", "cnn", "int8_weights", "onnxruntime_saturates", "quantize",
           "transformer"]

OPSET = 17


@functools.cache
def onnxruntime_saturates() -> bool:
    """Whether onnxruntime's uint8 x int8 products clip pairs of byte products on this machine
    (probed once: a MatMulInteger of 255s by 127s; False without onnxruntime)."""
    try:
        import onnxruntime
    except ImportError:
        return False
    depth = 64
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, depth]),
         helper.make_tensor_value_info("b", TensorProto.INT8, [depth, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"a": np.full((4, depth), 255, np.uint8), "b": np.full((depth, 4), 127, np.int8)}
    y = session.run(None, feeds)[0]
    return bool((y != 255 * 127 * depth).any())


def int8_weights(rng: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
    """Uniform int8 weights: the full range, or 7 bits (-64 to 63) where
    :func:`onnxruntime_saturates`."""
    low, high = (-64, 63) if onnxruntime_saturates() else (-128, 127)
    return rng.integers(low, high + 1, shape).astype(np.int8)


def _weights(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    return (rng.standard_normal(shape) * (2.0 / fan_in) ** 0.5).astype(np.float32)


def cnn(rng: np.random.Generator, channels: int = 16, size: int = 32) -> onnx.ModelProto:
    """x (1, 3, size, size) -> logits (1, 10)."""
    c = channels
    inits = {
        "w1": _weights(rng, (c, 3, 3, 3), 27), "b1": rng.standard_normal(c).astype(np.float32) * 0.1,
        "w2": _weights(rng, (2 * c, c, 3, 3), 9 * c),
        "b2": rng.standard_normal(2 * c).astype(np.float32) * 0.1,
        "w3": _weights(rng, (2 * c, 2 * c, 1, 1), 2 * c),
        "b3": rng.standard_normal(2 * c).astype(np.float32) * 0.1,
        "fc": _weights(rng, (10, 2 * c), 2 * c), "fb": rng.standard_normal(10).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="conv3"),
        helper.make_node("Add", ["c3", "r2"], ["s3"], name="residual"),
        helper.make_node("Relu", ["s3"], ["r3"], name="relu3"),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], name="head", transB=1),
    ]
    return _model(nodes, "cnn", [1, 3, size, size], [1, 10], inits)


def transformer(rng: np.random.Generator, tokens: int = 32, width: int = 64,
                attention: bool = True) -> onnx.ModelProto:
    """x (1, tokens, width) -> y (1, tokens, width); without ``attention`` only the output
    projection and the feed-forward block (every MatMul then has constant weights)."""
    d = width
    inits: dict[str, np.ndarray] = {"scale": np.array(1 / d ** 0.5, np.float32)}
    for name, shape in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
                        ("w1", (d, 4 * d)), ("w2", (4 * d, d))):
        inits[name] = _weights(rng, shape, shape[0])
        inits["b" + name[1:]] = rng.standard_normal(shape[1]).astype(np.float32) * 0.1

    def linear(x: str, w: str, y: str) -> list[onnx.NodeProto]:
        return [helper.make_node("MatMul", [x, w], [y + "_m"], name=y + "_matmul"),
                helper.make_node("Add", [y + "_m", "b" + w[1:]], [y], name=y + "_bias")]

    mixing = [
        *linear("x", "wq", "q"), *linear("x", "wk", "k"), *linear("x", "wv", "v"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="scores"),
        helper.make_node("Mul", ["scores", "scale"], ["attention"], name="scaled"),
        helper.make_node("MatMul", ["attention", "v"], ["context"], name="context"),
    ]
    if not attention:
        inits = {k: v for k, v in inits.items() if k[1:] not in ("q", "k", "v") and k != "scale"}
    nodes = [
        *(mixing if attention else []),
        *linear("context" if attention else "x", "wo", "o"),
        helper.make_node("Add", ["o", "x"], ["h"], name="residual1"),
        *linear("h", "w1", "f1"),
        helper.make_node("Relu", ["f1"], ["f1r"], name="ffn_relu"),
        *linear("f1r", "w2", "f2"),
        helper.make_node("Add", ["f2", "h"], ["y"], name="residual2"),
    ]
    return _model(nodes, "transformer" if attention else "mlp", [1, tokens, d], [1, tokens, d], inits)


def _model(nodes: list[onnx.NodeProto], name: str, x_shape: list[int], y_shape: list[int],
           inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


MODELS: dict[str, Callable[[np.random.Generator], onnx.ModelProto]] = {
    "cnn": cnn, "transformer": transformer,
    "mlp": lambda rng: transformer(rng, attention=False),
}


def calibration_samples(model: onnx.ModelProto, count: int, seed: int) -> list[np.ndarray]:
    """Seeded standard-normal inputs of the model's input shape."""
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(count)]


def quantize(model: onnx.ModelProto, folder: Path, mode: str = "static",
             per_channel: bool = True, signed_activations: bool = False) -> Path:
    """The quantized model's path: ``mode`` "static" (QDQ, calibrated on 8 seeded samples;
    uint8 activations, or int8 with ``signed_activations``) or "dynamic"; 7-bit weights where
    :func:`onnxruntime_saturates`."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    name = model.graph.name
    source = folder / f"{name}.onnx"
    target = folder / (f"{name}-{mode}{'-per-channel' if per_channel else ''}"
                       f"{'-int8' if signed_activations else ''}.onnx")
    onnx.save(model, source)
    if mode == "dynamic":
        quantize_dynamic(str(source), str(target), per_channel=per_channel, weight_type=QuantType.QInt8,
                         reduce_range=onnxruntime_saturates())
        return target
    samples = calibration_samples(model, 8, seed=1)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter({"x": s} for s in samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel,
                    activation_type=QuantType.QInt8 if signed_activations else QuantType.QUInt8,
                    weight_type=QuantType.QInt8, reduce_range=onnxruntime_saturates())
    return target
