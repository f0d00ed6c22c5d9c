"""ConvTranspose: the gradient of Conv as a product followed by a col2im scatter-add.

Each group's weights, viewed as a (C/group, M/group * K) matrix, multiply the images' input
pixels in one batched product, giving every output channel's contribution at every kernel
position for every input pixel. Those columns are then added into the full output canvas,
``stride * (in - 1) + (kernel - 1) * dilation + 1`` along each axis, with one strided numpy
add per kernel position (not per pixel); the output is the window of the canvas that the
padding leaves, zeros where ``output_padding`` or ``output_shape`` reach past it.

Padding: explicit ``pads`` (with ``output_shape``, if also given, setting the size), or,
when ``output_shape`` is given or ``auto_pad`` is SAME_UPPER/SAME_LOWER without pads, the
total padding ``canvas + output_padding - output_shape`` (at least 0; output_shape is
``in * stride`` for SAME_*) split with the extra unit at the end for SAME_UPPER and at the
beginning otherwise, as the ONNX specification states. VALID pads nothing.

float16 and bfloat16 compute in float32 and round once. Not tunable yet.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from .base import Kernel, NodeContext, compute_dtype, ints
from .conv import OPSET_TYPES
from .declaration import KernelDeclaration, declare, dispatch_table
from .window import WindowAttributes

__all__ = ["KERNELS", "ConvTranspose"]


class ConvTranspose(Kernel):
    """ONNX ConvTranspose (1, 11, 22): 1-D, 2-D and 3-D, with groups, dilations and bias."""

    op_type: ClassVar[str] = "ConvTranspose"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.window = WindowAttributes.read(ctx)
        self.group = int(ctx.attribute("group", 1))
        if self.group < 1:
            raise ctx.error(f"group must be positive, got {self.group}")
        padding = ints(ctx.attribute("output_padding"))
        self.output_padding = None if padding is None else tuple(padding)
        if self.output_padding is not None and any(p < 0 for p in self.output_padding):
            raise ctx.error(f"output_padding must not be negative, got {list(self.output_padding)}")
        shape = ints(ctx.attribute("output_shape"))
        self.output_shape = None if shape is None else tuple(shape)
        if self.output_shape is not None and any(s < 1 for s in self.output_shape):
            raise ctx.error(f"output_shape must be positive, got {list(self.output_shape)}")

    def _attribute(self, name: str, value: tuple[int, ...] | None, rank: int,
                   default: int) -> tuple[int, ...]:
        if value is None:
            return (default,) * rank
        if len(value) != rank:
            raise self.ctx.error(f"{name} has {len(value)} values, the input has {rank} spatial "
                                 f"axes (expected {rank})")
        return value

    def geometry(self, spatial: Sequence[int], kernel: Sequence[int]
                 ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """``(strides, dilations, begin, output)`` for an input of spatial shape ``spatial``:
        the canvas offset of the output's first element and the output's spatial shape."""
        rank, window = len(spatial), self.window
        if window.kernel_shape is not None and tuple(window.kernel_shape) != tuple(kernel):
            raise self.ctx.error(f"kernel_shape {list(window.kernel_shape)} differs from the "
                                 f"weights' spatial shape {list(kernel)}")
        strides = self._attribute("strides", window.strides, rank, 1)
        dilations = self._attribute("dilations", window.dilations, rank, 1)
        extra = self._attribute("output_padding", self.output_padding, rank, 0)
        requested = self.output_shape
        if requested is not None and len(requested) == rank + 2:
            requested = requested[2:]  # the full output shape (N, M, ...)
        if requested is not None:
            requested = self._attribute("output_shape", requested, rank, 0)
        canvas = [s * (i - 1) + (k - 1) * d + 1 + e
                  for i, k, s, d, e in zip(spatial, kernel, strides, dilations, extra, strict=True)]
        automatic = window.auto_pad in ("SAME_UPPER", "SAME_LOWER")
        if window.pads is not None or not (automatic or requested is not None):
            pads = (0,) * (2 * rank) if window.auto_pad == "VALID" else \
                self._attribute("pads", window.pads, 2 * rank, 0)
            begin = pads[:rank]
            output = requested or tuple(c - b - f for c, b, f in
                                        zip(canvas, pads[:rank], pads[rank:], strict=True))
        else:
            output = requested or tuple(i * s for i, s in zip(spatial, strides, strict=True))
            totals = [max(0, c - o) for c, o in zip(canvas, output, strict=True)]
            upper = window.auto_pad == "SAME_UPPER"
            begin = tuple(t // 2 if upper else t - t // 2 for t in totals)
        if any(o < 1 for o in output):
            raise self.ctx.error(f"the padding leaves no output: spatial output shape {list(output)}")
        return strides, dilations, tuple(begin), tuple(output)

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
            raise self.ctx.error("needs inputs X and W")
        x, w = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        if x.ndim < 3 or w.ndim != x.ndim:
            raise self.ctx.error(f"X must be (N, C, D1, ...) and W (C, M/group, k1, ...) of the "
                                 f"same rank, got shapes {list(x.shape)} and {list(w.shape)}")
        group, channels = self.group, x.shape[1]
        if channels % group or w.shape[0] != channels:
            raise self.ctx.error(f"W has {w.shape[0]} input channels, X has {channels}, which "
                                 f"must be a multiple of group {group} and equal to W's")
        filters = w.shape[1] * group
        if bias is not None and bias.shape != (filters,):
            raise self.ctx.error(f"B must have shape [{filters}] (one per output channel), "
                                 f"got {list(bias.shape)}")
        spatial, kernel = x.shape[2:], w.shape[2:]
        strides, dilations, begin, output = self.geometry(spatial, kernel)
        compute = compute_dtype(x.dtype)
        columns = self._columns(x.astype(compute, copy=False), w.astype(compute, copy=False))
        canvas = self._scatter(columns, spatial, kernel, strides, dilations, begin, output)
        y = self._window(canvas, begin, output)
        if bias is not None:
            y += bias.astype(compute, copy=False).reshape((1, -1) + (1,) * len(spatial))
        return (y.astype(x.dtype, copy=False),)

    def _columns(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """(K, N, group, M/group, D): every filter at every kernel position (K of them, the
        leading axis, so that each position's block is contiguous) times every input pixel,
        one batched product over the groups."""
        n, _, *spatial = x.shape
        channels, per_filter, *kernel = w.shape
        group, positions = self.group, math.prod(kernel)
        per_group = channels // group
        x_groups = x.reshape(n, group, per_group, math.prod(spatial))
        w_groups = np.ascontiguousarray(  # (group, K * M/group, C/group), position-major rows
            w.reshape(group, per_group, per_filter, positions).transpose(0, 3, 2, 1)
        ).reshape(group, positions * per_filter, per_group)
        columns = np.matmul(w_groups, x_groups)  # (N, group, K * M/group, D)
        columns = columns.reshape(n, group, positions, per_filter, -1)
        return np.moveaxis(columns, 2, 0)

    def _scatter(self, columns: np.ndarray, spatial: Sequence[int], kernel: Sequence[int],
                 strides: Sequence[int], dilations: Sequence[int], begin: Sequence[int],
                 output: Sequence[int]) -> np.ndarray:
        """The (N, M, ...) canvas, large enough for the output window: one strided add per
        kernel position."""
        full = [s * (i - 1) + (k - 1) * d + 1 for i, k, s, d in
                zip(spatial, kernel, strides, dilations, strict=True)]
        size = [max(f, b + o) for f, b, o in zip(full, begin, output, strict=True)]
        _, n, group, per_filter, _ = columns.shape
        canvas = np.zeros((n, group, per_filter, *size), columns.dtype)
        lead = (slice(None),) * 3
        for index, position in enumerate(itertools.product(*(range(k) for k in kernel))):
            target = tuple(slice(p * d, p * d + s * (i - 1) + 1, s) for p, d, s, i in
                           zip(position, dilations, strides, spatial, strict=True))
            canvas[(*lead, *target)] += columns[index].reshape(n, group, per_filter, *spatial)
        return canvas.reshape(n, group * per_filter, *size)

    @staticmethod
    def _window(canvas: np.ndarray, begin: Sequence[int], output: Sequence[int]) -> np.ndarray:
        """The output: the canvas from ``begin`` on, ``output`` long (``begin`` >= 0 here)."""
        index = tuple(slice(b, b + o) for b, o in zip(begin, output, strict=True))
        return np.ascontiguousarray(canvas[(slice(None), slice(None), *index)])


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(ConvTranspose, (1, 11, 22), types=OPSET_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
