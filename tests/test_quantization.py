"""The quantization kernels against onnx's reference evaluator, exact integer products, and
the errors a bad scale, zero point or attribute gets."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import DECLARATIONS
from onnx_light.kernels.base import Kernel, KernelError, NodeContext
from onnx_light.parallel import ThreadPool

POOL = ThreadPool(1)
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)

INTEGER_TARGETS = {
    TensorProto.UINT8: (np.uint8, 0, 255), TensorProto.INT8: (np.int8, -128, 127),
    TensorProto.UINT16: (np.uint16, 0, 65535), TensorProto.INT16: (np.int16, -32768, 32767),
    TensorProto.UINT4: (ml_dtypes.uint4, 0, 15), TensorProto.INT4: (ml_dtypes.int4, -8, 7),
    TensorProto.UINT2: (ml_dtypes.uint2, 0, 3), TensorProto.INT2: (ml_dtypes.int2, -2, 1),
}
FLOAT_TARGETS = {
    TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, TensorProto.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2, TensorProto.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    TensorProto.FLOAT4E2M1: ml_dtypes.float4_e2m1fn,
}


def element_type(array: np.ndarray) -> int:
    return helper.np_dtype_to_tensor_dtype(array.dtype)


def build(op: str, inputs: list[np.ndarray | None], opset: int, outputs: int = 1,
          **attributes: Any) -> tuple[onnx.ModelProto, Kernel]:
    """The one-node model and our kernel for it."""
    names = ["" if x is None else f"x{i}" for i, x in enumerate(inputs)]
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], name=f"{op.lower()}_node",
                            **attributes)
    graph = helper.make_graph(
        [node], "one_node",
        [helper.make_tensor_value_info(n, element_type(x), x.shape)
         for n, x in zip(names, inputs, strict=True) if x is not None],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None) for i in range(outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    attribute_values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    ctx = NodeContext(node.name, op, "", opset, attribute_values,
                      tuple(None if x is None else element_type(x) for x in inputs),
                      (None,) * outputs, len(inputs), outputs)
    declaration = DECLARATIONS[op]
    kernel = declaration.kernel(ctx)
    kernel.bind(POOL)
    return model, kernel


def ours(op: str, inputs: list[np.ndarray | None], opset: int, outputs: int = 1,
         **attributes: Any) -> list[np.ndarray]:
    return list(build(op, inputs, opset, outputs, **attributes)[1].run(*inputs))


def same(actual: np.ndarray, expected: np.ndarray) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_array_equal(actual.astype(np.float64), expected.astype(np.float64))


def check(op: str, inputs: list[np.ndarray | None], opset: int, outputs: int = 1,
          **attributes: Any) -> list[np.ndarray]:
    """Run ``op`` through the reference and our kernel and compare every output exactly."""
    model, kernel = build(op, inputs, opset, outputs, **attributes)
    feeds = {f"x{i}": x for i, x in enumerate(inputs) if x is not None}
    expected = ReferenceEvaluator(model).run(None, feeds)
    actual = list(kernel.run(*inputs))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        same(a, e)
    return actual


@st.composite
def quantization_problems(draw: st.DrawFn) -> dict[str, Any]:
    """An input shape, a granularity (tensor, axis, block) with its axis and block size."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    granularity = draw(st.sampled_from(["tensor", "axis", "block"]))
    axis = draw(st.integers(-rank, rank - 1))
    block = draw(st.integers(1, 4)) if granularity == "block" else 0
    if granularity == "tensor":
        parameter_shape: tuple[int, ...] = ()
    elif granularity == "axis":
        parameter_shape = (shape[axis],)
    else:
        parameter_shape = tuple(-(-d // block) if i == axis % rank else d for i, d in enumerate(shape))
    seed = draw(st.integers(0, 2**16))
    return {"shape": shape, "axis": axis, "block": block, "parameter_shape": parameter_shape,
            "rng": np.random.default_rng(seed)}


def _attributes(problem: dict[str, Any]) -> dict[str, int]:
    attributes = {"axis": problem["axis"]}
    if problem["block"]:
        attributes["block_size"] = problem["block"]
    return attributes


# ---------------------------------------------------------------- QuantizeLinear


@SETTINGS
@given(problem=quantization_problems(), target=st.sampled_from(sorted(INTEGER_TARGETS)),
       x_type=st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16]))
def test_quantize_linear_integer_targets(problem: dict[str, Any], target: int, x_type: Any) -> None:
    rng, dtype, (low, high) = problem["rng"], INTEGER_TARGETS[target][0], INTEGER_TARGETS[target][1:]
    x = (rng.standard_normal(problem["shape"]) * 3 * (high - low + 1)).astype(x_type)
    # halves on purpose: x / scale lands on .5 for some elements (round half to even)
    x.reshape(-1)[::3] = (np.arange(x.size)[::3] + 0.5).astype(x_type)
    scale = rng.choice([0.5, 1.0, 2.0, 0.25], problem["parameter_shape"]).astype(x_type)
    zero = rng.integers(low, high + 1, problem["parameter_shape"]).astype(dtype)
    y = check("QuantizeLinear", [x, scale, zero], 25, **_attributes(problem))[0]
    assert y.dtype == dtype


@SETTINGS
@given(problem=quantization_problems(), target=st.sampled_from(sorted(FLOAT_TARGETS)),
       saturate=st.sampled_from([0, 1]))
def test_quantize_linear_float_targets(problem: dict[str, Any], target: int, saturate: int) -> None:
    rng, dtype = problem["rng"], FLOAT_TARGETS[target]
    x = (rng.standard_normal(problem["shape"]) * 1000).astype(np.float32)
    scale = rng.choice([0.5, 1.0, 2.0], problem["parameter_shape"]).astype(np.float32)
    zero = np.zeros(problem["parameter_shape"], dtype)
    attributes = _attributes(problem)
    if target != TensorProto.FLOAT4E2M1:
        attributes["saturate"] = saturate
    check("QuantizeLinear", [x, scale, zero], 25, **attributes)


def test_quantize_linear_rounds_half_to_even_and_saturates() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1000.0, -1000.0], np.float32)
    y = ours("QuantizeLinear", [x, np.array(1.0, np.float32), np.array(0, np.int8)], 13)[0]
    np.testing.assert_array_equal(y, np.array([0, 2, 2, 0, -2, 127, -128], np.int8))
    four = ours("QuantizeLinear", [x, np.array(1.0, np.float32), np.array(0, ml_dtypes.int4)], 21)[0]
    np.testing.assert_array_equal(four.astype(np.int8), np.array([0, 2, 2, 0, -2, 7, -8], np.int8))


def test_quantize_linear_without_zero_point_is_uint8_or_output_dtype() -> None:
    x = np.array([[-1.0, 3.0], [300.0, 2.5]], np.float32)
    check("QuantizeLinear", [x, np.array(0.5, np.float32)], 10)
    check("QuantizeLinear", [x, np.array(0.5, np.float32)], 21, output_dtype=TensorProto.INT16)


def test_quantize_linear_precision_and_int32_input() -> None:
    x = np.arange(-20, 20, dtype=np.int32).reshape(4, 10)
    check("QuantizeLinear", [x, np.array(3.0, np.float32), np.array(1, np.int8)], 13)
    xf = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    check("QuantizeLinear", [xf, np.array(0.1, np.float32), np.array(0, np.uint8)], 23,
          precision=TensorProto.FLOAT16)


# ---------------------------------------------------------------- DequantizeLinear


@SETTINGS
@given(problem=quantization_problems(), source=st.sampled_from(sorted(INTEGER_TARGETS)),
       out=st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16]))
def test_dequantize_linear_integer_sources(problem: dict[str, Any], source: int, out: Any) -> None:
    rng, (dtype, low, high) = problem["rng"], INTEGER_TARGETS[source]
    x = rng.integers(low, high + 1, problem["shape"]).astype(dtype)
    scale = rng.uniform(0.01, 0.5, problem["parameter_shape"]).astype(out)  # float16 holds 65535 * 0.5
    zero = rng.integers(low, high + 1, problem["parameter_shape"]).astype(dtype)
    y = check("DequantizeLinear", [x, scale, zero], 25, **_attributes(problem))[0]
    assert y.dtype == out


@SETTINGS
@given(problem=quantization_problems(), source=st.sampled_from(sorted(FLOAT_TARGETS)))
def test_dequantize_linear_float_sources(problem: dict[str, Any], source: int) -> None:
    rng = problem["rng"]
    x = rng.uniform(-6, 6, problem["shape"]).astype(FLOAT_TARGETS[source])
    scale = rng.uniform(0.01, 2, problem["parameter_shape"]).astype(np.float32)
    check("DequantizeLinear", [x, scale], 25, **_attributes(problem))


def test_dequantize_linear_output_dtype_and_e8m0_scale() -> None:
    x = np.arange(-8, 8, dtype=np.int8).reshape(4, 4)
    scale = np.array([0.5, 1, 2, 4], np.float32).astype(ml_dtypes.float8_e8m0fnu)
    y = check("DequantizeLinear", [x, scale], 25, axis=0, output_dtype=TensorProto.FLOAT16)[0]
    assert y.dtype == np.float16
    with pytest.raises(KernelError, match=r"float8e8m0 scale needs output_dtype"):
        ours("DequantizeLinear", [x, scale], 25, axis=0)


def test_dequantize_linear_int32_is_exact() -> None:
    x = np.array([2**30 + 1, -(2**30) - 3, 7], np.int32)
    y = ours("DequantizeLinear", [x, np.array(1.0, np.float32), np.array(1, np.int32)], 13)[0]
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, np.float32([2**30, -(2**30) - 4, 6]))


# ---------------------------------------------------------------- DynamicQuantizeLinear


@SETTINGS
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=st.integers(0, 2**16),
       shift=st.sampled_from([-5.0, 0.0, 5.0]))
def test_dynamic_quantize_linear(shape: list[int], seed: int, shift: float) -> None:
    x = (np.random.default_rng(seed).standard_normal(shape) + shift).astype(np.float32)
    check("DynamicQuantizeLinear", [x], 11, outputs=3)


def test_dynamic_quantize_linear_of_zeros_and_empty() -> None:
    check("DynamicQuantizeLinear", [np.zeros((2, 3), np.float32)], 11, outputs=3)
    with pytest.raises(KernelError, match=r"dynamicquantizelinear_node.*empty tensor"):
        ours("DynamicQuantizeLinear", [np.zeros((0, 3), np.float32)], 11, outputs=3)


# ---------------------------------------------------------------- errors name the node

X = np.arange(12, dtype=np.float32).reshape(3, 4)


@pytest.mark.parametrize(("inputs", "attributes", "message"), [
    ([X, np.ones(5, np.float32), np.zeros(5, np.uint8)], {"axis": 1},
     "scale has 5 values but axis 1"),
    ([X, np.ones((2, 2), np.float32), np.zeros((2, 2), np.uint8)], {"axis": 1, "block_size": 3},
     r"does not match block_size 3 on axis 1.*expected shape \[3, 2\]"),
    ([X, np.ones(4, np.float32), np.zeros(4, np.uint8)], {"axis": 2}, "axis 2 is out of range"),
    ([X, np.ones(4, np.float32), np.zeros(3, np.uint8)], {"axis": 1},
     r"zero point's shape \[3\] differs from the scale's \[4\]"),
    ([X, np.ones((3, 2), np.float32), np.zeros((3, 2), np.uint8)], {"axis": 1},
     "must be a scalar or a 1-D tensor"),
    ([X, np.float32(1), np.array(0, np.uint8)], {"output_dtype": TensorProto.INT8},
     "zero point's type uint8 differs from output_dtype int8"),
    ([X, np.float32(1), np.array(0, np.uint8)], {"block_size": -1}, "block_size must be 0 or positive"),
    ([X, np.float32(1)], {"output_dtype": TensorProto.FLOAT}, "output_dtype 1 is not a quantized type"),
])
def test_quantize_linear_errors(inputs: list[np.ndarray], attributes: dict[str, int], message: str) -> None:
    with pytest.raises(KernelError, match=rf"node 'quantizelinear_node' \(QuantizeLinear\): .*{message}"):
        ours("QuantizeLinear", [np.asarray(v) for v in inputs], 25, **attributes)


def test_dequantize_linear_errors() -> None:
    x = np.zeros((2, 2), np.uint8)
    with pytest.raises(KernelError, match=r"'dequantizelinear_node'.*zero point's type int8 differs"):
        ours("DequantizeLinear", [x, np.float32(1), np.array(0, np.int8)], 25)
    with pytest.raises(KernelError, match=r"scalar or a 1-D tensor before opset 21"):
        ours("DequantizeLinear", [x, np.ones((2, 1), np.float32), np.zeros((2, 1), np.uint8)], 19)
    with pytest.raises(KernelError, match=r"DequantizeLinear-19 .*does not take element type int4"):
        ours("DequantizeLinear", [x.astype(ml_dtypes.int4), np.float32(1)], 19)
