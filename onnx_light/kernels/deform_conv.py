"""DeformConv: a convolution whose every kernel tap reads the input at a learned offset.

Each output position's taps sit where Conv's would (``stride * out - pad_begin + dilation *
tap``) moved by the ``offset`` input (one displacement per spatial axis, per offset group,
tap and output position), are read by multilinear interpolation (bilinear in 2-D) with zeros
outside the input, and are scaled by ``mask`` when given. The interpolated columns (every
input channel at every tap and output position) then multiply each group's weights in one
batched product, as an im2col Conv does. 1-D, 2-D and 3-D inputs; float16 and bfloat16
compute in float32 and round once. Not tunable.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from .base import Kernel, NodeContext, compute_dtype
from .conv import OPSET_TYPES
from .declaration import KernelDeclaration, declare, dispatch_table
from .window import WindowAttributes

__all__ = ["KERNELS", "DeformConv"]


def _positive(ctx: NodeContext, name: str) -> int:
    value = int(ctx.attribute(name, 1))
    if value < 1:
        raise ctx.error(f"{name} must be positive, got {value}")
    return value


class DeformConv(Kernel):
    """ONNX DeformConv (19, 22): groups, offset groups, dilations, bias and mask."""

    op_type: ClassVar[str] = "DeformConv"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.window = WindowAttributes.read(ctx)
        self.group = _positive(ctx, "group")
        self.offset_group = _positive(ctx, "offset_group")

    def _check(self, name: str, array: np.ndarray, expected: Sequence[int]) -> None:
        if tuple(array.shape) != tuple(expected):
            raise self.ctx.error(f"{name} has shape {list(array.shape)}, expected {list(expected)}")

    def run(
        self,
        x: np.ndarray,
        w: np.ndarray,
        offset: np.ndarray,
        b: np.ndarray | None = None,
        mask: np.ndarray | None = None,
    ) -> Sequence[np.ndarray]:
        ctx = self.ctx
        if x.ndim < 3 or w.ndim != x.ndim:
            raise ctx.error(
                f"X ({list(x.shape)}) and W ({list(w.shape)}) must have the same rank, at least 3"
            )
        n, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
        outputs, kernel = w.shape[0], w.shape[2:]
        groups, offset_groups, rank = self.group, self.offset_group, len(spatial)
        if channels % groups or outputs % groups or w.shape[1] * groups != channels:
            raise ctx.error(
                f"X has {channels} channels and W shape {list(w.shape)}: with group "
                f"{groups}, W must have shape [M, C / group, ...] and both M and C "
                "must divide by group"
            )
        if channels % offset_groups:
            raise ctx.error(f"offset_group {offset_groups} does not divide the {channels} channels")
        geometry = self.window.window(ctx, spatial, kernel)
        taps, positions = math.prod(kernel), math.prod(geometry.output)
        self._check("offset", offset, (n, offset_groups * taps * rank, *geometry.output))
        if mask is not None:
            self._check("mask", mask, (n, offset_groups * taps, *geometry.output))
        if b is not None:
            self._check("B", b, (outputs,))
        dtype = compute_dtype(x.dtype)
        # where Conv's taps sit, per axis: (taps, positions)
        tap_grid = np.indices(kernel).reshape(rank, taps, 1)
        out_grid = np.indices(geometry.output).reshape(rank, 1, positions)
        shifts = offset.astype(dtype).reshape(n, offset_groups, taps, rank, positions)
        places = [
            out_grid[a] * geometry.strides[a]
            - geometry.begin[a]
            + tap_grid[a] * geometry.dilations[a]
            + shifts[:, :, :, a]
            for a in range(rank)
        ]
        floors = [np.floor(p) for p in places]
        image = x.astype(dtype).reshape(n, offset_groups, channels // offset_groups, 1, -1)
        columns = np.zeros((n, offset_groups, channels // offset_groups, taps, positions), dtype)
        strides = [math.prod(spatial[a + 1 :]) for a in range(rank)]
        for corner in itertools.product((0, 1), repeat=rank):
            weight = np.ones(places[0].shape, dtype)
            flat = np.zeros(places[0].shape, np.int64)
            for a, step in enumerate(corner):
                index = floors[a] + step
                fraction = places[a] - floors[a]
                weight *= (fraction if step else 1 - fraction) * ((index >= 0) & (index < spatial[a]))
                flat += np.clip(index, 0, spatial[a] - 1).astype(np.int64) * strides[a]
            read = np.take_along_axis(image, flat.reshape(n, offset_groups, 1, 1, -1), axis=-1)
            columns += weight[:, :, None] * read.reshape(columns.shape)
        if mask is not None:
            columns *= mask.astype(dtype).reshape(n, offset_groups, 1, taps, positions)
        columns = columns.reshape(n, groups, channels // groups * taps, positions)
        weights = w.astype(dtype).reshape(groups, outputs // groups, -1)
        y = np.matmul(weights, columns).reshape(n, outputs, *geometry.output)
        if b is not None:
            y += b.astype(dtype).reshape(outputs, *(1,) * rank)
        return [y.astype(x.dtype, copy=False)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (declare(DeformConv, (19, 22), types=OPSET_TYPES),)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
