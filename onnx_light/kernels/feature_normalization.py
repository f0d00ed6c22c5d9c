"""Normalization over groups of features: GroupNormalization, RMSNormalization,
LpNormalization, MeanVarianceNormalization.

Statistics are taken in the ``stash_type`` precision where the operator has one (float32 by
default, as for LayerNormalization, float64 inputs included) and in the compute type
(float32 for float16 and bfloat16) otherwise; the result is rounded once to the input type.
None of these kernels is tunable: they are memory-bound passes of a few numpy calls each;
RMSNormalization's float32 path is compiled rows (what the runtime makes of RMSNorm written
out, ``runtime/rmsnorm_fusion.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import (
    FLOAT_TYPES,
    Kernel,
    NodeContext,
    Prepared,
    TensorSpec,
    compute_dtype,
    ints,
    normalize_axes,
    normalize_axis,
    numpy_dtype,
)
from .compiled import compiled, read_only, wide_vectors
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "GroupNormalization", "LpNormalization", "MeanVarianceNormalization",
           "RMSNormalization", "rms_norm_rows"]

Arrays = Sequence[np.ndarray]
_STASH_TYPES = (T.FLOAT, T.DOUBLE)


def _stash(ctx: NodeContext) -> np.dtype:
    """The precision statistics are taken in: ``stash_type``, float (the default) or double."""
    stash = int(ctx.attribute("stash_type", T.FLOAT))
    if stash not in _STASH_TYPES:
        raise ctx.error(f"stash_type must be FLOAT (1) or DOUBLE (11), got {stash}")
    return numpy_dtype(stash)


def _epsilon(ctx: NodeContext) -> float:
    epsilon = float(np.float32(ctx.attribute("epsilon", 1e-5)))
    if not epsilon >= 0:
        raise ctx.error(f"epsilon must not be negative, got {epsilon}")
    return epsilon


class GroupNormalization(Kernel):
    """ONNX GroupNormalization (21): each image's channels split into ``num_groups`` groups,
    each normalized over its channels and spatial positions, then scaled and shifted per
    channel. Version 18 (one scale and bias per group) is deprecated: onnx's checker, which
    every session runs, rejects it."""

    op_type: ClassVar[str] = "GroupNormalization"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.epsilon = _epsilon(ctx)
        groups = ctx.attribute("num_groups")
        if groups is None or int(groups) < 1:
            raise ctx.error(f"attribute 'num_groups' must be a positive integer, got {groups!r}")
        self.groups = int(groups)
        self.stash = _stash(ctx)

    def run(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> Arrays:
        if x.ndim < 2 or x.shape[1] % self.groups:
            raise self.ctx.error(f"X of shape {list(x.shape)} must be (N, C, ...) with C a "
                                 f"multiple of num_groups={self.groups}")
        n, channels = x.shape[:2]
        for name, value in (("scale", scale), ("bias", bias)):
            if value.size != channels:
                raise self.ctx.error(f"{name} must hold {channels} values (one per channel), "
                                     f"got shape {list(value.shape)}")
        stash = self.stash
        grouped = x.reshape(n, self.groups, -1).astype(stash)
        mean = grouped.mean(axis=2, keepdims=True)
        centered = grouped - mean
        variance = np.square(centered).mean(axis=2, keepdims=True)
        normalized = (centered / np.sqrt(variance + stash.type(self.epsilon))).reshape(x.shape)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        compute = compute_dtype(x.dtype)
        y = (normalized.astype(compute) * scale.astype(compute).reshape(shape)
             + bias.astype(compute).reshape(shape))
        return [y.astype(x.dtype, copy=False)]


@compiled(fastmath={"contract", "reassoc"})
def _square_sum(row: np.ndarray) -> float:
    """The float64 sum of the squares of ``row``, in the order LLVM's vectorized loop adds them
    (reassociation only: the same order for every row)."""
    wide_vectors()
    total = 0.0
    for i in range(row.shape[0]):
        v = np.float64(row[i])
        total += v * v
    return total


@compiled(fastmath={"contract"})
def rms_norm_rows(x: np.ndarray, scale: np.ndarray, epsilon: float, out: np.ndarray) -> None:
    """out[r] = x[r] / sqrt(mean(x[r]^2) + epsilon) * scale for each row of the float32
    matrix ``x``: the mean of squares in float64 (vectorized, :func:`_square_sum`), the output
    rounded once."""
    wide_vectors()
    length = x.shape[1]
    for r in range(x.shape[0]):
        row = x[r]
        inverse = 1.0 / math.sqrt(_square_sum(row) / length + epsilon)
        target = out[r]
        for i in range(length):
            target[i] = np.float64(row[i]) * inverse * np.float64(scale[i])


class RMSNormalization(Kernel):
    """ONNX RMSNormalization (23): X divided by the root mean square over the axes from
    ``axis`` on (plus ``epsilon``), times ``scale``. float32 X and scale with the float32
    stash run the compiled rows (:func:`rms_norm_rows`, serial), other types numpy."""

    op_type: ClassVar[str] = "RMSNormalization"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = int(ctx.attribute("axis", -1))
        self.epsilon = _epsilon(ctx)
        self.stash = _stash(ctx)

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile the float32 rows now, at session construction (a warm cache loads them)."""
        if self.element_type == T.FLOAT and self.stash == np.float32:
            one = np.ones((1, 1), np.float32)
            rms_norm_rows(read_only(one), read_only(np.ones(1, np.float32)), 0.0, one.copy())
        return None

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """For float32 X and scale with the float32 stash, scale of one value or one per
        normalized element: the compiled rows into the given buffer (:meth:`run`'s values,
        bit for bit), without :meth:`run`'s checks and copies on every call."""
        if len(inputs) != 2 or self.element_type != T.FLOAT or self.stash != np.float32:
            return None
        (shape, dtype), (scale_shape, scale_dtype) = inputs
        if dtype != np.float32 or scale_dtype != np.float32 or not -len(shape) <= self.axis < len(shape):
            return None
        length = math.prod(shape[self.axis % len(shape):])
        scale_size = math.prod(scale_shape)
        if not math.prod(shape) or scale_size not in (1, length):
            return None
        try:
            np.broadcast_shapes(scale_shape, shape[self.axis % len(shape):])
        except ValueError:
            return None
        rows, epsilon = rms_norm_rows.dispatcher, self.epsilon

        def normalize(x: np.ndarray, scale: np.ndarray, out: np.ndarray) -> None:
            row = scale.reshape(-1) if scale_size == length else np.full(length, scale.reshape(-1)[0])
            rows(read_only(x.reshape(-1, length)), read_only(row), epsilon, out.reshape(-1, length))

        return Prepared(normalize, tuple(shape), np.dtype(np.float32))

    def run(self, x: np.ndarray, scale: np.ndarray) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        try:
            np.broadcast_shapes(scale.shape, x.shape[axis:])
        except ValueError:
            raise self.ctx.error(f"scale of shape {list(scale.shape)} does not broadcast to the "
                                 f"normalized axes {list(x.shape[axis:])}") from None
        length = math.prod(x.shape[axis:])
        if (x.dtype == np.float32 and scale.dtype == np.float32 and self.stash == np.float32
                and x.size and scale.size in (1, length)):
            rows = np.ascontiguousarray(x).reshape(-1, length)
            out = np.empty(rows.shape, np.float32)
            scale_row = scale.reshape(-1) if scale.size == length and scale.flags.c_contiguous \
                else np.ascontiguousarray(np.broadcast_to(scale.reshape(-1), (length,)))
            rms_norm_rows(read_only(rows), read_only(scale_row), self.epsilon, out)
            return [out.reshape(x.shape)]
        stash = self.stash
        data = x.astype(stash, copy=False)
        mean_square = np.mean(np.square(data), axis=tuple(range(axis, x.ndim)), keepdims=True)
        y = data / np.sqrt(mean_square + stash.type(self.epsilon)) * scale.astype(stash, copy=False)
        return [y.astype(x.dtype, copy=False)]


class LpNormalization(Kernel):
    """ONNX LpNormalization (1, 22): X divided by its L1 or L2 norm along ``axis`` (0 where
    the norm is 0)."""

    op_type: ClassVar[str] = "LpNormalization"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = int(ctx.attribute("axis", -1))
        self.p = int(ctx.attribute("p", 2))
        if self.p not in (1, 2):
            raise ctx.error(f"p must be 1 or 2, got {self.p}")

    def run(self, x: np.ndarray) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        data = x.astype(compute_dtype(x.dtype), copy=False)
        norm = (np.sum(np.abs(data), axis=axis, keepdims=True) if self.p == 1
                else np.sqrt(np.sum(np.square(data), axis=axis, keepdims=True)))
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.where(norm == 0, 0, data / norm)
        return [y.astype(x.dtype, copy=False)]


class MeanVarianceNormalization(Kernel):
    """ONNX MeanVarianceNormalization (9, 13): ``(X - mean) / (std + 1e-9)`` over ``axes``
    (default 0, 2, 3), the constant ONNX's definition (a function of ReduceMean) adds."""

    op_type: ClassVar[str] = "MeanVarianceNormalization"
    EPSILON: ClassVar[float] = 1e-9

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axes = ints(ctx.attribute("axes", [0, 2, 3]))

    def run(self, x: np.ndarray) -> Arrays:
        axes = normalize_axes(self.ctx, self.axes, x.ndim)
        data = x.astype(compute_dtype(x.dtype), copy=False)
        mean = np.mean(data, axis=axes, keepdims=True)
        variance = np.mean(np.square(data), axis=axes, keepdims=True) - np.square(mean)
        y = (data - mean) / (np.sqrt(np.maximum(variance, 0)) + data.dtype.type(self.EPSILON))
        return [y.astype(x.dtype, copy=False)]


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(GroupNormalization, (21,), types=FLOAT_TYPES),  # 18 is deprecated
    declare(LpNormalization, (1, 22), types=FLOAT_TYPES),
    declare(MeanVarianceNormalization, (9, 13), types=FLOAT_TYPES),
    declare(RMSNormalization, (23,), types=FLOAT_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
