"""The quantization kernels against onnx's reference evaluator, exact integer products, and
the errors a bad scale, zero point or attribute gets."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import build, ours_and_reference
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.base import KernelError
from onnx_light.kernels.quantized_products import exact_matmul

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from quantized_models import onnxruntime_saturates

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
    actual, expected = ours_and_reference(op, inputs, opset, outputs, **attributes)
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


@SETTINGS
@given(st.sampled_from([np.uint8, np.int8]), st.integers(1, 3000), st.floats(1e-3, 4.0),
       st.integers(0, 2**16), st.booleans())
def test_quantize_linear_to_bytes_per_tensor_is_the_float32_arithmetic(dtype: Any, size: int, scale: float,
                                                                        seed: int, zero_given: bool) -> None:
    """float32 to a byte type per tensor takes one compiled pass: bit for bit ``x / scale``
    in float32, rounded half to even, plus the zero point, saturated (halves and extremes
    included)."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    y_scale = np.array(scale, np.float32)
    x = (rng.standard_normal(size) * 200 * y_scale).astype(np.float32)
    x[::5] = ((rng.integers(-300, 300, x[::5].size) + 0.5) * y_scale).astype(np.float32)
    zero = np.array(rng.integers(info.min, info.max + 1), dtype) if zero_given else None
    y = ours("QuantizeLinear", [x, y_scale, zero] if zero_given else [x, y_scale], 13)[0]
    expected = np.rint(x / y_scale) + np.float32(0 if zero is None else zero)
    assert y.dtype == (dtype if zero_given else np.uint8)
    bounds = np.iinfo(y.dtype)
    np.testing.assert_array_equal(y, np.clip(expected, bounds.min, bounds.max).astype(y.dtype))


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


# ---------------------------------------------------------------- integer products

BYTE_TYPES = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


def _bytes(rng: np.random.Generator, dtype: Any, shape: Any) -> np.ndarray:
    low, high = BYTE_TYPES[np.dtype(dtype)]
    return rng.integers(low, high + 1, shape).astype(dtype)


def _python_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The product in Python integers (object arrays): exact whatever the sizes."""
    return np.matmul(a.astype(np.int64).astype(object), b.astype(np.int64).astype(object))


@st.composite
def matmul_problems(draw: st.DrawFn) -> dict[str, Any]:
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    m, k, n = (draw(st.integers(1, 6)) for _ in range(3))
    a_type, b_type = (draw(st.sampled_from([np.int8, np.uint8])) for _ in range(2))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return {"a": _bytes(rng, a_type, (*batch, m, k)), "b": _bytes(rng, b_type, (*batch, k, n)),
            "per_row": draw(st.booleans()), "per_column": draw(st.booleans()), "rng": rng}


@SETTINGS
@given(problem=matmul_problems())
def test_matmul_integer_is_exact(problem: dict[str, Any]) -> None:
    a, b, rng = problem["a"], problem["b"], problem["rng"]
    a_zero = _bytes(rng, a.dtype, (a.shape[-2],) if problem["per_row"] else ())
    b_zero = _bytes(rng, b.dtype, (b.shape[-1],) if problem["per_column"] else ())
    y = ours("MatMulInteger", [a, b, a_zero, b_zero], 10)[0]
    expected = _python_matmul(a.astype(np.int64) - a_zero.reshape(-1, 1).astype(np.int64),
                              b.astype(np.int64) - b_zero.astype(np.int64))
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y.astype(object), expected)
    if not problem["per_row"]:  # the reference broadcasts a per-row zero point along K
        check("MatMulInteger", [a, b, a_zero, b_zero], 10)


def test_matmul_integer_long_sums_beyond_float32() -> None:
    """Sums past 2**24, which a float32 product would round."""
    a = np.full((2, 4099), -128, np.int8)
    b = np.full((4099, 3), 127, np.int8)
    b[0, 0] = -128
    y = ours("MatMulInteger", [a, b, np.array(127, np.int8), np.array(-128, np.int8)], 10)[0]
    expected = _python_matmul(a.astype(np.int64) - 127, b.astype(np.int64) + 128)
    assert int(np.abs(expected).max()) > 2**24
    np.testing.assert_array_equal(y.astype(object), expected)


@pytest.mark.parametrize(("magnitude", "length"), [
    (255, 70_000),       # 8-bit operands: the float64 product, past 2**31 (wraps as int32 does)
    (2**20, 2**14),      # partial sums up to 2**54: the int32 product instead
])
def test_exact_matmul_wraps_like_int32_on_either_path(magnitude: int, length: int) -> None:
    rng = np.random.default_rng(7)
    a = rng.integers(magnitude // 2, magnitude + 1, size=(2, length)).astype(np.int32)
    b = rng.integers(magnitude // 2, magnitude + 1, size=(length, 3)).astype(np.int32)
    exact = a.astype(object) @ b.astype(object)
    wrapped = ((exact + 2**31) % 2**32 - 2**31).astype(np.int64)
    y = exact_matmul(a, b)
    assert y.dtype == np.int32 and np.abs(exact).max() > 2**31
    np.testing.assert_array_equal(y, wrapped)


def _naive_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dilation: int, group: int
                ) -> np.ndarray:
    """A 2-D convolution summed in int64, one kernel position at a time."""
    x = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    m, cg, kh, kw = w.shape
    oh = (x.shape[2] - (kh - 1) * dilation - 1) // stride + 1
    ow = (x.shape[3] - (kw - 1) * dilation - 1) // stride + 1
    out = np.zeros((x.shape[0], m, oh, ow), np.int64)
    mg = m // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                patch = x[:, g * cg:(g + 1) * cg, i * dilation:i * dilation + stride * (oh - 1) + 1:stride,
                          j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
                out[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", patch,
                                                         w[g * mg:(g + 1) * mg, :, i, j].astype(np.int64))
    return out


@st.composite
def conv_problems(draw: st.DrawFn) -> dict[str, Any]:
    group = draw(st.integers(1, 2))
    channels, filters = group * draw(st.integers(1, 3)), group * draw(st.integers(1, 3))
    kernel, dilation, stride, pad = (draw(st.integers(1, 3)), draw(st.integers(1, 2)),
                                     draw(st.integers(1, 2)), draw(st.integers(0, 2)))
    size = draw(st.integers((kernel - 1) * dilation + 1, 7))
    x_type, w_type = (draw(st.sampled_from([np.int8, np.uint8])) for _ in range(2))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return {"x": _bytes(rng, x_type, (draw(st.integers(1, 2)), channels, size, size + 1)),
            "w": _bytes(rng, w_type, (filters, channels // group, kernel, kernel)),
            "attributes": {"group": group, "strides": [stride] * 2, "dilations": [dilation] * 2,
                           "pads": [pad] * 4},
            "per_channel": draw(st.booleans()), "rng": rng}


@SETTINGS
@given(problem=conv_problems())
def test_conv_integer_is_exact(problem: dict[str, Any]) -> None:
    x, w, rng, attributes = problem["x"], problem["w"], problem["rng"], problem["attributes"]
    x_zero = _bytes(rng, x.dtype, ())
    w_zero = _bytes(rng, w.dtype, (w.shape[0],) if problem["per_channel"] else ())
    y = check("ConvInteger", [x, w, x_zero, w_zero], 10, **attributes)[0]
    assert y.dtype == np.int32
    expected = _naive_conv(x.astype(np.int64) - int(x_zero),
                           w.astype(np.int64) - w_zero.astype(np.int64).reshape(-1, 1, 1, 1),
                           attributes["strides"][0], attributes["pads"][0], attributes["dilations"][0],
                           attributes["group"])
    np.testing.assert_array_equal(y, expected)


def test_conv_integer_auto_pad_and_one_dimension() -> None:
    rng = np.random.default_rng(3)
    x, w = _bytes(rng, np.uint8, (1, 2, 9)), _bytes(rng, np.uint8, (3, 2, 4))
    check("ConvInteger", [x, w, np.array(100, np.uint8)], 10, auto_pad="SAME_UPPER", strides=[2])


# ---------------------------------------------------------------- QLinearMatMul, QLinearConv


@SETTINGS
@given(problem=matmul_problems(), scale_type=st.sampled_from([np.float32, np.float16]),
       y_type=st.sampled_from([np.int8, np.uint8]))
def test_qlinear_matmul(problem: dict[str, Any], scale_type: Any, y_type: Any) -> None:
    a, b, rng = problem["a"], problem["b"], problem["rng"]
    columns = (b.shape[-1],) if problem["per_column"] else ()
    inputs = [a, np.array(rng.uniform(0.01, 0.1), scale_type), _bytes(rng, a.dtype, ()),
              b, rng.uniform(0.01, 0.1, columns).astype(scale_type), _bytes(rng, b.dtype, columns),
              np.array(rng.uniform(0.05, 0.5), scale_type), _bytes(rng, y_type, ())]
    check("QLinearMatMul", inputs, 21 if scale_type == np.float16 else 10)


def test_qlinear_matmul_per_row_scales() -> None:
    """Row i of the result is the per-tensor result with row i's scale and zero point."""
    rng = np.random.default_rng(5)
    a, b = _bytes(rng, np.uint8, (3, 4)), _bytes(rng, np.int8, (4, 2))
    a_scale, a_zero = np.float32([0.02, 0.05, 0.1]), np.uint8([3, 128, 250])
    rest = [b, np.float32(0.03), np.int8(1), np.float32(0.2), np.uint8(7)]
    y = ours("QLinearMatMul", [a, a_scale, a_zero, *map(np.asarray, rest)], 21)[0]
    for i in range(3):
        row = ours("QLinearMatMul", [a[i:i + 1], a_scale[i:i + 1], a_zero[i:i + 1],
                                     *map(np.asarray, rest)], 21)
        np.testing.assert_array_equal(y[i:i + 1], row[0])


@SETTINGS
@given(problem=conv_problems(), bias=st.booleans(), y_type=st.sampled_from([np.int8, np.uint8]))
def test_qlinear_conv(problem: dict[str, Any], bias: bool, y_type: Any) -> None:
    x, w, rng = problem["x"], problem["w"], problem["rng"]
    channels = (w.shape[0],) if problem["per_channel"] else ()
    inputs = [x, np.array(rng.uniform(0.01, 0.1), np.float32), _bytes(rng, x.dtype, ()),
              w, rng.uniform(0.01, 0.1, channels).astype(np.float32), _bytes(rng, w.dtype, channels),
              np.array(rng.uniform(0.5, 2), np.float32), _bytes(rng, y_type, ())]
    if bias:
        inputs.append(rng.integers(-5000, 5000, w.shape[0]).astype(np.int32))
    check("QLinearConv", inputs, 10, **problem["attributes"])


# ---------------------------------------------------------------- errors of the integer products

A8, B8 = np.zeros((2, 3), np.uint8), np.zeros((3, 4), np.uint8)
X8, W8 = np.zeros((1, 2, 4, 4), np.uint8), np.zeros((3, 2, 2, 2), np.uint8)


@pytest.mark.parametrize(("op", "inputs", "attributes", "message"), [
    ("MatMulInteger", [A8, B8, np.array(0, np.int8)], {}, "a_zero_point's type int8 differs"),
    ("MatMulInteger", [A8, B8, None, np.zeros(3, np.uint8)], {}, r"b_zero_point of shape \[3\] does not fit"),
    ("MatMulInteger", [A8, np.zeros((4, 3), np.uint8)], {}, r"cannot multiply shapes \[2, 3\] and \[4, 3\]"),
    ("ConvInteger", [X8, W8, np.zeros(2, np.uint8)], {}, "x_zero_point must be a scalar"),
    ("ConvInteger", [X8, W8], {"group": 2}, "do not match group 2"),
    ("ConvInteger", [X8, W8], {"strides": [0, 1]}, "strides must be positive"),
    ("QLinearConv", [X8, np.float32(1), np.uint8(0), W8, np.ones(2, np.float32), np.uint8(0),
                     np.float32(1), np.uint8(0)], {}, r"w_scale of shape \[2\] does not fit"),
    ("QLinearConv", [X8, np.float32(1), np.uint8(0), W8, np.float32(1), np.uint8(0),
                     np.float32(1), np.uint8(0), np.zeros(3, np.int64)], {}, "the bias must be int32"),
    ("QLinearMatMul", [A8, np.float32(1), np.uint8(0), B8, np.float16(1), np.uint8(0),
                       np.float32(1), np.uint8(0)], {}, "the scales' types differ"),
])
def test_integer_product_errors(op: str, inputs: list[Any], attributes: dict[str, Any], message: str) -> None:
    arrays = [None if v is None else np.asarray(v) for v in inputs]
    with pytest.raises(KernelError, match=rf"node '{op.lower()}_node' \({op}\): .*{message}"):
        ours(op, arrays, 21 if op == "QLinearMatMul" else 10, **attributes)


# ---------------------------------------------------------------- a QDQ model from onnxruntime's quantizer


def _float_conv_matmul_model(rng: np.random.Generator) -> onnx.ModelProto:
    """x (1, 3, 8, 8) -> Conv (4 filters, 3x3) -> Relu -> Flatten -> MatMul (144 x 5)."""
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.1, "b")
    m = numpy_helper.from_array(rng.standard_normal((144, 5)).astype(np.float32) * 0.1, "m")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "m"], ["y"], name="matmul")]
    graph = helper.make_graph(nodes, "conv_matmul",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], [w, b, m])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_qdq_model_from_quantize_static_matches_onnxruntime(tmp_path: Any) -> None:
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from onnx_light.runtime import RuntimeSession

    rng = np.random.default_rng(11)
    samples = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter({"x": s} for s in samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    source, quantized = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(_float_conv_matmul_model(rng), source)
    quantize_static(str(source), str(quantized), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    reduce_range=onnxruntime_saturates())
    model = onnx.load(quantized)
    ops = {node.op_type for node in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "MatMul"} <= ops, ops
    per_axis = [n for n in model.graph.node if n.op_type == "DequantizeLinear"
                and any(i.name == n.input[1] and len(i.dims) == 1 for i in model.graph.initializer)]
    assert per_axis, "per-channel weights expected"
    # the output's quantization step: the scale of the last QuantizeLinear
    last = next(n for n in reversed(model.graph.node) if n.op_type == "QuantizeLinear")
    step = next(float(numpy_helper.to_array(i)) for i in model.graph.initializer if i.name == last.input[1])
    theirs = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
    session = RuntimeSession(str(quantized))
    for x in [*samples[:3], rng.standard_normal((1, 3, 8, 8)).astype(np.float32) * 2]:
        expected = theirs.run(None, {"x": x})[0]
        actual = session.run(None, {"x": x})[0]
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected, rtol=0, atol=step * 1.0001)


def test_products_report_their_multiply_adds() -> None:
    a, b = np.zeros((2, 3, 5), np.uint8), np.zeros((5, 4), np.uint8)
    assert build("MatMulInteger", [a, b], 10)[1].work([a.shape, b.shape], [(2, 3, 4)]) == 2 * 3 * 4 * 5
    x, w = np.zeros((1, 4, 6, 6), np.uint8), np.zeros((6, 2, 3, 3), np.uint8)
    conv = build("ConvInteger", [x, w], 10, group=2)[1]
    assert conv.work([x.shape, w.shape], [(1, 6, 4, 4)]) == 6 * 16 * 2 * 9
    scalar = np.float32(1)
    qconv = build("QLinearConv", [x, scalar, np.uint8(0), w, scalar, np.uint8(0), scalar, np.uint8(0)], 10,
                  group=2)[1]
    assert qconv.work([x.shape, (), (), w.shape, (), (), (), ()], [(1, 6, 4, 4)]) == 6 * 16 * 2 * 9


@pytest.mark.parametrize("target", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2, TensorProto.UINT8])
def test_qlinear_matmul_float8_operands(target: int) -> None:
    """QLinearMatMul-21 on float8: the shifted products summed in float64, the output cast with
    saturation (or rounded and saturated for an integer output)."""
    rng = np.random.default_rng(9)
    f8 = ml_dtypes.float8_e4m3fn
    a, b = rng.uniform(-4, 4, (3, 5)).astype(f8), rng.uniform(-4, 4, (5, 2)).astype(f8)
    a_scale, b_scale, y_scale = np.float32(0.5), np.float32([0.25, 2.0]), np.float32(0.125)
    a_zero, b_zero = np.zeros((), f8), np.zeros(2, f8)
    y_type = FLOAT_TARGETS.get(target, np.uint8)
    y_zero = np.array(3, y_type)
    y = ours("QLinearMatMul", [a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero], 21)[0]
    real = a.astype(np.float64) @ b.astype(np.float64) * (a_scale * b_scale / y_scale).astype(np.float64) + 3
    if target == TensorProto.UINT8:
        expected = np.clip(np.rint(real), 0, 255).astype(np.uint8)
    else:
        limit = float(ml_dtypes.finfo(y_type).max)
        expected = np.clip(real, -limit, limit).astype(y_type)
    assert y.dtype == expected.dtype
    np.testing.assert_array_equal(y.astype(np.float64), expected.astype(np.float64))
    with pytest.raises(KernelError, match=r"QLinearMatMul-10 .*does not take element type float8e4m3fn"):
        ours("QLinearMatMul", [a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero], 10)
