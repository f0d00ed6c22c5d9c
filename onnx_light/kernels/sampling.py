"""Spatial sampling: AffineGrid and GridSample.

AffineGrid maps the evenly spaced positions of a (N, C, H, W) or (N, C, D, H, W) image in
[-1, 1] through each affine matrix. GridSample reads an image at such positions: each
normalized coordinate is mapped to pixel units (``align_corners``: -1 and 1 are the corner
pixels' centres, else their outer edges), rounded half to even for ``nearest``; coordinates
outside the image are clamped (``border``) or reflected (``reflection``) first; then every
tap of the interpolation (1 for nearest, 2 per axis for linear, 4 for cubic with Keys'
a = -0.75) is one fancy-indexed gather of all output positions at once, with indices outside
the image giving 0 (``zeros``), the edge pixel (``border``) or their reflection. Taps
compute in float32 (float64 for float64 images). Not tunable.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from .base import FLOAT_TYPES, NUMERIC_TYPES, Kernel, NodeContext, compute_dtype, ints
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "AffineGrid", "GridSample"]

Arrays = Sequence[np.ndarray]


def _positions(length: int, align_corners: bool) -> np.ndarray:
    """The normalized centres of ``length`` pixels along one axis."""
    if align_corners:
        return np.linspace(-1, 1, length)  # one pixel: -1, as the reference has it
    return (2 * np.arange(length) + 1) / length - 1


class AffineGrid(Kernel):
    """ONNX AffineGrid (20): (N, H, W, 2) or (N, D, H, W, 3) positions ``theta @ [x, y(, z), 1]``."""

    op_type: ClassVar[str] = "AffineGrid"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.align_corners = bool(ctx.attribute("align_corners", 0))

    def run(self, theta: np.ndarray, size: np.ndarray) -> Arrays:
        dims = ints(size)
        rank = len(dims) - 2
        if rank not in (2, 3) or theta.shape != (dims[0], rank, rank + 1):
            raise self.ctx.error(f"theta of shape {list(theta.shape)} and size {dims} must be (N, 2, 3) "
                                 "with (N, C, H, W) or (N, 3, 4) with (N, C, D, H, W)")
        spatial = dims[2:]  # (H, W) or (D, H, W); coordinates are (x, y[, z]), the last axis first
        axes = np.meshgrid(*(_positions(n, self.align_corners) for n in spatial), indexing="ij")
        homogeneous = np.stack([*reversed(axes), np.ones(spatial)], axis=-1).reshape(-1, rank + 1)
        compute = compute_dtype(theta.dtype)
        grid = np.einsum("pk,nrk->npr", homogeneous.astype(compute), theta.astype(compute))
        return [grid.reshape(dims[0], *spatial, rank).astype(theta.dtype)]


_MODES = {16: ("bilinear", "nearest", "bicubic"), 20: ("linear", "nearest", "cubic")}
_CANONICAL = {"bilinear": "linear", "bicubic": "cubic"}


def _reflect(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """``x`` reflected at ``low`` and ``high`` (back and forth) until it lies between them."""
    span = high - low
    if span <= 0:
        return np.full_like(x, low)
    with np.errstate(invalid="ignore"):
        below, above = low - x, x - high
        below_folds, above_folds = np.floor(below / span), np.floor(above / span)
        below_rest, above_rest = below - below_folds * span, above - above_folds * span
        from_low = np.where(below_folds % 2 == 0, low + below_rest, high - below_rest)
        from_high = np.where(above_folds % 2 == 0, high - above_rest, low + above_rest)
    return np.where(x < low, from_low, np.where(x > high, from_high, x))


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 from floor(x)."""
    a = -0.75

    def near(d: np.ndarray) -> np.ndarray:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: np.ndarray) -> np.ndarray:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


class GridSample(Kernel):
    """ONNX GridSample (16, 20, 22): the image at the grid's normalized positions."""

    op_type: ClassVar[str] = "GridSample"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        modes = _MODES[20 if ctx.opset >= 20 else 16]
        mode = ctx.attribute("mode", modes[0])
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode not in modes:
            raise ctx.error(f"mode must be one of {list(modes)} at opset {ctx.opset}, got {mode!r}")
        self.mode = _CANONICAL.get(mode, mode)
        padding = ctx.attribute("padding_mode", "zeros")
        self.padding = padding.decode() if isinstance(padding, bytes) else str(padding)
        if self.padding not in ("zeros", "border", "reflection"):
            raise ctx.error(f"padding_mode must be 'zeros', 'border' or 'reflection', got {self.padding!r}")
        self.align_corners = bool(ctx.attribute("align_corners", 0))

    def run(self, x: np.ndarray, grid: np.ndarray) -> Arrays:
        rank = x.ndim - 2
        if rank < 1 or (self.ctx.opset < 20 and rank != 2) or grid.ndim != x.ndim \
                or grid.shape[0] != x.shape[0] or grid.shape[-1] != rank:
            raise self.ctx.error(f"X {list(x.shape)} must be (N, C, D1, ...) and grid {list(grid.shape)} "
                                 f"(N, ..., {rank}) with as many axes")
        n, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
        compute = compute_dtype(x.dtype)
        coordinates = [self._pixels(grid[..., rank - 1 - axis].astype(np.float32), spatial[axis])
                       for axis in range(rank)]
        taps_per_axis = [self._taps(c, spatial[axis]) for axis, c in enumerate(coordinates)]
        image = np.moveaxis(x.astype(compute, copy=False), 1, -1)  # (N, *spatial, C)
        batch = np.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))
        out = np.zeros((*grid.shape[:-1], channels), compute)
        for taps in itertools.product(*taps_per_axis):
            weight = math.prod((w for _, w, _ in taps), start=np.ones((), compute))
            valid = math.prod((v for _, _, v in taps), start=np.ones((), bool))
            picked = image[(batch, *(i for i, _, _ in taps))]
            out += (np.where(valid, weight, 0).astype(compute))[..., np.newaxis] * picked
        return [np.moveaxis(out, -1, 1).astype(x.dtype)]

    def _pixels(self, normalized: np.ndarray, length: int) -> np.ndarray:
        """Normalized coordinates in pixel units, rounded for nearest, clamped or reflected
        where they fall outside the image."""
        if self.align_corners:
            x = (normalized + 1) / 2 * (length - 1)
            low, high = 0.0, length - 1.0
        else:
            x = ((normalized + 1) * length - 1) / 2
            low, high = -0.5, length - 0.5
        if self.mode == "nearest":
            x = np.rint(x)
        outside = (x < low) | (x > high)
        if self.padding == "border":
            x = np.where(outside, np.clip(x, 0, length - 1), x)
        elif self.padding == "reflection":
            x = np.where(outside, _reflect(x, low, high), x)
        return x

    def _taps(self, x: np.ndarray, length: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(index, weight, valid) of each interpolation tap along one axis."""
        if self.mode == "nearest":
            return [self._fetch(x.astype(np.int64), length, np.ones_like(x))]
        base = np.floor(x)
        t = x - base
        base = base.astype(np.int64)
        if self.mode == "linear":
            return [self._fetch(base, length, 1 - t), self._fetch(base + 1, length, t)]
        return [self._fetch(base + k - 1, length, w) for k, w in enumerate(_cubic_weights(t))]

    def _fetch(self, index: np.ndarray, length: int,
               weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where tap ``index`` reads: 0 outside the image (zeros), its edge (border) or its
        reflection (reflection)."""
        if self.padding == "zeros":
            valid = (index >= 0) & (index < length)
            return np.clip(index, 0, length - 1), weight, valid
        if self.padding == "border":
            return np.clip(index, 0, length - 1), weight, np.ones(index.shape, bool)
        low, high = (0.0, length - 1.0) if self.align_corners else (-0.5, length - 0.5)
        reflected = np.trunc(_reflect(index.astype(np.float64), low, high)).astype(np.int64)
        return np.clip(reflected, 0, length - 1), weight, np.ones(index.shape, bool)


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(AffineGrid, (20,), types=FLOAT_TYPES),
    declare(GridSample, (16, 20, 22), types=NUMERIC_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
