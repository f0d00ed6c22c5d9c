"""Indexing kernels: GatherND, the Scatter family, TensorScatter, Compress, ReverseSequence.

Each kernel turns ONNX's index tensors into one numpy fancy index (a tuple of integer arrays,
negative indices counted from the end, any index out of range the node's error) and makes one
numpy call with it: a copy then an assignment for the scatters, or ``ufunc.at`` where a
``reduction`` combines duplicates in index order. None is tunable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from .base import Kernel, NodeContext, normalize_axis
from .declaration import KernelDeclaration, declare, dispatch_table
from .structural import _indices

__all__ = ["KERNELS", "Compress", "GatherND", "ReverseSequence", "Scatter", "ScatterElements",
           "ScatterND", "TensorScatter"]

Arrays = list[np.ndarray]

# reduction -> the ufunc whose ``at`` applies it (None: plain assignment); by since_version
_REDUCTIONS: dict[str, np.ufunc | None] = {
    "none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
}
_REDUCTIONS_BY_OPSET: Mapping[int, tuple[str, ...]] = {
    1: ("none",), 16: ("none", "add", "mul"), 18: ("none", "add", "mul", "max", "min"),
}


def _reduction(ctx: NodeContext) -> np.ufunc | None:
    """The ufunc of the node's ``reduction`` attribute, checked against its opset."""
    allowed = _REDUCTIONS_BY_OPSET[max(v for v in _REDUCTIONS_BY_OPSET if v <= ctx.opset)]
    reduction = ctx.attribute("reduction", "none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction not in allowed:
        raise ctx.error(f"reduction must be one of {list(allowed)} at opset {ctx.opset}, "
                        f"got {reduction!r}")
    return _REDUCTIONS[reduction]


def _scatter(data: np.ndarray, index: tuple[np.ndarray, ...], updates: np.ndarray,
             reduction: np.ufunc | None) -> np.ndarray:
    """A copy of ``data`` with ``updates`` written (or combined by ``reduction``) at ``index``."""
    out = data.copy()
    if reduction is None:
        out[index] = updates
    elif out.dtype == np.bool_ and reduction in (np.add, np.multiply):
        (np.logical_or if reduction is np.add else np.logical_and).at(out, index, updates)
    else:
        reduction.at(out, index, updates)
    return out


def _tuple_index(ctx: NodeContext, indices: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Index tuples (the last axis of ``indices``, one entry per leading axis of ``shape``) as
    a numpy fancy index, each column bounded by its axis."""
    depth = indices.shape[-1]
    if depth > len(shape):
        raise ctx.error(f"indices address {depth} axes of a tensor of rank {len(shape)}")
    return tuple(_indices(ctx, indices[..., i], shape[i]) for i in range(depth))


def _element_index(ctx: NodeContext, indices: np.ndarray, axis: int,
                   shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """ScatterElements' index: ``indices`` along ``axis``, each other axis its own position."""
    if indices.ndim != len(shape) or any(n > shape[i] for i, n in enumerate(indices.shape) if i != axis):
        raise ctx.error(f"indices of shape {list(indices.shape)} do not fit data of shape {list(shape)}")
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = _indices(ctx, indices, shape[axis])
    return tuple(grid)


class ScatterND(Kernel):
    """ONNX ScatterND (11, 13, 16, 18): ``updates`` at the index tuples of ``indices``."""

    op_type: ClassVar[str] = "ScatterND"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.reduction = _reduction(ctx)

    def run(self, data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> Arrays:
        if indices.ndim < 1:
            raise self.ctx.error("indices must have rank 1 or more")
        index = _tuple_index(self.ctx, indices, data.shape)
        expected = indices.shape[:-1] + data.shape[indices.shape[-1]:]
        if updates.shape != expected:
            raise self.ctx.error(f"updates must have shape {list(expected)}, got {list(updates.shape)}")
        return [_scatter(data, index, updates, self.reduction)]


class ScatterElements(Kernel):
    """ONNX ScatterElements (11, 13, 16, 18): ``updates[i][j]`` at ``[indices[i][j]][j]``
    (axis 0; likewise on any ``axis``)."""

    op_type: ClassVar[str] = "ScatterElements"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = int(ctx.attribute("axis", 0))
        self.reduction = _reduction(ctx)

    def run(self, data: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, data.ndim)
        if updates.shape != indices.shape:
            raise self.ctx.error(f"updates of shape {list(updates.shape)} must have the shape of "
                                 f"indices, {list(indices.shape)}")
        index = _element_index(self.ctx, indices, axis, data.shape)
        return [_scatter(data, index, updates, self.reduction)]


class Scatter(ScatterElements):
    """ONNX Scatter (9; deprecated at 11): ScatterElements without ``reduction``."""

    op_type: ClassVar[str] = "Scatter"


class TensorScatter(Kernel):
    """ONNX TensorScatter (24): a copy of ``past_cache`` with ``update`` written along
    ``axis`` from each batch entry's ``write_indices`` on (0 without them), wrapping around
    the axis in ``circular`` mode."""

    op_type: ClassVar[str] = "TensorScatter"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = int(ctx.attribute("axis", -2))
        mode = ctx.attribute("mode", "linear")
        self.mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if self.mode not in ("linear", "circular"):
            raise ctx.error(f"mode must be 'linear' or 'circular', got {self.mode!r}")

    def run(self, past: np.ndarray, update: np.ndarray, write_indices: np.ndarray | None = None) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, past.ndim)
        if axis == 0:
            raise self.ctx.error("axis must not be the batch axis 0")
        if update.ndim != past.ndim or any(u != p for i, (u, p) in enumerate(zip(update.shape, past.shape,
                                                                                 strict=True)) if i != axis):
            raise self.ctx.error(f"update of shape {list(update.shape)} must be past_cache's shape "
                                 f"{list(past.shape)} but along axis {axis}")
        batch, capacity, length = past.shape[0], past.shape[axis], update.shape[axis]
        starts = (np.zeros(batch, np.int64) if write_indices is None
                  else np.asarray(write_indices, np.int64).reshape(-1))
        if starts.size != batch or (starts.size and starts.min() < 0):
            raise self.ctx.error(f"write_indices must hold {batch} non-negative indices, got "
                                 f"{starts.tolist()}")
        positions = starts[:, None] + np.arange(length)  # (batch, length)
        if self.mode == "circular":
            positions %= capacity
        elif positions.size and positions.max() >= capacity:
            raise self.ctx.error(f"write_indices {starts.tolist()} + {length} updates pass the cache's "
                                 f"{capacity} entries (mode 'linear')")
        shape = [1] * past.ndim
        shape[0], shape[axis] = batch, length
        grid = list(np.indices(update.shape, sparse=True))
        grid[axis] = positions.reshape(shape)
        out = past.copy()
        out[tuple(grid)] = update
        return [out]


class GatherND(Kernel):
    """ONNX GatherND (11, 12, 13): slices of ``data`` at the index tuples of ``indices``, the
    first ``batch_dims`` axes shared by both."""

    op_type: ClassVar[str] = "GatherND"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.batch_dims = int(ctx.attribute("batch_dims", 0))
        if self.batch_dims < 0:
            raise ctx.error(f"batch_dims must not be negative, got {self.batch_dims}")

    def run(self, data: np.ndarray, indices: np.ndarray) -> Arrays:
        b = self.batch_dims
        if b >= min(data.ndim, indices.ndim) or data.shape[:b] != indices.shape[:b]:
            raise self.ctx.error(f"batch_dims {b} must name leading axes shared by data "
                                 f"{list(data.shape)} and indices {list(indices.shape)}")
        batch = math.prod(data.shape[:b])
        rows = data.reshape(batch, *data.shape[b:])
        tuples = indices.reshape(batch, -1, indices.shape[-1])
        index = _tuple_index(self.ctx, tuples, rows.shape[1:])
        gathered = rows[(np.arange(batch).reshape(-1, 1), *index)]
        depth = indices.shape[-1]
        return [gathered.reshape(indices.shape[:-1] + data.shape[b + depth:])]


class Compress(Kernel):
    """ONNX Compress (9, 11, 28): the slices along ``axis`` (of the flattened input without
    one) where ``condition`` is true; a shorter condition keeps only the slices it covers."""

    op_type: ClassVar[str] = "Compress"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = ctx.attribute("axis")

    def run(self, x: np.ndarray, condition: np.ndarray) -> Arrays:
        if condition.ndim != 1:
            raise self.ctx.error(f"condition must be 1-D, got shape {list(condition.shape)}")
        if self.axis is None:
            x, axis = x.reshape(-1), 0
        else:
            axis = normalize_axis(self.ctx, int(self.axis), x.ndim)
        if condition.size > x.shape[axis]:
            raise self.ctx.error(f"condition has {condition.size} values, the axis has {x.shape[axis]}")
        return [np.compress(condition.astype(bool), x, axis=axis)]


class ReverseSequence(Kernel):
    """ONNX ReverseSequence (10, 28): along ``time_axis``, the first ``sequence_lens[b]``
    entries of each batch entry ``b`` (on ``batch_axis``) reversed, the rest copied."""

    op_type: ClassVar[str] = "ReverseSequence"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.batch_axis = int(ctx.attribute("batch_axis", 1))
        self.time_axis = int(ctx.attribute("time_axis", 0))
        if {self.batch_axis, self.time_axis} != {0, 1}:
            raise ctx.error(f"batch_axis and time_axis must be 0 and 1 in some order, got "
                            f"{self.batch_axis} and {self.time_axis}")

    def run(self, x: np.ndarray, sequence_lens: np.ndarray) -> Arrays:
        if x.ndim < 2:
            raise self.ctx.error(f"input must have rank 2 or more, got {x.ndim}")
        steps, batch = x.shape[self.time_axis], x.shape[self.batch_axis]
        lengths = np.asarray(sequence_lens, np.int64).reshape(-1)
        if lengths.size != batch or (lengths.size and (lengths.min() < 0 or lengths.max() > steps)):
            raise self.ctx.error(f"sequence_lens {lengths.tolist()} must hold {batch} lengths in "
                                 f"[0, {steps}]")
        t = np.arange(steps).reshape(-1, 1)
        source = np.where(t < lengths, lengths - 1 - t, t)  # (time, batch)
        if self.time_axis == 1:
            source = source.T
        source = source.reshape(source.shape + (1,) * (x.ndim - 2))
        return [np.take_along_axis(x, np.broadcast_to(source, x.shape), axis=self.time_axis)]


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(Compress, (9, 11, 28)),
    declare(GatherND, (11, 12, 13)),
    declare(ReverseSequence, (10, 28)),
    declare(Scatter, (9,)),  # deprecated at 11: onnx's checker rejects it
    declare(ScatterElements, (11, 13, 16, 18)),
    declare(ScatterND, (11, 13, 16, 18)),
    declare(TensorScatter, (24,)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
