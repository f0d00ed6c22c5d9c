"""A session runs another kernel library's declarations (``RuntimeSession(declarations=...)``),
alone or with onnx_light's, resolving that library's keys from the registry it is given."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_light import kernels
from onnx_light.kernels.base import Kernel
from onnx_light.kernels.declaration import declare
from onnx_light.runtime import RuntimeSession, UnsupportedOperatorError
from onnx_light.tuning import KernelTuningRegistry, Parameter, set_kernel_tuning_parameters

BLOCK = "block.elements"


class BlockedRelu(Kernel):
    """A toy library's Relu: max(x, 0) one block of ``block.elements`` at a time."""

    op_type = "Relu"
    implementation = "blocked"

    def _configure(self, values):
        self.block = int(values[BLOCK])

    def run(self, x):
        out = np.empty_like(x).reshape(-1)
        flat = x.reshape(-1)
        for start in range(0, flat.size, self.block):
            np.maximum(flat[start:start + self.block], 0, out=out[start:start + self.block])
        return (out.reshape(x.shape),)


def _parameters(element_type):
    return (Parameter(BLOCK, "int", 1024, "elements per block", minimum=1),)


TOY = declare(BlockedRelu, (14,), types=(TensorProto.FLOAT,), parameters=_parameters,
              library="toylib")


def _model(ops):
    nodes, previous = [], "x"
    for index, op in enumerate(ops):
        inputs = [previous, previous] if op == "Add" else [previous]
        name = "y" if index == len(ops) - 1 else f"t{index}"
        nodes.append(helper.make_node(op, inputs, [name], name=f"{op.lower()}{index}"))
        previous = name
    info = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [info("x", TensorProto.FLOAT, [4, 8])],
                              [info("y", TensorProto.FLOAT, [4, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_toy_librarys_keys_carry_its_name():
    assert str(TOY.key(TensorProto.FLOAT)) == "toylib/Relu/blocked[float]@cpu#1"
    assert str(kernels.DECLARATIONS["", "Relu"].key(TensorProto.FLOAT)).startswith("onnx_light/")


def test_a_session_runs_another_librarys_declarations_from_its_registry():
    registry = KernelTuningRegistry()
    registry.register(schemas=TOY.schemas())
    set_kernel_tuning_parameters("Relu", "float", {BLOCK: 5}, library="toylib", num_threads=1,
                                 persist=False, registry=registry)
    session = RuntimeSession(_model(["Relu"]), num_threads=1, registry=registry,
                             declarations=[TOY])
    (report,) = session.tuning_report()
    assert (report["key"], report["values"]) == (str(TOY.key(TensorProto.FLOAT)), {BLOCK: 5})
    (kernel,) = [k for k, _, _ in session._steps]
    assert isinstance(kernel, BlockedRelu) and kernel.block == 5
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))
    with pytest.raises(UnsupportedOperatorError, match=r"Add.*not implemented"):
        RuntimeSession(_model(["Add", "Relu"]), registry=registry, declarations=[TOY])


def test_a_session_mixes_the_toy_kernel_with_ours():
    registry = KernelTuningRegistry()
    kernels.register(registry)
    registry.register(schemas=TOY.schemas())
    session = RuntimeSession(_model(["Add", "Relu"]), num_threads=1, registry=registry,
                             fuse=False, declarations={**kernels.DECLARATIONS, "Relu": TOY})
    assert [entry["key"].split("/")[0] for entry in session.tuning_report()] == [
        "onnx_light", "toylib"]
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x + x, 0))


@pytest.mark.parametrize("declarations, words", [
    ({"Add": TOY}, ["declarations['Add']", "KernelDeclaration of Add"]),
    ([TOY, "Relu"], ["KernelDeclarations", "'Relu'"]),
    ([TOY, TOY], ["Relu is declared twice"]),
    ("Relu", ["mapping", "str"]),
])
def test_bad_declarations_are_refused_naming_the_problem(declarations, words):
    with pytest.raises((TypeError, ValueError)) as info:
        RuntimeSession(_model(["Relu"]), declarations=declarations)
    for word in words:
        assert word in str(info.value)
