"""Byte products summed in int16 pairs (``integer_gemm.short_sums``: 7-bit int8 weights against
uint8 bytes, ``vpmaddubsw`` on AVX2 without the byte dot product): the packed product's sums
are numpy's int64 sums at the bound (weights of -64 and 64 against 255s) and on random
shapes; a convolution with such weights takes them where the processor has no byte dot
product (packed windows and the swapped product), and its outputs are those of the int16
pairs' product, bit for bit; weights past the bound never take them."""

from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnx_light.kernels.quantized_products as quantized_products
from onnx_light.kernels.integer_gemm import (
    SHORT_WEIGHT,
    ByteRows,
    PackedColumns,
    no_residual,
    packed_layout,
    short_sums,
)
from onnx_light.kernels.integer_loops import packed_sums
from onnx_light.runtime import RuntimeSession

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True)


def _sums(w: np.ndarray, x: np.ndarray, x_zero: int, tile_columns: int = 768) -> np.ndarray:
    """``packed_sums`` of int8 ``w`` (rows, depth) and uint8 ``x`` (depth, columns) in the
    bytes' layout with the int16 pairs' promise, int32 sums."""
    left, right = ByteRows(w, 0), PackedColumns.of(x, x_zero, layout="packed")
    repeated, row_zero, row_sums = left.repeated(right.lanes.dtype, "packed")
    rows, columns = w.shape[0], x.shape[1]
    zeros, out = np.zeros(columns, np.int32), np.empty((rows, columns), np.int32)
    packed_sums(right.lanes, repeated, 0, rows, 0, columns, 64, tile_columns, row_zero, row_sums,
                right.zero, zeros, w.shape[1], np.zeros(rows, np.int32), zeros, np.ones((1, 1), np.float32),
                0, 0, 0, False, out, no_residual(out.dtype), np.zeros(9, np.float32), np.int16(1))
    return out


@SETTINGS
@given(rows=st.integers(1, 13), depth=st.integers(1, 70), columns=st.integers(1, 60),
       tile_columns=st.sampled_from([16, 48, 768]), extreme=st.booleans(), seed=st.integers(0, 2**16))
def test_short_sums_are_exact(rows: int, depth: int, columns: int, tile_columns: int, extreme: bool,
                              seed: int) -> None:
    rng = np.random.default_rng(seed)
    if extreme:  # every pair of products at the int16 bound: 2 x 255 x 64
        w = rng.choice(np.array([-SHORT_WEIGHT, SHORT_WEIGHT], np.int8), (rows, depth))
        x = np.full((depth, columns), 255, np.uint8)
    else:
        w = rng.integers(-SHORT_WEIGHT, SHORT_WEIGHT + 1, (rows, depth)).astype(np.int8)
        x = rng.integers(0, 256, (depth, columns)).astype(np.uint8)
    zero = int(rng.integers(0, 256))
    expected = w.astype(np.int64) @ (x.astype(np.int64) - zero)
    np.testing.assert_array_equal(_sums(w, x, zero, tile_columns), expected)


def test_short_sums_take_only_7_bit_weights_against_uint8() -> None:
    w = np.array([[SHORT_WEIGHT, -SHORT_WEIGHT]], np.int8)
    assert short_sums(ByteRows(w, 0), np.dtype(np.uint8))
    assert not short_sums(ByteRows(w, 0), np.dtype(np.int8))
    assert not short_sums(ByteRows(w + np.int8(1), 0), np.dtype(np.uint8))
    assert not short_sums(ByteRows(w - np.int8(1), 0), np.dtype(np.uint8))
    assert not short_sums(ByteRows(w.view(np.uint8), 0), np.dtype(np.uint8))


def _conv_model(x_shape: tuple[int, ...], w: np.ndarray, rng: np.random.Generator,
                **attributes: Any) -> Any:
    constants = {"x_scale": np.float32(0.02), "x_zero": np.uint8(rng.integers(0, 256)), "w": w,
                 "w_scale": (10.0 ** rng.uniform(-3, -1, w.shape[0])).astype(np.float32),
                 "w_zero": np.zeros(w.shape[0], np.int8), "y_scale": np.float32(rng.uniform(0.05, 0.5)),
                 "y_zero": np.uint8(rng.integers(0, 256)),
                 "bias": rng.integers(-5000, 5000, w.shape[0]).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale",
                                            "y_zero", "bias"], ["y"], **attributes)
    graph = helper.make_graph([node], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.UINT8, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@SETTINGS
@given(channels=st.integers(1, 20), filters=st.integers(1, 20), size=st.integers(1, 17),
       kernel=st.sampled_from([1, 3]), magnitude=st.sampled_from([SHORT_WEIGHT, SHORT_WEIGHT + 1]),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_convolution_with_7_bit_weights(channels: int, filters: int, size: int, kernel: int,
                                        magnitude: int, threads: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = rng.integers(-magnitude, magnitude + 1, (filters, channels, kernel, kernel)).astype(np.int8)
    w.flat[0] = magnitude
    x = rng.integers(0, 256, (1, channels, size, size)).astype(np.uint8)
    model = _conv_model(x.shape, w, rng, pads=[kernel // 2] * 4)
    session = RuntimeSession(model, num_threads=threads)
    with mock.patch.object(quantized_products, "short_sums", lambda *_: False):
        pairs = RuntimeSession(model, num_threads=threads)
    (conv,) = [kernel for kernel, _, _ in session._steps]
    short = magnitude <= SHORT_WEIGHT and conv.layout == "pairs"
    assert conv.weights_layout(conv.packed[2], x.dtype) == (short, "packed" if short else conv.layout)
    # few positions and many filters: the swapped product (weights packed, no window plan)
    assert len(conv.window_plans) == (0 if size * size < 8 <= filters else 1)
    for plan in conv.window_plans.values():
        assert (plan.layout == "packed") == (short or conv.layout == "packed")
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], pairs.run(None, {"x": x})[0])


def test_short_sums_are_the_default_only_without_the_byte_dot_product() -> None:
    if packed_layout("auto") != "pairs":
        pytest.skip("this processor has a byte dot product (or AMX): exact without the int16 promise")
    rng = np.random.default_rng(1)
    w = rng.integers(-SHORT_WEIGHT, SHORT_WEIGHT + 1, (8, 8, 3, 3)).astype(np.int8)
    session = RuntimeSession(_conv_model((1, 8, 9, 9), w, rng, pads=[1, 1, 1, 1]), num_threads=1)
    (conv,) = [kernel for kernel, _, _ in session._steps]
    assert [plan.layout for plan in conv.window_plans.values()] == ["packed"]
    assert all(product.mode.dtype == np.int16
               for plan in conv.window_plans.values() for product, _ in plan.groups)
