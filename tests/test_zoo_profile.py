"""benchmarks/zoo_profile.py's classes: each Conv by its weights' shape, found by its node
name (onnx_light's steps) and by the output names onnxruntime gives its fused and NCHWc nodes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

pytest.importorskip("onnxruntime")

import zoo_profile  # noqa: E402


def _model():
    weights = {"stem": (8, 3, 3, 3), "dw": (8, 1, 3, 3), "pw": (16, 8, 1, 1),
               "full": (16, 16, 3, 3), "grouped": (16, 8, 3, 3)}
    init = [numpy_helper.from_array(np.zeros(shape, np.float32), name) for name, shape in weights.items()]
    nodes = [
        helper.make_node("Conv", ["x", "stem"], ["a"], name="stem_conv", strides=[2, 2], pads=[1] * 4),
        helper.make_node("Relu", ["a"], ["a_relu"], name="relu"),
        helper.make_node("Conv", ["a_relu", "dw"], ["b"], name="dw_conv", group=8, pads=[1] * 4),
        helper.make_node("Conv", ["b", "pw"], ["c"], name="pw_conv"),
        helper.make_node("Conv", ["c", "full"], ["d"], name="full_conv", pads=[1] * 4),
        helper.make_node("Conv", ["d", "grouped"], ["e"], name="grouped_conv", group=2, pads=[1] * 4),
        helper.make_node("Add", ["d", "e"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    return helper.make_model(graph)


def test_convolutions_are_classed_by_their_weights():
    classes = zoo_profile.conv_classes(_model())
    expected = {"stem_conv": "stem 3x3 /2", "dw_conv": "depthwise 3x3", "pw_conv": "pointwise",
                "full_conv": "full 3x3", "grouped_conv": "grouped 3x3"}
    assert {name: classes[name] for name in expected} == expected
    # onnxruntime names a Conv fused with its Relu after the Relu's output, with an NCHWc suffix
    assert zoo_profile.node_class("a_relu_nchwc", "Conv", classes) == "stem 3x3 /2"
    assert zoo_profile.node_class("ReorderInput_3", "ReorderInput", classes) == "reorder"
    assert zoo_profile.node_class("add", "Add", classes) == "Add"
