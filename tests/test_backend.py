"""ONNX's own backend test suite, run through ``onnx_light.backend``.

Every node test whose model uses only operators onnx_light implements (at the
test's opset) is included. A test of a supported operator that does not pass
is listed in ``EXCLUDED`` with its reason; nothing is skipped silently. The cases of the
random number operators, whose expected outputs are one draw no implementation reproduces,
run here too but are compared by shape and type, as tools/node_test_coverage.py counts them
(tests/test_random_draws.py checks the draws).
"""

from __future__ import annotations

import warnings
from typing import Any

import onnx
import onnx.backend.test
import pytest
from node_test_coverage import (  # tools/: the coverage tool counts the same cases
    assert_same_kinds,
    comparison,
    supported,
)
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests

from onnx_light.backend import OnnxLightBackend

# Test name -> why it is excluded. Keep reasons specific.
EXCLUDED: dict[str, str] = {
    "test_loop16_seq_none": (
        "onnx's runner cannot compare its output, a sequence whose first tensor has rank 0 "
        "(Runner.assert_similar_outputs calls len() on each tensor of a sequence); "
        "tests/test_control_flow.py compares it tensor by tensor"
    ),
    "test_attention_4d_causal_fp16_expanded": (
        "float16 Softmax is computed in float32 (0.5 ulp worst case against the exact result, "
        "1.4 ulp for the reference); after MatMul the outputs differ by 1.2e-3, just over the "
        "test's 1e-3 tolerance"
    ),
    "test_mvn": (
        "onnx.checker.check_model(full_check=True), which every session runs, rejects the model "
        "(opset 13): inferring the MeanVarianceNormalization-13 function body fails on its "
        "Constant node; the opset 18 expansion, test_mvn_expanded_ver18, runs"
    ),
}


# ONNX generates its node test data on import, with numpy warnings we don't own.
class OneThreadBackend(OnnxLightBackend):
    """The backend at one thread: the node tests' tensors are far below every parallel
    threshold, so a second thread would only compile the kernels' parallel forms (tens of
    seconds from an empty compile cache) without running them; the real models run at two
    threads in tests/test_real_models.py."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> Any:
        return super().prepare(model, device, **{"num_threads": 1, **kwargs})


with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _SUPPORTED = [case for case in load_model_tests(kind="node") if supported(case.model)]
    SUPPORTED_NODE_TESTS = sorted(case.name for case in _SUPPORTED)
    DRAWN_CASES = [case for case in _SUPPORTED if comparison(case.model) is assert_same_kinds]
    _runner = onnx.backend.test.BackendTest(OneThreadBackend, __name__)
_runner.include("^(" + "|".join(SUPPORTED_NODE_TESTS) + ")_cpu$")
# ONNX's nine real-model tests: the light_*.onnx graphs shipped in the onnx package, with their
# reference outputs (the runner may create ~/.onnx/models/light/<name> for its test data).
REAL_MODEL_TESTS = (
    "test_bvlc_alexnet",
    "test_densenet121",
    "test_inception_v1",
    "test_inception_v2",
    "test_resnet50",
    "test_shufflenet",
    "test_squeezenet",
    "test_vgg19",
    "test_zfnet512",
)
_runner.include("^(" + "|".join(REAL_MODEL_TESTS) + ")_cpu$")
_DRAWN_NAMES = {case.name for case in DRAWN_CASES}
for _name in (*EXCLUDED, *_DRAWN_NAMES):
    _runner.exclude(f"^{_name}_cpu$")
SELECTED_BACKEND_TESTS = {
    f"{name}_cpu" for name in SUPPORTED_NODE_TESTS if name not in EXCLUDED and name not in _DRAWN_NAMES
}
SELECTED_BACKEND_TESTS |= {f"{name}_cpu" for name in REAL_MODEL_TESTS}

globals().update(_runner.test_cases)


def test_exclusions_name_supported_tests() -> None:
    """Every exclusion names a test that exists and would otherwise run."""
    stale = sorted(set(EXCLUDED) - set(SUPPORTED_NODE_TESTS))
    assert not stale, f"exclusions for tests that are not selected: {stale}"


@pytest.mark.parametrize("case", DRAWN_CASES, ids=lambda case: case.name)
def test_random_draw_cases_give_the_expected_shapes_and_types(case) -> None:
    """ONNX's cases of the random operators, compared as the coverage tool compares them."""
    ((inputs, expected),) = case.data_sets
    prepared = OnnxLightBackend.prepare(case.model)
    assert_same_kinds(
        [numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v for v in expected],
        list(prepared.run(list(inputs))),
        case.rtol,
        case.atol,
    )
