"""The ``pairs`` integer product (int16 pairs, ``vpmaddwd``: the packed kernel of processors
without a byte dot product) gives the exact int64 sums over shapes that are not whole
micro-tiles, every pair of byte types, zero points, biases and per-channel requantization,
serial or split across two threads; convolutions packed in its layout likewise; ``auto``
picks the layout by the host's features."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import build, byte_product_case, integer_product, random_bytes
from onnx import TensorProto

from onnx_light.kernels import DECLARATIONS, byte_vectors, tile_matrices
from onnx_light.kernels.integer_gemm import (
    ALGORITHM,
    MINIMUM_MACS,
    TILE_COLUMNS,
    TILE_ROWS,
    ByteRows,
    PackedColumns,
    integer_candidates,
    packed_layout,
    packed_product,
)
from onnx_light.parallel import ThreadPool

BYTE_PAIRS = [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8), (np.int8, np.uint8)]


def _requantized(sums: np.ndarray, multiplier: np.ndarray, zero: int, low: int, high: int,
                 dtype: Any) -> np.ndarray:
    """onnxruntime's requantization in numpy: float32 product, half to even, saturated."""
    scaled = sums.astype(np.int32).astype(np.float32) * multiplier
    return np.clip(np.rint(scaled) + np.float32(zero), low, high).astype(dtype)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 70), depth=st.integers(1, 300), columns=st.integers(1, 90),
       pair=st.sampled_from(BYTE_PAIRS), zero_points=st.booleans(), per_channel=st.booleans(),
       tiles=st.sampled_from([(4, 24), (64, 768), (5, 40), (1, 1)]), seed=st.integers(0, 2**16))
def test_pairs_give_the_exact_sums_and_requantized_outputs(
        rows: int, depth: int, columns: int, pair: tuple[Any, Any], zero_points: bool,
        per_channel: bool, tiles: tuple[int, int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b, a_zero, b_zero, bias, expected = byte_product_case(
        rng, *pair, rows, depth, columns, zero_points, per_channel)
    kernel = integer_product("pairs", *tiles)
    assert kernel.layout == "pairs"
    got = kernel.product(ByteRows(a, a_zero), ByteRows(b, b_zero), bias)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, expected)
    multiplier = rng.uniform(1e-5, 1e-3, (1, columns) if per_channel else (1, 1)).astype(np.float32)
    for dtype, zero, low, high in ((np.uint8, 128, 0, 255), (np.int8, -3, -128, 127)):
        out = np.empty((rows, columns), dtype)
        kernel.product(ByteRows(a, a_zero), ByteRows(b, b_zero), bias,
                       requantization=(out, multiplier, zero, low, high))
        np.testing.assert_array_equal(out, _requantized(expected, multiplier, zero, low, high, dtype))


def test_pairs_split_across_threads_and_write_transposed_outputs() -> None:
    """Two threads split the rows (then the columns) in whole micro-tiles; a transposed
    requantized output is written through its strides; the rows' own zero points too."""
    rng = np.random.default_rng(5)
    a, b = random_bytes(rng, np.uint8, (131, 203)), random_bytes(rng, np.int8, (45, 203))
    a_zero = random_bytes(rng, np.uint8, 131).astype(np.int32)
    expected = (a.astype(np.int64) - a_zero[:, None]) @ (b.astype(np.int64) + 2).T
    with ThreadPool(2) as pool:
        kernel = integer_product("pairs", 8, 24, 1, pool)
        np.testing.assert_array_equal(kernel.product(ByteRows(a, a_zero), ByteRows(b, -2)), expected)
        np.testing.assert_array_equal(kernel.product(ByteRows(b, -2), ByteRows(a, a_zero)), expected.T)
        out = np.empty((45, 131), np.int8).T
        multiplier = np.full((1, 1), 1e-4, np.float32)
        kernel.product(ByteRows(a, a_zero), ByteRows(b, -2), requantization=(out, multiplier, 0, -128, 127))
        np.testing.assert_array_equal(out, _requantized(expected, multiplier, 0, -128, 127, np.int8))


def test_pairs_wrap_like_int32() -> None:
    """255 * 255 * 40000 overflows int32: the pairs' sums wrap as int32 does."""
    a, b = np.full((2, 40000), 255, np.uint8), np.full((3, 40000), 255, np.uint8)
    wrapped = (255 * 255 * 40000 + 2**31) % 2**32 - 2**31
    np.testing.assert_array_equal(integer_product("pairs").product(ByteRows(a, 0), ByteRows(b, 0)),
                                  np.full((2, 3), wrapped))


@pytest.mark.parametrize("depth", [1, 2, 3, 5, 130])
def test_pairs_layout_holds_the_bytes_values_as_int16(depth: int) -> None:
    """Each lane's word holds two rows of the reduced axis as int16 (int8 sign-extended,
    uint8 not), zeros past the last row and column; the left operand keeps its type's
    values and zero points."""
    rng = np.random.default_rng(depth)
    for dtype in (np.int8, np.uint8):
        source = random_bytes(rng, dtype, (depth, 11))
        packed = PackedColumns.of(source, 3, layout="pairs")
        assert packed.layout == "pairs" and packed.lanes.dtype == np.int16
        assert packed.lanes.shape == (2, -(-depth // 2), 8, 2)
        unpacked = packed.lanes.transpose(1, 3, 0, 2).reshape(-1, 16)
        expected = np.zeros_like(unpacked)
        expected[:depth, :11] = source
        np.testing.assert_array_equal(unpacked, expected)
        np.testing.assert_array_equal(packed.column_sums(), source.astype(np.int32).sum(axis=0))
        repeated, zero, sums = ByteRows(source.T, 7).repeated(packed.lanes.dtype, "pairs")
        assert repeated.dtype == np.int16 and repeated.shape == (12, 2 * -(-depth // 2))
        np.testing.assert_array_equal(repeated[:11, :depth], source.T)
        np.testing.assert_array_equal(zero, np.full(11, 7))
        np.testing.assert_array_equal(sums[:11], source.astype(np.int32).sum(axis=0))


CONV_CASES = [
    # (x shape, w shape, attributes): a strided, dilated, padded 2-D one in two groups; a 1-D
    # one; one with few positions and many filters (the product the other way round)
    ((2, 8, 11, 10), (12, 4, 3, 3), {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1],
                                      "dilations": [1, 2]}),
    ((1, 5, 17), (7, 5, 4), {"pads": [2, 1], "strides": [3]}),
    ((1, 9, 5, 5), (70, 9, 3, 3), {"pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attributes"), CONV_CASES)
@pytest.mark.parametrize("pair", BYTE_PAIRS)
def test_convolutions_packed_as_pairs_are_exact(x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                                                attributes: dict[str, Any], pair: tuple[Any, Any]) -> None:
    """ConvInteger's windows packed in the pairs layout (two threads) give the exact int32
    sums; QLinearConv's requantized outputs are those of the exact ``compiled`` product."""
    rng = np.random.default_rng(len(x_shape) + w_shape[0])
    x_type, w_type = pair
    x, w = random_bytes(rng, x_type, x_shape), random_bytes(rng, w_type, w_shape)
    x_zero, w_zero = random_bytes(rng, x_type, ()), random_bytes(rng, w_type, ())
    values = {ALGORITHM: "pairs", TILE_ROWS: 8, TILE_COLUMNS: 48, MINIMUM_MACS: 1}
    with ThreadPool(2) as pool:
        kernel = build("ConvInteger", [x, w, x_zero, w_zero], 10, **attributes)[1]
        kernel.configure(values)
        got = kernel.bind(pool).run(x, w, x_zero, w_zero)[0]
        reference = build("ConvInteger", [x, w, x_zero, w_zero], 10, **attributes)[1]
        reference.configure({**values, ALGORITHM: "compiled"})
        np.testing.assert_array_equal(got, reference.run(x, w, x_zero, w_zero)[0])
        scales = rng.uniform(0.002, 0.02, w_shape[0]).astype(np.float32)
        inputs = [x, np.array(0.03, np.float32), x_zero, w, scales, np.zeros(w_shape[0], w_type),
                  np.array(0.2, np.float32), random_bytes(rng, x_type, ()),
                  rng.integers(-3000, 3000, w_shape[0]).astype(np.int32)]
        outputs = []
        for algorithm in ("pairs", "compiled"):
            qlinear = build("QLinearConv", inputs, 13, **attributes)[1]
            qlinear.configure({**values, ALGORITHM: algorithm})
            outputs.append(qlinear.bind(pool).run(*inputs)[0])
        np.testing.assert_array_equal(outputs[0], outputs[1])


def test_auto_picks_the_layout_by_the_hosts_features(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto``: AMX tiles where available, else the byte dot product where the processor
    has it, else int16 pairs; ``amx`` falls back to ``packed`` as before; ``packed`` and
    ``pairs`` are what they name. The quantized contrib products pack in ``auto``'s layout."""
    for tiles, bytes_dot, auto, amx in ((True, True, "amx", "amx"), (False, True, "packed", "packed"),
                                        (False, False, "pairs", "packed")):
        monkeypatch.setattr(tile_matrices, "available", lambda tiles=tiles: tiles)
        monkeypatch.setattr(byte_vectors, "available", lambda bytes_dot=bytes_dot: bytes_dot)
        assert (packed_layout("auto"), packed_layout("amx")) == (auto, amx)
        assert (packed_layout("packed"), packed_layout("pairs")) == ("packed", "pairs")
    assert integer_product("auto").layout == "pairs"
    with pytest.raises(ValueError, match="unknown packed layout 'quads'"):
        ByteRows(np.zeros((2, 3), np.int8), 0).packed("quads")
    assert integer_product("compiled").layout == "packed"  # unused: its right operand is not packed
    assert dict(DECLARATIONS["", "QLinearConv"].schema(TensorProto.UINT8).defaults)[ALGORITHM] == "auto"
    # the calibration tries every concrete algorithm, ``pairs`` included (``auto`` is one of them)
    assert {values[ALGORITHM] for values in integer_candidates()} == {"amx", "packed", "pairs", "compiled",
                                                                      "blas"}


def test_host_layouts_agree_with_each_other() -> None:
    """Whatever this host's ``auto`` layout, the other packed layouts compute the same sums
    (``packed`` through portable vector code where the processor lacks the instruction)."""
    rng = np.random.default_rng(11)
    a, b = random_bytes(rng, np.uint8, (29, 77)), random_bytes(rng, np.int8, (41, 77))
    expected = (a.astype(np.int64) - 9) @ (b.astype(np.int64) + 1).T
    for layout in ("packed", "pairs", packed_layout("auto")):
        np.testing.assert_array_equal(packed_product(ByteRows(a, 9), ByteRows(b, -1).packed(layout)),
                                      expected)
