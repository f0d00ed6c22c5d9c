"""The compiled depthwise (one input channel per group, 1-D or 2-D) and pointwise (1x1,
stride 1, no padding) integer convolutions of ConvInteger and QLinearConv: int32 sums against
numpy's int64 sums, requantized outputs bit-for-bit against onnxruntime, serial and split
across threads."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import build, kernel_state
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.integer_gemm import MINIMUM_MACS
from onnx_light.kernels.integer_loops import SHORT_ROW
from onnx_light.parallel import ThreadPool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from quantized_models import onnxruntime_saturates

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)
RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}


def _bytes(rng: np.random.Generator, dtype: Any, shape: Any) -> np.ndarray:
    low, high = RANGES[np.dtype(dtype)]
    return rng.integers(low, high + 1, shape).astype(dtype)


@st.composite
def depthwise_problems(draw: st.DrawFn) -> dict[str, Any]:
    """A depthwise convolution: 1-D or 2-D, kernel height 1-4 and width 1 or 3 (the loop
    compiles once per kernel width), strides 1-3, pads 0-2 on each side
    independently, dilation 1-2, byte types, zero points per tensor or per channel."""
    rank = draw(st.integers(1, 2))
    channels = draw(st.integers(2, 6))
    kernel = [*(draw(st.integers(1, 4)) for _ in range(rank - 1)), draw(st.sampled_from([1, 3]))]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [draw(st.integers(1, 2)) for _ in range(rank)]
    pads = [draw(st.integers(0, 2)) for _ in range(2 * rank)]
    size = [draw(st.integers(max(1, (k - 1) * d + 1 - p - q), 9))
            for k, d, p, q in zip(kernel, dilations, pads[:rank], pads[rank:], strict=True)]
    x_type = draw(st.sampled_from([np.uint8, np.int8]))
    w_type = np.int8 if x_type == np.int8 else draw(st.sampled_from([np.uint8, np.int8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    per_channel = draw(st.booleans())
    return {"x": _bytes(rng, x_type, (draw(st.integers(1, 2)), channels, *size)),
            "w": _bytes(rng, w_type, (channels, 1, *kernel)),
            "attributes": {"group": channels, "strides": strides, "dilations": dilations, "pads": pads},
            "w_zero": _bytes(rng, w_type, (channels,) if per_channel else ()), "rng": rng}


@st.composite
def pointwise_problems(draw: st.DrawFn) -> dict[str, Any]:
    """A 1x1 convolution: 1-D to 3-D, up to 9 input channels (the loop takes four a pass),
    up to 440 positions (the loop takes 256 at a time)."""
    rank = draw(st.integers(1, 3))
    size = [draw(st.integers(1, 22 if rank == 2 else 5)) for _ in range(rank)]
    channels, filters = draw(st.integers(1, 9)), draw(st.integers(1, 5))
    x_type = draw(st.sampled_from([np.uint8, np.int8]))
    w_type = np.int8 if x_type == np.int8 else draw(st.sampled_from([np.uint8, np.int8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    per_channel = draw(st.booleans())
    return {"x": _bytes(rng, x_type, (draw(st.integers(1, 2)), channels, *size)),
            "w": _bytes(rng, w_type, (filters, channels, *[1] * rank)), "attributes": {},
            "w_zero": _bytes(rng, w_type, (filters,) if per_channel else ()), "rng": rng}


@st.composite
def windowed_problems(draw: st.DrawFn) -> dict[str, Any]:
    """A convolution the packed product takes through its packed windows: 1-D or 2-D,
    kernels 1-3, strides 1-2, pads 0-2, dilation 1-2, group 1-2, up to 7 input channels per
    group (reduced lengths not a multiple of four), up to 9 filters and 14 x 14 positions
    (every micro-tile shape), byte types, zero points per tensor or per channel."""
    rank = draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [draw(st.integers(1, 2)) for _ in range(rank)]
    dilations = [draw(st.integers(1, 2)) for _ in range(rank)]
    pads = [draw(st.integers(0, 2)) for _ in range(2 * rank)]
    size = [draw(st.integers(max(1, (k - 1) * d + 1 - p - q), 14 if rank == 2 else 40))
            for k, d, p, q in zip(kernel, dilations, pads[:rank], pads[rank:], strict=True)]
    group = draw(st.integers(1, 2))
    channels, filters = draw(st.integers(1, 7)), draw(st.integers(1, 9))
    x_type = draw(st.sampled_from([np.uint8, np.int8]))
    w_type = np.int8 if x_type == np.int8 else draw(st.sampled_from([np.uint8, np.int8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    per_channel = draw(st.booleans())
    return {"x": _bytes(rng, x_type, (draw(st.integers(1, 2)), channels * group, *size)),
            "w": _bytes(rng, w_type, (filters * group, channels, *kernel)),
            "attributes": {"group": group, "strides": strides, "dilations": dilations, "pads": pads},
            "w_zero": _bytes(rng, w_type, (filters * group,) if per_channel else ()), "rng": rng}


def _split(kernel: Any) -> Any:
    """``kernel`` on two threads, splitting whatever its size."""
    kernel.bind(ThreadPool(2))
    kernel.configure({MINIMUM_MACS: 1})
    return kernel


def _naive(problem: dict[str, Any], x_zero: np.ndarray) -> np.ndarray:
    """The exact sums of a depthwise, pointwise or windowed problem, in int64."""
    x, w, w_zero = problem["x"], problem["w"], problem["w_zero"]
    shifted = w.astype(np.int64) - w_zero.astype(np.int64).reshape((-1,) + (1,) * (w.ndim - 1))
    if problem["attributes"]:  # depthwise (one channel per group) or windowed
        return _naive_windows(x.astype(np.int64) - int(x_zero), shifted, problem["attributes"])
    return np.einsum("nc...,mc->nm...", x.astype(np.int64) - int(x_zero), shifted.reshape(w.shape[:2]))


def _naive_windows(x: np.ndarray, w: np.ndarray, attributes: dict[str, Any]) -> np.ndarray:
    """A grouped 1-D or 2-D convolution of int64 ``x`` and ``w`` (strides, dilations, pads),
    one kernel offset at a time (the rank-1 case as a 2-D one of height 1)."""
    rank = x.ndim - 2
    strides, dilations, pads = attributes["strides"], attributes["dilations"], attributes["pads"]
    if rank == 1:
        x, w = x[:, :, None], w[:, :, None]
        strides, dilations, pads = [1, *strides], [1, *dilations], [0, pads[0], 0, pads[1]]
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    m, per_group, kh, kw = w.shape
    group = attributes["group"]
    filters = m // group
    oh = (x.shape[2] - (kh - 1) * dilations[0] - 1) // strides[0] + 1
    ow = (x.shape[3] - (kw - 1) * dilations[1] - 1) // strides[1] + 1
    out = np.zeros((x.shape[0], m, oh, ow), np.int64)
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                patch = x[:, g * per_group:(g + 1) * per_group,
                          i * dilations[0]:i * dilations[0] + strides[0] * (oh - 1) + 1:strides[0],
                          j * dilations[1]:j * dilations[1] + strides[1] * (ow - 1) + 1:strides[1]]
                out[:, g * filters:(g + 1) * filters] += np.einsum(
                    "nchw,mc->nmhw", patch, w[g * filters:(g + 1) * filters, :, i, j])
    return out.reshape(*out.shape[:2], *([ow] if rank == 1 else [oh, ow]))


@SETTINGS
@given(problem=st.one_of(depthwise_problems(), pointwise_problems(), windowed_problems()),
       threads=st.sampled_from([1, 2]))
def test_conv_integer_is_exact(problem: dict[str, Any], threads: int) -> None:
    x, w, rng, w_zero = problem["x"], problem["w"], problem["rng"], problem["w_zero"]
    x_zero = _bytes(rng, x.dtype, ())
    kernel = build("ConvInteger", [x, w, x_zero, w_zero], 10, **problem["attributes"])[1]
    actual = (_split(kernel) if threads == 2 else kernel).run(x, w, x_zero, w_zero)[0]
    assert actual.dtype == np.int32
    np.testing.assert_array_equal(actual, _naive(problem, x_zero))


def _onnxruntime_qlinear_conv(inputs: list[np.ndarray], attributes: dict[str, Any]) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    names = ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero", "bias"]
    constants = [numpy_helper.from_array(value, name)
                 for name, value in zip(names[1:], inputs[1:], strict=False)]
    node = helper.make_node("QLinearConv", names[:len(inputs)], ["y"], **attributes)
    x = inputs[0]
    graph = helper.make_graph([node], "depthwise", [helper.make_tensor_value_info(
        "x", TensorProto.UINT8 if x.dtype == np.uint8 else TensorProto.INT8, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8 if x.dtype == np.uint8 else TensorProto.INT8,
                                       None)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@SETTINGS
@given(problem=st.one_of(depthwise_problems(), pointwise_problems(), windowed_problems()), bias=st.booleans(),
       threads=st.sampled_from([1, 2]))
def test_qlinear_conv_matches_onnxruntime(problem: dict[str, Any], bias: bool, threads: int
                                                   ) -> None:
    """The output of the input's type (the only one onnxruntime's QLinearConv has); int8
    weights halved to 7 bits where onnxruntime's byte products saturate."""
    x, w, rng = problem["x"], problem["w"], problem["rng"]
    if w.dtype == np.int8 and onnxruntime_saturates():
        w = w >> 1
    w_scale = rng.uniform(0.01, 0.1, problem["w_zero"].shape).astype(np.float32)
    inputs = [x, np.array(rng.uniform(0.01, 0.1), np.float32), _bytes(rng, x.dtype, ()),
              w, w_scale, problem["w_zero"], np.array(rng.uniform(0.05, 0.5), np.float32),
              _bytes(rng, x.dtype, ())]
    if bias:
        inputs.append(rng.integers(-5000, 5000, w.shape[0]).astype(np.int32))
    kernel = build("QLinearConv", inputs, 10, **problem["attributes"])[1]
    actual = (_split(kernel) if threads == 2 else kernel).run(*inputs)[0]
    expected = _onnxruntime_qlinear_conv(inputs, problem["attributes"])
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("width", [SHORT_ROW - 1, SHORT_ROW, 2 * SHORT_ROW + 3])
@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
def test_depthwise_requantizes_short_and_long_rows(width: int, strides: list[int]) -> None:
    """A 3x3 depthwise QLinearConv whose output rows are shorter than ``SHORT_ROW`` (the
    loop requantizes the whole run at once) or not (row by row), against onnxruntime."""
    rng = np.random.default_rng(width + strides[0])
    x, w = _bytes(rng, np.uint8, (1, 3, 5, width)), _bytes(rng, np.int8, (3, 1, 3, 3)) >> 1
    inputs = [x, np.float32(0.05), np.uint8(7), w, rng.uniform(0.01, 0.1, 3).astype(np.float32),
              np.zeros(3, np.int8), np.float32(0.3), np.uint8(128),
              rng.integers(-900, 900, 3).astype(np.int32)]
    inputs = [np.asarray(value) for value in inputs]
    attributes = {"group": 3, "strides": strides, "pads": [1, 1, 1, 1]}
    actual = build("QLinearConv", inputs, 10, **attributes)[1].run(*inputs)[0]
    np.testing.assert_array_equal(actual, _onnxruntime_qlinear_conv(inputs, attributes))


@pytest.mark.parametrize("group", [1, 4])
def test_qlinear_conv_route_settled_at_construction(group: int) -> None:
    """A QLinearConv specialized for its constant inputs and settled for X's shape holds its
    plan and route (depthwise or packed windows) before any run; runs of that shape go
    straight to the loops with onnxruntime's result and change none of the kernel's
    attributes; another shape or another constant array runs the whole path, unkept."""
    rng = np.random.default_rng(group)
    x, w = _bytes(rng, np.uint8, (1, 4, 9, 9)), _bytes(rng, np.int8, (4, 4 // group, 3, 3)) >> 1
    inputs = [x, np.float32(0.05), np.uint8(7), w, rng.uniform(0.01, 0.1, 4).astype(np.float32),
              np.zeros(4, np.int8), np.float32(0.3), np.uint8(128),
              rng.integers(-900, 900, 4).astype(np.int32)]
    inputs = [np.asarray(value) for value in inputs]
    attributes = {"group": group, "pads": [1, 1, 1, 1]}
    built = build("QLinearConv", inputs, 10, **attributes)[1]
    kernel = built.specialize([None, *inputs[1:]]).settle([x.shape, *(None for _ in inputs[1:])])
    assert kernel.route is not None and kernel.route.call is not None
    assert built.route is None and not built.depthwise_plans and not built.window_plans
    before = kernel_state(kernel)
    first = kernel.run(*inputs)[0]
    np.testing.assert_array_equal(first, _onnxruntime_qlinear_conv(inputs, attributes))
    np.testing.assert_array_equal(kernel.run(*inputs)[0], first)
    wider = [_bytes(rng, np.uint8, (1, 4, 9, 12)), *inputs[1:]]
    np.testing.assert_array_equal(kernel.run(*wider)[0], _onnxruntime_qlinear_conv(wider, attributes))
    other_bias = [*inputs[:8], np.zeros(4, np.int32)]
    np.testing.assert_array_equal(kernel.run(*other_bias)[0],
                                  _onnxruntime_qlinear_conv(other_bias, attributes))
    assert kernel_state(kernel) == before
    # the kernel unspecialized makes its plans per run, keeping none
    np.testing.assert_array_equal(built.run(*inputs)[0], first)
    assert built.route is None and not built.depthwise_plans and not built.window_plans


def test_depthwise_compiled_at_specialization() -> None:
    """A session compiles the loop for its constant weights' kernel width and output type."""
    rng = np.random.default_rng(4)
    x, w = _bytes(rng, np.uint8, (1, 3, 6, 6)), _bytes(rng, np.int8, (3, 1, 3, 3))
    inputs = [x, np.float32(0.05), np.uint8(7), w, np.float32(0.02), np.int8(0), np.float32(0.3),
              np.uint8(128)]
    inputs = [np.asarray(value) for value in inputs]
    kernel = build("QLinearConv", inputs, 10, group=3, pads=[1, 1, 1, 1])[1]
    specialized = kernel.specialize(inputs) or kernel
    expected = _onnxruntime_qlinear_conv(inputs, {"group": 3, "pads": [1, 1, 1, 1]})
    np.testing.assert_array_equal(specialized.run(*inputs)[0], expected)


@pytest.mark.parametrize(("kernel", "attributes"), [(1, {}), (3, {"pads": [1, 1, 1, 1], "group": 2})])
def test_float32_sums_beyond_2_to_24_are_exact(kernel: int, attributes: dict[str, Any]) -> None:
    """600 input channels of extreme shifted bytes (the pointwise loop, and the blas
    algorithm's product): sums far beyond 2**24, still exact."""
    rng = np.random.default_rng(6)
    x = rng.integers(250, 256, (1, 600, 3, 5)).astype(np.uint8)
    w = rng.integers(0, 4, (4, 600 // attributes.get("group", 1), kernel, kernel)).astype(np.uint8)
    x_zero, w_zero = np.asarray(np.uint8(0)), np.asarray(np.uint8(255))
    actual = build("ConvInteger", [x, w, x_zero, w_zero], 10, **attributes)[1].run(x, w, x_zero, w_zero)[0]
    expected = _naive_conv(x.astype(np.int64), w.astype(np.int64) - 255, attributes)
    assert np.abs(expected).max() > 2**25
    np.testing.assert_array_equal(actual, expected)


def _naive_conv(x: np.ndarray, w: np.ndarray, attributes: dict[str, Any]) -> np.ndarray:
    """A 2-D convolution at stride 1 in int64, one kernel offset at a time."""
    group, pad = attributes.get("group", 1), attributes.get("pads", [0])[0]
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    m, per_group, kh, kw = w.shape
    oh, ow = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    out = np.zeros((x.shape[0], m, oh, ow), np.int64)
    filters = m // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                out[:, g * filters:(g + 1) * filters] += np.einsum(
                    "nchw,mc->nmhw", x[:, g * per_group:(g + 1) * per_group, i:i + oh, j:j + ow],
                    w[g * filters:(g + 1) * filters, :, i, j])
    return out


@pytest.mark.parametrize("left", [0, 1, 2])
@pytest.mark.parametrize("width", [9, 10, 16, 18])
@pytest.mark.parametrize("x_type", [np.uint8, np.int8])
def test_depthwise_stride_two_columns(left: int, width: int, x_type: Any) -> None:
    """Stride 2 along the width (the loop's copy of columns into the two phases: by 16-bit
    words of two columns over an even width of 16 or more, else byte by byte): every left
    padding parity and width parity, both byte types (an int8 word's bytes sign-extended),
    against int64 sums."""
    rng = np.random.default_rng(left * 10 + width)
    attributes = {"group": 3, "strides": [1, 2], "dilations": [1, 1], "pads": [1, left, 1, 1]}
    problem = {"x": _bytes(rng, x_type, (2, 3, 5, width)), "w": _bytes(rng, np.int8, (3, 1, 3, 3)),
               "attributes": attributes, "w_zero": _bytes(rng, np.int8, (3,)), "rng": rng}
    x_zero = _bytes(rng, x_type, ())
    x, w, w_zero = problem["x"], problem["w"], problem["w_zero"]
    actual = build("ConvInteger", [x, w, x_zero, w_zero], 10, **attributes)[1].run(x, w, x_zero, w_zero)[0]
    np.testing.assert_array_equal(actual, _naive(problem, x_zero))


@pytest.mark.parametrize("size", [16, 17])
def test_depthwise_extreme_windows_are_exact(size: int) -> None:
    """Shifted bytes of the largest magnitude (255 x -255) over a 16 x 16 window (256 taps,
    summed in float32: every partial sum below 2**24) and a 17 x 17 one (289 taps: int32)."""
    x = np.full((1, 2, size, size), 255, np.uint8)
    w = np.zeros((2, 1, size, size), np.uint8)
    x_zero, w_zero = np.asarray(np.uint8(0)), np.asarray(np.uint8(255))
    attributes = {"group": 2, "strides": [1, 1], "dilations": [1, 1], "pads": [1, 0, 0, 1]}
    actual = build("ConvInteger", [x, w, x_zero, w_zero], 10, **attributes)[1].run(x, w, x_zero, w_zero)[0]
    problem = {"x": x, "w": w, "w_zero": w_zero, "attributes": attributes}
    expected = _naive(problem, x_zero)
    assert expected.min() <= -(size - 1) * size * 255 * 255
    np.testing.assert_array_equal(actual, expected)
