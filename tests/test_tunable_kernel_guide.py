"""The worked example of docs/adding-a-tunable-kernel.md runs as the guide says.

The example module (docs/examples_src/rows_lp_normalization.py, included in the page as it
is) is loaded from its file and used against a fresh :class:`KernelTuningRegistry`: it
registers, resolves its portable defaults, configures a kernel, matches ONNX's definition
(computed in float64) on both paths and calibrates within a tiny budget. The process-wide
registry is never touched.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.parallel import ThreadPool
from onnx_light.runtime import RuntimeSession
from onnx_light.runtime import session as session_module
from onnx_light.tuning import (
    KernelTuningRegistry,
    calibrate_kernel_tuning,
    default_registry,
    execution_descriptor,
    kernel_tuning_parameters,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples_src" / "rows_lp_normalization.py"
_spec = importlib.util.spec_from_file_location("rows_lp_normalization", EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)
(DECLARATION,) = example.DECLARATIONS
F = TensorProto.FLOAT


@pytest.fixture
def registry() -> KernelTuningRegistry:
    """A fresh registry holding the example's schemas and callbacks; the default one must
    keep its generation."""
    generation = default_registry().generation
    fresh = KernelTuningRegistry()
    fresh.register(schemas=DECLARATION.schemas(), callbacks=DECLARATION.callbacks())
    yield fresh
    assert default_registry().generation == generation


def _ctx(element_type=F, **attributes) -> NodeContext:
    return NodeContext("lp", "LpNormalization", "", 22, attributes, (element_type,), num_inputs=1)


def _reference(x: np.ndarray, axis: int = -1, p: int = 2) -> np.ndarray:
    """ONNX's definition in float64. (onnx's ReferenceEvaluator is no reference here: it
    sums x rather than |x| for p=1 and reads axis=0 as the default -1.)"""
    norm = np.linalg.norm(x.astype(np.float64), ord=p, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm == 0, 0, x / norm)


def test_it_registers_and_resolves_its_portable_defaults(tmp_path: Path, registry) -> None:
    records = kernel_tuning_parameters("LpNormalization", "float", path=tmp_path / "c.txt",
                                       num_threads=2, registry=registry)
    (record,) = records
    assert record["key"] == "onnx_light/LpNormalization/rows[float]@cpu#1"
    assert record["calibratable"] is True
    assert record["active_values"] == {example.MINIMUM_ELEMENTS: (1 << 20) // 4}
    double = registry.snapshot().resolve(DECLARATION.key(TensorProto.DOUBLE), execution_descriptor(2))
    assert double.values == {example.MINIMUM_ELEMENTS: (1 << 20) // 8}


@pytest.mark.parametrize(("shape", "attributes"), [
    ((6, 5), {}), ((4, 3, 7), {"axis": 1, "p": 1}), ((3, 4, 5), {"axis": 0}), ((2, 0, 3), {}),
])
def test_serial_and_parallel_match_the_reference_and_each_other(shape, attributes) -> None:
    x = np.random.default_rng(7).uniform(-3, 3, shape).astype(np.float32)
    if x.size:
        x.reshape(-1)[:3] = 0  # a zero norm somewhere
    with ThreadPool(2) as pool:
        serial = example.RowsLpNormalization(_ctx(**attributes)).bind(pool)
        serial.configure({example.MINIMUM_ELEMENTS: example.SERIAL})
        parallel = example.RowsLpNormalization(_ctx(**attributes)).bind(pool)
        parallel.configure({example.MINIMUM_ELEMENTS: 1})
        (expected,), (got,) = serial.run(x), parallel.run(x)
    assert expected.tobytes() == got.tobytes() and got.dtype == np.float32
    np.testing.assert_allclose(got, _reference(x, **attributes), rtol=1e-6, atol=1e-7)


def test_a_session_resolves_the_example_from_the_given_registry(registry, monkeypatch) -> None:
    monkeypatch.setitem(session_module.DECLARATIONS, ("", "LpNormalization"), DECLARATION)
    node = helper.make_node("LpNormalization", ["x"], ["y"])
    info = helper.make_tensor_value_info
    graph = helper.make_graph([node], "g", [info("x", F, [8, 16])], [info("y", F, [8, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    session = RuntimeSession(model, registry=registry)
    (report,) = session.tuning_report()
    assert report["key"] == str(DECLARATION.key(F))
    x = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], _reference(x), rtol=1e-6)


def test_bad_values_name_the_node_key_and_parameter() -> None:
    kernel = example.RowsLpNormalization(_ctx())
    with pytest.raises(KernelError, match=r"node 'lp' \(LpNormalization\): "
                                          r"onnx_light/LpNormalization/rows\[float\]@cpu#1: "
                                          r".*parallel\.minimum_elements.*below the minimum 1"):
        kernel.configure({example.MINIMUM_ELEMENTS: 0})
    with pytest.raises(KernelError, match=r"node 'lp' \(LpNormalization\): p must be 1 or 2, got 3"):
        example.RowsLpNormalization(_ctx(p=3))
    with pytest.raises(KernelError, match="does not take element type int32"):
        example.RowsLpNormalization(_ctx(TensorProto.INT32))


def test_it_calibrates_within_a_tiny_budget(tmp_path: Path, registry) -> None:
    before = registry.generation
    report = calibrate_kernel_tuning("LpNormalization", "float", num_threads=2,
                                     max_duration_ms=200, path=tmp_path / "c.txt",
                                     registry=registry)
    (result,) = report["calibrated"]
    assert result["key"] == str(DECLARATION.key(F))
    assert result["measurements"] and result["diagnostics"]
    value = result["values"][example.MINIMUM_ELEMENTS]
    assert isinstance(value, int) and value >= 1  # a measured crossover or the portable value
    assert report["generation"] == registry.generation == before + 1
