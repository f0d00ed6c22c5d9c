"""Casts to their input's own type dropped at construction (runtime/identity_casts.py): their
readers read the input, a graph output never becomes the caller's feed."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_light.runtime import RuntimeSession

F, D = TensorProto.FLOAT, TensorProto.DOUBLE


def _session(nodes: list, outputs: list[tuple[str, int]], fuse: bool = True) -> RuntimeSession:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info(name, kind, None) for name, kind in outputs])
    return RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                          num_threads=1, fuse=fuse)


def _x() -> np.ndarray:
    return np.array([[-1.5, 0.0, 2.0], [np.nan, -0.0, 3.0]], np.float32)


def _ops(session: RuntimeSession) -> list[str]:
    return [item.op_type for item in session._plan]


@pytest.mark.parametrize("fuse", [True, False])
def test_an_identity_cast_read_by_steps_is_dropped(fuse) -> None:
    nodes = [helper.make_node("Cast", ["x"], ["c"], to=F), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Neg", ["c"], ["n"])]
    session = _session(nodes, [("r", F), ("n", F)], fuse)
    assert _ops(session) == (["Relu", "Neg"] if fuse else ["Cast", "Relu", "Neg"])
    x = _x()
    r, n = session.run(None, {"x": x})
    np.testing.assert_array_equal(r, np.maximum(x, 0))
    assert (-x).tobytes() == n.tobytes()


def test_outputs_never_become_the_feed() -> None:
    # the Cast handed to the caller stays; the Reshape reading the feed after the Cast goes
    # gives a copy, as a view of any feed
    nodes = [helper.make_node("Cast", ["x"], ["c"], to=F), helper.make_node("Cast", ["x"], ["d"], to=F),
             helper.make_node("Flatten", ["d"], ["f"], axis=0)]
    session = _session(nodes, [("c", F), ("f", F)])
    assert _ops(session) == ["Cast", "Flatten"]
    x = _x()
    c, f = session.run(None, {"x": x})
    assert c.tobytes() == x.tobytes() and f.tobytes() == x.tobytes() and f.shape == (1, 6)
    assert not np.shares_memory(c, x) and not np.shares_memory(f, x)


def test_a_cast_to_another_type_stays() -> None:
    nodes = [helper.make_node("Cast", ["x"], ["c"], to=D), helper.make_node("Neg", ["c"], ["n"])]
    session = _session(nodes, [("n", D)])
    assert _ops(session) == ["Cast", "Neg"]
    assert session.run(None, {"x": _x()})[0].dtype == np.float64
