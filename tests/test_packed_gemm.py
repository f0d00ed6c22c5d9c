"""Products with packed constant weights (kernels/packed_gemm.py) against float64 and the
unpacked BLAS path, and MatMul / Gemm nodes that pack their weights in a session."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels import gemm, packed_gemm
from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.compiled_elementwise import numba_threads
from onnx_light.kernels.gemm import GemmKernel, MatMulKernel
from onnx_light.runtime import RuntimeSession

packed_only = pytest.mark.skipif(not packed_gemm.available(),
                                 reason="packed products need AVX2 and FMA or AVX-512F")

F = TensorProto.FLOAT
U = float(np.finfo(np.float32).eps) / 2


def _bound(a: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """gemm.py's error bound of a float32 product of length K, plus the bias's rounding."""
    k = a.shape[-1]
    size = np.abs(a.astype(np.float64)) @ np.abs(w.astype(np.float64))
    if bias is not None:
        size = size + np.abs(bias.astype(np.float64))
    return 2 * (k + 2) * U * size + np.finfo(np.float32).tiny


@packed_only
@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3), max_size=2), st.integers(0, 20), st.integers(0, 600),
       st.integers(1, 140), st.booleans(), st.integers(0, 2**31 - 1))
def test_packed_products_are_within_the_blas_bound(batch, m, k, n, with_bias, seed) -> None:
    """Any A (..., M, K) times packed W (K, N), with or without a bias, edge blocks of rows
    and columns and sums over several passes of KC steps included: within gemm.py's bound of
    the float64 product, shaped as numpy's."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((*batch, m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    y = packed_gemm.PackedWeights(w, bias).multiply(a)
    exact = a.astype(np.float64) @ w.astype(np.float64) + (0 if bias is None else bias)
    assert y.dtype == np.float32 and y.shape == exact.shape
    assert np.all(np.abs(y - exact) <= _bound(a, w, bias))
    out = np.full(exact.shape, np.nan, np.float32)
    packed_gemm.PackedWeights(w, bias).multiply(a, out)
    assert out.tobytes() == y.tobytes()


@packed_only
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 30), st.integers(0, 40), st.integers(0, 300), st.booleans(), st.integers(0, 2**31 - 1))
def test_pack_rows_is_blocks_of_mr_rows_step_by_step(first, rows, k, strided, seed) -> None:
    """pack_rows's layout, bit for bit: block b's step p holds rows first + b * MR + r (r < MR)
    at column p, +0 past ``last``; odd depths, partial last blocks and strided A included."""
    mr = packed_gemm.geometry().rows
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((first + rows + 3, 2 * k if strided else k)).astype(np.float32)
    if strided:
        a = a[:, ::2]
    last = first + rows
    blocks = -(-rows // mr)
    padded = np.zeros((blocks * mr, k), np.float32)
    padded[:rows] = a[first:last]
    expected = padded.reshape(blocks, mr, k).transpose(0, 2, 1)
    packed = packed_gemm.pack_rows(a, first, last)
    assert packed.shape == (blocks, k, mr) and packed.tobytes() == np.ascontiguousarray(expected).tobytes()


@packed_only
def test_passes_over_the_sum_give_one_pass_bits(monkeypatch) -> None:
    """Summing in passes of KC steps (partial sums stored and reloaded in float32) gives the
    bits of one pass: the same fused multiply-adds in the same order."""
    rng = np.random.default_rng(8)
    k = packed_gemm.KC.value + 44
    a = rng.standard_normal((13, k)).astype(np.float32)
    w = rng.standard_normal((k, 100)).astype(np.float32)
    bias = rng.standard_normal(100).astype(np.float32)
    passes = packed_gemm.PackedWeights(w, bias).multiply(a)
    reference = np.empty_like(passes)
    panels = packed_gemm.PackedWeights(w, bias)
    total = np.zeros((13, 100), np.float32)
    for p in range(k):  # one pass: the float32 fused multiply-adds in order of the sum
        total = (a[:, p:p + 1].astype(np.float64) * w[p].astype(np.float64) + total).astype(np.float32)
    reference[...] = total + bias
    assert panels.panels.shape[1] == k > packed_gemm.KC.value
    assert passes.tobytes() == reference.tobytes()


@packed_only
def test_special_values_propagate_like_blas() -> None:
    """NaN and infinities reach the elements IEEE arithmetic says; products of zeros and
    negative zeros sum to +0, as numpy's BLAS gives them."""
    a = np.ones((7, 5), np.float32)
    a[1, 2] = np.nan
    a[3, 0] = np.inf
    a[4] = -0.0
    w = np.ones((5, 70), np.float32)
    w[:, 3] = 0.0
    y = packed_gemm.PackedWeights(w).multiply(a)
    with np.errstate(invalid="ignore"):
        expected = a @ w
    assert np.array_equal(np.isnan(y), np.isnan(expected))
    assert np.array_equal(np.isposinf(y), np.isposinf(expected))
    zeros = expected == 0
    assert np.array_equal(y == 0, zeros) and not np.signbit(y[zeros]).any()


def _session(node: helper.NodeProto, initializers: list[np.ndarray], names: list[str],
             a_shape: tuple[int, ...], out_shape: tuple[int, ...], threads: int) -> RuntimeSession:
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("a", F, list(a_shape))],
        [helper.make_tensor_value_info("y", F, list(out_shape))],
        [numpy_helper.from_array(v, name) for v, name in zip(initializers, names, strict=True)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return RuntimeSession(model.SerializeToString(), num_threads=threads)


@packed_only
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("trans_b", "c_shape"), [(0, None), (1, (70,)), (0, (1, 70))])
def test_gemm_of_constant_weights_packs_them(trans_b: int, c_shape, threads: int) -> None:
    """A Gemm of constant B (and C of one value per column) packs B at construction and
    gives the unpacked kernel's values within the bound, in both the bound plan and a run
    with a node hook."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((33, 40)).astype(np.float32)
    w = rng.standard_normal((40, 70)).astype(np.float32)
    b = np.ascontiguousarray(w.T) if trans_b else w
    initializers, names = [b], ["b"]
    if c_shape is not None:
        initializers.append(rng.standard_normal(c_shape).astype(np.float32))
        names.append("c")
    node = helper.make_node("Gemm", ["a", *names], ["y"], transB=trans_b)
    session = _session(node, initializers, names, a.shape, (33, 70), threads)
    assert any(isinstance(k, GemmKernel) and k._packed is not None for k, _, _ in session._steps)
    bias = None if c_shape is None else initializers[1].reshape(-1)
    expected = a @ w + (0 if bias is None else bias)
    for y in (session.run(None, {"a": a})[0], session.run(None, {"a": a}, node_hook=lambda *_: None)[0]):
        assert np.all(np.abs(y - expected) <= _bound(a, w, bias))


@packed_only
def test_matmul_with_bias_packs_weights_and_bias() -> None:
    """MatMul(A, W) + b with constant W and b: one packed step, the fused graph's values
    within the bound of float64; a Gemm with a C given at run time is not packed."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 9, 64)).astype(np.float32)
    w = rng.standard_normal((64, 130)).astype(np.float32)
    bias = rng.standard_normal(130).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "bias"], ["y"])],
        "g", [helper.make_tensor_value_info("a", F, [2, 9, 64])],
        [helper.make_tensor_value_info("y", F, [2, 9, 130])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")])
    session = RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
                             .SerializeToString())
    assert [type(k) for k, _, _ in session._steps] == [MatMulKernel]
    assert session._steps[0][0]._packed is not None
    y = session.run(None, {"a": a})[0]
    exact = a.astype(np.float64) @ w + bias
    assert np.all(np.abs(y - exact) <= _bound(a, w, bias))
    gemm = helper.make_graph(
        [helper.make_node("Gemm", ["a", "w", "c"], ["y"])], "g",
        [helper.make_tensor_value_info("a", F, [9, 64]), helper.make_tensor_value_info("c", F, [130])],
        [helper.make_tensor_value_info("y", F, [9, 130])], [numpy_helper.from_array(w, "w")])
    session = RuntimeSession(helper.make_model(gemm, opset_imports=[helper.make_opsetid("", 13)])
                             .SerializeToString())
    assert session._steps[0][0]._packed is None
    y = session.run(None, {"a": a[0], "c": bias})[0]
    assert np.all(np.abs(y - (a[0].astype(np.float64) @ w + bias)) <= _bound(a[0], w, bias))


@packed_only
@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_feeding_packed_weights_listed_as_an_input_multiplies_the_fed_ones(op: str) -> None:
    """Weights that are an initializer and a graph input are packed for the usual run; a run
    that feeds other weights multiplies those (the unfolded plan), the next run without them
    the packed ones again."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((8, 64)).astype(np.float32)
    w, fed = (rng.standard_normal((64, 48)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node(op, ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", F, [8, 64]), helper.make_tensor_value_info("w", F, [64, 48])],
        [helper.make_tensor_value_info("y", F, [8, 48])], [numpy_helper.from_array(w, "w")])
    session = RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
                             .SerializeToString())
    assert session._steps[0][0]._packed is not None
    for weights, feeds in ((w, {"a": a}), (fed, {"a": a, "w": fed}), (w, {"a": a})):
        y = session.run(None, feeds)[0]
        assert np.all(np.abs(y - a.astype(np.float64) @ weights) <= _bound(a, weights, None))


def _held_by(data: bytes) -> tuple[RuntimeSession, int]:
    """A session of the serialized model and the bytes of Python memory it holds."""
    gc.collect()
    tracemalloc.start()
    try:
        session = RuntimeSession(data)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return session, held


@packed_only
def test_constant_weights_are_kept_once_in_panels() -> None:
    """The session keeps packed weights in their panels only: its memory grows by about the
    weights' size, not twice it (the slot holds a stand-in of their shape that takes none)."""
    rng = np.random.default_rng(9)
    w = rng.standard_normal((1024, 2048)).astype(np.float32)  # 8 MiB
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", F, [4, 1024])],
        [helper.make_tensor_value_info("y", F, [4, 2048])], [numpy_helper.from_array(w, "w")])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    _held_by(data)  # imports, compiled kernels, caches: what a second session does not add
    session, held = _held_by(data)
    assert w.nbytes <= held < 1.5 * w.nbytes
    (slot,) = session._released
    assert session._values[slot].shape == w.shape and session._values[slot].strides == (0, 0)
    a = rng.standard_normal((4, 1024)).astype(np.float32)
    assert np.all(np.abs(session.run(None, {"a": a})[0] - a.astype(np.float64) @ w) <= _bound(a, w, None))


@packed_only
@pytest.mark.parametrize("trans_b", [0, 1])
def test_a_run_of_the_unfolded_plan_rebuilds_released_weights(trans_b: int) -> None:
    """Gemm of released weights B and an overridable C (packed as the bias): a run that
    feeds C takes the unfolded plan, whose Gemm multiplies B rebuilt from the panels, bit
    for bit the original (transposed back for ``transB``)."""
    rng = np.random.default_rng(10)
    a = rng.standard_normal((6, 40)).astype(np.float32)
    w = rng.standard_normal((40, 70)).astype(np.float32)
    b = np.ascontiguousarray(w.T) if trans_b else w
    c, fed = (rng.standard_normal(70).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=trans_b)], "g",
        [helper.make_tensor_value_info("a", F, [6, 40]), helper.make_tensor_value_info("c", F, [70])],
        [helper.make_tensor_value_info("y", F, [6, 70])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(c, "c")])
    session = RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
                             .SerializeToString())
    (slot,) = session._released
    for bias, feeds in ((c, {"a": a}), (fed, {"a": a, "c": fed}), (c, {"a": a})):
        y = session.run(None, feeds)[0]
        assert np.all(np.abs(y - (a.astype(np.float64) @ w + bias)) <= _bound(a, w, bias))
    assert session._constants[slot].tobytes() == b.tobytes()


def _matmul_session(w: np.ndarray, threads: int) -> RuntimeSession:
    k, n = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", F, ["m", k])],
        [helper.make_tensor_value_info("y", F, ["m", n])], [numpy_helper.from_array(w, "w")])
    return RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
                          .SerializeToString(), num_threads=threads)


@packed_only
def test_blocks_of_rows_and_threads_give_the_same_bits() -> None:
    """The product blocked over rows of A (blocks that are not whole micro-kernel blocks
    included) and its panels shared out among two numba threads give the bits of one block:
    each element's sum runs in the same order."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((3, 17, 300)).astype(np.float32)
    w = rng.standard_normal((300, 130)).astype(np.float32)
    packed = packed_gemm.PackedWeights(w, rng.standard_normal(130).astype(np.float32))
    packed.block = 1 << 20
    whole = packed.multiply(a)
    assert numba_threads(2)
    mr = packed_gemm.geometry().rows
    for block in (mr, 4 * mr, 7):
        packed.block = block
        assert packed.multiply(a).tobytes() == whole.tobytes()
        assert packed.multiply(a, threads=2).tobytes() == whole.tobytes()


@packed_only
@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 600), n=st.integers(1, 200), group=st.integers(1, 5),
       with_bias=st.booleans())
def test_panels_shared_among_threads_give_the_serial_bits(m: int, k: int, n: int, group: int,
                                                          with_bias: bool) -> None:
    """Whatever the shape (edge panels and blocks of rows, sums of more than one pass) and the
    panels per task, the threads' product is the one-thread product bit for bit."""
    rng = np.random.default_rng(m * 1000003 + k * 1009 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed = packed_gemm.PackedWeights(w, rng.standard_normal(n).astype(np.float32) if with_bias else None)
    whole = packed.multiply(a)
    assert numba_threads(2)
    out = np.full((m, n), np.nan, np.float32)
    packed_gemm.packed_panels_parallel.dispatcher(a, packed.panels, packed.layout, packed.bias,
                                                  packed.with_bias, out, 2 * packed.rows, n, 2,
                                                  group, (100000, 100000))
    assert out.tobytes() == whole.tobytes()


@packed_only
def test_one_or_two_rows_give_the_bits_of_a_full_block() -> None:
    """A product of one or two rows (the micro-kernel's block of 2 rows) gives the bits those
    rows get in a product of many rows (blocks of ``MR`` rows)."""
    rng = np.random.default_rng(13)
    a = rng.standard_normal((9, 700)).astype(np.float32)
    w = rng.standard_normal((700, 7 * packed_gemm.geometry().columns + 5)).astype(np.float32)
    packed = packed_gemm.PackedWeights(w, rng.standard_normal(w.shape[1]).astype(np.float32))
    whole = packed.multiply(a)
    for rows in (slice(0, 1), slice(3, 5), slice(8, 9)):
        assert packed.multiply(a[rows]).tobytes() == whole[rows].tobytes()


@packed_only
def test_two_threads_share_the_packed_product(monkeypatch) -> None:
    """Above ``parallel.minimum_flops`` a two-thread session shares the packed product's
    panels among two threads (the weights stay packed) and gives the one-thread session's
    bits, A of more than ``BLOCK_A_BYTES`` included; below it the product runs on one."""
    rng = np.random.default_rng(9)
    w = rng.standard_normal((384, 200)).astype(np.float32)
    a = rng.standard_normal((500, 384)).astype(np.float32)
    assert a.nbytes > packed_gemm.BLOCK_A_BYTES and a.size * w.shape[1] >= 1 << 25
    serial, split = _matmul_session(w, 1), _matmul_session(w, 2)
    assert split._steps[0][0]._packed is not None
    calls = []
    original = packed_gemm.PackedWeights.multiply

    def recorded(self, a, out=None, threads=1):
        calls.append(threads)
        return original(self, a, out, threads)

    monkeypatch.setattr(packed_gemm.PackedWeights, "multiply", recorded)
    y = split.run(None, {"a": a})[0]
    assert calls == [2]
    assert y.tobytes() == serial.run(None, {"a": a})[0].tobytes()
    assert np.all(np.abs(y - a.astype(np.float64) @ w) <= _bound(a, w, None))
    split.run(None, {"a": a[:10]})
    assert calls[-1] == 1


@packed_only
@pytest.mark.parametrize("op_type", ["MatMul", "Gemm"])
def test_weights_product_blas_leaves_constant_weights_to_blas(op_type: str) -> None:
    """``weights.product = "blas"`` keeps constant weights as they are (no packed variant of the
    kernel); ``"packed"``, the portable value, packs them."""
    w = np.ones((8, 20), np.float32)
    for product, packs in (("blas", False), ("packed", True)):
        ctx = NodeContext("node", op_type, "", 13, {}, (F, F), (F,), 2, 1)
        kernel = gemm.KERNELS[op_type][13](ctx)
        kernel.bind(None).configure({gemm.PRODUCT: product})
        specialized = kernel.specialize([None, w])
        assert (specialized is not None and specialized._packed is not None) is packs
    assert gemm.gemm_schema("MatMul", F).parameter(gemm.PRODUCT).default == "packed"
    assert gemm.PRODUCT not in gemm.gemm_schema("MatMul", TensorProto.INT64).names


@pytest.mark.parametrize("threads", [1, 2])
def test_without_the_packed_kernel_blas_multiplies_constant_weights(monkeypatch, threads: int) -> None:
    """Where the packed kernel cannot run (``available()`` false), MatMul and Gemm of constant
    weights keep them unpacked and BLAS computes the product within the bound."""
    monkeypatch.setattr(packed_gemm, "available", lambda: False)
    rng = np.random.default_rng(12)
    w = rng.standard_normal((256, 200)).astype(np.float32)
    a = rng.standard_normal((700, 256)).astype(np.float32)
    session = _matmul_session(w, threads)
    assert session._steps[0][0]._packed is None
    y = session.run(None, {"a": a})[0]
    assert np.all(np.abs(y - a.astype(np.float64) @ w) <= _bound(a, w, None))
    c = rng.standard_normal(200).astype(np.float32)
    gemm = _session(helper.make_node("Gemm", ["a", "b", "c"], ["y"]), [w, c], ["b", "c"], a.shape,
                    (700, 200), threads)
    assert gemm._steps[0][0]._packed is None
    y = gemm.run(None, {"a": a})[0]
    assert np.all(np.abs(y - (a.astype(np.float64) @ w + c)) <= _bound(a, w, c))


@pytest.mark.parametrize("shape", [(1, 96, 112, 112), (3, 5), (0, 4), ()])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_aligned_empty_starts_on_a_cache_line(shape, dtype):
    """``aligned_empty``: the shape and type asked for, C-contiguous and writable, its data on
    a 64-byte boundary (numpy's own large arrays start 16 bytes past one) unless it is empty."""
    array = packed_gemm.aligned_empty(shape, dtype)
    assert array.shape == shape and array.dtype == dtype
    assert array.flags.c_contiguous and array.flags.writeable
    assert array.size == 0 or array.ctypes.data % 64 == 0
    array[...] = 1
    assert array.sum() == array.size


@pytest.mark.parametrize(("features", "expected"), [
    ({"avx2", "fma", "avx512f"}, packed_gemm.Geometry(lanes=16, vectors=4, rows=6)),
    ({"avx2", "fma"}, packed_gemm.Geometry(lanes=8, vectors=2, rows=6)),
    ({"avx2"}, None), (set(), None)])
def test_the_block_follows_the_vector_width(monkeypatch, features, expected) -> None:
    """The micro-kernel's block is the first of GEOMETRIES whose features the processor has;
    without AVX2 and FMA or AVX-512F there is none and the products stay with BLAS."""
    monkeypatch.setattr(packed_gemm, "target_flags", lambda: frozenset(features))
    packed_gemm.geometry.cache_clear()
    try:
        assert packed_gemm.geometry() == expected
        assert packed_gemm.available() is (expected is not None)
    finally:
        packed_gemm.geometry.cache_clear()
    for shape in (shape for _, shape in packed_gemm.GEOMETRIES):
        accumulators = shape.rows * shape.vectors
        assert accumulators + shape.vectors + 1 <= (32 if shape.lanes == 16 else 16)
        assert shape.heights[-1] == shape.rows and shape.heights[0] == 2


_OTHER_BLOCK = """
import sys
import numpy as np
from onnx_light.kernels import packed_gemm
lanes, vectors, rows = map(int, sys.argv[1:])
packed_gemm.GEOMETRIES = ((frozenset(), packed_gemm.Geometry(lanes, vectors, rows)),)
rng = np.random.default_rng(21)
for m, k, n in ((1, 7, 5), (13, 300, 100), (40, 600, 150)):
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    sys.stdout.write(packed_gemm.PackedWeights(w, bias).multiply(a).tobytes().hex() + "\\n")
"""


@packed_only
def test_the_other_width_gives_the_same_bits(tmp_path: Path) -> None:
    """The block of the other vector width (AVX-512's 6 x 64 on an AVX2 machine, where LLVM
    splits its 16-lane vectors in two; AVX2's 6 x 16 on an AVX-512 one), run in a process of its
    own with a compile cache of its own, gives this process's bits: edge rows and columns, a
    bias and several passes of the sum included."""
    shapes = [shape for _, shape in packed_gemm.GEOMETRIES]
    other = next(shape for shape in shapes if shape != packed_gemm.geometry())
    outputs = []
    for shape in (other, packed_gemm.geometry()):
        env = {**os.environ, "ONNX_LIGHT_NUMBA_CACHE": str(tmp_path / str(shape.lanes)),
               "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        env.pop("NUMBA_CACHE_DIR", None)
        done = subprocess.run([sys.executable, "-c", _OTHER_BLOCK, str(shape.lanes), str(shape.vectors),
                               str(shape.rows)], env=env, capture_output=True, text=True, check=False,
                              timeout=600)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.split())
    assert len(outputs[0]) == 3 and outputs[0] == outputs[1]


def _reference_panels(w: np.ndarray, nr: int) -> np.ndarray:
    """W (K, N) in panels (P, K, NR), zeros past N, one panel at a time."""
    k, n = w.shape
    panels = np.zeros((-(-n // nr), k, nr), np.float32)
    for panel in range(panels.shape[0]):
        part = w[:, panel * nr:(panel + 1) * nr]
        panels[panel, :, :part.shape[1]] = part
    return panels


def _in_layout(w: np.ndarray, layout: str) -> np.ndarray:
    """W's values as a C-contiguous matrix, the transpose of one, or a strided view."""
    if layout == "transposed":
        return np.ascontiguousarray(w.T).T
    if layout == "strided":
        view = np.zeros((2 * w.shape[0], 3 * w.shape[1]), np.float32)[::2, ::3]
        view[...] = w
        return view
    return w.copy()


@packed_only
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 70), st.integers(0, 90), st.sampled_from(["plain", "transposed", "strided"]),
       st.integers(0, 2**31 - 1))
def test_weights_pack_from_their_own_layout(k, n, layout, seed) -> None:
    """W (K, N) given as a C-contiguous matrix, as the transpose of a C-contiguous B (Gemm's
    transB) or as a strided view: the panels are the ones packed panel by panel, and
    ``weights()`` gives W back bit for bit (random bit patterns: NaN payloads and negative
    zeros included); the products are those of the contiguous W."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, (k, n), dtype=np.uint64).astype(np.uint32).view(np.float32)
    w = _in_layout(bits, layout)
    w.flags.writeable = False  # as folded constants come
    packed = packed_gemm.PackedWeights(w)
    nr = packed_gemm.geometry().columns
    assert packed.panels.tobytes() == _reference_panels(bits, nr).tobytes()
    assert packed.weights().tobytes() == bits.tobytes()
    finite = rng.standard_normal((k, n)).astype(np.float32)
    view = _in_layout(finite, layout)
    a = rng.standard_normal((5, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    expected = packed_gemm.PackedWeights(np.ascontiguousarray(finite), bias).multiply(a)
    assert packed_gemm.PackedWeights(view, bias).multiply(a).tobytes() == expected.tobytes()
