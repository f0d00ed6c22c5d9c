"""RMSNorm written out (runtime/rmsnorm_fusion.py) against the unfused graph."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.feature_normalization import RMSNormalization
from onnx_light.runtime import RuntimeSession

F = TensorProto.FLOAT
# The step rounds x / sqrt(mean(x^2) + eps) * w once; the graph after each of six nodes.
RTOL, ATOL = 4e-7, 1e-7


def rms_model(shape, *, casts=True, reciprocal=False, swap=False, opset=17, axis=-1,
              weight_size=None, keep=None, residual=False):
    """LLaMA's RMSNorm as PyTorch exports it, on x of ``shape``."""
    rng = np.random.default_rng(0)
    size = shape[-1] if weight_size is None else weight_size
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, size).astype(np.float32), "w")]
    nodes = []
    x = "x"
    if casts:
        nodes.append(helper.make_node("Cast", ["x"], ["xc"], to=F))
        x = "xc"
    nodes.append(helper.make_node("Pow", [x, "two"], ["p"]))
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array([axis], np.int64), "axes"))
        nodes.append(helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1))
    else:
        nodes.append(helper.make_node("ReduceMean", ["p"], ["m"], axes=[axis], keepdims=1))
    nodes += [helper.make_node("Add", ["eps", "m"] if swap else ["m", "eps"], ["a"]),
              helper.make_node("Sqrt", ["a"], ["s"])]
    nodes.append(helper.make_node("Reciprocal", ["s"], ["r"]) if reciprocal
                 else helper.make_node("Div", ["one", "s"], ["r"]))
    nodes.append(helper.make_node("Mul", ["r", x] if swap else [x, "r"], ["y"]))
    y = "y"
    if casts:
        nodes.append(helper.make_node("Cast", ["y"], ["yc"], to=F))
        y = "yc"
    nodes.append(helper.make_node("Mul", [y, "w"] if swap else ["w", y], ["out"]))
    outputs = ["out"] + ([keep] if keep else [])
    if residual:  # X read outside the pattern too
        nodes.append(helper.make_node("Add", [x, "out"], ["sum"]))
        outputs = ["sum"]
    graph = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info("x", F, list(shape))],
                              [helper.make_tensor_value_info(n, F, None) for n in outputs], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(model, fused_nodes, shape, rms=True):
    x = (np.random.default_rng(1).standard_normal(shape) * 3).astype(np.float32)
    session = RuntimeSession(model)
    plain = RuntimeSession(model, fuse=False)
    assert session.fused_nodes == fused_nodes
    kernels = [getattr(step.run, "__self__", None) for step in session._plan]
    assert sum(isinstance(k, RMSNormalization) for k in kernels) == rms
    for got, expected in zip(session.run(None, {"x": x}), plain.run(None, {"x": x}), strict=True):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("casts", [True, False])
@pytest.mark.parametrize("reciprocal", [True, False])
@pytest.mark.parametrize("swap", [True, False])
@pytest.mark.parametrize("opset", [17, 18])
def test_fused_against_unfused(casts, reciprocal, swap, opset):
    shape = (2, 5, 37)
    check(rms_model(shape, casts=casts, reciprocal=reciprocal, swap=swap, opset=opset),
          fused_nodes=(9 if casts else 7) - 1, shape=shape)


def test_x_read_elsewhere_loses_its_identity_cast_all_the_same():
    shape = (3, 16)
    # the second Cast fused, the first dropped as an identity (runtime/identity_casts.py)
    check(rms_model(shape, residual=True), fused_nodes=8, shape=shape)


@pytest.mark.parametrize("case", ["axis", "kept", "weight"])
def test_refused(case):
    """Not the last axis; an intermediate value that is a graph output; a weight that is not
    one value per element of the last axis."""
    shape = (4, 6)
    model = {"axis": lambda: rms_model(shape, axis=0, weight_size=6),
             "kept": lambda: rms_model(shape, keep="s"),
             "weight": lambda: rms_model(shape, weight_size=1)}[case]()
    check(model, fused_nodes=2, shape=shape, rms=False)  # the identity Casts only


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=4), data=st.data(),
       one_scale=st.booleans())
def test_prepared_step_gives_run_bits(shape, data, one_scale):
    """An RMSNormalization step with fixed float32 specs is prepared (its compiled rows into
    the memory plan's buffer) and gives :meth:`RMSNormalization.run`'s values bit for bit."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    normalized = shape[axis % len(shape):]
    rng = np.random.default_rng(2)
    w = rng.uniform(0.5, 1.5, 1 if one_scale else normalized).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("RMSNormalization", ["x", "w"], ["y"], axis=axis, epsilon=1e-5),
         helper.make_node("Neg", ["y"], ["z"])], "rms",
        [helper.make_tensor_value_info("x", F, shape)], [helper.make_tensor_value_info("z", F, None)],
        initializer=[numpy_helper.from_array(w, "w")])
    session = RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))
    (step,) = [item for item in session._plan if item.op_type == "RMSNormalization"]
    assert step.prepared is not None
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    (expected,) = step.run(x, w)
    for _ in range(2):  # the second run writes into the memory plan's buffers
        (got,) = session.run(None, {"x": x})
        assert got.tobytes() == np.negative(expected).tobytes()
