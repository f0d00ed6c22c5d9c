"""onnxruntime's QOperator-format operators (``com.microsoft``) against onnxruntime: each on
random inputs, uint8 and int8, and CNNs quantized by ``quantize_static`` in the QOperator
format. Requantized outputs agree within one quantization step (the float32 rescaling may
round across a half where onnxruntime's integer pipelines do not); float outputs within
float32 tolerances."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

import onnx_light
from onnx_light.runtime import RuntimeSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from contrib_models import branches_like, mobilenet_like, one_node, quantize_static_model, resnet_like
from quantized_models import int8_weights, onnxruntime_saturates

ort = pytest.importorskip("onnxruntime")
BYTES = (np.uint8, np.int8)


def _both(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return RuntimeSession(model).run(None, feeds), theirs.run(None, feeds)


def _within_a_step(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    difference = np.abs(actual.astype(np.int32) - expected.astype(np.int32))
    assert difference.max(initial=0) <= 1, difference.max()


def _bytes(rng: np.random.Generator, dtype: Any, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _parameters(rng: np.random.Generator, dtype: Any, *names: str) -> dict[str, np.ndarray]:
    """A random scale and zero point for each name (``<name>_scale``, ``<name>_zero``)."""
    out: dict[str, np.ndarray] = {}
    for name in names:
        out[f"{name}_scale"] = np.float32(rng.uniform(0.005, 0.05))
        out[f"{name}_zero"] = np.asarray(rng.integers(-20, 20) + (128 if dtype == np.uint8 else 0), dtype)
    return out


def _binary_model(op_type: str, dtype: Any, a: np.ndarray, b: np.ndarray,
                  rng: np.random.Generator) -> onnx.ModelProto:
    constants = _parameters(rng, dtype, "a", "b", "c")
    if op_type == "QLinearMul":
        constants["c_scale"] = np.float32(constants["a_scale"] * constants["b_scale"] * rng.uniform(20, 60))
    return one_node(op_type, {"a": a, "b": b}, constants,
                    ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "c_scale", "c_zero"], [dtype])


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize(("a_shape", "b_shape"), [
    ((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (1, 3, 1, 1)), ((1, 3, 1, 1), (2, 3, 4, 5)),
    ((2, 3, 4, 5), (5,)), ((2, 3, 4, 5), ()), ((), (7, 9)), ((4, 1), (33,)), ((2, 1, 5), (1, 3, 1))])
def test_binary_is_onnxruntime_bit_for_bit(op_type: str, dtype: Any, a_shape: tuple[int, ...],
                                           b_shape: tuple[int, ...]) -> None:
    """onnxruntime's x86 arithmetic (its FMA order for Add, its integer product for Mul) on
    every broadcast pattern: no value differs, over many random scales and zero points."""
    rng = np.random.default_rng(0)
    for _ in range(12):
        feeds = {"a": _bytes(rng, dtype, *a_shape), "b": _bytes(rng, dtype, *b_shape)}
        (actual,), (expected,) = _both(_binary_model(op_type, dtype, feeds["a"], feeds["b"], rng), feeds)
        assert actual.dtype == expected.dtype
        np.testing.assert_array_equal(actual, expected)


@settings(deadline=None, derandomize=True, max_examples=40)
@given(st.sampled_from(["QLinearAdd", "QLinearMul"]), st.sampled_from(BYTES),
       st.lists(st.integers(1, 7), min_size=0, max_size=4), st.lists(st.booleans(), min_size=4, max_size=4),
       st.integers(0, 2), st.integers(0, 2 ** 32 - 1))
def test_binary_broadcasts_as_onnxruntime(op_type: str, dtype: Any, shape: list[int], kept: list[bool],
                                          dropped: int, seed: int) -> None:
    """Random shapes: B keeps some of A's axes (others 1) and drops up to ``dropped`` leading
    ones; either operand first."""
    b_shape = [n if keep else 1 for n, keep in zip(shape, kept, strict=False)][min(dropped, len(shape)):]
    rng = np.random.default_rng(seed)
    a, b = _bytes(rng, dtype, *shape), _bytes(rng, dtype, *b_shape)
    if seed % 2:
        a, b = b, a
    feeds = {"a": a, "b": b}
    (actual,), (expected,) = _both(_binary_model(op_type, dtype, a, b, rng), feeds)
    np.testing.assert_array_equal(actual, expected)


@settings(deadline=None, derandomize=True, max_examples=40)
@given(st.sampled_from(BYTES), st.lists(st.integers(1, 40), min_size=3, max_size=5), st.booleans(),
       st.floats(0.05, 1.5), st.integers(0, 2 ** 32 - 1))
def test_global_average_pool_is_onnxruntime_bit_for_bit(dtype: Any, shape: list[int], channels_last: bool,
                                                        ratio: float, seed: int) -> None:
    """onnxruntime's integer sums and float32 rescaling: no value differs, channels first or
    last, on random shapes, scales (the output's ``ratio`` times the input's) and zero points."""
    rng = np.random.default_rng(seed)
    feeds = {"x": _bytes(rng, dtype, *shape)}
    constants = _parameters(rng, dtype, "x", "y")
    constants["y_scale"] = np.float32(constants["x_scale"] * ratio)
    model = one_node("QLinearGlobalAveragePool", feeds, constants,
                     ["x", "x_scale", "x_zero", "y_scale", "y_zero"], [dtype],
                     channels_last=int(channels_last))
    (actual,), (expected,) = _both(model, feeds)
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("op_type", "attributes"), [
    ("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.2}), ("QLinearLeakyRelu", {}),
    ("QLinearGlobalAveragePool", {}), ("QLinearGlobalAveragePool", {"channels_last": 1}),
    ("QLinearAveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("QLinearAveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("QLinearAveragePool", {"kernel_shape": [2, 2], "channels_last": 1, "ceil_mode": 1, "strides": [2, 2]}),
])
def test_unary(op_type: str, attributes: dict[str, Any], dtype: Any) -> None:
    rng = np.random.default_rng(1)
    feeds = {"x": _bytes(rng, dtype, 2, 3, 7, 7)}
    constants = _parameters(rng, dtype, "x", "y")
    model = one_node(op_type, feeds, constants, ["x", "x_scale", "x_zero", "y_scale", "y_zero"],
                     [dtype], **attributes)
    (actual,), (expected,) = _both(model, feeds)
    _within_a_step(actual, expected)


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize(("opset", "axis"), [(13, -1), (13, 1), (12, 1)])
def test_softmax(dtype: Any, opset: int, axis: int) -> None:
    rng = np.random.default_rng(2)
    feeds = {"x": _bytes(rng, dtype, 2, 5, 6)}
    constants = _parameters(rng, dtype, "x")
    constants.update(y_scale=np.float32(1 / 256),
                     y_zero=np.asarray(0 if dtype == np.uint8 else -128, dtype))
    model = one_node("QLinearSoftmax", feeds, constants, ["x", "x_scale", "x_zero", "y_scale", "y_zero"],
                     [dtype], axis=axis, opset=opset)
    (actual,), (expected,) = _both(model, feeds)
    _within_a_step(actual, expected)


@pytest.mark.parametrize("dtype", BYTES)
def test_concat(dtype: Any) -> None:
    rng = np.random.default_rng(3)
    feeds = {"a": _bytes(rng, dtype, 2, 3, 4), "b": _bytes(rng, dtype, 2, 5, 4)}
    constants = _parameters(rng, dtype, "a", "b", "y")
    model = one_node("QLinearConcat", feeds, constants,
                     ["y_scale", "y_zero", "a", "a_scale", "a_zero", "b", "b_scale", "b_zero"],
                     [dtype], axis=1)
    (actual,), (expected,) = _both(model, feeds)
    _within_a_step(actual, expected)


@pytest.mark.parametrize("dtype", BYTES)
def test_where(dtype: Any) -> None:
    rng = np.random.default_rng(9)
    feeds = {"c": rng.random((3, 1, 5)) < 0.5, "x": _bytes(rng, dtype, 3, 4, 5), "y": _bytes(rng, dtype, 5)}
    constants = _parameters(rng, dtype, "x", "y", "z")
    model = one_node("QLinearWhere", feeds, constants,
                     ["c", "x", "x_scale", "x_zero", "y", "y_scale", "y_zero", "z_scale", "z_zero"], [dtype])
    (actual,), (expected,) = _both(model, feeds)
    _within_a_step(actual, expected)


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize(("quantized", "bias", "trans_a", "alpha"), [
    (True, True, 0, 1.0), (False, True, 0, 1.0), (True, False, 1, 0.5), (False, False, 0, 2.0)])
def test_qgemm(dtype: Any, per_column: bool, quantized: bool, bias: bool, trans_a: int,
               alpha: float) -> None:
    rng = np.random.default_rng(4)
    a = _bytes(rng, dtype, 6, 5) if trans_a else _bytes(rng, dtype, 5, 6)
    feeds = {"a": a}
    constants: dict[str, np.ndarray] = {
        **{k: v for k, v in _parameters(rng, dtype, "a", "y").items()},
        "b": int8_weights(rng, (4, 6)),
        "b_scale": rng.uniform(0.005, 0.05, 4 if per_column else 1).astype(np.float32),
        "b_zero": np.zeros(4 if per_column else 1, np.int8),
        "c": rng.integers(-500, 500, 4).astype(np.int32)}
    constants["y_scale"] = np.float32(constants["a_scale"] * 0.05 * 30)
    inputs = ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "c" if bias else ""]
    inputs += ["y_scale", "y_zero"] if quantized else []
    model = one_node("QGemm", feeds, constants, inputs, [dtype if quantized else np.float32],
                     transA=trans_a, transB=1, alpha=alpha)
    (actual,), (expected,) = _both(model, feeds)
    if quantized:
        _within_a_step(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", BYTES)
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_integer_to_float(dtype: Any, bias: bool) -> None:
    rng = np.random.default_rng(5)
    feeds = {"a": _bytes(rng, dtype, 2, 3, 6)}
    constants = {"b": int8_weights(rng, (6, 4)), "a_scale": np.float32(0.02),
                 "b_scale": rng.uniform(0.01, 0.03, 4).astype(np.float32),
                 "a_zero": np.asarray(3, dtype), "b_zero": np.zeros(4, np.int8),
                 "bias": rng.standard_normal(4).astype(np.float32)}
    model = one_node("MatMulIntegerToFloat", feeds, constants,
                     ["a", "b", "a_scale", "b_scale", "a_zero", "b_zero", *(["bias"] if bias else [])])
    (actual,), (expected,) = _both(model, feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b_type", BYTES)
def test_dynamic_quantize_matmul(b_type: Any) -> None:
    rng = np.random.default_rng(6)
    feeds = {"a": rng.standard_normal((2, 3, 6)).astype(np.float32)}
    b = int8_weights(rng, (6, 4)) if b_type == np.int8 else _bytes(rng, b_type, 6, 4)
    constants = {"b": b, "b_scale": np.float32(0.02),
                 "b_zero": np.asarray(5, b_type), "bias": rng.standard_normal(4).astype(np.float32)}
    model = one_node("DynamicQuantizeMatMul", feeds, constants, ["a", "b", "b_scale", "b_zero", "bias"])
    (actual,), (expected,) = _both(model, feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def test_bad_inputs_name_the_node() -> None:
    rng = np.random.default_rng(7)
    feeds = {"a": _bytes(rng, np.uint8, 2, 3), "b": _bytes(rng, np.uint8, 4, 3)}
    constants = _parameters(rng, np.uint8, "a", "b", "c")
    model = one_node("QLinearAdd", feeds, constants,
                     ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "c_scale", "c_zero"], [np.uint8])
    with pytest.raises(ValueError, match=r"node 'node' \(QLinearAdd\).*broadcast"):
        RuntimeSession(model).run(None, feeds)


_CNN_OPS = {"QLinearAdd", "QLinearGlobalAveragePool", "QGemm"}


@pytest.mark.parametrize(("build", "expected"), [
    (mobilenet_like, _CNN_OPS), (resnet_like, _CNN_OPS),
    (branches_like, {*_CNN_OPS, "QLinearLeakyRelu", "QLinearSigmoid", "QLinearMul", "QLinearConcat",
                     "QLinearAveragePool", "QLinearSoftmax"}),
])
@pytest.mark.parametrize("activation", ["QUInt8", "QInt8"])
@pytest.mark.parametrize("quant_format", ["QOperator", "QDQ"])
def test_quantized_cnn_matches_onnxruntime(build: Any, expected: set[str], activation: str,
                                           quant_format: str, tmp_path: Any) -> None:
    """Per-channel static quantization; the QDQ format (QuantizeLinear/DequantizeLinear
    around float nodes, no contrib operators) runs as integer kernels too: the QDQ rewrite
    (runtime/qdq.py) makes the same QLinear operators of it, nothing float is left but the
    model's input and output conversions, Flatten and the Reshapes around the Gemm head."""
    rng = np.random.default_rng(8)
    samples = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(4)]
    model = quantize_static_model(build(), tmp_path, samples, quant_format, activation)
    contrib = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert contrib == (expected if quant_format == "QOperator" else set()), contrib
    convolutions = sum(n.op_type == ("QLinearConv" if quant_format == "QOperator" else "Conv")
                       for n in model.graph.node)
    assert convolutions >= 4
    session = RuntimeSession(model)
    # the contrib nodes' outputs are typed, so the QLinearConvs after them know their type
    assert all(kernel.element_type is not None for kernel, _, _ in session._steps
               if kernel.ctx.op_type == "QLinearConv")
    planned = {kernel.ctx.op_type for kernel, _, _ in session._steps}
    if "QLinearConvAdd" in planned:  # a residual QLinearAdd fused into its QLinearConv
        planned = (planned - {"QLinearConvAdd"}) | {"QLinearConv", "QLinearAdd"}
    assert expected - {"QGemm"} <= planned, planned
    assert planned - expected <= {"QLinearConv", "QuantizeLinear", "DequantizeLinear", "Flatten", "Reshape",
                                  "MaxPool"}, planned
    last = next(n for n in reversed(model.graph.node) if n.op_type == "DequantizeLinear")
    step = float(next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == last.input[1]))
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for x in [samples[0], rng.standard_normal((1, 3, 32, 32)).astype(np.float32) * 2]:
        expected = theirs.run(None, {"x": x})[0]
        actual = session.run(None, {"x": x})[0]
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected, rtol=0, atol=step * 1.0001)


def _lstm_model(rng: np.random.Generator, inputs: int, hidden: int, steps: int) -> onnx.ModelProto:
    from onnx import helper

    initializers = [numpy_helper.from_array(array.astype(np.float32), name) for name, array in (
        ("W", rng.standard_normal((2, 4 * hidden, inputs)) * 0.3),
        ("R", rng.standard_normal((2, 4 * hidden, hidden)) * 0.3),
        ("B", rng.standard_normal((2, 8 * hidden)) * 0.1))]
    node = helper.make_node("LSTM", ["x", "W", "R", "B", "lengths"], ["y", "y_h", "y_c"],
                            hidden_size=hidden, direction="bidirectional")
    graph = helper.make_graph(
        [node], "lstm", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [steps, 2, inputs]),
                         helper.make_tensor_value_info("lengths", onnx.TensorProto.INT32, [2])],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("y", "y_h", "y_c")],
        initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantize_lstm(per_channel: bool, tmp_path: Any) -> None:
    """quantize_dynamic's DynamicQuantizeLSTM: exactly ONNX LSTM on the dequantized weights
    (onnxruntime's LSTM as the oracle), and near onnxruntime's DynamicQuantizeLSTM, which also
    quantizes the input and hidden state at every step (its own outputs move about 0.02 from
    the float LSTM's on this model)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(10)
    source, quantized = tmp_path / "lstm.onnx", tmp_path / "lstm.dq.onnx"
    onnx.save(_lstm_model(rng, 16, 32, 10), source)
    quantize_dynamic(str(source), str(quantized), weight_type=QuantType.QInt8, per_channel=per_channel,
                     op_types_to_quantize=["LSTM"], reduce_range=onnxruntime_saturates())
    model = onnx.load(quantized)
    (node,) = model.graph.node
    assert (node.domain, node.op_type) == ("com.microsoft", "DynamicQuantizeLSTM")
    feeds = {"x": rng.standard_normal((10, 2, 16)).astype(np.float32),
             "lengths": np.array([10, 7], np.int32)}
    actual = RuntimeSession(model).run(None, feeds)
    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}

    def dequantized(name: str) -> np.ndarray:
        scale, zero = constants[f"{name}_scale"], constants[f"{name}_zero_point"]
        columns = (scale.shape[0], 1, -1)
        real = ((constants[f"{name}_quantized"].astype(np.int32) - zero.astype(np.int32).reshape(columns))
                * scale.reshape(columns))
        return real.transpose(0, 2, 1).astype(np.float32)

    float_model = onnx.load(source)
    for initializer in float_model.graph.initializer:
        if initializer.name in ("W", "R"):
            initializer.CopyFrom(numpy_helper.from_array(dequantized(initializer.name), initializer.name))
    theirs = ort.InferenceSession(float_model.SerializeToString(), providers=["CPUExecutionProvider"])
    for ours, exact in zip(actual, theirs.run(None, feeds), strict=True):
        np.testing.assert_allclose(ours, exact, rtol=1e-5, atol=1e-5)
    quantized_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for ours, near in zip(actual, quantized_session.run(None, feeds), strict=True):
        np.testing.assert_allclose(ours, near, rtol=0, atol=0.05)


@pytest.mark.parametrize(("bits", "zero_points", "k", "bias", "g_idx"), [
    (4, None, 64, False, False), (4, "packed", 80, True, False), (4, "float", 64, False, False),
    (8, "packed", 64, True, False), (2, "packed", 64, False, False), (4, None, 64, False, True),
])
def test_matmul_nbits(bits: int, zero_points: str | None, k: int, bias: bool, g_idx: bool) -> None:
    """Random packed weights, scales and zero points: onnxruntime reads the same bytes. g_idx
    in its default order (each row's own block) and without zero points here: onnxruntime's
    CPU kernel with a g_idx leaves packed zero points out (8 in their place); see the next
    test."""
    rng = np.random.default_rng(11)
    n, block = 24, 32
    blocks = -(-k // block)
    feeds = {"a": rng.standard_normal((2, 3, k)).astype(np.float32)}
    constants: dict[str, np.ndarray] = {
        "b": rng.integers(0, 256, (n, blocks, block * bits // 8)).astype(np.uint8),
        "scales": rng.uniform(0.01, 0.1, n * blocks).astype(np.float32)}
    inputs = ["a", "b", "scales"]
    if zero_points == "packed":
        constants["zeros"] = rng.integers(0, 256, n * -(-blocks * bits // 8)).astype(np.uint8)
    elif zero_points == "float":
        constants["zeros"] = rng.uniform(0, 2 ** bits - 1, n * blocks).astype(np.float32)
    inputs.append("zeros" if zero_points else "")
    if g_idx:
        constants["g_idx"] = (np.arange(k) // block).astype(np.int32)
    inputs.append("g_idx" if g_idx else "")
    if bias:
        constants["bias"] = rng.standard_normal(n).astype(np.float32)
    inputs.append("bias" if bias else "")
    model = one_node("MatMulNBits", feeds, constants, inputs, K=k, N=n, bits=bits, block_size=block)
    (actual,), (expected,) = _both(model, feeds)
    assert actual.shape == expected.shape == (2, 3, n)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def test_matmul_nbits_g_idx_gives_each_row_its_block() -> None:
    """A permuted g_idx (act-order weights): row k's weight is dequantized with the scale and
    zero point of block g_idx[k]; numpy on the unpacked values is the oracle."""
    rng = np.random.default_rng(12)
    k, n, block = 64, 8, 16
    values = rng.integers(0, 16, (n, k)).astype(np.uint8)
    packed = (values[:, 0::2] | (values[:, 1::2] << 4)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, (n, k // block)).astype(np.float32)
    g_idx = rng.permutation(np.arange(k) // block).astype(np.int32)
    a = rng.standard_normal((3, k)).astype(np.float32)
    model = one_node("MatMulNBits", {"a": a}, {"b": packed, "scales": scales, "g_idx": g_idx},
                     ["a", "b", "scales", "", "g_idx"], K=k, N=n, bits=4, block_size=block)
    (actual,) = RuntimeSession(model).run(None, {"a": a})
    weights = (values.astype(np.float32) - 8) * scales[:, g_idx]
    np.testing.assert_allclose(actual, a @ weights.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["QUInt8", "QInt16"])
def test_qdq_model_with_contrib_quantize_linear(activation: str, tmp_path: Any) -> None:
    """``UseQDQContribOps`` makes the quantizer write com.microsoft QuantizeLinear and
    DequantizeLinear (16-bit activations too): run as ONNX's version 21, within a step; the
    8-bit groups become integer products (the QDQ rewrite), the 16-bit ones stay float."""
    rng = np.random.default_rng(14)
    samples = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(4)]
    model = quantize_static_model(resnet_like(), tmp_path, samples, "QDQ", activation,
                                  extra_options={"UseQDQContribOps": True})
    contrib = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert contrib == {"QuantizeLinear", "DequantizeLinear"}, contrib
    last = next(n for n in reversed(model.graph.node) if n.op_type == "DequantizeLinear")
    step = float(next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == last.input[1]))
    x = {"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    session = RuntimeSession(model)
    integer = any(kernel.ctx.op_type == "QLinearConv" for kernel, _, _ in session._steps)
    assert integer == (activation == "QUInt8")
    actual = session.run(None, x)[0]
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = theirs.run(None, x)[0]
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=0, atol=step * 1.0001)


@pytest.mark.usefixtures("isolated_tuning")
def test_softmax_is_tuned_as_float_softmax() -> None:
    """A value published for float Softmax before the session is built configures the
    node's Softmax and shows in the tuning report with its source."""
    onnx_light.set_kernel_tuning_parameters("Softmax", "float", {"parallel.minimum_elements": 4321},
                                            num_threads=2, persist=False)
    rng = np.random.default_rng(2)
    feeds = {"x": _bytes(rng, np.uint8, 2, 5, 6)}
    constants = _parameters(rng, np.uint8, "x")
    constants.update(y_scale=np.float32(1 / 256), y_zero=np.asarray(0, np.uint8))
    model = one_node("QLinearSoftmax", feeds, constants, ["x", "x_scale", "x_zero", "y_scale", "y_zero"],
                     [np.uint8], axis=-1, opset=13)
    session = RuntimeSession(model, num_threads=2)
    (step,) = session._plan
    assert step.run.__self__.softmax.minimum_elements == 4321
    (entry,) = session.tuning_report()
    assert entry["key"].startswith("onnx_light/Softmax/") and entry["source"] == "published_profile"
    assert entry["values"]["parallel.minimum_elements"] == 4321
