"""Structural kernels, reductions and softmax against onnx.reference on one-node models.

Each case builds a one-node model with ``onnx.helper``, runs it through
``onnx.reference.ReferenceEvaluator`` and through our kernel (built directly from
the dispatch tables), and compares: exactly for structural ops, within a relative
tolerance for float reductions and softmax. Where the reference does not implement
an opset (Reshape-1, Tile-1, Dropout-6) or departs from the ONNX spec, the expected
values are written out by hand.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from kernel_cases import build, ours_and_reference
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import reductions, structural
from onnx_light.kernels.base import KernelError, compute_dtype, narrow_float_dtypes
from onnx_light.runtime import RuntimeSession

LATEST = onnx.defs.onnx_opset_version()
KERNELS = {**structural.KERNELS, **reductions.KERNELS}
BF16 = ml_dtypes.bfloat16
RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12,
        np.dtype(np.float16): 1e-3, np.dtype(BF16): 1e-2}
RNG = np.random.default_rng(20240601)


def ours(op: str, inputs: list[np.ndarray | None], opset: int = LATEST, outputs: int = 1,
         **attributes: Any) -> list[np.ndarray]:
    return list(build(op, inputs, opset, outputs, **attributes)[1].run(*inputs))


def same(actual: np.ndarray, expected: np.ndarray, approx: bool = False) -> None:
    """Same dtype, shape and values (NaN equal to NaN); ``approx`` uses the dtype's tolerance."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if expected.dtype.kind == "U":  # the reference sometimes returns numpy str arrays
        expected = expected.astype(object)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype.kind == "V" or actual.dtype.type.__module__ == "ml_dtypes":
        actual, expected = actual.astype(np.float64), expected.astype(np.float64)
    if approx:
        np.testing.assert_allclose(actual, expected, rtol=RTOL[np.dtype(expected.dtype)], atol=0)
    else:
        np.testing.assert_array_equal(actual, expected)


def check(op: str, inputs: list[np.ndarray | None], opset: int = LATEST, outputs: int = 1,
          approx: bool = False, **attributes: Any) -> list[np.ndarray]:
    """Run ``op`` through the reference and our kernel and compare every output."""
    actual, expected = ours_and_reference(op, inputs, opset, outputs, **attributes)
    for a, e in zip(actual, expected, strict=True):
        same(a, e, approx)
    return actual


def ints64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def floats(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def strings(*shape: int) -> np.ndarray:
    return np.array([f"s{i}" for i in range(int(np.prod(shape)))], object).reshape(shape)


def booleans(*shape: int) -> np.ndarray:
    return RNG.random(shape) > 0.5


SAMPLES = {
    "float32": lambda: floats(2, 3, 4),
    "float64": lambda: floats(2, 3, 4, dtype=np.float64),
    "float16": lambda: floats(2, 3, 4, dtype=np.float16),
    "bfloat16": lambda: floats(2, 3, 4, dtype=BF16),
    "int32": lambda: RNG.integers(-50, 50, (2, 3, 4)).astype(np.int32),
    "uint8": lambda: RNG.integers(0, 200, (2, 3, 4)).astype(np.uint8),
    "bool": lambda: booleans(2, 3, 4),
    "string": lambda: strings(2, 3, 4),
}
ANY_TYPE = pytest.mark.parametrize("kind", sorted(SAMPLES))


# ---------------------------------------------------------------- the dispatch tables

def test_tables_list_every_onnx_since_version() -> None:
    for op, versions in KERNELS.items():
        expected = set()
        for opset in range(1, LATEST + 1):
            with contextlib.suppress(onnx.defs.SchemaError):
                expected.add(onnx.defs.get_schema(op, opset).since_version)
        assert set(versions) == expected, op
        assert {cls.op_type for cls in versions.values()} == {op}
        # Softmax alone is tunable: its compiled rows' and the fused attention's thresholds
        assert all(cls.declaration.tunable == (op == "Softmax") for cls in versions.values())


def test_modules_do_not_share_ops() -> None:
    assert not set(structural.KERNELS) & set(reductions.KERNELS)


# ---------------------------------------------------------------- Constant, ConstantOfShape, Identity

@pytest.mark.parametrize(("attribute", "value"), [
    ("value", numpy_helper.from_array(floats(2, 3))),
    ("value", numpy_helper.from_array(np.array([1.5, -2], BF16))),
    ("value", numpy_helper.from_array(np.zeros((0, 2), np.int32))),
    ("value", helper.make_tensor("t", TensorProto.STRING, [2], [b"ab", b"c"])),
    ("value_float", 2.5),
    ("value_floats", [1.0, 2.0]),
    ("value_int", 7),
    ("value_ints", [1, -2, 3]),
    ("value_string", "hello"),
    ("value_strings", ["a", "bc"]),
])
def test_constant(attribute: str, value: Any) -> None:
    check("Constant", [], **{attribute: value})


def test_constant_opset_9_and_sparse() -> None:
    check("Constant", [], opset=9, value=numpy_helper.from_array(ints64(4, 5)))
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "v"),
                                       numpy_helper.from_array(ints64(1, 5), "i"), [2, 3])
    [dense] = ours("Constant", [], sparse_value=sparse)
    same(dense, np.array([[0, 1, 0], [0, 0, 2]], np.float32))
    coordinates = helper.make_sparse_tensor(numpy_helper.from_array(ints64(7), "v"),
                                            numpy_helper.from_array(ints64(1, 2).reshape(1, 2), "i"), [2, 3])
    [dense] = ours("Constant", [], sparse_value=coordinates)
    same(dense, np.array([[0, 0, 0], [0, 0, 7]], np.int64))


@pytest.mark.parametrize("shape", [ints64(2, 3), ints64(), ints64(0, 4), ints64(1)])
@pytest.mark.parametrize("value", [None, np.array([7], np.int64), np.array([True]),
                                   np.array([0.5], np.float64), np.array([1.25], BF16)])
def test_constant_of_shape(shape: np.ndarray, value: np.ndarray | None) -> None:
    attributes = {} if value is None else {"value": numpy_helper.from_array(value)}
    check("ConstantOfShape", [shape], **attributes)
    check("ConstantOfShape", [shape], opset=9, **attributes)


@ANY_TYPE
@pytest.mark.parametrize("opset", [1, 13, LATEST])
def test_identity(kind: str, opset: int) -> None:
    check("Identity", [SAMPLES[kind]()], opset=opset)


# ---------------------------------------------------------------- Cast, CastLike

NUMBERS = np.array([[0.47892547, -1.5, 3.0, 0.0], [200.0, -7.25, 1e-3, 65504.0]], np.float32)
CAST_TARGETS = ["FLOAT", "DOUBLE", "FLOAT16", "BFLOAT16", "INT8", "UINT8", "INT16", "INT32", "INT64",
                "UINT64", "BOOL", "STRING"]


@pytest.mark.parametrize("source", ["float32", "float64", "float16", "bfloat16", "int32", "uint8", "bool"])
@pytest.mark.parametrize("target", CAST_TARGETS)
def test_cast_numbers(source: str, target: str) -> None:
    x = SAMPLES[source]()
    if source == "bfloat16" and target == "STRING":  # the reference cannot format bfloat16: round trip
        [text] = ours("Cast", [x], to=TensorProto.STRING)
        same(ours("Cast", [text], to=TensorProto.BFLOAT16)[0], x)
        return
    if target in ("INT8", "UINT8", "INT16", "INT32", "INT64", "UINT64") and x.dtype.kind != "b":
        x = np.abs(x) if target.startswith("U") else x  # out-of-range floats are undefined
        x = (x * 10).astype(x.dtype) if source not in ("int32", "uint8") else x
    check("Cast", [x], to=getattr(TensorProto, target))


@pytest.mark.parametrize("opset", [6, 9, 13, 19, 21, 24, 25])
def test_cast_opsets(opset: int) -> None:
    check("Cast", [NUMBERS], opset=opset, to=TensorProto.FLOAT16)
    check("Cast", [NUMBERS], opset=opset, to=TensorProto.INT32)


def test_cast_1_names_the_type() -> None:
    [y] = ours("Cast", [NUMBERS], opset=1, to="int32")
    same(y, NUMBERS.astype(np.int32))


def test_cast_strings() -> None:
    text = np.array(["1.5", "-3", "INF", "+INF", "-INF", "NaN", "inf", "1e-5", "1E8"], object)
    for target in (TensorProto.FLOAT, TensorProto.DOUBLE):
        check("Cast", [text], to=target)
    with np.errstate(over="ignore"):  # 1E8 overflows the half types to infinity
        for dtype in (np.float16, BF16):
            [y] = ours("Cast", [text], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
            same(y, text.astype(np.float64).astype(dtype))
    check("Cast", [np.array(["1000", "-7", "0"], object)], to=TensorProto.INT64)
    check("Cast", [np.array(["255", "3"], object)], to=TensorProto.UINT8)
    # undefined by ONNX: decimals truncate to integers, and booleans read the number
    [y] = ours("Cast", [np.array(["100.5", "-2.7"], object)], to=TensorProto.INT32)
    same(y, np.array([100, -2], np.int32))
    [y] = ours("Cast", [np.array(["0", "1", "2.5"], object)], to=TensorProto.BOOL)
    same(y, np.array([0, 1, 1], bool))
    check("Cast", [NUMBERS], to=TensorProto.STRING)
    check("Cast", [np.array([np.nan, np.inf, -np.inf, -0.0], np.float64)], to=TensorProto.STRING)
    check("Cast", [strings(2, 2)], to=TensorProto.STRING)
    same(ours("Cast", [np.array([0.5, 3], BF16)], to=TensorProto.STRING)[0], np.array(["0.5", "3"], object))


FLOAT8 = ["FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"]
EXTREMES = np.array([0.47892547, 1e6, -1e6, np.inf, -np.inf, np.nan, 1e-7, -0.0, 300, 70000], np.float32)


@pytest.mark.parametrize("target", FLOAT8)
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cast_float8(target: str, saturate: int, dtype: Any) -> None:
    with np.errstate(over="ignore"):
        x = EXTREMES.astype(dtype)
    [y] = check("Cast", [x], to=getattr(TensorProto, target), saturate=saturate)
    check("Cast", [y], to=TensorProto.FLOAT)


SMALL_INTEGERS = ["INT4", "UINT4", "INT2", "UINT2"]


def small_type_values(target: str) -> np.ndarray:
    """Every value of a small type (float4e2m1's from -8 to 7, saturating at 6) as float32."""
    if target == "FLOAT4E2M1":
        return np.arange(-8, 8).astype(np.float32)
    info = ml_dtypes.iinfo(structural.numpy_dtype(getattr(TensorProto, target)))
    return np.arange(int(info.min), int(info.max) + 1).astype(np.float32)


@pytest.mark.parametrize("target", [*SMALL_INTEGERS, "FLOAT4E2M1"])
def test_cast_small_types(target: str) -> None:
    x = small_type_values(target)
    [y] = ours("Cast", [x], to=getattr(TensorProto, target))
    same(y, x.astype(structural.numpy_dtype(getattr(TensorProto, target))))
    same(ours("Cast", [y], to=TensorProto.FLOAT)[0], y.astype(np.float32))


@pytest.mark.parametrize("target", SMALL_INTEGERS)
def test_cast_out_of_range_to_small_integers(target: str) -> None:
    """ONNX leaves a float out of an integer type's range undefined: some value, and no warning."""
    inside = small_type_values(target)
    outside = np.array([inside[0] - 1, inside[-1] + 1, 1e6, np.inf, -np.inf, np.nan], np.float32)
    [y] = ours("Cast", [np.concatenate([inside, outside])], to=getattr(TensorProto, target))
    assert y.dtype == structural.numpy_dtype(getattr(TensorProto, target))
    same(y[:inside.size].astype(np.float32), inside)


def test_cast_float8e8m0() -> None:
    x = np.array([0.0, 0.124, 0.25, 0.5, 1.1, 2.0, 4.0, 8.0, 3e38, np.nan], np.float32)
    [y] = check("Cast", [x], to=TensorProto.FLOAT8E8M0)  # saturate, round up
    same(y.astype(np.float32)[:9], np.array([2.0**-127, 0.125, 0.25, 0.5, 2, 2, 4, 8, 2.0**127], np.float32))
    [down] = ours("Cast", [x], to=TensorProto.FLOAT8E8M0, round_mode="down")
    same(down.astype(np.float32)[:8], np.array([2.0**-127, 0.0625, 0.25, 0.5, 1, 2, 4, 8], np.float32))
    [nearest] = ours("Cast", [np.array([1.4, 1.6, 3e38], np.float32)], to=TensorProto.FLOAT8E8M0,
                     round_mode="nearest", saturate=0)
    same(nearest.astype(np.float32), np.array([1, 2, np.nan], np.float32))


@pytest.mark.parametrize(("x", "like"), [
    (NUMBERS, np.zeros(1, np.int32)),
    (NUMBERS, np.zeros(1, np.float16)),
    (ints64(1, -2), np.zeros(1, np.float64)),
    (ints64(1, -2), np.array(["a"], object)),
    (np.array(["1.5", "NaN"], object), np.zeros(1, np.float32)),
    (booleans(3), np.zeros(1, np.float32)),
])
@pytest.mark.parametrize("opset", [15, 19, LATEST])
def test_cast_like(x: np.ndarray, like: np.ndarray, opset: int) -> None:
    check("CastLike", [x, like], opset=opset)


def test_cast_like_bfloat16() -> None:
    [y] = ours("CastLike", [NUMBERS, np.zeros(1, BF16)])
    same(y, NUMBERS.astype(BF16))


# ---------------------------------------------------------------- shapes

@pytest.mark.parametrize(("shape", "allowzero"), [
    ([4, 6], 0), ([-1], 0), ([0, -1], 0), ([0, 2, 3], 0), ([3, -1, 2], 0), ([24], 1), ([1, 1, 24, 1], 0),
])
@pytest.mark.parametrize("kind", ["float32", "string", "bool"])
def test_reshape(shape: list[int], allowzero: int, kind: str) -> None:
    x = SAMPLES[kind]().reshape(4, 6)
    check("Reshape", [x, ints64(*shape)], opset=5)
    check("Reshape", [x, ints64(*shape)], allowzero=allowzero)


def test_reshape_of_a_constant_shape_follows_each_input_shape() -> None:
    """A Reshape specialized for its constant shape (0 and -1 in it) gives numpy's reshape
    for input shapes that change from call to call, and the same errors."""
    # Values from arange, not the module's generator, whose draws later cases depend on.
    kernel = build("Reshape", [np.zeros((2, 3, 4), np.float32), ints64(0, -1)], LATEST, 1)[1]
    shape = ints64(0, -1)
    special = kernel.specialize([None, shape])
    assert special is not None and special is not kernel
    for dims in [(2, 3, 4), (2, 3, 4), (5, 2), (5, 2, 2), (2, 3, 4)]:
        x = np.arange(math.prod(dims), dtype=np.float32).reshape(dims)
        same(special.run(x, shape)[0], x.reshape(dims[0], -1))
    assert kernel.specialize([None, None]) is None
    with pytest.raises(KernelError, match="copies a dimension"):
        special.run(np.float32(1.0).reshape(()), shape)
    with pytest.raises(KernelError, match="infer"):
        special.run(np.zeros((0, 3), np.float32), shape)
    fixed = kernel.specialize([None, ints64(4, -1)])
    with pytest.raises(KernelError, match="infer"):
        fixed.run(np.zeros(6, np.float32), ints64(4, -1))
    same(fixed.run(np.zeros(8, np.float32), ints64(4, -1))[0], np.zeros((4, 2), np.float32))


def test_reshape_zeros_and_opset_1() -> None:
    empty = np.zeros((0, 3), np.float32)
    check("Reshape", [empty, ints64(3, 0)], allowzero=1)
    same(ours("Reshape", [empty, ints64(-1, 3, 1)])[0], empty.reshape(0, 3, 1))
    with pytest.raises(KernelError, match="infer"):  # any -1 would do: ambiguous, as in onnxruntime
        ours("Reshape", [empty, ints64(0, -1)])
    x = floats(2, 3)
    same(ours("Reshape", [x], opset=1, shape=[3, -1])[0], x.reshape(3, 2))


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
@pytest.mark.parametrize("opset", [11, 13, LATEST])
def test_flatten(axis: int, opset: int) -> None:
    check("Flatten", [floats(2, 3, 4)], opset=opset, axis=axis)
    check("Flatten", [strings(2, 3, 4)], opset=opset, axis=axis)
    [y] = ours("Flatten", [np.zeros((2, 0, 4), bool)], opset=opset, axis=axis)  # the reference fails here
    split = axis + 3 if axis < 0 else axis
    assert y.shape == (int(np.prod((2, 0, 4)[:split])), int(np.prod((2, 0, 4)[split:]))) and y.dtype == bool


def test_flatten_old_opsets() -> None:
    check("Flatten", [floats(2, 3, 4)], opset=1)
    check("Flatten", [floats(2, 3, 4)], opset=9, axis=0)


@ANY_TYPE
@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(kind: str, perm: list[int] | None) -> None:
    attributes = {} if perm is None else {"perm": perm}
    check("Transpose", [SAMPLES[kind]()], opset=1, **attributes)
    check("Transpose", [SAMPLES[kind]()], **attributes)


@pytest.mark.parametrize("axes", [None, [0], [2, 0], [-1]])
def test_squeeze(axes: list[int] | None) -> None:
    x = floats(1, 3, 1)
    attributes = {} if axes is None else {"axes": axes}
    [y] = check("Squeeze", [x, None if axes is None else ints64(*axes)])
    [text] = ours("Squeeze", [strings(1, 3, 1), None if axes is None else ints64(*axes)], opset=13)
    assert text.shape == y.shape
    # the reference squeezes attribute axes one at a time (wrong for several); compare across opsets
    for opset in (1, 11):
        if opset == 11 or axes is None or min(axes) >= 0:
            same(ours("Squeeze", [x], opset=opset, **attributes)[0], y)
    if axes is None or len(axes) == 1:
        check("Squeeze", [x], opset=11, **attributes)


@pytest.mark.parametrize("axes", [[0], [3], [-1], [0, 4], [3, 0], [-5, 1]])
def test_unsqueeze(axes: list[int]) -> None:
    x = floats(2, 3, 4)
    [y] = check("Unsqueeze", [x, ints64(*axes)])
    check("Unsqueeze", [booleans(2, 3, 4), ints64(*axes)], opset=13)
    # The reference inserts attribute axes one at a time, which is only right when they are sorted
    # and non-negative; the spec (axes index the output) is the same in every opset.
    for opset in (1, 11):
        if opset == 11 or min(axes) >= 0:
            same(ours("Unsqueeze", [x], opset=opset, axes=axes)[0], y)
    if axes == sorted(axes) and min(axes) >= 0:
        check("Unsqueeze", [x], opset=11, axes=axes)


def test_unsqueeze_scalar() -> None:
    check("Unsqueeze", [np.array(3.0, np.float32), ints64(0, -1)])


@pytest.mark.parametrize(("x", "start", "end"), [
    (floats(2, 3, 4), None, None), (floats(2, 3, 4), 1, None), (floats(2, 3, 4), -1, None),
    (floats(2, 3, 4), 0, -1), (floats(2, 3, 4), -10, 10), (floats(2, 3, 4), 2, 1),
    (np.array(1.0, np.float32), None, None), (strings(0, 5), 1, None),
])
def test_shape_and_size(x: np.ndarray, start: int | None, end: int | None) -> None:
    attributes = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    check("Shape", [x], **attributes)
    check("Shape", [x], opset=1)
    check("Size", [x])
    check("Size", [x], opset=1)


@pytest.mark.parametrize(("shape", "target"), [
    ((3, 1), (2, 1, 6)), ((3, 1), (3, 4)), ((1,), (2, 3)), ((2, 3), (1,)), ((2, 1), (2, 0)), ((), (2, 2)),
])
@pytest.mark.parametrize("kind", ["float32", "bool", "string"])
def test_expand(shape: tuple[int, ...], target: tuple[int, ...], kind: str) -> None:
    x = SAMPLES[kind]().reshape(-1)[:int(np.prod(shape))].reshape(shape)
    check("Expand", [x, ints64(*target)], opset=8)
    check("Expand", [x, ints64(*target)])


@pytest.mark.parametrize("repeats", [(1, 1, 1), (2, 1, 3), (0, 2, 1)])
@ANY_TYPE
def test_tile(repeats: tuple[int, ...], kind: str) -> None:
    check("Tile", [SAMPLES[kind](), ints64(*repeats)], opset=6)
    check("Tile", [SAMPLES[kind](), ints64(*repeats)])


def test_tile_1() -> None:
    x = floats(2, 3)
    same(ours("Tile", [x, np.array(3.0, np.float32), np.array(1.0, np.float32)], opset=1)[0],
         np.tile(x, (1, 3)))


# ---------------------------------------------------------------- Concat, Split

@pytest.mark.parametrize("axis", [0, 1, -1, -2])
@pytest.mark.parametrize("kind", ["float32", "bfloat16", "string", "bool"])
def test_concat(axis: int, kind: str) -> None:
    x = SAMPLES[kind]()[0]
    empty = x[:0] if axis in (0, -2) else x[:, :0]
    check("Concat", [x, x[::-1], empty], axis=axis)
    check("Concat", [x], axis=axis, opset=11)
    if axis >= 0:
        check("Concat", [x, x], axis=axis, opset=4)


def test_concat_1_default_axis() -> None:
    x = floats(2, 3)
    same(ours("Concat", [x, x], opset=1)[0], np.concatenate([x, x], axis=1))  # not in the reference


@pytest.mark.parametrize(("split", "axis", "outputs"), [
    (None, 0, 2), (None, 1, 3), ([1, 2], 1, 2), ([4, 0, 2], -1, 3), ([0, 2], 0, 2), (None, -1, 1),
])
@pytest.mark.parametrize("kind", ["float32", "string"])
def test_split(split: list[int] | None, axis: int, outputs: int, kind: str) -> None:
    x = np.concatenate([SAMPLES[kind]().reshape(2, 3, 4)[..., :3]] * 2, axis=-1)  # shape (2, 3, 6)
    attributes = {} if split is None else {"split": split}
    check("Split", [x], opset=11, outputs=outputs, axis=axis, **attributes)
    check("Split", [x, None if split is None else ints64(*split)], outputs=outputs, axis=axis,
          **({} if split is not None else {"num_outputs": outputs}))
    check("Split", [x, None if split is None else ints64(*split)], opset=13, outputs=outputs, axis=axis)
    if axis >= 0:
        check("Split", [x], opset=2, outputs=outputs, axis=axis, **attributes)


@pytest.mark.parametrize(("dim", "parts"), [(7, 3), (6, 4), (5, 5), (2, 2)])
def test_split_18_uneven(dim: int, parts: int) -> None:
    check("Split", [np.arange(dim, dtype=np.int64)], outputs=parts, num_outputs=parts)


def test_split_1_input() -> None:
    x = floats(6)
    outputs = ours("Split", [x, np.array([2.0, 4.0], np.float32)], opset=1, outputs=2)
    same(outputs[0], x[:2])
    same(outputs[1], x[2:])


# ---------------------------------------------------------------- Slice, Gather, GatherElements

BIG = np.iinfo(np.int64).max
SLICES = [
    ([0, 1], [2, 3], None, None),
    ([1], [BIG], [1], None),
    ([-1], [-BIG], [2], [-1]),
    ([0, 0, 3], [-1, -1, -BIG], [0, 1, 2], [1, 2, -2]),
    ([10], [20], [0], None),
    ([-100], [100], [-1], [3]),
    ([3], [1], [2], [1]),
    ([2], [-5], [-1], [-1]),
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICES)
@pytest.mark.parametrize("kind", ["float32", "string", "bfloat16"])
def test_slice(starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None,
               kind: str) -> None:
    x = SAMPLES[kind]().reshape(2, 3, 4)
    inputs = [x, ints64(*starts), ints64(*ends), None if axes is None else ints64(*axes),
              None if steps is None else ints64(*steps)]
    check("Slice", inputs, opset=10)
    check("Slice", inputs)
    check("Slice", [x, *(None if v is None else v.astype(np.int32) for v in inputs[1:])])
    if steps is None:
        attributes = {"starts": starts, "ends": ends, **({} if axes is None else {"axes": axes})}
        check("Slice", [x], opset=1, **attributes)


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICES)
def test_slice_with_constant_bounds_reads_them_once(starts: list[int], ends: list[int],
                                                    axes: list[int] | None, steps: list[int] | None) -> None:
    """Constant bounds (every input after the data given) are read at specialization: the
    same views, for two data shapes in turn; a bound not constant or an omitted input in
    between leaves the kernel as it is."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    inputs = [x, ints64(*starts), ints64(*ends), None if axes is None else ints64(*axes),
              None if steps is None else ints64(*steps)]
    while inputs[-1] is None:
        inputs.pop()
    _, kernel = build("Slice", inputs, 13)
    specialized = kernel.specialize([None, *inputs[1:]])
    if any(v is None for v in inputs):
        assert specialized is None
        return
    for data in (x, np.arange(60, dtype=np.float32).reshape(3, 4, 5), x):
        same(specialized.run(data, *inputs[1:])[0], kernel.run(data, *inputs[1:])[0])
    assert kernel.specialize([None, None, *inputs[2:]]) is None
    _, bad = build("Slice", [x, ints64(0, 1), ints64(2)], 13)
    assert bad.specialize([None, ints64(0, 1), ints64(2)]) is None


def test_slice_clamps_negative_step_starts_per_spec() -> None:
    # The spec clamps a negative-step start into [0, dim - 1]: start -100 becomes 0 and
    # INT64_MIN as end reaches the first element, so the slice is [x[0]].
    x = np.arange(5, dtype=np.int64)
    same(ours("Slice", [x, ints64(-100), ints64(-BIG - 1), None, ints64(-1)])[0], ints64(0))
    same(ours("Slice", [x, ints64(100), ints64(-BIG - 1), None, ints64(-2)])[0], ints64(4, 2, 0))


@pytest.mark.parametrize(("indices", "axis"), [
    (ints64(0, 2, 1), 0), (ints64(-1, 0), 1), (np.array([[1, 0], [0, -3]], np.int32), 2),
    (np.array(1, np.int64), 1), (ints64(), 0), (ints64(-2, 1), -1),
])
@ANY_TYPE
def test_gather(indices: np.ndarray, axis: int, kind: str) -> None:
    x = SAMPLES[kind]().reshape(3, 2, 4)
    check("Gather", [x, indices], axis=axis)
    if axis >= 0 and (indices.size == 0 or indices.min() >= 0):
        check("Gather", [x, indices], opset=1, axis=axis)


def _table_gather(axis: int, index_type: int = TensorProto.INT64) -> RuntimeSession:
    """A session gathering from a constant (5, 4) float32 table by (2, 3) indices fed."""
    table = numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(5, 4), "table")
    out_shape = [2, 3, 4] if axis == 0 else [5, 2, 3]
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["y"], axis=axis)], "g",
        [helper.make_tensor_value_info("i", index_type, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return RuntimeSession(model, num_threads=1)


@pytest.mark.parametrize(("axis", "index_type", "prepared"), [
    (0, TensorProto.INT64, True), (1, TensorProto.INT64, False), (0, TensorProto.INT32, False),
])
def test_gather_of_table_rows_is_a_prepared_step_with_the_checks_of_run(axis, index_type, prepared) -> None:
    session = _table_gather(axis, index_type)
    assert [item.prepared is not None for item in session._plan] == [prepared]
    table = np.arange(20, dtype=np.float32).reshape(5, 4)
    dim = table.shape[axis]
    dtype = helper.tensor_dtype_to_np_dtype(index_type)
    for values in ([[0, dim - 1, -1], [-dim, 2, 2]], [[1, 1, 1], [dim - 1, 0, -2]]):
        i = np.array(values, dtype)
        same(session.run(None, {"i": i})[0], np.take(table, i, axis=axis))
    for bad in (dim, -dim - 1, np.iinfo(dtype).max, np.iinfo(dtype).min):
        i = np.zeros((2, 3), dtype)
        i[1, 2] = bad
        with pytest.raises(ValueError, match=rf"indices must lie in \[{-dim}, {dim - 1}\], got"):
            session.run(None, {"i": i})


@pytest.mark.parametrize(("indices", "axis"), [
    (np.array([[0, 1, 1], [1, 0, 1]], np.int64), 0), (np.array([[0, -1, 1], [2, 0, -3]], np.int32), 1),
    (np.array([[1, 0, 0], [0, 2, 2]], np.int64), -1), (np.zeros((0, 3), np.int64), 0),
])
@pytest.mark.parametrize("kind", ["float32", "string", "bool"])
def test_gather_elements(indices: np.ndarray, axis: int, kind: str) -> None:
    x = SAMPLES[kind]().reshape(2, 12)[:, :3]
    check("GatherElements", [x, indices], opset=11, axis=axis)
    check("GatherElements", [x, indices], axis=axis)


def test_gather_elements_with_shorter_indices() -> None:
    # indices may be shorter than the data on the other axes (the reference refuses this)
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    same(ours("GatherElements", [x, ints64(2, 0).reshape(1, 2)], axis=0)[0], ints64(8, 1).reshape(1, 2))
    same(ours("GatherElements", [x, ints64(-1, 0).reshape(2, 1)], axis=1)[0], ints64(3, 4).reshape(2, 1))


# ---------------------------------------------------------------- Range, Dropout, Pad

@pytest.mark.parametrize(("start", "limit", "delta"), [
    (3, 9, 3), (10, 4, -2), (0, 10, 1), (5, 5, 1), (5, 1, 1), (1, 11, 4), (-3, 3, 2),
])
@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64, np.float32, np.float64])
def test_range(start: int, limit: int, delta: int, dtype: Any) -> None:
    scalars = [np.array(v, dtype) for v in (start, limit, delta)]
    check("Range", scalars, opset=11)
    check("Range", scalars)


def test_range_fractions_and_half_types() -> None:
    check("Range", [np.array(v, np.float32) for v in (0.5, 2.0, 0.25)])
    # ONNX defines element i as start + i * delta; numpy.arange (the reference) rounds differently
    check("Range", [np.array(v, np.float64) for v in (1.0, -1.0, -0.3)], approx=True)
    same(ours("Range", [np.array(v, np.float64) for v in (1.0, -1.0, -0.3)])[0], 1.0 + np.arange(7) * -0.3)
    for dtype in (np.float16, BF16):
        [y] = ours("Range", [np.array(v, dtype) for v in (0, 300, 1.5)])
        same(y, (np.arange(200) * 1.5).astype(dtype))


@pytest.mark.parametrize("opset", [10, 12, 13, LATEST])
def test_dropout_inference(opset: int) -> None:
    x = floats(3, 4)
    check("Dropout", [x], opset=opset, outputs=2)
    check("Dropout", [x], opset=opset)
    if opset >= 12:
        check("Dropout", [x, np.array(0.3, np.float32), np.array(False)], opset=opset, outputs=2)
        check("Dropout", [x, np.array(0.0, np.float32), np.array(True)], opset=opset, outputs=2)


def test_dropout_old_and_training() -> None:
    x = floats(3, 4)
    for opset in (6, 7):  # the mask has the data's type before opset 10 (the reference says bool)
        output, mask = ours("Dropout", [x], opset=opset, outputs=2, is_test=1)
        same(output, x)
        same(mask, np.ones_like(x))
    output, mask = ours("Dropout", [x, np.array(0.5, np.float32), np.array(True)], outputs=2, seed=3)
    same(output, np.where(mask, x * 2, 0).astype(np.float32))
    same(ours("Dropout", [x, np.array(0.5, np.float32), np.array(True)], outputs=2, seed=3)[1], mask)
    assert mask.dtype == bool


PADS = [
    ([0, 2, 0, 0], None), ([1, 0, 2, 1], None), ([0, 0, 0, 0], None), ([1, 2], [1]), ([2, 1], [-2]),
]


@pytest.mark.parametrize(("pads", "axes"), PADS)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(pads: list[int], axes: list[int] | None, mode: str) -> None:
    x = floats(3, 4)
    inputs = [x, ints64(*pads), np.array(1.5, np.float32), None if axes is None else ints64(*axes)]
    check("Pad", inputs, mode=mode)
    if axes is None:
        check("Pad", inputs[:2], opset=11 if mode != "wrap" else 19, mode=mode)
        if mode != "wrap" and min(pads) >= 0:
            check("Pad", [x], opset=2, pads=pads, mode=mode, value=2.0)
            check("Pad", [x], opset=1, paddings=pads, mode=mode)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_negative_pads_crop(mode: str) -> None:
    # not in the reference: negative pads remove elements, then the positive ones pad
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    [y] = ours("Pad", [x, ints64(-1, 1, 1, -2)], mode=mode)
    same(y, np.pad(x[1:, :2], [(0, 1), (1, 0)], mode=mode))
    [y] = ours("Pad", [x, ints64(0, -1, 0, -1)], mode=mode)
    same(y, x[:, 1:3])


@pytest.mark.parametrize("kind", ["int32", "bool", "string", "bfloat16", "float16", "uint8"])
def test_pad_types(kind: str) -> None:
    x = SAMPLES[kind]()
    if kind == "string":  # the default pad of a string tensor is "" (the reference pads with 0)
        same(ours("Pad", [x, ints64(0, 0, 1, 0, 0, 0)])[0][..., 0], np.full((2, 3), "", object))
    else:
        check("Pad", [x, ints64(0, 1, 2, 1, 0, 1)])
    check("Pad", [x, ints64(1, 1), None, ints64(-1)], mode="edge")
    check("Pad", [x, ints64(0, 1, 2, 1, 0, 1), x.reshape(-1)[:1]], mode="constant")


@pytest.mark.parametrize("k", [None, 0, 1, -1, 5, -5])
@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("kind", ["float32", "int32", "bool"])
def test_trilu(k: int | None, upper: int, kind: str) -> None:
    x = SAMPLES[kind]()
    check("Trilu", [x, None if k is None else np.array(k, np.int64)], upper=upper)
    check("Trilu", [x[0, :2], None if k is None else np.array(k, np.int64)], upper=upper)


@pytest.mark.parametrize("x", [
    floats(2, 3).round(), booleans(3, 4), np.array([0, 3, 0, -1], np.int32), np.zeros((2, 0), np.float32),
    np.zeros((2, 2), np.float32), np.array([0, 1.5], BF16),
])
def test_nonzero(x: np.ndarray) -> None:
    check("NonZero", [x])
    check("NonZero", [x], opset=9)


def test_nonzero_scalar() -> None:
    same(ours("NonZero", [np.array(2.0, np.float32)])[0], np.zeros((0, 1), np.int64))
    same(ours("NonZero", [np.array(0, np.int32)])[0], np.zeros((0, 0), np.int64))


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
@pytest.mark.parametrize(("indices", "values"), [
    (ints64(0, 2, 1, 4), np.array([0, 1], np.float32)),
    (np.array([[1, -1], [7, 0]], np.int32), np.array([-1, 5], np.int64)),
    (np.array([1.7, 2.2, 0.0], np.float32), np.array(["off", "on"], object)),
])
def test_one_hot(axis: int, indices: np.ndarray, values: np.ndarray) -> None:
    depth = np.array(4, np.int64)
    if values.dtype == object:  # the reference cannot handle string values
        [y] = ours("OneHot", [indices, depth, values], axis=axis)
        [numbers] = ours("OneHot", [indices, depth, np.array([0, 1], np.int64)], axis=axis)
        same(y, np.where(numbers == 1, "on", "off").astype(object))
    else:
        check("OneHot", [indices, depth, values], axis=axis)
        check("OneHot", [indices, depth.astype(np.float32), values], opset=11, axis=axis)


# ---------------------------------------------------------------- reductions

REDUCTIONS = sorted(op for op in reductions.KERNELS if op.startswith("Reduce"))
AXES = [None, [1], [-1, 0], [0, 1, 2], []]


def reduce_inputs(op: str, opset: int, x: np.ndarray, axes: list[int] | None) -> tuple[list, dict]:
    """Inputs and attributes placing ``axes`` where ``op`` at ``opset`` expects it."""
    if opset >= (13 if op == "ReduceSum" else 18):
        return [x, None if axes is None else ints64(*axes)], {}
    return [x], {} if axes is None else {"axes": axes}


def reduction_data(op: str, dtype: Any) -> np.ndarray:
    x = floats(2, 3, 4, dtype=np.float64)
    if op in ("ReduceLogSum", "ReduceL2") or dtype not in (np.float32, np.float64):
        x = np.abs(x) + 0.5
    if op == "ReduceProd":
        x = np.clip(x, -1.5, 1.5)
    return (x * 10).astype(dtype) if np.dtype(dtype).kind in "iu" else x.astype(dtype)


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("opset", [1, 11, 13, 18, LATEST])
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions(op: str, opset: int, axes: list[int] | None, keepdims: int) -> None:
    if axes == [] and opset < (13 if op == "ReduceSum" else 18):
        return  # onnx.helper cannot type an empty list attribute
    for dtype in (np.float32, np.float64):
        inputs, attributes = reduce_inputs(op, opset, reduction_data(op, dtype), axes)
        check(op, inputs, opset=opset, approx=True, keepdims=keepdims, **attributes)


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float16])
def test_reductions_other_types(op: str, dtype: Any) -> None:
    inputs, attributes = reduce_inputs(op, LATEST, reduction_data(op, dtype), [1])
    if dtype == np.float16:
        [actual] = ours(op, inputs, **attributes)
        [expected] = ours(op, [inputs[0].astype(np.float32), inputs[1]], **attributes)
        same(actual, expected.astype(np.float16), approx=True)
    elif op in ("ReduceLogSum", "ReduceLogSumExp", "ReduceL2", "ReduceMean"):
        # computed in float64, truncated back to the integer type
        [expected] = ours(op, [inputs[0].astype(np.float64), inputs[1]], **attributes)
        same(ours(op, inputs, **attributes)[0], expected.astype(dtype))
    else:
        # the output keeps the input type (the reference widens ReduceSumSquare to int64)
        model, kernel = build(op, inputs, LATEST, **attributes)
        [expected] = ReferenceEvaluator(model).run(None, {"x0": inputs[0], "x1": inputs[1]})
        same(kernel.run(*inputs)[0], expected.astype(dtype))


def test_reduce_max_min_bool_and_bfloat16() -> None:
    x = booleans(3, 4)
    for op in ("ReduceMax", "ReduceMin"):
        check(op, [x, ints64(1)], keepdims=0)
        [y] = ours(op, [floats(3, 4, dtype=BF16), ints64(0)])
        assert y.dtype == BF16 and y.shape == (1, 4)


@pytest.mark.parametrize("op", REDUCTIONS)
def test_reductions_noop_and_empty_sets(op: str) -> None:
    x = reduction_data(op, np.float32)
    same(ours(op, [x, ints64()], noop_with_empty_axes=1)[0], x)
    empty = np.zeros((2, 0, 4), np.float32)
    inputs, attributes = reduce_inputs(op, LATEST, empty, [1])
    if op != "ReduceMean":  # an empty mean is undefined
        check(op, inputs, **attributes)


def test_log_sum_exp_is_stable() -> None:
    x = np.array([[1000.0, 1000.0], [-1000.0, -1001.0]], np.float32)
    [y] = ours("ReduceLogSumExp", [x, ints64(1)], keepdims=0)
    np.testing.assert_allclose(y, [1000 + np.log(2), -1000 + np.log1p(np.exp(-1))], rtol=1e-6)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64, np.uint8])
def test_arg_max_min(op: str, axis: int, keepdims: int, last: int, dtype: Any) -> None:
    x = RNG.integers(0, 3, (3, 4, 5)).astype(dtype)  # ties on purpose
    check(op, [x], axis=axis, keepdims=keepdims, select_last_index=last)
    if not last:
        check(op, [x], opset=11, axis=axis, keepdims=keepdims)
        if axis >= 0:
            check(op, [x], opset=1, axis=axis, keepdims=keepdims)


def test_arg_max_bfloat16() -> None:
    x = np.array([[1, 3, 3], [2, -1, 0]], BF16)
    same(ours("ArgMax", [x], axis=1, select_last_index=1)[0], ints64(2, 0).reshape(2, 1))
    same(ours("ArgMin", [x], axis=0, keepdims=0)[0], ints64(0, 1, 1))


def softmax_oracle(op: str, x: np.ndarray, axis: int, opset: int) -> np.ndarray:
    """Softmax in extended precision, with the 2-D coercion of opsets before 13."""
    data = x.astype(np.longdouble)
    if opset < 13:
        axis %= x.ndim
        data, axis = data.reshape(int(np.prod(x.shape[:axis])), -1), 1
    shifted = data - data.max(axis=axis, keepdims=True)
    log_total = np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    result = shifted - log_total if op == "LogSoftmax" else np.exp(shifted - log_total)
    return result.reshape(x.shape).astype(x.dtype)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax(op: str, opset: int, axis: int | None, dtype: Any) -> None:
    if opset == 1 and axis == -1:
        return
    x = floats(2, 3, 4, dtype=dtype) * 5
    attributes = {} if axis is None else {"axis": axis}
    [y] = ours(op, [x], opset=opset, **attributes)
    # The reference ignores the 2-D coercion of old opsets and computes LogSoftmax as the log of
    # Softmax, which loses the log-probabilities near 0; extended precision is the oracle instead.
    default = 1 if opset < 13 else -1
    same(y, softmax_oracle(op, x, default if axis is None else axis, opset), approx=True)
    if opset == 13 and op == "Softmax":
        check(op, [x], opset=opset, approx=True, **attributes)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_stable_empty_and_half(op: str) -> None:
    x = np.array([[1000, 999, -1000], [0, 0, 0]], np.float32)
    same(ours(op, [x])[0], softmax_oracle(op, x, -1, 13), approx=True)
    check(op, [np.zeros((0, 3), np.float32)], approx=True)
    x = floats(2, 5, dtype=np.float16)
    same(ours(op, [x])[0], ours(op, [x.astype(np.float32)])[0].astype(np.float16), approx=True)


# ---------------------------------------------------------------- errors name the node

@pytest.mark.parametrize(("op", "inputs", "opset", "attributes"), [
    ("Cast", [NUMBERS], LATEST, {"to": 999}),
    ("Cast", [NUMBERS], LATEST, {"to": TensorProto.FLOAT8E8M0, "round_mode": "sideways"}),
    ("Constant", [], LATEST, {"value_int": 1, "value_float": 2.0}),
    ("Concat", [NUMBERS], LATEST, {}),
    ("Pad", [NUMBERS, ints64(1, 1, 1, 1)], LATEST, {"mode": "mirror"}),
    ("Pad", [NUMBERS, ints64(1, 1, 1, 1)], 18, {"mode": "wrap"}),
    ("Split", [NUMBERS], LATEST, {"num_outputs": 3}),
    ("Unsqueeze", [NUMBERS], 11, {}),
])
def test_bad_attributes_fail_at_construction(op: str, inputs: list, opset: int, attributes: dict) -> None:
    with pytest.raises(KernelError, match=f"{op.lower()}_node"):
        build(op, inputs, opset, **attributes)


@pytest.mark.parametrize(("op", "inputs", "attributes"), [
    ("Reshape", [NUMBERS, ints64(-1, -1)], {}),
    ("Reshape", [NUMBERS, ints64(3, 3)], {}),
    ("Reshape", [np.zeros((0, 3), np.float32), ints64(0, -1)], {"allowzero": 1}),
    ("Transpose", [NUMBERS], {"perm": [0, 0]}),
    ("Squeeze", [NUMBERS, ints64(0)], {}),
    ("Unsqueeze", [NUMBERS, ints64(0, -4)], {}),
    ("Gather", [NUMBERS, ints64(2)], {}),
    ("Gather", [NUMBERS, ints64(0)], {"axis": 2}),
    ("GatherElements", [NUMBERS, ints64(0)], {}),
    ("GatherElements", [NUMBERS, np.zeros((1, 5), np.int64)], {}),
    ("Slice", [NUMBERS, ints64(0), ints64(1), ints64(0), ints64(0)], {}),
    ("Slice", [NUMBERS, ints64(0, 0), ints64(1, 1), ints64(1, -1)], {}),
    ("Expand", [NUMBERS, ints64(3, 4)], {}),
    ("Concat", [NUMBERS, floats(2, 3)], {"axis": 0}),
    ("Split", [NUMBERS], {"axis": 1}),
    ("Split", [NUMBERS, ints64(1, 2)], {"axis": 1}),
    ("Range", [np.array(1), np.array(5), np.array(0)], {}),
    ("Tile", [NUMBERS, ints64(2)], {}),
    ("Flatten", [NUMBERS], {"axis": 3}),
    ("ConstantOfShape", [ints64(2, -1)], {}),
    ("Pad", [NUMBERS, ints64(1, 1)], {}),
    ("Pad", [np.zeros((0, 2), np.float32), ints64(1, 0, 0, 0)], {"mode": "edge"}),
    ("Trilu", [ints64(1, 2)], {}),
    ("OneHot", [ints64(1), np.array(0), ints64(0, 1)], {}),
    ("ReduceSum", [NUMBERS, ints64(0, -2)], {}),
    ("ReduceMax", [NUMBERS, ints64(2)], {}),
    ("ArgMax", [np.zeros((2, 0), np.float32)], {"axis": 1}),
    ("Softmax", [NUMBERS], {"axis": 2}),
])
def test_bad_inputs_fail_at_run(op: str, inputs: list, attributes: dict) -> None:
    outputs = 3 if op == "Split" else 1
    _, kernel = build(op, inputs, LATEST, outputs, **attributes)
    with pytest.raises(KernelError, match=f"{op.lower()}_node"):
        kernel.run(*inputs)


def test_narrow_floats_compute_in_float32_and_other_types_as_they_are():
    narrow = {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn),
              np.dtype(ml_dtypes.float8_e4m3fnuz), np.dtype(ml_dtypes.float8_e5m2),
              np.dtype(ml_dtypes.float8_e5m2fnuz)}
    assert narrow == narrow_float_dtypes()
    for dtype in narrow:
        assert compute_dtype(dtype) == np.float32
    for dtype in (np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint64):
        assert compute_dtype(np.dtype(dtype)) == dtype


def test_a_cast_to_the_inputs_own_type_is_the_input_and_outputs_stay_apart():
    """The cast is a view for the plan (no copy between nodes), never for the caller."""
    from onnx_light.runtime import RuntimeSession

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 4]) for n in ("c", "y")])
    session = RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    c, y = session.run(None, {"x": x})
    assert not np.shares_memory(c, x) and not np.shares_memory(c, y)
    np.testing.assert_array_equal(c, x)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    assert x.min() == -1  # the feed is untouched
