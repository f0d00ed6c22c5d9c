"""MaxUnpool: the values of a MaxPool output put back at the flat positions of its Indices,
zeros elsewhere, in one numpy scatter. Not tunable."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import FLOAT_TYPES, Kernel, NodeContext, ints
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "MaxUnpool"]


class MaxUnpool(Kernel):
    """ONNX MaxUnpool (9, 11, 22): indices address an output of spatial size
    ``(in - 1) * stride + kernel - pad_begin - pad_end``; a larger ``output_shape`` holds that
    output at its start (the zeros it adds follow on each axis), as ONNX's reference does."""

    op_type: ClassVar[str] = "MaxUnpool"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.kernel_shape = ints(ctx.attribute("kernel_shape"))
        if not self.kernel_shape or min(self.kernel_shape) < 1:
            raise ctx.error(f"attribute kernel_shape must hold positive sizes, got {self.kernel_shape}")
        rank = len(self.kernel_shape)
        self.strides = ints(ctx.attribute("strides")) or [1] * rank
        self.pads = ints(ctx.attribute("pads")) or [0] * (2 * rank)
        if len(self.strides) != rank or len(self.pads) != 2 * rank or min(self.strides) < 1:
            raise ctx.error(f"strides {self.strides} and pads {self.pads} do not fit kernel_shape "
                            f"{self.kernel_shape}")

    def run(self, x: np.ndarray, indices: np.ndarray,
            output_shape: np.ndarray | None = None) -> Sequence[np.ndarray]:
        rank = len(self.kernel_shape)
        if x.ndim != rank + 2 or indices.shape != x.shape:
            raise self.ctx.error(f"X {list(x.shape)} and I {list(indices.shape)} must be the same "
                                 f"(N, C, ...) shape with {rank} spatial axes")
        inferred = list(x.shape[:2]) + [
            (i - 1) * s + k - self.pads[a] - self.pads[a + rank]
            for a, (i, s, k) in enumerate(zip(x.shape[2:], self.strides, self.kernel_shape, strict=True))]
        shape = inferred if output_shape is None else ints(output_shape)
        if len(shape) != x.ndim or any(o < i for o, i in zip(shape, inferred, strict=True)):
            raise self.ctx.error(f"output_shape {shape} must be at least the unpooled shape {inferred}")
        size = math.prod(inferred)
        flat = np.asarray(indices, np.int64).reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= size):
            raise self.ctx.error(f"indices must lie in [0, {size}) of the unpooled shape {inferred}")
        unpooled = np.zeros(size, x.dtype)
        unpooled[flat] = x.reshape(-1)
        if shape == inferred:
            return (unpooled.reshape(shape),)
        out = np.zeros(shape, x.dtype)
        out[tuple(slice(0, i) for i in inferred)] = unpooled.reshape(inferred)
        return (out,)


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(MaxUnpool, (9, 11, 22), types={9: (T.FLOAT16, T.FLOAT, T.DOUBLE), 22: FLOAT_TYPES}),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
