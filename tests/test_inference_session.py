"""onnx_light.InferenceSession against onnxruntime: the same script, run with either module.

Each ``_script_*`` function takes the runtime module (``onnxruntime`` or ``onnx_light``) and
does what an onnxruntime user's script does; the tests run it with both and compare outputs,
metadata, provider behaviour, profile files and the optimized models (loaded by
onnxruntime).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_light

ort = pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _common import real_models  # noqa: E402

RUNTIMES = {"onnxruntime": ort, "onnx_light": onnx_light}
LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
EVENT_KEYS = {"cat", "pid", "tid", "dur", "ts", "ph", "name", "args"}


def _conv_model() -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu, times a folded constant (c + c), with metadata."""
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((4, 3, 3, 3)), "b": rng.standard_normal(4),
              "scale": rng.uniform(0.5, 1.5, 4), "bias": rng.standard_normal(4),
              "mean": rng.standard_normal(4), "var": rng.uniform(0.5, 1.5, 4),
              "c": rng.standard_normal((1, 4, 1, 1))}
    initializers = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["conv", "scale", "bias", "mean", "var"],
                              ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["relu"], name="relu"),
             helper.make_node("Add", ["c", "c"], ["cc"], name="double"),
             helper.make_node("Mul", ["relu", "cc"], ["y"], name="scale_by_cc")]
    graph = helper.make_graph(
        nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])], initializers,
        doc_string="graph doc")
    model = helper.make_model(graph, producer_name="maker", producer_version="2.0", domain="dom",
                              model_version=7, doc_string="model doc",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"author": "me", "licence": "none"})
    return model


X = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)


def _session(rt, source, **options):
    so = rt.SessionOptions()
    so.intra_op_num_threads = 1
    for name, value in options.items():
        setattr(so, name, value)
    return rt.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def _script_basics(rt, source: bytes) -> dict:
    session = _session(rt, source)
    meta = session.get_modelmeta()
    return {
        "providers": session.get_providers(),
        "provider_options": session.get_provider_options(),
        "available": "CPUExecutionProvider" in rt.get_available_providers(),
        "meta": {name: getattr(meta, name) for name in (
            "producer_name", "graph_name", "domain", "description", "graph_description",
            "version", "custom_metadata_map")},
        "inputs": [(a.name, a.type, a.shape) for a in session.get_inputs()],
        "outputs": [(a.name, a.type, a.shape) for a in session.get_outputs()],
        "overridable": session.get_overridable_initializers(),
        "y": session.run(None, {"x": X})[0],
        "y_named": session.run(["y"], {"x": X}, rt.RunOptions())[0],
    }


def test_the_same_script_gives_the_same_results():
    source = _conv_model().SerializeToString()
    ours, theirs = (_script_basics(RUNTIMES[name], source) for name in ("onnx_light", "onnxruntime"))
    for name in ("y", "y_named"):
        np.testing.assert_allclose(ours.pop(name), theirs.pop(name), rtol=1e-5, atol=1e-5)
    assert ours == theirs
    assert ours["meta"]["custom_metadata_map"] == {"author": "me", "licence": "none"}


def test_paths_bytes_and_model_protos_load(tmp_path):
    model = _conv_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    expected = onnx_light.InferenceSession(str(path)).run(None, {"x": X})[0]
    for source in (path, model.SerializeToString(), model):  # a ModelProto: onnx_light only
        np.testing.assert_array_equal(onnx_light.InferenceSession(source).run(None, {"x": X})[0],
                                      expected)
    with pytest.raises(FileNotFoundError, match="no ONNX model file"):
        onnx_light.InferenceSession(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="not a serialized ONNX model"):
        onnx_light.InferenceSession(b"garbage")
    with pytest.raises(TypeError, match="unexpected keyword"):
        onnx_light.InferenceSession(path, provider=["CPUExecutionProvider"])


def _script_providers(rt, source: bytes, providers) -> tuple[list[str], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = rt.InferenceSession(source, providers=providers)
    return session.get_providers(), [str(w.message) for w in caught]


@pytest.mark.parametrize("providers", [
    ["CUDAExecutionProvider", "CPUExecutionProvider"], ["CUDAExecutionProvider"],
    ["NoSuchExecutionProvider"], ["CPUExecutionProvider"], [("CPUExecutionProvider", {})], None])
def test_providers_fall_back_to_the_cpu_with_a_warning_as_onnxruntime_does(providers, capfd):
    source = _conv_model().SerializeToString()
    ours, ours_warned = _script_providers(onnx_light, source, providers)
    theirs, theirs_warned = _script_providers(ort, source, providers)
    capfd.readouterr()  # onnxruntime prints its fallback to stdout
    assert ours == theirs == ["CPUExecutionProvider"]
    assert len(ours_warned) == len(theirs_warned)
    unavailable = [p for p in providers or [] if isinstance(p, str) and p != "CPUExecutionProvider"]
    for name, message in zip(unavailable, ours_warned, strict=True):
        assert f"'{name}'" in message and "Available providers: 'CPUExecutionProvider'" in message


def test_provider_arguments_that_cannot_mean_anything_are_refused():
    source = _conv_model().SerializeToString()
    with pytest.raises(TypeError, match="list of names"):
        onnx_light.InferenceSession(source, providers="CPUExecutionProvider")
    with pytest.raises(ValueError, match="same length"):
        onnx_light.InferenceSession(source, providers=["CPUExecutionProvider"],
                                    provider_options=[{}, {}])


def _script_profile(rt, source: bytes, prefix: str) -> tuple[str, list[dict], str]:
    session = _session(rt, source, enable_profiling=True, profile_file_prefix=prefix,
                       graph_optimization_level=rt.GraphOptimizationLevel.ORT_DISABLE_ALL)
    for _ in range(2):
        session.run(None, {"x": X})
    name = session.end_profiling()
    return name, json.loads(Path(name).read_text()), session.end_profiling()


def test_profile_files_have_onnxruntimes_structure(tmp_path):
    source = _conv_model().SerializeToString()
    results = {rt: _script_profile(RUNTIMES[rt], source, str(tmp_path / rt)) for rt in RUNTIMES}
    shapes = {}
    for rt, (name, events, again) in results.items():
        assert re.fullmatch(re.escape(str(tmp_path / rt)) + r"_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{3}\.json",
                            name)
        assert again == ""
        assert all(set(e) == EVENT_KEYS and e["ph"] == "X" for e in events)
        assert all(isinstance(e[k], int) for e in events for k in ("pid", "tid", "dur", "ts"))
        nodes = [e for e in events if e["cat"] == "Node"]
        shapes[rt] = {
            "session": sorted({e["name"] for e in events if e["cat"] == "Session"}
                              & {"model_loading_array", "session_initialization", "model_run"}),
            "runs": sum(e["name"] == "model_run" for e in events),
            "nodes": sorted((e["name"], e["args"]["op_name"], e["args"]["provider"]) for e in nodes),
        }
    assert shapes["onnx_light"] == shapes["onnxruntime"]
    assert shapes["onnx_light"]["runs"] == 2
    assert len(shapes["onnx_light"]["nodes"]) == 2 * 5  # every node: nothing folded or fused


def _node_ops(session) -> list[str]:
    """The op types a profiled run of ``session`` ran."""
    session.run(None, {"x": X})
    events = json.loads(Path(session.end_profiling()).read_text())
    return sorted(e["args"]["op_name"] for e in events if e["cat"] == "Node")


def test_optimization_levels_fold_then_fuse(tmp_path):
    source = _conv_model().SerializeToString()
    ops = {level: _node_ops(_session(onnx_light, source, enable_profiling=True,
                                     profile_file_prefix=str(tmp_path / level),
                                     graph_optimization_level=getattr(
                                         onnx_light.GraphOptimizationLevel, level)))
           for level in LEVELS}
    assert ops["ORT_DISABLE_ALL"] == ["Add", "BatchNormalization", "Conv", "Mul", "Relu"]
    assert ops["ORT_ENABLE_BASIC"] == ["BatchNormalization", "Conv", "Mul", "Relu"]
    assert len(ops["ORT_ENABLE_EXTENDED"]) < 4 and ops["ORT_ENABLE_ALL"] == ops["ORT_ENABLE_EXTENDED"]


@pytest.mark.parametrize("level", LEVELS)
def test_the_optimized_model_runs_on_onnxruntime_with_the_same_outputs(level, tmp_path):
    source = _conv_model().SerializeToString()
    written = {}
    for name, rt in RUNTIMES.items():
        path = tmp_path / f"{name}.onnx"
        session = _session(rt, source, optimized_model_filepath=str(path),
                           graph_optimization_level=getattr(rt.GraphOptimizationLevel, level))
        written[name] = (path, session.run(None, {"x": X})[0])
    path, ours = written["onnx_light"]
    reloaded = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(reloaded.run(None, {"x": X})[0], written["onnxruntime"][1],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours, written["onnxruntime"][1], rtol=1e-5, atol=1e-5)
    ops = [n.op_type for n in onnx.load(path).graph.node]
    assert ops == (["Conv", "BatchNormalization", "Relu", "Add", "Mul"] if level == "ORT_DISABLE_ALL"
                   else ["Conv", "BatchNormalization", "Relu", "Mul"])  # the Add is folded
    if level != "ORT_DISABLE_ALL":  # onnxruntime folds the same node (and more: Conv + BN)
        assert "Add" not in {n.op_type for n in onnx.load(written["onnxruntime"][0]).graph.node}


def test_a_real_model_runs_folded_and_written_as_onnxruntime_runs_it(tmp_path):
    """SqueezeNet (ONNX's light model, made IR 4 so that its ConstantOfShape weights fold)."""
    model = onnx.load(real_models.model_path("squeezenet"))
    initializers = {t.name for t in model.graph.initializer}
    kept = [i for i in model.graph.input if i.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.ir_version = 4
    name, x = real_models.model_input(model)
    source = model.SerializeToString()
    path = tmp_path / "squeezenet.onnx"
    ours = _session(onnx_light, source, optimized_model_filepath=str(path))
    expected = _session(ort, source).run(None, {name: x})[0]
    np.testing.assert_allclose(ours.run(None, {name: x})[0], expected, rtol=1e-3, atol=1e-6)
    written = onnx.load(path)
    assert "ConstantOfShape" not in {n.op_type for n in written.graph.node}
    assert len(written.graph.node) < len(model.graph.node)
    np.testing.assert_allclose(_session(ort, str(path)).run(None, {name: x})[0], expected,
                               rtol=1e-3, atol=1e-6)


def test_runs_from_eight_threads_equal_serial_runs_bitwise():
    model = real_models.with_random_weights(onnx.load(real_models.model_path("squeezenet")))
    so = onnx_light.SessionOptions()
    so.intra_op_num_threads = 2
    so.execution_mode = onnx_light.ExecutionMode.ORT_PARALLEL
    session = onnx_light.InferenceSession(model.SerializeToString(), so)
    name, x = real_models.model_input(model)
    feeds = [{name: (x * (1 + i / 8)).astype(np.float32)} for i in range(8)]
    serial = [session.run(None, feed)[0] for feed in feeds]
    results, errors = [None] * 8, []

    def work(index: int) -> None:
        try:
            results[index] = [session.run(None, feeds[index])[0] for _ in range(3)]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for expected, runs in zip(serial, results, strict=True):
        assert all(np.array_equal(run, expected) for run in runs)


def test_session_options_have_onnxruntimes_defaults_and_refuse_typos():
    ours, theirs = onnx_light.SessionOptions(), ort.SessionOptions()
    for name in onnx_light.inference_session.SESSION_DEFAULTS:
        if name != "profile_file_prefix":
            assert int(getattr(ours, name)) == int(getattr(theirs, name)) if name in (
                "execution_mode", "graph_optimization_level") else (
                getattr(ours, name) == getattr(theirs, name)), name
    for rt in RUNTIMES.values():
        for options in (rt.SessionOptions(), rt.RunOptions()):
            with pytest.raises(AttributeError, match="has no attribute"):
                options.intra_op_num_thread = 2
            with pytest.raises(AttributeError):
                options.terminat = True
    with pytest.raises(TypeError, match="intra_op_num_threads must be int"):
        ours.intra_op_num_threads = "2"
    with pytest.raises(TypeError, match="GraphOptimizationLevel"):
        ours.graph_optimization_level = 1
    with pytest.raises(AttributeError, match="did you mean 'intra_op_num_threads'"):
        ours.intra_op_num_thread = 2
    ours.add_session_config_entry("session.load_model_format", "ONNX")
    assert ours.get_session_config_entry("session.load_model_format") == "ONNX"


@pytest.fixture
def light_logger():
    logger = logging.getLogger("onnx_light")
    level = logger.level
    yield logger
    logger.setLevel(level)


def test_terminate_stops_a_run_between_nodes(light_logger):
    session = _session(onnx_light, _conv_model().SerializeToString(),
                       graph_optimization_level=onnx_light.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options = onnx_light.RunOptions()
    options.terminate = True
    with pytest.raises(onnx_light.RunTerminatedError, match="not started"):
        session.run(None, {"x": X}, options)

    class TerminateAfterFirstNode(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            options.terminate = True  # as another thread would, while the run is under way

    options = onnx_light.RunOptions()
    options.log_severity_level = 0  # verbose: one record per node
    options.logid = "tagged"
    handler = TerminateAfterFirstNode()
    light_logger.setLevel(logging.DEBUG)
    light_logger.addHandler(handler)
    try:
        with pytest.raises(onnx_light.RunTerminatedError, match="'tagged' terminated before node 'bn'"):
            session.run(None, {"x": X}, options)
    finally:
        light_logger.removeHandler(handler)
    assert session.run(None, {"x": X}, onnx_light.RunOptions())[0].shape == (2, 4, 8, 8)


def test_log_severity_levels_map_to_the_onnx_light_logger(light_logger):
    source = _conv_model().SerializeToString()
    _session(onnx_light, source, log_severity_level=3)
    assert light_logger.level == logging.ERROR
    with pytest.raises(ValueError, match="log_severity_level must be -1"):
        _session(onnx_light, source, log_severity_level=7)
    options = onnx_light.RunOptions()
    options.log_severity_level = 5
    with pytest.raises(ValueError, match=r"RunOptions\.log_severity_level"):
        _session(onnx_light, source).run(None, {"x": X}, options)


def test_the_runtimes_errors_are_importable_from_onnx_light():
    session = onnx_light.InferenceSession(_conv_model().SerializeToString())
    with pytest.raises(onnx_light.InvalidInputError, match="expected element type tensor"):
        session.run(None, {"x": X.astype(np.float64)})
    with pytest.raises(onnx_light.InvalidInputError, match="unknown output"):
        session.run(["nope"], {"x": X})
    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(onnx_light.UnsupportedOperatorError, match=r"com\.example::NoSuchOp"):
        onnx_light.InferenceSession(model.SerializeToString())
    assert issubclass(onnx_light.KernelError, ValueError)
    assert issubclass(onnx_light.RunTerminatedError, RuntimeError)


@pytest.mark.parametrize("mode, threads, grouped", [
    ("ORT_SEQUENTIAL", 2, False), ("ORT_PARALLEL", 2, True), ("ORT_PARALLEL", 1, False)])
def test_execution_mode_and_threads_map_to_the_native_session(mode, threads, grouped):
    """Inception v1's modules run as branches side by side in parallel mode only."""
    so = onnx_light.SessionOptions()
    so.intra_op_num_threads = threads
    so.execution_mode = getattr(onnx_light.ExecutionMode, mode)
    native = onnx_light.InferenceSession(real_models.model_path("inception_v1"), so)._session
    assert native.num_threads == threads
    assert (native.branch_groups > 0) is grouped
    with pytest.raises(ValueError, match="intra_op_num_threads must be 0"):
        so.intra_op_num_threads = -1
        onnx_light.InferenceSession(real_models.model_path("inception_v1"), so)
