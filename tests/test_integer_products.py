"""The tunable integer product: every configuration exact and identical, serial equal to
parallel, the QLinear operators bit-for-bit onnxruntime's, bad values refused, calibration
end to end on a fresh registry."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import build
from onnx import TensorProto

from onnx_light.kernels import DECLARATIONS
from onnx_light.kernels.base import KernelError
from onnx_light.kernels.integer_gemm import (
    ALGORITHM,
    MINIMUM_MACS,
    PRODUCT_CORPUS,
    TILE_COLUMNS,
    TILE_ROWS,
    ByteRows,
    IntegerProductConfigurations,
    PackedColumns,
    integer_candidates,
    no_residual,
)
from onnx_light.kernels.integer_loops import packed_sums
from onnx_light.parallel import ThreadPool
from onnx_light.tuning import KernelTuningRegistry, calibrate_kernel_tuning
from onnx_light.tuning.processor import execution_descriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from quantized_models import int8_weights

OPS = ("QLinearMatMul", "QLinearConv", "MatMulInteger", "ConvInteger")
CONFIGURATIONS = [
    {ALGORITHM: "packed", TILE_ROWS: 5, TILE_COLUMNS: 30, MINIMUM_MACS: 1 << 40},
    {ALGORITHM: "blas", TILE_ROWS: 16, TILE_COLUMNS: 64, MINIMUM_MACS: 1 << 40},
    {ALGORITHM: "packed", TILE_ROWS: 64, TILE_COLUMNS: 192, MINIMUM_MACS: 1},
    {ALGORITHM: "compiled", TILE_ROWS: 3, TILE_COLUMNS: 5, MINIMUM_MACS: 1 << 40},
    {ALGORITHM: "compiled", TILE_ROWS: 16, TILE_COLUMNS: 64, MINIMUM_MACS: 1},
    {ALGORITHM: "blas", TILE_ROWS: 2, TILE_COLUMNS: 7, MINIMUM_MACS: 1},
    {ALGORITHM: "amx", TILE_ROWS: 5, TILE_COLUMNS: 30, MINIMUM_MACS: 1 << 40},
    {ALGORITHM: "amx", TILE_ROWS: 64, TILE_COLUMNS: 192, MINIMUM_MACS: 1},
    {ALGORITHM: "pairs", TILE_ROWS: 5, TILE_COLUMNS: 30, MINIMUM_MACS: 1 << 40},
    {ALGORITHM: "pairs", TILE_ROWS: 64, TILE_COLUMNS: 192, MINIMUM_MACS: 1},
    {ALGORITHM: "auto", TILE_ROWS: 64, TILE_COLUMNS: 768, MINIMUM_MACS: 1},
]


def _bytes(rng: np.random.Generator, dtype: Any, shape: Any) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _kernel(op: str, inputs: list[np.ndarray | None], opset: int, values: dict[str, Any],
            pool: ThreadPool | None = None, **attributes: Any) -> Any:
    kernel = build(op, inputs, opset, **attributes)[1]
    kernel.configure(values)
    return kernel.bind(pool)


@pytest.mark.parametrize(("left", "right"), [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)])
@pytest.mark.parametrize("depth", [1, 300, 1100])  # 1100: several float32 chunks of every pair
def test_every_configuration_gives_the_exact_sums(left: Any, right: Any, depth: int) -> None:
    rng = np.random.default_rng(depth)
    a, b = _bytes(rng, left, (19, depth)), _bytes(rng, right, (61, depth))  # 61: 24 + 24 + 8 + 5
    a_zero, b_zero = _bytes(rng, left, 19).astype(np.int32), _bytes(rng, right, 61).astype(np.int32)
    bias = rng.integers(-2**20, 2**20, (1, 61)).astype(np.int32)
    expected = (a.astype(np.int64) - a_zero[:, None]) @ (b.astype(np.int64) - b_zero[:, None]).T + bias
    kernel = build("MatMulInteger", [a, b.T], 10)[1]
    with ThreadPool(2) as pool:
        kernel.bind(pool)
        for values in CONFIGURATIONS:
            kernel.configure(values)
            got = kernel.product(ByteRows(a, a_zero), ByteRows(b, b_zero), bias)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, expected, err_msg=str(values))


def test_sums_wrap_like_int32() -> None:
    """255 * 255 * 40000 overflows int32: every configuration wraps as int32 does."""
    a, b = np.full((2, 40000), 255, np.uint8), np.full((3, 40000), 255, np.uint8)
    exact = 255 * 255 * 40000
    wrapped = (exact + 2**31) % 2**32 - 2**31
    kernel = build("MatMulInteger", [a, b.T], 10)[1]
    for values in CONFIGURATIONS[:3]:
        kernel.configure(values)
        np.testing.assert_array_equal(kernel.product(ByteRows(a, 0), ByteRows(b, 0)), wrapped)


def _qlinear_matmul_inputs(rng: np.random.Generator, a_type: Any, per_column: bool) -> list[np.ndarray]:
    columns = (48,) if per_column else ()
    return [_bytes(rng, a_type, (2, 37, 200)), np.array(0.02, np.float32), _bytes(rng, a_type, ()),
            int8_weights(rng, (200, 48)), rng.uniform(0.002, 0.02, columns).astype(np.float32),
            np.zeros(columns, np.int8), np.array(0.35, np.float32), _bytes(rng, a_type, ())]


def _qlinear_conv_inputs(rng: np.random.Generator, x_type: Any, per_channel: bool) -> list[np.ndarray]:
    channels = (12,) if per_channel else ()
    return [_bytes(rng, x_type, (2, 8, 11, 10)), np.array(0.03, np.float32), _bytes(rng, x_type, ()),
            int8_weights(rng, (12, 4, 3, 3)), rng.uniform(0.002, 0.02, channels).astype(np.float32),
            np.zeros(channels, np.int8), np.array(0.2, np.float32), _bytes(rng, x_type, ()),
            rng.integers(-3000, 3000, 12).astype(np.int32)]


CONV_ATTRIBUTES = {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2]}


def _onnxruntime(op: str, inputs: list[np.ndarray], opset: int, **attributes: Any) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    model = build(op, inputs, opset, **attributes)[0]
    output = TensorProto.INT32 if op.endswith("Integer") else TensorProto.UINT8 \
        if inputs[7].dtype == np.uint8 else TensorProto.INT8
    model.graph.output[0].type.tensor_type.elem_type = output
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {f"x{i}": x for i, x in enumerate(inputs)})[0]


@pytest.mark.parametrize(("op", "make", "attributes"), [
    ("QLinearMatMul", _qlinear_matmul_inputs, {}),
    ("QLinearConv", _qlinear_conv_inputs, CONV_ATTRIBUTES),
])
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_products_are_onnxruntimes(op: str, make: Any, attributes: dict[str, Any],
                                           signed: bool, per_channel: bool) -> None:
    inputs = make(np.random.default_rng(7), np.int8 if signed else np.uint8, per_channel)
    expected = _onnxruntime(op, inputs, 13, **attributes)
    with ThreadPool(2) as pool:
        for values in CONFIGURATIONS:
            got = _kernel(op, inputs, 13, values, pool, **attributes).run(*inputs)[0]
            assert got.dtype == expected.dtype and got.shape == expected.shape
            difference = np.abs(got.astype(np.int32) - expected.astype(np.int32)).max()
            assert difference == 0, (values, difference)


def _depthwise_inputs(rng: np.random.Generator, x_type: Any, per_channel: bool) -> list[np.ndarray]:
    channels = (16,) if per_channel else ()
    return [_bytes(rng, x_type, (2, 16, 9, 10)), np.array(0.03, np.float32), _bytes(rng, x_type, ()),
            int8_weights(rng, (16, 1, 3, 3)), rng.uniform(0.002, 0.02, channels).astype(np.float32),
            _bytes(rng, np.int8, channels), np.array(0.05, np.float32), _bytes(rng, x_type, ()),
            rng.integers(-3000, 3000, 16).astype(np.int32)]


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
def test_depthwise_qlinear_conv_is_onnxruntimes(signed: bool, per_channel: bool) -> None:
    """Depthwise convolutions (one channel per group) take their own per-tap path."""
    inputs = _depthwise_inputs(np.random.default_rng(9), np.int8 if signed else np.uint8, per_channel)
    attributes = {"group": 16, "pads": [1, 2, 1, 0], "strides": [2, 1]}
    expected = _onnxruntime("QLinearConv", inputs, 13, **attributes)
    got = _kernel("QLinearConv", inputs, 13, CONFIGURATIONS[0], **attributes).run(*inputs)[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    if not per_channel:  # onnxruntime's ConvInteger takes per-tensor weight zero points only
        integer = [inputs[0], inputs[3], inputs[2], inputs[5]]
        sums = _kernel("ConvInteger", integer, 13, CONFIGURATIONS[0], **attributes).run(*integer)[0]
        np.testing.assert_array_equal(sums, _onnxruntime("ConvInteger", integer, 13, **attributes))


@pytest.mark.parametrize(("op", "make", "attributes"), [
    ("MatMulInteger", _qlinear_matmul_inputs, {}),
    ("ConvInteger", _qlinear_conv_inputs, CONV_ATTRIBUTES),
])
def test_integer_products_are_onnxruntimes(op: str, make: Any, attributes: dict[str, Any]) -> None:
    full = make(np.random.default_rng(8), np.uint8, False)
    inputs = [full[0], full[3], full[2], full[5]]
    expected = _onnxruntime(op, inputs, 13, **attributes)
    for values in CONFIGURATIONS[:3]:
        got = _kernel(op, inputs, 13, values, **attributes).run(*inputs)[0]
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, expected)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(rows=st.integers(1, 13), depth=st.integers(1, 40), columns=st.integers(1, 80),
       tile_columns=st.sampled_from([24, 48, 768]), layout=st.sampled_from(["pairs", "packed"]),
       output=st.sampled_from([np.uint8, np.int8]), transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_requantized_tiles_match_the_int32_sums(rows: int, depth: int, columns: int, tile_columns: int,
                                                layout: str, output: Any, transposed: bool,
                                                seed: int) -> None:
    """``packed_sums`` requantizing whole micro-tiles from their registers and the rest through
    its panel gives numpy's float32 requantization of its int32 sums, bit for bit: per-row
    multipliers from tiny to saturating, both output types, blocks of columns, and a
    transposed output (no tile from the registers)."""
    rng = np.random.default_rng(seed)
    left = ByteRows(_bytes(rng, np.int8, (rows, depth)), 0)
    right = PackedColumns.of(_bytes(rng, np.uint8, (depth, columns)), int(rng.integers(0, 256)),
                             layout=layout)
    repeated, row_zero, row_sums = left.repeated(right.lanes.dtype, layout)
    bias = rng.integers(-3000, 3000, rows).astype(np.int32)
    zeros = np.zeros(columns, np.int32)
    multiplier = (10.0 ** rng.uniform(-5, 0, (rows, 1))).astype(np.float32)
    multiplier[rng.random(rows) < 0.3] = 0.5  # halves: ties rounded to even
    low, high = (0, 255) if output == np.uint8 else (-128, 127)
    zero = int(rng.integers(low, high + 1))

    def run(out: np.ndarray, scaled: bool) -> np.ndarray:
        packed_sums(right.lanes, repeated, 0, rows, 0, columns, 64, tile_columns, row_zero, row_sums,
                    right.zero, zeros, depth, bias, zeros, multiplier, zero, low, high, scaled, out,
                    no_residual(out.dtype), np.zeros(9, np.float32), np.int32(0))
        return out

    sums = run(np.empty((rows, columns), np.int32), False)
    expected = np.clip(np.rint(sums.astype(np.float32) * multiplier) + np.float32(zero), low, high)
    expected = expected.astype(output)
    target = np.empty((columns, rows), output).T if transposed else np.empty((rows, columns), output)
    np.testing.assert_array_equal(run(target, True), expected)


def test_requantization_rounds_half_to_even_in_float32() -> None:
    """Sums whose float32 product with the multiplier is exactly k + 0.5 round to the even
    integer, and values past the type's range saturate."""
    a = np.array([[1, 3, 5, 7, 200]], np.uint8).T.copy()  # (5, 1)
    b = np.ones((1, 1), np.int8)
    inputs = [a, np.array(0.5, np.float32), np.array(0, np.uint8), b, np.array(1.0, np.float32),
              np.array(0, np.int8), np.array(1.0, np.float32), np.array(100, np.uint8)]
    got = _kernel("QLinearMatMul", inputs, 13, CONFIGURATIONS[1]).run(*inputs)[0]
    np.testing.assert_array_equal(got.ravel(), [100, 102, 102, 104, 200])
    inputs[-1] = np.array(200, np.uint8)
    got = _kernel("QLinearMatMul", inputs, 13, CONFIGURATIONS[0]).run(*inputs)[0]
    np.testing.assert_array_equal(got.ravel(), [200, 202, 202, 204, 255])


def test_output_zero_points_are_read_at_every_run() -> None:
    """The output range a product remembers follows its zero point: another (constant)
    array, or a fed one changed in place, gives its own outputs."""
    a = np.array([[1, 3, 5, 7, 200]], np.uint8).T.copy()  # (5, 1)
    b = np.ones((1, 1), np.int8)
    inputs = [a, np.array(0.5, np.float32), np.array(0, np.uint8), b, np.array(1.0, np.float32),
              np.array(0, np.int8), np.array(1.0, np.float32), np.array(100, np.uint8)]
    kernel = _kernel("QLinearMatMul", inputs, 13, CONFIGURATIONS[1])
    for zero, expected in ((100, [100, 102, 102, 104, 200]), (200, [200, 202, 202, 204, 255])):
        constant = np.array(zero, np.uint8)
        constant.flags.writeable = False
        np.testing.assert_array_equal(kernel.run(*inputs[:-1], constant)[0].ravel(), expected)
    fed = np.array(100, np.uint8)
    np.testing.assert_array_equal(kernel.run(*inputs[:-1], fed)[0].ravel(), [100, 102, 102, 104, 200])
    fed[...] = 0
    np.testing.assert_array_equal(kernel.run(*inputs[:-1], fed)[0].ravel(), [0, 2, 2, 4, 100])
    with pytest.raises(KernelError, match="y_zero_point"):
        kernel.run(*inputs[:-1], np.array([1, 2], np.uint8))


def test_constant_weights_are_packed_once_and_runs_stay_exact() -> None:
    rng = np.random.default_rng(3)
    inputs = _qlinear_conv_inputs(rng, np.uint8, True)
    kernel = _kernel("QLinearConv", inputs, 13, CONFIGURATIONS[1], **CONV_ATTRIBUTES)
    constants = [None if i == 0 else x for i, x in enumerate(inputs)]
    packed = kernel.specialize(constants)
    assert packed is not None and packed.packed is not None and kernel.packed is None
    np.testing.assert_array_equal(packed.run(*inputs)[0], kernel.run(*inputs)[0])
    other = [*inputs[:3], _bytes(rng, np.int8, inputs[3].shape), *inputs[4:]]  # other weights
    np.testing.assert_array_equal(packed.run(*other)[0], kernel.run(*other)[0])


@pytest.mark.parametrize(("values", "message"), [
    ({ALGORITHM: "simd"}, r"product\.algorithm"),
    ({TILE_ROWS: 0}, r"tile\.rows"),
    ({"tile.depth": 4}, r"tile\.depth"),
])
@pytest.mark.parametrize("op", OPS)
def test_bad_values_name_the_node_key_and_parameter(op: str, values: dict[str, Any], message: str) -> None:
    inputs = (_qlinear_conv_inputs if "Conv" in op else _qlinear_matmul_inputs)(
        np.random.default_rng(0), np.uint8, False)
    if op in ("MatMulInteger", "ConvInteger"):
        inputs = [inputs[0], inputs[3], inputs[2], inputs[5]]
    kernel = build(op, inputs, 13)[1]
    with pytest.raises(KernelError, match=rf"node '{op.lower()}_node' \({op}\): "
                                          rf"onnx_light/{op}/portable\[uint8\]@cpu#2: .*{message}"):
        kernel.configure(values)


def test_candidates_respect_the_schema_and_calibration_compares_exactly() -> None:
    schema = DECLARATIONS["", "QLinearMatMul"].schema(TensorProto.UINT8)
    for values in integer_candidates():
        schema.validate(values)
    problem = IntegerProductConfigurations(DECLARATIONS["", "QLinearMatMul"], TensorProto.UINT8, 2)
    assert problem.cases == tuple(entry[0] for entry in PRODUCT_CORPUS)
    inputs = problem.make_inputs(problem.cases[0])
    reference = problem.run(dict(schema.defaults), inputs)
    wrong = reference.copy()
    wrong[0, 0] += 1
    assert problem.same_output(reference, problem.run(integer_candidates()[0], inputs))
    assert not problem.same_output(reference, wrong)


def test_tuning_end_to_end_on_a_fresh_registry(tmp_path: Any) -> None:
    declaration = DECLARATIONS["", "QLinearConv"]
    registry = KernelTuningRegistry()
    registry.register(declaration.schemas(), callbacks=declaration.callbacks())
    key = declaration.schema(TensorProto.INT8).key
    resolved = registry.snapshot().resolve(key, execution_descriptor(2))
    assert dict(resolved.values) == dict(declaration.schema(TensorProto.INT8).defaults)
    report = calibrate_kernel_tuning("QLinearConv", "int8", num_threads=2, max_duration_ms=300,
                                     path=tmp_path / "cache.txt", registry=registry)
    (result,) = report["calibrated"]
    assert result["key"] == str(key) and (result["diagnostics"] or result["measurements"])
    declaration.schema(TensorProto.INT8).validate(result["values"])
