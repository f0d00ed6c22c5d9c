"""Kernel declarations: the one source of dispatch, element-type checks, keys, schemas and
callbacks; dispatch refuses an operator version or element type with both named."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_light import kernels
from onnx_light.kernels.base import Kernel, KernelError, NodeContext
from onnx_light.kernels.declaration import KernelDeclaration, declarations_by_op, declare, dispatch_table
from onnx_light.parallel import ThreadPool
from onnx_light.runtime import RuntimeSession
from onnx_light.runtime.dispatch import UnsupportedOperator, UnsupportedOperatorError, find_kernel
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.registry import KernelTuningRegistry
from onnx_light.tuning.schema import Parameter

T = TensorProto


def _model(op_type, element_type, opset, inputs=1):
    names = "abcde"[:inputs]
    # the first input (N, C, D); the others, if any, one value per channel
    info = [helper.make_tensor_value_info(n, element_type, [1, 2, 3] if n == "a" else [2])
            for n in names]
    out = helper.make_tensor_value_info("y", element_type, [1, 2, 3])
    graph = helper.make_graph([helper.make_node(op_type, list(names), ["y"])], "g", info, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(("op_type", "element_type", "opset", "inputs", "named"), [
    ("Erf", T.INT32, 9, 1, "Erf-9 (opset 9) does not take element type int32"),
    ("Erf", T.UINT8, 12, 1, "Erf-9 (opset 12) does not take element type uint8"),
    ("BatchNormalization", T.BFLOAT16, 14, 5,
     "BatchNormalization-14 (opset 14) does not take element type bfloat16"),
])
def test_a_type_the_kernel_does_not_take_fails_at_construction_naming_it(op_type, element_type,
                                                                         opset, inputs, named):
    """onnx's checker accepts these models (the types are ONNX's); the kernels do not."""
    with pytest.raises(UnsupportedOperatorError) as info:
        RuntimeSession(_model(op_type, element_type, opset, inputs), registry=KernelTuningRegistry())
    (operator,) = info.value.operators
    assert (operator.op_type, operator.opset) == (op_type, opset)
    assert f"ai.onnx::{op_type} (opset {opset}): {named}; it takes [" in str(info.value)


def test_an_operator_version_newer_than_the_kernel_fails_at_construction():
    """A declaration that stops at Relu-13 must not run a Relu-14 node with Relu-13's meaning."""
    registry = KernelTuningRegistry()
    kernels.register(registry)
    relu = kernels.DECLARATIONS["", "Relu"]
    older = KernelDeclaration("Relu", relu.kernel, {v: t for v, t in relu.versions.items() if v < 14})
    declarations = {**kernels.DECLARATIONS, ("", "Relu"): older}
    with pytest.raises(UnsupportedOperatorError,
                       match=r"ai\.onnx::Relu \(opset 17\): Relu-14 \(opset 17\) is newer than the "
                             r"kernel, which implements since-versions \[1, 6, 13\]"):
        RuntimeSession(_model("Relu", T.FLOAT, 17), registry=registry, declarations=declarations)
    (y,) = RuntimeSession(_model("Relu", T.FLOAT, 13), registry=registry,
                          declarations=declarations).run(
        None, {"a": np.full((1, 2, 3), -1, np.float32)})  # Relu-13 runs
    assert not y.any()


def test_dispatch_without_a_context_checks_the_version_only():
    found = find_kernel(kernels.DECLARATIONS, "", "MatMul", 8)
    assert found is kernels.KERNELS["MatMul"][1]
    ctx = NodeContext("n", "MatMul", "", 8, input_types=(T.INT64, T.INT64), num_inputs=2)
    refused = find_kernel(kernels.DECLARATIONS, "", "MatMul", 8, ctx)
    assert isinstance(refused, UnsupportedOperator) and "int64" in refused.reason
    untyped = NodeContext("n", "MatMul", "", 8, num_inputs=2)
    assert find_kernel(kernels.DECLARATIONS, "", "MatMul", 8, untyped) is found


def test_dispatch_is_keyed_by_domain_and_operator():
    """The model's opset for each domain picks the version; 'ai.onnx' is the default domain."""
    scaler = find_kernel(kernels.DECLARATIONS, "ai.onnx.ml", "Scaler", 1)
    assert scaler is kernels.ml.KERNELS["Scaler"][1]
    assert find_kernel(kernels.DECLARATIONS, "ai.onnx", "Relu", 14) is kernels.KERNELS["Relu"][14]
    # an ai.onnx.ml operator is not one of the default domain, nor the other way round
    assert "operator not implemented" in find_kernel(kernels.DECLARATIONS, "", "Scaler", 13).reason
    assert "operator not implemented" in find_kernel(kernels.DECLARATIONS, "ai.onnx.ml", "Relu", 3).reason
    ctx = NodeContext("encoder_7", "LabelEncoder", "ai.onnx.ml", 1, input_types=(T.STRING,))
    assert find_kernel(kernels.DECLARATIONS, "ai.onnx.ml", "LabelEncoder", 1, ctx) is \
        kernels.ml.KERNELS["LabelEncoder"][1]
    refused = find_kernel(kernels.DECLARATIONS, "ai.onnx.ml", "Imputer", 1,
                          NodeContext("imputer_8", "Imputer", "ai.onnx.ml", 1, input_types=(T.UINT8,)))
    assert str(refused) == ("ai.onnx.ml::Imputer (opset 1): Imputer-1 (opset 1) does not take element "
                            "type uint8; it takes ['float', 'double', 'int64', 'int32'] (node 'imputer_8')")
    late = find_kernel(kernels.DECLARATIONS, "ai.onnx.ml", "TreeEnsemble", 3,
                       NodeContext("forest", "TreeEnsemble", "ai.onnx.ml", 3, input_types=(T.FLOAT,)))
    assert str(late) == ("ai.onnx.ml::TreeEnsemble (opset 3): TreeEnsemble is implemented from "
                         "opset 5 on, the model uses opset 3 (node 'forest')")


def _ml_model(op_type):
    node = helper.make_node(op_type, ["x"], ["y"], name="the_node", domain="ai.onnx.ml")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("ai.onnx.ml", 3)])


def test_a_session_names_the_node_domain_and_operator_it_cannot_run():
    registry = KernelTuningRegistry()
    without = {key: d for key, d in kernels.DECLARATIONS.items() if key != ("ai.onnx.ml", "Binarizer")}
    with pytest.raises(UnsupportedOperatorError) as info:
        RuntimeSession(_ml_model("Binarizer"), registry=registry, declarations=without)
    assert str(info.value).endswith(
        "ai.onnx.ml::Binarizer (opset 3): operator not implemented (node 'the_node')")
    (y,) = RuntimeSession(_ml_model("Binarizer"), registry=registry).run(
        None, {"x": np.array([[-1, 0, 2], [3, -4, 0.5]], np.float32)})
    np.testing.assert_array_equal(y, [[0, 0, 1], [1, 0, 1]])


def test_the_table_and_register_are_derived_from_the_declarations():
    default_domain = [d for d in kernels.DECLARATIONS.values() if not d.domain]
    assert dispatch_table(default_domain) == kernels.KERNELS
    assert {op for domain, op in kernels.DECLARATIONS if domain == "ai.onnx.ml"} == set(kernels.ml.KERNELS)
    assert {op for domain, op in kernels.DECLARATIONS if domain == "com.microsoft"} == set(
        kernels.contrib.KERNELS)
    assert {domain for domain, _ in kernels.DECLARATIONS} == {"", "ai.onnx.ml", "com.microsoft"}
    with pytest.raises(ValueError, match="one domain's; the declarations span"):
        dispatch_table(kernels.DECLARATIONS.values())
    registry = KernelTuningRegistry()
    kernels.register(registry)
    snapshot = registry.snapshot()
    for declaration in kernels.DECLARATIONS.values():
        assert declaration.kernel.declaration is declaration
        for element_type in declaration.element_types if declaration.tunable else ():
            key = declaration.key(element_type)
            assert key.implementation == declaration.kernel.implementation
            assert snapshot.schema(key) == declaration.schema(element_type)
            assert snapshot.callback(key).func is declaration.calibrate


class _Toy(Kernel):
    op_type: ClassVar[str] = "Toy"

    def _configure(self, values):
        self.blocks = int(values["toy.blocks"])

    def run(self, x):
        return [np.copy(x)]


def _toy_parameters(element_type):
    return (Parameter("toy.blocks", "int", 4 if element_type == T.DOUBLE else 2, minimum=1,
                      maximum=64),)


TOY = declare(_Toy, (3, 7), types={3: (T.FLOAT,), 7: (T.FLOAT, T.DOUBLE)}, parameters=_toy_parameters,
              library="toylib")


def test_declare_expands_types_by_version_and_builds_the_key_once():
    assert dict(TOY.versions) == {3: (T.FLOAT,), 7: (T.FLOAT, T.DOUBLE)}
    assert TOY.element_types == (T.FLOAT, T.DOUBLE)
    assert TOY.key(T.DOUBLE) == KernelTuningKey("toylib", "Toy", "portable", T.DOUBLE)
    # without a name: the top-level package of the kernel's module
    elsewhere = type("Elsewhere", (Kernel,), {"op_type": "Elsewhere", "__module__": "mylib.ops"})
    assert declare(elsewhere, (1,)).library == "mylib"
    assert TOY.version(2) is None and TOY.version(6) == 3 and TOY.version(30) == 7
    assert TOY.refusal(5, T.DOUBLE) == ("Toy-3 (opset 5) does not take element type double; "
                                        "it takes ['float']")
    assert TOY.refusal(7, T.DOUBLE) is None
    with pytest.raises(ValueError, match="declared twice"):
        declare(_Toy, (1,))
    with pytest.raises(ValueError, match=r"operator ai\.onnx::Toy is declared twice"):
        declarations_by_op([TOY], [KernelDeclaration("Toy", Kernel, {1: None})])
    with pytest.raises(ValueError, match="no element types for since-version 1"):
        declare(type("Late", (Kernel,), {"op_type": "Late"}), (1, 2), types={2: (T.FLOAT,)})


def test_configure_checks_every_value_against_the_schema_in_one_message():
    kernel = _Toy(NodeContext("toy", "Toy", "", 7, input_types=(T.DOUBLE,)))
    assert kernel.blocks == 4  # the portable default of its element type
    kernel.configure({"toy.blocks": 9})
    assert kernel.blocks == 9
    kernel.configure(None)
    assert kernel.blocks == 9
    for values, rule in (({"toy.blocks": 0}, "below the minimum 1"),
                         ({"toy.blocks": 65}, "above the maximum 64"),
                         ({"toy.blocks": 2.0}, "expected int"),
                         ({"toy.other": 1}, "unknown parameter 'toy.other'")):
        with pytest.raises(KernelError, match=rf"node 'toy' \(Toy\): toylib/Toy/portable"
                                              rf"\[double\]@cpu#1: .*{rule}"):
            kernel.configure(values)
    assert kernel.blocks == 9
    with pytest.raises(KernelError, match="does not take element type double"):
        _Toy(NodeContext("toy", "Toy", "", 5, input_types=(T.DOUBLE,)))
    untyped = _Toy(NodeContext("toy", "Toy", "", 7))
    assert untyped.blocks == 2 and untyped.tuning_key() is None
    with pytest.raises(KernelError, match="element type is not known"):
        untyped.configure({"toy.blocks": 3})


def test_bind_and_variant_leave_the_original_alone():
    kernel = _Toy(NodeContext("toy", "Toy", "", 7, input_types=(T.FLOAT,)))
    assert kernel.num_threads == 1
    with ThreadPool(2) as pool:
        assert kernel.bind(pool) is kernel and kernel.num_threads == 2
        other = kernel.variant(blocks=7)
        assert (other.blocks, other.pool, kernel.blocks) == (7, pool, 2)
    with pytest.raises(AttributeError, match="no attribute 'block'"):
        kernel.variant(block=1)


@pytest.mark.parametrize("op_type, opset, attributes, message", [
    ("Pad", 1, {}, "attribute 'paddings' is required before opset 2"),
    ("Pad", 2, {"paddings": [0, 0]}, "attribute 'pads' is required before opset 11"),
    ("Reshape", 1, {}, "attribute 'shape' is required before opset 5"),
    ("Slice", 1, {"starts": [0]}, "attribute 'ends' is required before opset 10"),
    ("Unsqueeze", 11, {}, "attribute 'axes' is required before opset 13"),
    ("TopK", 1, {}, "attribute 'k' is required before opset 10"),
])
def test_attributes_an_opset_requires_are_declared_and_checked_at_construction(
        op_type, opset, attributes, message):
    declaration = kernels.DECLARATIONS["", op_type]
    assert declaration.required  # the rule is data of the declaration, not code in the class
    ctx = NodeContext(op_type.lower(), op_type, "", opset, attributes, (T.FLOAT,), (T.FLOAT,), 1)
    assert declaration.missing(ctx) == message
    with pytest.raises(KernelError, match=rf"node '{op_type.lower()}' \({op_type}\): {message}"):
        declaration.kernel(ctx)
    later = dataclasses.replace(ctx, opset=max(rule.before for rule in declaration.required))
    assert declaration.missing(later) is None


@pytest.mark.parametrize("omitted", [{"num_inputs": 2}, {"num_inputs": 3, "omitted_inputs": frozenset({2})}])
def test_an_input_an_opset_requires_is_declared_and_checked_at_construction(omitted):
    """Gemm's C is required before opset 11 (left out, or named ''): a rule of the
    declaration, checked when the kernel is built (in a session the ONNX checker refuses
    such a node first); from opset 11 on the product runs without it."""
    declaration = kernels.DECLARATIONS["", "Gemm"]
    ctx = NodeContext("g", "Gemm", "", 9, {}, (T.FLOAT, T.FLOAT), (T.FLOAT,), **omitted)
    assert declaration.missing(ctx) == "input C is required before opset 11 (opset 9)"
    with pytest.raises(KernelError, match=r"node 'g' \(Gemm\): input C is required before opset 11"):
        declaration.kernel(ctx)
    kernel = declaration.kernel(dataclasses.replace(ctx, opset=11))
    kernel.bind(None).configure(None)
    a, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(kernel.run(a, b)[0], a @ b)
