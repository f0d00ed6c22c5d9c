"""Region-of-interest pooling: RoiAlign and MaxRoiPool.

RoiAlign samples each output bin on a regular grid (``sampling_ratio`` points per axis, or
``ceil(roi size / output size)``) with bilinear interpolation; a sample more than one pixel
outside the image counts as 0. Bilinear weights are separable, so for ``mode="avg"`` one ROI
is two products, ``Ay @ X @ Ax^T``, with ``Ay`` (output height x H) and ``Ax`` (output
width x W) holding each bin's summed sample weights per row and column; ``mode="max"`` takes,
as the ONNX reference and onnxruntime do, the largest weighted corner value
``w * X[corner]`` over all samples of a bin, from one gather of the samples' corners.

MaxRoiPool rounds each ROI (``[batch, x1, y1, x2, y2]`` times ``spatial_scale``) to whole
pixels, splits it into ``pooled_shape`` bins (floor/ceil bounds, clipped to the image) and
takes each bin's maximum, 0 for an empty bin; the maximum over a rectangle is computed as the
maximum over its rows, then over its columns (one numpy call per bin row and bin column).

float16 and bfloat16 compute in float32 and round once. Neither kernel is tunable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext, compute_dtype, ints
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "MaxRoiPool", "RoiAlign"]

_FLOATS = (T.FLOAT16, T.FLOAT, T.DOUBLE)
_FLOATS_BF16 = (*_FLOATS, T.BFLOAT16)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_image(kernel: Kernel, x: np.ndarray, rois: np.ndarray, columns: int) -> None:
    if x.ndim != 4:
        raise kernel.ctx.error(f"X must have shape (N, C, H, W), got {list(x.shape)}")
    if rois.ndim != 2 or rois.shape[1] != columns:
        raise kernel.ctx.error(f"rois must have shape (num_rois, {columns}), got {list(rois.shape)}")


def _check_batches(kernel: Kernel, batches: np.ndarray, images: int) -> None:
    if batches.size and (batches.min() < 0 or batches.max() >= images):
        raise kernel.ctx.error(f"batch indices must be in [0, {images}), got {batches.tolist()}")


class RoiAlign(Kernel):
    """ONNX RoiAlign (10, 16, 22): ``avg`` or ``max``; ``coordinate_transformation_mode``
    ``half_pixel`` (the default from 16) or ``output_half_pixel`` (version 10's behaviour)."""

    op_type: ClassVar[str] = "RoiAlign"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.mode = _text(ctx.attribute("mode", "avg")).lower()
        if self.mode not in ("avg", "max"):
            raise ctx.error(f"mode must be avg or max, got {self.mode!r}")
        default = "half_pixel" if ctx.opset >= 16 else "output_half_pixel"
        transform = _text(ctx.attribute("coordinate_transformation_mode", default))
        if transform not in ("half_pixel", "output_half_pixel"):
            raise ctx.error("coordinate_transformation_mode must be half_pixel or "
                            f"output_half_pixel, got {transform!r}")
        self.half_pixel = transform == "half_pixel"
        self.output_size = (int(ctx.attribute("output_height", 1)), int(ctx.attribute("output_width", 1)))
        if min(self.output_size) < 1:
            raise ctx.error(f"output_height and output_width must be positive, got {list(self.output_size)}")
        self.sampling_ratio = int(ctx.attribute("sampling_ratio", 0))
        if self.sampling_ratio < 0:
            raise ctx.error(f"sampling_ratio must not be negative, got {self.sampling_ratio}")
        self.spatial_scale = float(ctx.attribute("spatial_scale", 1.0))

    def run(self, x: np.ndarray, rois: np.ndarray, batch_indices: np.ndarray) -> Sequence[np.ndarray]:
        _check_image(self, x, rois, 4)
        batches = batch_indices.astype(np.int64).reshape(-1)
        if batches.shape != (rois.shape[0],):
            raise self.ctx.error(f"batch_indices must hold one index per ROI ({rois.shape[0]}), "
                                 f"got shape {list(batch_indices.shape)}")
        _check_batches(self, batches, x.shape[0])
        compute = compute_dtype(x.dtype)
        data = x.astype(compute, copy=False)
        height, width = self.output_size
        y = np.empty((rois.shape[0], x.shape[1], height, width), compute)
        offset = 0.5 if self.half_pixel else 0.0
        for index, (roi, batch) in enumerate(zip(rois.astype(np.float64), batches, strict=True)):
            x1, y1, x2, y2 = roi * self.spatial_scale - offset
            rows = self._axis(y1, y2, height, x.shape[2])
            columns = self._axis(x1, x2, width, x.shape[3])
            image = data[batch]
            if self.mode == "avg":
                ay = self._weights(*rows, x.shape[2])
                ax = self._weights(*columns, x.shape[3])
                count = max(rows[0].shape[2] * columns[0].shape[2], 1)
                y[index] = (ay.astype(compute) @ image @ ax.T.astype(compute)) / compute.type(count)
            else:
                y[index] = self._max(image, rows, columns)
        return (y.astype(x.dtype, copy=False),)

    def _axis(self, start: float, end: float, bins: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Along one axis, for every (bin, sample): the low and high pixel and their weights,
        each stacked (2, bins, grid); the weights are 0 for a sample outside the image."""
        extent = end - start
        if not self.half_pixel:
            extent = max(extent, 1.0)
        step = extent / bins
        grid = self.sampling_ratio or math.ceil(extent / bins)
        grid = max(grid, 0)  # an empty ROI (half_pixel, x2 < x1) has no samples
        samples = (start + np.arange(bins)[:, None] * step
                   + (np.arange(grid)[None, :] + 0.5) * step / max(grid, 1))
        valid = (samples >= -1.0) & (samples <= size)
        samples = np.maximum(samples, 0.0)
        low = samples.astype(np.int64)
        edge = low >= size - 1
        low = np.where(edge, size - 1, low)
        high = np.where(edge, size - 1, low + 1)
        samples = np.where(edge, low, samples)
        fraction = samples - low
        weights = np.stack([(1 - fraction) * valid, fraction * valid])
        return np.stack([low, high]), weights

    @staticmethod
    def _weights(pixels: np.ndarray, weights: np.ndarray, size: int) -> np.ndarray:
        """(bins, size): each bin's summed sample weights per pixel."""
        bins = pixels.shape[1]
        matrix = np.zeros((bins, size))
        rows = np.broadcast_to(np.arange(bins)[None, :, None], pixels.shape)
        np.add.at(matrix, (rows, pixels), weights)
        return matrix

    @staticmethod
    def _max(image: np.ndarray, rows: tuple[np.ndarray, np.ndarray],
             columns: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """(C, bins_y, bins_x): the largest weighted corner value over each bin's samples."""
        row_pixels, row_weights = rows
        column_pixels, column_weights = columns
        channels = image.shape[0]
        bins_y, grid_y = row_pixels.shape[1:]
        bins_x, grid_x = column_pixels.shape[1:]
        if grid_y == 0 or grid_x == 0:
            return np.zeros((channels, bins_y, bins_x), image.dtype)
        # values[c, corner_y, bin_y, sample_y, corner_x, bin_x, sample_x]
        values = image[:, row_pixels.reshape(-1)][:, :, column_pixels.reshape(-1)]
        values = values.reshape(channels, 2, bins_y, grid_y, 2, bins_x, grid_x)
        weights = (row_weights[:, :, :, None, None, None]
                   * column_weights[None, None, None, :, :, :]).astype(image.dtype)
        return (values * weights).max(axis=(1, 3, 4, 6))


def _round_half_away(values: np.ndarray) -> np.ndarray:
    return np.sign(values) * np.floor(np.abs(values) + 0.5)


class MaxRoiPool(Kernel):
    """ONNX MaxRoiPool (1, 22): rois ``[batch_index, x1, y1, x2, y2]``, ``pooled_shape``
    bins per ROI."""

    op_type: ClassVar[str] = "MaxRoiPool"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        shape = ints(ctx.attribute("pooled_shape"))
        if shape is None or len(shape) != 2 or min(shape) < 1:
            raise ctx.error(f"pooled_shape must be two positive sizes, got {shape}")
        self.pooled_shape = (shape[0], shape[1])
        self.spatial_scale = float(ctx.attribute("spatial_scale", 1.0))

    def run(self, x: np.ndarray, rois: np.ndarray) -> Sequence[np.ndarray]:
        _check_image(self, x, rois, 5)
        batches = rois[:, 0].astype(np.int64)
        _check_batches(self, batches, x.shape[0])
        compute = compute_dtype(x.dtype)
        data = x.astype(compute, copy=False)
        bins_y, bins_x = self.pooled_shape
        y = np.zeros((rois.shape[0], x.shape[1], bins_y, bins_x), compute)
        corners = _round_half_away(rois[:, 1:].astype(np.float64) * self.spatial_scale).astype(np.int64)
        for index, (batch, (x1, y1, x2, y2)) in enumerate(zip(batches, corners, strict=True)):
            row_bounds = self._bounds(y1, y2, bins_y, x.shape[2])
            column_bounds = self._bounds(x1, x2, bins_x, x.shape[3])
            image = data[batch]
            row_max = np.zeros((x.shape[1], bins_y, x.shape[3]), compute)  # 0: an empty bin
            for by, (top, bottom) in enumerate(row_bounds):
                if bottom > top:
                    row_max[:, by] = image[:, top:bottom].max(axis=1)
            for bx, (left, right) in enumerate(column_bounds):
                if right > left:
                    y[index, :, :, bx] = row_max[:, :, left:right].max(axis=2)
        return (y.astype(x.dtype, copy=False),)

    @staticmethod
    def _bounds(start: int, end: int, bins: int, size: int) -> list[tuple[int, int]]:
        """Each bin's [begin, end) pixels along one axis, clipped to the image."""
        step = max(end - start + 1, 1) / bins
        return [(min(max(math.floor(b * step) + start, 0), size),
                 min(max(math.ceil((b + 1) * step) + start, 0), size)) for b in range(bins)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(RoiAlign, (10, 16, 22), types={10: _FLOATS, 22: _FLOATS_BF16}),
    declare(MaxRoiPool, (1, 22), types={1: _FLOATS, 22: _FLOATS_BF16}),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
