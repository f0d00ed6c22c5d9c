"""ONNX's nine light real-model graphs through RuntimeSession, against onnxruntime.

The light models (``onnx/backend/test/data/light/light_*.onnx``) make their weights with
ConstantOfShape nodes (every weight 0.02, biases random), so their softmax outputs are uniform
and a comparison of them says little. As shipped, each model's output is compared with
ONNX's own (tests/test_backend.py runs the backend's real-model tests, rtol 1e-3); here each
is run as shipped for what construction must have done, and compared with onnxruntime at the
same thread count (2), on ONNX's own test input (``arange / size``), with every
ConstantOfShape weight replaced by a seeded random initializer (the same value scaled by
U(0.5, 1.5)), on the logits (the Softmax input, or the graph output where there is no
Softmax): within ``1e-4 * max |logits|``. Both runtimes add float32 products in different
orders through up to 120 layers; the differences measured here are below 1e-6 of the
largest logit.

That a session's first run costs about as much as later runs is a timing claim, measured by
``benchmarks/real_models.py`` and recorded in ``docs/real-models.md``, not asserted here.
What is asserted is its precondition: construction does all the work that depends only on the
model (dispatch, tuning resolution, every kernel's configuration, the plan, every compiled
form of its kernels), and a run changes no kernel's state and neither compiles nor loads
compiled code.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx_light import cli
from onnx_light.kernels.compiled import process_compile_seconds
from onnx_light.kernels.conv import ConvConfig, ConvKernel
from onnx_light.runtime import RuntimeSession

ort = pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _common import real_models  # noqa: E402  (the benchmark's random weights)
from kernel_cases import kernel_state  # noqa: E402

MODELS = real_models.MODELS
# The two with the largest weights (VGG-19: 143M, ZFNet-512: 62M parameters of fully connected
# layers) are compared as shipped only, to keep the random-weight comparison quick.
RANDOM_WEIGHT_MODELS = tuple(m for m in MODELS if m not in ("vgg19", "zfnet512"))
THREADS = 2
_path = real_models.model_path  # the light model files
_input = real_models.model_input  # ONNX's runner input: arange(size).reshape(shape) / size


def _onnxruntime(model: onnx.ModelProto | str):
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _kernel_state(session: RuntimeSession) -> list[dict[str, object]]:
    """Every kernel's attributes, by identity (and a copy of any dict, list or set)."""
    return [kernel_state(kernel) for kernel, _, _ in session._steps]


@pytest.mark.parametrize("name", MODELS)
def test_light_model_does_no_lazy_work(name):
    path = _path(name)
    model = onnx.load(path)
    session = RuntimeSession(path, num_threads=THREADS)
    # Construction configured every tunable kernel with the resolved values.
    convs = [k for k, _, _ in session._steps if isinstance(k, ConvKernel)]
    assert convs
    resolved = {entry["node"]: entry["values"] for entry in session.tuning_report()}
    for kernel in convs:
        assert kernel.pool is not None
        assert kernel.config == ConvConfig.from_values(resolved[kernel.ctx.name])
    before = _kernel_state(session)
    input_name, x = _input(model)
    compiling = process_compile_seconds()
    got = session.run(None, {input_name: x})
    assert _kernel_state(session) == before, "a run changed a kernel's state (lazy work)"
    # nor did it compile or load compiled code (a form of a kernel construction did not make)
    assert process_compile_seconds() == compiling
    assert [(a.shape, a.dtype) for a in got] == [
        (tuple(d.dim_value for d in o.type.tensor_type.shape.dim), np.float32) for o in model.graph.output]
    # the second run gives the same result (nothing was left half done by the first)
    np.testing.assert_array_equal(session.run(None, {input_name: x})[0], got[0])


def _with_random_weights(name: str, seed: int = 0) -> onnx.ModelProto:
    """The light model with seeded random weights (the benchmark's), and the logits (the
    Softmax input, if any) as an extra output."""
    model = onnx.load(_path(name))
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    model = real_models.with_random_weights(model, seed)
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
    if softmax:
        model.graph.output.append(inferred[softmax[-1].input[0]])
    return model


@pytest.mark.parametrize("name", RANDOM_WEIGHT_MODELS)
def test_light_model_with_random_weights_matches_onnxruntime(name):
    model = _with_random_weights(name)
    input_name, x = _input(model)
    session = RuntimeSession(model, num_threads=THREADS)
    compiling = process_compile_seconds()
    got = session.run(None, {input_name: x})[-1]
    assert process_compile_seconds() == compiling, "the first run compiled a kernel"
    expected = _onnxruntime(model).run(None, {input_name: x})[-1]
    assert got.shape == expected.shape
    scale = float(np.abs(expected).max())
    assert scale > 0 and np.isfinite(scale)
    difference = float(np.abs(got.astype(np.float64) - expected).max())
    assert difference <= 1e-4 * scale, f"logits differ by {difference:.3g} (largest {scale:.3g})"


@pytest.mark.parametrize(("name", "groups"), [("inception_v1", 6), ("inception_v2", 8),
                                             ("resnet50", 0), ("densenet121", 0)])
def test_inception_modules_run_as_branches_with_the_same_results(name, groups):
    model = _with_random_weights(name)
    input_name, x = _input(model)
    session = RuntimeSession(model, num_threads=THREADS)
    assert session.branch_groups == groups
    plain = RuntimeSession(model, num_threads=THREADS, branches=False)
    for got, expected in zip(session.run(None, {input_name: x}), plain.run(None, {input_name: x}),
                             strict=True):
        np.testing.assert_array_equal(got, expected)


# The command runs every model through the same session as the tests above; the three whose
# weights take hundreds of MB (construction seconds each) are left to those.
CLI_MODELS = tuple(m for m in MODELS if m not in ("vgg19", "zfnet512", "bvlc_alexnet"))


@pytest.mark.parametrize("name", CLI_MODELS)
def test_cli_runs_the_lighter_light_models(name, capsys):
    status = cli.main(["run", _path(name), "--threads", str(THREADS), "--repeat", "1"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "session construction" in out and "first run" in out
    assert re.search(r"plan: \d+ node\(s\) folded into constants, \d+ fused into others, "
                     r"\d+ group\(s\) of branches run side by side", out)
    first_output = out.splitlines()[0]
    assert "shape [1, 1000" in first_output or name == "densenet121", first_output


def test_light_models_are_where_the_runner_finds_them():
    for name in MODELS:
        assert os.path.isfile(_path(name)), name
