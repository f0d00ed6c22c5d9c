"""The tiles plan of Gemm and MatMul (``kernels/blas_tiles.py``): BLAS calls on tiles inside one
compiled parallel region, the bias added per tile, the runtime's fused activation after.

Values are compared with a float64 product (the bound of ``onnx_light.kernels.gemm``) over the
layouts the plan hands to BLAS without a copy (transposed views, row and column slices, broadcast
batches) and those it must copy (negative and zero strides inside a matrix); every test checks
that the plan it means was the one taken.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T

from onnx_light.kernels import blas_tiles, gemm
from onnx_light.kernels.base import NodeContext
from onnx_light.parallel import BLAS, ThreadPool

TILES = {gemm.MODE: "tiles", gemm.MINIMUM_FLOPS: 1, gemm.MINIMUM_ROWS: 1}
DTYPES = {T.FLOAT: np.float32, T.DOUBLE: np.float64}


@pytest.fixture(scope="module")
def pool():
    with ThreadPool(2) as two:
        yield two


@pytest.fixture
def regions(monkeypatch):
    """Counts the calls of the compiled region (the tiles plan taken, not a fallback)."""
    calls = []
    real = blas_tiles.region

    def counting():
        dispatcher = real()

        def call(*args):
            calls.append(args[-2:])  # tile rows and columns
            return dispatcher(*args)

        return call

    monkeypatch.setattr(blas_tiles, "region", counting)
    return calls


def _kernel(op, element_type, pool, values=TILES, **attributes):
    count = 3 if op == "Gemm" else 2
    ctx = NodeContext("node", op, "", 13, attributes, (element_type,) * count, (element_type,),
                      count, 1)
    kernel = gemm.KERNELS[op][13](ctx).bind(pool)
    kernel.configure(values)
    return kernel


def _assert_close(got, a, b, alpha=1.0, c=None, beta=1.0):
    """``got`` within ``2 (K + 2) u (|alpha| |A||B| + |beta| |C|)`` of the float64 product."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = alpha * np.matmul(a64, b64)
    magnitude = abs(alpha) * np.matmul(np.abs(a64), np.abs(b64))
    if c is not None:
        exact = exact + beta * c.astype(np.float64)
        magnitude = magnitude + abs(beta) * np.abs(c.astype(np.float64))
    u = np.finfo(got.dtype).eps / 2
    assert got.shape == exact.shape
    assert np.all(np.abs(got - exact) <= 2 * (a.shape[-1] + 2) * u * magnitude + 1e-30)


def _layouts(rng, dtype):
    """(name, A, B): operands in the layouts BLAS takes as they are, and in some it cannot."""
    big = rng.standard_normal((40, 50)).astype(dtype)
    yield "contiguous", rng.standard_normal((9, 7)).astype(dtype), rng.standard_normal((7, 5)).astype(dtype)
    yield "transposed views", big[:7, :9].T, big[10:15, :7].T
    yield "row and column slices", big[1:10, 3:10], big[::2][:7, 20:31]
    yield "negative strides", big[9:0:-1, :7], big[:7, ::-1][:, :6]
    yield "zero strides", np.broadcast_to(big[0, :7], (9, 7)), big[:7, :1].repeat(4, axis=1)
    yield "one row", big[3:4, :7], big[:7, :8]
    yield "one column", big[:9, :7], big[:7, 4:5]
    yield "batch x matrix", rng.standard_normal((3, 9, 7)).astype(dtype), big[:7, :5]
    yield ("broadcast batches", rng.standard_normal((2, 1, 9, 7)).astype(dtype),
           rng.standard_normal((4, 7, 5)).astype(dtype))
    yield "transposed batch", np.swapaxes(rng.standard_normal((3, 7, 9)).astype(dtype), 1, 2), \
        np.swapaxes(rng.standard_normal((3, 5, 7)).astype(dtype), 1, 2)


@pytest.mark.parametrize("element_type", list(DTYPES), ids=["float", "double"])
def test_matmul_tiles_layouts(element_type, pool, regions):
    rng = np.random.default_rng(1)
    kernel = _kernel("MatMul", element_type, pool)
    for name, a, b in _layouts(rng, DTYPES[element_type]):
        a_before, b_before = a.copy(), b.copy()
        calls = len(regions)
        (got,) = kernel.run(a, b)
        assert len(regions) == calls + 1, name
        assert got.dtype == DTYPES[element_type]
        _assert_close(got, a, b)
        assert not np.shares_memory(got, a) and not np.shares_memory(got, b), name
        np.testing.assert_array_equal(a, a_before)
        np.testing.assert_array_equal(b, b_before)


@pytest.mark.parametrize("element_type", [T.FLOAT16, T.BFLOAT16], ids=["float16", "bfloat16"])
def test_narrow_floats_take_tiles_in_float32(element_type, pool, regions):
    import ml_dtypes

    dtype = {T.FLOAT16: np.float16, T.BFLOAT16: ml_dtypes.bfloat16}[element_type]
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 9, 33)).astype(dtype)
    b = rng.standard_normal((33, 6)).astype(dtype)
    (got,) = _kernel("MatMul", element_type, pool).run(a, b)
    assert regions and got.dtype == dtype
    expected = (a.astype(np.float32) @ b.astype(np.float32)).astype(dtype)  # one final rounding
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("c_shape", [None, (), (5,), (1, 5), (9, 1), (9, 5)])
@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_tiles_add_the_bias_in_the_region(c_shape, trans, pool, regions):
    rng = np.random.default_rng(3)
    trans_a, trans_b = trans
    a = rng.standard_normal((7, 9) if trans_a else (9, 7)).astype(np.float32)
    b = rng.standard_normal((5, 7) if trans_b else (7, 5)).astype(np.float32)
    c = None if c_shape is None else rng.standard_normal(c_shape).astype(np.float32)
    kernel = _kernel("Gemm", T.FLOAT, pool, alpha=0.5, beta=-2.0, transA=trans_a, transB=trans_b)
    (got,) = kernel.run(a, b, c)
    assert regions
    a2, b2 = (a.T if trans_a else a), (b.T if trans_b else b)
    _assert_close(got, a2, b2, 0.5, None if c is None else np.broadcast_to(c, (9, 5)), -2.0)


def test_fused_activation_matches_the_unfused_result(pool, regions):
    """An epilogue given to the kernel (an in-place function, as the runtime's fusion makes
    them) runs on the product's output."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 16, 24)).astype(np.float32)
    b = rng.standard_normal((24, 40)).astype(np.float32)
    kernel = _kernel("MatMul", T.FLOAT, pool)
    relu = kernel.variant(epilogue=lambda y: np.maximum(y, 0, out=y))
    before = len(regions)
    (plain,) = kernel.run(a, b)
    (fused,) = relu.run(a, b)
    np.testing.assert_array_equal(fused, np.maximum(plain, 0))
    assert len(regions) == before + 2


def test_configuration_compiles_the_region(pool, regions):
    """A kernel configured for tiles on several threads runs its region once at configuration
    (the session's construction), so the first run does not compile."""
    kernel = _kernel("MatMul", T.DOUBLE, pool)
    assert kernel._region is not None and len(regions) == 1
    serial = _kernel("MatMul", T.DOUBLE, None)  # one thread: the plan is never tiles
    assert serial._region is None and len(regions) == 1


def test_integer_products_never_take_tiles(pool):
    kernel = _kernel("MatMul", T.INT64, pool, values={gemm.MINIMUM_FLOPS: 1})
    assert "tiles" not in gemm.gemm_schema("MatMul", T.INT64).parameter(gemm.MODE).choices
    a = np.arange(12, dtype=np.int64).reshape(3, 4) - 5
    assert kernel.plan(3, 4, 4) != "tiles"
    np.testing.assert_array_equal(kernel.run(a, a.T)[0], a @ a.T)


def test_without_a_callable_blas_tiles_fall_back_to_the_split(monkeypatch, pool):
    monkeypatch.setattr(blas_tiles, "gemm_function", lambda dtype: None)
    kernel = _kernel("MatMul", T.FLOAT, pool)
    assert kernel.plan(64, 64, 64) == "split_rows"
    a = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)
    _assert_close(kernel.run(a, a)[0], a, a)


def test_inside_a_pool_region_the_tiles_run_on_the_calling_thread(pool, regions, monkeypatch):
    kernel = _kernel("MatMul", T.FLOAT, pool)
    threads = []
    monkeypatch.setattr(blas_tiles, "use_threads", threads.append)
    a = np.random.default_rng(6).standard_normal((32, 32)).astype(np.float32)
    results = [None, None]

    def block(start, stop):
        for i in range(start, stop):
            results[i] = kernel.run(a, a)[0]

    pool.parallel_for(2, block)
    kernel.run(a, a)
    assert threads == [1, 1, 2]  # one thread in each block, both threads outside
    for got in results:
        np.testing.assert_array_equal(got, results[1])
        _assert_close(got, a, a)


def test_tile_counts_cut_the_long_side_first():
    assert blas_tiles.tile_counts(1, 64, 256, 2, 16) == (1, 2)
    assert blas_tiles.tile_counts(1, 256, 64, 4, 16) == (4, 1)
    assert blas_tiles.tile_counts(8, 32, 32, 2, 16) == (1, 1)  # batch items are tiles already
    assert blas_tiles.tile_counts(1, 20, 20, 4, 16) == (1, 1)  # no side below the minimum
    assert blas_tiles.tile_counts(1, 64, 64, 4, 16) == (2, 2)
    assert blas_tiles.tile_counts(3, 100, 50, 8, 16) == (3, 1)  # rows on a tie (50 x 50)


def test_blas_operand_layouts():
    x = np.zeros((6, 8), np.float32)
    assert blas_tiles.blas_operand(x, 1)[1:] == (0, 8, False)
    assert blas_tiles.blas_operand(x.T, 1)[1:] == (0, 8, True)
    assert blas_tiles.blas_operand(x[:, 2:5], 1)[1:] == (0, 8, False)
    kept, batch_stride, leading, transposed = blas_tiles.blas_operand(x[::-1], 1)
    assert kept.flags.c_contiguous and (batch_stride, leading, transposed) == (0, 8, False)
    stacked = np.zeros((3, 6, 8), np.float64)
    assert blas_tiles.blas_operand(stacked, 3)[1:] == (48, 8, False)
    with pytest.raises(ValueError, match="does not broadcast"):
        blas_tiles.blas_operand(stacked, 4)


def test_blas_gemm_is_checked_and_restores_blas_threads(pool):
    for dtype in (np.float32, np.float64):
        assert blas_tiles.gemm_function(np.dtype(dtype)) is not None
    assert blas_tiles.gemm_function(np.dtype(np.float16)) is None
    before = BLAS.get()
    a = np.ones((64, 64), np.float32)
    np.testing.assert_array_equal(_kernel("MatMul", T.FLOAT, pool).run(a, a)[0], a @ a)
    assert BLAS.get() == before


def test_the_blas_gemm_is_numpys_own_when_another_blas_is_loaded():
    """numba loads scipy's BLAS beside numpy's when scipy is installed: the gemm found is in
    the library numpy loaded (whose threads the runtime's BLAS limit governs)."""
    import os

    from threadpoolctl import threadpool_info

    home = os.path.dirname(os.path.realpath(np.__file__))
    assert blas_tiles._numpys(os.path.join(home + ".libs", "libopenblas.so"))
    assert not blas_tiles._numpys(os.path.join(home + "_other", "libopenblas.so"))
    numpys = [i for i in threadpool_info() if i["user_api"] == "blas" and blas_tiles._numpys(i["filepath"])]
    if numpys:  # a wheel's own OpenBLAS: its symbols are the ones found
        import ctypes

        handle = ctypes.CDLL(numpys[0]["filepath"])
        function = blas_tiles.gemm_function(np.dtype(np.float32))
        assert any(ctypes.cast(function, ctypes.c_void_p).value
                   == ctypes.cast(getattr(handle, name), ctypes.c_void_p).value
                   for name, _ in blas_tiles._symbol_names("s") if hasattr(handle, name))


@pytest.mark.parametrize("element_type", [T.INT32, T.INT64, T.UINT32, T.UINT64],
                         ids=["int32", "int64", "uint32", "uint64"])
def test_integer_plans_are_exact_on_strided_inputs(element_type, pool):
    dtype = {T.INT32: np.int32, T.INT64: np.int64, T.UINT32: np.uint32, T.UINT64: np.uint64}[element_type]
    rng = np.random.default_rng(7)
    big = rng.integers(0, 7, size=(3, 40, 40)).astype(dtype)
    a, b = big[:, 1:20:2, ::3].transpose(0, 2, 1), big[0, 5:15, 3:20:2]  # (3, 14, 10) x (10, 9)
    expected = np.matmul(np.ascontiguousarray(a).astype(np.int64),
                         np.ascontiguousarray(b).astype(np.int64)).astype(dtype)
    for mode in gemm.INTEGER_MODES:
        kernel = _kernel("MatMul", element_type, pool,
                         values={gemm.MODE: mode, gemm.MINIMUM_FLOPS: 1, gemm.MINIMUM_ROWS: 1})
        (got,) = kernel.run(a, b)
        assert got.dtype == dtype and not np.shares_memory(got, big)
        np.testing.assert_array_equal(got, expected)


def test_a_session_with_tiles_matches_onnxruntime(regions):
    """A broadcasting batched MatMul and a Gemm with transB and bias, run by a session whose
    registry publishes the tiles plan, against onnxruntime with the same thread count."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    from onnx_light import kernels
    from onnx_light.runtime.session import RuntimeSession
    from onnx_light.tuning.api import set_kernel_tuning_parameters
    from onnx_light.tuning.registry import KernelTuningRegistry

    rng = np.random.default_rng(8)
    w = rng.standard_normal((24, 16)).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["X", "Y"], ["P"]),
             helper.make_node("Reshape", ["P", "shape"], ["Q"]),
             helper.make_node("Gemm", ["Q", "W", "C"], ["Z"], transB=1, alpha=0.5)]
    graph = helper.make_graph(
        nodes, "tiles",
        [helper.make_tensor_value_info("X", T.FLOAT, [2, 1, 8, 12]),
         helper.make_tensor_value_info("Y", T.FLOAT, [3, 12, 16])],
        [helper.make_tensor_value_info("P", T.FLOAT, [2, 3, 8, 16]),
         helper.make_tensor_value_info("Z", T.FLOAT, [48, 24])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "C"),
         numpy_helper.from_array(np.array([48, 16], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    registry = KernelTuningRegistry()
    kernels.register(registry)
    for op in ("Gemm", "MatMul"):
        set_kernel_tuning_parameters(op, T.FLOAT, TILES, num_threads=2, persist=False,
                                     registry=registry)
    feeds = {"X": rng.standard_normal((2, 1, 8, 12)).astype(np.float32),
             "Y": rng.standard_normal((3, 12, 16)).astype(np.float32)}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    peer = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    session = RuntimeSession(model, num_threads=2, registry=registry)
    before = len(regions)
    got = session.run(None, feeds)
    assert len(regions) == before + 2  # both products took the tiles plan
    for mine, theirs in zip(got, peer.run(None, feeds), strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-5)
