"""Resize and Upsample: one axis at a time, through index and weight tables.

For each resized axis the output positions are mapped to input coordinates by the
coordinate transformation mode; the interpolation (nearest, linear or cubic, widened by
``1 / scale`` with antialias when downsampling) gives each output position a few taps, an
input index (clamped to the edge) and a weight. The axis is then resized by one gather per
tap and a weighted sum, in float64 as the ONNX reference computes (nearest: one gather in
the input's type). ``tf_crop_and_resize`` sets positions whose coordinate falls outside the
input to ``extrapolation_value``.
Upsample is Resize with ``asymmetric`` coordinates and ``floor`` rounding. Not tunable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from .base import NUMERIC_TYPES, Kernel, NodeContext, normalize_axes
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "Resize", "Upsample"]

Arrays = Sequence[np.ndarray]

_MODES = ("nearest", "linear", "cubic")
_TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
               "asymmetric", "tf_crop_and_resize")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_POLICIES = ("stretch", "not_larger", "not_smaller")


def _text(ctx: NodeContext, name: str, default: str, allowed: Sequence[str]) -> str:
    value = ctx.attribute(name, default)
    value = value.decode() if isinstance(value, bytes) else str(value)
    if value not in allowed:
        raise ctx.error(f"attribute {name!r} must be one of {list(allowed)}, got {value!r}")
    return value


class _AxisPlan:
    """How one axis is resized: its tap indices and weights, and where it extrapolates."""

    def __init__(self, indices: np.ndarray, weights: np.ndarray, outside: np.ndarray | None):
        self.indices, self.weights, self.outside = indices, weights, outside


class Resize(Kernel):
    """ONNX Resize (10, 11, 13, 18, 19) of every mode, coordinate transformation, rounding,
    aspect ratio policy and antialias."""

    op_type: ClassVar[str] = "Resize"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.mode = _text(ctx, "mode", "nearest", _MODES)
        legacy = ctx.op_type == "Upsample" or ctx.opset < 11
        if legacy:
            self.transform, self.nearest_mode = "asymmetric", "floor"
            if self.mode == "cubic":
                raise ctx.error(f"mode 'cubic' needs Resize-11 or newer (opset {ctx.opset})")
        else:
            self.transform = _text(ctx, "coordinate_transformation_mode", "half_pixel",
                                   _TRANSFORMS)
            self.nearest_mode = _text(ctx, "nearest_mode", "round_prefer_floor", _NEAREST_MODES)
        self.cubic_a = float(ctx.attribute("cubic_coeff_a", -0.75))
        self.exclude_outside = bool(ctx.attribute("exclude_outside", 0))
        self.extrapolation = float(ctx.attribute("extrapolation_value", 0.0))
        self.policy = _text(ctx, "keep_aspect_ratio_policy", "stretch", _POLICIES)
        self.antialias = bool(ctx.attribute("antialias", 0)) and self.mode != "nearest"
        axes = ctx.attribute("axes")
        self.axes = None if axes is None else [int(a) for a in axes]

    def run(self, x: np.ndarray, *inputs: np.ndarray | None) -> Arrays:
        if self.ctx.opset < 11 or self.ctx.op_type == "Upsample":
            roi, scales, sizes = None, (inputs[0] if inputs else None), None
        else:
            roi, scales, sizes = (list(inputs) + [None] * 3)[:3]
        return [self.resize(x, _given(roi), _given(scales), _given(sizes))]

    def resize(self, x: np.ndarray, roi: np.ndarray | None, scales: np.ndarray | None,
               sizes: np.ndarray | None) -> np.ndarray:
        rank = x.ndim
        axes = list(range(rank)) if self.axes is None else list(normalize_axes(self.ctx, self.axes, rank))
        if (scales is None) == (sizes is None):
            raise self.ctx.error("exactly one of 'scales' and 'sizes' must be given, got "
                                 + ("both" if scales is not None else "neither"))
        given = scales if scales is not None else sizes
        if given.size != len(axes):
            raise self.ctx.error(f"{'scales' if scales is not None else 'sizes'} has {given.size} "
                                 f"values; the input of rank {rank} resizes {len(axes)} axes")
        shape = [x.shape[a] for a in axes]
        if scales is not None:
            factors = [float(s) for s in scales.reshape(-1)]
            if min(factors) <= 0:
                raise self.ctx.error(f"scales must be positive, got {factors}")
            out = [int(f * n) for f, n in zip(factors, shape, strict=True)]
        else:
            out = [int(s) for s in sizes.reshape(-1)]
            if min(out) < 0:
                raise self.ctx.error(f"sizes must not be negative, got {out}")
            factors = [o / n for o, n in zip(out, shape, strict=True)]
            if self.policy != "stretch":
                scale = min(factors) if self.policy == "not_larger" else max(factors)
                factors = [scale] * len(axes)
                out = [int(scale * n + 0.5) for n in shape]
        if roi is not None and self.transform == "tf_crop_and_resize":
            if roi.size != 2 * len(axes):
                raise self.ctx.error(f"roi has {roi.size} values, needs 2 x {len(axes)}")
            starts, ends = roi.reshape(2, -1).astype(np.float64)
        else:
            starts, ends = np.zeros(len(axes)), np.ones(len(axes))
        nearest = self.mode == "nearest"
        result = x if nearest else x.astype(np.float64)  # nearest picks values: no arithmetic
        for axis, n, o, f, lo, hi in zip(axes, shape, out, factors, starts, ends, strict=True):
            if o == n and f == 1.0 and (self.transform != "tf_crop_and_resize"
                                        or (lo == 0.0 and hi == 1.0)):
                continue
            result = self._apply(result, axis, self._plan(n, o, f, lo, hi))
        if not nearest and not np.issubdtype(x.dtype, np.floating):
            info = np.iinfo(x.dtype)
            result = np.clip(np.rint(result), info.min, info.max)
        return result.astype(x.dtype, copy=result is x)

    def _coordinates(self, n: int, o: int, f: float, lo: float, hi: float) -> np.ndarray:
        """The input coordinate of each of the ``o`` output positions along an axis of ``n``."""
        pos = np.arange(o, dtype=np.float64)
        width = f * n  # the reference's (possibly fractional) resized length
        t = self.transform
        if t == "align_corners":
            return np.zeros(o) if width == 1 else pos * (n - 1) / (width - 1)
        if t == "asymmetric":
            return pos / f
        if t == "tf_crop_and_resize":
            if width == 1:
                return np.full(o, (hi - lo) * (n - 1) / 2 + lo * (n - 1))
            return pos * (hi - lo) * (n - 1) / (width - 1) + lo * (n - 1)
        if t == "pytorch_half_pixel" and width == 1:
            return np.full(o, -0.5)
        coordinates = (pos + 0.5) / f - 0.5
        if t == "half_pixel_symmetric":
            coordinates += n / 2 * (1 - o / width)
        return coordinates

    def _plan(self, n: int, o: int, f: float, lo: float, hi: float) -> _AxisPlan:
        """The taps of every output position along one axis."""
        coordinates = self._coordinates(n, o, f, lo, hi)
        base = np.floor(coordinates)
        exact = coordinates == base
        # As the reference: an integer coordinate counts as ratio 1 from its left neighbour.
        ratio = np.where(exact, 1.0, coordinates - base)[:, np.newaxis]
        base = np.where(exact, base - 1, base).astype(np.int64)[:, np.newaxis]
        if self.mode == "nearest":
            mode = self.nearest_mode
            if mode == "round_prefer_floor":
                up = ratio > 0.5
            elif mode == "round_prefer_ceil":
                up = ratio >= 0.5
            else:
                up = np.full(ratio.shape, mode == "ceil")
            up |= exact[:, np.newaxis]
            offsets, weights = up.astype(np.int64), np.ones(ratio.shape)
        else:
            support = 1.0 if self.mode == "linear" else 2.0
            scale = min(f, 1.0) if self.antialias else 1.0
            start = int(np.floor(-support / scale) + 1)
            offsets = np.arange(start, 2 - start)[np.newaxis, :]
            distance = np.abs((offsets - ratio) * scale)
            weights = self._kernel(distance)
            if self.antialias:
                weights = weights / weights.sum(axis=1, keepdims=True)
        indices = base + offsets
        if self.exclude_outside and self.mode != "nearest":
            weights = np.where((indices >= 0) & (indices < n), weights, 0.0)
            weights = weights / weights.sum(axis=1, keepdims=True)
        outside = None
        if self.transform == "tf_crop_and_resize":
            outside = (coordinates < 0) | (coordinates > n - 1)
        return _AxisPlan(np.clip(indices, 0, n - 1), weights, outside)

    def _kernel(self, d: np.ndarray) -> np.ndarray:
        """The linear or cubic (Keys, ``cubic_coeff_a``) interpolation kernel at distances ``d``."""
        if self.mode == "linear":
            return np.clip(1 - d, 0, 1)
        a = self.cubic_a
        near = ((a + 2) * d - (a + 3)) * d * d + 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        return np.where(d <= 1, near, np.where(d < 2, far, 0.0))

    def _apply(self, data: np.ndarray, axis: int, plan: _AxisPlan) -> np.ndarray:
        if self.mode == "nearest":
            result = np.take(data, plan.indices[:, 0], axis=axis)
            if plan.outside is not None:
                np.moveaxis(result, axis, -1)[..., plan.outside] = self.extrapolation
            return result
        moved = np.moveaxis(data, axis, -1)
        result = np.zeros((*moved.shape[:-1], plan.indices.shape[0]))
        for tap in range(plan.indices.shape[1]):
            result += moved[..., plan.indices[:, tap]] * plan.weights[:, tap]
        if plan.outside is not None:
            result[..., plan.outside] = self.extrapolation
        return np.moveaxis(result, -1, axis)


def _given(value: np.ndarray | None) -> np.ndarray | None:
    """An optional input, None when omitted or empty (the older opsets' way to omit it)."""
    return None if value is None or np.asarray(value).size == 0 else np.asarray(value)


class Upsample(Resize):
    """ONNX Upsample (7: ``scales`` attribute, 9: ``scales`` input), nearest or linear."""

    op_type: ClassVar[str] = "Upsample"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        if self.mode not in ("nearest", "linear"):
            raise ctx.error(f"mode must be 'nearest' or 'linear', got {self.mode!r}")
        scales = ctx.attribute("scales")
        self.scales = None if scales is None else np.asarray(scales, np.float64)

    def run(self, x: np.ndarray, *inputs: np.ndarray | None) -> Arrays:
        scales = _given(inputs[0]) if inputs else self.scales
        if scales is None:
            raise self.ctx.error("needs scales: the 'scales' attribute (7) or input (9)")
        return [self.resize(x, None, scales, None)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(Resize, (10, 11, 13, 18, 19), types=NUMERIC_TYPES),
    declare(Upsample, (7, 9), types=NUMERIC_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
