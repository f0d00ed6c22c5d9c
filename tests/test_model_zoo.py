"""Smoke test of ``benchmarks/model_zoo.py`` without torch.

Tiny models made with ``onnx.helper`` stand in for the exported architectures and go through
the script's own cache, timing and table code. No timing is asserted: the ratio columns must
hold positive finite numbers, the outputs must agree, and a model onnx_light cannot run must be
a row with its error. A tiny Conv model goes through onnxruntime's static quantizer as the
``*_int8`` entries do. Only the last test exports a real architecture, where torch is installed
(it is a benchmark-only extra, so CI skips it).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

pytest.importorskip("onnxruntime")

import model_zoo  # noqa: E402

WEIGHT = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
THREADS = (1, 2)


def tiny_model(op_type: str = "Relu", domain: str = "") -> onnx.ModelProto:
    """x (2x8) @ W (8x4), then ``op_type`` (of ``domain``)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node(op_type, ["y"], ["output"], domain=domain)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(WEIGHT, "w")])
    opsets = [helper.make_opsetid("", model_zoo.OPSET)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def tiny_spec(name: str = "tiny", **config) -> model_zoo.ModelSpec:
    def build(_config):
        raise AssertionError("the smoke test exports with onnx.helper, never with torch")

    feeds = lambda rng: {"x": rng.standard_normal((2, 8), dtype=np.float32)}  # noqa: E731
    return model_zoo.ModelSpec(name, "test", build, feeds, config)


class HelperExporter:
    """Writes ``tiny_model(op_type, domain)`` where the script would export with torch."""

    def __init__(self, op_type: str = "Relu", domain: str = "") -> None:
        self.op_type, self.domain, self.calls = op_type, domain, 0

    def __call__(self, spec, feeds, path: Path) -> None:
        assert list(feeds) == ["x"]
        self.calls += 1
        onnx.save(tiny_model(self.op_type, self.domain), str(path))


VERSIONS = {"torch": "2.14.1", "torchvision": "0.29.1", "transformers": "5.24.0"}


def test_the_cache_exports_once_per_model_versions_and_settings(tmp_path, monkeypatch):
    spec, export = tiny_spec(), HelperExporter()
    feeds = model_zoo.model_feeds(spec)
    path, exported = model_zoo.cached_model(spec, feeds, tmp_path, VERSIONS, export)
    assert exported and path.exists() and export.calls == 1 and path.name.startswith("tiny-")
    assert model_zoo.cached_model(spec, feeds, tmp_path, VERSIONS, export) == (path, False)
    assert export.calls == 1 and not list(tmp_path.glob("*.partial"))

    other_torch = model_zoo.cache_key(spec, {**VERSIONS, "torch": "2.13.0"})
    other_config = model_zoo.cache_key(tiny_spec(hidden_size=128), VERSIONS)
    monkeypatch.setitem(model_zoo.EXPORT_SETTINGS, "opset", model_zoo.OPSET + 1)
    other_settings = model_zoo.cache_key(spec, VERSIONS)
    assert len({path.name, other_torch, other_config, other_settings}) == 4


def test_a_corrupt_cached_file_is_exported_again(tmp_path):
    spec, export = tiny_spec(), HelperExporter()
    feeds = model_zoo.model_feeds(spec)
    (tmp_path / model_zoo.cache_key(spec, VERSIONS)).write_bytes(b"not a model")
    path, exported = model_zoo.cached_model(spec, feeds, tmp_path, VERSIONS, export)
    assert exported and export.calls == 1
    onnx.checker.check_model(onnx.load(str(path)))


def test_feeds_are_seeded():
    spec = model_zoo.MODELS["bert"]
    first, second = model_zoo.model_feeds(spec), model_zoo.model_feeds(spec)
    assert first["input_ids"].dtype == np.int64 and np.array_equal(first["input_ids"], second["input_ids"])
    assert first["input_ids"].max() < model_zoo.VOCAB


def _check_table(table: model_zoo._common.Table, rows: int) -> None:
    assert len(table.rows) == rows and all(len(row) == len(table.columns) for row in table.rows)
    for name in ("ratio 1t", "ratio 2t", "onnx_light t2/t1", "onnxruntime t2/t1"):
        assert name in table.ratios


def test_measure_times_both_runtimes_at_each_thread_count():
    model = tiny_model()
    feeds = model_zoo.model_feeds(tiny_spec())
    result = model_zoo.measure("tiny", model, feeds, THREADS, 2, model_zoo.real_models.Rounds(0))
    assert result.error is None and result.parameters == WEIGHT.size
    assert set(result.onnx_light) == set(result.onnxruntime) == set(THREADS)
    assert result.max_abs_diff is not None and result.max_abs_diff < 1e-5 and result.max_rel_diff < 1e-5
    table = model_zoo.table([result], THREADS, 2)
    _check_table(table, 1)
    for name in table.ratios:
        (value,) = table.column(name)
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (name, value)
    assert table.column("ratio 2t")[0] == pytest.approx(result.onnx_light[2] / result.onnxruntime[2])
    assert "| tiny |" in table.markdown()


def test_a_model_onnx_light_cannot_run_is_a_row_with_its_operators():
    # com.microsoft::Trilu: onnxruntime runs it, onnx_light's contrib kernels do not include it
    model = tiny_model("Trilu", "com.microsoft")
    feeds = model_zoo.model_feeds(tiny_spec())
    result = model_zoo.measure("contrib", model, feeds, THREADS, 1, model_zoo.real_models.Rounds(0))
    assert result.error == "unsupported: Trilu"
    assert not result.onnx_light and set(result.onnxruntime) == set(THREADS)
    assert result.max_abs_diff is None and result.ratio(1) is None
    table = model_zoo.table([result], THREADS, 1)
    _check_table(table, 1)
    row = table.markdown().splitlines()[-1]
    assert row.startswith("| contrib |") and "unsupported: Trilu" in row and "n/a" in row


def test_main_prints_the_table_and_writes_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(model_zoo, "MODELS", {"tiny": tiny_spec(), "broken": tiny_spec("broken")})
    export = HelperExporter()

    def exporter(spec, feeds, path):
        if spec.name == "broken":
            raise RuntimeError("Exporting the operator 'aten::diff' is not supported")
        export(spec, feeds, path)

    monkeypatch.setattr(model_zoo, "torch_export", exporter)
    argv = ["--models", "tiny", "broken", "--threads", "1", "2", "--rounds", "1",
            "--cache-dir", str(tmp_path / "cache"), "--json", str(tmp_path / "results.json")]
    assert model_zoo.main(argv) == 0
    out = capsys.readouterr().out
    assert "physical / logical cores" in out  # python -m onnx_light cpu
    assert "| tiny |" in out and "| broken |" in out
    assert "export: RuntimeError: Exporting the operator 'aten::diff'" in out
    rows = {row["name"]: row for row in json.loads((tmp_path / "results.json").read_text())}
    assert rows["tiny"]["error"] is None and set(rows["tiny"]["onnx_light"]) == {"1", "2"}
    assert rows["broken"]["error"].startswith("export:")

    assert model_zoo.main([*argv[:6], "--cache-dir", str(tmp_path / "cache"), "--export-only"]) == 0
    assert "- tiny: cached" in capsys.readouterr().out and export.calls == 1


CONV_WEIGHT = np.random.default_rng(2).standard_normal((4, 3, 3, 3)).astype(np.float32)


def conv_spec() -> model_zoo.ModelSpec:
    def build(_config):
        raise AssertionError("the smoke test exports with onnx.helper, never with torch")

    feeds = lambda rng: {"pixels": rng.standard_normal((1, 3, 8, 8), dtype=np.float32)}  # noqa: E731
    return model_zoo.ModelSpec("conv", "test", build, feeds)


def export_conv(spec, feeds, path: Path) -> None:
    """pixels (1x3x8x8) -> Conv 3x3 (4 filters) -> Relu."""
    assert list(feeds) == ["pixels"]
    nodes = [helper.make_node("Conv", ["pixels", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["y"], ["output"])]
    bias = np.linspace(-0.5, 0.5, 4, dtype=np.float32)
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(CONV_WEIGHT, "w"), numpy_helper.from_array(bias, "b")])
    opsets = [helper.make_opsetid("", model_zoo.OPSET)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), str(path))


def test_a_quantized_entry_is_made_from_the_cached_float_model(tmp_path, monkeypatch):
    versions = {**VERSIONS, "onnxruntime": "1.32.0"}
    float_spec = conv_spec()
    spec = model_zoo.int8_variant(float_spec)
    assert spec.name == "conv_int8" and spec.source is float_spec
    feeds = model_zoo.model_feeds(spec)
    path, exported = model_zoo.model_file(spec, feeds, tmp_path, versions, export_conv)
    float_path = tmp_path / model_zoo.cache_key(float_spec, versions)
    assert exported and float_path.exists() and path.name.startswith("conv_int8-")
    assert model_zoo.model_file(spec, feeds, tmp_path, versions, export_conv) == (path, False)

    model = onnx.load(str(path))
    ops = [node.op_type for node in model.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops and "Conv" in ops
    scales = [t for t in model.graph.initializer if t.name.startswith("w_") and t.name.endswith("scale")]
    assert [list(t.dims) for t in scales] == [[4]]  # per output channel
    activations = {t.name: t.data_type for t in model.graph.initializer if t.name.endswith("zero_point")}
    assert TensorProto.UINT8 in activations.values() and TensorProto.INT8 in activations.values()

    # the float model's key, onnxruntime's version and the settings all change the file
    keys = {path.name, float_path.name, model_zoo.cache_key(spec, {**versions, "onnxruntime": "1.31.0"}),
            model_zoo.cache_key(spec, {**versions, "torch": "2.13.0"})}
    monkeypatch.setitem(model_zoo.QUANTIZATION, "calibration_images", 8)
    keys.add(model_zoo.cache_key(spec, versions))
    assert len(keys) == 5
    assert model_zoo.cache_key(float_spec, versions) == float_path.name  # onnxruntime: not the float's key

    calibration = model_zoo.calibration_feeds(spec)
    assert len(calibration) == 8
    assert not any(np.array_equal(c["pixels"], feeds["pixels"]) for c in calibration)


def test_the_int8_table_sets_a_quantized_row_beside_its_float_row(tmp_path, monkeypatch):
    float_spec = conv_spec()
    spec = model_zoo.int8_variant(float_spec)
    monkeypatch.setattr(model_zoo, "MODELS", {"conv": float_spec, "conv_int8": spec})
    monkeypatch.setattr(model_zoo, "torch_export", export_conv)
    argv = ["--models", "conv", "conv_int8", "--threads", "1", "2", "--rounds", "1",
            "--cache-dir", str(tmp_path)]
    results = model_zoo.run(model_zoo.build_parser().parse_args(argv), model_zoo.real_models.Rounds(0),
                            log=lambda line: None)
    floats, int8 = results
    assert floats.error is None and int8.error is None
    # int8 against int8: onnxruntime's integer rounding may differ by a quantization step
    assert int8.max_rel_diff < 0.05
    table = model_zoo.int8_table(results, THREADS)
    assert table.column("model") == ["conv_int8"]
    for count in THREADS:
        assert table.column(f"onnx_light int8/float {count}t")[0] == pytest.approx(
            int8.onnx_light[count] / floats.onnx_light[count])
        assert table.column(f"onnxruntime int8/float {count}t")[0] == pytest.approx(
            int8.onnxruntime[count] / floats.onnxruntime[count])
        assert table.column(f"int8 ratio {count}t")[0] == pytest.approx(int8.ratio(count))
    assert model_zoo.int8_table([floats], THREADS) is None
    alone = model_zoo.int8_table([int8], THREADS)  # no float row in the run: n/a, not a crash
    assert alone.column("onnx_light int8/float 1t") == [None] and "| conv_int8 |" in alone.markdown()


def test_command_line_defaults():
    args = model_zoo.build_parser().parse_args([])
    assert args.threads == [1, 2] and args.models == list(model_zoo.MODELS) and not args.export_only
    assert {"bert", "distilbert", "gpt2", "llama", "vit", "mobilenet_v2", "mobilenet_v3_small",
            "efficientnet_b0", "shufflenet_v2", "resnet50", "mobilenet_v2_int8",
            "resnet50_int8"} <= set(model_zoo.MODELS)
    assert model_zoo.MODELS["resnet50_int8"].source is model_zoo.MODELS["resnet50"]


def test_a_real_architecture_exports_and_runs(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    spec = model_zoo.MODELS["shufflenet_v2"]
    feeds = model_zoo.model_feeds(spec)
    path, exported = model_zoo.cached_model(spec, feeds, tmp_path, model_zoo.package_versions())
    assert exported
    result = model_zoo.measure(spec.name, onnx.load(str(path)), feeds, (1,), 1,
                               model_zoo.real_models.Rounds(0))
    assert result.error is None and result.max_rel_diff < 1e-3
