"""MatMul followed by the Add of a constant bias as one step (runtime/fusion.py, kernels/matmul_bias.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.matmul_bias import SMALL_WORK, MatMulBias
from onnx_light.runtime import RuntimeSession

DTYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}
# The fused loop sums in order, BLAS in its own order: a few units in the last place.
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}


def _linear(a_shape, n, dtype=np.float32, bias_shape=None, bias_first=False, layers=1, ir=8,
            output_product=False, seed=0):
    """``layers`` MatMul + Add(bias) pairs on A of ``a_shape``; W of (K, n) then (n, n)."""
    rng = np.random.default_rng(seed)
    element = DTYPES[dtype]
    initializers, nodes, previous, k = [], [], "a", a_shape[-1]
    for index in range(layers):
        w = rng.uniform(-1, 1, (k, n)).astype(dtype)
        bias = rng.uniform(-1, 1, bias_shape or (n,)).astype(dtype)
        initializers += [numpy_helper.from_array(w, f"w{index}"), numpy_helper.from_array(bias, f"b{index}")]
        product = f"p{index}"
        out = "y" if index == layers - 1 else f"h{index}"
        nodes.append(helper.make_node("MatMul", [previous, f"w{index}"], [product]))
        operands = [f"b{index}", product] if bias_first else [product, f"b{index}"]
        nodes.append(helper.make_node("Add", operands, [out]))
        previous, k = out, n
    inputs = [helper.make_tensor_value_info("a", element, list(a_shape))]
    if ir < 4:  # every initializer is also a graph input a feed may override
        inputs += [helper.make_tensor_value_info(t.name, element, list(t.dims)) for t in initializers]
    outputs = [helper.make_tensor_value_info("y", element, None)]
    if output_product:
        outputs.append(helper.make_tensor_value_info("p0", element, None))
    graph = helper.make_graph(nodes, "linear", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir
    return model


def _fused_steps(session):
    return [step for step in session._plan if isinstance(step.kernel, MatMulBias)]


def _compare(model, a, dtype, fused_steps):
    session, plain = RuntimeSession(model), RuntimeSession(model, fuse=False)
    assert len(_fused_steps(session)) == fused_steps
    assert not _fused_steps(plain)
    got, expected = session.run(None, {"a": a}), plain.run(None, {"a": a})
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    return session


@settings(deadline=None, derandomize=True, max_examples=25)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40), st.sampled_from([np.float32, np.float64]),
       st.sampled_from(["(n,)", "(1, n)"]), st.booleans(), st.integers(1, 3))
def test_fused_equals_unfused_over_shapes(m, k, n, dtype, bias_shape, bias_first, layers):
    # a product of at most SMALL_WORK multiply-adds (each layer's) runs as one compiled loop
    model = _linear((m, k), n, dtype, eval(bias_shape), bias_first, layers)
    a = np.random.default_rng(1).uniform(-1, 1, (m, k)).astype(dtype)
    small = sum(m * (k if layer == 0 else n) * n <= SMALL_WORK for layer in range(layers))
    _compare(model, a, dtype, fused_steps=small)


def test_larger_or_batched_products_keep_their_steps():
    for a_shape, n in (((64, 64), 64), ((2, 3, 5), 4)):
        model = _linear(a_shape, n, bias_shape=(1,) * (len(a_shape) - 1) + (n,))
        a = np.random.default_rng(2).standard_normal(a_shape).astype(np.float32)
        _compare(model, a, np.float32, fused_steps=0)


@pytest.mark.parametrize("shape", [(3, 7, 5), (40, 30, 20)])  # the compiled loop, MatMul + add
def test_the_run_and_the_prepared_step_agree_bit_for_bit(shape):
    m, k, n = shape
    model = _linear((m, k), n)
    matmul = RuntimeSession(model, fuse=False)._plan[0].kernel
    bias = numpy_helper.to_array(model.graph.initializer[1])
    kernel = MatMulBias(dataclasses.replace(matmul.ctx, op_type="MatMulBias"), matmul, bias)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = numpy_helper.to_array(model.graph.initializer[0])
    prepared = kernel.prepare([((m, k), np.dtype(np.float32)), ((k, n), np.dtype(np.float32))])
    assert (prepared.compute.__name__ == "compute_small") == (m * k * n <= SMALL_WORK)
    out = np.empty((m, n), np.float32)
    prepared.compute(a, w, out=out)
    got = kernel.run(a, w)[0]
    np.testing.assert_array_equal(out, got)
    np.testing.assert_allclose(got, a @ w + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["bias grows the output", "bias per row", "product returned",
                                  "bias fed", "integer"])
def test_additions_that_are_not_a_bias_stay_steps(case):
    a = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    feeds = {"a": a}
    if case == "bias grows the output":
        model = _linear((3, 4), 5, bias_shape=(2, 1, 5))
    elif case == "bias per row":
        model = _linear((3, 4), 5, bias_shape=(3, 1))
    elif case == "product returned":
        model = _linear((3, 4), 5, output_product=True)
    elif case == "bias fed":
        model = _linear((3, 4), 5)
        bias = model.graph.initializer.pop()
        model.graph.input.append(helper.make_tensor_value_info(bias.name, TensorProto.FLOAT, list(bias.dims)))
        feeds[bias.name] = numpy_helper.to_array(bias)
    else:
        model = _linear((3, 4), 5)
        for tensor in model.graph.initializer:
            values = numpy_helper.to_array(tensor).astype(np.int64)
            tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
        model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
        feeds["a"] = np.arange(12, dtype=np.int64).reshape(3, 4)
    session, plain = RuntimeSession(model), RuntimeSession(model, fuse=False)
    assert not _fused_steps(session)
    for got, expected in zip(session.run(None, feeds), plain.run(None, feeds), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_overriding_the_bias_takes_the_unfused_plan():
    model = _linear((2, 6), 3, ir=3)
    session = RuntimeSession(model)
    assert _fused_steps(session)
    a = np.random.default_rng(5).standard_normal((2, 6)).astype(np.float32)
    w = numpy_helper.to_array(model.graph.initializer[0])
    bias = np.array([10.0, -20.0, 30.0], np.float32)
    (y,) = session.run(None, {"a": a, "b0": bias})
    np.testing.assert_allclose(y, a @ w + bias, rtol=1e-5, atol=1e-5)
