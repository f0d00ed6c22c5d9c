"""Kernels that move blocks of pixels: DepthToSpace, SpaceToDepth, CenterCropPad, Col2Im.

DepthToSpace and SpaceToDepth are one reshape, one transpose and one copy; CenterCropPad is
one slice of the input copied into the (zero-filled) centre of the output; Col2Im adds each
of the block's positions into a strided view of the padded image, one numpy call per block
position. None is tunable.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from .base import Kernel, NodeContext, ints, normalize_axes
from .declaration import KernelDeclaration, declare, dispatch_table
from .structural import zero

__all__ = ["KERNELS", "CenterCropPad", "Col2Im", "DepthToSpace", "SpaceToDepth"]

Arrays = Sequence[np.ndarray]


def _blocksize(ctx: NodeContext) -> int:
    size = ctx.attribute("blocksize")
    if size is None or int(size) < 1:
        raise ctx.error(f"attribute 'blocksize' must be a positive integer, got {size!r}")
    return int(size)


def _image(ctx: NodeContext, x: np.ndarray) -> tuple[int, int, int, int]:
    if x.ndim != 4:
        raise ctx.error(f"input must be (N, C, H, W), got shape {list(x.shape)}")
    return x.shape


def _mode(ctx: NodeContext, since_version: int) -> str:
    """The ``mode`` attribute: DCR (the default) or CRD, the latter from ``since_version``."""
    mode = ctx.attribute("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    modes = ("DCR", "CRD") if ctx.opset >= since_version else ("DCR",)
    if mode not in modes:
        raise ctx.error(f"mode must be one of {list(modes)} at opset {ctx.opset}, got {mode!r}")
    return mode


class DepthToSpace(Kernel):
    """ONNX DepthToSpace (1, 11, 13, 28): channels rearranged into ``blocksize`` x
    ``blocksize`` blocks of pixels, depth-column-row (DCR, the default) or
    column-row-depth (CRD, from 11) ordered."""

    op_type: ClassVar[str] = "DepthToSpace"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.blocksize = _blocksize(ctx)
        self.mode = _mode(ctx, 11)

    def run(self, x: np.ndarray) -> Arrays:
        n, c, h, w = _image(self.ctx, x)
        b = self.blocksize
        if c % (b * b):
            raise self.ctx.error(f"{c} channels are not a multiple of blocksize^2 = {b * b}")
        if self.mode == "DCR":
            blocks = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            blocks = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return [blocks.reshape(n, c // (b * b), h * b, w * b)]


class SpaceToDepth(Kernel):
    """ONNX SpaceToDepth (1, 13, 28): each ``blocksize`` x ``blocksize`` block of pixels
    moved into channels, DepthToSpace's inverse in its DCR (default) or CRD (from 28) order."""

    op_type: ClassVar[str] = "SpaceToDepth"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.blocksize = _blocksize(ctx)
        self.mode = _mode(ctx, 28)

    def run(self, x: np.ndarray) -> Arrays:
        n, c, h, w = _image(self.ctx, x)
        b = self.blocksize
        if h % b or w % b:
            raise self.ctx.error(f"height {h} and width {w} must be multiples of blocksize {b}")
        blocks = x.reshape(n, c, h // b, b, w // b, b)
        blocks = blocks.transpose((0, 3, 5, 1, 2, 4) if self.mode == "DCR" else (0, 1, 3, 5, 2, 4))
        return [blocks.reshape(n, c * b * b, h // b, w // b)]


class CenterCropPad(Kernel):
    """ONNX CenterCropPad (18): each of ``axes`` (all by default) cut or zero-padded to the
    length ``shape`` gives, around its centre (an odd difference puts the extra entry at the
    end)."""

    op_type: ClassVar[str] = "CenterCropPad"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axes = ints(ctx.attribute("axes"))

    def run(self, x: np.ndarray, shape: np.ndarray) -> Arrays:
        axes = normalize_axes(self.ctx, range(x.ndim) if self.axes is None else self.axes, x.ndim)
        lengths = ints(shape)
        if len(lengths) != len(axes) or min(lengths, default=0) < 0:
            raise self.ctx.error(f"shape {lengths} must hold a non-negative length for each of "
                                 f"the axes {list(axes)}")
        target = list(x.shape)
        source, destination = [slice(None)] * x.ndim, [slice(None)] * x.ndim
        for axis, length in zip(axes, lengths, strict=True):
            dim = x.shape[axis]
            target[axis] = length
            if length <= dim:
                start = (dim - length) // 2
                source[axis] = slice(start, start + length)
            else:
                start = (length - dim) // 2
                destination[axis] = slice(start, start + dim)
        out = np.full(target, zero(x.dtype), x.dtype)
        out[tuple(destination)] = x[tuple(source)]
        return [out]


class Col2Im(Kernel):
    """ONNX Col2Im (18): (N, C * prod(block_shape), L) columns summed back into
    (N, C, *image_shape) images, the inverse layout of an im2col with ``dilations``,
    ``pads`` and ``strides``."""

    op_type: ClassVar[str] = "Col2Im"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.dilations = ints(ctx.attribute("dilations"))
        self.pads = ints(ctx.attribute("pads"))
        self.strides = ints(ctx.attribute("strides"))
        for name in ("dilations", "strides"):
            if any(v < 1 for v in getattr(self, name) or ()):
                raise ctx.error(f"{name} must be positive, got {getattr(self, name)}")
        if any(p < 0 for p in self.pads or ()):
            raise ctx.error(f"pads must not be negative, got {self.pads}")

    def run(self, x: np.ndarray, image_shape: np.ndarray, block_shape: np.ndarray) -> Arrays:
        image, block = ints(image_shape), ints(block_shape)
        rank = len(image)
        dilations = self.dilations or [1] * rank
        strides = self.strides or [1] * rank
        pads = self.pads or [0] * (2 * rank)
        if len(block) != rank or len(dilations) != rank or len(strides) != rank or len(pads) != 2 * rank:
            raise self.ctx.error(f"image_shape {image}, block_shape {block}, dilations {dilations}, "
                                 f"strides {strides} and pads {pads} disagree on the rank")
        padded = [i + pads[a] + pads[a + rank] for a, i in enumerate(image)]
        grid = [(p - (k - 1) * d - 1) // s + 1
                for p, k, d, s in zip(padded, block, dilations, strides, strict=True)]
        size = math.prod(block)
        if x.ndim != 3 or x.shape[1] % size or x.shape[2] != math.prod(grid) or min(grid) < 1:
            raise self.ctx.error(f"input of shape {list(x.shape)} must be (N, C * {size}, "
                                 f"{math.prod(grid)}) for blocks {block} over image {image}")
        n, channels = x.shape[0], x.shape[1] // size
        columns = x.reshape(n, channels, *block, *grid)
        out = np.zeros((n, channels, *padded), x.dtype)
        for position in itertools.product(*(range(k) for k in block)):
            window = tuple(slice(k * d, k * d + (g - 1) * s + 1, s)
                           for k, d, g, s in zip(position, dilations, grid, strides, strict=True))
            out[(slice(None), slice(None), *window)] += columns[(slice(None), slice(None), *position)]
        crop = tuple(slice(pads[a], pads[a] + i) for a, i in enumerate(image))
        return [np.ascontiguousarray(out[(slice(None), slice(None), *crop)])]


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(CenterCropPad, (18,)),
    declare(Col2Im, (18,)),
    declare(DepthToSpace, (1, 11, 13, 28)),
    declare(SpaceToDepth, (1, 13, 28)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
