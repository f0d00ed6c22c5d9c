"""Lp-norm pooling: LpPool and GlobalLpPool, ``(sum of |x|^p over the window)^(1/p)``.

LpPool is pooling.py's window machinery (:class:`~onnx_light.kernels.conv.WindowAttributes`
geometry, padding with 0, the separable sum of :func:`~onnx_light.kernels.pooling._separable`,
planes split across the pool when large) applied to ``|x|^p``; p = 1 and 2 skip the power.
float16 and bfloat16 compute in float32 and round once. Not tunable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from .base import Kernel, NodeContext, compute_dtype
from .declaration import KernelDeclaration, declare, dispatch_table
from .pooling import _FLOATS, _FLOATS_22, _planes, _Pool, _positions, _separable
from .window import pad_spatial

__all__ = ["KERNELS", "GlobalLpPool", "LpPool"]


def _p(ctx: NodeContext) -> float:
    p = float(ctx.attribute("p", 2))
    if not p > 0:
        raise ctx.error(f"p must be positive, got {p}")
    return p


def _power(x: np.ndarray, p: float) -> np.ndarray:
    magnitude = np.abs(x)
    return magnitude if p == 1 else np.square(magnitude) if p == 2 else magnitude ** p


def _root(total: np.ndarray, p: float) -> np.ndarray:
    return total if p == 1 else np.sqrt(total) if p == 2 else total ** (1 / p)


class LpPool(_Pool):
    """ONNX LpPool (1, 2, 11, 18, 22): ceil_mode and dilations from 18."""

    op_type: ClassVar[str] = "LpPool"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.p = _p(ctx)

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        window = self.window(x)
        compute = compute_dtype(x.dtype)
        xp = pad_spatial(_power(x.astype(compute, copy=False), self.p), window, 0)
        n, c = x.shape[:2]
        out = np.empty((n, c, *window.output), compute)
        planes_in = xp.reshape(n * c, *xp.shape[2:])
        planes_out = out.reshape(n * c, *window.output)

        def block(start: int, stop: int) -> None:
            target = planes_out[start:stop]
            _separable(planes_in[start:stop], window, np.add, target)
            target[...] = _root(target, self.p)

        if out.size:
            _planes(self, n * c, out.size * len(_positions(window)), block)
        return (out.astype(x.dtype, copy=False),)


class GlobalLpPool(Kernel):
    """ONNX GlobalLpPool (1, 2, 22): the Lp norm over every spatial axis, kept as size 1."""

    op_type: ClassVar[str] = "GlobalLpPool"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.p = _p(ctx)

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        if x.ndim < 3:
            raise self.ctx.error(f"X must have shape (N, C, D1, ...), got {list(x.shape)}")
        data = _power(x.astype(compute_dtype(x.dtype), copy=False), self.p)
        total = np.sum(data, axis=tuple(range(2, x.ndim)), keepdims=True)
        return (_root(total, self.p).astype(x.dtype, copy=False),)


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
_TYPES = {1: _FLOATS, 22: _FLOATS_22}
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(GlobalLpPool, (1, 2, 22), types=_TYPES),
    declare(LpPool, (1, 2, 11, 18, 22), types=_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
