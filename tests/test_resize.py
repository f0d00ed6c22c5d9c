"""Resize and Upsample against ``onnx.reference.ReferenceEvaluator``, and their errors.

Both compute one axis at a time in float64, so float32 results agree to a few ulps; nearest
only picks values and is exact. The reference interpolates tf_crop_and_resize's extrapolated
values along later axes (weights summing to 1 within rounding), hence the relative tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.kernels.resize import Resize, Upsample

TRANSFORMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
              "asymmetric", "tf_crop_and_resize"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def _reference(inputs, attributes, opset=19):
    names = ["x", "roi", "scales", "sizes"][:len(inputs)]
    names = [n if v is not None else "" for n, v in zip(names, inputs, strict=True)]
    node = helper.make_node("Resize", names, ["y"], **attributes)
    x = inputs[0]
    graph = helper.make_graph(
        [node], "one",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), None)
         for n, v in zip(names, inputs, strict=True) if v is not None],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(x.dtype), None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: v for n, v in zip(names, inputs, strict=True) if v is not None}
    return ReferenceEvaluator(model).run(None, feeds)[0]


def _run(kernel_class, inputs, attributes, opset=19):
    ctx = NodeContext("resize_node", kernel_class.op_type, "", opset, attributes,
                      (TensorProto.FLOAT,), (TensorProto.FLOAT,), len(inputs), 1)
    return kernel_class(ctx).run(*inputs)[0]


@settings(deadline=None, derandomize=True, max_examples=150)
@given(st.sampled_from(["nearest", "linear", "cubic"]), st.sampled_from(TRANSFORMS),
       st.sampled_from(NEAREST_MODES), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from([-0.75, -0.5]), st.integers(1, 5), st.integers(1, 5),
       st.sampled_from([0.25, 0.5, 0.6, 1.0, 1.5, 2.0, 3.0]),
       st.sampled_from([0.3, 0.5, 1.0, 1.7, 2.0]), st.integers(0, 1000))
def test_resize_scales_against_reference(mode, transform, nearest_mode, antialias, exclude,
                                         with_axes, a, height, width, scale_h, scale_w, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (2, 3, height, width)).astype(np.float32)
    attributes = {"mode": mode, "coordinate_transformation_mode": transform,
                  "nearest_mode": nearest_mode, "antialias": int(antialias and mode != "nearest"),
                  "exclude_outside": int(exclude and mode != "nearest"), "cubic_coeff_a": a,
                  "extrapolation_value": 7.0}
    if with_axes:
        attributes["axes"] = [3, 2]
        scales = np.array([scale_w, scale_h], np.float32)
        roi = np.array([0.2, 0.1, 0.9, 1.2], np.float32)
    else:
        scales = np.array([1, 1, scale_h, scale_w], np.float32)
        roi = np.array([0, 0, -0.1, 0.2, 1, 1, 0.8, 1.1], np.float32)
    inputs = [x, roi if transform == "tf_crop_and_resize" else None, scales]
    expected = _reference(inputs, attributes)
    got = _run(Resize, inputs, attributes)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=8 * np.finfo(np.float32).eps)


@settings(deadline=None, derandomize=True, max_examples=80)
@given(st.sampled_from(["nearest", "linear", "cubic"]), st.sampled_from(TRANSFORMS[:5]),
       st.sampled_from(["stretch", "not_larger", "not_smaller"]), st.integers(1, 5),
       st.integers(1, 5), st.integers(1, 9), st.integers(1, 9), st.integers(0, 1000))
def test_resize_sizes_against_reference(mode, transform, policy, height, width, out_h, out_w,
                                        seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (1, 2, height, width)).astype(np.float32)
    attributes = {"mode": mode, "coordinate_transformation_mode": transform,
                  "keep_aspect_ratio_policy": policy, "axes": [2, 3]}
    inputs = [x, None, None, np.array([out_h, out_w], np.int64)]
    expected = _reference(inputs, attributes)
    got = _run(Resize, inputs, attributes)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=8 * np.finfo(np.float32).eps)


def test_resize_nearest_of_integers_picks_values():
    x = np.arange(24, dtype=np.uint8).reshape(1, 1, 4, 6) * 10
    inputs = [x, None, np.array([1, 1, 0.5, 1.5], np.float32)]
    attributes = {"mode": "nearest"}
    got = _run(Resize, inputs, attributes)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, _reference(inputs, attributes))


def test_resize_by_one_returns_a_copy():
    x = np.ones((1, 1, 2, 2), np.float32)
    got = _run(Resize, [x, None, np.ones(4, np.float32)], {"mode": "nearest"})
    np.testing.assert_array_equal(got, x)
    assert not np.shares_memory(got, x)


def test_upsample_is_asymmetric_floor_resize():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (1, 2, 3, 4)).astype(np.float32)
    scales = np.array([1, 1, 2, 3], np.float32)
    nearest = _run(Upsample, [x, scales], {"mode": "nearest"}, opset=9)
    np.testing.assert_array_equal(nearest, x.repeat(2, axis=2).repeat(3, axis=3))
    np.testing.assert_array_equal(_run(Upsample, [x], {"mode": "nearest", "scales": scales.tolist()},
                                       opset=7), nearest)
    linear = _run(Upsample, [x, scales], {"mode": "linear"}, opset=9)
    expected = _reference([x, None, scales], {"mode": "linear",
                                              "coordinate_transformation_mode": "asymmetric"})
    np.testing.assert_allclose(linear, expected, rtol=0, atol=8 * np.finfo(np.float32).eps)
    np.testing.assert_array_equal(_run(Resize, [x, scales], {"mode": "linear"}, opset=10), linear)


@pytest.mark.parametrize(("inputs", "attributes", "message"), [
    ([np.ones((1, 1, 2, 2), np.float32), None, np.ones(4, np.float32), np.array([1, 1, 4, 4])],
     {}, "exactly one of 'scales' and 'sizes' must be given, got both"),
    ([np.ones((1, 1, 2, 2), np.float32), None, None, None], {},
     "exactly one of 'scales' and 'sizes' must be given, got neither"),
    ([np.ones((1, 1, 2, 2), np.float32), None, np.ones(3, np.float32)], {},
     "scales has 3 values; the input of rank 4 resizes 4 axes"),
    ([np.ones((1, 1, 2, 2), np.float32), None, np.ones(4, np.float32)], {"mode": "bilinear"},
     "attribute 'mode' must be one of ['nearest', 'linear', 'cubic'], got 'bilinear'"),
    ([np.ones((1, 1, 2, 2), np.float32), None, np.ones(4, np.float32)],
     {"coordinate_transformation_mode": "centre"}, "attribute 'coordinate_transformation_mode'"),
])
def test_resize_errors_name_the_node(inputs, attributes, message):
    with pytest.raises(KernelError) as error:
        _run(Resize, inputs, attributes)
    assert "node 'resize_node' (Resize)" in str(error.value)
    assert message in str(error.value)


def test_upsample_rejects_cubic():
    with pytest.raises(KernelError, match=r"node 'resize_node' \(Upsample\).*'cubic'"):
        _run(Upsample, [np.ones((1, 1, 2, 2), np.float32)], {"mode": "cubic"}, opset=9)
