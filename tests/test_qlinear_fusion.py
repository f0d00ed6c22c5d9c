"""QLinearAdd fused into the QLinearConv whose output it reads (``runtime/qlinear_fusion.py``,
``kernels/quantized_residual.py``): the fused step's outputs are the unfused pair's, bit for
bit, on every convolution path (packed windows, depthwise, swapped product), both operand
roles, both byte types, scales from tiny to saturating, one and two threads; the runs the
fused arithmetic does not cover (fed scales, a broadcast residual) keep the pair's values."""

from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.contrib.qlinear import _combine_bytes
from onnx_light.kernels.integer_loops import add_residual
from onnx_light.runtime import RuntimeSession

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)
_TYPES = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}


def _bytes(rng: np.random.Generator, dtype: Any, shape: Any) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _scale(rng: np.random.Generator) -> np.float32:
    return np.float32(10.0 ** rng.uniform(-3.5, -0.5))


def _model(x_shape: tuple[int, ...], w: np.ndarray, attributes: dict[str, Any],
           residual_shape: tuple[int, ...], dtype: Any, position: int, rng: np.random.Generator,
           fed_scale: bool = False) -> onnx.ModelProto:
    """QLinearConv(X) -> Y, then QLinearAdd of Y and the fed residual R (Y its input at
    ``position``); random scales, zero points and bias; ``fed_scale``: R's scale is an input."""
    element = _TYPES[np.dtype(dtype)]
    constants = {"x_scale": _scale(rng), "x_zero": _bytes(rng, dtype, ()), "w": w,
                 "w_scale": (10.0 ** rng.uniform(-3, -1, w.shape[0])).astype(np.float32),
                 "w_zero": np.zeros(w.shape[0], np.int8), "y_scale": _scale(rng),
                 "y_zero": _bytes(rng, dtype, ()),
                 "bias": rng.integers(-2000, 2000, w.shape[0]).astype(np.int32),
                 "a_scale": _scale(rng), "a_zero": _bytes(rng, dtype, ()), "c_scale": _scale(rng),
                 "c_zero": _bytes(rng, dtype, ())}
    inputs = [helper.make_tensor_value_info("x", element, x_shape),
              helper.make_tensor_value_info("r", element, residual_shape)]
    if fed_scale:
        inputs.append(helper.make_tensor_value_info("r_scale", TensorProto.FLOAT, []))
    else:
        constants["r_scale"] = _scale(rng)
    constants["r_zero"] = _bytes(rng, dtype, ())
    operands = [["y", "a_scale", "a_zero"], ["r", "r_scale", "r_zero"]]
    if position == 3:
        operands.reverse()
    nodes = [helper.make_node("QLinearConv", ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale",
                                              "y_zero", "bias"], ["y"], **attributes),
             helper.make_node("QLinearAdd", [*operands[0], *operands[1], "c_scale", "c_zero"], ["out"],
                              domain="com.microsoft")]
    graph = helper.make_graph(nodes, "residual", inputs,
                              [helper.make_tensor_value_info("out", element, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _runs(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int) -> tuple[list, list, list[Any]]:
    """The outputs of a session with the fusion and of one without it, and the fused
    session's step kernels. On two threads every product is split across them (the
    convolutions' ``minimum_macs`` set to 1 after construction)."""
    fused = RuntimeSession(model, num_threads=threads)
    with mock.patch("onnx_light.runtime.fusion.fuse_qlinear_add", lambda steps, keep, shapes: list(steps)):
        plain = RuntimeSession(model, num_threads=threads)
    if threads > 1:
        for session in (fused, plain):
            for kernel, _, _ in session._steps:
                getattr(kernel, "conv", kernel).minimum_macs = 1
    return fused.run(None, feeds), plain.run(None, feeds), [kernel for kernel, _, _ in fused._steps]


def _kinds(kernels: list[Any]) -> list[str]:
    return [type(kernel).__name__ for kernel in kernels]


@st.composite
def residual_problems(draw: st.DrawFn) -> dict[str, Any]:
    """A convolution of each path with a residual of its output's shape: a 1x1 or 3x3 one
    the packed windows take (up to 19 filters, positions not a multiple of a micro-tile), a
    depthwise 3x3, or a 1x1 of few positions and many filters (the swapped product)."""
    kind = draw(st.sampled_from(["pointwise", "windows", "depthwise", "swapped"]))
    dtype = draw(st.sampled_from([np.uint8, np.int8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    n = draw(st.integers(1, 2))
    if kind == "swapped":
        c, m, size, kernel, attributes = draw(st.integers(1, 12)), 9, (1, draw(st.integers(1, 7))), 1, {}
    elif kind == "depthwise":
        c = m = draw(st.integers(2, 9))
        size, kernel = (draw(st.integers(1, 12)), draw(st.integers(1, 12))), 3
        attributes = {"group": c, "pads": [1, 1, 1, 1], "strides": [draw(st.integers(1, 2))] * 2}
    else:
        c, m = draw(st.integers(1, 12)), draw(st.integers(1, 19))
        size = (draw(st.integers(1, 15)), draw(st.integers(1, 15)))
        kernel = 1 if kind == "pointwise" else 3
        attributes = {} if kind == "pointwise" else {"pads": [1, 1, 1, 1]}
    w = _bytes(rng, np.int8, (m, 1 if kind == "depthwise" else c, kernel, kernel)) // 2
    stride = attributes.get("strides", [1])[0]
    out = tuple((s - 1) // stride + 1 for s in size)
    return {"x": _bytes(rng, dtype, (n, c, *size)), "w": w, "attributes": attributes,
            "residual": _bytes(rng, dtype, (n, m, *out)), "position": draw(st.sampled_from([0, 3])),
            "threads": draw(st.sampled_from([1, 2])), "rng": rng, "kind": kind}


@SETTINGS
@given(residual_problems())
def test_fused_residual_is_the_unfused_pair(problem: dict[str, Any]) -> None:
    x, residual = problem["x"], problem["residual"]
    model = _model(x.shape, problem["w"], problem["attributes"], residual.shape, x.dtype, problem["position"],
                   problem["rng"])
    fused, plain, kernels = _runs(model, {"x": x, "r": residual}, problem["threads"])
    assert _kinds(kernels) == ["QLinearConvAdd"]
    (step,) = kernels
    assert step.combine is not None and step.output_shape == residual.shape
    # the packed windows add the residual in the product's loop, the others after it
    assert (step.conv.route.call is not None) == (problem["kind"] != "swapped")
    assert fused[0].dtype == plain[0].dtype == x.dtype
    np.testing.assert_array_equal(fused[0], plain[0])


@pytest.mark.parametrize("position", [0, 3])
def test_fed_scale_and_broadcast_residual(position: int) -> None:
    """A fed residual scale keeps the fused step on the pair's arithmetic (its parameters
    are not constant); a residual that broadcasts is not fused."""
    rng = np.random.default_rng(position)
    x, w = _bytes(rng, np.uint8, (1, 5, 6, 7)), _bytes(rng, np.int8, (4, 5, 1, 1)) // 2
    residual = _bytes(rng, np.uint8, (1, 4, 6, 7))
    model = _model(x.shape, w, {}, residual.shape, np.uint8, position, rng, fed_scale=True)
    for scale in (0.01, 0.2):
        feeds = {"x": x, "r": residual, "r_scale": np.array(scale, np.float32)}
        fused, plain, kernels = _runs(model, feeds, 1)
        assert _kinds(kernels) == ["QLinearConvAdd"] and kernels[0].combine is None
        np.testing.assert_array_equal(fused[0], plain[0])
    column = residual[:, :, :1, :1].copy()
    model = _model(x.shape, w, {}, column.shape, np.uint8, position, rng)
    fused, plain, kernels = _runs(model, {"x": x, "r": column}, 1)
    assert _kinds(kernels) == ["QLinearConv", "QLinearAdd"]
    np.testing.assert_array_equal(fused[0], plain[0])


@SETTINGS
@given(dtype=st.sampled_from([np.uint8, np.int8]), out_first=st.booleans(), seed=st.integers(0, 2**16),
       rows=st.integers(1, 5), columns=st.integers(1, 70), ratios=st.floats(-3, 3))
def test_add_residual_is_qlinear_adds_pass(dtype: Any, out_first: bool, seed: int, rows: int, columns: int,
                                           ratios: float) -> None:
    """``add_residual`` on a block of rows gives QLinearAdd's compiled pass's bytes on the
    same operands in either role, for scale ratios from 1/1000 to 1000 (saturating)."""
    rng = np.random.default_rng(seed)
    out, residual = _bytes(rng, dtype, (rows, columns)), _bytes(rng, dtype, (rows, columns))
    info = np.iinfo(dtype)
    scales = (10.0 ** (rng.uniform(-1, 1, 3) + np.array([ratios, 0, 0]))).astype(np.float32)
    zeros = rng.integers(info.min, info.max + 1, 3)
    parameters = np.array([scales[0], zeros[0], scales[1], zeros[1], scales[2], zeros[2], info.min, info.max],
                          np.float32)
    first, second = (out, residual) if out_first else (residual, out)
    expected = np.empty_like(out)
    _combine_bytes(first, second, expected, False, parameters)
    got = out.copy()
    combine = np.append(parameters, 1 if out_first else 0).astype(np.float32)
    add_residual(got, residual, 0, rows, 0, columns, combine)
    np.testing.assert_array_equal(got, expected)
