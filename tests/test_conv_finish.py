"""Conv's finishing pass (kernels/conv/finish.py): bias, residual and clamp in one compiled
pass, bitwise numpy's separate passes; and the sessions that use it against the unfused ones."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.conv.finish import Finish
from onnx_light.runtime import RuntimeSession

RNG = np.random.default_rng(5)


def _numpy_passes(block, bias, residual_block, clamp):
    if bias is not None:
        block += bias
    if residual_block is not None:
        block += residual_block
    if clamp is not None:
        np.maximum(block, block.dtype.type(clamp[0]), out=block)
        np.minimum(block, block.dtype.type(clamp[1]), out=block)


BLOCKS = {  # a view of out (2, 6, 5, 7) and whether it gets a bias per (axis 0, axis 1)
    "rows": (lambda o: o.reshape(2, 6, 35)[:, :, 7:28], True),
    "filters": (lambda o: o.reshape(2, 6, 35)[:, 2:5], True),
    "planes": (lambda o: o[1, 1:5], False),
    "whole": (lambda o: o, False),
    "columns": (lambda o: o[:, :, :, 2:6], False),  # last axis not the whole row: still one pass
    "strided": (lambda o: o[:, :, :, ::2], False),  # numpy's passes
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("view", list(BLOCKS))
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("clamp", [None, (0.0, math.inf), (-0.5, 0.75)])
def test_finish_equals_numpys_passes_bitwise(dtype, view, residual, clamp):
    select, with_bias = BLOCKS[view]
    out = RNG.standard_normal((2, 6, 5, 7)).astype(dtype)
    out.reshape(-1)[:4] = [np.nan, -0.0, np.inf, -np.inf]
    expected = out.copy()
    flat = RNG.standard_normal(out.size).astype(dtype) if residual else None
    block, block_expected = select(out), select(expected)
    bias = RNG.standard_normal((*block.shape[:2], 1)).astype(dtype) if with_bias else None
    epilogue = None
    if clamp is not None:
        def epilogue(b, low=clamp[0], high=clamp[1]):
            np.maximum(b, b.dtype.type(low), out=b)
            np.minimum(b, b.dtype.type(high), out=b)
    Finish(out, flat, epilogue, clamp)(block, bias)
    residual_block = None
    if flat is not None:
        offset = (block_expected.__array_interface__["data"][0]
                  - expected.__array_interface__["data"][0]) // expected.itemsize
        residual_block = np.lib.stride_tricks.as_strided(flat[offset:], block_expected.shape,
                                                         block_expected.strides)
    with np.errstate(invalid="ignore"):
        _numpy_passes(block_expected, bias, residual_block, clamp)
    np.testing.assert_array_equal(out, expected)  # and nothing outside the block changed


def _conv_graph(activation_nodes, residual, x_shape=(1, 8, 9, 9), filters=8, kernel=1, opset=17):
    w = RNG.uniform(-1, 1, (filters, x_shape[1], kernel, kernel)).astype(np.float32)
    init = [numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(RNG.uniform(-1, 1, filters).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[kernel // 2] * 4)]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "x"], ["a"]))
        last = "a"
    for i, (op, extra_inputs, attributes) in enumerate(activation_nodes):
        nodes.append(helper.make_node(op, [last, *extra_inputs], [f"act{i}"], **attributes))
        last = f"act{i}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    float32 = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", float32, list(x_shape))],
                              [helper.make_tensor_value_info("y", float32, None)], initializer=init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


CLAMPS = {"relu": ([("Relu", [], {})], 17),
          "clip_attributes": ([("Clip", [], {"min": -0.3, "max": 0.4})], 10),
          "clip_inputs": ([("Clip", ["lo", "hi"], {})], 17), "clip_low": ([("Clip", ["lo"], {})], 17)}


@pytest.mark.parametrize("case", list(CLAMPS))
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_with_clamp_and_residual_equals_the_unfused_session_bitwise(case, residual, kernel, threads):
    activations, opset = CLAMPS[case]
    model = _conv_graph(activations, residual, kernel=kernel, opset=opset)
    model.graph.initializer.extend([numpy_helper.from_array(np.array(-0.25, np.float32), "lo"),
                                    numpy_helper.from_array(np.array(0.5, np.float32), "hi")])
    fused = RuntimeSession(model, num_threads=threads)
    plain = RuntimeSession(model, num_threads=threads, fuse=False)
    conv = next(step.run.__self__ for step in fused._plan if step.run.__self__.ctx.op_type == "Conv")
    assert conv.clamp is not None and conv.residual == residual
    x = RNG.standard_normal((1, 8, 9, 9)).astype(np.float32) * 2
    x[0, 0, 0, :3] = [np.nan, -0.0, np.inf]
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("source_layout", ["wide", "strided"])
def test_finish_copy_from_a_wide_product_equals_numpys_passes(dtype, residual, bias, source_layout):
    """The wide algorithms' write: the kept columns of a wider product plus the bias, the
    residual and the clamp, into rows of the output (the strided source takes numpy's passes)."""
    out = RNG.standard_normal((2, 6, 5, 7)).astype(dtype)
    expected = out.copy()
    wide = RNG.standard_normal((2, 4, 3, 9 if source_layout == "wide" else 14)).astype(dtype)
    wide.reshape(-1)[:3] = [np.nan, -0.0, np.inf]
    source = wide[..., :7] if source_layout == "wide" else wide[..., ::2]
    flat = RNG.standard_normal(out.size).astype(dtype) if residual else None
    b = RNG.standard_normal((2, 4, 1, 1)).astype(dtype) if bias else None
    clamp = (-0.5, 1.5)
    finish = Finish(out, flat, lambda block: None, clamp)
    finish.copy(out[:, 1:5, 2:5], source, b)
    target = expected[:, 1:5, 2:5]
    with np.errstate(invalid="ignore"):
        if b is None:
            np.copyto(target, source)
        else:
            np.add(source, b, out=target)
        if flat is not None:
            offset = (target.__array_interface__["data"][0]
                      - expected.__array_interface__["data"][0]) // expected.itemsize
            target += np.lib.stride_tricks.as_strided(flat[offset:], target.shape, target.strides)
        np.maximum(target, dtype(clamp[0]), out=target)
        np.minimum(target, dtype(clamp[1]), out=target)
    np.testing.assert_array_equal(out, expected)
