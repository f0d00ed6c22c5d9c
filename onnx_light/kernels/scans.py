"""Running totals along an axis: CumSum and CumProd.

Both are the :class:`Scan` base class parameterised by one numpy accumulation and its
identity: ``reverse`` flips the axis before and after, ``exclusive`` shifts the result by one
entry and starts it with the identity. float16 and bfloat16 accumulate in float32 and round
once; the other types accumulate in their own type (integers wrap as ONNX's do). None is
tunable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext, compute_dtype, normalize_axis
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "CumProd", "CumSum", "Scan"]

Arrays = list[np.ndarray]
_TYPES = (T.UINT32, T.UINT64, T.INT32, T.INT64, T.FLOAT16, T.FLOAT, T.DOUBLE, T.BFLOAT16)


class Scan(Kernel):
    """One running-total op: ``accumulate`` along the axis given as the second input."""

    accumulate: ClassVar[Callable[..., np.ndarray]]
    identity: ClassVar[int]

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.exclusive = bool(ctx.attribute("exclusive", 0))
        self.reverse = bool(ctx.attribute("reverse", 0))

    def run(self, x: np.ndarray, axis: np.ndarray) -> Arrays:
        if np.asarray(axis).size != 1:
            raise self.ctx.error(f"axis must hold one value, got shape {list(np.shape(axis))}")
        if x.ndim == 0:
            raise self.ctx.error("input must have rank 1 or more")
        along = normalize_axis(self.ctx, int(np.asarray(axis).reshape(-1)[0]), x.ndim)
        data = x.astype(compute_dtype(x.dtype), copy=False)
        if self.reverse:
            data = np.flip(data, along)
        total = type(self).accumulate(data, axis=along, dtype=data.dtype)
        if self.exclusive and total.shape[along]:
            first = np.full_like(np.take(total, [0], axis=along), self.identity)
            total = np.concatenate([first, np.delete(total, -1, axis=along)], axis=along)
        if self.reverse:
            total = np.flip(total, along)
        return [np.ascontiguousarray(total, dtype=x.dtype)]


class CumSum(Scan):
    op_type: ClassVar[str] = "CumSum"
    accumulate = staticmethod(np.cumsum)
    identity = 0


class CumProd(Scan):
    op_type: ClassVar[str] = "CumProd"
    accumulate = staticmethod(np.cumprod)
    identity = 1


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(CumProd, (26,), types=_TYPES),
    declare(CumSum, (11, 14), types=_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
