"""Conv's ``im2col_units`` (onnx_light/kernels/conv/im2col_units.py: 1-D im2col in one compiled
call, units of output columns each copied, multiplied by numpy's BLAS and finished) against
the ONNX reference within the bound of ``onnx_light.kernels.conv.numerics``, on random 1-D
shapes (strides, dilations, pads, images, unit widths), in float32 and float64, with fused
epilogues, at one and two threads (the same bits: the units depend on the shape alone)."""

from __future__ import annotations

import numpy as np
import pytest
from conv_epilogues import assert_fused_epilogue_matches
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import conv
from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.blas_tiles import gemm_function
from onnx_light.kernels.conv.im2col_units import unit_columns
from onnx_light.parallel import ThreadPool

pytestmark = pytest.mark.skipif(gemm_function(np.dtype(np.float32)) is None,
                                reason="numpy's BLAS is not reachable from compiled code")
T = TensorProto
TYPES = {np.float32: T.FLOAT, np.float64: T.DOUBLE}


@pytest.fixture(scope="module")
def pools():
    with ThreadPool(1) as one, ThreadPool(2) as two:
        yield {1: one, 2: two}


def _kernel(attributes, pool, columns, dtype=np.float32):
    element = TYPES[dtype]
    ctx = NodeContext("conv1d", "Conv", "", 22, attributes, (element,) * 3, (element,), 3, 1)
    kernel = conv.ConvKernel(ctx).bind(pool)
    kernel.configure({conv.ALGORITHM: "im2col_units", conv.UNITS_COLUMNS: columns, conv.REGION_FLOPS: 1})
    return kernel


def _reference(x, w, b, attributes):
    element = TYPES[x.dtype.type]
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attributes)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info(n, element, None)
                                               for n in ("x", "w", "b")],
                              [helper.make_tensor_value_info("y", element, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    return ReferenceEvaluator(model).run(None, {"x": x, "w": w, "b": b})[0]


def test_unit_columns_are_equal_multiples_of_16():
    assert unit_columns(1599, 256) == 240  # 7 units
    assert unit_columns(399, 256) == 208  # 2 units
    assert unit_columns(199, 256) == 199  # one unit: the whole row
    assert unit_columns(50, 1) == 16
    assert unit_columns(3, 1 << 20) == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(images=st.integers(1, 2), channels=st.integers(1, 9), filters=st.integers(1, 12),
       kernel=st.integers(1, 7), stride=st.integers(1, 4), dilation=st.integers(1, 3),
       pads=st.tuples(st.integers(0, 4), st.integers(0, 4)), outputs=st.integers(1, 90),
       columns=st.sampled_from([1, 16, 40, 1 << 20]), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 2**16))
def test_matches_the_reference_evaluator(pools, images, channels, filters, kernel, stride, dilation,
                                         pads, outputs, columns, dtype, seed):
    """Within the bound; the same bits on one and two threads."""
    length = max(1, (outputs - 1) * stride + (kernel - 1) * dilation + 1 - sum(pads))
    attributes = {"strides": [stride], "pads": list(pads), "dilations": [dilation]}
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (images, channels, length)).astype(dtype)
    w = rng.uniform(-1, 1, (filters, channels, kernel)).astype(dtype)
    b = rng.uniform(-1, 1, filters).astype(dtype)
    one = _kernel(attributes, pools[1], columns, dtype)
    assert one.problem(x.shape, w.shape).algorithm == "im2col_units"
    got = one.run(x, w, b)[0]
    assert got.dtype == dtype
    error = np.abs(got.astype(np.float64) - _reference(x, w, b, attributes))
    assert np.all(error <= conv.error_bound(x, w, b, **attributes))
    two = _kernel(attributes, pools[2], columns, dtype)
    assert two.problem(x.shape, w.shape).plan == "region"
    np.testing.assert_array_equal(two.run(x, w, b)[0], got)


def test_auto_takes_it_only_where_asked(pools):
    """``auto`` computes 1-D convolutions of one group with ``im2col_units`` where
    ``im2col_units.columns`` is not 0 (the portable 0: im2col), never grouped ones."""
    ctx = NodeContext("conv1d", "Conv", "", 22, {"strides": [2]}, (T.FLOAT,) * 3, (T.FLOAT,), 3, 1)
    kernel = conv.ConvKernel(ctx).bind(pools[1])
    kernel.configure({})
    assert kernel.problem((1, 128, 799), (128, 128, 3)).algorithm == "im2col"
    kernel.configure({conv.UNITS_COLUMNS: 256})
    assert kernel.problem((1, 128, 799), (128, 128, 3)).algorithm == "im2col_units"
    grouped = conv.ConvKernel(NodeContext("g", "Conv", "", 22, {"group": 2}, (T.FLOAT,) * 3,
                                          (T.FLOAT,), 3, 1)).bind(pools[1])
    grouped.configure({conv.UNITS_COLUMNS: 256})
    assert grouped.problem((1, 128, 99), (128, 64, 3)).algorithm == "im2col"


@pytest.mark.parametrize("epilogue", ["relu6", "HardSwish", "Swish", "residual"])
def test_fused_epilogues(pools, epilogue):
    """A clamp, a compiled activation or a residual Add then Relu finished in the units: what
    the plain convolution followed by the epilogue gives, bit for bit, at both thread counts."""
    rng = np.random.default_rng(13)
    attributes = {"strides": [2], "pads": [2, 1]}
    x = rng.uniform(-1, 1, (2, 6, 131)).astype(np.float32)
    w = rng.uniform(-1, 1, (13, 6, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 13).astype(np.float32)
    for threads in (1, 2):
        assert_fused_epilogue_matches(_kernel(attributes, pools[threads], 16), x, w, b, epilogue, rng)
