"""Order-based kernels: TopK and Unique.

TopK sorts stably, so that equal values keep their index order (ONNX: the lower index first,
for the largest and the smallest alike); the largest are found by sorting the reversed axis
ascending and reading it backwards, which needs no negation (unsigned types). Unique is
numpy's ``unique`` with, for ``sorted=0``, its results reordered by first occurrence. None
is tunable.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import FLOAT_TYPES, INTEGER_TYPES, Kernel, NodeContext, compute_dtype, normalize_axis
from .declaration import KernelDeclaration, Required, declare, dispatch_table
from .structural import outputs_of

__all__ = ["KERNELS", "TopK", "Unique"]

Arrays = list[np.ndarray]
_TOPK_TYPES = {1: (T.FLOAT16, T.FLOAT, T.DOUBLE), 11: (*INTEGER_TYPES, T.FLOAT16, T.FLOAT, T.DOUBLE),
               24: (*INTEGER_TYPES, *FLOAT_TYPES)}


class TopK(Kernel):
    """ONNX TopK (1, 10, 11, 24): the ``k`` largest (or smallest) entries along ``axis`` and
    their int64 indices, in order (``sorted=0`` returns them sorted too)."""

    op_type: ClassVar[str] = "TopK"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = int(ctx.attribute("axis", -1))
        self.largest = ctx.opset < 11 or bool(ctx.attribute("largest", 1))
        self.k = ctx.attribute("k")

    def run(self, x: np.ndarray, k: np.ndarray | None = None) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        if self.ctx.opset >= 10:
            if k is None or np.asarray(k).size != 1:
                raise self.ctx.error("input K must hold one value")
            count = int(np.asarray(k).reshape(-1)[0])
        else:
            count = int(self.k)
        size = x.shape[axis]
        if not 0 <= count <= size:
            raise self.ctx.error(f"k must lie in [0, {size}] (the axis length), got {count}")
        data = x.astype(compute_dtype(x.dtype), copy=False)
        if self.largest:
            order = np.flip(np.argsort(np.flip(data, axis), axis=axis, kind="stable"), axis)
            order = size - 1 - np.take(order, np.arange(count), axis=axis)
        else:
            order = np.take(np.argsort(data, axis=axis, kind="stable"), np.arange(count), axis=axis)
        return [np.take_along_axis(x, order, axis=axis), order.astype(np.int64)]


class Unique(Kernel):
    """ONNX Unique (11, 28): the distinct values (or slices along ``axis``), the index of
    each one's first occurrence, each input entry's position among them, and their counts."""

    op_type: ClassVar[str] = "Unique"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.sorted = bool(ctx.attribute("sorted", 1))
        self.axis = ctx.attribute("axis")

    def run(self, x: np.ndarray) -> Arrays:
        axis = None if self.axis is None else normalize_axis(self.ctx, int(self.axis), x.ndim)
        values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                                   return_counts=True, axis=axis)
        inverse = inverse.reshape(-1)
        if not self.sorted:
            order = np.argsort(first, kind="stable")
            position = np.empty_like(order)
            position[order] = np.arange(order.size)
            values = np.take(values, order, axis=0 if axis is None else axis)
            first, counts, inverse = first[order], counts[order], position[inverse]
        return outputs_of(self.ctx, values, *(a.astype(np.int64) for a in (first, inverse, counts)))


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(TopK, (1, 10, 11, 24), types=_TOPK_TYPES, required=(Required("k", before=10),)),
    declare(Unique, (11, 28)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
