"""The QDQ rewrite (runtime/qdq.py) on hand-built groups, and quantized models made by
onnxruntime's quantizer, against onnxruntime on the same model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light.runtime.qdq import rewrite_qdq
from onnx_light.runtime.session import RuntimeSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import quantized_models
from kernel_cases import kernel_state

ort = pytest.importorskip("onnxruntime")

PRODUCTS = {"Conv", "MatMul", "Gemm"}
INTEGER = {"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"}


def _onnxruntime(model: onnx.ModelProto | str, threads: int = 1) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _plan_ops(session: RuntimeSession) -> list[str]:
    return [step.op_type for step in session._plan]


# ---------------------------------------------------------------- hand-built groups

X_SCALE, Y_SCALE = 0.05, 0.08


def _group(op: str, *, output_q: bool = True, bias: bool = True, per_channel: bool = True,
           bias_scale: float | None = None, gemm_trans_b: int = 1) -> onnx.ModelProto:
    """x (float) -> Q -> DQ -> op(DQ(w) [, DQ(bias)]) [-> Q -> DQ] -> y."""
    rng = np.random.default_rng(4)
    if op == "Conv":
        x_shape, w_shape, channels, attributes = [1, 6, 9, 9], (8, 6, 3, 3), 8, {"pads": [1, 1, 1, 1]}
    elif op == "MatMul":
        x_shape, w_shape, channels, attributes = [2, 5, 24], (24, 8), 8, {}
    else:
        x_shape, w_shape, channels = [5, 24], (8, 24) if gemm_trans_b else (24, 8), 8
        attributes = {"transB": gemm_trans_b}
    w = quantized_models.int8_weights(rng, w_shape)
    w_scale = rng.uniform(0.002, 0.02, channels if per_channel else ()).astype(np.float32)
    axis = 0 if op == "Conv" or (op == "Gemm" and gemm_trans_b) else 1
    inits = {"w_q": w, "w_scale": w_scale, "w_zero": np.zeros(w_scale.shape, np.int8),
             "x_scale": np.array(X_SCALE, np.float32), "x_zero": np.array(120, np.uint8),
             "y_scale": np.array(Y_SCALE, np.float32), "y_zero": np.array(110, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"], name="qx"),
             helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"], name="dqx"),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w_dq"], name="dqw",
                              axis=axis)]
    inputs = ["x_dq", "w_dq"]
    if bias:
        inits["b_q"] = rng.integers(-2000, 2000, channels).astype(np.int32)
        inits["b_scale"] = (np.float32(X_SCALE) * w_scale if bias_scale is None
                            else np.full(w_scale.shape, bias_scale, np.float32))
        nodes.append(helper.make_node("DequantizeLinear", ["b_q", "b_scale"], ["b_dq"], name="dqb", axis=0))
        inputs.append("b_dq")
    product = "y" if not output_q else "p"
    nodes.append(helper.make_node(op, inputs, [product], name="product", **attributes))
    if output_q:
        nodes += [helper.make_node("QuantizeLinear", ["p", "y_scale", "y_zero"], ["y_q"], name="qy"),
                  helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zero"], ["y"], name="dqy")]
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(seed).uniform(-6, 6, shape).astype(np.float32)}


def _compare(model: onnx.ModelProto, expected_ops: list[str], step: float) -> None:
    """The rewrite makes ``expected_ops``; its outputs are onnxruntime's and the unfused
    graph's within ``step`` (one output step; 0: exact up to float32 rounding)."""
    before = model.SerializeToString()
    rewritten = rewrite_qdq(model)
    assert model.SerializeToString() == before, "the caller's model was changed"
    quantization = ("QuantizeLinear", "DequantizeLinear")
    assert [n.op_type for n in rewritten.graph.node if n.op_type not in quantization] == expected_ops
    session = RuntimeSession(model, num_threads=1)
    assert not PRODUCTS & set(_plan_ops(session))
    feeds = _feeds(model)
    ours = session.run(None, feeds)[0]
    for other in (_onnxruntime(model).run(None, feeds)[0],
                  RuntimeSession(model, num_threads=1, fuse=False).run(None, feeds)[0]):
        assert ours.shape == other.shape and ours.dtype == other.dtype
        tolerance = step * 1.0001 or 1e-5 * float(np.abs(other).max())
        np.testing.assert_allclose(ours, other, rtol=0, atol=tolerance)


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_group_becomes_qlinear_conv(per_channel: bool, bias: bool) -> None:
    model = _group("Conv", per_channel=per_channel, bias=bias)
    _compare(model, ["QLinearConv"], Y_SCALE)
    qconv = next(n for n in rewrite_qdq(model).graph.node if n.op_type == "QLinearConv")
    assert list(qconv.input[-1:]) == (["b_q"] if bias else ["y_zero"])
    dequantized = [n.input[0] for n in rewrite_qdq(model).graph.node if n.op_type == "DequantizeLinear"]
    assert dequantized == ["y_q"]  # the weights' and the bias' DequantizeLinear are gone


def test_matmul_group_becomes_qlinear_matmul() -> None:
    _compare(_group("MatMul", bias=False), ["QLinearMatMul"], Y_SCALE)


@pytest.mark.parametrize("trans_b", [1, 0])
def test_gemm_group_becomes_a_qlinear_product(trans_b: int) -> None:
    _compare(_group("Gemm", gemm_trans_b=trans_b), ["Reshape", "QLinearConv", "Reshape"], Y_SCALE)
    _compare(_group("Gemm", gemm_trans_b=trans_b, bias=False), ["QLinearMatMul"], Y_SCALE)


def test_float_outputs_become_integer_products_and_a_scale() -> None:
    _compare(_group("MatMul", output_q=False, bias=False), ["MatMulInteger", "Cast", "Mul"], 0)
    _compare(_group("Conv", output_q=False), ["ConvInteger", "Cast", "Mul", "Add"], 0)


@pytest.mark.parametrize(("model", "why"), [
    (_group("Conv", bias_scale=0.001), "the bias' scale is not x_scale * w_scale"),
    (_group("Gemm", output_q=False), "a Gemm with a float output"),
])
def test_groups_that_stay_float(model: onnx.ModelProto, why: str) -> None:
    assert rewrite_qdq(model) is model, why


def test_activation_scale_per_channel_is_not_rewritten() -> None:
    model = _group("MatMul", bias=False)
    per_row = numpy_helper.from_array(np.full(24, X_SCALE, np.float32), "x_scale_rows")
    model.graph.initializer.append(per_row)
    dq = next(n for n in model.graph.node if n.name == "dqx")
    dq.input[1] = "x_scale_rows"
    dq.input[2] = ""
    dq.attribute.append(helper.make_attribute("axis", 2))
    assert rewrite_qdq(model) is model


def test_a_product_output_read_elsewhere_keeps_its_float_value() -> None:
    model = _group("MatMul", bias=False)
    model.graph.output.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, None))
    rewritten = rewrite_qdq(model)
    assert [n.op_type for n in rewritten.graph.node if n.op_type in INTEGER] == ["MatMulInteger"]
    feeds = _feeds(model, 1)
    ours = RuntimeSession(model, num_threads=1).run(None, feeds)
    theirs = _onnxruntime(model).run(None, feeds)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=0, atol=Y_SCALE * 1.0001)


def _moving(op: str, same_parameters: bool = True, **attributes: Any) -> onnx.ModelProto:
    """x -> Q -> DQ -> op -> Q -> DQ -> y, the second Q with the first's parameters or others."""
    inits = {"s": np.array(X_SCALE, np.float32), "z": np.array(120, np.uint8),
             "s2": np.array(X_SCALE if same_parameters else Y_SCALE, np.float32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"], name="qx"),
             helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"], name="dqx"),
             helper.make_node(op, ["x_dq"], ["p"], name="moved", **attributes),
             helper.make_node("QuantizeLinear", ["p", "s2", "z"], ["p_q"], name="qp"),
             helper.make_node("DequantizeLinear", ["p_q", "s2", "z"], ["y"], name="dqy")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    graph = helper.make_graph(nodes, op, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("op", "attributes"), [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("Transpose", {"perm": [0, 2, 3, 1]}),
    ("Flatten", {}),
])
def test_moving_operators_run_on_the_bytes(op: str, attributes: dict[str, Any]) -> None:
    model = _moving(op, **attributes)
    rewritten = rewrite_qdq(model)
    assert [n.op_type for n in rewritten.graph.node] == ["QuantizeLinear", op, "DequantizeLinear"]
    feeds = _feeds(model, 2)
    ours = RuntimeSession(model, num_threads=1).run(None, feeds)[0]
    np.testing.assert_array_equal(ours, _onnxruntime(model).run(None, feeds)[0])
    np.testing.assert_array_equal(ours, RuntimeSession(model, fuse=False).run(None, feeds)[0])
    other_scale = _moving(op, same_parameters=False, **attributes)
    assert rewrite_qdq(other_scale) is other_scale


def test_a_float_model_is_returned_as_it_is() -> None:
    model = quantized_models.cnn(np.random.default_rng(0))
    assert rewrite_qdq(model) is model


# ---------------------------------------------------------------- onnxruntime's quantizer


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("quantized")
    made: dict[tuple[str, str, bool, bool], Path] = {}

    def make(name: str, mode: str, per_channel: bool, signed: bool) -> Path:
        if (name, mode, per_channel, signed) not in made:
            model = quantized_models.MODELS[name](np.random.default_rng(0))
            made[name, mode, per_channel, signed] = quantized_models.quantize(
                model, folder, mode, per_channel, signed)
        return made[name, mode, per_channel, signed]

    return make


def _output_step(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that makes the graph's output (0: a float output)."""
    last = next((n for n in model.graph.node if n.output[0] == model.graph.output[0].name), None)
    if last is None or last.op_type != "DequantizeLinear":
        return 0.0
    return float(next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == last.input[1]))


@pytest.mark.parametrize(("name", "mode", "per_channel", "signed", "integer_ops"), [
    ("cnn", "static", True, False, {"QLinearConv"}),
    ("cnn", "static", False, False, {"QLinearConv"}),
    ("cnn", "static", True, True, {"QLinearConv"}),
    ("transformer", "static", True, False, {"QLinearMatMul"}),
    ("cnn", "dynamic", True, False, {"ConvInteger", "MatMulInteger"}),
    ("mlp", "dynamic", True, False, {"MatMulInteger"}),
])
def test_quantized_models_match_onnxruntime(quantized: Any, name: str, mode: str, per_channel: bool,
                                            signed: bool, integer_ops: set[str]) -> None:
    path = str(quantized(name, mode, per_channel, signed))
    model = onnx.load(path)
    step = _output_step(model)
    session, theirs = RuntimeSession(path, num_threads=1), _onnxruntime(path)
    plan = _plan_ops(session)
    assert integer_ops <= set(plan) and not PRODUCTS & set(plan), plan
    reported = {entry["key"].split("/")[1] for entry in session.tuning_report()}
    assert integer_ops <= reported
    two = RuntimeSession(path, num_threads=2)
    for seed in range(3):
        x = quantized_models.calibration_samples(model, 1, seed=10 + seed)[0] * (1 + seed)
        expected, actual = theirs.run(None, {"x": x})[0], session.run(None, {"x": x})[0]
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        tolerance = step * 1.0001 or 1e-5 * float(np.abs(expected).max())
        np.testing.assert_allclose(actual, expected, rtol=0, atol=tolerance)
        np.testing.assert_array_equal(two.run(None, {"x": x})[0], actual)


def _inverted_residual(rng: np.random.Generator) -> onnx.ModelProto:
    """x (1, 3, 16, 16) -> logits (1, 10): a MobileNetV2-style block (stem, 1x1 expansion,
    3x3 depthwise, 1x1 projection, residual) and a classifier."""
    inits = {"w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3,
             "w2": rng.standard_normal((24, 8, 1, 1)).astype(np.float32) * 0.3,
             "w3": rng.standard_normal((24, 1, 3, 3)).astype(np.float32) * 0.3,
             "w4": rng.standard_normal((8, 24, 1, 1)).astype(np.float32) * 0.2,
             "fc": rng.standard_normal((10, 8)).astype(np.float32) * 0.3,
             **{f"b{i}": rng.standard_normal(c).astype(np.float32) * 0.1
                for i, c in ((1, 8), (2, 24), (3, 24), (4, 8), (5, 10))}}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1], group=24),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("Conv", ["r3", "w4", "b4"], ["c4"]),
        helper.make_node("Add", ["c4", "r1"], ["s"]),
        helper.make_node("GlobalAveragePool", ["s"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "b5"], ["y"], transB=1),
    ]
    graph = helper.make_graph(nodes, "inverted_residual",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("quant_format", ["QDQ", "QOperator"])
def test_int8_model_settles_its_convolutions_and_does_no_lazy_work(tmp_path: Path, quant_format: str
                                                                   ) -> None:
    """A MobileNetV2-style block quantized by onnxruntime (QDQ, rewritten to QLinearConv, or
    QOperator's QLinearConv): the session settles each QLinearConv's plans and route at
    construction, a run changes no kernel's state, and the output is onnxruntime's."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    model = _inverted_residual(np.random.default_rng(3))
    source, target = tmp_path / "float.onnx", tmp_path / "int8.onnx"
    onnx.save(model, source)
    samples = quantized_models.calibration_samples(model, 8, seed=1)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter({"x": s} for s in samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    quantize_static(str(source), str(target), Reader(), quant_format=getattr(QuantFormat, quant_format),
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    reduce_range=quantized_models.onnxruntime_saturates())
    session = RuntimeSession(str(target), num_threads=1)
    # the residual QLinearAdd is fused into its convolution's step (runtime/qlinear_fusion.py)
    convs = [getattr(k, "conv", k) for k, _, _ in session._steps
             if k.op_type in ("QLinearConv", "QLinearConvAdd")]
    assert "QLinearConvAdd" in _plan_ops(session)
    assert len(convs) >= 4  # the QDQ Gemm with a bias is one too
    assert all(k.route is not None for k in convs)
    assert sum(k.route.call is not None for k in convs) >= 1  # the depthwise at least
    kernels = [kernel for kernel, _, _ in session._steps] + convs
    before = [kernel_state(kernel) for kernel in kernels]
    x = quantized_models.calibration_samples(model, 1, seed=10)[0]
    actual = session.run(None, {"x": x})[0]
    assert [kernel_state(kernel) for kernel in kernels] == before, "lazy work in a run"
    expected = _onnxruntime(str(target)).run(None, {"x": x})[0]
    tolerance = _output_step(onnx.load(target)) * 1.0001 or 1e-5 * float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tolerance)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], actual)


def test_int8_transformer_does_no_lazy_work(quantized: Any) -> None:
    """The QDQ transformer's QLinearMatMul hold their packed B and output range from
    construction: a run changes no kernel's state."""
    path = str(quantized("transformer", "static", True, False))
    session = RuntimeSession(path, num_threads=1)
    assert "QLinearMatMul" in _plan_ops(session)
    before = [kernel_state(kernel) for kernel, _, _ in session._steps]
    x = quantized_models.calibration_samples(onnx.load(path), 1, seed=10)[0]
    session.run(None, {"x": x})
    assert [kernel_state(kernel) for kernel, _, _ in session._steps] == before, "lazy work in a run"
