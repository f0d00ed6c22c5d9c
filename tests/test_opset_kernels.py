"""The operators of issue 18's first installment against ``onnx.reference`` on random cases.

ONNX's node tests cover one or two shapes per operator; here hypothesis draws shapes, axes,
attributes and element types, builds a one-node model, and compares a
:class:`~onnx_light.RuntimeSession` (dispatch, type checks, the kernel) with
``onnx.reference.ReferenceEvaluator``: exactly for indexing and integer results, within the
element type's tolerance for float arithmetic. Where the reference departs from the spec
(DFT of a real signal with ``dft_length``), the expected values are numpy's directly.
"""

from __future__ import annotations

import contextlib
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light import RuntimeSession
from onnx_light.kernels import (
    KERNELS,
    activations,
    attention,
    bitwise,
    detection,
    feature_normalization,
    indexing,
    losses,
    matrices,
    norm_pooling,
    rearrangement,
    sampling,
    scans,
    signal_processing,
    sorting,
    state_space,
    strings,
    unpooling,
)
from onnx_light.kernels.base import Kernel, KernelError, NodeContext
from onnx_light.parallel import ThreadPool

LATEST = onnx.defs.onnx_opset_version()
MODULES = (activations, attention, bitwise, detection, feature_normalization, indexing, losses, matrices,
           norm_pooling, rearrangement, sampling, scans, signal_processing, sorting, state_space, strings,
           unpooling)
BF16 = ml_dtypes.bfloat16
RTOL = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-10,
        np.dtype(np.float16): 4e-3, np.dtype(BF16): 3e-2}
# derandomize: the same examples every run, so that a reference quirk cannot fail a run at random
EXAMPLES = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def model(op: str, inputs: list[np.ndarray | None], outputs: list[np.ndarray] | int, opset: int,
          **attributes: Any) -> onnx.ModelProto:
    """A one-node model. ``outputs``: the output arrays (a session needs their types and
    ranks), or only how many there are (the reference evaluator ignores declared outputs)."""
    names = ["" if x is None else f"x{i}" for i, x in enumerate(inputs)]
    examples = outputs if isinstance(outputs, list) else [np.zeros(0, np.float32)] * outputs
    node = helper.make_node(op, names, [f"y{i}" for i in range(len(examples))], name=f"{op}_node",
                            **attributes)
    graph = helper.make_graph(
        [node], "one_node",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
         for n, x in zip(names, inputs, strict=True) if x is not None],
        [helper.make_tensor_value_info(f"y{i}", helper.np_dtype_to_tensor_dtype(y.dtype), [None] * y.ndim)
         for i, y in enumerate(examples)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def feeds(inputs: list[np.ndarray | None]) -> dict[str, np.ndarray]:
    return {f"x{i}": x for i, x in enumerate(inputs) if x is not None}


def ours(op: str, inputs: list[np.ndarray | None], outputs: list[np.ndarray] | int = 1,
         opset: int = LATEST, **attributes: Any) -> list[np.ndarray]:
    session = RuntimeSession(model(op, inputs, outputs, opset, **attributes), num_threads=1)
    return session.run(None, feeds(inputs))


def reference(op: str, inputs: list[np.ndarray | None], opset: int = LATEST, outputs: int = 1,
              **attributes: Any) -> list[np.ndarray]:
    placeholder = model(op, inputs, outputs, opset, **attributes)
    with np.errstate(all="ignore"):  # 0 / 0 where a loss ignores every target, for one
        return [np.asarray(y) for y in ReferenceEvaluator(placeholder).run(None, feeds(inputs))]


def same(actual: np.ndarray, expected: np.ndarray, approx: bool = False) -> None:
    """Same dtype, shape and values (NaN equal to NaN); ``approx`` uses the dtype's tolerance."""
    if expected.dtype.kind == "U":  # the reference sometimes returns numpy str arrays
        expected = expected.astype(object)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype == BF16:
        actual, expected = actual.astype(np.float64), expected.astype(np.float64)
    if approx and actual.dtype.kind == "f":
        np.testing.assert_allclose(actual, expected, rtol=RTOL[np.dtype(expected.dtype)],
                                   atol=RTOL[np.dtype(expected.dtype)])
    else:
        np.testing.assert_array_equal(actual, expected)


def check(op: str, inputs: list[np.ndarray | None], opset: int = LATEST, outputs: int = 1,
          approx: bool = False, **attributes: Any) -> list[np.ndarray]:
    """Run ``op`` through the reference and a session and compare every output."""
    expected = reference(op, inputs, opset, outputs, **attributes)
    actual = ours(op, inputs, expected, opset, **attributes)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        same(a, e, approx)
    return actual


def arrays(shape: tuple[int, ...], dtype: Any, seed: int, low: int = -20, high: int = 20) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(max(low, 0) if dtype.kind == "u" else low, high, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


SHAPES = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)
SEEDS = st.integers(0, 2**32 - 1)


# ---------------------------------------------------------------- the dispatch table

def test_tables_list_every_onnx_since_version_that_is_not_deprecated() -> None:
    """Deprecated versions (Scatter-11, GroupNormalization-18) are left out: onnx's checker,
    which every session runs, rejects a model that uses them."""
    for module in MODULES:
        for op, versions in module.KERNELS.items():
            expected = set()
            for opset in range(1, LATEST + 1):
                with contextlib.suppress(onnx.defs.SchemaError):
                    schema = onnx.defs.get_schema(op, opset)
                    if not schema.deprecated:
                        expected.add(schema.since_version)
            assert set(versions) == expected, op
            assert {cls.op_type for cls in versions.values()} == {op}
            assert not any(cls.declaration.tunable for cls in versions.values()), op
            assert all(KERNELS[op][v] is cls for v, cls in versions.items()), op


# ---------------------------------------------------------------- indexing

@EXAMPLES
@given(SHAPES, st.integers(1, 3), st.integers(1, 6), st.sampled_from(["none", "add", "mul", "max", "min"]),
       st.sampled_from([np.float32, np.int32, np.float16, np.int64]), SEEDS)
def test_scatter_nd(shape: tuple[int, ...], depth: int, count: int, reduction: str, dtype: Any,
                    seed: int) -> None:
    depth = min(depth, len(shape))
    rng = np.random.default_rng(seed)
    data = arrays(shape, dtype, seed)
    positions = np.array(list(np.ndindex(*shape[:depth])))
    chosen = positions[rng.choice(len(positions), size=min(count, len(positions)), replace=False)]
    if reduction != "none":  # duplicates combine in index order
        chosen = np.concatenate([chosen, chosen[:1]])
    indices = np.where(rng.random(chosen.shape) < 0.3, chosen - np.array(shape[:depth]), chosen)
    updates = arrays((len(indices), *shape[depth:]), dtype, seed + 1, -3, 4)
    check("ScatterND", [data, indices.astype(np.int64), updates], approx=True, reduction=reduction)


@EXAMPLES
@given(SHAPES, st.data(), st.sampled_from(["none", "add", "mul", "max", "min"]),
       st.sampled_from([np.float32, np.int32, np.float64, np.uint8]), st.sampled_from([np.int32, np.int64]),
       SEEDS)
def test_scatter_elements(shape: tuple[int, ...], data: st.DataObject, reduction: str, dtype: Any,
                          index_type: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dim = shape[axis]
    index_shape = tuple(data.draw(st.integers(1, n)) for n in shape)
    # distinct targets along the axis for "none", where duplicates are undefined
    rows = (np.argsort(rng.random((*index_shape[:axis % len(shape)], dim,
                                   *index_shape[axis % len(shape) + 1:])), axis=axis)
            if reduction == "none" else rng.integers(0, dim, index_shape))
    indices = np.take(rows, np.arange(index_shape[axis]), axis=axis)
    indices = np.where(rng.random(indices.shape) < 0.3, indices - dim, indices).astype(index_type)
    updates = arrays(indices.shape, dtype, seed + 1, 0, 4)
    check("ScatterElements", [arrays(shape, dtype, seed, 0, 20), indices, updates], approx=True,
          axis=axis, reduction=reduction)


@EXAMPLES
@given(SHAPES, st.integers(0, 2), st.integers(1, 3), st.integers(1, 4), SEEDS)
def test_gather_nd(shape: tuple[int, ...], batch_dims: int, depth: int, count: int, seed: int) -> None:
    batch_dims = min(batch_dims, len(shape) - 1)
    depth = min(depth, len(shape) - batch_dims)
    rng = np.random.default_rng(seed)
    dims = np.array(shape[batch_dims:batch_dims + depth])
    indices = rng.integers(-dims, dims, (*shape[:batch_dims], count, depth)).astype(np.int64)
    check("GatherND", [arrays(shape, np.float32, seed), indices], batch_dims=batch_dims)


@EXAMPLES
@given(st.integers(1, 3), st.integers(1, 3), st.integers(2, 6), st.data(), st.booleans(),
       st.sampled_from(["linear", "circular"]), SEEDS)
def test_tensor_scatter(batch: int, heads: int, capacity: int, data: st.DataObject, indexed: bool, mode: str,
                        seed: int) -> None:
    rng = np.random.default_rng(seed)
    length = data.draw(st.integers(1, capacity))
    past = arrays((batch, heads, capacity, 3), np.float32, seed)
    update = arrays((batch, heads, length, 3), np.float32, seed + 1)
    limit = capacity if mode == "circular" else capacity - length + 1
    indices = [rng.integers(0, limit, batch).astype(np.int64)] if indexed else []
    check("TensorScatter", [past, update, *indices], mode=mode)


@EXAMPLES
@given(SHAPES, st.data(), SEEDS)
def test_compress(shape: tuple[int, ...], data: st.DataObject, seed: int) -> None:
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    length = int(np.prod(shape)) if axis is None else shape[axis]
    condition = np.random.default_rng(seed).random(data.draw(st.integers(0, length))) < 0.5
    attributes = {} if axis is None else {"axis": axis}
    check("Compress", [arrays(shape, np.int32, seed), condition], **attributes)


@EXAMPLES
@given(st.integers(1, 5), st.integers(1, 4), st.integers(0, 1), SEEDS)
def test_reverse_sequence(steps: int, batch: int, time_axis: int, seed: int) -> None:
    shape = (steps, batch, 3) if time_axis == 0 else (batch, steps, 3)
    lengths = np.random.default_rng(seed).integers(0, steps + 1, batch).astype(np.int64)
    check("ReverseSequence", [arrays(shape, np.float32, seed), lengths], time_axis=time_axis,
          batch_axis=1 - time_axis)


@EXAMPLES
@given(SHAPES, st.data(), st.integers(0, 1), st.integers(0, 1),
       st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.uint32, np.float16]),
       st.sampled_from(["CumSum", "CumProd"]), SEEDS)
def test_cumulative(shape: tuple[int, ...], data: st.DataObject, exclusive: int, reverse: int,
                    dtype: Any, op: str, seed: int) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = arrays(shape, dtype, seed, 0, 4)
    expected = np.moveaxis(x.astype(np.float64), axis, 0)
    if reverse:
        expected = expected[::-1]
    total = (np.cumsum if op == "CumSum" else np.cumprod)(expected, axis=0)
    if exclusive:
        total = np.concatenate([np.full_like(total[:1], 0 if op == "CumSum" else 1), total[:-1]])
    if reverse:
        total = total[::-1]
    actual = ours(op, [x, np.array(axis, np.int64)], [x], exclusive=exclusive, reverse=reverse)[0]
    same(actual, np.moveaxis(total, 0, axis).astype(dtype), approx=True)
    if op == "CumSum":  # the reference implements CumSum only
        check(op, [x, np.array(axis, np.int64)], approx=True, exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
def test_cumulative_over_an_empty_axis(op: str) -> None:
    x = np.zeros((2, 0), np.float32)
    same(ours(op, [x, np.array(1, np.int64)], [x], exclusive=1, reverse=1)[0], x)


# ---------------------------------------------------------------- sorting

@EXAMPLES
@given(SHAPES, st.data(), st.integers(0, 1),
       st.sampled_from([np.float32, np.int32, np.uint8, np.float64, np.int64]), SEEDS)
def test_top_k_keeps_the_lower_index_of_ties(shape: tuple[int, ...], data: st.DataObject, largest: int,
                                             dtype: Any, seed: int) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(0, shape[axis]))
    x = np.random.default_rng(seed).integers(0, 3, shape).astype(dtype)  # many ties
    values, indices = ours("TopK", [x, np.array([k], np.int64)], [x, np.zeros(x.shape, np.int64)],
                           axis=axis, largest=largest)
    ranked = np.argsort(-x.astype(np.float64) if largest else x, axis=axis, kind="stable")
    expected = np.take(ranked, np.arange(k), axis=axis)
    same(indices, expected.astype(np.int64))
    same(values, np.take_along_axis(x, expected, axis=axis))


@pytest.mark.parametrize("opset", [1, 10, 11])
def test_top_k_opsets(opset: int) -> None:
    x = arrays((3, 5), np.float32, 3)
    inputs = [x] if opset < 10 else [x, np.array([2], np.int64)]
    attributes = {"k": 2} if opset < 10 else {}
    check("TopK", inputs, opset=opset, outputs=2, axis=1, **attributes)


@EXAMPLES
@given(SHAPES, st.data(), st.integers(0, 1), st.sampled_from([np.float32, np.int64, np.int8]), SEEDS)
def test_unique(shape: tuple[int, ...], data: st.DataObject, sorted_: int, dtype: Any, seed: int) -> None:
    axis = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    x = np.random.default_rng(seed).integers(0, 3, shape).astype(dtype)
    attributes = {} if axis is None else {"axis": axis}
    if sorted_:
        check("Unique", [x], outputs=4, sorted=1, **attributes)
        return
    # the reference's unsorted order is wrong for an axis or a flattened input: the definition,
    # slices in order of first occurrence
    along = 0 if axis is None else axis % x.ndim
    slices = list(np.moveaxis(x.reshape(-1) if axis is None else x, along, 0))
    first: list[int] = []
    inverse = []
    for i, item in enumerate(slices):
        match = next((j for j, f in enumerate(first) if np.array_equal(slices[f], item)), None)
        if match is None:
            first.append(i)
            match = len(first) - 1
        inverse.append(match)
    values = np.moveaxis(np.stack([slices[f] for f in first]), 0, along)
    counts = np.bincount(inverse, minlength=len(first))
    expected = [values, np.array(first), np.array(inverse), counts]
    actual = ours("Unique", [x], [values, *(np.zeros(1, np.int64),) * 3], sorted=0, **attributes)
    for a, e in zip(actual, expected, strict=True):
        same(a, e.astype(a.dtype) if a.dtype == np.int64 else e)


# ---------------------------------------------------------------- matrices

@pytest.mark.parametrize(("equation", "shapes"), [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]),
    ("ii->i", [(3, 3)]),
    ("ij->", [(2, 3)]),
    ("...ij->...ji", [(2, 1, 2, 3)]),
    ("i,i", [(4,), (4,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
def test_einsum(equation: str, shapes: list[tuple[int, ...]], dtype: Any) -> None:
    inputs = [arrays(shape, dtype, i, -3, 4) for i, shape in enumerate(shapes)]
    check("Einsum", inputs, approx=True, equation=equation)


@pytest.mark.parametrize("k", [-2, 0, 1, 4])
@pytest.mark.parametrize("dtype", [None, TensorProto.INT32, TensorProto.BOOL, TensorProto.DOUBLE])
def test_eye_like(k: int, dtype: int | None) -> None:
    attributes = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check("EyeLike", [np.zeros((3, 4), np.float32)], **attributes)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_det(dtype: Any) -> None:
    check("Det", [arrays((2, 3, 3), dtype, 5)], approx=True)


# ---------------------------------------------------------------- activations

@EXAMPLES
@given(SHAPES, st.sampled_from(["Mish", "Swish", "ThresholdedRelu", "Shrink"]),
       st.sampled_from([np.float32, np.float64, np.float16]), st.floats(0.25, 2.0), SEEDS)
def test_activations(shape: tuple[int, ...], op: str, dtype: Any, alpha: float, seed: int) -> None:
    x = arrays(shape, dtype, seed) * 3
    attributes = {"Swish": {"alpha": alpha}, "ThresholdedRelu": {"alpha": alpha},
                  "Shrink": {"lambd": alpha, "bias": alpha / 2}}.get(op, {})
    if op == "Swish":  # the reference has no Swish (opset 24): x * sigmoid(alpha x)
        wide = x.astype(np.float64)
        expected = (wide / (1 + np.exp(-np.float32(alpha) * wide))).astype(dtype)
        same(ours(op, [x], [x], **attributes)[0], expected, approx=True)
    else:
        check(op, [x], approx=True, **attributes)


@pytest.mark.parametrize(("op", "attributes"), [("Mish", {}), ("Swish", {"alpha": 0.7}),
                                                ("ThresholdedRelu", {"alpha": 0.2})])
def test_in_place_activations_run_as_the_epilogue_of_a_conv(op: str, attributes: dict[str, Any]) -> None:
    """Mish, Swish and ThresholdedRelu compute in place, so the runtime's fusion folds them
    into the convolution before them, with the unfused result."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node(op, ["c"], ["y"], name="activation", **attributes)]
    graph = helper.make_graph(nodes, "conv_activation",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
                              initializer=[onnx.numpy_helper.from_array(w, "w")])
    conv_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", LATEST)])
    x = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)}
    fused, plain = RuntimeSession(conv_model, num_threads=1), RuntimeSession(conv_model, fuse=False)
    assert fused.fused_nodes == 1 and plain.fused_nodes == 0
    np.testing.assert_allclose(fused.run(None, x)[0], plain.run(None, x)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 5)])
def test_swiglu_is_swish_of_the_gate_times_the_value(shape: tuple[int, ...]) -> None:
    a, b = arrays(shape, np.float32, 1), arrays(shape, np.float32, 2)
    wide = a.astype(np.float64)
    expected = (wide / (1 + np.exp(-0.5 * wide)) * b).astype(np.float32)
    same(ours("SwiGLU", [a, b], [a], alpha=0.5)[0], expected, approx=True)


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int8])
def test_shrink_integers(dtype: Any) -> None:
    check("Shrink", [arrays((4, 5), dtype, 2)], lambd=1.5, bias=1.0)


@EXAMPLES
@given(SHAPES, st.data(), st.sampled_from([11, 13]), SEEDS)
def test_hardmax_marks_the_first_maximum(shape: tuple[int, ...], data: st.DataObject, opset: int,
                                         seed: int) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = np.random.default_rng(seed).integers(0, 3, shape).astype(np.float32)  # ties
    if opset >= 13:
        check("Hardmax", [x], opset=opset, axis=axis)
        return
    # before 13 the input is coerced to 2-D at axis (the reference ignores that): by definition
    rows = x.reshape(int(np.prod(shape[:axis % len(shape)])), -1)
    expected = np.zeros_like(rows)
    expected[np.arange(rows.shape[0]), np.argmax(rows, axis=1)] = 1
    same(ours("Hardmax", [x], [x], opset=opset, axis=axis)[0], expected.reshape(shape))


# ---------------------------------------------------------------- normalization

@EXAMPLES
@given(st.integers(1, 3), st.sampled_from([(2, 1), (4, 2), (6, 3), (4, 4)]), st.integers(1, 5),
       st.sampled_from([np.float32, np.float64, np.float16]), SEEDS)
def test_group_normalization(n: int, channels_groups: tuple[int, int], width: int, dtype: Any,
                             seed: int) -> None:
    channels, groups = channels_groups
    x = arrays((n, channels, width, 2), dtype, seed)
    scale, bias = arrays((channels,), dtype, seed + 1), arrays((channels,), dtype, seed + 2)
    stash = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
    check("GroupNormalization", [x, scale, bias], approx=True, num_groups=groups, epsilon=1e-3,
          stash_type=stash)


@EXAMPLES
@given(SHAPES, st.data(), st.sampled_from([np.float32, np.float64, np.float16]), SEEDS)
def test_rms_normalization(shape: tuple[int, ...], data: st.DataObject, dtype: Any, seed: int) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x, scale = arrays(shape, dtype, seed), arrays(shape[axis:], dtype, seed + 1)
    expected = reference("RMSNormalization", [x, scale], axis=axis)[0]
    actual = ours("RMSNormalization", [x, scale], [expected], axis=axis)[0]
    # the statistics are float32 (stash_type's default); the reference computes in X's type
    np.testing.assert_allclose(actual, expected, rtol=max(RTOL[x.dtype], 1e-5), atol=1e-5)
    assert actual.dtype == x.dtype


@EXAMPLES
@given(SHAPES, st.data(), st.sampled_from([1, 2]), SEEDS)
def test_lp_normalization(shape: tuple[int, ...], data: st.DataObject, p: int, seed: int) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = arrays(shape, np.float32, seed)
    x[..., 0] = 0  # zero norms where the axis is the last one
    # by definition: the reference's L1 norm forgets the absolute value
    norm = np.sum(np.abs(x.astype(np.float64)) ** p, axis=axis, keepdims=True) ** (1 / p)
    expected = np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm)).astype(np.float32)
    same(ours("LpNormalization", [x], [x], axis=axis, p=p)[0], expected, approx=True)


@pytest.mark.parametrize(("axes", "opset"), [(None, 9), (None, 12), ([0, 2, 3], LATEST), ([1], LATEST),
                                             ([-1, 0], LATEST)])
def test_mean_variance_normalization(axes: list[int] | None, opset: int) -> None:
    """From opset 13 onnx's checker rejects a node without ``axes`` (its function body), so
    the default axes are checked at 9 and 12."""
    attributes = {} if axes is None else {"axes": axes}
    check("MeanVarianceNormalization", [arrays((2, 3, 4, 5), np.float32, 9)], opset=opset, approx=True,
          **attributes)


# ---------------------------------------------------------------- losses

@EXAMPLES
@given(st.integers(1, 3), st.integers(2, 5), st.lists(st.integers(1, 3), max_size=2).map(tuple),
       st.sampled_from(["none", "sum", "mean"]), st.booleans(), st.sampled_from([None, 0, 1]),
       st.sampled_from(["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]),
       st.sampled_from([np.float32, np.float64]), st.sampled_from([np.int32, np.int64]), SEEDS)
def test_losses(n: int, classes: int, extra: tuple[int, ...], reduction: str, weighted: bool,
                ignore_index: int | None, op: str, dtype: Any, index_type: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = arrays((n, classes, *extra), dtype, seed)
    if op == "NegativeLogLikelihoodLoss":
        scores = -np.abs(scores)  # log-probabilities
    target = rng.integers(0, classes, (n, *extra)).astype(index_type)
    weight = rng.random(classes).astype(dtype) + 0.5 if weighted else None
    attributes = {"reduction": reduction} | ({} if ignore_index is None else {"ignore_index": ignore_index})
    outputs = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    check(op, [scores, target, weight], outputs=outputs, approx=True, **attributes)


# ---------------------------------------------------------------- attention

@EXAMPLES
@given(st.integers(1, 2), st.sampled_from([(2, 2), (4, 2), (3, 1)]), st.integers(1, 4), st.integers(1, 4),
       st.integers(0, 3), st.booleans(), st.sampled_from([None, "bool", "float"]),
       st.sampled_from([0.0, 2.0]), st.sampled_from([0, 1, 2, 3]), st.booleans(),
       st.sampled_from([np.float32, np.float16]), SEEDS)
def test_attention(batch: int, heads: tuple[int, int], q_length: int, kv_length: int, past: int,
                   causal: bool, mask: str | None, softcap: float, mode: int, three_d: bool, dtype: Any,
                   seed: int) -> None:
    q_heads, kv_heads = heads
    size, v_size = 4, 3
    q = arrays((batch, q_heads, q_length, size), dtype, seed)
    k = arrays((batch, kv_heads, kv_length, size), dtype, seed + 1)
    v = arrays((batch, kv_heads, kv_length, v_size), dtype, seed + 2)
    total = past + kv_length
    masks = {None: None, "bool": np.random.default_rng(seed).random((q_length, total)) < 0.8,
             "float": arrays((1, q_heads, q_length, total), dtype, seed + 3)}
    pasts = ([arrays((batch, kv_heads, past, size), dtype, seed + 4),
              arrays((batch, kv_heads, past, v_size), dtype, seed + 5)] if past else [None, None])
    attributes = {"is_causal": int(causal), "softcap": softcap, "qk_matmul_output_mode": mode}
    if three_d:
        q, k, v = (x.transpose(0, 2, 1, 3).reshape(batch, x.shape[2], -1) for x in (q, k, v))
        attributes |= {"q_num_heads": q_heads, "kv_num_heads": kv_heads}
    inputs = [q, k, v, masks[mask], *pasts]
    while inputs[-1] is None:
        inputs.pop()
    expected = reference("Attention", inputs, outputs=4, **attributes)
    actual = ours("Attention", inputs, expected, **attributes)
    # mode 0 is the raw product (the spec): the reference returns it soft-capped
    compared = 3 if softcap and mode == 0 else 4
    for a, e in zip(actual[:compared], expected[:compared], strict=True):
        same(a, e, approx=True)


def test_attention_mode_0_is_the_product_before_the_soft_cap() -> None:
    q = arrays((1, 2, 3, 4), np.float32, 1)
    k, v = arrays((1, 2, 5, 4), np.float32, 2), arrays((1, 2, 5, 4), np.float32, 3)
    outputs = ours("Attention", [q, k, v], [q, k, v, np.zeros((1, 2, 3, 5), np.float32)], softcap=0.5,
                   qk_matmul_output_mode=0)
    raw = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / 2  # scale 1 / sqrt(head size 4)
    np.testing.assert_allclose(outputs[3], raw, rtol=1e-5, atol=1e-6)
    assert np.abs(raw).max() > 0.5  # beyond the cap: a capped product would differ


@EXAMPLES
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 4), st.sampled_from([4, 6, 8]), st.booleans(),
       st.booleans(), st.booleans(), st.sampled_from([np.float32, np.float16]), SEEDS)
def test_rotary_embedding(batch: int, heads: int, length: int, size: int, partial: bool, interleaved: bool,
                          positions: bool, dtype: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    dim = size // 2 if partial and size % 4 == 0 else size
    x = arrays((batch, heads, length, size), dtype, seed)
    angles = rng.random((8, dim // 2)) * 6 if positions else rng.random((batch, length, dim // 2)) * 6
    caches = [np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)]
    ids = [rng.integers(0, 8, (batch, length)).astype(np.int64)] if positions else []
    attributes = {"interleaved": int(interleaved)} | ({"rotary_embedding_dim": dim} if partial else {})
    check("RotaryEmbedding", [x, *caches, *ids], approx=True, **attributes)
    three_d = x.transpose(0, 2, 1, 3).reshape(batch, length, heads * size)
    check("RotaryEmbedding", [three_d, *caches, *ids], approx=True, num_heads=heads, **attributes)


@EXAMPLES
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 5), st.integers(1, 4), st.booleans(),
       st.booleans(), st.sampled_from(["none", "silu"]), SEEDS)
def test_causal_conv_with_state(batch: int, channels: int, length: int, k: int, biased: bool, stateful: bool,
                                activation: str, seed: int) -> None:
    inputs = [arrays((batch, channels, length), np.float32, seed),
              arrays((channels, 1, k), np.float32, seed + 1),
              arrays((channels,), np.float32, seed + 2) if biased else None,
              arrays((batch, channels, k - 1), np.float32, seed + 3) if stateful else None]
    while inputs[-1] is None:
        inputs.pop()
    check("CausalConvWithState", inputs, outputs=2, approx=True, activation=activation)


@EXAMPLES
@given(st.integers(1, 2), st.integers(1, 4), st.sampled_from([(2, 2), (4, 2), (2, 1)]),
       st.sampled_from(["linear", "gated", "delta", "gated_delta"]), st.booleans(), st.booleans(), SEEDS)
def test_linear_attention(batch: int, steps: int, heads: tuple[int, int], rule: str, stateful: bool,
                          per_key_decay: bool, seed: int) -> None:
    q_heads, kv_heads = heads
    dk, dv = 3, 2
    rng = np.random.default_rng(seed)
    key = arrays((batch, steps, kv_heads, dk), np.float32, seed + 1)
    key /= np.linalg.norm(key, axis=-1, keepdims=True)  # L2-normalized, as the delta rules expect
    decay = -rng.random((batch, steps, kv_heads * (dk if per_key_decay else 1))).astype(np.float32)
    beta = rng.random((batch, steps, kv_heads)).astype(np.float32)
    inputs = [arrays((batch, steps, q_heads * dk), np.float32, seed), key.reshape(batch, steps, -1),
              arrays((batch, steps, kv_heads * dv), np.float32, seed + 2),
              arrays((batch, kv_heads, dk, dv), np.float32, seed + 3) if stateful else None,
              decay if "gated" in rule else None, beta if "delta" in rule else None]
    while inputs[-1] is None:
        inputs.pop()
    check("LinearAttention", inputs, outputs=2, approx=True, q_num_heads=q_heads, kv_num_heads=kv_heads,
          update_rule=rule)


# ---------------------------------------------------------------- detection

@EXAMPLES
@given(st.integers(1, 2), st.integers(1, 3), st.integers(0, 12), st.integers(0, 1), st.integers(0, 5),
       st.sampled_from([0.0, 0.3, 0.6]), st.sampled_from([None, 0.0, 0.4]), SEEDS)
def test_non_max_suppression(images: int, classes: int, count: int, center: int, limit: int, iou: float,
                             floor: float | None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    origin = rng.integers(0, 8, (images, count, 2)).astype(np.float32)  # overlaps and equal boxes
    extent = rng.integers(0, 5, (images, count, 2)).astype(np.float32)  # some of no area
    boxes = (np.concatenate([origin + extent / 2, extent], axis=2) if center
             else np.concatenate([origin, origin + extent], axis=2))
    scores = rng.integers(0, 5, (images, classes, count)).astype(np.float32) / 4  # ties
    inputs = [boxes, scores, np.array([limit], np.int64), np.array([iou], np.float32),
              None if floor is None else np.array([floor], np.float32)]
    while inputs[-1] is None:
        inputs.pop()
    check("NonMaxSuppression", inputs, center_point_box=center)


# ---------------------------------------------------------------- strings

WORDS = st.lists(st.sampled_from(["", " ", "a", "B", "ab", "a b", " x  y ", "to", "TO", "é", "a,b,,c"]),
                 min_size=1, max_size=6)


@EXAMPLES
@given(WORDS, WORDS)
def test_string_concat_broadcasts(left: list[str], right: list[str]) -> None:
    x = np.array(left, object).reshape(-1, 1)
    y = np.array(right, object)
    check("StringConcat", [x, y])


@EXAMPLES
@given(WORDS, st.sampled_from([None, ",", " ", "ab"]), st.sampled_from([None, 0, 1, 2]))
def test_string_split(words: list[str], delimiter: str | None, maxsplit: int | None) -> None:
    attributes = ({} if delimiter is None else {"delimiter": delimiter}) | \
                 ({} if maxsplit is None else {"maxsplit": maxsplit})
    check("StringSplit", [np.array(words, object).reshape(1, -1)], outputs=2, **attributes)


@pytest.mark.parametrize(("words", "case_sensitive", "action", "expected"), [
    (["To", "be", "or", "NOT", "to"], 0, "LOWER", ["be", "or"]),
    (["To", "be", "or", "NOT", "to"], 1, "NONE", ["To", "be", "or", "NOT"]),
    (["To", "be", "or", "NOT", "to"], 0, "UPPER", ["BE", "OR"]),
    (["to", "NOT"], 0, "NONE", [""]),
])
@pytest.mark.parametrize("row", [False, True])
def test_string_normalizer(words: list[str], case_sensitive: int, action: str, expected: list[str],
                           row: bool) -> None:
    """By definition: stop words are whole elements, compared case-insensitively by default
    (the reference keeps "To" for the stop word "to", cuts stop words out of elements with
    spaces, drops empty strings and strips accents)."""
    shape = (1, -1) if row else (-1,)
    x = np.array(words, object).reshape(shape)
    y = ours("StringNormalizer", [x], [x], stopwords=["to", "not"], is_case_sensitive=case_sensitive,
             case_change_action=action)[0]
    same(y, np.array(expected, object).reshape(shape))


@pytest.mark.parametrize("pattern", [r"a.*", r"[a-z]+ [a-z]+", r"\s*x\s+y\s*", r"(?i)to", r"é|"])
def test_regex_full_match(pattern: str) -> None:
    words = np.array(["", " ", "a", "B", "ab", "a b", " x  y ", "to", "TO", "é"], object).reshape(2, 5)
    check("RegexFullMatch", [words], pattern=pattern)


# ---------------------------------------------------------------- bitwise

@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.uint64])
def test_bitwise_binary_broadcasts(op: str, dtype: Any) -> None:
    check(op, [arrays((3, 4), dtype, 1, -100, 100), arrays((4,), dtype, 2, -100, 100)])


def test_bitwise_not() -> None:
    check("BitwiseNot", [arrays((3, 4), np.int16, 1, -100, 100)])


@pytest.mark.parametrize(("source", "target"), [
    (np.float32, np.int32), (np.int64, np.float64), (np.uint16, np.float16), (np.bool_, np.uint8),
    (ml_dtypes.bfloat16, np.int16), (np.int8, ml_dtypes.float8_e4m3fn), (np.complex64, np.uint64),
])
def test_bit_cast_keeps_the_bits(source: Any, target: Any) -> None:
    x = np.random.default_rng(3).integers(0, 255, (2, 3, 8), dtype=np.uint8).view(np.dtype(source)) \
        if np.dtype(source) != np.bool_ else np.array([[True, False, True]])
    to = helper.np_dtype_to_tensor_dtype(np.dtype(target))
    y = ours("BitCast", [x], [x.view(np.dtype(target))], to=to)[0]
    assert y.dtype == np.dtype(target) and y.shape == x.shape
    assert y.tobytes() == x.tobytes()
    assert not np.shares_memory(x, y)


def test_bit_cast_between_four_bit_types_keeps_the_low_bits() -> None:
    x = np.array([-8, -1, 0, 7], ml_dtypes.int4)
    y = ours("BitCast", [x], [np.zeros(4, ml_dtypes.uint4)], to=TensorProto.UINT4)[0]
    same(y, np.array([8, 15, 0, 7], ml_dtypes.uint4))


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64])
def test_bit_shift(direction: str, dtype: Any) -> None:
    x = arrays((3, 4), dtype, 1, 0, 200)
    check("BitShift", [x, arrays((4,), dtype, 2, 0, 8)], direction=direction)


def test_bit_shift_signed_and_out_of_range_amounts() -> None:
    x = np.array([-8, -1, 5, 64, -128, 3], np.int8)
    amounts = np.array([1, 9, -1, 1, 7, 8], np.int8)
    right = ours("BitShift", [x, amounts], [x], opset=28, direction="RIGHT")[0]
    left = ours("BitShift", [x, amounts], [x], opset=28, direction="LEFT")[0]
    same(right, np.array([-4, -1, 0, 32, -1, 0], np.int8))
    same(left, np.array([-16, 0, 0, -128, 0, 0], np.int8))


# ---------------------------------------------------------------- rearrangement

@EXAMPLES
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3),
       st.sampled_from(["DCR", "CRD"]), SEEDS)
def test_depth_to_space_and_back(n: int, c: int, h: int, w: int, b: int, mode: str, seed: int) -> None:
    x = arrays((n, c * b * b, h, w), np.float32, seed)
    space = check("DepthToSpace", [x], blocksize=b, mode=mode)[0]
    if mode == "DCR":  # the reference implements SpaceToDepth's DCR order only
        check("SpaceToDepth", [space], blocksize=b)
    same(ours("SpaceToDepth", [space], [x], blocksize=b, mode=mode)[0], x)


@EXAMPLES
@given(SHAPES, st.data(), SEEDS)
def test_center_crop_pad(shape: tuple[int, ...], data: st.DataObject, seed: int) -> None:
    axes = data.draw(st.one_of(st.none(), st.lists(st.integers(0, len(shape) - 1), min_size=1,
                                                   max_size=len(shape), unique=True)))
    count = len(shape) if axes is None else len(axes)
    lengths = np.array(data.draw(st.lists(st.integers(0, 6), min_size=count, max_size=count)), np.int64)
    attributes = {} if axes is None else {"axes": axes}
    check("CenterCropPad", [arrays(shape, np.float32, seed), lengths], **attributes)


@pytest.mark.parametrize(("image", "block", "attributes"), [
    ((5, 5), (1, 5), {}),
    ((5, 5), (2, 2), {"strides": [2, 2], "pads": [1, 1, 0, 0]}),
    ((6, 4), (2, 3), {"dilations": [2, 1]}),
    ((4, 4, 3), (2, 2, 2), {}),
])
def test_col2im(image: tuple[int, ...], block: tuple[int, ...], attributes: dict[str, Any]) -> None:
    rank = len(image)
    dilations = attributes.get("dilations", [1] * rank)
    strides = attributes.get("strides", [1] * rank)
    pads = attributes.get("pads", [0] * 2 * rank)
    grid = [(i + pads[a] + pads[a + rank] - (k - 1) * d - 1) // s + 1
            for a, (i, k, d, s) in enumerate(zip(image, block, dilations, strides, strict=True))]
    x = arrays((2, 3 * int(np.prod(block)), int(np.prod(grid))), np.float32, 4)
    check("Col2Im", [x, np.array(image, np.int64), np.array(block, np.int64)], approx=True, **attributes)


# ---------------------------------------------------------------- pooling

@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("attributes", [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 0, 1, 0]},
    {"kernel_shape": [3], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [2, 2], "dilations": [2, 1], "ceil_mode": 1, "strides": [2, 2]},
])
def test_lp_pool(p: int, attributes: dict[str, Any]) -> None:
    rank = len(attributes["kernel_shape"])
    check("LpPool", [arrays((2, 3, 7, 6)[:2 + rank], np.float32, 5)], approx=True, p=p, **attributes)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool(p: int) -> None:
    x = arrays((2, 3, 4, 5), np.float32, 6)
    expected = (np.sum(np.abs(x.astype(np.float64)) ** p, axis=(2, 3), keepdims=True) ** (1 / p))
    same(ours("GlobalLpPool", [x], [x], p=p)[0], expected.astype(np.float32), approx=True)


def test_max_unpool_inverts_max_pool_indices() -> None:
    x = arrays((2, 3, 6, 6), np.float32, 7)
    pooled, indices = ours("MaxPool", [x], [x, np.zeros(x.shape, np.int64)], kernel_shape=[2, 2],
                           strides=[2, 2])
    unpooled = check("MaxUnpool", [pooled, indices], kernel_shape=[2, 2], strides=[2, 2])[0]
    expected = np.zeros(x.size, np.float32)
    expected[indices.reshape(-1)] = pooled.reshape(-1)
    same(unpooled, expected.reshape(x.shape))


# ---------------------------------------------------------------- sampling

@EXAMPLES
@given(st.integers(1, 3), st.sampled_from(["linear", "nearest", "cubic"]),
       st.sampled_from(["zeros", "border", "reflection"]), st.integers(0, 1), SEEDS)
def test_grid_sample(rank: int, mode: str, padding: str, align_corners: int, seed: int) -> None:
    if mode == "cubic" and rank == 3:
        rank = 2  # the reference's cubic walk over 4^3 taps per pixel is slow
    rng = np.random.default_rng(seed)
    # one pixel reflected about its own centre is 0 / 0 (the reference raises): two or more
    smallest = 2 if padding == "reflection" and align_corners else 1
    x = arrays((1, 2, *rng.integers(smallest, 5, rank)), np.float32, seed)
    # positions inside, outside and on pixel centres and edges (rounding ties for nearest)
    grid = (rng.integers(-6, 7, (1, *rng.integers(1, 4, rank), rank)) / 4).astype(np.float32)
    attributes = {"mode": mode, "padding_mode": padding, "align_corners": align_corners}
    expected = check("GridSample", [x, grid], approx=True, **attributes)
    if rank == 2:  # opset 16 names the modes bilinear and bicubic (the reference does not)
        attributes["mode"] = {"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode)
        same(ours("GridSample", [x, grid], expected, opset=16, **attributes)[0], expected[0])


@pytest.mark.parametrize("size", [(2, 1, 3, 4), (1, 2, 1, 1), (2, 1, 2, 3, 4)])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid(size: tuple[int, ...], align_corners: int) -> None:
    rank = len(size) - 2
    theta = arrays((size[0], rank, rank + 1), np.float32, 4)
    check("AffineGrid", [theta, np.array(size, np.int64)], approx=True, align_corners=align_corners)


# ---------------------------------------------------------------- signal processing

@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("output_datatype", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_windows(op: str, periodic: int, output_datatype: int) -> None:
    check(op, [np.array(9, np.int64)], approx=True, periodic=periodic, output_datatype=output_datatype)


@EXAMPLES
@given(st.integers(1, 3), st.integers(2, 9), st.integers(1, 2), st.integers(0, 1), st.integers(0, 1),
       st.one_of(st.none(), st.integers(2, 12)), st.sampled_from([np.float32, np.float64]), SEEDS)
def test_dft(batch: int, length: int, parts: int, inverse: int, onesided: int, dft_length: int | None,
             dtype: Any, seed: int) -> None:
    if onesided:  # one-sided: a real signal forward, complex frequencies back
        parts = 2 if inverse else 1
    x = arrays((batch, length, 3, parts), dtype, seed)
    signal = x[..., 0] + (1j * x[..., 1] if parts == 2 else 0)
    n = dft_length or (2 * (length - 1) if inverse and onesided else length)
    if inverse and onesided:
        half = np.fft.irfft(signal, n=n, axis=1)[..., np.newaxis]
        expected = half.astype(dtype)
    else:
        full = (np.fft.ifft if inverse else np.fft.fft)(signal, n=n, axis=1)
        full = full[:, :n // 2 + 1] if onesided else full
        expected = np.stack([full.real, full.imag], axis=-1).astype(dtype)
    inputs = [x, None if dft_length is None else np.array(dft_length, np.int64), np.array(1, np.int64)]
    actual = ours("DFT", inputs, [expected], inverse=inverse, onesided=onesided)[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * max(1, n))
    assert actual.dtype == expected.dtype


@pytest.mark.parametrize("window", [True, False])
@pytest.mark.parametrize("onesided", [0, 1])
def test_stft(window: bool, onesided: int) -> None:
    signal = arrays((2, 64, 1), np.float32, 8)
    inputs = [signal, np.array(8, np.int64),
              np.hanning(16).astype(np.float32) if window else None,
              None if window else np.array(16, np.int64)]
    check("STFT", inputs, approx=True, onesided=onesided)


@pytest.mark.parametrize(("mels", "length", "rate", "low", "high"), [
    (8, 16, 8192, 0.0, 4096.0), (5, 64, 16000, 50.0, 7000.0), (20, 512, 22050, 20.0, 8000.0),
])
def test_mel_weight_matrix(mels: int, length: int, rate: int, low: float, high: float) -> None:
    inputs = [np.array(v, np.int64) for v in (mels, length, rate)] + \
             [np.array(v, np.float32) for v in (low, high)]
    check("MelWeightMatrix", inputs, approx=True)


# ---------------------------------------------------------------- bad attributes and inputs

F32, I64 = np.float32, np.int64
BAD = [
    # (op, opset, inputs, attributes, what the message says), at construction...
    ("ScatterND", 16, [np.zeros(3, F32), np.zeros((1, 1), I64), np.zeros(1, F32)], {"reduction": "max"},
     "reduction must be one of ['none', 'add', 'mul'] at opset 16, got 'max'"),
    ("ScatterElements", LATEST, [np.zeros(3, F32), np.zeros(1, I64), np.zeros(1, F32)], {"reduction": "sum"},
     "reduction must be one of"),
    ("GatherND", LATEST, [np.zeros((2, 2), F32), np.zeros((1, 1), I64)], {"batch_dims": -1},
     "batch_dims must not be negative"),
    ("ReverseSequence", LATEST, [np.zeros((2, 2), F32), np.zeros(2, I64)], {"batch_axis": 0, "time_axis": 0},
     "batch_axis and time_axis must be 0 and 1"),
    ("CumSum", LATEST, [np.zeros(3, np.int8), np.array(0, I64)], {}, "does not take element type int8"),
    ("TopK", 10, [np.zeros(3, np.int32), np.array([1], I64)], {},
     "(opset 10) does not take element type int32"),
    ("TopK", 1, [np.zeros(3, F32)], {}, "attribute 'k' is required before opset 10"),
    ("EyeLike", LATEST, [np.zeros((2, 2), F32)], {"dtype": TensorProto.STRING}, "dtype must be a numeric"),
    ("Einsum", LATEST, [np.zeros(2, F32)], {"equation": "i,i->"}, "has 2 operands, the node has 1 inputs"),
    ("Det", LATEST, [np.zeros((2, 2), np.int32)], {}, "does not take element type int32"),
    ("Mish", LATEST, [np.zeros(2, np.int32)], {}, "does not take element type int32"),
    ("Shrink", LATEST, [np.zeros(2, F32)], {"lambd": "wide"}, "attribute 'lambd' must be a float"),
    ("BitShift", LATEST, [np.zeros(2, np.uint8)] * 2, {"direction": "UP"},
     "attribute 'direction' must be one of ['LEFT', 'RIGHT']"),
    ("BitShift", 11, [np.zeros(2, np.int32)] * 2, {"direction": "LEFT"},
     "(opset 11) does not take element type int32"),
    ("BitwiseAnd", LATEST, [np.zeros(2, F32)] * 2, {}, "does not take element type float"),
    ("GroupNormalization", LATEST, [np.zeros((1, 2, 2), F32), np.ones(2, F32), np.zeros(2, F32)], {},
     "attribute 'num_groups' must be a positive integer"),
    ("GroupNormalization", LATEST, [np.zeros((1, 2, 2), F32), np.ones(2, F32), np.zeros(2, F32)],
     {"num_groups": 1, "stash_type": TensorProto.FLOAT16}, "stash_type must be FLOAT (1) or DOUBLE (11)"),
    ("LpNormalization", LATEST, [np.zeros((2, 2), F32)], {"p": 3}, "p must be 1 or 2, got 3"),
    ("DepthToSpace", LATEST, [np.zeros((1, 4, 1, 1), F32)], {},
     "attribute 'blocksize' must be a positive integer"),
    ("SpaceToDepth", 13, [np.zeros((1, 1, 2, 2), F32)], {"blocksize": 2, "mode": "CRD"},
     "mode must be one of ['DCR'] at opset 13, got 'CRD'"),
    ("Col2Im", LATEST, [np.zeros((1, 4, 4), F32), np.array([3, 3], I64), np.array([2, 2], I64)],
     {"strides": [0, 1]}, "strides must be positive"),
    ("LpPool", LATEST, [np.zeros((1, 1, 4), F32)], {"kernel_shape": [2], "p": 0}, "p must be positive"),
    ("MaxUnpool", LATEST, [np.zeros((1, 1, 2), F32), np.zeros((1, 1, 2), I64)], {}, "kernel_shape must hold"),
    ("HannWindow", LATEST, [np.array(4, I64)], {"output_datatype": TensorProto.STRING},
     "output_datatype must be a numeric element type"),
    ("DFT", LATEST, [np.zeros((1, 4, 1), np.int32)], {}, "does not take element type int32"),
    # ... and when the node runs (the model declares no dimensions)
    ("ScatterND", LATEST, [np.zeros(3, F32), np.array([[3]], I64), np.zeros(1, F32)], {},
     "indices must lie in [-3, 2], got [3, 3]"),
    ("ScatterND", LATEST, [np.zeros(3, F32), np.array([[1]], I64), np.zeros(2, F32)], {},
     "updates must have shape [1]"),
    ("ScatterElements", LATEST, [np.zeros(3, F32), np.array([1], I64), np.zeros(2, F32)], {},
     "must have the shape of indices"),
    ("GatherND", LATEST, [np.zeros(3, F32), np.zeros((1, 2), I64)], {},
     "indices address 2 axes of a tensor of rank 1"),
    ("Compress", LATEST, [np.zeros(2, F32), np.ones(3, bool)], {"axis": 0},
     "condition has 3 values, the axis has 2"),
    ("ReverseSequence", LATEST, [np.zeros((2, 2), F32), np.array([3, 1], I64)], {},
     "sequence_lens [3, 1] must hold 2 lengths in [0, 2]"),
    ("CumSum", LATEST, [np.zeros(3, F32), np.array(5, I64)], {}, "axis 5 is out of range"),
    ("TopK", LATEST, [np.zeros(3, F32), np.array([4], I64)], {}, "k must lie in [0, 3]"),
    ("Einsum", LATEST, [np.zeros(2, F32), np.zeros(3, F32)], {"equation": "i,i->"}, "does not fit shapes"),
    ("Det", LATEST, [np.zeros((2, 3), F32)], {}, "square matrices"),
    ("GroupNormalization", LATEST, [np.zeros((1, 3, 2), F32), np.ones(3, F32), np.zeros(3, F32)],
     {"num_groups": 2}, "multiple of num_groups=2"),
    ("GroupNormalization", LATEST, [np.zeros((1, 2, 2), F32), np.ones(3, F32), np.zeros(2, F32)],
     {"num_groups": 1}, "scale must hold 2 values"),
    ("RMSNormalization", LATEST, [np.zeros((2, 3), F32), np.ones(2, F32)], {}, "does not broadcast"),
    ("DepthToSpace", LATEST, [np.zeros((1, 3, 1, 1), F32)], {"blocksize": 2},
     "not a multiple of blocksize^2"),
    ("SpaceToDepth", LATEST, [np.zeros((1, 1, 3, 2), F32)], {"blocksize": 2}, "multiples of blocksize 2"),
    ("CenterCropPad", LATEST, [np.zeros((2, 2), F32), np.array([1], I64)], {},
     "must hold a non-negative length"),
    ("Col2Im", LATEST, [np.zeros((1, 4, 5), F32), np.array([3, 3], I64), np.array([2, 2], I64)], {},
     "must be (N, C * 4, 4)"),
    ("MaxUnpool", LATEST, [np.ones((1, 1, 2), F32), np.array([[[0, 9]]], I64)],
     {"kernel_shape": [2], "strides": [2]},
     "indices must lie in [0, 4)"),
    ("MaxUnpool", LATEST, [np.ones((1, 1, 2), F32), np.zeros((1, 1, 2), I64), np.array([1, 1, 3], I64)],
     {"kernel_shape": [2], "strides": [2]}, "must be at least the unpooled shape [1, 1, 4]"),
    ("DFT", LATEST, [np.zeros((1, 4, 2), F32), None, np.array(-1, I64)], {},
     "names the last (real, imaginary) axis"),
    ("STFT", LATEST, [np.zeros((1, 8, 1), F32), np.array(2, I64), None, np.array(9, I64)], {}, "do not fit"),
    ("MelWeightMatrix", LATEST,
     [np.array(v, I64) for v in (4, 16, 8000)] + [np.array(v, F32) for v in (0, 5000)], {},
     "upper_edge_hertz (5000.0) <= sample_rate / 2"),
    ("BlackmanWindow", LATEST, [np.array(-1, I64)], {}, "must be an integer of at least 0, got -1"),
    ("NegativeLogLikelihoodLoss", LATEST, [np.zeros((2, 3), F32), np.zeros(2, I64)], {"reduction": "max"},
     "reduction must be one of ['none', 'sum', 'mean'], got 'max'"),
    ("NegativeLogLikelihoodLoss", 13, [np.zeros((2, 3), ml_dtypes.bfloat16), np.zeros(2, I64)], {},
     "(opset 13) does not take element type bfloat16"),
    ("NegativeLogLikelihoodLoss", LATEST, [np.zeros((2, 3), F32), np.array([0, 3], I64)], {},
     "targets must lie in [0, 3) (or be ignore_index), got [0, 3]"),
    ("NegativeLogLikelihoodLoss", LATEST, [np.zeros((2, 3), F32), np.zeros(3, I64)], {},
     "target of shape [3] must be the input's shape [2, 3] without its class axis 1"),
    ("Attention", LATEST, [np.zeros((1, 2, 4), F32)] * 3, {"q_num_heads": 3, "kv_num_heads": 3},
     "Q's hidden size 4 is not a multiple of 3 heads"),
    ("Attention", LATEST, [np.zeros((1, 1, 2, 4), F32)] * 3, {"qk_matmul_output_mode": 4},
     "qk_matmul_output_mode must be 0, 1, 2 or 3, got 4"),
    ("Attention", LATEST, [np.zeros((1, 1, 2, 4), F32)] * 3 + [None, np.zeros((1, 1, 1, 4), F32)], {},
     "past_key and past_value go together"),
    ("Attention", LATEST, [np.zeros((1, 1, 2, 4), F32)] * 3 + [np.ones((1, 3), bool)], {},
     "attn_mask's last axis (3) is longer than the total sequence (2)"),
    ("BitCast", LATEST, [np.zeros(2, F32)], {"to": TensorProto.INT64},
     "cannot reinterpret float (32 bits) as int64 (64 bits)"),
    ("BitCast", LATEST, [np.zeros(2, F32)], {"to": TensorProto.STRING},
     "attribute 'to' must be a non-string"),
    ("TensorScatter", LATEST, [np.zeros((1, 4, 2), F32), np.zeros((1, 2, 2), F32), np.array([3], I64)], {},
     "write_indices [3] + 2 updates pass the cache's 4 entries (mode 'linear')"),
    ("TensorScatter", LATEST, [np.zeros((1, 4, 2), F32), np.zeros((1, 2, 3), F32)], {},
     "update of shape [1, 2, 3] must be past_cache's shape [1, 4, 2] but along axis 1"),
    ("SwiGLU", LATEST, [np.zeros((2, 3), F32), np.zeros(3, F32)], {},
     "A [2, 3] and B [3] must have one shape"),
    ("RotaryEmbedding", LATEST, [np.zeros((1, 1, 2, 4), F32), np.zeros((2, 3), F32), np.zeros((2, 3), F32),
                                 np.zeros((1, 2), I64)], {}, "cos_cache gives angles of shape [1, 2, 3]"),
    ("RotaryEmbedding", LATEST, [np.zeros((1, 2, 4), F32)] + [np.zeros((1, 2, 2), F32)] * 2, {},
     "a 3-D input of hidden size 4 needs num_heads dividing it"),
    ("NonMaxSuppression", LATEST, [np.zeros((1, 2, 4), F32), np.zeros((1, 1, 3), F32)], {},
     "boxes [1, 2, 4] must be (images, boxes, 4) and scores [1, 1, 3] (images, classes, boxes)"),
    ("NonMaxSuppression", LATEST, [np.zeros((1, 2, 4), F32), np.zeros((1, 1, 2), F32)],
     {"center_point_box": 2},
     "center_point_box must be 0 or 1, got 2"),
    ("NonMaxSuppression", LATEST, [np.zeros((1, 2, 4), F32), np.zeros((1, 1, 2), F32), np.array([1], I64),
                                   np.array([1.5], F32)], {}, "iou_threshold must lie in [0, 1], got 1.5"),
    ("RegexFullMatch", LATEST, [np.array(["a"], object)], {"pattern": "(a"},
     "pattern '(a' is not a valid regular expression"),
    ("StringNormalizer", LATEST, [np.array(["a"], object)], {"case_change_action": "TITLE"},
     "case_change_action must be 'LOWER', 'UPPER' or 'NONE', got 'TITLE'"),
    ("StringNormalizer", LATEST, [np.array([["a"], ["b"]], object)], {},
     "input must have shape [C] or [1, C], got [2, 1]"),
    ("StringConcat", LATEST, [np.array(["a", "b"], object), np.array(["c", "d", "e"], object)], {},
     "cannot broadcast shapes [2] and [3]"),
    ("StringSplit", LATEST, [np.array(["a"], object)], {"maxsplit": -2}, "maxsplit must not be negative"),
    ("StringSplit", LATEST, [np.zeros(2, F32)], {}, "does not take element type float"),
    ("GridSample", 16, [np.zeros((1, 1, 2, 2), F32), np.zeros((1, 2, 2, 2), F32)], {"mode": "linear"},
     "mode must be one of ['bilinear', 'nearest', 'bicubic'] at opset 16, got 'linear'"),
    ("GridSample", LATEST, [np.zeros((1, 1, 2, 2), F32), np.zeros((1, 2, 2, 2), F32)],
     {"padding_mode": "wrap"},
     "padding_mode must be 'zeros', 'border' or 'reflection', got 'wrap'"),
    ("GridSample", LATEST, [np.zeros((1, 1, 2, 2), F32), np.zeros((1, 2, 2, 3), F32)], {},
     "grid [1, 2, 2, 3] (N, ..., 2) with as many axes"),
    ("AffineGrid", LATEST, [np.zeros((1, 2, 3), F32), np.array([1, 1, 2, 2, 2], I64)], {},
     "must be (N, 2, 3) with (N, C, H, W) or (N, 3, 4) with (N, C, D, H, W)"),
    ("CausalConvWithState", LATEST, [np.zeros((1, 2, 3), F32), np.zeros((2, 1, 2), F32)],
     {"activation": "relu"}, "activation must be 'silu', 'swish' or 'none', got 'relu'"),
    ("CausalConvWithState", LATEST, [np.zeros((1, 2, 3), F32), np.zeros((2, 1, 3), F32), None,
                                     np.zeros((1, 2, 1), F32)], {}, "past_state must have shape [1, 2, 2]"),
    ("LinearAttention", LATEST, [np.zeros((1, 1, 6), F32)] * 3, {"q_num_heads": 3, "kv_num_heads": 2},
     "q_num_heads (3) must be a positive multiple of kv_num_heads (2)"),
    ("LinearAttention", LATEST, [np.zeros((1, 1, 4), F32)] * 3, {"q_num_heads": 2, "kv_num_heads": 2},
     "update_rule 'gated_delta' needs the input 'decay'"),
    ("SoftmaxCrossEntropyLoss", LATEST, [np.zeros((2, 3), F32), np.zeros(2, I64), np.ones(2, F32)], {},
     "weight must hold 3 values, got shape [2]"),
]


def kernel_for(op: str, opset: int, inputs: list[np.ndarray | None], attributes: dict[str, Any]) -> Kernel:
    """Our kernel for a node, built from the dispatch table as a session builds it (without
    onnx's checker in front, which rejects some of these nodes already)."""
    versions = KERNELS[op]
    ctx = NodeContext(f"{op}_node", op, "", opset, attributes,
                      tuple(None if x is None else helper.np_dtype_to_tensor_dtype(x.dtype) for x in inputs),
                      (None,), len(inputs), 1)
    kernel = versions[max(v for v in versions if v <= opset)](ctx)
    kernel.bind(ThreadPool(1))
    return kernel


@pytest.mark.parametrize(("op", "opset", "inputs", "attributes", "message"), BAD,
                         ids=[f"{row[0]}-{i}" for i, row in enumerate(BAD)])
def test_bad_attributes_and_inputs_name_the_node_and_the_problem(
        op: str, opset: int, inputs: list[np.ndarray | None], attributes: dict[str, Any],
        message: str) -> None:
    with pytest.raises(KernelError) as caught:
        kernel_for(op, opset, inputs, attributes).run(*inputs)
    text = str(caught.value)
    assert text.startswith(f"node '{op}_node' ({op}): "), text
    assert message in text, text


def test_a_session_names_the_node_of_a_bad_attribute_at_construction() -> None:
    """Through a session, the kernel's check is what rejects a value onnx's checker lets pass."""
    inputs = [np.zeros(3, F32), np.zeros((1, 1), I64), np.zeros(1, F32)]
    expected = [np.zeros(3, F32)]
    with pytest.raises(KernelError, match=r"node 'ScatterND_node' \(ScatterND\): reduction must be"):
        RuntimeSession(model("ScatterND", inputs, expected, 16, reduction="max"))
