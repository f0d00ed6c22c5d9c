"""Compiled elementwise programs (kernels/compiled_elementwise.py), the ops that run them and
the fusion of elementwise chains (runtime/fusion.py step 5), against float64 references and
onnx's ReferenceEvaluator."""

from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest
from float32_bounds import assert_within_gelu32_bound, assert_within_layer_norm32_bound
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.polynomial import chebyshev
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnx_light
from onnx_light.kernels import KERNELS, normalization
from onnx_light.kernels import compiled_elementwise as ce
from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.elementwise import COMPILED_OPS, MINIMUM_ELEMENTS, OPS, default_minimum_elements
from onnx_light.kernels.fused_elementwise import FusedElementwise
from onnx_light.parallel import get_pool
from onnx_light.runtime import RuntimeSession

F = TensorProto.FLOAT
RNG = np.random.default_rng(11)
_erf = np.vectorize(math.erf, otypes=[np.float64])

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1e-6, -1e-6, 88.0, -88.0,
                    100.0, -100.0, 800.0, -800.0, 3.9, -3.9, 5.6, -5.6], np.float32)
VALUES = np.concatenate([SPECIAL, np.linspace(-12, 12, 4001, dtype=np.float32),
                         np.float32(10.0) ** np.linspace(-20, 1.5, 300, dtype=np.float32)])


def _reference(code: int, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return {
            ce.NEG: lambda v: -v, ce.ABS: np.abs, ce.EXP: np.exp, ce.ERF: _erf, ce.TANH: np.tanh,
            ce.SIGMOID: lambda v: 1 / (1 + np.exp(-v)), ce.RELU: lambda v: np.maximum(v, 0),
            ce.SQRT: np.sqrt, ce.RECIPROCAL: lambda v: 1 / v,
            ce.GELU: lambda v: 0.5 * v * (1 + _erf(v / np.sqrt(2))),
            ce.GELU_TANH: lambda v: v / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3))),
            ce.MISH: lambda v: v * np.tanh(np.logaddexp(v, 0)),
            ce.HARD_SWISH: lambda v: v * np.clip(v / 6 + 0.5, 0, 1),
        }[code](x.astype(np.float64))


def _unary(code: int) -> ce.CompiledProgram:
    program = ce.Program()
    return program.finish(program.unary(code, program.load(0)))


def _assert_close(actual: np.ndarray, expected: np.ndarray, ulps: float, atol: float = 0.0) -> None:
    """Within ``ulps`` float32 units of the float64 ``expected`` (or ``atol``); NaN where it
    is NaN, infinities and the signs of zeros equal."""
    with np.errstate(over="ignore"):
        rounded = expected.astype(np.float32)
    assert np.array_equal(np.isnan(actual), np.isnan(rounded))
    same = actual == rounded
    zeros = same & (rounded == 0)
    assert np.array_equal(np.signbit(actual[zeros]), np.signbit(rounded[zeros]))
    finite = np.isfinite(rounded) & ~same
    error = np.abs(actual[finite].astype(np.float64) - expected[finite])
    bound = ulps * np.spacing(np.abs(rounded[finite])).astype(np.float64) + atol
    assert np.all(error <= bound), (actual[finite][error > bound], expected[finite][error > bound])


def test_erf_polynomial_is_as_accurate_as_stated() -> None:
    """erf(a) = a P(u) to 3e-13 on [0, 3.95], as does a fresh fit made the documented way
    (the high-degree power coefficients themselves are ill-conditioned, so not compared)."""
    hi = ce._ERF_LIMIT ** 2
    t = np.cos(np.pi * (np.arange(200) + 0.5) / 200) * hi / 2 + hi / 2
    values = np.array([math.erf(math.sqrt(v)) / math.sqrt(v) for v in t])
    fit = chebyshev.cheb2poly(chebyshev.chebfit((t - hi / 2) / (hi / 2), values, 22))
    a = np.linspace(0, ce._ERF_LIMIT, 20001)
    u = a * a * ce._ERF_SCALE - 1
    for coefficients in (ce.ERF_POLYNOMIAL, fit):
        p = np.polynomial.polynomial.polyval(u, coefficients)
        assert np.max(np.abs(p * a - _erf(a))) < 3e-13


@pytest.mark.parametrize(("code", "ulps", "atol"), [
    (ce.ERF, 0.5001, 0), (ce.EXP, 0.5001, 0), (ce.TANH, 0.5001, 0), (ce.SIGMOID, 0.5001, 0),
    (ce.NEG, 0, 0), (ce.ABS, 0, 0), (ce.RELU, 0, 0), (ce.SQRT, 0.5, 0), (ce.RECIPROCAL, 0.5, 0),
    (ce.MISH, 1, 1e-30), (ce.HARD_SWISH, 0.5001, 0)])
def test_unary_operations_round_the_float64_value(code: int, ulps: float, atol: float) -> None:
    """Each operation is the float64 function rounded once; NaN, infinities and signed zeros
    as numpy has them."""
    _assert_close(_unary(code).run([VALUES]), _reference(code, VALUES), ulps, atol)


@pytest.mark.parametrize("code", [ce.GELU, ce.GELU_TANH])
def test_gelu_programs_are_within_the_float32_bound(code: int) -> None:
    """A float32 GELU program computes in float32 (``float32_math``): within 2 ulp of the
    float64 result plus 1 ulp of the argument; NaN, infinities and zeros exact."""
    assert_within_gelu32_bound(_unary(code).run([VALUES]), _reference(code, VALUES), VALUES)


@pytest.mark.parametrize("code", [ce.ADD, ce.SUB, ce.MUL, ce.DIV, ce.MAX, ce.MIN, ce.LEAKY])
def test_binary_operations_are_numpys(code: int) -> None:
    program = ce.Program()
    out = program.finish(program.binary(code, program.load(0), program.load(1)))
    a = RNG.permutation(np.resize(SPECIAL, 1000)).astype(np.float32)
    b = RNG.permutation(np.resize(SPECIAL, 1000)).astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        expected = {ce.ADD: np.add, ce.SUB: np.subtract, ce.MUL: np.multiply, ce.DIV: np.divide,
                    ce.MAX: np.maximum, ce.MIN: np.minimum,
                    ce.LEAKY: lambda x, s: np.where(x > 0, x, x * s)}[code](a64, b64)
    _assert_close(out.run([a, b]), expected, 0.5)


@st.composite
def _run_broadcast(draw) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """An output shape and an input shape whose nonunit dimensions are a contiguous run of
    the output's (leading ones dropped or kept, trailing ones for the axes after the run)."""
    out = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=4)))
    start = draw(st.integers(0, len(out)))
    stop = draw(st.integers(start, len(out)))
    lead = draw(st.integers(0, start))
    return out, (1,) * lead + out[start:stop] + (1,) * (len(out) - stop)


@settings(max_examples=60, deadline=None)
@given(_run_broadcast(), st.integers(0, 2**31 - 1))
def test_runs_of_output_dimensions_broadcast_like_numpy(shapes, seed: int) -> None:
    """An input over any contiguous run of the output's dimensions (a per-channel (C, 1)
    over (N, C, T), a bias, one element) gives numpy's broadcast, GELU rounded once (absolute
    1e-7 where erf has rounded to -1)."""
    out_shape, shape = shapes
    rng = np.random.default_rng(seed)
    program = ce.Program()
    x, y = program.load(0), program.load(1)
    fused = program.finish(program.unary(ce.GELU, program.binary(ce.MUL, x, y)))
    a = rng.standard_normal(out_shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    result = fused.run([a, b])
    product = a.astype(np.float64) * b
    assert result is not None and result.shape == product.shape
    _assert_close(result, 0.5 * product * (1 + _erf(product / np.sqrt(2))), 0.5001, 1e-7)


def test_broadcasting_patterns_and_refusals() -> None:
    """Whole, one-element and trailing-block inputs broadcast like numpy; other patterns,
    and inputs of another type, are refused (None) for the caller to compute otherwise."""
    program = ce.Program()
    x, y, z = program.load(0), program.load(1), program.load(2)
    add = program.finish(program.binary(ce.ADD, program.binary(ce.MUL, x, y), z))
    a = RNG.standard_normal((3, 5, 7)).astype(np.float32)
    for b, c in [(np.float32(2.0), RNG.standard_normal(7).astype(np.float32)),
                 (RNG.standard_normal((5, 7)).astype(np.float32), np.ones((1, 1, 1), np.float32)),
                 (a[::-1], RNG.standard_normal((1, 5, 7)).astype(np.float32))]:
        b = np.asarray(b)
        expected = a.astype(np.float64) * b + c
        result = add.run([a, b, c])
        assert result.shape == expected.shape
        _assert_close(result, expected, 0.5)
    assert add.run([a, np.ones((3, 1, 7), np.float32), a]) is None
    assert add.run([a, a.astype(np.float64), a]) is None


def test_parallel_regions_give_the_serial_bits() -> None:
    program = _unary(ce.GELU)
    x = RNG.standard_normal(100_003).astype(np.float32) * 4
    serial = program.run([x], 1)
    assert serial.tobytes() == program.run([x], 2, minimum_elements=1).tobytes()
    numba = pytest.importorskip("numba")
    assert numba.get_num_threads() == min(2, numba.config.NUMBA_NUM_THREADS)


def test_calibration_searches_the_compiled_path() -> None:
    """The crossover search of a compiled op times its program, serial against parallel, and
    still finds their outputs bit-identical."""
    from onnx_light.kernels import DECLARATIONS
    from onnx_light.kernels.calibration import ElementwiseCrossover

    problem = ElementwiseCrossover(DECLARATIONS["", "Gelu"], F, 2)
    assert problem._serial.program is not None and problem._parallel.program is not None
    inputs = problem.make_inputs(50_000, "equal")
    assert problem.same_output(problem.serial(inputs), problem.candidate(inputs))


def _serial_in_a_fork(queue) -> None:
    program = _unary(ce.ERF)
    x = np.linspace(-3, 3, 100_000, dtype=np.float32)
    queue.put((ce._Regions.allowed, program.run([x], 2, minimum_elements=1).tobytes()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_fork_after_parallel_regions_computes_serially() -> None:
    """GNU OpenMP does not survive fork: the child of a process that ran regions computes its
    programs serially (same bits) instead of hanging in its first region."""
    import multiprocessing

    program = _unary(ce.ERF)
    x = np.linspace(-3, 3, 100_000, dtype=np.float32)
    expected = program.run([x], 2, minimum_elements=1).tobytes()
    assert ce._Regions.started
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_serial_in_a_fork, args=(queue,))
    child.start()
    allowed, result = queue.get(timeout=120)
    child.join(timeout=30)
    assert allowed is False and result == expected and child.exitcode == 0


def _kernel(op_type: str, element_type: int, **attributes: object):
    version = max(KERNELS[op_type])
    ctx = NodeContext("n", op_type, "", version, attributes, (element_type,), (element_type,), 1)
    return KERNELS[op_type][version](ctx).bind(get_pool(2))


@pytest.mark.parametrize("op_type", sorted(COMPILED_OPS))
def test_compiled_ops_take_the_program_for_float32_only(op_type: str) -> None:
    """float32 runs the program (the output is the program's, never a view of the input, for
    any memory layout); the other float types keep the numpy path and agree with it."""
    kernel = _kernel(op_type, F)
    assert kernel.program is not None
    x = (RNG.standard_normal((6, 40)) * 3).astype(np.float32)
    for layout in (x, x.T, x[:, ::3]):
        out = kernel.run(layout)[0]
        assert not np.shares_memory(out, x) and out.flags.c_contiguous
        assert out.tobytes() == kernel.program.run([np.ascontiguousarray(layout)]).tobytes()
    for element_type, dtype in ((TensorProto.DOUBLE, np.float64), (TensorProto.FLOAT16, np.float16),
                                (TensorProto.BFLOAT16, ml_dtypes.bfloat16)):
        other = _kernel(op_type, element_type)
        assert other.program is None
        result = other.run(x.astype(dtype))[0]
        assert result.dtype == dtype
        np.testing.assert_allclose(result.astype(np.float64), kernel.run(x)[0], rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------------------ fusion

def _const(name: str, value) -> TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _model(nodes, initializers, shape=(2, 8, 64), outputs=("y",)):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, list(shape))],
                              [helper.make_tensor_value_info(o, F, None) for o in outputs], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


GELU_NODES = [helper.make_node("Add", ["x", "bias"], ["b"]), helper.make_node("Div", ["b", "r"], ["d"]),
              helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]),
              helper.make_node("Mul", ["b", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
GELU_CONSTANTS = [_const("bias", RNG.standard_normal(64)), _const("r", 2 ** 0.5), _const("one", 1.0),
                  _const("half", 0.5)]
GELU_TANH_NODES = [
    helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("Mul", ["p", "c"], ["pc"]),
    helper.make_node("Add", ["x", "pc"], ["s"]), helper.make_node("Mul", ["s", "k"], ["u"]),
    helper.make_node("Tanh", ["u"], ["t"]), helper.make_node("Add", ["t", "one"], ["a"]),
    helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
GELU_TANH_CONSTANTS = [_const("three", 3.0), _const("c", 0.044715), _const("k", (2 / np.pi) ** 0.5),
                       _const("one", 1.0), _const("half", 0.5)]


def _fused_types(session: RuntimeSession) -> list[str]:
    return [step.op_type for step in session._plan]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("nodes", "constants"), [(GELU_NODES, GELU_CONSTANTS),
                                                  (GELU_TANH_NODES, GELU_TANH_CONSTANTS)],
                         ids=["gelu-erf-bias", "gelu-tanh"])
def test_gelu_chains_become_one_step_equal_to_the_graph(nodes, constants, threads: int) -> None:
    model = _model(nodes, constants)
    session = RuntimeSession(model, num_threads=threads)
    assert _fused_types(session) == ["FusedElementwise"]
    assert session.fused_nodes == len(nodes) - 1
    x = (RNG.standard_normal((2, 8, 64)) * 4).astype(np.float32)
    y = session.run(None, {"x": x})[0]
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    unfused = RuntimeSession(model, fuse=False).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-7)
    np.testing.assert_allclose(y, unfused, rtol=2e-6, atol=2e-7)
    assert not np.shares_memory(y, x)


def test_chains_of_cheap_ops_and_open_chains_stay_unfused() -> None:
    """Sigmoid * x is faster as numpy calls; a chain whose intermediate is a graph output
    (or read by a node outside it) keeps its nodes; both compute the graph's values."""
    silu = _model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])], [])
    assert "FusedElementwise" not in _fused_types(RuntimeSession(silu))
    open_chain = _model(GELU_NODES, GELU_CONSTANTS, outputs=("y", "e"))
    session = RuntimeSession(open_chain)
    assert "Erf" in _fused_types(session)
    x = RNG.standard_normal((2, 8, 64)).astype(np.float32)
    for actual, expected in zip(session.run(None, {"x": x}),
                                ReferenceEvaluator(open_chain).run(None, {"x": x}), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=2e-6, atol=2e-7)


def test_a_chain_falls_back_to_its_nodes_for_broadcasts_it_does_not_take() -> None:
    """x (2, 1, 64) times w (8, 1): the program refuses the pattern, the fused step runs the
    original kernels instead, with the graph's result."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["b"]), helper.make_node("Erf", ["b"], ["e"]),
             helper.make_node("Mul", ["e", "b"], ["y"])]
    model = _model(nodes, [_const("w", RNG.standard_normal((8, 1)))], shape=(2, 1, 64))
    session = RuntimeSession(model)
    assert _fused_types(session) == ["FusedElementwise"]
    fused = session._plan[0].run.__self__
    assert isinstance(fused, FusedElementwise) and fused.node_types == ("Mul", "Erf", "Mul")
    x = RNG.standard_normal((2, 1, 64)).astype(np.float32)
    y = session.run(None, {"x": x})[0]
    assert y.shape == (2, 8, 64)
    np.testing.assert_allclose(y, ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-6, atol=1e-7)


@pytest.mark.usefixtures("isolated_tuning")
def test_a_chain_runs_with_the_published_values_of_the_node_it_is_tuned_as(monkeypatch) -> None:
    """A value published for Erf (the chain's most expensive op) before the session is built:
    the fused step runs its program with it and the tuning report shows it and its source."""
    erf = next(op for op in OPS if op.op_type == "Erf")
    published = {MINIMUM_ELEMENTS: default_minimum_elements(erf, F) + 777}
    onnx_light.set_kernel_tuning_parameters("Erf", "float", published, num_threads=2, persist=False)
    model = _model(GELU_NODES, GELU_CONSTANTS)
    session = RuntimeSession(model, num_threads=2)
    fused = session._plan[0].run.__self__
    assert isinstance(fused, FusedElementwise) and fused.minimum_elements == published[MINIMUM_ELEMENTS]
    (entry,) = session.tuning_report()
    assert entry["key"].startswith("onnx_light/Erf/")
    assert entry["values"] == published and entry["source"] == "published_profile"
    x = RNG.standard_normal((2, 8, 64)).astype(np.float32)
    expected = RuntimeSession(model, fuse=False).run(None, {"x": x})[0]
    thresholds = []
    run = ce.CompiledProgram.run
    monkeypatch.setattr(ce.CompiledProgram, "run",
                        lambda self, arrays, threads=1, minimum=1, out=None: (
                            thresholds.append(minimum), run(self, arrays, threads, minimum, out))[1])
    y = session.run(None, {"x": x})[0]
    assert thresholds == [published[MINIMUM_ELEMENTS]]
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-7)


def test_a_chain_is_not_tuned_as_its_pow() -> None:
    """GELU-tanh's cube is a Pow node, which the program computes as two products: the chain
    is tuned as its Tanh, not as numpy's general power."""
    session = RuntimeSession(_model(GELU_TANH_NODES, GELU_TANH_CONSTANTS), num_threads=2)
    fused = session._plan[0].run.__self__
    assert isinstance(fused, FusedElementwise) and "Pow" in fused.node_types
    assert fused.tuned.ctx.op_type == "Tanh"
    (entry,) = session.tuning_report()
    assert entry["key"].startswith("onnx_light/Tanh/")


# ------------------------------------------------------------------------------ LayerNormalization

def _layer_norm(element_type: int, threads: int, **attributes: object):
    ctx = NodeContext("ln", "LayerNormalization", "", 17, attributes, (element_type,) * 3,
                      (element_type,) * 3, 3, 3)
    return KERNELS["LayerNormalization"][17](ctx).bind(get_pool(threads))


def _layer_norm_reference(x, scale, bias, axis, epsilon=1e-5):
    axes = tuple(range(axis % x.ndim, x.ndim))
    data = x.astype(np.float64)
    mean = data.mean(axis=axes, keepdims=True)
    inverse = 1 / np.sqrt(((data - mean) ** 2).mean(axis=axes, keepdims=True) + epsilon)
    y = (data - mean) * inverse * scale + (0 if bias is None else bias)
    return [y, mean, inverse]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("shape", "axis", "scale_shape", "with_bias"), [
    ((2, 32, 256), -1, (256,), True), ((2, 32, 256), -1, (256,), False),
    ((4, 6, 10), 1, (6, 10), True), ((4, 6, 10), 1, (1, 10), True), ((3, 1000), 0, (1000,), True),
    ((3, 67, 200), -1, (200,), True)])  # 40200 elements: over two threads, rows split unevenly
def test_layer_norm_compiled_rows_match_float64(shape, axis, scale_shape, with_bias, threads,
                                                 monkeypatch) -> None:
    """float32 LayerNormalization (the compiled rows, serial or over two threads from 2^15
    elements, for any layout of X) is the float64 computation rounded: Y to a few units, Mean
    and InvStdDev to one; its outputs are new arrays."""
    monkeypatch.setattr(normalization, "LAYER_NORM_PARALLEL_MINIMUM", 1 << 15)
    kernel = _layer_norm(F, threads, axis=axis)
    x = (RNG.standard_normal(shape) * 3 + 1).astype(np.float32)
    scale = RNG.standard_normal(scale_shape).astype(np.float32)
    bias = RNG.standard_normal(scale_shape).astype(np.float32) if with_bias else None
    expected = _layer_norm_reference(x, scale, bias, axis)
    for layout in (x, np.asfortranarray(x)):
        outputs = kernel.run(layout, scale, *([bias] if with_bias else []))
        for actual, wanted in zip(outputs, expected, strict=True):
            assert actual.dtype == np.float32 and actual.shape == wanted.shape
            assert not np.shares_memory(actual, x)
            np.testing.assert_allclose(actual, wanted, rtol=2e-6, atol=2e-6)
    if threads == 2 and x.size >= 1 << 15:
        serial = _layer_norm(F, 1, axis=axis).run(x, scale, *([bias] if with_bias else []))
        assert all(a.tobytes() == b.tobytes() for a, b in zip(outputs, serial, strict=True))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 1100), st.sampled_from([0.0, 1.0, 300.0]), st.booleans(),
       st.sampled_from([1e-5, 1e-12, 0.5]), st.data())
def test_layer_norm_rows_within_the_float32_bound(rows: int, n: int, shift: float, with_bias: bool,
                                                  epsilon: float, data: st.DataObject) -> None:
    """Rows of any width, values of any sign and size up to 1e4 (plus an offset), constant
    rows too: Y, Mean and InvStdDev within the float32 bound against float64."""
    x = data.draw(hnp.arrays(np.float32, (rows, n), elements=st.floats(-1e4, 1e4, width=32)))
    x = x + np.float32(shift)
    rng = np.random.default_rng(n)
    scale = rng.standard_normal(n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if with_bias else None
    y, mean, inverse = _layer_norm(F, 1, epsilon=epsilon).run(x, scale, *([bias] if with_bias else []))
    assert_within_layer_norm32_bound(y, mean, inverse, x, scale, bias, np.float32(epsilon))


def test_layer_norm_rows_with_nan_or_infinity_are_nan() -> None:
    """A NaN or an infinity in a row makes its Y and InvStdDev NaN and its Mean what float64
    gives (NaN, or the infinity); the other rows are untouched by it."""
    x = RNG.standard_normal((5, 40)).astype(np.float32)
    x[0, 3], x[1, 0], x[2, 39], (x[3, 1], x[3, 2]) = np.nan, np.inf, -np.inf, (np.inf, -np.inf)
    scale, bias = np.ones(40, np.float32), np.zeros(40, np.float32)
    y, mean, inverse = _layer_norm(F, 1).run(x, scale, bias)
    with np.errstate(invalid="ignore"):
        expected = _layer_norm_reference(x, scale, bias, -1)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected[0]))
    assert np.isnan(y[:4]).all() and not np.isnan(y[4]).any()
    np.testing.assert_array_equal(mean.reshape(-1)[:4], expected[1].reshape(-1)[:4].astype(np.float32))
    assert np.isnan(inverse.reshape(-1)[:4]).all()
    assert_within_layer_norm32_bound(y[4:], mean[4:], inverse[4:], x[4:], scale, bias, np.float32(1e-5))


def test_layer_norm_other_types_keep_the_numpy_path() -> None:
    x = RNG.standard_normal((4, 16))
    scale, bias = RNG.standard_normal(16), RNG.standard_normal(16)
    for dtype, tolerance in ((np.float64, 1e-6), (np.float16, 1e-2)):  # stash_type: float32
        kernel = _layer_norm({np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16}[dtype], 1)
        y = kernel.run(x.astype(dtype), scale.astype(dtype), bias.astype(dtype))[0]
        assert y.dtype == dtype
        expected = _layer_norm_reference(x.astype(dtype), scale.astype(dtype), bias.astype(dtype), -1)[0]
        np.testing.assert_allclose(y.astype(np.float64), expected, rtol=tolerance, atol=tolerance * 10)


def _gelu_program(form: str) -> ce.Program:
    """GELU as exporters write it, on x = input 0 + input 1 (a bias)."""
    p = ce.Program()
    x = p.binary(ce.ADD, p.load(0), p.load(1))
    if form == "div":
        d = p.binary(ce.DIV, x, p.constant(float(np.float32(math.sqrt(2)))))
    else:
        d = p.binary(ce.MUL, p.constant(float(np.float32(math.sqrt(0.5)))), x)
    f = p.binary(ce.ADD, p.unary(ce.ERF, d), p.constant(1.0))
    if form == "half first":
        g = p.binary(ce.MUL, f, p.binary(ce.MUL, x, p.constant(0.5)))
        return p, g
    g = p.binary(ce.MUL, x, f)
    return p, p.binary(ce.MUL, p.constant(0.5), g)


@pytest.mark.parametrize("form", ["div", "mul", "half first"])
def test_gelu_written_out_folds_into_one_instruction(form):
    p, result = _gelu_program(form)
    program = p.finish(result)
    codes = program.code[:, 0].tolist()
    assert ce.GELU in codes and ce.ERF not in codes and codes.count(ce.MUL) == 0
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 1000)).astype(np.float32) * 4
    x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    bias = rng.standard_normal(1000).astype(np.float32)
    s = x + bias  # gelu_rows rounds the sum to float32, as onnxruntime's BiasGelu
    expected = 0.5 * s * np.array([1 + math.erf(v / math.sqrt(2)) if np.isfinite(v) else np.nan
                                   for v in s.reshape(-1).astype(np.float64)]).reshape(s.shape)
    got = program.run([x, bias])
    finite = np.isfinite(s)
    assert_within_gelu32_bound(got[finite], expected[finite], s[finite])
    assert np.isnan(got[0, 0]) and got[0, 1] == np.inf and np.isnan(got[0, 2])  # -inf * 0, as the chain


def test_gelu_whose_intermediate_is_read_elsewhere_is_not_folded():
    p, result = _gelu_program("div")
    erf = next(row[1] for row in p._rows if row[0] == ce.ERF)
    program = p.finish(p.binary(ce.ADD, result, erf))
    assert ce.GELU not in program.code[:, 0].tolist()


def test_gpt2_gelu_joins_one_program_and_folds_into_gelu_tanh():
    """x * 0.5 and the tanh chain meet in the last Mul: one program, one GELU_TANH."""
    scalars = {"half": 0.5, "three": 3.0, "c": 0.044715, "k": math.sqrt(2 / math.pi), "one": 1.0}
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in scalars.items()]
    nodes = [helper.make_node("Mul", ["x", "half"], ["a"]), helper.make_node("Pow", ["x", "three"], ["p"]),
             helper.make_node("Mul", ["p", "c"], ["q"]), helper.make_node("Add", ["x", "q"], ["s"]),
             helper.make_node("Mul", ["s", "k"], ["t"]), helper.make_node("Tanh", ["t"], ["u"]),
             helper.make_node("Add", ["u", "one"], ["v"]), helper.make_node("Mul", ["a", "v"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 300])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 300])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = RuntimeSession(model)
    (step,) = session._plan
    program = step.run.__self__.program
    assert program.code[:, 0].tolist().count(ce.GELU_TANH) == 1 and ce.TANH not in program.code[:, 0]
    x = (np.random.default_rng(3).standard_normal((4, 300)) * 4).astype(np.float32)
    expected = RuntimeSession(model, fuse=False).run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=5e-7, atol=2e-7)


@pytest.mark.parametrize(("shape", "axis", "with_bias"), [((2, 9, 40), -1, True), ((3, 4, 5), 1, False)])
def test_layer_norm_in_the_bound_plan_gives_the_kernel_bits(shape, axis: int, with_bias: bool) -> None:
    """The bound plan's prepared LayerNormalization (Y alone) writes what the kernel's run gives."""
    normalized = list(shape[axis % len(shape):])
    names = ["x", "scale", *(["bias"] if with_bias else [])]
    rng = np.random.default_rng(5)
    parameters = [rng.standard_normal(normalized).astype(np.float32) for _ in names[1:]]
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", names, ["y"], axis=axis)], "g",
        [helper.make_tensor_value_info("x", F, list(shape))],
        [helper.make_tensor_value_info("y", F, list(shape))],
        [numpy_helper.from_array(p, name) for p, name in zip(parameters, names[1:], strict=True)])
    session = RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                             .SerializeToString())
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    bound = session.run(None, {"x": x})[0]
    hooked = session.run(None, {"x": x}, node_hook=lambda *_: None)[0]
    assert bound.tobytes() == hooked.tobytes()
    np.testing.assert_allclose(bound, _layer_norm_reference(x, *parameters[:1], parameters[1] if with_bias
                                                            else None, axis)[0], rtol=2e-6, atol=2e-6)


# --------------------------------------------------------------------------- InstanceNormalization

@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=3, max_size=4), st.sampled_from([1, 2]),
       st.booleans(), st.integers(0, 2**31 - 1))
def test_instance_norm_compiled_planes_match_float64(shape, threads: int, fortran: bool, seed: int) -> None:
    """float32 InstanceNormalization (the compiled planes, serial or over two threads, any
    layout of X) is the float64 computation rounded once, as numpy's float64 path gives it;
    the output is a new array."""
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    ctx = NodeContext("in", "InstanceNormalization", "", 6, {"epsilon": 1e-3}, (F,) * 3, (F,), 3, 1)
    kernel = KERNELS["InstanceNormalization"][6](ctx).bind(get_pool(threads))
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    scale, bias = (rng.standard_normal(shape[1]).astype(np.float32) for _ in range(2))
    data = x.astype(np.float64)
    axes = tuple(range(2, x.ndim))
    mean = data.mean(axis=axes, keepdims=True)
    inverse = 1 / np.sqrt(((data - mean) ** 2).mean(axis=axes, keepdims=True) + np.float32(1e-3))
    wanted = (data - mean) * inverse * scale.reshape(1, -1, *(1,) * len(axes)) \
        + bias.reshape(1, -1, *(1,) * len(axes))
    layout = np.asfortranarray(x) if fortran else x
    (actual,) = kernel.run(layout, scale, bias)
    assert actual.dtype == np.float32 and actual.shape == x.shape
    assert not np.shares_memory(actual, x)
    np.testing.assert_allclose(actual, wanted, rtol=1e-6, atol=1e-6)
    (numpy_path,) = kernel.run(x.astype(np.float64), scale.astype(np.float64), bias.astype(np.float64))
    np.testing.assert_allclose(actual, numpy_path, rtol=1e-6, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=3), st.booleans(),
       st.sampled_from([ce.GELU, ce.GELU_TANH]), st.integers(0, 2**31 - 1))
def test_gelu_in_one_pass_is_within_the_float32_bound_of_the_interpreter(shape, with_bias: bool, code: int,
                                                                          seed: int) -> None:
    """GELU(x) and GELU(x + bias along the last axis), erf and tanh forms, run row by row in
    float32 (gelu_rows) within 2 ulp of the interpreter's float64 values plus 1 ulp of the
    argument, special values included; other broadcasts keep the interpreter."""
    rng = np.random.default_rng(seed)
    program = ce.Program()
    x = program.load(0)
    if with_bias:
        x = program.binary(ce.ADD, program.load(1), x)
    program.constant(0.5)  # a constant nothing reads, as the folded GELU leaves them
    gelu = program.finish(program.unary(code, x))
    assert gelu._gelu_form == (code, with_bias)
    a = (rng.standard_normal(shape) * 4).astype(np.float32)
    a.reshape(-1)[:len(SPECIAL)] = SPECIAL[:a.size]
    inputs = [a, rng.standard_normal(shape[-1:]).astype(np.float32)][:1 + with_bias]
    flat = np.empty(a.size, np.float32)
    periods = np.array([(a.size, 1), (shape[-1], 1), (0, 1), (0, 1)], np.int64)
    arrays = [x.reshape(-1) for x in inputs] + [np.zeros(1, np.float32)] * (4 - len(inputs))
    ce.run_program.dispatcher(gelu.code, gelu.constants, *arrays, periods, gelu.registers, flat, 0, a.size)
    argument = (a + inputs[1]) if with_bias else a
    assert_within_gelu32_bound(gelu.run(inputs).reshape(-1), flat, argument.reshape(-1))
    assert gelu.run(inputs, threads=2).tobytes() == gelu.run(inputs).tobytes()  # rows over threads
    if with_bias:  # the bias as input 0, the whole tensor as input 1
        assert gelu.run(inputs[::-1]).tobytes() == gelu.run(inputs).tobytes()
    if with_bias and a.ndim > 1 and shape[0] > 1:  # a bias along the first axis: the interpreter
        column = rng.standard_normal((shape[0],) + (1,) * (a.ndim - 1)).astype(np.float32)
        with np.errstate(all="ignore"):  # -inf (1 + erf(-inf)) is NaN, as computed
            expected = _reference(code, a.astype(np.float64) + column)
        _assert_close(gelu.run([a, column]), expected, 0.5001, 1e-7)


@pytest.mark.parametrize("shape", [(1, 1000), (3, 517), (7, 129), (2, 64), (9, 300)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("tanh", [False, True])
def test_gelu_rows_split_over_threads_give_the_serial_bits(shape, with_bias: bool, tanh: bool) -> None:
    """Fewer than four rows per thread split by elements (a row's end, whole rows, a row's
    start per thread), more by rows: the serial values either way."""
    rng = np.random.default_rng(shape[1])
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[:len(SPECIAL)] = SPECIAL
    bias = rng.standard_normal(shape[1]).astype(np.float32) if with_bias else np.zeros(1, np.float32)
    serial, split = np.empty_like(x), np.full_like(x, np.nan)
    ce.gelu_rows.dispatcher(x, bias, with_bias, tanh, serial)
    assert ce.numba_threads(2)
    ce.gelu_rows_parallel.dispatcher(x, bias, with_bias, tanh, split, 2)
    assert split.tobytes() == serial.tobytes()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(2, 9), st.integers(2, 50), st.booleans(), st.integers(0, 2**31 - 1))
def test_gelu_of_a_channel_affine_is_within_the_float32_bound(batch: int, channels: int, plane: int,
                                                              swap: bool, seed: int) -> None:
    """GELU(x * scale + shift), scale and shift (C, 1) over (N, C, T) (wav2vec2's group norm
    and GELU), run plane by plane: the affine rounded as the graph's float32 Mul and Add, then
    GELU within the float32 bound of its float64 value, special values included. (One channel
    or planes of one element are a scalar or an elementwise operand: the interpreter's, tested
    above.)"""
    rng = np.random.default_rng(seed)
    program = ce.Program()
    x, scale, shift = program.load(0), program.load(1), program.load(2)
    product = program.binary(ce.MUL, scale, x) if swap else program.binary(ce.MUL, x, scale)
    program.constant(1.0)
    chain = program.finish(program.unary(ce.GELU, program.binary(ce.ADD, shift, product)))
    assert chain._gelu_affine
    a = (rng.standard_normal((batch, channels, plane)) * 3).astype(np.float32)
    a.reshape(-1)[:len(SPECIAL)] = SPECIAL[:a.size]
    s, b = (rng.standard_normal((channels, 1)).astype(np.float32) for _ in range(2))
    with np.errstate(all="ignore"):
        t = a * s + b  # float32, one rounding each, as the Mul and Add nodes
    expected = _reference(ce.GELU, t)
    assert_within_gelu32_bound(chain.run([a, s, b]), expected, t)
