"""Sibling products of one input made one (runtime/sibling_fusion.py) against the unfused
graph: bit for bit (both run the packed product)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels import packed_gemm
from onnx_light.kernels.gemm import MatMulKernel
from onnx_light.runtime import RuntimeSession

F = TensorProto.FLOAT

pytestmark = pytest.mark.skipif(not packed_gemm.available(),
                                reason="the packed product needs AVX2 and FMA or AVX-512F")


def model(m, k, widths, *, bias=True, output_sibling=None, variable_b=None, batch=(1,)):
    """A (batch..., m, k) times each constant (k, n_i) weight (plus a bias, then Relu as
    the consumer); sibling ``output_sibling`` is a graph output itself, sibling ``variable_b``
    reads its B from a graph input."""
    rng = np.random.default_rng(0)
    inits, nodes, outputs = [], [], []
    inputs = [helper.make_tensor_value_info("a", F, [*batch, m, k])]
    for i, n in enumerate(widths):
        w = rng.standard_normal((k, n)).astype(np.float32)
        if i == variable_b:
            inputs.append(helper.make_tensor_value_info(f"w{i}", F, [k, n]))
        else:
            inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", ["a", f"w{i}"], [f"p{i}"]))
        last = f"p{i}"
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"b{i}"))
            nodes.append(helper.make_node("Add", [last, f"b{i}"], [f"s{i}"]))
            last = f"s{i}"
        if i == output_sibling:
            outputs.append(helper.make_tensor_value_info(last, F, None))
        else:
            nodes.append(helper.make_node("Neg", [last], [f"y{i}"]))
            outputs.append(helper.make_tensor_value_info(f"y{i}", F, None))
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def split_products(session):
    return [kernel for kernel, _, _ in session._steps if isinstance(kernel, MatMulKernel) and kernel.split]


def check(model_proto, feeds, threads=1):
    session = RuntimeSession(model_proto, num_threads=threads)
    plain = RuntimeSession(model_proto, num_threads=threads, fuse=False)
    for _ in range(2):  # the second run writes into the memory plan's buffers
        got, expected = session.run(None, feeds), plain.run(None, feeds)
        for x, y in zip(got, expected, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes()
        assert not any(np.shares_memory(x, y) for i, x in enumerate(got) for y in got[i + 1:])
    return session, got


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 70),
       widths=st.lists(st.integers(1, 80), min_size=2, max_size=4),
       bias=st.booleans(), threads=st.sampled_from([1, 2]))
def test_siblings_fuse_bit_for_bit(m, k, widths, bias, threads):
    a = np.random.default_rng(1).standard_normal((1, m, k)).astype(np.float32)
    session, _ = check(model(m, k, widths, bias=bias), {"a": a}, threads)
    (fused,) = split_products(session)
    assert fused.split == tuple(widths)
    assert (fused.bias is not None) == bias


def test_nan_and_infinity_propagate():
    a = np.random.default_rng(2).standard_normal((2, 8, 16)).astype(np.float32)
    a[0, 1, 3], a[1, 2, 0] = np.nan, np.inf
    session, got = check(model(8, 16, [24, 24, 24], batch=(2,)), {"a": a})
    assert len(split_products(session)) == 1
    for y in got:
        assert np.isnan(y[0, 1]).all() and not np.isfinite(y[1, 2]).all()


def test_graph_output_sibling_stays_apart():
    """A sibling that is a graph output is not a view of the fused product; the others fuse."""
    a = np.random.default_rng(3).standard_normal((1, 10, 32)).astype(np.float32)
    session, got = check(model(10, 32, [16, 16, 16], output_sibling=1), {"a": a})
    (fused,) = split_products(session)
    assert fused.split == (16, 16)
    assert got[1].flags.c_contiguous


def test_variable_weights_not_fused():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((1, 6, 12)).astype(np.float32)
    w = rng.standard_normal((12, 20)).astype(np.float32)
    session, _ = check(model(6, 12, [20, 20], variable_b=0), {"a": a, "w0": w})
    assert not split_products(session)
    session, _ = check(model(6, 12, [20, 20, 20], variable_b=2), {"a": a, "w2": w})
    assert [k.split for k in split_products(session)] == [(20, 20)]


def test_mixed_bias_groups_apart():
    """Siblings with a bias and without one fuse in separate groups (no zero bias added)."""
    m = model(5, 16, [32, 32], bias=True)
    extra = model(5, 16, [32, 32], bias=False)
    for node in extra.graph.node:
        for names in (node.input, node.output):
            for i, name in enumerate(names):
                if name != "a":
                    names[i] = "x" + name
    m.graph.node.extend(extra.graph.node)
    for value in (*extra.graph.initializer, *extra.graph.output):
        value.name = "x" + value.name
    m.graph.initializer.extend(extra.graph.initializer)
    m.graph.output.extend(extra.graph.output)
    a = np.random.default_rng(5).standard_normal((1, 5, 16)).astype(np.float32)
    session, _ = check(m, {"a": a})
    assert sorted(k.bias is not None for k in split_products(session)) == [False, True]


def test_fed_weights_take_the_unfused_plan():
    """An initializer that is also a graph input and that a run feeds: the run takes the plan
    without the fused product (whose weights side by side hold the initializer's value)."""
    m = model(6, 24, [16, 16, 16])
    m.graph.input.append(helper.make_tensor_value_info("w1", F, [24, 16]))
    rng = np.random.default_rng(6)
    a = rng.standard_normal((1, 6, 24)).astype(np.float32)
    w1 = rng.standard_normal((24, 16)).astype(np.float32)
    session, plain = RuntimeSession(m), RuntimeSession(m, fuse=False)
    assert len(split_products(session)) == 1
    for feeds in ({"a": a, "w1": w1}, {"a": a}, {"a": a, "w1": w1}):
        got, expected = session.run(None, feeds), plain.run(None, feeds)
        assert all(x.tobytes() == y.tobytes() for x, y in zip(got, expected, strict=True))
    assert not np.array_equal(session.run(None, {"a": a, "w1": w1})[1], session.run(None, {"a": a})[1])
