"""The small model of the reliability checks: y = Relu(x + b) @ w on float (Add, Relu and
MatMul, every node tunable), its numpy reference, and a check that a session of it on the
process-wide registry computes the right thing whatever the cache holds.

Used by ``tools/cache_fuzz.py``, ``tools/model_fuzz.py`` and the reliability tests.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper

ROWS, INNER, COLUMNS = 64, 48, 24


def small_model() -> onnx.ModelProto:
    """Add + Relu + MatMul on float, every node tunable, with initializers b and w."""
    rng = np.random.default_rng(7)
    b = rng.standard_normal(INNER).astype(np.float32)
    w = rng.standard_normal((INNER, COLUMNS)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w"], ["y"], name="matmul")]
    graph = helper.make_graph(
        nodes, "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, INNER])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, COLUMNS])],
        initializer=[onnx.numpy_helper.from_array(b, "b"), onnx.numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def small_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((ROWS, INNER)).astype(np.float32)}


def small_expected(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    """The numpy reference of :func:`small_model`."""
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    return np.maximum(feeds["x"] + inits["b"], 0) @ inits["w"]


def check_small_session(num_threads: int = 2, model: onnx.ModelProto | None = None) -> str | None:
    """Build a session of the small model on the process-wide registry and run it; returns
    what went wrong, or None when the output matches the reference."""
    from onnx_light import RuntimeSession

    model = small_model() if model is None else model
    feeds = small_feeds()
    try:
        (y,) = RuntimeSession(model, num_threads=num_threads).run(None, feeds)
    except Exception as exc:
        return f"session failed: {type(exc).__name__}: {exc}"
    expected = small_expected(model, feeds)
    if y.shape != expected.shape or y.dtype != np.float32:
        return f"session output has shape {y.shape} dtype {y.dtype}"
    if not np.allclose(y, expected, rtol=1e-5, atol=1e-5):
        return f"session output differs from the reference by {np.abs(y - expected).max()}"
    return None

