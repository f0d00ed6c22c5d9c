"""The products' GELU and residual LayerNormalization epilogues (kernels/product_epilogues.py,
runtime/matmul_fusion.py) against the steps they replace (bit for bit, at 1 and 2 threads,
the parallel passes forced) and against the unfused graph (within the bound stated below)."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.matmul_bias import SMALL_WORK
from onnx_light.kernels.product_epilogues import MatMulAddNorm, MatMulGelu
from onnx_light.runtime import RuntimeSession, matmul_fusion
from onnx_light.runtime.arena import MemoryPlan
from onnx_light.runtime.session import _steps_of

F = TensorProto.FLOAT
U = 2.0 ** -24  # float32's unit roundoff
GELU_SLOPE = 1.13  # the largest |GELU'(x)| (1.1289 at x = 1.414...), either form


def _const(name, value):
    value = numpy_helper.from_array(np.array(value, np.float32))
    return helper.make_node("Constant", [], [name], value=value)


def _gelu_nodes(x, out, form):
    """GELU of ``x`` as the exporters write it: BERT's erf form, GPT-2's tanh form."""
    if form == "erf":
        return [_const("root2", 1.4142135), _const("one", 1.0), _const("half", 0.5),
                helper.make_node("Div", [x, "root2"], ["g_d"]), helper.make_node("Erf", ["g_d"], ["g_e"]),
                helper.make_node("Add", ["g_e", "one"], ["g_a"]),
                helper.make_node("Mul", [x, "g_a"], ["g_m"]),
                helper.make_node("Mul", ["g_m", "half"], [out])]
    return [_const("half", 0.5), _const("three", 3.0), _const("k3", 0.044715), _const("k1", 0.7978845608),
            _const("one", 1.0), helper.make_node("Mul", ["half", x], ["g_h"]),
            helper.make_node("Pow", [x, "three"], ["g_p"]), helper.make_node("Mul", ["k3", "g_p"], ["g_c"]),
            helper.make_node("Add", [x, "g_c"], ["g_s"]), helper.make_node("Mul", ["k1", "g_s"], ["g_u"]),
            helper.make_node("Tanh", ["g_u"], ["g_t"]), helper.make_node("Add", ["one", "g_t"], ["g_a"]),
            helper.make_node("Mul", ["g_h", "g_a"], [out])]


def gelu_model(a_shape, n, form, bias, bias_first, seed=0):
    rng = np.random.default_rng(seed)
    k = a_shape[-1]
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32), "w")]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["p"])]
    x = "p"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
        nodes.append(helper.make_node("Add", ["b", "p"] if bias_first else ["p", "b"], ["s"]))
        x = "s"
    graph = helper.make_graph(nodes + _gelu_nodes(x, "y", form), "g",
                              [helper.make_tensor_value_info("a", F, list(a_shape))],
                              [helper.make_tensor_value_info("y", F, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def norm_model(a_shape, n, bias, shift, residual_first, seed=0):
    """LayerNorm(a @ w (+ b) + r) over the last axis: a post-norm encoder's residual."""
    rng = np.random.default_rng(seed)
    k = a_shape[-1]
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "shift")]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["p"])]
    x = "p"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"))
        nodes.append(helper.make_node("Add", ["p", "b"], ["s"]))
        x = "s"
    nodes += [helper.make_node("Add", ["r", x] if residual_first else [x, "r"], ["t"]),
              helper.make_node("LayerNormalization", ["t", "scale", "shift"] if shift else ["t", "scale"],
                               ["y"], axis=-1, epsilon=1e-5)]
    r_shape = [*a_shape[:-1], n]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", F, list(a_shape)),
                                           helper.make_tensor_value_info("r", F, r_shape)],
                              [helper.make_tensor_value_info("y", F, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def fused_steps(session, kind):
    return [step.kernel for item in session._plan for step in _steps_of(item)
            if isinstance(step.kernel, kind)]


def without_epilogues(model, threads):
    """The session of the steps the epilogues replace (their fusion passes not run)."""
    with mock.patch.object(matmul_fusion, "_fuse_gelu", lambda steps, *rest: list(steps)), \
            mock.patch.object(matmul_fusion, "_fuse_norms", lambda steps, *rest: list(steps)):
        return RuntimeSession(model, num_threads=threads)


def force_parallel(kernels):
    """Every fused step's product split over the threads whatever its size."""
    for kernel in kernels:
        kernel.product.minimum_flops = 1
        kernel.product.minimum_rows = 1


shapes = st.tuples(st.sampled_from([(), (1,), (2,), (2, 3)]), st.integers(1, 20), st.integers(1, 40),
                   st.integers(1, 70))


@settings(max_examples=25, deadline=None)
@given(shape=shapes, form=st.sampled_from(["erf", "tanh"]), bias=st.booleans(), bias_first=st.booleans(),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 3))
def test_gelu_epilogue_is_the_steps_it_replaces_bit_for_bit(shape, form, bias, bias_first, threads, seed):
    batch, m, k, n = shape
    model = gelu_model((*batch, m, k), n, form, bias, bias_first, seed)
    session = RuntimeSession(model, num_threads=threads)
    steps = fused_steps(session, MatMulGelu)
    # a bias of one value is a constant of the chain's program: GELU(Y + c) is no GELU form
    assert len(steps) == (0 if bias and n == 1 else 1)
    assert all(step.tanh == (form == "tanh") for step in steps)
    if threads > 1:
        force_parallel(steps)
    a = np.random.default_rng(seed + 10).standard_normal((*batch, m, k)).astype(np.float32) * 2
    expected = without_epilogues(model, threads).run(None, {"a": a})[0]
    for _ in range(2):  # the second run writes into the memory plan's buffer
        (got,) = session.run(None, {"a": a})
        assert got.tobytes() == expected.tobytes()
    for step in steps:
        (unprepared,) = step.run(a, step.packed.weights())
        assert unprepared.tobytes() == expected.tobytes()


@pytest.mark.parametrize("form", ["erf", "tanh"])
def test_gelu_epilogue_within_the_bound_of_the_unfused_graph(form):
    """|fused - unfused| <= GELU_SLOPE * 2 (K + 2) u (|A| @ |W| + |b|) + 16 u (|t| + |y|): the
    products' first-order bound (two summation orders) moved by GELU's steepest slope, plus
    a few roundings of the chain (float32 GELU within 2 ulp of y and 1 of its argument t; the
    unfused chain rounds each of its five nodes)."""
    m, k, n = 37, 300, 70
    model = gelu_model((m, k), n, form, bias=True, bias_first=False)
    a = np.random.default_rng(5).standard_normal((m, k)).astype(np.float32) * 3
    fused = RuntimeSession(model, num_threads=1)
    assert len(fused_steps(fused, MatMulGelu)) == 1
    got = fused.run(None, {"a": a})[0].astype(np.float64)
    expected = RuntimeSession(model, num_threads=1, fuse=False).run(None, {"a": a})[0].astype(np.float64)
    w, b = (numpy_helper.to_array(init).astype(np.float64) for init in model.graph.initializer)
    t = a.astype(np.float64) @ w + b
    bound = (GELU_SLOPE * 2 * (k + 2) * U * (np.abs(a) @ np.abs(w) + np.abs(b))
             + 16 * U * (np.abs(t) + np.abs(expected)))
    assert np.all(np.abs(got - expected) <= bound)


@settings(max_examples=25, deadline=None)
@given(shape=shapes, bias=st.booleans(), shift=st.booleans(), residual_first=st.booleans(),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 3))
def test_norm_epilogue_is_the_unfused_graph_bit_for_bit(shape, bias, shift, residual_first, threads, seed):
    """The product (packed, bias added once), the residual's Add and the compiled
    LayerNormalization: the unfused graph's values, bit for bit (its MatMul packs its weights
    as well), and the steps the epilogue replaces."""
    batch, m, k, n = shape
    model = norm_model((*batch, m, k), n, bias, shift, residual_first, seed)
    session = RuntimeSession(model, num_threads=threads)
    steps = fused_steps(session, MatMulAddNorm)
    small = not batch and bias and m * k * n <= SMALL_WORK  # a MatMulBias loop: not packed
    assert len(steps) == (0 if small else 1)
    if threads > 1:
        force_parallel(steps)
    rng = np.random.default_rng(seed + 20)
    feeds = {"a": rng.standard_normal((*batch, m, k)).astype(np.float32),
             "r": rng.standard_normal((*batch, m, n)).astype(np.float32)}
    expected = without_epilogues(model, threads).run(None, feeds)[0]
    unfused = RuntimeSession(model, num_threads=threads, fuse=False).run(None, feeds)[0]
    if not small:
        assert expected.tobytes() == unfused.tobytes()
    for _ in range(2):
        (got,) = session.run(None, feeds)
        assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("case", ["kept sum", "two readers", "other axis", "mean output"])
def test_norms_that_do_not_fit_stay_steps(case):
    model = norm_model((4, 8), 6, bias=True, shift=True, residual_first=False)
    graph = model.graph
    if case == "kept sum":
        graph.output.append(helper.make_tensor_value_info("t", F, None))
    elif case == "two readers":
        graph.node.append(helper.make_node("Neg", ["t"], ["z"]))
        graph.output.append(helper.make_tensor_value_info("z", F, None))
    elif case == "other axis":
        graph.node[-1].attribute[0].i = 0
    else:
        graph.node[-1].output.append("mean")
        graph.output.append(helper.make_tensor_value_info("mean", F, None))
    session = RuntimeSession(model, num_threads=1)
    assert not fused_steps(session, MatMulAddNorm)
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((4, 8)).astype(np.float32),
             "r": rng.standard_normal((4, 6)).astype(np.float32)}
    plain = RuntimeSession(model, num_threads=1, fuse=False)
    for x, y in zip(session.run(None, feeds), plain.run(None, feeds), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_gelu_of_a_product_read_twice_stays_steps():
    model = gelu_model((4, 8), 6, "erf", bias=True, bias_first=False)
    model.graph.output.append(helper.make_tensor_value_info("p", F, None))
    assert not fused_steps(RuntimeSession(model, num_threads=1), MatMulGelu)


def test_run_takes_other_row_counts_and_falls_back_to_the_replaced_steps():
    """``run`` on other row counts than the plan's: the packed pass, the replaced steps' values
    bit for bit; W of another shape than the packed one: the replaced steps themselves."""
    model = norm_model((2, 4, 40), 48, bias=True, shift=True, residual_first=False)
    (step,) = fused_steps(RuntimeSession(model, num_threads=1), MatMulAddNorm)
    rng = np.random.default_rng(3)
    w = step.packed.weights()
    scale, shift = (numpy_helper.to_array(init) for init in model.graph.initializer[1:3])
    for rows in (1, 9):
        a = rng.standard_normal((rows, 40)).astype(np.float32)
        r = rng.standard_normal((rows, 48)).astype(np.float32)
        (expected,) = step.norm.run(step.product.run(a, w)[0] + r, scale, shift)  # packed, bias in
        assert step.run(a, w, r, scale, shift)[0].tobytes() == expected.tobytes()
    a, r, w2 = rng.standard_normal((3, 20)), rng.standard_normal((3, 48)), rng.standard_normal((20, 48))
    a, r, w2 = (x.astype(np.float32) for x in (a, r, w2))
    (expected,) = step.norm.run(a @ w2 + step.product.bias + r, scale, shift)
    np.testing.assert_allclose(step.run(a, w2, r, scale, shift)[0], expected, rtol=1e-4, atol=1e-4)


def test_arena_buffers_start_on_cache_lines():
    """The memory plan's numeric buffers start on 64-byte boundaries (a product's threads
    writing neighbouring columns then share no cache line where the rows are whole lines)."""
    plan = MemoryPlan(((((3, 5), np.dtype(np.float32))), ((7,), np.dtype(np.int64)),
                       ((2, 2), np.dtype(object))), {})
    buffers = plan.allocate()
    assert [b.shape for b in buffers] == [(3, 5), (7,), (2, 2)]
    assert all(b.ctypes.data % 64 == 0 and b.flags.c_contiguous and b.flags.writeable for b in buffers[:2])


def test_gelu_of_a_large_product_stays_steps():
    """Above ``GELU_EPILOGUE_MAXIMUM`` output elements the chain stays a step of its own."""
    n = 64
    rows = matmul_fusion.GELU_EPILOGUE_MAXIMUM // n
    for m, fused in ((rows, 1), (rows + 1, 0)):
        session = RuntimeSession(gelu_model((m, 8), n, "erf", bias=True, bias_first=False), num_threads=1)
        assert len(fused_steps(session, MatMulGelu)) == fused
