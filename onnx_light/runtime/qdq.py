"""The QDQ rewrite: products between DequantizeLinear and QuantizeLinear run as integer products.

A QDQ model (``onnxruntime.quantization.quantize_static`` writes them) keeps every product in
float between DequantizeLinear and QuantizeLinear nodes. At construction, before the model is
checked and dispatched, each group below becomes the integer operator that computes it, so
that the product runs on the bytes (:mod:`~onnx_light.kernels.integer_gemm`) and is
requantized once, as onnxruntime's own QDQ fusion does:

- ``DQ(x), DQ(w) -> Conv -> Q`` (``DQ(bias)`` of int32 optional): QLinearConv with the int32
  bias, when the bias' scale is ``x_scale * w_scale`` (what the quantizer writes);
- ``DQ(a), DQ(b) -> MatMul -> Q``: QLinearMatMul (b constant or not);
- ``DQ(a), DQ(w) -> Gemm -> Q`` (alpha and beta 1, no transA): QLinearMatMul on the weights
  (transposed once for transB), or with a bias a QLinearConv over a length-1 axis, whose
  weights are Gemm's output columns: ``Reshape(a, [M, K, 1])``, QLinearConv, ``Reshape`` back;
- ``DQ(x), DQ(w) -> MatMul`` or ``-> Conv`` whose output stays float: MatMulInteger or
  ConvInteger, then ``Cast`` to float and ``Mul`` by ``a_scale * w_scale`` (and ``Add`` of the
  dequantized bias);
- ``DQ -> op -> Q`` with the same scale and zero point on both sides, for an operator that
  only moves or selects elements (:data:`MOVING`: MaxPool, Reshape, Transpose, ...): the
  operator on the bytes, exactly (dequantizing is monotonic, and quantizing a dequantized
  byte with the same parameters gives it back);
- ``DQ(x), ... -> op -> Q`` for Add, Mul, Concat, GlobalAveragePool, AveragePool, LeakyRelu,
  Sigmoid and Softmax (:data:`CONTRIB`), per tensor: onnxruntime's QLinear operator
  (``com.microsoft``, imported when the model does not), as onnxruntime's own session fuses
  such groups.

QuantizeLinear and DequantizeLinear may be onnxruntime's (``com.microsoft``, which its
quantizer writes with ``UseQDQContribOps``). The inputs must be uint8 or int8 with constant
scales and zero points: per tensor for activations, per tensor or per output channel for
weights. The DequantizeLinear nodes that
nothing reads afterwards are removed; the model given is never changed (the rewrite works on a
copy). Results: the integer products are exact, and the requantization rounds the float32
product ``acc * (x_scale * w_scale / y_scale)`` half to even as onnxruntime does; the float
graph rounds ``x * w`` sums in float32 before its QuantizeLinear, so the two can differ by one
step of the output scale. ``RuntimeSession(..., fuse=False)`` runs the graph as written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["rewrite_qdq"]

_BYTES = (TensorProto.UINT8, TensorProto.INT8)
# QuantizeLinear and DequantizeLinear of the default domain, and onnxruntime's of the same
# meaning (the quantizer's UseQDQContribOps writes them).
_QDQ_DOMAINS = ("", "ai.onnx", "com.microsoft")


@dataclass(frozen=True)
class _Dequantized:
    """One DequantizeLinear input of a product: the quantized value and its parameters."""

    quantized: str
    scale: np.ndarray
    zero: np.ndarray  # of the quantized type (zeros when the node has none)
    axis: int
    scale_name: str
    zero_name: str  # '' when the node has none


class _Graph:
    """The graph's constants, producers and readers, and the new nodes and constants."""

    def __init__(self, graph: onnx.GraphProto, opset: int) -> None:
        self.graph = graph
        self.opset = opset
        self.constants = {i.name: i for i in graph.initializer}
        self.producer = {name: node for node in graph.node for name in node.output}
        self.readers = Counter(name for node in graph.node for name in node.input if name)
        self.readers.update(o.name for o in graph.output)
        self.types = {i.name: i.type.tensor_type.elem_type for i in graph.input}
        self.added: list[TensorProto] = []
        self.names = set(self.producer) | set(self.constants) | set(self.types)

    def array(self, name: str) -> np.ndarray | None:
        tensor = self.constants.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    def constant(self, array: np.ndarray, hint: str) -> str:
        """A new initializer's name (unused in the graph)."""
        name, count = hint, 0
        while name in self.names:
            count += 1
            name = f"{hint}_{count}"
        self.names.add(name)
        self.added.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def element_type(self, name: str, zero: np.ndarray | None) -> int | None:
        if zero is not None:
            return helper.np_dtype_to_tensor_dtype(zero.dtype)
        if name in self.constants:
            return self.constants[name].data_type
        return self.types.get(name)

    def dequantized(self, name: str) -> _Dequantized | None:
        """The DequantizeLinear making ``name``, with constant byte parameters, or None."""
        node = self.producer.get(name)
        if node is None or node.op_type != "DequantizeLinear" or node.domain not in _QDQ_DOMAINS:
            return None
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get("block_size", 0) or attributes.get("output_dtype", 0):
            return None
        scale = self.array(node.input[1])
        zero_name = node.input[2] if len(node.input) > 2 else ""
        zero = self.array(zero_name) if zero_name else None
        if scale is None or scale.dtype != np.float32 or scale.ndim > 1 or (zero_name and zero is None):
            return None
        element_type = self.element_type(node.input[0], zero)
        if element_type not in (*_BYTES, TensorProto.INT32):
            return None
        if zero is None:
            zero = np.zeros(scale.shape, helper.tensor_dtype_to_np_dtype(element_type))
        if zero.shape != scale.shape and not zero.size == scale.size == 1:
            return None
        return _Dequantized(node.input[0], scale, zero, int(attributes.get("axis", 1)),
                            node.input[1], zero_name)

    def zero_name(self, value: _Dequantized) -> str:
        return value.zero_name or self.constant(value.zero, value.quantized + "_zero_point")

    def only_reader(self, name: str) -> onnx.NodeProto | None:
        """The single node reading ``name`` (None: several, none, or a graph output)."""
        if self.readers[name] != 1 or any(o.name == name for o in self.graph.output):
            return None
        return next((n for n in self.graph.node if name in n.input), None)


def _per_tensor(value: _Dequantized | None) -> bool:
    return value is not None and value.scale.size == 1 and value.zero.dtype in (np.uint8, np.int8)


def _per_channel(value: _Dequantized | None, rank: int, axis: int, channels: int) -> bool:
    """Per tensor, or one scale per ``channels`` along ``axis`` of a constant of ``rank``."""
    if value is None or value.zero.dtype not in (np.uint8, np.int8):
        return False
    return value.scale.size == 1 or (value.scale.size == channels and value.axis % rank == axis)


def _requantized(g: _Graph, output: str) -> tuple[onnx.NodeProto, _Dequantized] | None:
    """The QuantizeLinear that alone reads ``output``, with per-tensor byte parameters."""
    node = g.only_reader(output)
    if node is None or node.op_type != "QuantizeLinear" or node.domain not in _QDQ_DOMAINS:
        return None
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attributes.get("block_size", 0) or attributes.get("output_dtype", 0) or attributes.get("precision", 0):
        return None
    scale = g.array(node.input[1])
    zero_name = node.input[2] if len(node.input) > 2 else ""
    zero = g.array(zero_name) if zero_name else np.zeros((), np.uint8)
    if scale is None or scale.dtype != np.float32 or scale.size != 1 or zero is None \
            or zero.size != 1 or zero.dtype not in (np.uint8, np.int8):
        return None
    return node, _Dequantized(node.output[0], scale, zero, 1, node.input[1], zero_name)


def _bias(g: _Graph, node: onnx.NodeProto, x: _Dequantized, w: _Dequantized,
          channels: int) -> tuple[str, np.ndarray] | bool | None:
    """The int32 bias' name and value when its scale is ``x_scale * w_scale``; None without a
    bias; False when the bias cannot be used."""
    if len(node.input) < 3 or not node.input[2]:
        return None
    bias = g.dequantized(node.input[2])
    if bias is None or bias.zero.dtype != np.int32 or np.any(bias.zero != 0):
        return False
    values = g.array(bias.quantized)
    if values is None or values.shape != (channels,):
        return False
    expected = np.broadcast_to(x.scale.reshape(-1)[0] * w.scale.reshape(-1), (channels,))
    if not np.allclose(np.broadcast_to(bias.scale, (channels,)), expected, rtol=1e-6, atol=0):
        return False
    return bias.quantized, values


def _conv(g: _Graph, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    x, w = g.dequantized(node.input[0]), g.dequantized(node.input[1])
    weights = g.array(w.quantized) if w is not None else None
    if not _per_tensor(x) or weights is None or weights.ndim < 3 \
            or not _per_channel(w, weights.ndim, 0, weights.shape[0]):
        return None
    bias = _bias(g, node, x, w, weights.shape[0])
    if bias is False:
        return None
    attributes = list(node.attribute)
    requantized = _requantized(g, node.output[0])
    if requantized is not None:
        q, y = requantized
        inputs = [x.quantized, x.scale_name, g.zero_name(x), w.quantized, w.scale_name,
                  g.zero_name(w), y.scale_name, g.zero_name(y)]
        if bias is not None:
            inputs.append(bias[0])
        return [_node("QLinearConv", inputs, [q.output[0]], node.name, attributes, q)]
    channels = (weights.shape[0],) + (1,) * (weights.ndim - 2)
    shape = g.constant((x.scale.reshape(-1)[0] * w.scale.reshape(-1)).reshape(
        channels if w.scale.size > 1 else ()), node.output[0] + "_scale")
    product = node.output[0] + "_int32"
    nodes = [_node("ConvInteger", [x.quantized, w.quantized, g.zero_name(x), g.zero_name(w)],
                   [product], node.name, attributes)]
    real = _scaled(nodes, product, shape, node)
    if bias is not None:
        bias_scale = g.dequantized(node.input[2]).scale  # checked by _bias
        values = (bias[1].astype(np.float32) * bias_scale.astype(np.float32)).reshape(channels)
        nodes.append(helper.make_node("Add", [real, g.constant(values, node.output[0] + "_bias")],
                                      [node.output[0]], name=node.name + "_bias"))
    else:
        nodes[-1].output[0] = node.output[0]
    return nodes


def _scaled(nodes: list[onnx.NodeProto], product: str, scale: str, node: onnx.NodeProto) -> str:
    """Append ``Cast(product) * scale`` (float32); returns the result's name."""
    real = node.output[0] + "_real"
    nodes.append(helper.make_node("Cast", [product], [real + "_unscaled"], name=node.name + "_cast",
                                  to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Mul", [real + "_unscaled", scale], [real], name=node.name + "_scale"))
    return real


def _matmul(g: _Graph, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    a, b = g.dequantized(node.input[0]), g.dequantized(node.input[1])
    if not _per_tensor(a) or b is None:
        return None
    weights = g.array(b.quantized)
    if weights is not None and weights.ndim == 2:
        if not _per_channel(b, 2, 1, weights.shape[1]):
            return None
    elif not _per_tensor(b):
        return None
    requantized = _requantized(g, node.output[0])
    if requantized is not None:
        q, y = requantized
        inputs = [a.quantized, a.scale_name, g.zero_name(a), b.quantized, b.scale_name,
                  g.zero_name(b), y.scale_name, g.zero_name(y)]
        return [_node("QLinearMatMul", inputs, [q.output[0]], node.name, [], q)]
    if weights is None or weights.ndim != 2:
        return None
    product = node.output[0] + "_int32"
    nodes = [_node("MatMulInteger", [a.quantized, b.quantized, g.zero_name(a), g.zero_name(b)],
                   [product], node.name, [])]
    scale = g.constant((a.scale.reshape(-1)[0] * b.scale.reshape(-1)).reshape(
        (-1,) if b.scale.size > 1 else ()), node.output[0] + "_scale")
    _scaled(nodes, product, scale, node)
    nodes[-1].output[0] = node.output[0]
    return nodes


def _gemm(g: _Graph, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attributes.get("transA", 0) or attributes.get("alpha", 1.0) != 1.0 \
            or attributes.get("beta", 1.0) != 1.0:
        return None
    a, w = g.dequantized(node.input[0]), g.dequantized(node.input[1])
    weights = g.array(w.quantized) if w is not None else None
    requantized = _requantized(g, node.output[0])
    if not _per_tensor(a) or weights is None or weights.ndim != 2 or requantized is None:
        return None
    transposed = bool(attributes.get("transB", 0))
    columns = weights.shape[0] if transposed else weights.shape[1]
    if not _per_channel(w, 2, 0 if transposed else 1, columns):
        return None
    bias = _bias(g, node, a, w, columns)
    if bias is False:
        return None
    q, y = requantized
    rows = weights if transposed else weights.T  # (N, K): one row per output column
    head = [a.quantized, a.scale_name, g.zero_name(a)]
    tail = [w.scale_name, g.zero_name(w), y.scale_name, g.zero_name(y)]
    if bias is None:
        matrix = g.constant(rows.T, w.quantized + "_matrix")
        return [_node("QLinearMatMul", [*head, matrix, *tail], [q.output[0]], node.name, [], q)]
    filters = g.constant(rows[:, :, np.newaxis], w.quantized + "_filters")
    column, result = node.output[0] + "_column", node.output[0] + "_columns"
    return [
        helper.make_node("Reshape", [a.quantized, g.constant(np.array([0, 0, 1]), "gemm_as_conv_shape")],
                         [column], name=node.name + "_as_conv"),
        _node("QLinearConv", [column, *head[1:], filters, *tail, bias[0]], [result], node.name, [], q),
        helper.make_node("Reshape", [result, g.constant(np.array([0, 0]), "gemm_from_conv_shape")],
                         [q.output[0]], name=node.name + "_from_conv"),
    ]


def _node(op_type: str, inputs: list[str], outputs: list[str], name: str,
          attributes: list[onnx.AttributeProto], q: onnx.NodeProto | None = None) -> onnx.NodeProto:
    """The integer node replacing the product ``name`` (and the QuantizeLinear ``q``)."""
    node = helper.make_node(op_type, inputs, outputs, name=name or outputs[0])
    node.attribute.extend(a for a in attributes)
    if q is not None:
        node.doc_string = f"QDQ rewrite of {name!r} and {q.name!r}"
    return node


# Operators that only move or select elements, and the opset from which they take bytes.
MOVING = {"MaxPool": 12, "Reshape": 1, "Flatten": 1, "Transpose": 1, "Squeeze": 1, "Unsqueeze": 1,
          "Identity": 1}


def _moving(g: _Graph, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """``DQ -> op -> Q`` with the same scale and zero point: the op on the bytes."""
    if len(node.output) != 1 or g.opset < MOVING[node.op_type]:
        return None
    x = g.dequantized(node.input[0])
    requantized = _requantized(g, node.output[0])
    if not _per_tensor(x) or requantized is None or g.only_reader(node.input[0]) is not node:
        return None
    q, y = requantized
    if y.zero.dtype != x.zero.dtype or y.scale.reshape(()) != x.scale.reshape(()) \
            or y.zero.reshape(()) != x.zero.reshape(()):
        return None
    moved = onnx.NodeProto()
    moved.CopyFrom(node)
    moved.input[0] = x.quantized
    moved.output[0] = q.output[0]
    return [moved]


#: onnxruntime's quantized operators for ``DQ -> op -> Q`` (``com.microsoft``, as its own
#: session fuses such groups): per-tensor byte parameters, one type throughout.
CONTRIB = {"Add": "QLinearAdd", "Mul": "QLinearMul", "Concat": "QLinearConcat",
           "GlobalAveragePool": "QLinearGlobalAveragePool", "AveragePool": "QLinearAveragePool",
           "LeakyRelu": "QLinearLeakyRelu", "Sigmoid": "QLinearSigmoid", "Softmax": "QLinearSoftmax"}
CONTRIB_DOMAIN = "com.microsoft"


def _contrib(g: _Graph, node: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """``DQ(x), ... -> op -> Q`` for an operator of :data:`CONTRIB`: onnxruntime's QLinear
    operator with the node's attributes (QLinearSoftmax also takes the model's opset, which
    says what its ``axis`` means)."""
    operands = [g.dequantized(name) for name in node.input]
    requantized = _requantized(g, node.output[0])
    if len(node.output) != 1 or requantized is None or not all(_per_tensor(x) for x in operands):
        return None
    q, y = requantized
    if any(x.zero.dtype != y.zero.dtype for x in operands):
        return None
    triples = [name for x in operands for name in (x.quantized, x.scale_name, g.zero_name(x))]
    output = [y.scale_name, g.zero_name(y)]
    inputs = [*output, *triples] if node.op_type == "Concat" else [*triples, *output]
    attributes = list(node.attribute)
    if node.op_type == "Softmax":
        attributes.append(helper.make_attribute("opset", g.opset))
    fused = _node(CONTRIB[node.op_type], inputs, [q.output[0]], node.name, attributes, q)
    fused.domain = CONTRIB_DOMAIN
    return [fused]


_REWRITES = {"Conv": _conv, "MatMul": _matmul, "Gemm": _gemm, **dict.fromkeys(MOVING, _moving),
             **dict.fromkeys(CONTRIB, _contrib)}


def rewrite_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its QDQ product groups as integer operators (``model`` itself when it has
    none: a float model costs one pass over its nodes)."""
    graph = model.graph
    if not any(n.op_type == "DequantizeLinear" for n in graph.node):
        return model
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    g = _Graph(graph, opset)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for index, node in enumerate(graph.node):
        rewrite = _REWRITES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        nodes = rewrite(g, node) if rewrite is not None else None
        if nodes is None:
            continue
        replaced[index] = nodes
        q = g.only_reader(node.output[0])
        if q is not None and q.op_type == "QuantizeLinear" and any(q.output[0] in n.output for n in nodes):
            removed.add(next(i for i, n in enumerate(graph.node) if n is q))
    if not replaced:
        return model
    result = onnx.ModelProto()
    result.CopyFrom(model)
    nodes = list(_rebuilt(graph.node, replaced, removed))
    del result.graph.node[:]
    result.graph.node.extend(_without_dead_dequantization(nodes, graph))
    result.graph.initializer.extend(g.added)
    if any(n.domain == CONTRIB_DOMAIN for n in nodes) and all(
            entry.domain != CONTRIB_DOMAIN for entry in result.opset_import):
        result.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    return result


def _rebuilt(nodes: Sequence[onnx.NodeProto], replaced: dict[int, list[onnx.NodeProto]],
             removed: set[int]) -> Iterator[onnx.NodeProto]:
    for index, node in enumerate(nodes):
        if index in removed:
            continue
        yield from replaced.get(index, [node])


def _without_dead_dequantization(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """``nodes`` without the DequantizeLinear nodes whose outputs nothing reads any more."""
    read = Counter(name for node in nodes for name in node.input if name)
    read.update(o.name for o in graph.output)
    return [node for node in nodes
            if node.op_type != "DequantizeLinear" or any(read[o] for o in node.output)]
