"""Support vector machines of ai.onnx.ml: SVMClassifier (one-vs-one votes, libsvm's pairwise
probabilities when ``prob_a``/``prob_b`` are given) and SVMRegressor.

The kernel matrix of a batch against the support vectors is one matrix product (RBF through
the expansion |x|^2 - 2 x.v + |v|^2), computed in float64 and handed out as float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..base import Kernel, NodeContext
from ..declaration import KernelDeclaration, declare, dispatch_table
from .transforms import DOMAIN, NUMERIC_INPUTS, POST_TRANSFORMS, as_features, class_labels, post_transform

__all__ = ["DECLARATIONS", "KERNELS", "SVMClassifier", "SVMRegressor", "SupportVectors"]

KERNEL_TYPES = ("LINEAR", "POLY", "RBF", "SIGMOID")


class SupportVectors:
    """The kernel function of a node (``kernel_type``, ``kernel_params`` = gamma, coef0,
    degree) and its support vectors [V, C] (none: the linear mode, features used as they are)."""

    def __init__(self, ctx: NodeContext, count: int) -> None:
        self.ctx = ctx
        self.kind = ctx.attribute("kernel_type", "LINEAR")
        if self.kind not in KERNEL_TYPES:
            raise ctx.error(f"kernel_type must be one of {list(KERNEL_TYPES)}, got {self.kind!r}")
        params = list(ctx.attribute("kernel_params", ()) or ())
        self.gamma, self.coef0, self.degree = (params + [0.0, 0.0, 0.0][len(params):])[:3]
        vectors = np.asarray(ctx.attribute("support_vectors", ()), dtype=np.float64)
        if count and vectors.size % count:
            raise ctx.error(f"{vectors.size} support vector values do not split into {count} vectors")
        self.vectors = vectors.reshape(count, -1) if count else None

    def kernels(self, x: np.ndarray) -> np.ndarray:
        """K(x_n, v_j) for every row and support vector, float64 [N, V]."""
        features = as_features(self.ctx, x, np.float64).astype(np.float64, copy=False)
        vectors = self.vectors
        if features.shape[1] != vectors.shape[1]:
            raise self.ctx.error(f"input has {features.shape[1]} feature(s), the support vectors "
                                 f"{vectors.shape[1]}")
        dots = features @ vectors.T
        if self.kind == "LINEAR":
            return dots
        if self.kind == "RBF":
            squares = (features * features).sum(axis=1)[:, None] + (vectors * vectors).sum(axis=1)
            return np.exp(-self.gamma * np.maximum(squares - 2 * dots, 0.0))
        affine = self.gamma * dots + self.coef0
        return affine ** int(self.degree) if self.kind == "POLY" else np.tanh(affine)


def _pairwise_probabilities(pairs: np.ndarray, classes: int, rows: int) -> np.ndarray:
    """libsvm's multiclass probabilities from the pairwise ones (``pairs``: [N, k(k-1)/2],
    P(class i beats class j) in pair order), by its fixed-point iteration, every row at once
    (a row stops updating once it has converged, as it would alone)."""
    r = np.zeros((rows, classes, classes))
    index = 0
    for i in range(classes):
        for j in range(i + 1, classes):
            r[:, i, j] = pairs[:, index]
            r[:, j, i] = 1 - pairs[:, index]
            index += 1
    q = -np.einsum("nti,nit->nti", r, r) * 0  # shape holder, filled below
    for t in range(classes):
        q[:, t, t] = (r[:, :, t] ** 2).sum(axis=1) - r[:, t, t] ** 2
        for u in range(classes):
            if u != t:
                q[:, t, u] = -r[:, u, t] * r[:, t, u]
    p = np.full((rows, classes), 1.0 / classes)
    active = np.ones(rows, dtype=bool)
    epsilon = 0.005 / classes
    for _ in range(max(100, classes)):
        qp = np.einsum("ntu,nu->nt", q, p)
        pqp = (p * qp).sum(axis=1)
        active &= np.abs(qp - pqp[:, None]).max(axis=1) >= epsilon
        if not active.any():
            break
        for t in range(classes):
            diff = np.where(active, (-qp[:, t] + pqp) / q[:, t, t], 0.0)
            p[:, t] += diff
            pqp = (pqp + diff * (diff * q[:, t, t] + 2 * qp[:, t])) / (1 + diff) ** 2
            p /= (1 + diff)[:, None]
            qp = (qp + diff[:, None] * q[:, t, :]) / (1 + diff)[:, None]
    return p


class SVMClassifier(Kernel):
    op_type = "SVMClassifier"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.labels = class_labels(ctx, "classlabels_ints", "classlabels_strings")
        if self.labels is None:
            raise ctx.error("one of classlabels_ints and classlabels_strings must be set")
        classes = len(self.labels)
        per_class = np.asarray(ctx.attribute("vectors_per_class", ()) or (), dtype=np.int64)
        count = int(per_class.sum())
        if count and len(per_class) != classes:
            raise ctx.error(f"vectors_per_class has {len(per_class)} entries for {classes} classes")
        self.support = SupportVectors(ctx, count)
        self.starts = np.concatenate([[0], np.cumsum(per_class)[:-1]]).astype(np.int64)
        self.per_class = per_class
        coefficients = np.asarray(ctx.attribute("coefficients", ()), dtype=np.float64)
        self.rho = np.asarray(ctx.attribute("rho", ()), dtype=np.float64)
        if count:
            if coefficients.size != (classes - 1) * count:
                raise ctx.error(f"{coefficients.size} coefficients for {classes - 1} x {count} "
                                "(classes - 1 by support vectors)")
            if self.rho.size != classes * (classes - 1) // 2:
                raise ctx.error(f"rho has {self.rho.size} value(s) for {classes} classes' "
                                f"{classes * (classes - 1) // 2} pairs")
            self.coefficients = coefficients.reshape(classes - 1, count)
        else:
            if not coefficients.size or coefficients.size % classes:
                raise ctx.error(f"{coefficients.size} coefficients do not split into {classes} classes")
            self.coefficients = coefficients.reshape(classes, -1)
        prob_a = ctx.attribute("prob_a")
        prob_b = ctx.attribute("prob_b")
        self.prob_a = np.asarray(prob_a, np.float64) if prob_a else None
        self.prob_b = np.asarray(prob_b, np.float64) if prob_b else None
        self.transform_name = ctx.attribute("post_transform", "NONE")
        self.transform = post_transform(ctx)

    def _votes_and_scores(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        kernels = self.support.kernels(x)
        classes = len(self.labels)
        votes = np.zeros((kernels.shape[0], classes), dtype=np.int64)
        scores = np.empty((kernels.shape[0], classes * (classes - 1) // 2))
        pair = 0
        for i in range(classes):
            rows_i = slice(self.starts[i], self.starts[i] + self.per_class[i])
            for j in range(i + 1, classes):
                rows_j = slice(self.starts[j], self.starts[j] + self.per_class[j])
                s = (self.rho[pair] + kernels[:, rows_i] @ self.coefficients[j - 1, rows_i]
                     + kernels[:, rows_j] @ self.coefficients[i, rows_j])
                scores[:, pair] = s
                votes[:, i] += s > 0
                votes[:, j] += s <= 0
                pair += 1
        return votes, scores

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        classes = len(self.labels)
        if self.support.vectors is None:  # linear mode: one score per class
            features = as_features(self.ctx, x, np.float64).astype(np.float64, copy=False)
            scores = features @ self.coefficients.T + self.rho[0]
            scores = self.transform(scores.astype(np.float32))
            return self.labels[np.argmax(scores, axis=1)], scores
        votes, scores = self._votes_and_scores(x)
        labels = self.labels[np.argmax(votes, axis=1)]
        if self.prob_a is not None:
            pairs = 1 - 1 / (1 + np.exp(-(scores * self.prob_a + self.prob_b)))
            pairs = np.clip(pairs, 1e-7, 1 - 1e-7)
            probabilities = _pairwise_probabilities(pairs, classes, scores.shape[0])
            return labels, self.transform(probabilities.astype(np.float32))
        if classes == 2:  # one pairwise score s: the scores [-s, s], then the transform
            scores = np.concatenate([-scores, scores], axis=1)
            if self.transform_name == "PROBIT":
                raise self.ctx.error("post_transform PROBIT does not apply to a binary SVM's scores")
        return labels, POST_TRANSFORMS[self.transform_name](scores.astype(np.float32))


class SVMRegressor(Kernel):
    op_type = "SVMRegressor"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        count = int(ctx.attribute("n_supports", 0))
        self.support = SupportVectors(ctx, count)
        self.coefficients = np.asarray(ctx.attribute("coefficients", ()), dtype=np.float64)
        if count and self.coefficients.size != count:
            raise ctx.error(f"{self.coefficients.size} coefficients for {count} support vectors")
        rho = ctx.attribute("rho", ())
        self.rho = float(rho[0]) if rho else 0.0
        self.one_class = bool(ctx.attribute("one_class", 0))
        self.transform = post_transform(ctx)

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        if self.support.vectors is None:
            features = as_features(self.ctx, x, np.float64).astype(np.float64, copy=False)
            if features.shape[1] != self.coefficients.size:
                raise self.ctx.error(f"input has {features.shape[1]} feature(s), the coefficients "
                                     f"{self.coefficients.size}")
            scores = features @ self.coefficients + self.rho
        else:
            scores = self.support.kernels(x) @ self.coefficients + self.rho
        if self.one_class:
            scores = np.where(scores > 0, 1.0, -1.0)
        return (self.transform(scores.astype(np.float32).reshape(-1, 1)),)


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(SVMClassifier, (1,), types=NUMERIC_INPUTS, domain=DOMAIN),
    declare(SVMRegressor, (1,), types=NUMERIC_INPUTS, domain=DOMAIN),
)

KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
