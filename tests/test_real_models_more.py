"""Three real architectures, built with onnx's helpers from seeded random weights, against
onnxruntime: a bidirectional LSTM text classifier, a small U-Net and an SSD-style detector
with its post-processing.

* The text classifier embeds token ids (Gather), runs a bidirectional LSTM over each padded
  sentence up to its own length (``sequence_lens``), pools the states over time and with the
  last ones, and classifies them (Gemm, Softmax).
* The U-Net encodes with Conv and MaxPool, decodes with ConvTranspose and Resize (bilinear,
  half-pixel) and joins encoder and decoder maps by Concat skip connections.
* The detector has box and class heads (Conv) on two feature maps, flattened
  (Transpose, Reshape, Concat), class probabilities (Softmax), the best candidates (TopK),
  their boxes and scores (Gather) and the final detections (NonMaxSuppression, GatherND).

The model with If and Loop is tests/test_control_flow.py's. Float outputs are compared within
float32 tolerances; indices (the detector's selections) exactly.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_light.runtime import RuntimeSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from contrib_models import Graph

ort = pytest.importorskip("onnxruntime")
F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
OPSET = 17


class _Graph(Graph):
    """contrib_models' graph builder with nodes of several outputs and named graph outputs."""

    def node(self, op_type: str, inputs: list[str], outputs: int = 1, **attributes) -> list[str]:
        names = [f"{op_type.lower()}{len(self.nodes)}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, **attributes))
        return names

    def one(self, op_type: str, inputs: list[str], **attributes) -> str:
        return self.node(op_type, inputs, **attributes)[0]

    def conv(self, x: str, channels: int, filters: int, kernel: int = 3, stride: int = 1,
             group: int = 1) -> str:
        return super().conv(x, channels, filters, kernel, stride, group)

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: dict[str, str],  # type: ignore[override]
              name: str = "model") -> onnx.ModelProto:
        """The graph with ``outputs`` (name -> value) as Identity outputs, shapes inferred."""
        nodes = self.nodes + [helper.make_node("Identity", [v], [k]) for k, v in outputs.items()]
        graph = helper.make_graph(
            nodes,
            name,
            inputs,
            [helper.make_value_info(k, onnx.TypeProto()) for k in outputs],
            initializer=self.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        return onnx.shape_inference.infer_shapes(model)


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def _compare(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-4, num_threads: int = 1
) -> list[np.ndarray]:
    ours = RuntimeSession(model, num_threads=num_threads).run(None, feeds)
    theirs = _onnxruntime(model, feeds)
    for output, mine, peer in zip(model.graph.output, ours, theirs, strict=True):
        assert mine.shape == peer.shape and mine.dtype == peer.dtype, output.name
        if mine.dtype.kind in "iub":
            np.testing.assert_array_equal(mine, peer, err_msg=output.name)
        else:
            scale = max(float(np.abs(peer).max(initial=0)), 1e-6)
            np.testing.assert_allclose(mine, peer, rtol=rtol, atol=rtol * scale, err_msg=output.name)
    return ours


# ------------------------------------------------------------------ text classifier

VOCABULARY, EMBEDDING, HIDDEN, CLASSES, STEPS, BATCH = 50, 12, 8, 4, 9, 3


def lstm_classifier() -> onnx.ModelProto:
    """tokens [B, T] (0 pads), lengths [B] -> class probabilities [B, C]."""
    g = _Graph(seed=11)
    embedded = g.one("Gather", [g.weight(VOCABULARY, EMBEDDING, scale=1.0), "tokens"])  # [B,T,E]
    steps = g.one("Transpose", [embedded], perm=[1, 0, 2])  # [T, B, E]
    w = g.weight(2, 4 * HIDDEN, EMBEDDING)
    r = g.weight(2, 4 * HIDDEN, HIDDEN)
    b = g.weight(2, 8 * HIDDEN, scale=0.1)
    y, y_h = g.node(
        "LSTM", [steps, w, r, b, "lengths"], outputs=2, direction="bidirectional", hidden_size=HIDDEN
    )  # Y [T, 2, B, H] (zeros past each length), Y_h [2, B, H]
    summed = g.one("ReduceSum", [y, g.constant([0], np.int64)], keepdims=0)  # [2, B, H]
    lengths = g.one("Cast", ["lengths"], to=F)
    mean = g.one("Div", [summed, g.one("Reshape", [lengths, g.constant([1, -1, 1], np.int64)])])
    pooled = g.one("Concat", [mean, y_h], axis=2)  # [2, B, 2H]
    features = g.one(
        "Reshape", [g.one("Transpose", [pooled], perm=[1, 0, 2]), g.constant([0, -1], np.int64)]
    )  # [B, 4H]
    logits = g.one("Gemm", [features, g.weight(CLASSES, 4 * HIDDEN), g.weight(CLASSES, scale=0.1)], transB=1)
    probabilities = g.one("Softmax", [logits], axis=1)
    inputs = [
        helper.make_tensor_value_info("tokens", I64, ["batch", "steps"]),
        helper.make_tensor_value_info("lengths", I32, ["batch"]),
    ]
    return g.model(inputs, {"probabilities": probabilities, "last_states": y_h})


def test_a_bidirectional_lstm_text_classifier_matches_onnxruntime():
    rng = np.random.default_rng(1)
    lengths = np.array([STEPS, 4, 1], np.int32)
    tokens = rng.integers(1, VOCABULARY, (BATCH, STEPS))
    tokens[np.arange(STEPS) >= lengths[:, None]] = 0  # padding
    probabilities, _ = _compare(lstm_classifier(), {"tokens": tokens, "lengths": lengths}, rtol=1e-5)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, rtol=1e-6)
    # a sentence's padding does not change its class: the LSTM stops at its length
    padded = tokens.copy()
    padded[2, 1:] = rng.integers(1, VOCABULARY, STEPS - 1)
    again, _ = RuntimeSession(lstm_classifier()).run(None, {"tokens": padded, "lengths": lengths})
    np.testing.assert_allclose(again[2], probabilities[2], rtol=1e-6)


# ------------------------------------------------------------------ U-Net


def unet(size: int = 32) -> onnx.ModelProto:
    """image [1, 3, S, S] -> per-pixel class probabilities [1, 2, S, S]."""
    g = _Graph(seed=12)

    def relu(x: str) -> str:
        return g.one("Relu", [x])

    def pool(x: str) -> str:
        return g.one("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])

    e1 = relu(g.conv("image", 3, 8))  # [8, S]
    e2 = relu(g.conv(pool(e1), 8, 16))  # [16, S/2]
    bottom = relu(g.conv(pool(e2), 16, 32))  # [32, S/4]
    up2 = g.one(
        "ConvTranspose",
        [bottom, g.weight(32, 16, 2, 2, scale=0.25), g.weight(16, scale=0.1)],
        kernel_shape=[2, 2],
        strides=[2, 2],
    )  # [16, S/2]
    d2 = relu(g.conv(g.one("Concat", [up2, e2], axis=1), 32, 16))
    up1 = g.one(
        "Resize",
        [d2, "", g.constant([1, 1, 2, 2])],
        mode="linear",
        coordinate_transformation_mode="half_pixel",
    )  # [16, S]
    d1 = relu(g.conv(g.one("Concat", [g.conv(up1, 16, 8), e1], axis=1), 16, 8))
    logits = g.conv(d1, 8, 2, kernel=1)
    inputs = [helper.make_tensor_value_info("image", F, [1, 3, size, size])]
    return g.model(inputs, {"logits": logits, "probabilities": g.one("Softmax", [logits], axis=1)})


@pytest.mark.parametrize("num_threads", [1, 2])
def test_a_small_unet_matches_onnxruntime(num_threads):
    image = np.random.default_rng(2).standard_normal((1, 3, 32, 32)).astype(np.float32)
    logits, probabilities = _compare(unet(), {"image": image}, num_threads=num_threads)
    assert logits.shape == (1, 2, 32, 32)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, rtol=1e-6)


# ------------------------------------------------------------------ SSD-style detector

DETECTOR_CLASSES, ANCHORS, CANDIDATES = 4, 3, 40  # classes with the background


def _anchors(size: int, cells: int) -> np.ndarray:
    """Corner boxes (y1, x1, y2, x2) of ANCHORS shapes centred on each cell, row-major."""
    centres = (np.arange(cells) + 0.5) / cells
    shapes = np.array([[1.0, 1.0], [1.4, 0.7], [0.7, 1.4]]) * 2 / cells
    cy, cx = np.meshgrid(centres, centres, indexing="ij")
    boxes = [np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], -1) for h, w in shapes]
    return np.stack(boxes, 2).reshape(-1, 4) * size


def ssd_detector(size: int = 32) -> onnx.ModelProto:
    """image [1, 3, S, S] -> selected (batch, class, box) [M, 3], their boxes [M, 4] and
    scores [M]."""
    g = _Graph(seed=13)
    f1 = g.one("Relu", [g.conv("image", 3, 16, stride=2)])  # [16, S/2]
    f2 = g.one("Relu", [g.conv(f1, 16, 16, stride=2)])  # [16, S/4]
    locations, confidences, anchors = [], [], []
    for feature, cells in ((f1, size // 2), (f2, size // 4)):
        for width, out in ((4, locations), (DETECTOR_CLASSES, confidences)):
            head = g.one("Transpose", [g.conv(feature, 16, ANCHORS * width)], perm=[0, 2, 3, 1])
            out.append(g.one("Reshape", [head, g.constant([1, -1, width], np.int64)]))
        anchors.append(_anchors(size, cells))
    shifts = g.one("Concat", locations, axis=1)  # [1, N, 4]
    boxes = g.one("Add", [g.constant(np.concatenate(anchors)[None]), g.one("Mul", [shifts, g.constant(2.0)])])
    scores = g.one("Softmax", [g.one("Concat", confidences, axis=1)], axis=-1)  # [1, N, C]
    objects = g.one(
        "Slice",
        [
            scores,
            g.constant([1], np.int64),
            g.constant([DETECTOR_CLASSES], np.int64),
            g.constant([2], np.int64),
        ],
    )  # without the background
    best = g.one("ReduceMax", [objects], axes=[2], keepdims=0)  # [1, N]
    _, top = g.node("TopK", [best, g.constant([CANDIDATES], np.int64)], outputs=2, axis=1)
    top = g.one("Squeeze", [top, g.constant([0], np.int64)])  # [K]
    kept_boxes = g.one("Gather", [boxes, top], axis=1)  # [1, K, 4]
    kept_scores = g.one("Transpose", [g.one("Gather", [objects, top], axis=1)], perm=[0, 2, 1])
    selected = g.one(
        "NonMaxSuppression",
        [kept_boxes, kept_scores, g.constant([20], np.int64), g.constant([0.45]), g.constant([0.2])],
    )  # [M, 3]
    box_index = g.one(
        "Squeeze",
        [
            g.one(
                "Slice",
                [selected, g.constant([2], np.int64), g.constant([3], np.int64), g.constant([1], np.int64)],
            ),
            g.constant([1], np.int64),
        ],
    )
    detected = g.one("Gather", [g.one("Squeeze", [kept_boxes, g.constant([0], np.int64)]), box_index])
    detected_scores = g.one("GatherND", [kept_scores, selected])
    inputs = [helper.make_tensor_value_info("image", F, [1, 3, size, size])]
    return g.model(
        inputs, {"selected": selected, "boxes": detected, "scores": detected_scores, "candidates": top}
    )


def test_an_ssd_style_detector_with_nms_matches_onnxruntime():
    image = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    selected, boxes, scores, _ = _compare(ssd_detector(), {"image": image}, rtol=1e-5)
    # something is detected, and overlapping candidates are suppressed
    assert 3 <= len(selected) < (DETECTOR_CLASSES - 1) * 20
    assert (scores > 0.2).all() and boxes.shape == (len(selected), 4)
