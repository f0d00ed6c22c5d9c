"""Run profiles: the per-operator summary, the Chrome trace, and ``run --profile``."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_light import cli
from onnx_light.profiling import Profiler, profile_file_name
from onnx_light.runtime import RuntimeSession


def _model() -> onnx.ModelProto:
    """Softmax(Relu(x) + Relu(x)): four nodes of three operator types, none fused."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
             helper.make_node("Relu", ["x"], ["b"], name="relu_b"),
             helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Softmax", ["s"], ["y"], name="softmax")]
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_profiler_counts_every_node_run_and_sums_per_operator_type(tmp_path):
    session = RuntimeSession(_model(), num_threads=1, fuse=False)
    profiler = Profiler()
    x = np.ones((64, 64), np.float32)
    for _ in range(3):
        started = time.perf_counter_ns()
        session.run(None, {"x": x}, node_hook=profiler.node_hook)
        profiler.session_event("model_run", started)
    rows = {row["op_type"]: row for row in profiler.operator_summary()}
    assert {op: row["calls"] for op, row in rows.items()} == {"Relu": 6, "Add": 3, "Softmax": 3}
    assert all(row["mean_us"] == row["total_us"] / row["calls"] for row in rows.values())
    assert 0 <= sum(row["share"] for row in rows.values()) <= 1
    events = json.loads(Path(profiler.write(str(tmp_path / "trace.json"))).read_text())
    nodes = [e for e in events if e["cat"] == "Node"]
    assert sorted({e["name"] for e in nodes}) == ["add_kernel_time", "relu_a_kernel_time",
                                                   "relu_b_kernel_time", "softmax_kernel_time"]
    assert {e["tid"] for e in events} == {threading.get_native_id()}
    runs = [e for e in events if e["name"] == "model_run"]
    assert len(runs) == 3 and all(e["ph"] == "X" for e in events)
    for node in nodes:  # each node lies inside one run
        assert any(r["ts"] <= node["ts"] and node["ts"] + node["dur"] <= r["ts"] + r["dur"] + 1
                   for r in runs)


def test_profile_file_names_follow_onnxruntimes_pattern():
    name = profile_file_name("dir/prefix", 1_796_166_515_145_380_656)
    assert re.fullmatch(r"dir/prefix_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_145\.json", name)


def test_a_trace_that_cannot_be_written_says_where(tmp_path):
    with pytest.raises(OSError, match=r"profile not written to .*missing"):
        Profiler().write(str(tmp_path / "missing" / "trace.json"))


def test_run_profile_prints_a_table_and_writes_the_trace_and_plot(tmp_path, capsys, monkeypatch):
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", str(path), "--repeat", "2", "--threads", "1", "--profile"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("time per operator type"):].splitlines()
    assert table[1].split() == ["operator", "time", "ms", "share", "calls", "mean", "ms"]
    calls = {line.split()[0]: int(line.split()[3]) for line in table[2:5]}
    assert calls == {"Relu": 4, "Add": 2, "Softmax": 2}
    trace = re.search(r"trace written: (\S+\.json)", out).group(1)
    events = json.loads((tmp_path / trace).read_text())
    assert sum(e["name"] == "model_run" for e in events) == 2
    assert sum(e["cat"] == "Node" for e in events) == 8
    plot = re.search(r"plot written: (\S+\.png)|no plot: (.*matplotlib.*)", out)
    assert plot is not None, out
    if plot.group(1):
        assert (tmp_path / plot.group(1)).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
