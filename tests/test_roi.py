"""RoiAlign against ``onnx.reference.ReferenceEvaluator``; MaxRoiPool, which the reference
does not implement, against onnxruntime. RoiAlign sums the same weighted values in another
order (products instead of a loop): a few float32 ulps relative to the largest magnitude.
MaxRoiPool picks values, so it is exact.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.kernels.roi import MaxRoiPool, RoiAlign

T = TensorProto


def _model(op_type, inputs, attributes, opset):
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op_type, names, ["y"], **attributes)
    graph = helper.make_graph(
        [node], "one",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), None)
         for n, v in zip(names, inputs, strict=True)],
        [helper.make_tensor_value_info("y", T.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model, dict(zip(names, inputs, strict=True))


def _run(kernel_class, inputs, attributes, opset=22):
    types = tuple(helper.np_dtype_to_tensor_dtype(v.dtype) for v in inputs)
    ctx = NodeContext("roi", kernel_class.op_type, "", opset, attributes, types, (T.FLOAT,),
                      len(inputs), 1)
    return kernel_class(ctx).run(*inputs)[0]


def _rois(rng, count, height, width, columns):
    """ROIs partly outside the image, some of them inverted (x2 < x1)."""
    start = rng.uniform(-0.2, 0.8, (count, 2)) * [width, height]
    corners = np.concatenate([start, start + rng.uniform(-0.2, 1.0, (count, 2)) * [width, height]], axis=1)
    if columns == 5:
        return np.concatenate([rng.integers(0, 2, (count, 1)), corners], axis=1).astype(np.float32)
    return corners.astype(np.float32)


@settings(deadline=None, derandomize=True, max_examples=60)
@given(st.sampled_from(["avg", "max"]), st.sampled_from(["half_pixel", "output_half_pixel"]),
       st.integers(1, 3), st.integers(1, 3), st.integers(0, 3), st.sampled_from([1.0, 0.5, 0.25]),
       st.integers(1, 6), st.integers(1, 6), st.integers(0, 1000))
def test_roi_align_against_reference(mode, transform, out_h, out_w, ratio, scale, height, width, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (2, 3, height, width)).astype(np.float32)
    rois = _rois(rng, 4, height / scale, width / scale, 4)
    batches = rng.integers(0, 2, 4).astype(np.int64)
    attributes = {"mode": mode, "coordinate_transformation_mode": transform,
                  "output_height": out_h, "output_width": out_w, "sampling_ratio": ratio,
                  "spatial_scale": scale}
    inputs = [x, rois, batches]
    model, feeds = _model("RoiAlign", inputs, attributes, 16)
    expected = ReferenceEvaluator(model).run(None, feeds)[0]
    got = _run(RoiAlign, inputs, attributes)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=32 * np.finfo(np.float32).eps)


def test_roi_align_10_is_output_half_pixel():
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-1, 1, (1, 2, 5, 5)).astype(np.float32), _rois(rng, 3, 5, 5, 4),
              np.zeros(3, np.int64)]
    explicit = _run(RoiAlign, inputs, {"coordinate_transformation_mode": "output_half_pixel"})
    np.testing.assert_array_equal(_run(RoiAlign, inputs, {}, opset=10), explicit)
    assert not np.array_equal(_run(RoiAlign, inputs, {}, opset=16), explicit)


@settings(deadline=None, derandomize=True, max_examples=40)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([1.0, 0.5, 0.25]),
       st.integers(1, 6), st.integers(1, 6), st.integers(0, 1000))
def test_max_roi_pool_against_onnxruntime(pooled_h, pooled_w, scale, height, width, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (2, 3, height, width)).astype(np.float32)
    rois = _rois(rng, 4, height / scale, width / scale, 5)
    attributes = {"pooled_shape": [pooled_h, pooled_w], "spatial_scale": scale}
    model, feeds = _model("MaxRoiPool", [x, rois], attributes, 21)
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)[0]
    np.testing.assert_array_equal(_run(MaxRoiPool, [x, rois], attributes), expected)


def test_float16_computes_in_float32():
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (1, 2, 4, 4))
    rois = _rois(rng, 2, 4, 4, 4)
    batches = np.zeros(2, np.int64)
    got = _run(RoiAlign, [x.astype(np.float16), rois.astype(np.float16), batches], {})
    assert got.dtype == np.float16
    expected = _run(RoiAlign, [x.astype(np.float16).astype(np.float32),
                               rois.astype(np.float16).astype(np.float32), batches], {})
    np.testing.assert_array_equal(got, expected.astype(np.float16))


@pytest.mark.parametrize("kernel_class, attributes, message", [
    (RoiAlign, {"mode": "sum"}, "mode must be avg or max"),
    (RoiAlign, {"coordinate_transformation_mode": "align_corners"},
     "coordinate_transformation_mode must be half_pixel or output_half_pixel"),
    (RoiAlign, {"output_height": 0}, "output_height and output_width must be positive"),
    (RoiAlign, {"sampling_ratio": -1}, "sampling_ratio must not be negative"),
    (MaxRoiPool, {}, "pooled_shape must be two positive sizes, got None"),
    (MaxRoiPool, {"pooled_shape": [2, 0]}, "pooled_shape must be two positive sizes"),
])
def test_bad_attributes_name_the_node(kernel_class, attributes, message):
    ctx = NodeContext("roi", kernel_class.op_type, "", 22, attributes, (T.FLOAT, T.FLOAT), (T.FLOAT,), 2, 1)
    with pytest.raises(KernelError, match=f"node 'roi' \\({kernel_class.op_type}\\): {message}"):
        kernel_class(ctx)


X = np.zeros((2, 1, 3, 3), np.float32)


@pytest.mark.parametrize("kernel_class, attributes, inputs, message", [
    (RoiAlign, {}, [X[0], np.zeros((1, 4), np.float32), np.zeros(1, np.int64)],
     r"X must have shape \(N, C, H, W\)"),
    (RoiAlign, {}, [X, np.zeros((1, 5), np.float32), np.zeros(1, np.int64)],
     r"rois must have shape \(num_rois, 4\)"),
    (RoiAlign, {}, [X, np.zeros((2, 4), np.float32), np.zeros(1, np.int64)],
     r"batch_indices must hold one index per ROI \(2\)"),
    (RoiAlign, {}, [X, np.zeros((1, 4), np.float32), np.full(1, 2, np.int64)],
     r"batch indices must be in \[0, 2\)"),
    (MaxRoiPool, {"pooled_shape": [1, 1]}, [X, np.zeros((1, 4), np.float32)],
     r"rois must have shape \(num_rois, 5\)"),
    (MaxRoiPool, {"pooled_shape": [1, 1]}, [X, np.array([[-1, 0, 0, 1, 1]], np.float32)],
     r"batch indices must be in \[0, 2\)"),
])
def test_bad_inputs_name_the_node(kernel_class, attributes, inputs, message):
    types = tuple(helper.np_dtype_to_tensor_dtype(v.dtype) for v in inputs)
    ctx = NodeContext("roi", kernel_class.op_type, "", 22, attributes, types, (T.FLOAT,), len(inputs), 1)
    with pytest.raises(KernelError, match=f"node 'roi' \\({kernel_class.op_type}\\): {message}"):
        kernel_class(ctx).run(*inputs)
