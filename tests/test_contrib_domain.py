"""The ``com.microsoft`` domain's wiring: dispatch at version 1 without onnx's schemas, types
carried past its nodes, unused imported domains, unsupported operators named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels import DECLARATIONS
from onnx_light.runtime import RuntimeSession
from onnx_light.runtime.dispatch import UnsupportedOperatorError

F = TensorProto.FLOAT


def _model(nodes: list[onnx.NodeProto], imports: dict[str, int],
           initializers: list[onnx.TensorProto] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("z", F, [2, 3])], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in imports.items()])


def test_domains_a_model_imports_but_never_uses_are_not_an_error() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["z"])],
                   {"": 17, "com.microsoft": 1, "com.example.unused": 3, "ai.onnx.ml": 3})
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(RuntimeSession(model).run(None, {"x": x})[0], np.maximum(x, 0))


def test_an_unsupported_contrib_operator_names_domain_operator_and_node() -> None:
    model = _model([helper.make_node("NoSuchFusion", ["x"], ["z"], name="mystery",
                                     domain="com.microsoft")], {"": 17, "com.microsoft": 1})
    with pytest.raises(UnsupportedOperatorError,
                       match=r"com\.microsoft::NoSuchFusion \(opset 1\): operator not implemented "
                             r"\(node 'mystery'\)"):
        RuntimeSession(model)


def test_a_contrib_node_without_its_domain_imported_is_refused() -> None:
    model = _model([helper.make_node("QLinearAdd", ["x"], ["z"], name="n", domain="com.microsoft")],
                   {"": 17})
    with pytest.raises(ValueError, match=r"No opset import for domain 'com\.microsoft'"):
        RuntimeSession(model)


def test_other_domains_stay_refused() -> None:
    model = _model([helper.make_node("Thing", ["x"], ["z"], name="n", domain="com.example")],
                   {"": 17, "com.example": 1})
    with pytest.raises(UnsupportedOperatorError, match=r"domain 'com\.example' is not supported"):
        RuntimeSession(model)


def test_contrib_operators_are_version_1_of_their_domain() -> None:
    contrib = [d for (domain, _), d in DECLARATIONS.items() if domain == "com.microsoft"]
    assert contrib and all(list(d.versions) == [1] for d in contrib)


def test_nodes_after_a_contrib_node_are_typed() -> None:
    """QLinearSigmoid's output (uint8) types the DequantizeLinear after it, and the float
    Relu after that: each kernel knows its element type, as after an ONNX node."""
    scale = numpy_helper.from_array(np.float32(0.05), "scale")
    zero = numpy_helper.from_array(np.uint8(128), "zero")
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"]),
             helper.make_node("QLinearSigmoid", ["q", "scale", "zero", "scale", "zero"], ["s"],
                              domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["s", "scale", "zero"], ["d"]),
             helper.make_node("Relu", ["d"], ["z"])]
    model = _model(nodes, {"": 17, "com.microsoft": 1}, [scale, zero])
    session = RuntimeSession(model, fuse=False)
    types = {kernel.ctx.op_type: kernel.ctx.input_types[0] for kernel, _, _ in session._steps}
    assert types == {"QuantizeLinear": F, "QLinearSigmoid": TensorProto.UINT8,
                     "DequantizeLinear": TensorProto.UINT8, "Relu": F}
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    expected = (np.clip(np.rint(1 / (1 + np.exp(-np.clip(np.rint(x / 0.05) + 128, 0, 255) * 0.05
                                                 + 128 * 0.05)) / 0.05) + 128, 0, 255) - 128) * 0.05
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, atol=1e-6)


def test_contrib_nodes_run_inside_control_flow_bodies() -> None:
    """A Gelu (com.microsoft) in an If branch, against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    x_info = helper.make_tensor_value_info("x", F, [2, 3])

    def branch(op_type: str, domain: str, name: str) -> onnx.GraphProto:
        node = helper.make_node(op_type, ["x"], [f"{name}_y"], domain=domain)
        return helper.make_graph([node], name, [], [helper.make_tensor_value_info(f"{name}_y", F, [2, 3])])

    nodes = [helper.make_node("If", ["flag"], ["z"], then_branch=branch("Gelu", "com.microsoft", "then"),
                              else_branch=branch("Relu", "", "else"))]
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    graph = helper.make_graph(nodes, "g", [x_info, flag], [helper.make_tensor_value_info("z", F, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = RuntimeSession(model)
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    for flag in (True, False):
        feeds = {"x": x, "flag": np.array(flag)}
        np.testing.assert_allclose(session.run(None, feeds)[0], theirs.run(None, feeds)[0],
                                   rtol=1e-6, atol=1e-7)
