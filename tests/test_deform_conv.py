"""DeformConv against onnxruntime on random inputs (groups, offset groups, strides,
dilations, pads, bias, mask), against onnx's reference evaluator on one of them, and, with
zero offsets, against onnxruntime's Conv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_light.runtime import RuntimeSession

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(19)
F = TensorProto.FLOAT


def _model(op_type: str, inputs: dict[str, np.ndarray], **attributes):
    node = helper.make_node(op_type, list(inputs), ["y"], **attributes)
    graph = helper.make_graph(
        [node],
        "deform",
        [helper.make_tensor_value_info(k, F, v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", F, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def _inputs(channels, groups, offset_groups, kernel, strides, dilations, pads, bias, mask):
    x = RNG.standard_normal((2, channels, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((4, channels // groups, *kernel)).astype(np.float32)
    out = [
        (size + pads[a] + pads[a + 2] - (kernel[a] - 1) * dilations[a] - 1) // strides[a] + 1
        for a, size in enumerate((7, 6))
    ]
    taps = kernel[0] * kernel[1]
    inputs = {
        "x": x,
        "w": w,
        "offset": (2 * RNG.standard_normal((2, offset_groups * taps * 2, *out))).astype(np.float32),
    }
    if bias or mask:
        inputs["b"] = RNG.standard_normal(4).astype(np.float32)
    if mask:
        inputs["mask"] = RNG.random((2, offset_groups * taps, *out)).astype(np.float32)
    return inputs


@pytest.mark.parametrize(
    ("channels", "groups", "offset_groups", "kernel", "strides", "dilations", "pads", "bias", "mask"),
    [
        (2, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False, False),
        (4, 2, 2, (2, 3), (2, 1), (1, 2), (0, 1, 2, 0), True, False),
        (6, 1, 3, (3, 2), (1, 2), (2, 1), (2, 0, 1, 1), True, True),
    ],
)
def test_deform_conv_matches_onnxruntime(
    channels, groups, offset_groups, kernel, strides, dilations, pads, bias, mask
):
    inputs = _inputs(channels, groups, offset_groups, kernel, strides, dilations, pads, bias, mask)
    model = _model(
        "DeformConv",
        inputs,
        group=groups,
        offset_group=offset_groups,
        kernel_shape=list(kernel),
        strides=list(strides),
        dilations=list(dilations),
        pads=list(pads),
    )
    (ours,) = RuntimeSession(model).run(None, inputs)
    (theirs,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, inputs
    )
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    if groups == 2:  # the reference evaluator's loops are slow: one case
        (reference,) = ReferenceEvaluator(model).run(None, inputs)
        np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-5)


def test_deform_conv_with_zero_offsets_is_onnxruntimes_conv():
    inputs = _inputs(4, 2, 1, (3, 3), (2, 1), (1, 2), (1, 2, 1, 0), True, False)
    inputs["offset"][...] = 0
    attributes = {
        "group": 2,
        "kernel_shape": [3, 3],
        "strides": [2, 1],
        "dilations": [1, 2],
        "pads": [1, 2, 1, 0],
    }
    (ours,) = RuntimeSession(_model("DeformConv", inputs, **attributes)).run(None, inputs)
    conv_inputs = {k: inputs[k] for k in ("x", "w", "b")}
    conv = _model("Conv", conv_inputs, **attributes)
    (theirs,) = ort.InferenceSession(conv.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, conv_inputs
    )
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_deform_conv_names_the_offset_that_does_not_fit():
    inputs = _inputs(2, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), False, False)
    session = RuntimeSession(
        _model(
            "DeformConv",
            {**inputs, "offset": inputs["offset"][:, :9]},
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        )
    )
    with pytest.raises(ValueError, match=r"offset has shape \[2, 9, 7, 6\], expected \[2, 18, 7, 6\]"):
        session.run(None, {**inputs, "offset": inputs["offset"][:, :9]})
