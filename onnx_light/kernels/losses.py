"""Loss kernels: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both gather ``-log p`` of each entry's target class along axis 1 of (N, C, d1, ..., dk)
scores, weight it by ``weight[target]`` (1 without weights; 0 where the target is
``ignore_index``), and reduce: ``none`` keeps the (N, d1, ..., dk) losses, ``sum`` adds them,
``mean`` divides that sum by the sum of the weights applied. SoftmaxCrossEntropyLoss takes the
log-probabilities of its scores first (reductions.py's LogSoftmax along axis 1) and may
return them. float16 and bfloat16 compute in float32 and round once. Not tunable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext, compute_dtype
from .declaration import KernelDeclaration, declare, dispatch_table
from .reductions import LogSoftmax
from .structural import outputs_of

__all__ = ["KERNELS", "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]

Arrays = Sequence[np.ndarray]
_TYPES = {12: (T.FLOAT16, T.FLOAT, T.DOUBLE), 22: (T.FLOAT16, T.FLOAT, T.DOUBLE, T.BFLOAT16)}
_REDUCTIONS = ("none", "sum", "mean")


class NegativeLogLikelihoodLoss(Kernel):
    """ONNX NegativeLogLikelihoodLoss (12, 13, 22): the loss of log-probabilities."""

    op_type: ClassVar[str] = "NegativeLogLikelihoodLoss"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        reduction = ctx.attribute("reduction", "mean")
        self.reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
        if self.reduction not in _REDUCTIONS:
            raise ctx.error(f"reduction must be one of {list(_REDUCTIONS)}, got {self.reduction!r}")
        ignore = ctx.attribute("ignore_index")
        self.ignore_index = None if ignore is None else int(ignore)

    def loss(self, log_prob: np.ndarray, target: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
        """The reduced loss of (N, C, ...) log-probabilities, in their (compute) type."""
        if log_prob.ndim < 2 or target.shape != log_prob.shape[:1] + log_prob.shape[2:]:
            raise self.ctx.error(f"target of shape {list(target.shape)} must be the input's shape "
                                 f"{list(log_prob.shape)} without its class axis 1")
        classes = log_prob.shape[1]
        target = np.asarray(target, np.int64)
        ignored = (np.zeros(target.shape, bool) if self.ignore_index is None
                   else target == self.ignore_index)
        counted = np.where(ignored, 0, target)
        if counted.size and (counted.min() < 0 or counted.max() >= classes):
            raise self.ctx.error(f"targets must lie in [0, {classes}) (or be ignore_index), got "
                                 f"[{counted.min()}, {counted.max()}]")
        if weight is not None and weight.shape != (classes,):
            raise self.ctx.error(f"weight must hold {classes} values, got shape {list(weight.shape)}")
        picked = np.take_along_axis(log_prob, counted[:, np.newaxis], axis=1)[:, 0]
        weights = (np.ones(target.shape, log_prob.dtype) if weight is None
                   else weight.astype(log_prob.dtype)[counted])
        weights[ignored] = 0
        losses = -picked * weights
        if self.reduction == "none":
            return losses
        total = np.sum(losses, dtype=log_prob.dtype)
        if self.reduction == "sum":
            return total
        with np.errstate(invalid="ignore", divide="ignore"):
            return total / np.sum(weights, dtype=log_prob.dtype)

    def run(self, x: np.ndarray, target: np.ndarray, weight: np.ndarray | None = None) -> Arrays:
        data = x.astype(compute_dtype(x.dtype), copy=False)
        return [np.asarray(self.loss(data, target, weight)).astype(x.dtype)]


class SoftmaxCrossEntropyLoss(NegativeLogLikelihoodLoss):
    """ONNX SoftmaxCrossEntropyLoss (12, 13, 22): the loss of LogSoftmax(scores) along axis 1,
    and those log-probabilities as an optional second output."""

    op_type: ClassVar[str] = "SoftmaxCrossEntropyLoss"

    def run(self, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> Arrays:
        if scores.ndim < 2:
            raise self.ctx.error(f"scores must have shape (N, C, ...), got {list(scores.shape)}")
        data = scores.astype(compute_dtype(scores.dtype), copy=False)
        with np.errstate(invalid="ignore", divide="ignore"):
            log_prob = LogSoftmax.normalise(data - np.max(data, axis=1, keepdims=True), 1)
        loss = np.asarray(self.loss(log_prob, labels, weights)).astype(scores.dtype)
        return outputs_of(self.ctx, loss, log_prob.astype(scores.dtype, copy=False))


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(NegativeLogLikelihoodLoss, (12, 13, 22), types=_TYPES),
    declare(SoftmaxCrossEntropyLoss, (12, 13), types={12: _TYPES[12], 13: _TYPES[22]}),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
