"""Models saved by onnxruntime's own graph optimizer (``SessionOptions.optimized_model_filepath``
at the extended level: FusedConv, FusedGemm, FusedMatMul, SkipLayerNormalization, BiasGelu),
and FusedConv and FusedGemm on their own, against onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from onnx_light.runtime import RuntimeSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from contrib_models import (
    bert_feeds,
    bert_like,
    branches_like,
    mlp_like,
    mobilenet_like,
    one_node,
    quantize_static_model,
    resnet_like,
)

ort = pytest.importorskip("onnxruntime")


def _optimized_by_onnxruntime(model: onnx.ModelProto, folder: Path) -> onnx.ModelProto:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(folder / f"{model.graph.name}.optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


@pytest.mark.parametrize(("build", "fused"), [
    (mobilenet_like, {"FusedConv"}), (resnet_like, {"FusedConv"}), (mlp_like, {"FusedGemm"}),
    (bert_like, {"SkipLayerNormalization", "FusedMatMul", "BiasGelu"}),
])
def test_model_saved_by_onnxruntime_matches_it(build: Any, fused: set[str], tmp_path: Path) -> None:
    model = _optimized_by_onnxruntime(build(), tmp_path)
    contrib = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert fused <= contrib, contrib
    session = RuntimeSession(model)
    if "FusedConv" in fused:  # tuned as the Conv it is
        keys = {entry["key"].split("/")[1] for entry in session.tuning_report()}
        assert "Conv" in keys and "FusedConv" not in keys, keys
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = bert_feeds(rng) if build is bert_like else {"x": rng.standard_normal(shape).astype(np.float32)}
    np.testing.assert_allclose(session.run(None, feeds)[0], theirs.run(None, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("activation", "parameters", "with_z"), [
    ("Relu", [], True), ("Clip", [0.0, 0.5], False), ("LeakyRelu", [0.2], True),
    ("Sigmoid", [], False), ("Tanh", [], True), ("HardSigmoid", [0.3, 0.4], False),
])
def test_fused_conv(activation: str, parameters: list[float], with_z: bool) -> None:
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((1, 4, 7, 7)).astype(np.float32)}
    constants = {"w": rng.standard_normal((6, 2, 3, 3)).astype(np.float32) * 0.3,
                 "b": rng.standard_normal(6).astype(np.float32) * 0.1}
    inputs = ["x", "w", "b"]
    if with_z:
        feeds["z"] = rng.standard_normal((1, 6, 4, 4)).astype(np.float32)
        inputs.append("z")
    extra = {"activation_params": parameters} if parameters else {}
    model = one_node("FusedConv", feeds, constants, inputs, activation=activation, group=2,
                     strides=[2, 2], pads=[1, 1, 1, 1], kernel_shape=[3, 3], **extra)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(RuntimeSession(model).run(None, feeds)[0], theirs.run(None, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def test_fused_conv_with_an_unknown_activation_names_the_node() -> None:
    feeds = {"x": np.zeros((1, 1, 3, 3), np.float32)}
    model = one_node("FusedConv", feeds, {"w": np.ones((1, 1, 1, 1), np.float32)}, ["x", "w"],
                     activation="Swish")
    with pytest.raises(ValueError, match=r"node 'node' \(FusedConv\): activation must be one of"):
        RuntimeSession(model)


@pytest.mark.parametrize(("activation", "attributes"), [
    ("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.1}), ("Sigmoid", {}), ("Tanh", {}),
    ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4}),
])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_fused_gemm(activation: str, attributes: dict, trans_b: int) -> None:
    rng = np.random.default_rng(2)
    feeds = {"a": rng.standard_normal((5, 8)).astype(np.float32)}
    constants = {"b": rng.standard_normal((6, 8) if trans_b else (8, 6)).astype(np.float32),
                 "c": rng.standard_normal(6).astype(np.float32)}
    model = one_node("FusedGemm", feeds, constants, ["a", "b", "c"], activation=activation,
                     transB=trans_b, alpha=0.7, beta=0.5, **attributes)
    session = RuntimeSession(model)
    assert {entry["key"].split("/")[1] for entry in session.tuning_report()} == {"Gemm"}
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, feeds)[0], theirs.run(None, feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("build", [mobilenet_like, branches_like])
def test_quantized_model_saved_by_onnxruntime_matches_it(build: Any, tmp_path: Path) -> None:
    """A QDQ model after onnxruntime's optimizer: its QDQ groups become QLinearConv and the
    com.microsoft QLinear operators (QGemm for the head)."""
    rng = np.random.default_rng(3)
    samples = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(4)]
    model = _optimized_by_onnxruntime(quantize_static_model(build(), tmp_path, samples, "QDQ"), tmp_path)
    contrib = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert {"QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= contrib, contrib
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = RuntimeSession(model)
    last = next(n for n in reversed(model.graph.node) if n.op_type == "DequantizeLinear")
    step = float(next(onnx.numpy_helper.to_array(i) for i in model.graph.initializer
                      if i.name == last.input[1]))
    for x in samples[:2]:
        np.testing.assert_allclose(session.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0],
                                   rtol=0, atol=step * 1.0001)
