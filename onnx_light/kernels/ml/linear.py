"""Linear predictors of ai.onnx.ml: LinearClassifier and LinearRegressor (scores = X W^T + b)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..base import Kernel, NodeContext
from ..declaration import KernelDeclaration, declare, dispatch_table
from .transforms import DOMAIN, NUMERIC_INPUTS, as_features, class_labels, post_transform

__all__ = ["DECLARATIONS", "KERNELS", "LinearClassifier", "LinearRegressor", "labels_of_scores"]



def _weights(ctx: NodeContext) -> tuple[np.ndarray, np.ndarray | None]:
    """``coefficients`` (flat: their rows are known once the feature count is) and
    ``intercepts``, as float32."""
    coefficients = np.asarray(ctx.attribute("coefficients", ()), dtype=np.float32).reshape(-1)
    if not coefficients.size:
        raise ctx.error("coefficients must be set")
    intercepts = ctx.attribute("intercepts")
    return coefficients, (None if intercepts is None or not len(intercepts)
                          else np.asarray(intercepts, np.float32))


def _scores(ctx: NodeContext, x: np.ndarray, coefficients: np.ndarray,
            bias: np.ndarray | None) -> np.ndarray:
    """X W^T + b, W the coefficients as one row per score; float32 [N, rows]."""
    features = as_features(ctx, x)
    count = features.shape[1]
    if not count or coefficients.size % count:
        raise ctx.error(f"{coefficients.size} coefficients do not split into rows of the "
                        f"input's {count} feature(s)")
    weights = coefficients.reshape(-1, count)
    if bias is not None and len(bias) != weights.shape[0]:
        raise ctx.error(f"{len(bias)} intercepts for {weights.shape[0]} row(s) of coefficients")
    scores = features @ weights.T.astype(features.dtype, copy=False)
    if bias is not None:
        scores += bias
    return scores.astype(np.float32, copy=False)


def labels_of_scores(labels: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """The label of each row's highest score (the first one on ties). Classifiers pick from
    the scores before their post-transform, as onnxruntime does (the transforms keep the order,
    but PROBIT gives NaN outside [0, 1])."""
    return labels[np.argmax(scores, axis=1)]


class LinearClassifier(Kernel):
    op_type = "LinearClassifier"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.labels = class_labels(ctx, "classlabels_ints", "classlabels_strings")
        if self.labels is None:
            raise ctx.error("one of classlabels_ints and classlabels_strings must be set")
        self.coefficients, self.bias = _weights(ctx)
        self.transform = post_transform(ctx)

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        scores = _scores(self.ctx, x, self.coefficients, self.bias)
        classes = len(self.labels)
        if scores.shape[1] == 1 and classes == 2:
            # one row of coefficients for two classes scores the second; the first its negation
            scores = np.concatenate([-scores, scores], axis=1)
        elif scores.shape[1] != classes:
            raise self.ctx.error(f"{scores.shape[1]} row(s) of coefficients for {classes} class labels")
        return labels_of_scores(self.labels, scores), self.transform(scores)


class LinearRegressor(Kernel):
    op_type = "LinearRegressor"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.coefficients, self.bias = _weights(ctx)
        self.targets = int(ctx.attribute("targets", 1))
        self.transform = post_transform(ctx)

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        scores = _scores(self.ctx, x, self.coefficients, self.bias)
        if scores.shape[1] != self.targets:
            raise self.ctx.error(f"the coefficients give {scores.shape[1]} target(s), "
                                 f"the targets attribute says {self.targets}")
        return (self.transform(scores),)


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(LinearClassifier, (1,), types=NUMERIC_INPUTS, domain=DOMAIN),
    declare(LinearRegressor, (1,), types=NUMERIC_INPUTS, domain=DOMAIN),
)

KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
