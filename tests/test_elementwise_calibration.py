"""Elementwise calibration callbacks: every key has one, inputs are valid, and a real (small)
calibration publishes values that a new session then uses."""

from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_light
from onnx_light.kernels import DECLARATIONS, calibration_callbacks
from onnx_light.kernels.calibration import ElementwiseCrossover
from onnx_light.kernels.elementwise import OPS, tuning_schemas
from onnx_light.parallel import ThreadPool
from onnx_light.runtime import RuntimeSession

SLACK_S = 1.0  # the search checks its budget between measurements, so it may overrun by one


pytestmark = pytest.mark.usefixtures("isolated_tuning")


def test_every_elementwise_key_is_calibratable():
    assert {schema.key for schema in tuning_schemas()} <= set(calibration_callbacks())
    records = onnx_light.kernel_tuning_parameters(library="onnx_light")
    elementwise = {op.op_type for op in OPS}
    assert all(r["calibratable"] for r in records if r["kernel"] in elementwise)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.op_type)
def test_calibration_inputs_are_deterministic_and_both_paths_agree(op):
    for element_type in op.types:
        problem = ElementwiseCrossover(DECLARATIONS["", op.op_type], element_type, 2)
        for case in problem.cases:
            first, again = problem.make_inputs(3000, case), problem.make_inputs(3000, case)
            for a, b in zip(first, again, strict=True):
                assert a.dtype == b.dtype and np.array_equal(a, b)
            if element_type not in (TensorProto.STRING, TensorProto.BOOL) and case == "equal":
                assert any(np.unique(x).size > 1 for x in first)
            reference = problem.serial(first)
            assert reference.size == 3000 or case == "broadcast"
            assert problem.same_output(reference, problem.candidate(first))


def test_signed_inputs_have_both_signs_and_no_integer_overflow():
    add = next(op for op in OPS if op.op_type == "Add")
    problem = ElementwiseCrossover(DECLARATIONS["", add.op_type], TensorProto.INT8, 2)
    x, y = problem.make_inputs(4096, "equal")
    assert x.min() < 0 < x.max()
    assert np.array_equal(problem.serial([x, y]), (x.astype(np.int64) + y).astype(np.int8))


def test_same_output_is_bit_exact():
    add = next(op for op in OPS if op.op_type == "Add")
    problem = ElementwiseCrossover(DECLARATIONS["", add.op_type], TensorProto.FLOAT, 2)
    a = np.array([0.0, np.nan], np.float32)
    assert problem.same_output(a, a.copy())
    assert not problem.same_output(a, np.array([-0.0, np.nan], np.float32))
    assert not problem.same_output(a, a.astype(np.float64))


def _add_model(n):
    info = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [n]) for name in "xyz"]
    graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"])], "g", info[:2], info[2:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_add_float_calibration_within_budget_and_used_by_a_new_session(tmp_path, monkeypatch):
    budget_ms = 3000
    started = time.perf_counter()
    report = onnx_light.calibrate_kernel_tuning("Add", "float", num_threads=2,
                                                max_duration_ms=budget_ms, path=tmp_path / "c.txt")
    elapsed = time.perf_counter() - started
    assert elapsed < budget_ms / 1000 + SLACK_S
    assert report["failed"] == []
    (result,) = report["calibrated"]
    assert result["load_average"] is not None
    assert result["measurements"], "nothing measured"
    minimum = result["values"]["parallel.minimum_elements"]

    calls = []
    original = ThreadPool.parallel_for
    monkeypatch.setattr(ThreadPool, "parallel_for",
                        lambda self, n, fn, **kw: (calls.append(n), original(self, n, fn, **kw))[1])
    rng = np.random.default_rng(0)
    for n, parallel in ((max(1, minimum - 1), False), (minimum, True)):
        if n > 1 << 24:
            continue
        session = RuntimeSession(_add_model(n), num_threads=2)
        (entry,) = session.tuning_report()
        assert entry["source"] == "published_profile"
        assert entry["values"] == result["values"]
        calls.clear()
        x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        (z,) = session.run(None, {"x": x, "y": y})
        np.testing.assert_array_equal(z, x + y)
        assert bool(calls) == parallel
