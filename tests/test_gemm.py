"""Gemm and MatMul kernels: ONNX semantics against the reference, every plan against serial, schemas.

Tolerances follow the bound stated in ``onnx_light.kernels.gemm``: two results that sum the
same K products in different orders differ by at most ``2 (K + 2) u (|alpha| |A||B| + |beta| |C|)``,
``u`` the unit roundoff of the accumulation type, plus one unit in the last place of the output
type after a final cast. Integers must match exactly.
"""

from __future__ import annotations

import itertools
import threading

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from threadpoolctl import threadpool_limits

from onnx_light import parallel
from onnx_light.kernels import gemm
from onnx_light.kernels import register as register_library
from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.parallel import ThreadPool
from onnx_light.runtime.session import RuntimeSession
from onnx_light.tuning.keys import element_type_name
from onnx_light.tuning.registry import KernelTuningRegistry
from onnx_light.tuning.schema import TuningValidationError

T = TensorProto
FLOATS = (T.FLOAT, T.DOUBLE, T.FLOAT16, T.BFLOAT16)
INTEGERS = (T.INT32, T.INT64, T.UINT32, T.UINT64)
ALL_TYPES = FLOATS + INTEGERS
DTYPES = {T.FLOAT: np.float32, T.DOUBLE: np.float64, T.FLOAT16: np.float16,
          T.BFLOAT16: ml_dtypes.bfloat16, T.INT32: np.int32, T.INT64: np.int64,
          T.UINT32: np.uint32, T.UINT64: np.uint64}
TYPE_IDS = {t: helper.tensor_dtype_to_string(t).replace("TensorProto.", "").lower() for t in ALL_TYPES}


@pytest.fixture(scope="module")
def pools():
    with ThreadPool(2) as two, ThreadPool(3) as three:
        yield {2: two, 3: three}


def _random(shape, element_type, rng):
    dtype = DTYPES[element_type]
    if element_type in INTEGERS:
        low = 0 if np.dtype(dtype).kind == "u" else -5
        return rng.integers(low, 6, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(dtype)


def _unit_roundoff(dtype) -> float:
    return float(ml_dtypes.finfo(dtype).eps) / 2


def _check(got, expected, a, b, *, alpha=1.0, beta=0.0, c=None, accumulate=None):
    """Assert ``got`` matches ``expected`` within the module's stated bound (exact for integers)."""
    got = np.asarray(got)
    expected = np.asarray(expected)
    assert got.shape == expected.shape
    if got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, expected)
        return
    out_dtype = got.dtype
    accumulate = out_dtype if accumulate is None else accumulate
    u = _unit_roundoff(accumulate)
    k = a.shape[-1]
    magnitude = abs(alpha) * np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    if c is not None:
        magnitude = magnitude + abs(beta) * np.abs(c.astype(np.float64))
    exact = expected.astype(np.float64)
    bound = (2 * (k + 2) * u * magnitude + 2 * _unit_roundoff(out_dtype) * np.abs(exact)
             + float(ml_dtypes.finfo(out_dtype).tiny))
    error = np.abs(got.astype(np.float64) - exact)
    assert np.all(error <= bound), f"max error {error.max()} above bound {bound.min()}"


def _context(op_type, element_type, opset=13, num_inputs=2, **attributes):
    return NodeContext("node", op_type, "", opset, attributes, (element_type,) * num_inputs,
                       (element_type,), num_inputs, 1)


def _kernel(op_type, element_type, values=None, pool=None, opset=13, num_inputs=2, **attributes):
    ctx = _context(op_type, element_type, opset, num_inputs, **attributes)
    kernel = gemm.KERNELS[op_type][max(v for v in gemm.KERNELS[op_type] if v <= opset)](ctx)
    kernel.bind(pool).configure(values)
    return kernel


def _forced(mode, minimum_rows=1, minimum_flops=1):
    return {gemm.MINIMUM_FLOPS: minimum_flops, gemm.MODE: mode, gemm.MINIMUM_ROWS: minimum_rows}


SERIAL = {gemm.MINIMUM_FLOPS: 1 << 62, gemm.MODE: "split", gemm.MINIMUM_ROWS: 1}


def _reference(op_type, inputs, element_type, opset=13, **attributes):
    names = [name if x is not None else "" for name, x in zip("ABC", inputs, strict=False)]
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op_type, names, ["Y"], **attributes)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, element_type, None) for n in names if n],
        [helper.make_tensor_value_info("Y", element_type, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: x for n, x in zip("ABC", inputs, strict=False) if x is not None}
    return ReferenceEvaluator(model).run(None, feeds)[0]


# --- Gemm against the ONNX reference ------------------------------------------------------------

C_SHAPES = {"absent": None, "scalar": (), "one": (1,), "row": (4,), "row2d": (1, 4), "column": (3, 1),
            "full": (3, 4)}


@pytest.mark.parametrize("c_kind", list(C_SHAPES))
@pytest.mark.parametrize("element_type", ALL_TYPES, ids=TYPE_IDS.get)
def test_gemm_matches_reference(element_type, c_kind):
    rng = np.random.default_rng(element_type * 31 + len(c_kind))
    m, k, n = 3, 5, 4
    c_shape = C_SHAPES[c_kind]
    alphas = (1.0, 0.5) if element_type not in INTEGERS else (1.0, 2.0, 0.5)
    for alpha, beta, trans_a, trans_b in itertools.product(alphas, (1.0, 0.0, 2.5), (0, 1), (0, 1)):
        a = _random((k, m) if trans_a else (m, k), element_type, rng)
        b = _random((n, k) if trans_b else (k, n), element_type, rng)
        c = None if c_shape is None else _random(c_shape, element_type, rng)
        attributes = {"alpha": alpha, "beta": beta, "transA": trans_a, "transB": trans_b}
        expected = _reference("Gemm", [a, b, c], element_type, **attributes)
        kernel = _kernel("Gemm", element_type, num_inputs=2 if c is None else 3, **attributes)
        (got,) = kernel.run(a, b, c)
        assert got.dtype == a.dtype
        _check(got, expected, a.T if trans_a else a, b.T if trans_b else b, alpha=alpha, beta=beta,
               c=None if c is None or beta == 0 else np.broadcast_to(c, (m, n)))


def test_gemm_reads_the_float32_attribute_like_the_reference():
    a = np.ones((2, 2), np.float64)
    expected = _reference("Gemm", [a, a], T.DOUBLE, alpha=0.1)
    (got,) = _kernel("Gemm", T.DOUBLE, alpha=float(np.float32(0.1))).run(a, a)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("opset", [7, 9, 11, 13])
def test_gemm_versions(opset):
    rng = np.random.default_rng(opset)
    a, b, c = (_random(s, T.FLOAT, rng) for s in ((3, 5), (5, 4), (4,)))
    expected = _reference("Gemm", [a, b, c], T.FLOAT, opset=opset, alpha=0.5)
    (got,) = _kernel("Gemm", T.FLOAT, opset=opset, num_inputs=3, alpha=0.5).run(a, b, c)
    _check(got, expected, a, b, alpha=0.5, beta=1.0, c=np.broadcast_to(c, (3, 4)))
    if opset < 11:  # the declaration's rule, checked when the kernel is built
        with pytest.raises(KernelError, match=r"input C is required before opset 11"):
            _kernel("Gemm", T.FLOAT, opset=opset, num_inputs=2)
    else:
        _check(_kernel("Gemm", T.FLOAT, opset=opset, num_inputs=2).run(a, b)[0], a @ b, a, b)


@pytest.mark.parametrize(("op_type", "opset", "element_type"), [
    ("Gemm", 7, T.INT32), ("Gemm", 11, T.BFLOAT16), ("MatMul", 1, T.INT64), ("MatMul", 9, T.BFLOAT16),
    ("Gemm", 6, T.FLOAT),
])
def test_element_type_not_allowed_at_opset(op_type, opset, element_type):
    cls = gemm.GemmKernel if op_type == "Gemm" else gemm.MatMulKernel
    expected = (f"{op_type} is implemented from opset 7 on" if opset < min(gemm.KERNELS[op_type]) else
                f"{op_type}-{opset} \\(opset {opset}\\) does not take element type "
                f"{element_type_name(element_type)}")
    with pytest.raises(KernelError, match=expected):
        cls(_context(op_type, element_type, opset))


def test_gemm_errors():
    kernel = _kernel("Gemm", T.FLOAT)
    a = np.ones((3, 5), np.float32)
    with pytest.raises(KernelError, match="2-D"):
        kernel.run(np.ones((1, 3, 5), np.float32), np.ones((5, 4), np.float32))
    with pytest.raises(KernelError, match="inner dimensions"):
        kernel.run(a, np.ones((4, 4), np.float32))
    with pytest.raises(KernelError, match="does not broadcast"):
        kernel.run(a, np.ones((5, 4), np.float32), np.ones((3,), np.float32))
    with pytest.raises(KernelError, match="same type"):
        kernel.run(a, np.ones((5, 4), np.float64))
    with pytest.raises(KernelError, match="node 'node' \\(Gemm\\)"):
        kernel.run(a)


def test_gemm_beta_zero_ignores_c_like_the_reference():
    a = np.ones((2, 3), np.float32)
    c = np.full((2, 2), np.nan, np.float32)
    (got,) = _kernel("Gemm", T.FLOAT, beta=0.0, num_inputs=3).run(a, a.T.copy(), c)
    np.testing.assert_array_equal(got, np.full((2, 2), 3.0, np.float32))


# --- MatMul against the ONNX reference ----------------------------------------------------------

MATMUL_SHAPES = [
    ((5,), (5,)), ((5,), (5, 4)), ((3, 5), (5,)), ((3, 5), (5, 4)), ((2, 3, 5), (2, 5, 4)),
    ((2, 3, 5), (5, 4)), ((3, 5), (2, 5, 4)), ((2, 1, 3, 5), (4, 5, 2)), ((5,), (2, 5, 4)),
    ((2, 3, 5), (5,)), ((1, 1, 3, 5), (1, 5, 4)), ((0, 5), (5, 4)), ((3, 0), (0, 4)),
]


@pytest.mark.parametrize("element_type", ALL_TYPES, ids=TYPE_IDS.get)
def test_matmul_matches_reference(element_type):
    rng = np.random.default_rng(element_type)
    kernel = _kernel("MatMul", element_type)
    for a_shape, b_shape in MATMUL_SHAPES:
        a, b = _random(a_shape, element_type, rng), _random(b_shape, element_type, rng)
        expected = _reference("MatMul", [a, b], element_type)
        (got,) = kernel.run(a, b)
        assert got.dtype == a.dtype, (a_shape, b_shape)
        _check(got, expected.astype(a.dtype), a, b)


@pytest.mark.parametrize("opset", [1, 9, 13])
def test_matmul_versions(opset):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    (got,) = _kernel("MatMul", T.FLOAT, opset=opset).run(a, a.T)
    np.testing.assert_array_equal(got, _reference("MatMul", [a, a.T.copy()], T.FLOAT, opset=opset))


def test_matmul_errors():
    kernel = _kernel("MatMul", T.FLOAT)
    with pytest.raises(KernelError, match="inner dimensions"):
        kernel.run(np.ones((3, 5), np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(KernelError, match="do not broadcast"):
        kernel.run(np.ones((2, 3, 5), np.float32), np.ones((3, 5, 2), np.float32))
    with pytest.raises(KernelError, match="at least one dimension"):
        kernel.run(np.float32(1), np.ones((1,), np.float32))
    with pytest.raises(KernelError, match="same type"):
        kernel.run(np.ones((3,), np.float32), np.ones((3,), np.float64))


# --- every plan against the forced-serial path --------------------------------------------------

PLAN_CASES = [  # (A shape, B shape): uneven blocks, one row, one column, batches
    ((7, 9), (9, 5)), ((1, 9), (9, 7)), ((7, 9), (9, 1)), ((2, 9), (9, 2)), ((1, 1), (1, 1)),
    ((3, 7, 9), (9, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((5, 8), (3, 8, 7)), ((0, 4), (4, 3)),
]


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("element_type", [T.FLOAT, T.DOUBLE, T.FLOAT16, T.BFLOAT16, T.INT32, T.UINT64],
                         ids=TYPE_IDS.get)
def test_matmul_every_plan_matches_serial(element_type, threads, pools):
    rng = np.random.default_rng(threads)
    serial = _kernel("MatMul", element_type, SERIAL, pools[threads])
    modes = gemm.INTEGER_MODES if element_type in INTEGERS else gemm.MODES
    seen = set()
    for (a_shape, b_shape), mode, minimum_rows in itertools.product(PLAN_CASES, modes, (1, 3)):
        a, b = _random(a_shape, element_type, rng), _random(b_shape, element_type, rng)
        kernel = _kernel("MatMul", element_type, _forced(mode, minimum_rows), pools[threads])
        (expected,) = serial.run(a, b)
        (got,) = kernel.run(a, b)
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        plan = kernel.plan(a.shape[-2], b.shape[-1], a.shape[-1], batch)
        seen.add(plan)
        _check(got, expected, a, b,
               accumulate=np.float32 if element_type in (T.FLOAT16, T.BFLOAT16) else None)
    expected_plans = {"serial", "split_rows", "split_columns", "split_batch"}
    if element_type not in INTEGERS:
        expected_plans.update({"blas", "tiles"})
    assert expected_plans <= seen


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("element_type", [T.FLOAT, T.FLOAT16, T.INT64], ids=TYPE_IDS.get)
def test_gemm_every_plan_matches_serial(element_type, threads, pools):
    rng = np.random.default_rng(7 * threads)
    modes = gemm.INTEGER_MODES if element_type in INTEGERS else gemm.MODES
    for (m, k, n), c_shape, (trans_a, trans_b) in itertools.product(
        [(7, 6, 5), (1, 6, 7), (7, 6, 1), (2, 3, 2)], [None, (), ("n",), ("m", 1), ("m", "n")],
        [(0, 0), (1, 0), (0, 1), (1, 1)],
    ):
        a = _random((k, m) if trans_a else (m, k), element_type, rng)
        b = _random((n, k) if trans_b else (k, n), element_type, rng)
        shape = None if c_shape is None else tuple({"m": m, "n": n}.get(d, d) for d in c_shape)
        c = None if shape is None else _random(shape, element_type, rng)
        attributes = {"alpha": 0.5, "beta": 2.0, "transA": trans_a, "transB": trans_b}
        (expected,) = _kernel("Gemm", element_type, SERIAL, pools[threads], num_inputs=3,
                              **attributes).run(a, b, c)
        for mode in modes:
            kernel = _kernel("Gemm", element_type, _forced(mode), pools[threads], num_inputs=3,
                             **attributes)
            (got,) = kernel.run(a, b, c)
            _check(got, expected, a.T if trans_a else a, b.T if trans_b else b, alpha=0.5, beta=2.0,
                   c=None if c is None else np.broadcast_to(c, (m, n)),
                   accumulate=np.float32 if element_type == T.FLOAT16 else None)


def test_split_blocks_are_uneven_and_cover_the_output(pools):
    """M=7 over 3 threads: blocks of 3, 2 and 2 rows, each written by its own BLAS call."""
    rows_seen = []
    lock = threading.Lock()

    def epilogue(y, rows, columns):
        with lock:
            rows_seen.append((rows.start, rows.stop))
        return y

    kernel = _kernel("MatMul", T.FLOAT, _forced("split_rows"), pools[3])
    a = np.arange(63, dtype=np.float32).reshape(7, 9)
    b = np.ones((9, 4), np.float32)
    y = kernel._product(a, b, epilogue)
    assert sorted(rows_seen) == [(0, 3), (3, 5), (5, 7)]
    np.testing.assert_array_equal(y, a @ b)


# --- the plan -----------------------------------------------------------------------------------


def test_plan_threshold_and_modes(pools):
    pool = pools[3]
    kernel = _kernel("MatMul", T.FLOAT, _forced("split", minimum_rows=4, minimum_flops=1000), pool)
    assert kernel.plan(10, 10, 9) == "serial"  # 900 < 1000
    assert kernel.plan(10, 10, 10) == "split_rows"  # at the threshold; a tie goes to rows
    assert kernel.plan(10, 11, 10) == "split_columns"  # same blocks: the larger dimension
    assert kernel.plan(4, 12, 100) == "split_columns"  # rows give 1 block, columns 3
    assert kernel.plan(7, 7, 100) == "serial"  # 7 // 4 = 1 block either way: no split, no BLAS threads
    assert kernel.plan(10, 10, 10, (1, 1)) == "split_rows"  # batch of one is a matrix
    assert kernel.plan(10, 10, 10, (2, 1)) == "split_batch"
    assert kernel.plan(0, 10, 10) == "serial"
    for mode, expected in [("blas", "blas"), ("split_rows", "split_rows"), ("split_columns", "serial")]:
        assert _kernel("MatMul", T.FLOAT, _forced(mode, 4), pool).plan(12, 4, 100) == expected
    integer = _kernel("MatMul", T.INT32, _forced("split_rows", 4), pool)
    assert integer.plan(1, 100, 100) == "serial"
    assert _kernel("MatMul", T.FLOAT, _forced("blas")).plan(512, 512, 512) == "serial"  # no pool
    assert _kernel("MatMul", T.FLOAT, _forced("blas"), ThreadPool(1)).plan(512, 512, 512) == "serial"


def test_defaults_without_configuration():
    kernel = gemm.MatMulKernel(_context("MatMul", T.FLOAT))
    defaults = gemm.gemm_schema("MatMul", T.FLOAT).defaults
    assert (kernel.minimum_flops, kernel.mode, kernel.minimum_rows) == (
        defaults[gemm.MINIMUM_FLOPS], defaults[gemm.MODE], defaults[gemm.MINIMUM_ROWS])
    untyped = gemm.MatMulKernel(NodeContext("n", "MatMul", "", 13))
    assert untyped.tuning_key() is None
    (y,) = untyped.run(np.ones((2, 2), np.int64), np.ones((2, 2), np.int64))
    np.testing.assert_array_equal(y, np.full((2, 2), 2))


def test_configure_copies_typed_values(pools):
    kernel = _kernel("Gemm", T.DOUBLE)
    kernel.bind(pools[2]).configure(_forced("split_columns", 8, 123))
    assert (kernel.minimum_flops, kernel.mode, kernel.minimum_rows) == (123, "split_columns", 8)
    assert kernel.num_threads == 2
    with pytest.raises(KernelError, match=r"parallel\.mode"):
        _kernel("MatMul", T.INT32).bind(pools[2]).configure(_forced("blas"))


def test_concurrent_runs_of_one_kernel(pools):
    """Sessions may run one kernel from several threads: no per-call state on the kernel."""
    kernel = _kernel("MatMul", T.FLOAT, _forced("split_rows"), pools[2])
    rng = np.random.default_rng(3)
    inputs = [(_random((9, 16), T.FLOAT, rng), _random((16, 5), T.FLOAT, rng)) for _ in range(6)]
    errors = []

    def work(a, b):
        try:
            for _ in range(20):
                _check(kernel.run(a, b)[0], a @ b, a, b)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=pair) for pair in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


# --- BLAS threads -------------------------------------------------------------------------------


@pytest.fixture
def blas_two():
    """Two BLAS threads around the test (or skip if no BLAS library is found)."""
    if not gemm.BLAS.get():
        pytest.skip("no BLAS library found by threadpoolctl")
    with threadpool_limits(limits=2, user_api="blas"):
        if gemm.BLAS.get()[0] != 2:
            pytest.skip("BLAS cannot use two threads here")
        yield


def test_blas_limit_and_restore(blas_two):
    # one count per BLAS library loaded: numpy's, and scipy's where it is installed (conftest.py)
    libraries = len(gemm.BLAS.get())
    previous = gemm.BLAS.limit(1)
    assert previous is not None and previous.previous == (2,) * libraries
    assert gemm.BLAS.get() == (1,) * libraries
    assert gemm.BLAS.limit(1) is None  # nothing to change: nothing to restore
    gemm.BLAS.restore(previous)
    assert gemm.BLAS.get() == (2,) * libraries
    with gemm.BLAS.scope(1):
        assert gemm.BLAS.get() == (1,) * libraries
    assert gemm.BLAS.get() == (2,) * libraries


@pytest.mark.parametrize("mode", gemm.MODES)
def test_kernels_restore_the_blas_thread_count(blas_two, mode, pools):
    seen = []
    kernel = _kernel("MatMul", T.FLOAT, _forced(mode), pools[3])
    serial = _kernel("MatMul", T.FLOAT, SERIAL, pools[3])

    def spy(y, rows, columns):
        seen.append(gemm.BLAS.get()[0])
        return y

    a = np.ones((8, 8), np.float32)
    for scope in (2, 1):  # outside a runtime's scope (BLAS at 2 threads), then inside scope(1)
        with gemm.BLAS.scope(scope):
            seen.clear()
            serial._product(a, a, spy)
            kernel._product(a, a, spy)
            assert seen[0] == 1  # the serial path runs with one BLAS thread
            if mode != "tiles":  # tiles apply alpha and C in their compiled region, not `spy`
                assert set(seen[1:]) == ({3} if mode == "blas" else {1})
            assert set(gemm.BLAS.get()) == {scope}
    assert set(gemm.BLAS.get()) == {2}


def test_kernel_in_a_live_thread_leaves_threadpoolctl_usable():
    """threadpoolctl >= 3.7 gives OpenBLAS's limit to one live thread: kernels must hand it back."""
    counts = gemm.BLAS.get()
    if not counts or counts[0] is None or counts[0] < 2:
        pytest.skip("needs a BLAS library running more than one thread")
    kernel = _kernel("MatMul", T.FLOAT, SERIAL)
    a = np.ones((4, 4), np.float32)
    done, finish = threading.Event(), threading.Event()

    def session():
        kernel.run(a, a)  # changes the limit to 1 and back
        done.set()
        finish.wait()

    thread = threading.Thread(target=session)
    thread.start()
    try:
        done.wait()
        with threadpool_limits(limits=1, user_api="blas"):
            assert set(gemm.BLAS.get()) == {1}
    finally:
        finish.set()
        thread.join()
    assert gemm.BLAS.get() == counts


def test_concurrent_runs_leave_the_blas_thread_count_as_found(pools):
    """A session's run and a BLAS-threaded kernel in another thread, ending in the opposite
    order to their start: the count in force is the later one's, then the count found."""
    counts = gemm.BLAS.get()
    if not counts or counts[0] is None or counts[0] < 2 or gemm.BLAS.per_thread:
        pytest.skip("needs a process-wide BLAS library running more than one thread")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"])], "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [4, 4]) for name in "AB"],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 4])])
    session = RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                             num_threads=1)
    kernel = _kernel("MatMul", T.FLOAT, _forced("blas"), pools[3])
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    session_inside, session_go = threading.Event(), threading.Event()
    kernel_inside, kernel_go = threading.Event(), threading.Event()
    seen, results = {}, {}

    def hook(node, op_type):
        seen["session"] = gemm.BLAS.get()
        session_inside.set()
        session_go.wait()

    def spy(y, rows, columns):
        seen["kernel"] = gemm.BLAS.get()
        kernel_inside.set()
        kernel_go.wait()
        return y

    def run_session():
        results["session"] = session.run(None, {"A": a, "B": a}, node_hook=hook)[0]

    def run_kernel():
        results["kernel"] = kernel._product(a, a, spy)

    threads = [threading.Thread(target=run_session), threading.Thread(target=run_kernel)]
    try:
        threads[0].start()
        assert session_inside.wait(30)  # the run holds one BLAS thread
        threads[1].start()
        assert kernel_inside.wait(30)  # the kernel holds three
        session_go.set()
        threads[0].join()
        assert gemm.BLAS.get() == (3,) * len(counts)  # the kernel's limit is still in force
    finally:
        session_go.set()
        kernel_go.set()
        for thread in threads:
            if thread.is_alive() or thread.ident is not None:
                thread.join()
    assert seen == {"session": (1,) * len(counts), "kernel": (3,) * len(counts)}
    np.testing.assert_array_equal(results["session"], a @ a)
    np.testing.assert_array_equal(results["kernel"], a @ a)
    assert gemm.BLAS.get() == counts


def test_per_thread_blas_limits_every_block(monkeypatch, pools):
    """With an OpenMP-threaded BLAS each block limits its own thread."""
    calls = []

    class PerThread(parallel.BlasThreads):
        @property
        def per_thread(self):
            return True

        def limit(self, num_threads):
            calls.append((threading.get_ident(), num_threads))
            return None

    monkeypatch.setattr(gemm, "BLAS", PerThread())
    kernel = _kernel("MatMul", T.FLOAT, _forced("split_rows"), pools[2])
    a = np.ones((4, 4), np.float32)
    np.testing.assert_array_equal(kernel.run(a, a)[0], a @ a)
    assert len(calls) == 3 and {n for _, n in calls} == {1}  # the kernel, then each of 2 blocks


# --- schemas and tables -------------------------------------------------------------------------


def test_schemas_validate_defaults_and_reject_bad_values():
    schemas = gemm.tuning_schemas()
    assert len(schemas) == len({s.key for s in schemas}) == 2 * len(ALL_TYPES)
    for schema in schemas:
        assert schema.validate(schema.defaults) == dict(schema.defaults)
        integer = schema.key.element_type in INTEGERS
        assert set(schema.parameter(gemm.MODE).choices) == set(
            gemm.INTEGER_MODES if integer else gemm.MODES)
        for bad in ({gemm.MODE: "fast"}, {gemm.MINIMUM_FLOPS: 0}, {gemm.MINIMUM_ROWS: 0},
                    {gemm.MINIMUM_FLOPS: True}, {gemm.MINIMUM_ROWS: 2.0}, {gemm.MODE: 1}):
            with pytest.raises(TuningValidationError):
                schema.update(schema.defaults, bad)
        with pytest.raises(KeyError):
            schema.update(schema.defaults, {"split.rows": 4})
        if integer:
            with pytest.raises(TuningValidationError):
                schema.update(schema.defaults, {gemm.MODE: "blas"})
    with pytest.raises(ValueError, match="no Gemm schema for element type int8"):
        gemm.gemm_schema("Gemm", T.INT8)


def test_registry_accepts_the_schemas():
    registry = KernelTuningRegistry()
    registry.register(schemas=gemm.tuning_schemas())
    assert set(registry.snapshot().keys()) == {s.key for s in gemm.tuning_schemas()}
    register_library(KernelTuningRegistry())  # together with the rest of the library


def test_kernel_table_and_keys():
    assert {op: sorted(versions) for op, versions in gemm.KERNELS.items()} == {
        "Gemm": [7, 9, 11, 13], "MatMul": [1, 9, 13]}
    keys = {s.key for s in gemm.tuning_schemas()}
    for op_type, versions in gemm.KERNELS.items():
        for cls in versions.values():
            assert cls.declaration.tunable and cls.op_type == op_type
        for element_type in ALL_TYPES:
            kernel = versions[13](_context(op_type, element_type))
            key = kernel.tuning_key()
            assert key in keys and key.element_type == element_type
            kernel.configure(gemm.gemm_schema(op_type, element_type).defaults)
