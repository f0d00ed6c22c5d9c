"""The ``amx`` integer product: AMX tiles give the exact int64 sums and the byte dot-product
kernel's outputs bit for bit, over shapes that are not whole tiles, zero points, biases and
per-channel requantization; where the tiles are not available (processor, or Linux's
permission refused) the algorithm is the byte dot-product kernel's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import byte_product_case, integer_product, random_bytes

from onnx_light.kernels import tile_matrices
from onnx_light.kernels.integer_gemm import ByteRows
from onnx_light.parallel import ThreadPool

needs_tiles = pytest.mark.skipif(not tile_matrices.available(),
                                 reason="no AMX-INT8 tiles here (processor, numba's target or "
                                        "Linux's permission)")


BYTE_PAIRS = [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8), (np.int8, np.uint8)]


@needs_tiles
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 80), depth=st.integers(1, 300), columns=st.integers(1, 90),
       pair=st.sampled_from(BYTE_PAIRS), zero_points=st.booleans(), per_channel=st.booleans(),
       tiles=st.sampled_from([(16, 32), (64, 768), (5, 40)]), seed=st.integers(0, 2**16))
def test_tiles_give_the_exact_sums_and_the_packed_kernels_outputs(
        rows: int, depth: int, columns: int, pair: tuple[Any, Any], zero_points: bool,
        per_channel: bool, tiles: tuple[int, int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b, a_zero, b_zero, bias, expected = byte_product_case(
        rng, *pair, rows, depth, columns, zero_points, per_channel)
    amx, packed = integer_product("amx", *tiles), integer_product("packed", *tiles)
    assert amx.layout == "amx" and packed.layout == "packed"
    got = amx.product(ByteRows(a, a_zero), ByteRows(b, b_zero), bias)
    np.testing.assert_array_equal(got, expected)
    multiplier = rng.uniform(1e-5, 1e-3, (1, columns) if per_channel else (1, 1)).astype(np.float32)
    outputs = []
    for kernel in (amx, packed):
        out = np.empty((rows, columns), np.uint8)
        kernel.product(ByteRows(a, a_zero), ByteRows(b, b_zero), bias,
                       requantization=(out, multiplier, 128, 0, 255))
        outputs.append(out)
    np.testing.assert_array_equal(outputs[0], outputs[1])


@needs_tiles
def test_tiles_split_across_threads_and_transposed_outputs() -> None:
    """Two threads split the rows (then the columns) in whole blocks of tiles; a transposed
    requantized output is written through its strides."""
    rng = np.random.default_rng(5)
    a, b = random_bytes(rng, np.uint8, (131, 200)), random_bytes(rng, np.int8, (45, 200))
    expected = (a.astype(np.int64) - 3) @ b.astype(np.int64).T
    with ThreadPool(2) as pool:
        kernel = integer_product("amx", 32, 32, 1, pool)
        np.testing.assert_array_equal(kernel.product(ByteRows(a, 3), ByteRows(b, 0)), expected)
        np.testing.assert_array_equal(kernel.product(ByteRows(b, 0), ByteRows(a, 3)), expected.T)
        out = np.empty((45, 131), np.int8).T
        kernel.product(ByteRows(a, 3), ByteRows(b, 0), requantization=(out, np.full((1, 1), 1e-4, np.float32),
                                                                        0, -128, 127))
        reference = np.empty((131, 45), np.int8)
        integer_product("packed").product(ByteRows(a, 3), ByteRows(b, 0), requantization=(
            reference, np.full((1, 1), 1e-4, np.float32), 0, -128, 127))
        np.testing.assert_array_equal(out, reference)


def test_refused_tiles_fall_back_to_the_packed_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the tiles (here: availability forced off, as when Linux refuses the
    permission), ``amx`` packs and multiplies as ``packed`` does, exactly."""
    monkeypatch.setattr(tile_matrices, "available", lambda: False)
    rng = np.random.default_rng(2)
    a, b = random_bytes(rng, np.uint8, (37, 70)), random_bytes(rng, np.int8, (53, 70))
    kernel = integer_product("amx")
    assert kernel.layout == "packed"
    right = ByteRows(b, 1)
    got = kernel.product(ByteRows(a, 7), right)
    np.testing.assert_array_equal(got, (a.astype(np.int64) - 7) @ (b.astype(np.int64) - 1).T)
    assert list(right.__dict__["_packed"]) == ["packed"]  # the byte dot-product kernel's layout


def test_availability_needs_the_features_and_the_permission(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`available` is False when numba's target lacks AMX-INT8, when Linux refuses the
    permission and when asking fails; it never raises."""
    ask = tile_matrices.available.__wrapped__
    assert tile_matrices.has_amx_int8("+avx512f,+amx-tile,+amx-int8,+amx-bf16")
    assert not tile_matrices.has_amx_int8("+avx512f,+amx-tile,-amx-int8")
    monkeypatch.setattr(tile_matrices, "_target_features", lambda: "+amx-tile,+amx-int8")
    monkeypatch.setattr(tile_matrices, "_permission", lambda: False)
    assert ask() is False

    def fails() -> bool:
        raise OSError("no arch_prctl")

    monkeypatch.setattr(tile_matrices, "_permission", fails)
    assert ask() is False
    monkeypatch.setattr(tile_matrices, "_permission", lambda: True)
    assert ask() is True
    monkeypatch.setattr(tile_matrices, "_target_features", lambda: "+avx512f,+avx512vnni")
    assert ask() is False
