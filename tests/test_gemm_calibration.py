"""Gemm/MatMul calibration: the corpus, the candidate grid, validation, and the callbacks."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import onnx_light
from onnx_light.kernels import DECLARATIONS, calibration_callbacks, conv, gemm
from onnx_light.kernels.calibration import GEMM_CORPUS, GemmConfigurations
from onnx_light.kernels.gemm import gemm_candidates
from onnx_light.tuning import default_registry

T = TensorProto


pytestmark = pytest.mark.usefixtures("isolated_tuning")


def test_every_gemm_and_matmul_key_is_calibratable():
    callbacks = calibration_callbacks()
    assert all(schema.key in callbacks for schema in gemm.tuning_schemas())


def test_corpus_covers_the_shapes_the_issue_names():
    names = " ".join(entry[0] for entry in GEMM_CORPUS)
    for word in ("small", "row", "column", "square", "wide", "tall", "trans", "head", "fc", "conv"):
        assert word in names


@pytest.mark.parametrize("element_type", [T.FLOAT, T.DOUBLE, T.FLOAT16, T.BFLOAT16, T.INT32])
def test_candidates_respect_the_schema(element_type):
    schema = gemm.gemm_schema("Gemm", element_type)
    candidates = gemm_candidates(element_type)
    assert len(candidates) >= 6
    for values in candidates:
        schema.validate(values)


@pytest.mark.parametrize("op_type", ["Gemm", "MatMul"])
@pytest.mark.parametrize("element_type", [T.FLOAT, T.FLOAT16, T.INT64])
def test_every_configuration_is_within_the_stated_bound(op_type, element_type):
    problem = GemmConfigurations(DECLARATIONS["", op_type], element_type, 2)
    portable = dict(gemm.gemm_schema(op_type, element_type).defaults)
    for case in problem.cases[:6]:
        inputs = problem.make_inputs(case)
        reference = problem.run(portable, inputs)
        for values in gemm_candidates(element_type):
            assert problem.same_output(reference, problem.run(values, inputs)), (case, values)


def test_bound_rejects_a_real_error():
    problem = GemmConfigurations(DECLARATIONS["", "Gemm"], T.FLOAT, 2)
    inputs = problem.make_inputs("square 128")
    output, _ = problem.run(dict(gemm.gemm_schema("Gemm", T.FLOAT).defaults), inputs)
    wrong = output.copy()
    wrong[3, 5] += 1e-3 * (1 + abs(wrong[3, 5]))
    assert not problem.same_output((output, inputs), (wrong, inputs))


def test_a_wrong_configuration_publishes_nothing(monkeypatch, tmp_path):
    original = gemm.GemmKernel.run

    def broken(self, *inputs):
        (y,) = original(self, *inputs)
        return [y + 1 if self.mode == "split_rows" else y]

    monkeypatch.setattr(gemm.GemmKernel, "run", broken)
    generation = default_registry().generation
    report = onnx_light.calibrate_kernel_tuning("Gemm", "float", num_threads=2,
                                                path=tmp_path / "c.txt", max_duration_ms=20000)
    assert "different result" in report["failed"][0]["error"]
    assert default_registry().generation == generation
    assert not (tmp_path / "c.txt").exists()


def test_small_budget_keeps_portable_values(tmp_path):
    report = onnx_light.calibrate_kernel_tuning("MatMul", "float", num_threads=2,
                                                path=tmp_path / "c.txt", max_duration_ms=50)
    (result,) = report["calibrated"]
    assert result["portable_kept"]
    assert result["values"] == dict(gemm.gemm_schema("MatMul", T.FLOAT).defaults)
    assert any("corpus not covered" in d for d in result["diagnostics"])
    assert np.isfinite(result["duration_s"])


@pytest.mark.parametrize("element_type", [T.FLOAT, T.INT32])
def test_calibration_never_tries_blas_threads(element_type):
    """BLAS's spinning threads slow the pool's next regions, which a search cannot see."""
    assert all(values[gemm.MODE] not in ("blas", "split_columns") for values in gemm_candidates(element_type))
    assert all(values[conv.SPLIT] != "blas" for values in conv.candidate_grid())
