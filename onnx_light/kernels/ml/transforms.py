"""What the ai.onnx.ml predictors share: score post-transforms, class labels, inputs as floats.

Linear, tree and SVM predictors end the same way: a ``post_transform`` applied row by row to
the scores (named in the legacy operators, numbered in TreeEnsemble-5), then the labels of the
best scores. ONNX's text defines the transforms; PROBIT and SOFTMAX_ZERO follow onnxruntime's
formulas (the erf inverse approximation with a = 0.147, exact zeros kept out of the softmax).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...tuning.keys import ElementType as T
from ..base import KernelError, NodeContext

#: The ONNX domain of these kernels.
DOMAIN = "ai.onnx.ml"
#: The input types of the predictors and scalers ('T' of most ai.onnx.ml operators).
NUMERIC_INPUTS = (T.FLOAT, T.DOUBLE, T.INT64, T.INT32)

__all__ = ["DOMAIN", "NUMERIC_INPUTS", "POST_TRANSFORMS", "as_features", "class_labels", "post_transform",
           "post_transform_named"]


def _logistic(scores: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-scores))


def _softmax(scores: np.ndarray) -> np.ndarray:
    exp = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def _softmax_zero(scores: np.ndarray) -> np.ndarray:
    """Softmax over the non-zero scores of each row; a zero score stays (about) zero and a row
    whose sum is zero becomes 0.5 everywhere."""
    top = scores.max(axis=-1, keepdims=True)
    nonzero = np.abs(scores) > 1e-7
    values = np.where(nonzero, np.exp(scores - top), scores * np.exp(-top))
    total = values.sum(axis=-1, keepdims=True)
    safe = np.where(total == 0, 1, total)
    return np.where(total == 0, np.float32(0.5), values / safe).astype(scores.dtype)


def _probit(scores: np.ndarray) -> np.ndarray:
    """sqrt(2) erfinv(2 p - 1), erfinv by Winitzki's approximation (a = 0.147)."""
    x = 2.0 * scores.astype(np.float64) - 1.0
    one_minus = (1.0 - x) * (1.0 + x)
    with np.errstate(divide="ignore", invalid="ignore"):
        log = np.log(one_minus)
        v = 2.0 / (np.pi * 0.147) + 0.5 * log
        inverse = np.sign(x) * np.sqrt(-v + np.sqrt(v * v - log / 0.147))
    return (1.41421356 * np.where(one_minus == 0, 0.0, inverse)).astype(scores.dtype)


POST_TRANSFORMS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "NONE": lambda scores: scores,
    "SOFTMAX": _softmax,
    "LOGISTIC": _logistic,
    "SOFTMAX_ZERO": _softmax_zero,
    "PROBIT": _probit,
}
# TreeEnsemble-5 numbers them: NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT.
_NUMBERED = tuple(POST_TRANSFORMS)


def post_transform_named(ctx: NodeContext, name: str | int | None) -> Callable[[np.ndarray], np.ndarray]:
    """The transform a node's ``post_transform`` attribute names (a name, or TreeEnsemble-5's
    number); anything else is the node's error, listing the valid ones."""
    if isinstance(name, int) and not isinstance(name, bool):
        if not 0 <= name < len(_NUMBERED):
            raise ctx.error(f"post_transform must be one of 0..{len(_NUMBERED) - 1} "
                            f"({', '.join(_NUMBERED)}), got {name}")
        return POST_TRANSFORMS[_NUMBERED[name]]
    name = "NONE" if name is None else name
    if name not in POST_TRANSFORMS:
        raise ctx.error(f"post_transform must be one of {list(POST_TRANSFORMS)}, got {name!r}")
    return POST_TRANSFORMS[name]


def post_transform(ctx: NodeContext) -> Callable[[np.ndarray], np.ndarray]:
    """The transform of the node's ``post_transform`` attribute."""
    return post_transform_named(ctx, ctx.attribute("post_transform"))


def class_labels(ctx: NodeContext, ints: str, strings: str) -> np.ndarray | None:
    """The node's class labels, from whichever of the two attributes it sets: int64 or str
    (an object array); None when it sets neither. Setting both is the node's error."""
    numbers, names = ctx.attribute(ints), ctx.attribute(strings)
    if numbers and names:
        raise ctx.error(f"only one of {ints} and {strings} may be set")
    if names:
        return np.array(names, dtype=object)
    if numbers:
        return np.array(numbers, dtype=np.int64)
    return None


def as_features(ctx: NodeContext, x: np.ndarray, dtype: type = np.float32) -> np.ndarray:
    """A predictor's input as a 2-d array of floats: [N, C] as given, a 1-d input as one row
    (float64 stays float64, other types become ``dtype``)."""
    if x.dtype.kind not in "fiub":
        raise KernelError(f"node {ctx.name!r} ({ctx.op_type}): input must be numeric, got {x.dtype}")
    if x.ndim == 1:
        x = x.reshape(1, -1)
    elif x.ndim != 2:
        x = x.reshape(x.shape[0], -1)
    return x if x.dtype == np.float64 else x.astype(dtype, copy=False)
