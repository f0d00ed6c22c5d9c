"""BERT-style encoders from onnxruntime's tools against onnxruntime: dynamically quantized
(``quantize_dynamic``) and fused by its transformer optimizer (``optimize_model``, the
``com.microsoft`` fusions), and each fused operator on random inputs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import onnx_light
from onnx_light.runtime import RuntimeSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from contrib_models import bert_feeds, bert_like, decoder_like, one_node
from quantized_models import int8_weights, onnxruntime_saturates

ort = pytest.importorskip("onnxruntime")


def _theirs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_dynamically_quantized_encoder_matches_onnxruntime(tmp_path: Any) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source, quantized = tmp_path / "bert.onnx", tmp_path / "bert.dq.onnx"
    onnx.save(bert_like(), source)
    quantize_dynamic(str(source), str(quantized), weight_type=QuantType.QInt8,
                     reduce_range=onnxruntime_saturates())
    model = onnx.load(quantized)
    ops = {n.op_type for n in model.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops, ops
    rng = np.random.default_rng(0)
    session = RuntimeSession(model)
    for _ in range(2):
        feeds = bert_feeds(rng)
        (expected,) = _theirs(model, feeds)
        (actual,) = session.run(None, feeds)
        # Both quantize the activations alike (DynamicQuantizeLinear) and sum exactly: only
        # float32 rounding in the float parts differs.
        np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-4)


# ------------------------------------------------------------------ each fused operator on random inputs

B, S, H, N = 2, 5, 16, 4  # batch, sequence, hidden, heads


def _random(rng: np.random.Generator, *shape: int, dtype: Any = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _case(name: str, rng: np.random.Generator) -> tuple[str, dict, dict, list[str], list, dict]:
    """(op_type, feeds, constants, inputs, output types, attributes) of the case ``name``."""
    x, f = _random(rng, B, S, H), np.float32
    gamma, beta, bias = 1 + 0.1 * _random(rng, H), _random(rng, H), _random(rng, H)
    ids = {"ids": rng.integers(0, 20, (B, S)).astype(np.int32),
           "segments": rng.integers(0, 2, (B, S)).astype(np.int32)}
    tables = {"words": _random(rng, 20, H), "positions": _random(rng, S + 3, H),
              "segment_table": _random(rng, 2, H), "gamma": gamma, "beta": beta}
    qkv_weights, qkv_bias = _random(rng, H, 3 * H) * 0.3, _random(rng, 3 * H)
    lengths = np.array([S, S - 2], np.int32)
    raw_mask = (np.arange(S)[None, :] < lengths[:, None]).astype(np.int32)
    angles = np.arange(S + 4)[:, None] * 0.1 * np.arange(1, H // N // 2 + 1)[None, :]
    caches = {"cos": np.cos(angles).astype(f), "sin": np.sin(angles).astype(f)}
    cases: dict[str, tuple] = {
        "Gelu": ("Gelu", {"x": x}, {}, ["x"], [f], {}),
        "FastGelu": ("FastGelu", {"x": x}, {}, ["x"], [f], {}),
        "FastGelu-bias": ("FastGelu", {"x": x}, {"b": bias}, ["x", "b"], [f], {}),
        "BiasGelu": ("BiasGelu", {"x": x}, {"b": bias}, ["x", "b"], [f], {}),
        "QuickGelu": ("QuickGelu", {"x": x}, {}, ["x"], [f], {}),
        "QuickGelu-alpha": ("QuickGelu", {"x": x}, {}, ["x"], [f], {"alpha": 1.3}),
        "SkipLayerNormalization": (
            "SkipLayerNormalization", {"x": x, "skip": _random(rng, B, S, H)},
            {"gamma": gamma, "beta": beta, "b": bias}, ["x", "skip", "gamma", "beta", "b"], [f] * 4,
            {"epsilon": 1e-5}),
        "SkipLayerNormalization-broadcast": (
            "SkipLayerNormalization", {"x": x, "skip": _random(rng, S, H)}, {"gamma": gamma},
            ["x", "skip", "gamma"], [f], {}),
        "SkipSimplifiedLayerNormalization": (
            "SkipSimplifiedLayerNormalization", {"x": x, "skip": _random(rng, B, S, H)},
            {"gamma": gamma, "b": bias}, ["x", "skip", "gamma", "b"], [f] * 4, {"epsilon": 1e-6}),
        "EmbedLayerNormalization": (
            "EmbedLayerNormalization", {**ids, "mask": raw_mask}, tables,
            ["ids", "segments", "words", "positions", "segment_table", "gamma", "beta", "mask"],
            [f, np.int32, f], {"epsilon": 1e-5}),
        "EmbedLayerNormalization-positions": (
            "EmbedLayerNormalization", {"ids": ids["ids"], "position_ids": rng.integers(
                0, S + 3, (B, S)).astype(np.int32)}, tables,
            ["ids", "", "words", "positions", "", "gamma", "beta", "", "position_ids"], [f, np.int32], {}),
        "FusedMatMul": ("FusedMatMul", {"a": _random(rng, 3, 4, 5), "b": _random(rng, 3, 6, 5)}, {},
                        ["a", "b"], [f], {"alpha": 0.5, "transB": 1}),
        "FusedMatMul-transA": ("FusedMatMul", {"a": _random(rng, 5, 4), "b": _random(rng, 2, 5, 3)}, {},
                               ["a", "b"], [f], {"transA": 1}),
        "FusedMatMul-transBatch": (
            "FusedMatMul", {"a": _random(rng, 3, 2, 4, 5), "b": _random(rng, 2, 4, 5, 6)}, {},
            ["a", "b"], [f], {"transBatchA": 1}),
        "FusedMatMul-transBatchB": (
            "FusedMatMul", {"a": _random(rng, 2, 4, 3, 5), "b": _random(rng, 6, 2, 4, 5)}, {},
            ["a", "b"], [f], {"transBatchB": 1, "transB": 1, "alpha": 2.0}),
        "Attention": ("Attention", {"x": x}, {"w": qkv_weights, "b": qkv_bias}, ["x", "w", "b"], [f],
                      {"num_heads": N}),
        "Attention-lengths": ("Attention", {"x": x, "mask": lengths}, {"w": qkv_weights, "b": qkv_bias},
                              ["x", "w", "b", "mask"], [f], {"num_heads": N}),
        "Attention-raw-mask-unidirectional": (
            "Attention", {"x": x, "mask": raw_mask}, {"w": qkv_weights, "b": qkv_bias},
            ["x", "w", "b", "mask"], [f], {"num_heads": N, "unidirectional": 1}),
        "Attention-past-scale": (
            "Attention", {"x": x, "past": _random(rng, 2, B, N, 3, H // N)},
            {"w": qkv_weights, "b": qkv_bias}, ["x", "w", "b", "", "past"], [f, f],
            {"num_heads": N, "scale": 0.3}),
        "Attention-bias-unidirectional": (
            "Attention", {"x": x, "attention_bias": _random(rng, 1, N, S, S)},
            {"w": qkv_weights, "b": qkv_bias}, ["x", "w", "b", "", "", "attention_bias"], [f],
            {"num_heads": N, "unidirectional": 1}),
        "Attention-qkv-sizes": (
            "Attention", {"x": x}, {"w": _random(rng, H, 2 * H + 8), "b": _random(rng, 2 * H + 8)},
            ["x", "w", "b"], [f], {"num_heads": N, "qkv_hidden_sizes": [H, H, 8]}),
        "MultiHeadAttention": (
            "MultiHeadAttention", {"q": x, "k": _random(rng, B, S + 1, H), "v": _random(rng, B, S + 1, H)},
            {"b": qkv_bias}, ["q", "k", "v", "b"], [f], {"num_heads": N}),
        "MultiHeadAttention-mask-past": (
            "MultiHeadAttention", {"q": x, "k": _random(rng, B, S, H), "v": _random(rng, B, S, H),
                                   "mask": np.concatenate([raw_mask, np.ones((B, 2), np.int32)], 1),
                                   "past_k": _random(rng, B, N, 2, H // N),
                                   "past_v": _random(rng, B, N, 2, H // N)},
            {}, ["q", "k", "v", "", "mask", "", "past_k", "past_v"], [f, f, f], {"num_heads": N}),
        "MultiHeadAttention-unidirectional": (
            "MultiHeadAttention", {"q": x, "k": _random(rng, B, S, H), "v": _random(rng, B, S, H)}, {},
            ["q", "k", "v"], [f], {"num_heads": N, "unidirectional": 1}),
        "MultiHeadAttention-bnsh-kv-bias": (
            "MultiHeadAttention", {"q": x, "k": _random(rng, B, N, S + 2, H // N),
                                   "v": _random(rng, B, N, S + 2, H // N),
                                   "attention_bias": _random(rng, B, N, S, S + 2)},
            {}, ["q", "k", "v", "", "", "attention_bias"], [f], {"num_heads": N, "scale": 0.2}),
        "RotaryEmbedding": (
            "RotaryEmbedding", {"x": x, "positions": rng.integers(0, S + 4, (B, S)).astype(np.int64)},
            caches, ["x", "positions", "cos", "sin"], [f], {"num_heads": N}),
        "RotaryEmbedding-offset-interleaved": (
            "RotaryEmbedding", {"x": _random(rng, B, N, S, H // N), "positions": np.array([2], np.int64)},
            caches, ["x", "positions", "cos", "sin"], [f], {"interleaved": 1}),
    }
    return cases[name]


CASES = [
    "Gelu", "FastGelu", "FastGelu-bias", "BiasGelu", "QuickGelu", "QuickGelu-alpha",
    "SkipLayerNormalization", "SkipLayerNormalization-broadcast", "SkipSimplifiedLayerNormalization",
    "EmbedLayerNormalization", "EmbedLayerNormalization-positions", "FusedMatMul", "FusedMatMul-transA",
    "FusedMatMul-transBatch", "FusedMatMul-transBatchB", "Attention", "Attention-lengths",
    "Attention-raw-mask-unidirectional", "Attention-past-scale", "Attention-bias-unidirectional",
    "Attention-qkv-sizes", "MultiHeadAttention", "MultiHeadAttention-mask-past",
    "MultiHeadAttention-unidirectional",
    "MultiHeadAttention-bnsh-kv-bias", "RotaryEmbedding", "RotaryEmbedding-offset-interleaved",
]


@pytest.mark.parametrize("name", CASES)
def test_fused_operator_matches_onnxruntime(name: str) -> None:
    op_type, feeds, constants, inputs, outputs, attributes = _case(name, np.random.default_rng(0))
    model = one_node(op_type, feeds, constants, inputs, outputs, **attributes)
    expected = _theirs(model, feeds)
    actual = RuntimeSession(model).run(None, feeds)
    assert len(actual) == len(expected)
    for ours, theirs in zip(actual, expected, strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_bias_add_is_the_sum_of_its_inputs() -> None:
    """onnxruntime runs BiasAdd on CUDA only: numpy is the oracle."""
    rng = np.random.default_rng(1)
    feeds = {"x": _random(rng, B, S, H), "skip": _random(rng, B, S, H)}
    bias = _random(rng, H)
    model = one_node("BiasAdd", feeds, {"b": bias}, ["x", "b", "skip"])
    (actual,) = RuntimeSession(model).run(None, feeds)
    np.testing.assert_allclose(actual, feeds["x"] + bias + feeds["skip"], rtol=1e-6)


@pytest.mark.parametrize("bias", [False, True])
def test_packed_qkv_attends_as_separate_qkv(bias: bool) -> None:
    """onnxruntime's CPU MultiHeadAttention does not take packed QKV (batch, S, heads, 3, size):
    the oracle is onnxruntime on the same Q, K and V given apart."""
    rng = np.random.default_rng(2)
    packed = _random(rng, B, S, N, 3, H // N)
    constants = {"b": _random(rng, 3 * H)} if bias else {}
    ours = RuntimeSession(one_node("MultiHeadAttention", {"qkv": packed}, constants,
                                   ["qkv", "", "", *(["b"] if bias else [])], num_heads=N,
                                   unidirectional=1)).run(None, {"qkv": packed})[0]
    apart = {name: np.ascontiguousarray(packed[:, :, :, i]).reshape(B, S, H)
             for i, name in enumerate("qkv")}
    model = one_node("MultiHeadAttention", apart, constants, ["q", "k", "v", *(["b"] if bias else [])],
                     num_heads=N, unidirectional=1)
    np.testing.assert_allclose(ours, _theirs(model, apart)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("rms", "disabled", "fusions"), [
    (False, (), {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"}),
    (False, ("embed_layer_norm", "bias_gelu", "skip_layer_norm"), {"Attention", "Gelu"}),
    (True, (), {"SkipSimplifiedLayerNormalization", "BiasGelu"}),
    # SimplifiedLayerNormalization is written in the default domain (onnxruntime's extension)
    (True, ("skip_layer_norm",), {"BiasGelu", "SimplifiedLayerNormalization"}),
])
def test_encoder_fused_by_the_transformer_optimizer_matches_onnxruntime(
        rms: bool, disabled: tuple[str, ...], fusions: set[str], tmp_path: Any) -> None:
    """The optimizer's fusions of the encoder (with LayerNormalization, or RMS normalization
    as in LLaMA-style models) against onnxruntime on the fused model and on the original."""
    pytest.importorskip("sympy")  # the optimizer's symbolic shape inference
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    for name in disabled:
        setattr(options, f"enable_{name}", False)

    source, target = tmp_path / "bert.onnx", tmp_path / "bert.fused.onnx"
    float_model = bert_like(rms=rms)
    onnx.save(float_model, source)
    optimize_model(str(source), model_type="bert", num_heads=4, hidden_size=64, opt_level=0,
                   optimization_options=options).save_model_to_file(str(target))
    optimized = onnx.load(target)
    fused = {n.op_type for n in optimized.graph.node if n.domain == "com.microsoft"
             or n.op_type == "SimplifiedLayerNormalization"}
    assert fusions <= fused, fused
    session = RuntimeSession(optimized)
    assert all(kernel.element_type is not None for kernel, _, _ in session._steps)
    rng = np.random.default_rng(3)
    for _ in range(2):
        feeds = bert_feeds(rng)
        (actual,) = session.run(None, feeds)
        np.testing.assert_allclose(actual, _theirs(optimized, feeds)[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(actual, _theirs(float_model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("axis", "outputs"), [(-1, 1), (-1, 2), (1, 2)])
def test_simplified_layer_normalization_in_the_default_domain(axis: int, outputs: int) -> None:
    """onnxruntime registers SimplifiedLayerNormalization in the default domain, where onnx
    has no such operator: the session runs it as the contrib kernel, the caller's model kept."""
    rng = np.random.default_rng(4)
    x = _random(rng, B, S, H)
    scale = (1 + 0.1 * _random(rng, *x.shape[axis:])).astype(np.float32)
    model = one_node("SimplifiedLayerNormalization", {"x": x}, {"scale": scale}, ["x", "scale"],
                     [np.float32] * outputs, axis=axis, epsilon=1e-5)
    model.graph.node[0].domain = ""
    del model.opset_import[1:]  # the default domain alone
    before = model.SerializeToString()
    actual = RuntimeSession(model).run(None, {"x": x})
    assert model.SerializeToString() == before
    expected = _theirs(model, {"x": x})
    for ours, theirs in zip(actual, expected, strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def _half(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in arrays.items()}


def _widened(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in arrays.items()}


@pytest.mark.parametrize("name", ["Gelu", "FastGelu-bias", "BiasGelu", "QuickGelu",
                                  "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
                                  "EmbedLayerNormalization", "FusedMatMul", "Attention-lengths",
                                  "MultiHeadAttention", "RotaryEmbedding"])
def test_float16_computes_in_float32_and_rounds_once(name: str) -> None:
    """float16 tensors give onnxruntime's float32 results (on the same values) rounded to
    float16: computed in float32, rounded once. The skip normalizations' mean and inverse
    deviation outputs stay float32, as onnxruntime's schema types them."""
    op_type, feeds, constants, inputs, outputs, attributes = _case(name, np.random.default_rng(5))
    feeds, constants = _half(feeds), _half(constants)
    statistics = {1, 2} if op_type.startswith("Skip") else set()
    halves = [np.float16 if t == np.float32 and i not in statistics else t for i, t in enumerate(outputs)]
    ours = RuntimeSession(one_node(op_type, feeds, constants, inputs, halves, **attributes)).run(None, feeds)
    wide = _widened(feeds)
    theirs = _theirs(one_node(op_type, wide, _widened(constants), inputs, outputs, **attributes), wide)
    for actual, expected, dtype in zip(ours, theirs, halves, strict=True):
        assert actual.shape == expected.shape and actual.dtype == dtype
        np.testing.assert_allclose(actual.astype(expected.dtype), expected, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(("op_type", "feeds", "inputs", "attributes", "message"), [
    ("Attention", {"x": np.zeros((1, 2, 8), np.float32), "w": np.zeros((8, 24), np.float32)},
     ["x", "w"], {}, "num_heads must be positive"),
    ("Attention", {"x": np.zeros((1, 2, 8), np.float32), "w": np.zeros((8, 24), np.float32),
                   "bias": np.zeros((1, 2, 5, 5), np.float32)},
     ["x", "w", "", "", "", "bias"], {"num_heads": 2}, r"attention_bias \(\[1, 2, 5, 5\]\) must broadcast"),
    ("Attention", {"x": np.zeros((1, 2, 8), np.float32), "w": np.zeros((8, 24), np.float32),
                   "mask": np.ones((3, 3), np.int32)},
     ["x", "w", "", "mask"], {"num_heads": 2}, "the mask of shape"),
    ("MultiHeadAttention", {"q": np.zeros((1, 2, 8), np.float32)}, ["q"], {"num_heads": 2},
     "key is required"),
    ("SkipLayerNormalization", {"x": np.zeros((1, 2, 8), np.float32), "skip": np.zeros((2, 2, 8), np.float32),
                                "gamma": np.ones(8, np.float32)}, ["x", "skip", "gamma"], {},
     "skip of its shape"),
    ("FusedMatMul", {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.float32)}, ["a", "b"], {},
     "cannot multiply"),
])
def test_bad_inputs_name_the_node(op_type: str, feeds: dict, inputs: list[str], attributes: dict,
                                  message: str) -> None:
    with pytest.raises(ValueError, match=rf"node 'node' \({op_type}\): .*{message}"):
        RuntimeSession(one_node(op_type, feeds, {}, inputs, **attributes)).run(None, feeds)


# ------------------------------------------------------------------ the dynamic quantizer's forms


@pytest.mark.parametrize(("weight_type", "per_column", "mask", "unidirectional"), [
    (np.int8, False, False, 0), (np.uint8, False, True, 0), (np.int8, True, True, 1),
])
def test_qattention_matches_onnxruntime(weight_type: Any, per_column: bool, mask: bool,
                                        unidirectional: int) -> None:
    rng = np.random.default_rng(6)
    info = np.iinfo(weight_type)
    feeds = {"x": rng.integers(0, 256, (B, S, H)).astype(np.uint8)}
    constants = {
        "w": int8_weights(rng, (H, 3 * H)) if weight_type == np.int8
        else rng.integers(info.min, info.max + 1, (H, 3 * H)).astype(weight_type),
        "b": _random(rng, 3 * H), "x_scale": np.float32(0.02),
        "w_scale": (rng.uniform(0.001, 0.004, 3 * H) if per_column else np.array(0.003)).astype(np.float32),
        "x_zero": np.uint8(120),
        "w_zero": (np.full(3 * H, 3) if per_column else np.array(3)).astype(weight_type)}
    if mask:
        feeds["mask"] = np.array([S, S - 2], np.int32)
    inputs = ["x", "w", "b", "x_scale", "w_scale", "mask" if mask else "", "x_zero", "w_zero"]
    model = one_node("QAttention", feeds, constants, inputs, num_heads=N, unidirectional=unidirectional)
    (actual,) = RuntimeSession(model).run(None, feeds)
    (expected,) = _theirs(model, feeds)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qembed_layer_normalization_matches_onnxruntime(dtype: Any) -> None:
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    feeds = {"ids": rng.integers(0, 20, (B, S)).astype(np.int32),
             "segments": rng.integers(0, 2, (B, S)).astype(np.int32),
             "mask": np.array([[1] * S, [1] * (S - 2) + [0, 0]], np.int32)}
    tables = {"words": (20, H), "positions": (S + 3, H), "segment_table": (2, H), "gamma": (H,), "beta": (H,)}
    constants: dict[str, np.ndarray] = {}
    for name, shape in tables.items():
        constants[name] = rng.integers(info.min, info.max + 1, shape).astype(dtype)
        constants[f"{name}_scale"] = np.float32(rng.uniform(0.005, 0.02))
        constants[f"{name}_zero"] = np.asarray(rng.integers(info.min // 2, info.max // 2), dtype)
    inputs = ["ids", "segments", *tables, "mask", *(f"{n}_scale" for n in tables),
              *(f"{n}_zero" for n in tables)]
    model = one_node("QEmbedLayerNormalization", feeds, constants, inputs, [np.float32, np.int32],
                     epsilon=1e-5)
    actual = RuntimeSession(model).run(None, feeds)
    expected = _theirs(model, feeds)
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(actual[1], expected[1])


def test_fused_then_dynamically_quantized_encoder_matches_onnxruntime(tmp_path: Any) -> None:
    """onnxruntime's recipe for a quantized BERT: the transformer optimizer, then
    ``quantize_dynamic`` (QAttention, QEmbedLayerNormalization, MatMulInteger)."""
    pytest.importorskip("sympy")
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    source, fused, quantized = (tmp_path / f"bert{suffix}.onnx" for suffix in ("", ".fused", ".dq"))
    onnx.save(bert_like(), source)
    optimize_model(str(source), model_type="bert", num_heads=4, hidden_size=64,
                   opt_level=0).save_model_to_file(str(fused))
    quantize_dynamic(str(fused), str(quantized), weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
                     reduce_range=onnxruntime_saturates())
    model = onnx.load(quantized)
    contrib = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert {"QAttention", "QEmbedLayerNormalization", "SkipLayerNormalization"} <= contrib, contrib
    session = RuntimeSession(model)
    assert all(kernel.element_type is not None for kernel, _, _ in session._steps)
    rng = np.random.default_rng(8)
    for _ in range(2):
        feeds = bert_feeds(rng)
        (actual,) = session.run(None, feeds)
        np.testing.assert_allclose(actual, _theirs(model, feeds)[0], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ GroupQueryAttention


def _gqa_case(rng: np.random.Generator, batch: int, length: int, past: int, lengths: list[int],
              packed: bool = False, rotary: int = 0, total: int | None = None,
              **attributes: Any) -> tuple[onnx.ModelProto, dict]:
    """One GroupQueryAttention node: a past buffer of ``past`` entries, ``total_sequence_length``
    ``total`` (by default ``past + length``)."""
    total = past + length if total is None else total
    heads, kv_heads = 4, 2
    size = 32 if rotary else 8  # onnxruntime rotates heads of a multiple of 16 features only
    feeds: dict[str, np.ndarray] = {}
    if packed:
        feeds["q"] = _random(rng, batch, length, (heads + 2 * kv_heads) * size)
        inputs = ["q", "", ""]
    else:
        feeds.update(q=_random(rng, batch, length, heads * size),
                     k=_random(rng, batch, length, kv_heads * size),
                     v=_random(rng, batch, length, kv_heads * size))
        inputs = ["q", "k", "v"]
    if past:
        feeds.update(past_k=_random(rng, batch, kv_heads, past, size),
                     past_v=_random(rng, batch, kv_heads, past, size))
    inputs += ["past_k", "past_v"] if past else ["", ""]
    constants = {"seqlens": np.array([n - 1 for n in lengths], np.int32),
                 "total": np.array(total, np.int32)}
    inputs += ["seqlens", "total"]
    if rotary:
        positions = np.arange(max(past, total) + length + 2)
        angles = positions[:, None] * 0.3 / np.arange(1, rotary // 2 + 1)[None, :]
        constants.update(cos=np.cos(angles).astype(np.float32), sin=np.sin(angles).astype(np.float32))
        inputs += ["cos", "sin"]
        attributes["do_rotary"] = 1
    model = one_node("GroupQueryAttention", feeds, constants, inputs, [np.float32] * 3,
                     num_heads=heads, kv_num_heads=kv_heads, **attributes)
    return model, feeds


@pytest.mark.parametrize(("batch", "length", "past", "lengths", "options"), [
    (1, 6, 0, [6], {}),
    (2, 6, 0, [6, 4], {}),  # the second prompt padded at its end
    (2, 6, 0, [6, 6], {"packed": True, "scale": 0.3}),
    (2, 1, 5, [6, 6], {}),
    (1, 3, 4, [7], {"rotary": 32}),
    (1, 3, 4, [7], {"rotary": 16, "rotary_interleaved": 1}),
    (1, 6, 0, [6], {"softcap": 2.0, "local_window_size": 3}),
    # a shared buffer of the maximal length: sequences of a batch at their own lengths
    (2, 1, 6, [4, 6], {"total": 6}),
    (2, 1, 8, [3, 7], {"total": 7, "rotary": 32}),
    (2, 1, 4, [4, 5], {"total": 5}),  # a buffer shorter than the total: the present grows
    (2, 3, 6, [2, 3], {"total": 3}),  # the first prompt, padded, into a buffer
    (1, 2, 6, [5], {"total": 5, "local_window_size": 2}),  # a later prompt of two tokens
])
def test_group_query_attention_matches_onnxruntime(batch: int, length: int, past: int,
                                                   lengths: list[int], options: dict) -> None:
    """Prompt (padded or not, packed QKV) and decoding steps with a cache, grouped heads (4
    query heads on 2 key-value heads), full and partial rotary, softcap, a local window, and
    onnxruntime's shared past/present buffers with sequences of different lengths."""
    model, feeds = _gqa_case(np.random.default_rng(9), batch, length, past, lengths, **options)
    actual = RuntimeSession(model).run(None, feeds)
    expected = _theirs(model, feeds)
    for ours, theirs in zip(actual, expected, strict=True):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_group_query_attention_runs_a_padded_batch_of_later_prompts_as_each_alone() -> None:
    """onnxruntime takes a later prompt of several tokens for one sequence only; a batch of
    them at their own cache lengths gives what each sequence gives alone."""
    lengths = [5, 7]
    model, feeds = _gqa_case(np.random.default_rng(12), 2, 2, 6, lengths, total=7, rotary=32)
    together = RuntimeSession(model).run(None, feeds)
    for b, n in enumerate(lengths):
        alone, _ = _gqa_case(np.random.default_rng(12), 1, 2, 6, [n], total=7, rotary=32)
        alone_feeds = {name: value[b:b + 1] for name, value in feeds.items()}
        for ours, single in zip(together, RuntimeSession(alone).run(None, alone_feeds), strict=True):
            np.testing.assert_allclose(ours[b:b + 1], single, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("lengths", "total", "message"), [
    ([6, 0], 6, r"with S = 1 new tokens, a past buffer of 5 and total_sequence_length 6"),
    ([6, 7], 6, r"\(\[6, 7\]\) must be within S\.\.S \+ 5 and at most 6"),
])
def test_group_query_attention_refuses_lengths_its_cache_cannot_hold(lengths: list[int], total: int,
                                                                     message: str) -> None:
    model, feeds = _gqa_case(np.random.default_rng(10), 2, 1, 5, lengths, total=total)
    with pytest.raises(ValueError, match=r"node 'node' \(GroupQueryAttention\): .*" + message):
        RuntimeSession(model).run(None, feeds)


def test_decoder_with_a_key_value_cache_matches_onnxruntime() -> None:
    """A LLaMA-style decoder as onnxruntime's model builder writes one (4-bit MatMulNBits,
    GroupQueryAttention with rotary embeddings, RMS normalizations): the prompt, then two
    decoding steps fed the present keys and values of the step before, each against
    onnxruntime given the same feeds."""
    model = decoder_like()
    session = RuntimeSession(model)
    assert all(kernel.element_type is not None for kernel, _, _ in session._steps)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    batch, length = 2, 5
    names = [info.name for info in model.graph.output]
    cache = {name.replace("present", "past_key_values"): np.zeros((batch, 2, 0, 16), np.float32)
             for name in names[1:]}
    for step in range(3):
        total = length + step
        tokens = length if step == 0 else 1
        feeds = {"input_ids": rng.integers(0, 50, (batch, tokens)).astype(np.int64),
                 "seqlens_k": np.full(batch, total - 1, np.int32),
                 "total_sequence_length": np.array(total, np.int32), **cache}
        actual, expected = session.run(None, feeds), theirs.run(None, feeds)
        for ours, reference in zip(actual, expected, strict=True):
            assert ours.shape == reference.shape
            np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5)
        cache = {name.replace("present", "past_key_values"): value
                 for name, value in zip(names[1:], expected[1:], strict=True)}


@pytest.mark.parametrize("opset", [12, 16])
def test_layer_normalization_below_opset_17_runs_as_onnxruntime_runs_it(opset: int) -> None:
    """onnxruntime runs LayerNormalization (which the transformer optimizer writes) at any
    opset; onnx defines it from 17 only."""
    rng = np.random.default_rng(13)
    x = _random(rng, B, S, H)
    constants = {"scale": 1 + 0.1 * _random(rng, H), "bias": _random(rng, H)}
    model = one_node("LayerNormalization", {"x": x}, constants, ["x", "scale", "bias"],
                     [np.float32] * 3, axis=-1, epsilon=1e-5)
    model.graph.node[0].domain = ""
    del model.opset_import[:]
    model.opset_import.append(onnx.helper.make_opsetid("", opset))
    actual, expected = RuntimeSession(model).run(None, {"x": x}), _theirs(model, {"x": x})
    for ours, theirs in zip(actual, expected, strict=True):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("isolated_tuning")
@pytest.mark.parametrize("name", ["BiasGelu", "FastGelu"])
def test_gelu_nodes_are_tuned_as_onnx_gelu(name: str) -> None:
    """A value published for ONNX Gelu before the session is built configures the node's
    kernel and shows in the tuning report with its source."""
    published = {"parallel.minimum_elements": 4321}
    onnx_light.set_kernel_tuning_parameters("Gelu", "float", published, num_threads=2, persist=False)
    op_type, feeds, constants, inputs, outputs, attributes = _case(name, np.random.default_rng(0))
    model = one_node(op_type, feeds, constants, inputs, outputs, **attributes)
    session = RuntimeSession(model, num_threads=2)
    (step,) = session._plan
    assert step.run.__self__.gelu.minimum_elements == 4321
    (entry,) = session.tuning_report()
    assert entry["key"].startswith("onnx_light/Gelu/") and entry["source"] == "published_profile"
    assert entry["values"] == published
