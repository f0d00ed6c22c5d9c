"""The gated pair of a LLaMA-style MLP, ``Mul(SiLU(A @ Wg), A @ Wu)``, made one GatedMatMul
step (runtime/sibling_fusion.py, kernels/gated_matmul.py): bit for bit the steps it replaces
(the packed products, the fused Swish and the Mul), within the Swish's bound of the unfused
graph, the same bits at one and two threads."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels import gated_matmul, packed_gemm
from onnx_light.kernels.compiled_activations import in_place
from onnx_light.kernels.gated_matmul import GatedMatMul
from onnx_light.runtime import RuntimeSession, sibling_fusion

F = TensorProto.FLOAT
EPS = float(np.finfo(np.float32).eps)

pytestmark = pytest.mark.skipif(not packed_gemm.available(),
                                reason="the packed product needs AVX2 and FMA or AVX-512F")


def model(m, k, n, *, batch=(1,), bias=False, swapped=False, up_n=None, gate_read=False,
          fed=False):
    """``Neg(Mul(G * Sigmoid(G), U))`` with G = A Wg (+ bg), U = A Wu (+ bu); ``swapped``
    writes each Mul's operands the other way round; ``up_n`` gives Wu another width;
    ``gate_read``: G is a graph output too; ``fed``: Wg is also a graph input."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "wg"),
             numpy_helper.from_array(rng.standard_normal((k, up_n or n)).astype(np.float32), "wu")]
    nodes = [helper.make_node("MatMul", ["a", "wg"], ["pg"]), helper.make_node("MatMul", ["a", "wu"], ["pu"])]
    gate, up = "pg", "pu"
    if bias:
        for name, width in (("g", n), ("u", up_n or n)):
            inits.append(numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), f"b{name}"))
            nodes.append(helper.make_node("Add", [f"p{name}", f"b{name}"], [f"s{name}"]))
        gate, up = "sg", "su"
    pair = [gate, "sig"]
    nodes += [helper.make_node("Sigmoid", [gate], ["sig"]),
              helper.make_node("Mul", pair[::-1] if swapped else pair, ["act"]),
              helper.make_node("Mul", ["act", up][::-1] if swapped else ["act", up], ["h"]),
              helper.make_node("Neg", ["h"], ["y"])]
    inputs = [helper.make_tensor_value_info("a", F, [*batch, m, k])]
    if fed:
        inputs.append(helper.make_tensor_value_info("wg", F, [k, n]))
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if gate_read:
        outputs.append(helper.make_tensor_value_info(gate, F, None))
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gated_steps(session):
    return [kernel for kernel, _, _ in session._steps if isinstance(kernel, GatedMatMul)]


def sessions(model_proto, threads=1):
    """The session, the same without the gated fusion (the packed products, the fused Swish
    and the Mul as separate steps) and the unfused graph."""
    fused = RuntimeSession(model_proto, num_threads=threads)
    with mock.patch.object(sibling_fusion, "_fuse_gated", lambda steps, *args: list(steps)):
        apart = RuntimeSession(model_proto, num_threads=threads)
    return fused, apart, RuntimeSession(model_proto, num_threads=threads, fuse=False)


def check(model_proto, feeds, threads=1):
    """Each run (the second writes into the memory plan's buffers) bit for bit the session
    without the gated fusion, and within the Swish's bound (4 units of the sigmoid, two
    roundings) of the unfused graph, whose products are the same packed sums."""
    fused, apart, plain = sessions(model_proto, threads)
    for _ in range(2):
        got, expected, reference = fused.run(None, feeds), apart.run(None, feeds), plain.run(None, feeds)
        for x, y, z in zip(got, expected, reference, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes()
            finite = np.isfinite(z)
            assert np.array_equal(np.isnan(x), np.isnan(z))
            assert np.all(np.abs(x[finite] - z[finite]) <= 8 * EPS * np.abs(z[finite]) + 1e-30)
        assert not any(np.shares_memory(x, v) for x in got for v in feeds.values())
    return fused, got


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 30), k=st.integers(1, 70), n=st.integers(1, 90), bias=st.booleans(),
       swapped=st.booleans(), batch=st.sampled_from([(1,), (2,), (2, 3)]), threads=st.sampled_from([1, 2]))
def test_gated_pair_fuses_bit_for_bit(m, k, n, bias, swapped, batch, threads):
    a = (np.random.default_rng(1).standard_normal((*batch, m, k)) * 3).astype(np.float32)
    session, _ = check(model(m, k, n, batch=batch, bias=bias, swapped=swapped), {"a": a}, threads)
    (step,) = gated_steps(session)
    assert step._packed is not None


@settings(max_examples=15, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 60), n=st.integers(1, 100), bias=st.booleans())
def test_same_bits_on_two_threads(m, k, n, bias):
    """The parallel pass (forced here below its threshold) gives the serial pass's bits."""
    session, _, _ = sessions(model(m, k, n, bias=bias), threads=2)
    (step,) = gated_steps(session)
    a = np.random.default_rng(2).standard_normal((m, k)).astype(np.float32)
    one, two = np.empty((m, n), np.float32), np.full((m, n), np.nan, np.float32)
    step._compute(a, one, threads=1)
    step._compute(a, two, threads=2)
    assert one.tobytes() == two.tobytes()


def test_nan_and_infinity_propagate():
    a = np.random.default_rng(3).standard_normal((1, 8, 16)).astype(np.float32)
    a[0, 1, 3], a[0, 2, 0], a[0, 5, 5] = np.nan, np.inf, -np.inf
    session, (y,) = check(model(8, 16, 40), {"a": a})
    assert len(gated_steps(session)) == 1
    assert np.isnan(y[0, 1]).all()


@pytest.mark.parametrize("change", [{"up_n": 1}, {"gate_read": True}])
def test_not_fused(change):
    """Weights of different widths (up broadcast along the columns), or a gate that
    something else reads, stay apart."""
    a = np.random.default_rng(4).standard_normal((1, 6, 12)).astype(np.float32)
    session = RuntimeSession(model(6, 12, 20, **change))
    assert not gated_steps(session)
    expected = RuntimeSession(model(6, 12, 20, **change), fuse=False).run(None, {"a": a})
    got = session.run(None, {"a": a})
    assert all(np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(got, expected, strict=True))


def test_fed_weights_take_the_unfused_plan():
    """Wg fed by a run: the plan without the fused step (the released weights rebuilt from
    the interleaved panels for it), and the default again after."""
    m = model(6, 24, 40, fed=True)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((1, 6, 24)).astype(np.float32)
    wg = rng.standard_normal((24, 40)).astype(np.float32)
    session, apart, _ = sessions(m)
    assert len(gated_steps(session)) == 1
    for feeds in ({"a": a, "wg": wg}, {"a": a}, {"a": a, "wg": wg}):
        got, expected = session.run(None, feeds), apart.run(None, feeds)
        assert all(x.tobytes() == y.tobytes() for x, y in zip(got, expected, strict=True))
    (step,) = gated_steps(session)
    initial = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for position, name in ((1, "wg"), (2, "wu")):
        assert step.packed_input(position)().tobytes() == initial[name].tobytes()


def test_other_shapes_run_the_products_apart():
    """Inputs the packed weights do not fit (another K) take the products' own kernels."""
    session, _, _ = sessions(model(4, 8, 16))
    (step,) = gated_steps(session)
    rng = np.random.default_rng(6)
    a, wg, wu = (rng.standard_normal(s).astype(np.float32) for s in ((3, 5), (5, 7), (5, 7)))
    (y,) = step.run(a, wg, wu)
    g = a @ wg
    expected = g / (1 + np.exp(-g)) * (a @ wu)
    assert np.allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_products_bound_to_the_sessions_pool():
    """The step's products run on the session's pool (its threads decide the parallel pass)."""
    session, _, _ = sessions(model(4, 8, 16), threads=2)
    (step,) = gated_steps(session)
    assert step.gate.num_threads == step.up.num_threads == 2


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 20), k=st.integers(1, 40), n=st.integers(1, 70), bias=st.booleans(),
       alpha=st.sampled_from([1.0, 1.702, 0.5]))
def test_epilogue_is_the_in_place_swish_then_the_product(m, k, n, bias, alpha):
    """The pass's epilogue (one vectorized loop per pair of panels) gives the bits of the
    packed products, the in-place Swish epilogue with the same alpha and the Mul."""
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    wg, wu = (rng.standard_normal((k, n)).astype(np.float32) for _ in range(2))
    bg, bu = ((rng.standard_normal(n).astype(np.float32) for _ in range(2)) if bias else (None, None))
    columns = packed_gemm.geometry().columns
    both = packed_gemm.PackedWeights(gated_matmul._interleaved(wg, wu, columns),
                                     None if bg is None else gated_matmul._interleaved(bg, bu, columns))
    out = np.empty((m, n), np.float32)
    gated_matmul.gated_rows(a, both.panels, both.layout, both.bias, both.with_bias, out, both.block, n,
                            np.float32(alpha))
    gate = packed_gemm.PackedWeights(wg, bg).multiply(a)
    in_place("Swish", {"alpha": alpha}, lambda block: None)(gate)
    assert out.tobytes() == (gate * packed_gemm.PackedWeights(wu, bu).multiply(a)).tobytes()
