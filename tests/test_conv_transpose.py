"""ConvTranspose against ``onnx.reference.ReferenceEvaluator``.

The reference mishandles groups with a bias or with C != M (it slices W and B per group by
output channels), so a grouped node is compared with the reference run on each group alone,
concatenated. The kernel sums the same products in another order: results agree to a few
float32 ulps times the number of terms, relative to the largest magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.kernels.conv_transpose import ConvTranspose

T = TensorProto


def _reference(inputs, attributes, opset=22):
    names = ["X", "W", "B"][:len(inputs)]
    node = helper.make_node("ConvTranspose", names, ["Y"], **attributes)
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info(n, T.FLOAT, None) for n in names],
        [helper.make_tensor_value_info("Y", T.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs, strict=True)))[0]


def _grouped_reference(inputs, attributes):
    """The reference on each group alone, the outputs concatenated along the channels."""
    group = attributes.get("group", 1)
    x, w = inputs[:2]
    per_group, filters = x.shape[1] // group, w.shape[1]
    outputs = []
    for g in range(group):
        part = [x[:, g * per_group:(g + 1) * per_group], w[g * per_group:(g + 1) * per_group]]
        if len(inputs) > 2:
            part.append(inputs[2][g * filters:(g + 1) * filters])
        outputs.append(_reference(part, {**attributes, "group": 1}))
    return np.concatenate(outputs, axis=1)


def _ctx(attributes=None, opset=22):
    return NodeContext("up", "ConvTranspose", "", opset, attributes or {}, (T.FLOAT,) * 2,
                       (T.FLOAT,), 2, 1)


def _run(inputs, attributes, opset=22):
    return ConvTranspose(_ctx(attributes, opset)).run(*inputs)[0]


def _assert_close(got, expected, terms):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected), initial=0)))
    tolerance = 4 * (terms + 1) * np.finfo(np.float32).eps * scale
    np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance)


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    group = draw(st.integers(1, 2))
    per_group, filters = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    spatial = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    strides = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    dilations = draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank))
    padding = [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(strides, dilations, strict=True)]
    canvas = [s * (i - 1) + (k - 1) * d + 1 + p for i, k, s, d, p in
              zip(spatial, kernel, strides, dilations, padding, strict=True)]
    attributes = {"group": group, "strides": strides, "dilations": dilations,
                  "output_padding": padding}
    mode = draw(st.sampled_from(["pads", "auto", "output_shape", "none"]))
    if mode == "pads":
        pads = [draw(st.integers(0, (c - 1) // 2)) for c in canvas * 2]
        attributes["pads"] = pads[:rank] + pads[rank:]
    elif mode == "auto":
        attributes["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        if attributes["auto_pad"] != "VALID":  # a negative total padding: see the module
            assume(all(i * s <= c for i, s, c in zip(spatial, strides, canvas, strict=True)))
    elif mode == "output_shape":  # at least the canvas: the reference pads it at the end
        attributes["output_shape"] = [c + draw(st.integers(0, 2)) for c in canvas]
    if draw(st.booleans()):
        attributes["kernel_shape"] = kernel
    rng = np.random.default_rng(draw(st.integers(0, 1000)))
    inputs = [rng.uniform(-1, 1, (2, group * per_group, *spatial)).astype(np.float32),
              rng.uniform(-1, 1, (group * per_group, filters, *kernel)).astype(np.float32)]
    if draw(st.booleans()):
        inputs.append(rng.uniform(-1, 1, group * filters).astype(np.float32))
    return inputs, attributes


def _expected(inputs, attributes):
    """The reference's full canvas (no padding: its col2im cannot extend the canvas), then
    the window the specification's padding rules leave, zeros (plus bias) past the canvas."""
    x, w = inputs[:2]
    plain = {k: attributes[k] for k in ("group", "strides", "dilations") if k in attributes}
    canvas = _grouped_reference(inputs[:2], plain)
    spatial, kernel, rank = x.shape[2:], w.shape[2:], x.ndim - 2
    strides = attributes.get("strides", [1] * rank)
    dilations = attributes.get("dilations", [1] * rank)
    full = [s * (i - 1) + (k - 1) * d + 1 + p for i, k, s, d, p in
            zip(spatial, kernel, strides, dilations, attributes.get("output_padding", [0] * rank),
                strict=True)]
    auto_pad = attributes.get("auto_pad", "NOTSET")
    if "pads" in attributes or (auto_pad in ("NOTSET", "VALID") and "output_shape" not in attributes):
        pads = attributes.get("pads", [0] * 2 * rank)
        begin = pads[:rank]
        shape = attributes.get("output_shape") or [f - b - e for f, b, e in
                                                   zip(full, begin, pads[rank:], strict=True)]
    else:
        shape = attributes.get("output_shape") or [i * s for i, s in zip(spatial, strides, strict=True)]
        totals = [max(0, f - n) for f, n in zip(full, shape, strict=True)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in totals]
    widths = [(0, 0), (0, 0), *((0, max(0, b + n - c)) for b, n, c in
                                zip(begin, shape, canvas.shape[2:], strict=True))]
    window = np.pad(canvas, widths)[(slice(None), slice(None),
                                     *(slice(b, b + n) for b, n in zip(begin, shape, strict=True)))]
    if len(inputs) > 2:
        window = window + inputs[2].reshape((1, -1) + (1,) * rank)
    return window


@settings(deadline=None, derandomize=True, max_examples=120)
@given(cases())
def test_against_reference(case):
    inputs, attributes = case
    terms = inputs[0].shape[1] * int(np.prod(inputs[1].shape[2:])) + 1
    _assert_close(_run(inputs, attributes), _expected(inputs, attributes), terms)


@settings(deadline=None, derandomize=True, max_examples=60)
@given(cases())
def test_padding_against_reference_itself(case):
    """Where the reference's col2im can place the window (no output_padding, no
    output_shape), its padding and the kernel's agree."""
    inputs, attributes = case
    attributes = {k: v for k, v in attributes.items() if k not in ("output_padding", "output_shape")}
    x, w = inputs[:2]
    if attributes.get("auto_pad", "VALID") != "VALID":  # a negative total: the reference shifts
        assume(all(i * s <= s * (i - 1) + (k - 1) * d + 1 for i, k, s, d in
                   zip(x.shape[2:], w.shape[2:], attributes["strides"], attributes["dilations"],
                       strict=True)))
    try:
        expected = _grouped_reference(inputs, attributes)
    except ValueError:  # a window the reference's col2im refuses
        assume(False)
    terms = inputs[0].shape[1] * int(np.prod(inputs[1].shape[2:])) + 1
    _assert_close(_run(inputs, attributes), expected, terms)


@settings(deadline=None, derandomize=True, max_examples=30)
@given(st.lists(st.integers(2, 4), min_size=1, max_size=2), st.integers(1, 2), st.integers(1, 3),
       st.sampled_from(["NOTSET", "SAME_UPPER", "SAME_LOWER"]), st.integers(0, 100))
def test_smaller_output_shape_splits_the_padding(spatial, stride, crop, auto_pad, seed):
    """An output_shape below the canvas crops it as the specification splits the total
    padding: the extra unit at the end for SAME_UPPER, at the beginning otherwise."""
    rng = np.random.default_rng(seed)
    rank = len(spatial)
    inputs = [rng.uniform(-1, 1, (1, 2, *spatial)).astype(np.float32),
              rng.uniform(-1, 1, (2, 3, *(3,) * rank)).astype(np.float32)]
    strides = [stride] * rank
    full = _reference(inputs, {"strides": strides})
    shape = [n - crop for n in full.shape[2:]]
    begin = crop // 2 if auto_pad == "SAME_UPPER" else crop - crop // 2
    expected = full[(slice(None), slice(None), *(slice(begin, begin + n) for n in shape))]
    got = _run(inputs, {"strides": strides, "output_shape": shape, "auto_pad": auto_pad})
    _assert_close(got, expected, 2 * 27 + 1)


def test_float16_computes_in_float32():
    rng = np.random.default_rng(4)
    inputs = [rng.uniform(-1, 1, (1, 2, 3, 3)).astype(np.float16),
              rng.uniform(-1, 1, (2, 2, 2, 2)).astype(np.float16)]
    attributes = {"strides": [2, 2]}
    got = _run(inputs, attributes)
    assert got.dtype == np.float16
    expected = _run([v.astype(np.float32) for v in inputs], attributes).astype(np.float16)
    np.testing.assert_array_equal(got, expected)


def test_older_opsets_run_alike():
    rng = np.random.default_rng(2)
    inputs = [rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32),
              rng.uniform(-1, 1, (2, 2, 3)).astype(np.float32)]
    newest = _run(inputs, {"pads": [1, 0]})
    for opset in (1, 11):
        np.testing.assert_array_equal(_run(inputs, {"pads": [1, 0]}, opset), newest)


@pytest.mark.parametrize("attributes, message", [
    ({"group": 0}, "group must be positive"),
    ({"output_padding": [-1]}, "output_padding must not be negative"),
    ({"output_shape": [0]}, "output_shape must be positive"),
    ({"auto_pad": "SAME"}, "auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER"),
    ({"strides": [0]}, "strides must be positive"),
    ({"pads": [-1, 0]}, "pads must not be negative"),
])
def test_bad_attributes_name_the_node(attributes, message):
    with pytest.raises(KernelError, match=f"node 'up' \\(ConvTranspose\\): {message}"):
        ConvTranspose(_ctx(attributes))


X = np.zeros((1, 2, 3), np.float32)
W = np.zeros((2, 3, 2), np.float32)


@pytest.mark.parametrize("attributes, inputs, message", [
    ({}, [X], "needs inputs X and W"),
    ({}, [X[0], W[0]], r"X must be \(N, C, D1, ...\) and W"),
    ({"group": 2}, [X, W[:1]], "W has 1 input channels, X has 2"),
    ({"group": 3}, [X, W], "W has 2 input channels, X has 2, which must be a multiple of group 3"),
    ({}, [X, W, np.zeros(2, np.float32)], r"B must have shape \[3\]"),
    ({"kernel_shape": [3]}, [X, W], r"kernel_shape \[3\] differs from the weights"),
    ({"strides": [1, 1]}, [X, W], "strides has 2 values, the input has 1 spatial axes"),
    ({"pads": [2, 2]}, [X, W], "the padding leaves no output"),
    ({"output_shape": [4, 4]}, [X, W], "output_shape has 2 values"),
])
def test_bad_inputs_name_the_node(attributes, inputs, message):
    kernel = ConvTranspose(_ctx(attributes))
    with pytest.raises(KernelError, match=f"node 'up' \\(ConvTranspose\\): {message}"):
        kernel.run(*inputs)


def test_bad_element_type_is_refused():
    ctx = NodeContext("up", "ConvTranspose", "", 22, {}, (T.INT64,) * 2, (T.INT64,), 2, 1)
    with pytest.raises(KernelError, match="does not take element type int64"):
        ConvTranspose(ctx)
