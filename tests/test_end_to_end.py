"""End to end: a small MLP against onnxruntime, and ``python -m onnx_light run``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light.cli import main
from onnx_light.runtime import RuntimeSession

ort = pytest.importorskip("onnxruntime")


def mlp_model(batch: int | str = "batch") -> onnx.ModelProto:
    """784 -> 256 (Gemm, Relu) -> 128 (MatMul, Add, Relu) -> 10 (Gemm, Softmax)."""
    rng = np.random.default_rng(42)

    def weight(name, *shape):
        data = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
        return numpy_helper.from_array(data, name)

    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], name="fc1"),
        helper.make_node("Relu", ["h1"], ["a1"], name="relu1"),
        helper.make_node("MatMul", ["a1", "w2"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "b2"], ["h2"], name="bias2"),
        helper.make_node("Relu", ["h2"], ["a2"], name="relu2"),
        helper.make_node("Gemm", ["a2", "w3", "b3"], ["h3"], name="fc3", transB=1),
        helper.make_node("Softmax", ["h3"], ["probabilities"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 784])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [batch, 10])],
        initializer=[weight("w1", 784, 256), weight("b1", 256), weight("w2", 256, 128),
                     weight("b2", 128), weight("w3", 10, 128), weight("b3", 10)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
def test_mlp_matches_onnxruntime(threads):
    model = mlp_model()
    x = np.random.default_rng(0).standard_normal((32, 784)).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    peer = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    (expected,) = peer.run(None, {"x": x})
    (ours,) = RuntimeSession(model, num_threads=threads).run(None, {"x": x})
    assert ours.dtype == np.float32 and ours.shape == (32, 10)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ours.sum(axis=1), 1.0, rtol=1e-5)


def test_cli_run(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), path)
    x = np.random.default_rng(0).standard_normal((3, 784)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    status = main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--threads", "2",
                   "--repeat", "3", "--output", str(tmp_path / "out.npz")])
    assert status == 0
    out = capsys.readouterr().out
    assert "probabilities: shape [3, 10] dtype float32" in out
    assert "first run" in out and "session construction" in out
    saved = np.load(tmp_path / "out.npz")
    (expected,) = RuntimeSession(path).run(None, {"x": x})
    np.testing.assert_array_equal(saved["probabilities"], expected)
    # --hold-memory keeps freed memory (glibc) and changes no result
    held = tmp_path / "held.npz"
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--repeat", "2",
                 "--hold-memory", "--output", str(held)]) == 0
    np.testing.assert_array_equal(np.load(held)["probabilities"], expected)


def test_cli_run_random_inputs_and_errors(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), path)
    assert main(["run", str(path), "--repeat", "1"]) == 0
    assert "probabilities: shape [1, 10]" in capsys.readouterr().out
    assert main(["run", str(tmp_path / "missing.onnx")]) == 2
    assert "missing.onnx" in capsys.readouterr().err
    assert main(["run", str(path), "--input", "x"]) == 2
    assert "NAME=FILE.npy" in capsys.readouterr().err
