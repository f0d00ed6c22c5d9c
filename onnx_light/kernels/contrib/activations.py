"""The transformer optimizer's fused activations: Gelu, FastGelu, BiasGelu, QuickGelu and
BiasAdd.

Gelu is ``0.5 x (1 + erf(x / sqrt 2))`` and FastGelu its tanh approximation, both through ONNX
Gelu-20's kernel (compiled for float32); BiasGelu adds a bias first, FastGelu an optional one;
QuickGelu is ``x sigmoid(alpha x)`` (alpha 1.702 by default); BiasAdd is ``x + bias + skip``.
Half-precision inputs compute in float32 and round once.
"""

from __future__ import annotations

import numpy as np

from ..base import NodeContext, compute_dtype
from ..declaration import KernelDeclaration
from ..elementwise import KERNELS as ELEMENTWISE
from ..elementwise import _sigmoid
from .base import FLOATS, ContribKernel, declare_contrib, onnx_kernel

__all__ = ["DECLARATIONS"]

Arrays = list[np.ndarray]


def _biased(kernel: ContribKernel, x: np.ndarray, *terms: np.ndarray | None) -> np.ndarray:
    """``x`` plus the given terms (broadcast to x's shape) in the compute type, a new array."""
    compute = compute_dtype(x.dtype)
    total = x.astype(compute, copy=True)
    for name, term in zip(("bias", "skip"), terms, strict=False):
        if term is None:
            continue
        try:
            np.add(total, term.astype(compute, copy=False), out=total)
        except ValueError:
            raise kernel.ctx.error(f"{name} of shape {list(term.shape)} does not broadcast to the "
                                   f"input's {list(x.shape)}") from None
    return total


class _Gelu(ContribKernel):
    """GELU of ``x`` (plus ``bias``), exact or ``approximate='tanh'``: ONNX Gelu's kernel,
    tuned as it."""

    approximate = "none"
    tuned_as = "gelu"

    def __init__(self, ctx: NodeContext) -> None:
        self.gelu = onnx_kernel(ctx, ELEMENTWISE["Gelu"][20], 20, {"approximate": self.approximate},
                                ctx.input_types[:1])
        super().__init__(ctx)

    def run(self, x: np.ndarray, bias: np.ndarray | None = None) -> Arrays:
        values = x if bias is None else _biased(self, x, bias).astype(x.dtype, copy=False)
        return list(self.gelu.run(values))


class Gelu(_Gelu):
    op_type = "Gelu"


class BiasGelu(_Gelu):
    op_type = "BiasGelu"


class FastGelu(_Gelu):
    op_type = "FastGelu"
    approximate = "tanh"


class QuickGelu(ContribKernel):
    """``x sigmoid(alpha x)``."""

    op_type = "QuickGelu"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.alpha = float(ctx.attribute("alpha", 1.702))

    def run(self, x: np.ndarray) -> Arrays:
        values = x.astype(compute_dtype(x.dtype))
        gate = values * values.dtype.type(self.alpha)
        _sigmoid(gate, out=gate)
        return [(values * gate).astype(x.dtype, copy=False)]


class BiasAdd(ContribKernel):
    """``x + bias + skip``: X and skip (batch, sequence, channels), bias (channels)."""

    op_type = "BiasAdd"

    def run(self, x: np.ndarray, bias: np.ndarray, skip: np.ndarray) -> Arrays:
        if x.ndim != 3 or bias.shape != x.shape[-1:] or skip.shape != x.shape:
            raise self.ctx.error(f"expected X (batch, sequence, channels), bias (channels) and skip "
                                 f"of X's shape; got {[list(a.shape) for a in (x, bias, skip)]}")
        return [_biased(self, x, bias, skip).astype(x.dtype, copy=False)]


DECLARATIONS: tuple[KernelDeclaration, ...] = tuple(
    declare_contrib(kernel, FLOATS) for kernel in (Gelu, BiasGelu, FastGelu, QuickGelu, BiasAdd))
