"""MatMul with its bias (runtime/matmul_fusion.py) against the unfused graph: bit for bit,
except small 2-D products, which become a MatMulBias loop (sums in written order)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnx_light
from onnx_light.kernels.gemm import MatMulKernel
from onnx_light.kernels.matmul_bias import SMALL_WORK, MatMulAdd, MatMulBias
from onnx_light.runtime import RuntimeSession

F, D = TensorProto.FLOAT, TensorProto.DOUBLE


def model(a_shape, w_shape, bias_shape, *, dtype=np.float32, bias_first=False, activation=None,
          keep_product=False):
    rng = np.random.default_rng(0)
    element = F if dtype == np.float32 else D
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(dtype), "w"),
             numpy_helper.from_array(rng.standard_normal(bias_shape).astype(dtype), "b")]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["p"]),
             helper.make_node("Add", ["b", "p"] if bias_first else ["p", "b"], ["s"])]
    last = "s"
    if activation:
        nodes.append(helper.make_node(activation, ["s"], ["y"]))
        last = "y"
    outputs = [helper.make_tensor_value_info(last, element, None)]
    if keep_product:
        outputs.append(helper.make_tensor_value_info("p", element, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", element, list(a_shape))],
                              outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def matmuls(session):
    return [step.run.__self__ for step in session._plan
            if isinstance(getattr(step.run, "__self__", None), MatMulKernel)]


def small_loops(session):
    return [step.run.__self__ for step in session._plan
            if isinstance(getattr(step.run, "__self__", None), MatMulBias)]


def check(m, a, fused_nodes, threads=1):
    """The fused session against the unfused one; bitwise unless the product is a MatMulBias
    loop, whose sums may round otherwise than BLAS's (a few units in the last place)."""
    session = RuntimeSession(m, num_threads=threads)
    plain = RuntimeSession(m, num_threads=threads, fuse=False)
    assert session.fused_nodes == fused_nodes
    exact = not small_loops(session)
    for _ in range(2):  # the second run writes into the memory plan's buffers
        got, expected = session.run(None, {"a": a}), plain.run(None, {"a": a})
        for x, y in zip(got, expected, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape
            if exact:
                assert x.tobytes() == y.tobytes()
            else:
                eps = np.finfo(x.dtype).eps
                np.testing.assert_allclose(x, y, rtol=8 * eps, atol=8 * eps)
    return session


@pytest.mark.parametrize(("a_shape", "bias_shape"), [
    ((5, 8), (6,)), ((5, 8), (1, 6)), ((2, 3, 8), (6,)), ((2, 3, 8), (1, 1, 6)),
    ((2, 2, 3, 8), (1, 6)), ((2, 2, 3, 8), (1, 1, 1, 6))])
@pytest.mark.parametrize("bias_first", [False, True])
def test_bias_rows_fuse(a_shape, bias_shape, bias_first):
    session = check(model(a_shape, (8, 6), bias_shape, bias_first=bias_first),
                    np.random.default_rng(1).standard_normal(a_shape).astype(np.float32), fused_nodes=1)
    if len(a_shape) == 2:  # a small 2-D product of constant weights: one compiled loop
        (loop,) = small_loops(session)
        assert loop.bias.shape == (6,) and not matmuls(session)
    else:
        (kernel,) = matmuls(session)
        assert kernel.bias is not None and kernel.bias.shape == (1, 6)


@pytest.mark.parametrize("threads", [1, 2])
def test_relu_after_the_bias_is_the_products_epilogue(threads):
    m = model((4, 96, 64), (64, 80), (80,), activation="Relu")
    session = check(m, np.random.default_rng(2).standard_normal((4, 96, 64)).astype(np.float32),
                    fused_nodes=2, threads=threads)
    (kernel,) = matmuls(session)
    assert kernel.bias is not None and kernel.epilogue is not None


def test_double():
    check(model((3, 8), (8, 6), (6,), dtype=np.float64), np.random.default_rng(3).standard_normal((3, 8)),
          fused_nodes=1)


@pytest.mark.parametrize("case", ["column", "matrix", "kept"])
def test_refused(case):
    """A bias per row (M, 1) or per element (M, N) is not a bias row; a product that is a
    graph output stays one."""
    bias_shape = {"column": (5, 1), "matrix": (5, 6), "kept": (6,)}[case]
    check(model((5, 8), (8, 6), bias_shape, keep_product=case == "kept"),
          np.random.default_rng(4).standard_normal((5, 8)).astype(np.float32), fused_nodes=0)


@pytest.mark.usefixtures("isolated_tuning")
def test_a_small_loop_is_tuned_as_its_matmul_node():
    """Values published for MatMul before the session is built configure the step's product
    (the path of the shapes the loop does not take) and show in the tuning report."""
    published = {"parallel.minimum_flops": 12345, "split.minimum_rows": 7}
    onnx_light.set_kernel_tuning_parameters("MatMul", "float", published, num_threads=2, persist=False)
    session = check(model((5, 8), (8, 6), (6,)),
                    np.random.default_rng(5).standard_normal((5, 8)).astype(np.float32),
                    fused_nodes=1, threads=2)
    (loop,) = small_loops(session)
    assert (loop.matmul.minimum_flops, loop.matmul.minimum_rows) == (12345, 7)
    (entry,) = session.tuning_report()
    assert entry["key"].startswith("onnx_light/MatMul/") and entry["source"] == "published_profile"
    assert {name: entry["values"][name] for name in published} == published


def residual_model(a_shape, n, *, bias=False, swap=False, r_shape=None, activation=None,
                   dtype=np.float32):
    """``Add(MatMul(A, W) [+ b], R)`` with R a graph input of the product's shape (or
    ``r_shape``), then ``activation``."""
    rng = np.random.default_rng(0)
    element = F if dtype == np.float32 else D
    k = a_shape[-1]
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(dtype), "w")]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["p"])]
    last = "p"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(dtype), "b"))
        nodes.append(helper.make_node("Add", ["p", "b"], ["s"]))
        last = "s"
    nodes.append(helper.make_node("Add", ["r", last] if swap else [last, "r"], ["sum"]))
    last = "sum"
    if activation:
        nodes.append(helper.make_node(activation, ["sum"], ["y"]))
        last = "y"
    inputs = [helper.make_tensor_value_info("a", element, list(a_shape)),
              helper.make_tensor_value_info("r", element, list(r_shape or (*a_shape[:-1], n)))]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(last, element, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def residual_steps(session):
    return [step.run.__self__ for step in session._plan
            if isinstance(getattr(step.run, "__self__", None), MatMulAdd)]


@settings(max_examples=25, deadline=None)
@given(batch=st.sampled_from([(), (1,), (2,), (2, 3)]), m=st.integers(1, 20), k=st.integers(1, 40),
       n=st.integers(1, 40), bias=st.booleans(), swap=st.booleans(),
       activation=st.sampled_from([None, "Relu"]), double=st.booleans(), threads=st.sampled_from([1, 2]))
def test_residual_add_fuses_bit_for_bit(batch, m, k, n, bias, swap, activation, double, threads):
    """The product (packed or BLAS), its bias, then R added in place: the unfused graph's
    bits, in both runs (the second into the memory plan's buffers); R is never written."""
    dtype = np.float64 if double else np.float32
    a_shape = (*batch, m, k)
    m_proto = residual_model(a_shape, n, bias=bias, swap=swap, activation=activation, dtype=dtype)
    rng = np.random.default_rng(1)
    feeds = {"a": rng.standard_normal(a_shape).astype(dtype),
             "r": rng.standard_normal((*batch, m, n)).astype(dtype)}
    kept = feeds["r"].copy()
    session = RuntimeSession(m_proto, num_threads=threads)
    plain = RuntimeSession(m_proto, num_threads=threads, fuse=False)
    small = len(a_shape) == 2 and bias and m * k * n <= SMALL_WORK  # a MatMulBias loop, not fused
    assert len(residual_steps(session)) == (0 if small else 1)
    for _ in range(2):
        (got,), (expected,) = session.run(None, feeds), plain.run(None, feeds)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        if small:
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        else:
            assert got.tobytes() == expected.tobytes()
        assert not np.shares_memory(got, feeds["r"]) and np.array_equal(feeds["r"], kept)


def test_broadcast_residual_not_fused():
    """An R that broadcasts to the product's shape (one row) stays a separate Add."""
    m_proto = residual_model((4, 8), 6, r_shape=(1, 6))
    rng = np.random.default_rng(2)
    feeds = {"a": rng.standard_normal((4, 8)).astype(np.float32),
             "r": rng.standard_normal((1, 6)).astype(np.float32)}
    session = RuntimeSession(m_proto)
    assert not residual_steps(session)
    expected = RuntimeSession(m_proto, fuse=False).run(None, feeds)[0]
    np.testing.assert_array_equal(session.run(None, feeds)[0], expected)


def test_residual_product_bound_to_the_sessions_pool():
    session = RuntimeSession(residual_model((2, 4, 8), 6), num_threads=2)
    (step,) = residual_steps(session)
    assert step.matmul.num_threads == 2
