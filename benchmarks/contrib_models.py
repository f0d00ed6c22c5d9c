"""Small real architectures built with onnx's helpers from seeded random weights, for the
tests and the benchmark (``contrib_speed.py``) of onnxruntime's ``com.microsoft`` operators:
CNNs to quantize (MobileNetV2-like, ResNet-like, and one with the other operators the QOperator
format has contrib nodes for) with onnxruntime's quantizer (:func:`quantize_static_model`), a
BERT-style encoder to quantize dynamically or to fuse with onnxruntime's transformer optimizer,
and one-node models of a contrib operator (:func:`one_node`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from quantized_models import onnxruntime_saturates

F = TensorProto.FLOAT
OPSET = 17


class Graph:
    """Nodes and seeded random initializers of one model, named in order."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def constant(self, values: Any, dtype: Any = np.float32) -> str:
        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(values, dtype), name))
        return name

    def weight(self, *shape: int, scale: float | None = None) -> str:
        scale = scale if scale is not None else 1 / np.sqrt(np.prod(shape[1:]) or 1)
        return self.constant(self.rng.standard_normal(shape) * scale)

    def one(self, op_type: str, inputs: list[str], **attributes: Any) -> str:
        name = f"{op_type.lower()}{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attributes))
        return name

    def conv(self, x: str, channels: int, filters: int, kernel: int = 1, stride: int = 1,
             group: int = 1) -> str:
        w = self.weight(filters, channels // group, kernel, kernel)
        b = self.weight(filters, scale=0.1)
        pad = kernel // 2
        return self.one("Conv", [x, w, b], kernel_shape=[kernel, kernel], strides=[stride, stride],
                        pads=[pad] * 4, group=group)

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
              name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        onnx.checker.check_model(model)
        return model


def _classifier_head(g: Graph, x: str, channels: int, classes: int) -> str:
    pooled = g.one("Flatten", [g.one("GlobalAveragePool", [x])])
    return g.one("Gemm", [pooled, g.weight(classes, channels), g.weight(classes, scale=0.1)], transB=1)


def mobilenet_like(seed: int = 0, size: int = 32) -> onnx.ModelProto:
    """A stem convolution, inverted residual blocks (1x1 expand, depthwise 3x3, 1x1 project,
    residual Add where the shapes allow), a 1x1 head, global pooling and a Gemm classifier;
    Relu6 as Clip(0, 6), as MobileNetV2 exports it."""
    g = Graph(seed)
    zero, six = g.constant(0.0), g.constant(6.0)

    def relu6(x: str) -> str:
        return g.one("Clip", [x, zero, six])

    x = relu6(g.conv("x", 3, 16, kernel=3, stride=2))
    channels = 16
    for out, stride in ((16, 1), (24, 2), (24, 1)):
        hidden = channels * 4
        h = relu6(g.conv(x, channels, hidden))
        h = relu6(g.conv(h, hidden, hidden, kernel=3, stride=stride, group=hidden))
        h = g.conv(h, hidden, out)
        x = g.one("Add", [x, h]) if stride == 1 and out == channels else h
        channels = out
    x = relu6(g.conv(x, channels, 48))
    y = _classifier_head(g, x, 48, 10)
    return g.model([helper.make_tensor_value_info("x", F, [1, 3, size, size])],
                   [helper.make_tensor_value_info(y, F, [1, 10])], "mobilenet_like")


def resnet_like(seed: int = 1, size: int = 32) -> onnx.ModelProto:
    """A stem convolution and MaxPool, basic residual blocks (two 3x3 convolutions, a 1x1
    projection where the shape changes, Add then Relu), global pooling and a Gemm classifier."""
    g = Graph(seed)
    x = g.one("Relu", [g.conv("x", 3, 16, kernel=3)])
    x = g.one("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    channels = 16
    for out, stride in ((16, 1), (32, 2)):
        h = g.one("Relu", [g.conv(x, channels, out, kernel=3, stride=stride)])
        h = g.conv(h, out, out, kernel=3)
        shortcut = x if stride == 1 and out == channels else g.conv(x, channels, out, stride=stride)
        x = g.one("Relu", [g.one("Add", [h, shortcut])])
        channels = out
    y = _classifier_head(g, x, channels, 10)
    return g.model([helper.make_tensor_value_info("x", F, [1, 3, size, size])],
                   [helper.make_tensor_value_info(y, F, [1, 10])], "resnet_like")


def quantize_static_model(model: onnx.ModelProto, folder: Path, samples: list[np.ndarray],
                          quant_format: str, activation: str = "QUInt8", **options: Any
                          ) -> onnx.ModelProto:
    """``model`` quantized by onnxruntime's static quantizer, calibrated on ``samples`` (fed to
    the input ``x``), per channel, int8 weights, ``activation`` (``QUInt8``/``QInt8``)
    activations, in ``quant_format`` (``QOperator``/``QDQ``); 7-bit weights where onnxruntime's
    byte products saturate (:func:`quantized_models.onnxruntime_saturates`)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter({"x": s} for s in samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    source, quantized = folder / f"{model.graph.name}.onnx", folder / f"{model.graph.name}.q.onnx"
    onnx.save(model, source)
    quantize_static(str(source), str(quantized), Reader(), quant_format=QuantFormat[quant_format],
                    per_channel=True, activation_type=QuantType[activation],
                    weight_type=QuantType.QInt8,
                    **{"reduce_range": onnxruntime_saturates(), **options})
    return onnx.load(quantized)


def bert_like(seed: int = 2, layers: int = 2, hidden: int = 64, heads: int = 4, vocabulary: int = 50,
              intermediate: int = 128, sequence: int = 8, rms: bool = False) -> onnx.ModelProto:
    """A BERT-style encoder as exporters write it: word, position and segment embeddings
    (Gather, Add, LayerNormalization), the attention mask as ``(1 - mask) * -10000``, then
    ``layers`` layers of multi-head self-attention (MatMul, Add, Reshape, Transpose, Softmax)
    and a feed-forward block with the exact (Erf) GELU, each with a residual Add and
    LayerNormalization (with ``rms``, the RMS normalization of LLaMA-style models as exporters
    write it: Pow, ReduceMean, Add, Sqrt, Div, Mul). Inputs: ``input_ids``, ``segment_ids``,
    ``attention_mask`` (int64, batch x ``sequence``)."""
    g = Graph(seed)
    head = hidden // heads
    i64 = TensorProto.INT64

    def dense(x: str, rows: int, columns: int) -> str:
        return g.one("Add", [g.one("MatMul", [x, g.weight(rows, columns, scale=rows ** -0.5)]),
                             g.weight(columns, scale=0.1)])

    def layer_norm(x: str) -> str:
        gamma = g.constant(1 + 0.1 * g.rng.standard_normal(hidden))
        if rms:
            mean_square = g.one("ReduceMean", [g.one("Pow", [x, g.constant(2.0)])], axes=[-1], keepdims=1)
            root = g.one("Sqrt", [g.one("Add", [mean_square, g.constant(1e-6)])])
            return g.one("Mul", [g.one("Mul", [x, g.one("Div", [g.constant(1.0), root])]), gamma])
        return g.one("LayerNormalization", [x, gamma, g.weight(hidden, scale=0.1)], axis=-1,
                     epsilon=1e-12)

    positions = g.constant(np.arange(sequence)[None, :], np.int64)
    words = g.one("Gather", [g.weight(vocabulary, hidden, scale=0.5), "input_ids"])
    placed = g.one("Gather", [g.weight(sequence, hidden, scale=0.5), positions])
    segments = g.one("Gather", [g.weight(2, hidden, scale=0.5), "segment_ids"])
    x = layer_norm(g.one("Add", [g.one("Add", [words, placed]), segments]))
    unsqueezed = g.one("Unsqueeze", [g.one("Unsqueeze", ["attention_mask", g.constant([1], np.int64)]),
                                     g.constant([2], np.int64)])
    mask = g.one("Mul", [g.one("Sub", [g.constant(1.0), g.one("Cast", [unsqueezed], to=F)]),
                         g.constant(-10000.0)])
    split = g.constant([0, 0, heads, head], np.int64)
    merge = g.constant([0, 0, hidden], np.int64)
    for _ in range(layers):
        q, k, v = (g.one("Reshape", [dense(x, hidden, hidden), split]) for _ in range(3))
        q = g.one("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.one("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.one("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.one("Div", [g.one("MatMul", [q, k]), g.constant(float(np.sqrt(head)))])
        probabilities = g.one("Softmax", [g.one("Add", [scores, mask])], axis=-1)
        context = g.one("Transpose", [g.one("MatMul", [probabilities, v])], perm=[0, 2, 1, 3])
        attended = dense(g.one("Reshape", [context, merge]), hidden, hidden)
        x = layer_norm(g.one("Add", [attended, x]))
        inner = dense(x, hidden, intermediate)
        erf = g.one("Erf", [g.one("Div", [inner, g.constant(float(np.sqrt(2.0)))])])
        gelu = g.one("Mul", [g.one("Mul", [inner, g.one("Add", [erf, g.constant(1.0)])]), g.constant(0.5)])
        x = layer_norm(g.one("Add", [dense(gelu, intermediate, hidden), x]))
    inputs = [helper.make_tensor_value_info(name, i64, ["batch", sequence])
              for name in ("input_ids", "segment_ids", "attention_mask")]
    return g.model(inputs, [helper.make_tensor_value_info(x, F, ["batch", sequence, hidden])], "bert_like")


def bert_feeds(rng: np.random.Generator, batch: int = 2, sequence: int = 8, vocabulary: int = 50
               ) -> dict[str, np.ndarray]:
    """Random token ids, segments and a mask with padding at the end of the second sentence."""
    mask = np.ones((batch, sequence), np.int64)
    mask[1:, sequence - 3:] = 0
    return {"input_ids": rng.integers(0, vocabulary, (batch, sequence)).astype(np.int64),
            "segment_ids": (np.arange(sequence)[None, :] >= sequence // 2).repeat(batch, 0).astype(np.int64),
            "attention_mask": mask}


def one_node(op_type: str, feeds: dict[str, np.ndarray], constants: dict[str, np.ndarray],
             inputs: list[str], outputs: Any = (np.float32,), **attributes: Any) -> onnx.ModelProto:
    """A model of one ``com.microsoft`` node: ``inputs`` name feeds (graph inputs), constants
    (initializers) or '' (omitted); outputs ``y0, y1, ...`` of the numpy types ``outputs``."""
    node = helper.make_node(op_type, inputs, [f"y{i}" for i in range(len(outputs))], name="node",
                            domain="com.microsoft", **attributes)
    graph = helper.make_graph(
        [node], op_type,
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
         for name, x in feeds.items()],
        [helper.make_tensor_value_info(f"y{i}", helper.np_dtype_to_tensor_dtype(np.dtype(t)), None)
         for i, t in enumerate(outputs)],
        [numpy_helper.from_array(np.asarray(x), name) for name, x in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                   helper.make_opsetid("com.microsoft", 1)])


def branches_like(seed: int = 3, size: int = 32) -> onnx.ModelProto:
    """The operators CNNs use beyond those two, for the quantizer's other QLinear nodes: two
    branches (LeakyRelu; a sigmoid gate multiplied in), joined by Concat, AveragePool, a
    residual Add, global pooling, Gemm and Softmax."""
    g = Graph(seed)
    x = g.one("Relu", [g.conv("x", 3, 8, kernel=3)])
    left = g.one("LeakyRelu", [g.conv(x, 8, 8, kernel=3)], alpha=0.1)
    right = g.conv(x, 8, 8)
    gated = g.one("Mul", [right, g.one("Sigmoid", [right])])
    joined = g.one("Concat", [left, gated], axis=1)
    pooled = g.one("AveragePool", [joined], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = g.one("Add", [pooled, g.conv(pooled, 16, 16)])
    logits = _classifier_head(g, y, 16, 10)
    probabilities = g.one("Softmax", [logits], axis=-1)
    return g.model([helper.make_tensor_value_info("x", F, [1, 3, size, size])],
                   [helper.make_tensor_value_info(probabilities, F, [1, 10])], "branches_like")


def _pack_nbits(rng: np.random.Generator, rows: int, columns: int, block: int = 32
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random 4-bit weights of a (rows, columns) MatMul as MatMulNBits holds them: B packed
    (columns, blocks, block / 2), scales and packed zero points."""
    blocks = -(-rows // block)
    packed = rng.integers(0, 256, (columns, blocks, block // 2)).astype(np.uint8)
    scales = (rng.uniform(0.5, 1.5, columns * blocks) / (8 * np.sqrt(rows))).astype(np.float32)
    zeros = rng.integers(0, 256, columns * -(-blocks // 2)).astype(np.uint8)
    return packed, scales, zeros


def decoder_like(seed: int = 4, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                 vocabulary: int = 50, intermediate: int = 128, positions: int = 64) -> onnx.ModelProto:
    """A LLaMA-style decoder as onnxruntime's model builder writes one for the CPU: token
    embeddings, per layer RMS normalization (SimplifiedLayerNormalization in the default
    domain, then SkipSimplifiedLayerNormalization with the residual), Q/K/V/O and the gated
    SiLU MLP as 4-bit MatMulNBits, GroupQueryAttention with rotary embeddings and a key-value
    cache, a final norm and a 4-bit language-model head. Inputs: ``input_ids`` (int64, batch
    x S), ``seqlens_k`` (int32, batch), ``total_sequence_length`` (int32 scalar) and
    ``past_key_values.<layer>.key/value`` (batch x kv heads x P x head size); outputs
    ``logits`` and ``present.<layer>.key/value``."""
    g = Graph(seed)
    size = hidden // heads
    angles = np.arange(positions)[:, None] / 10000 ** (np.arange(size // 2)[None, :] * 2 / size)
    cos, sin = g.constant(np.cos(angles)), g.constant(np.sin(angles))
    contrib = {"domain": "com.microsoft"}

    def nbits(x: str, rows: int, columns: int) -> str:
        packed, scales, zeros = _pack_nbits(g.rng, rows, columns)
        inputs = [x, g.constant(packed, np.uint8), g.constant(scales), g.constant(zeros, np.uint8)]
        return g.one("MatMulNBits", inputs, K=rows, N=columns, bits=4, block_size=32, **contrib)

    def gamma() -> str:
        return g.constant(1 + 0.1 * g.rng.standard_normal(hidden))

    x = g.one("Gather", [g.weight(vocabulary, hidden, scale=1.0), "input_ids"])
    normed = g.one("SimplifiedLayerNormalization", [x, gamma()], epsilon=1e-6)
    residual = x
    inputs, outputs = [], []
    for layer in range(layers):
        q, k, v = nbits(normed, hidden, hidden), nbits(normed, hidden, kv_heads * size), nbits(
            normed, hidden, kv_heads * size)
        past = [f"past_key_values.{layer}.{kind}" for kind in ("key", "value")]
        present = [f"present.{layer}.{kind}" for kind in ("key", "value")]
        attended = f"attended{layer}"
        g.nodes.append(helper.make_node(
            "GroupQueryAttention", [q, k, v, *past, "seqlens_k", "total_sequence_length", cos, sin],
            [attended, *present], name=attended, num_heads=heads, kv_num_heads=kv_heads, do_rotary=1,
            **contrib))
        inputs += [helper.make_tensor_value_info(name, F, ["batch", kv_heads, "past", size]) for name in past]
        outputs += [helper.make_tensor_value_info(name, F, ["batch", kv_heads, "total", size])
                    for name in present]
        sum_name = f"residual{layer}a"
        normed = f"normed{layer}a"
        g.nodes.append(helper.make_node(
            "SkipSimplifiedLayerNormalization", [nbits(attended, hidden, hidden), residual, gamma()],
            [normed, "", "", sum_name], name=normed, epsilon=1e-6, **contrib))
        gate, up = nbits(normed, hidden, intermediate), nbits(normed, hidden, intermediate)
        activated = g.one("Mul", [g.one("Mul", [gate, g.one("Sigmoid", [gate])]), up])
        residual = f"residual{layer}b"
        normed = f"normed{layer}b"
        g.nodes.append(helper.make_node(
            "SkipSimplifiedLayerNormalization", [nbits(activated, intermediate, hidden), sum_name, gamma()],
            [normed, "", "", residual], name=normed, epsilon=1e-6, **contrib))
    logits = nbits(normed, hidden, vocabulary)
    graph = helper.make_graph(
        g.nodes, "decoder_like",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
         helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []), *inputs],
        [helper.make_tensor_value_info(logits, F, ["batch", "sequence", vocabulary]), *outputs],
        g.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                   helper.make_opsetid("com.microsoft", 1)])


def mlp_like(seed: int = 5, width: int = 32) -> onnx.ModelProto:
    """Three Gemm layers with Relu, LeakyRelu and Sigmoid between them (what onnxruntime's
    optimizer fuses into FusedGemm); input ``x`` (4, width)."""
    g = Graph(seed)
    x = "x"
    for activation, attributes in (("Relu", {}), ("LeakyRelu", {"alpha": 0.1}), ("Sigmoid", {})):
        x = g.one(activation, [g.one("Gemm", [x, g.weight(width, width), g.weight(width, scale=0.1)],
                                     transB=1)], **attributes)
    return g.model([helper.make_tensor_value_info("x", F, [4, width])],
                   [helper.make_tensor_value_info(x, F, [4, width])], "mlp_like")
