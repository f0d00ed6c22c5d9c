"""FusedMatMul: MatMul with its operands' transposes and a scale folded in, as onnxruntime's
optimizers write it.

``alpha * A' @ B'``: ``transA``/``transB`` swap an operand's last two axes; ``transBatchA``/
``transBatchB`` first move its first axis behind the other batch axes (onnxruntime's layout
of a transposed batch). Half-precision operands compute in float32 and round once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..base import NodeContext, compute_dtype
from ..declaration import KernelDeclaration
from .base import FLOATS, ContribKernel, ValueType, declare_contrib

__all__ = ["DECLARATIONS"]


class FusedMatMul(ContribKernel):
    op_type = "FusedMatMul"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.alpha = float(ctx.attribute("alpha", 1.0))
        self.trans = (bool(ctx.attribute("transA", 0)), bool(ctx.attribute("transB", 0)))
        self.trans_batch = (bool(ctx.attribute("transBatchA", 0)), bool(ctx.attribute("transBatchB", 0)))

    @classmethod
    def typed_outputs(cls, first: ValueType, attributes: Mapping[str, Any],
                      num_outputs: int) -> list[ValueType]:
        return [(first[0], None)]

    def _operand(self, x: np.ndarray, index: int) -> np.ndarray:
        if self.trans_batch[index] and x.ndim > 2:
            x = np.moveaxis(x, 0, -2)
        return np.swapaxes(x, -1, -2) if self.trans[index] and x.ndim >= 2 else x

    def run(self, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
        compute = compute_dtype(a.dtype)
        left = self._operand(a, 0).astype(compute, copy=False)
        right = self._operand(b, 1).astype(compute, copy=False)
        try:
            product = np.matmul(left, right)
        except ValueError:
            raise self.ctx.error(f"cannot multiply shapes {list(left.shape)} and {list(right.shape)} "
                                 f"(A {list(a.shape)}, B {list(b.shape)} after the transposes)") from None
        if self.alpha != 1.0:
            product *= compute.type(self.alpha)
        return [product.astype(a.dtype, copy=False)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (declare_contrib(FusedMatMul, FLOATS),)
