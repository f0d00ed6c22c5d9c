"""Detection post-processing: NonMaxSuppression.

Per image and class, the boxes scoring above ``score_threshold`` are ranked by score
(equal scores: the lower box index first), their pairwise intersection over union is computed
in one numpy pass, and a greedy walk down the ranking keeps each box that no kept box
overlaps by more than ``iou_threshold``, up to ``max_output_boxes_per_class``. Boxes are
corners ``[y1, x1, y2, x2]`` (either diagonal) or, with ``center_point_box=1``,
``[x_center, y_center, width, height]``; a box of no area overlaps nothing. Not tunable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "NonMaxSuppression"]


def _corners(boxes: np.ndarray, center: bool) -> tuple[np.ndarray, ...]:
    """(y_min, x_min, y_max, x_max) of (..., 4) boxes, in float64."""
    b = boxes.astype(np.float64)
    if center:
        x, y, half_w, half_h = b[..., 0], b[..., 1], b[..., 2] / 2, b[..., 3] / 2
        return y - half_h, x - half_w, y + half_h, x + half_w
    return (np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
            np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3]))


def _overlaps(corners: tuple[np.ndarray, ...], threshold: float) -> np.ndarray:
    """Which pairs of the (k,) boxes overlap by more than ``threshold`` (k x k booleans)."""
    y0, x0, y1, x1 = corners
    height = np.minimum(y1[:, None], y1[None]) - np.maximum(y0[:, None], y0[None])
    width = np.minimum(x1[:, None], x1[None]) - np.maximum(x0[:, None], x0[None])
    intersection = np.where((height > 0) & (width > 0), height * width, 0)
    area = (y1 - y0) * (x1 - x0)
    union = area[:, None] + area[None] - intersection
    valid = (intersection > 0) & (area[:, None] > 0) & (area[None] > 0) & (union > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return valid & (intersection / np.where(valid, union, 1) > threshold)


class NonMaxSuppression(Kernel):
    """ONNX NonMaxSuppression (10, 11): (selected, 3) int64 rows ``[image, class, box]``,
    image by image, class by class, each class's boxes by descending score."""

    op_type: ClassVar[str] = "NonMaxSuppression"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.center = int(ctx.attribute("center_point_box", 0))
        if self.center not in (0, 1):
            raise ctx.error(f"center_point_box must be 0 or 1, got {self.center}")

    def run(self, boxes: np.ndarray, scores: np.ndarray, max_output_boxes_per_class: np.ndarray | None = None,
            iou_threshold: np.ndarray | None = None,
            score_threshold: np.ndarray | None = None) -> Sequence[np.ndarray]:
        if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 \
                or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
            raise self.ctx.error(f"boxes {list(boxes.shape)} must be (images, boxes, 4) and scores "
                                 f"{list(scores.shape)} (images, classes, boxes)")
        limit = 0 if max_output_boxes_per_class is None or not np.size(max_output_boxes_per_class) \
            else max(int(np.asarray(max_output_boxes_per_class).reshape(-1)[0]), 0)
        iou = 0.0 if iou_threshold is None or not np.size(iou_threshold) \
            else float(np.asarray(iou_threshold).reshape(-1)[0])
        if not 0 <= iou <= 1:
            raise self.ctx.error(f"iou_threshold must lie in [0, 1], got {iou}")
        floor = None if score_threshold is None or not np.size(score_threshold) \
            else float(np.asarray(score_threshold).reshape(-1)[0])
        selected: list[tuple[int, int, int]] = []
        corners = _corners(boxes, self.center == 1)
        for image in range(boxes.shape[0] if limit else 0):
            for category in range(scores.shape[1]):
                score = scores[image, category]
                candidates = np.flatnonzero(score > floor) if floor is not None else np.arange(score.size)
                ranked = candidates[np.argsort(-score[candidates].astype(np.float64), kind="stable")]
                overlap = _overlaps(tuple(c[image, ranked] for c in corners), iou)
                suppressed = np.zeros(ranked.size, bool)
                kept = 0
                for i in range(ranked.size):
                    if kept == limit:
                        break
                    if not suppressed[i]:
                        selected.append((image, category, int(ranked[i])))
                        suppressed |= overlap[i]
                        kept += 1
        return [np.array(selected, np.int64).reshape(-1, 3)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(NonMaxSuppression, (10, 11), types=(T.FLOAT,)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
