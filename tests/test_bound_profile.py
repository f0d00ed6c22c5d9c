"""benchmarks/bound_profile.py's timer: every call of the bound plan timed under its step's name,
the run's outputs unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

pytest.importorskip("onnxruntime")

import bound_profile  # noqa: E402

from onnx_light.runtime import session as session_module  # noqa: E402


def test_bound_times_every_step_of_the_bound_plan(monkeypatch):
    F = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="first"),
         helper.make_node("Neg", ["a"], ["y"], name="second")],
        "g", [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = session_module.RuntimeSession(model.SerializeToString())
    timer = bound_profile.BoundTimes()
    monkeypatch.setattr(session_module, "run_bound", timer)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    for _ in range(3):
        (y,) = session.run(None, {"x": x})
        np.testing.assert_array_equal(y, -np.maximum(x, 0))
    assert {name: len(times) for name, times in timer.times.items()} == {"first": 3, "second": 3}
    assert timer.types == {"first": "Relu", "second": "Neg"}
    assert all(t >= 0 for times in timer.times.values() for t in times)
