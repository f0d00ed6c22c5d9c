"""What each finished block of a convolution's output gets, in one compiled pass: the bias,
the fused residual addition and the fused activation when it is a clamp (Relu, Clip).

numpy needs one pass over the block for each (``block += bias``, ``block += residual``,
``maximum(block, 0)``); on a 1x1 convolution with few input channels those passes cost as
much as the product (docs/conv.md, "The finishing pass"). :func:`finish_rows` makes them one
pass, with numpy's operations in numpy's order in the output's type (no contraction): the
same values as the separate passes, bitwise.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..compiled import compiled, read_only
from ..compiled_activations import InPlace, flat_rows

__all__ = ["FINISHED_TYPES", "Finish", "compile_finish", "finish_from", "finish_rows", "finish_run",
           "fused_parts", "scale_channels"]

#: The output types the compiled pass takes.
FINISHED_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


@compiled(inline="always")
def _clamp(v: float, lo: float, hi: float) -> float:
    """numpy's ``minimum(maximum(v, lo), hi)``, NaN and signed zeros included: one
    comparison and one select per bound, which LLVM vectorises."""
    v = lo if v < lo else v
    return hi if v > hi else v


@compiled(inline="always")
def finish_run(base: np.ndarray, start: int, n: int, b: float, residual: np.ndarray, lo: float,
               hi: float, with_bias: bool, with_residual: bool) -> None:
    """``base[start + k] = clamp((base[start + k] + b) + residual[start + k])`` for ``k < n``;
    ``b`` is added only ``with_bias``, ``residual`` only ``with_residual``: one branch-free
    loop per combination, which LLVM vectorises."""
    if with_bias and with_residual:
        for k in range(n):
            base[start + k] = _clamp((base[start + k] + b) + residual[start + k], lo, hi)
    elif with_bias:
        for k in range(n):
            base[start + k] = _clamp(base[start + k] + b, lo, hi)
    elif with_residual:
        for k in range(n):
            base[start + k] = _clamp(base[start + k] + residual[start + k], lo, hi)
    else:
        for k in range(n):
            base[start + k] = _clamp(base[start + k], lo, hi)


@compiled
def finish_rows(base: np.ndarray, shape: tuple[int, int, int], strides: tuple[int, int],
                bias: np.ndarray, residual: np.ndarray, low: float, high: float) -> None:
    """``base[o] = clamp(base[o] + bias[i, j] + residual[o])`` for the offsets
    ``o = i * strides[0] + j * strides[1] + k`` of ``shape``; an empty ``bias`` or
    ``residual`` is not added; the clamp is numpy's maximum with ``low``, then minimum with
    ``high`` (NaN kept)."""
    lo, hi = base.dtype.type(low), base.dtype.type(high)
    zero = base.dtype.type(0)
    with_bias, with_residual = bias.size > 0, residual.size > 0
    n = np.uintp(shape[2])
    for i in range(np.uintp(shape[0])):
        for j in range(np.uintp(shape[1])):
            start = i * np.uintp(strides[0]) + j * np.uintp(strides[1])
            finish_run(base, start, n, bias[i, j] if with_bias else zero, residual, lo, hi,
                       with_bias, with_residual)


@compiled
def finish_from(target: np.ndarray, source: np.ndarray, shape: tuple[int, int, int, int],
                target_strides: tuple[int, int, int], source_strides: tuple[int, int, int],
                bias: np.ndarray, residual: np.ndarray, low: float, high: float) -> None:
    """:func:`finish_rows` of ``source`` written into ``target``: ``target[o] =
    clamp(source[q] + bias[i, j] + residual[o])`` for the offsets ``o`` (``q``) of ``shape``'s
    positions (i, j, r, k) along ``target_strides`` (``source_strides``) and k; an empty
    ``bias`` or ``residual`` is not added."""
    lo, hi = target.dtype.type(low), target.dtype.type(high)
    with_bias, with_residual = bias.size > 0, residual.size > 0
    n = np.uintp(shape[3])
    for i in range(np.uintp(shape[0])):
        for j in range(np.uintp(shape[1])):
            b = bias[i, j] if with_bias else target.dtype.type(0)
            for r in range(np.uintp(shape[2])):
                into = (i * np.uintp(target_strides[0]) + j * np.uintp(target_strides[1])
                        + r * np.uintp(target_strides[2]))
                read = (i * np.uintp(source_strides[0]) + j * np.uintp(source_strides[1])
                        + r * np.uintp(source_strides[2]))
                if with_bias and with_residual:
                    for k in range(n):
                        target[into + k] = _clamp((source[read + k] + b) + residual[into + k], lo, hi)
                elif with_bias:
                    for k in range(n):
                        target[into + k] = _clamp(source[read + k] + b, lo, hi)
                elif with_residual:
                    for k in range(n):
                        target[into + k] = _clamp(source[read + k] + residual[into + k], lo, hi)
                else:
                    for k in range(n):
                        target[into + k] = _clamp(source[read + k], lo, hi)


@compiled
def scale_channels(source: np.ndarray, factors: np.ndarray, out: np.ndarray, inner: int,
                   by_row: bool) -> None:
    """``out[r * inner + k] = source[r * inner + k] * f`` over flat arrays, ``f`` being
    ``factors[r]`` ``by_row`` (X (N, C, ...) by one factor per image and channel: inner is a
    plane) or ``factors[k]`` (weights (M, C) by one factor per input channel): numpy's
    products, one rounding each. A fused squeeze-and-excitation scale
    (:meth:`~onnx_light.kernels.conv.kernel.ConvKernel._scaled`), one pass without
    temporaries."""
    n = np.uintp(inner)
    for r in range(np.uintp(source.size) // n):
        start = r * n
        if by_row:
            f = factors[r]
            for k in range(n):
                out[start + k] = source[start + k] * f
        else:
            for k in range(n):
                out[start + k] = source[start + k] * factors[k]


@functools.cache
def _no_bias(dtype: np.dtype) -> np.ndarray:
    return read_only(np.empty((0, 0), dtype))


@functools.cache
def _no_residual(dtype: np.dtype) -> np.ndarray:
    return read_only(np.empty(0, dtype))


def _flat(view: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """A 4-D view with a contiguous last axis as flat memory from its first element and the
    first three axes' strides in elements; None otherwise."""
    item = view.itemsize
    if (view.size == 0 or view.ndim != 4 or view.strides[3] != item
            or any(s <= 0 or s % item for s in view.strides[:3])):
        return None
    strides = tuple(s // item for s in view.strides[:3])
    span = sum((n - 1) * s for n, s in zip(view.shape[:3], strides, strict=True)) + view.shape[3]
    return as_strided(view, shape=(span,), strides=(item,)), strides


def compile_finish(dtype: np.dtype) -> None:
    """Compile :func:`finish_rows` for ``dtype`` (or load it from numba's cache): a session
    does it at construction, not in its first run."""
    if np.dtype(dtype) in FINISHED_TYPES:
        finish = Finish(np.zeros((1, 1, 1, 1), dtype), None, None, (-math.inf, math.inf))
        finish(np.zeros((1, 1, 1), dtype), np.zeros((1, 1, 1), dtype))
        finish.copy(finish.out, np.zeros((1, 1, 1, 1), dtype), None)
        for flags in itertools.product((True, False), repeat=2):  # a session's values are
            source, factors = np.zeros(1, dtype), np.zeros(1, dtype)  # writeable, constants not
            source.flags.writeable, factors.flags.writeable = flags
            scale_channels.dispatcher(source, factors, np.zeros(1, dtype), 1, True)


@dataclass(frozen=True)
class Finish:
    """A convolution's finishing of each block of ``out`` (a C-contiguous array): the bias
    (given per block), the ``residual`` (laid out like ``out``: read at the block's offset),
    then the activation. One compiled pass adds the first two and applies ``clamp`` when the
    activation is one (``epilogue`` then is that clamp), then any other ``epilogue`` runs;
    blocks of other layouts or types take numpy's passes."""

    out: np.ndarray
    residual: np.ndarray | None
    epilogue: Callable[[np.ndarray], None] | None
    clamp: tuple[float, float] | None

    def __call__(self, block: np.ndarray, bias: np.ndarray | None = None) -> None:
        """Finish ``block`` (a view into ``out``); ``bias`` broadcasts against it, shaped
        (count, filters, 1, ...) for a block (count, filters, ...)."""
        if bias is None and self.residual is None and self.clamp is None:  # no pass to make
            if self.epilogue is not None:
                self.epilogue(block)
            return
        rows = self._rows(block, bias) if block.dtype in FINISHED_TYPES else None
        if rows is None:
            self._numpy(block, bias)
            return
        base, shape, strides, bias_rows = rows
        residual = self._residual_of(block, base.size)
        low, high = self.clamp if self.clamp is not None else (-math.inf, math.inf)
        finish_rows.dispatcher(base, shape, strides, bias_rows, residual, low, high)
        if self.clamp is None and self.epilogue is not None:
            self.epilogue(block)

    def copy(self, target: np.ndarray, source: np.ndarray, bias: np.ndarray | None) -> None:
        """``source`` (another view of the same shape, e.g. the wide product's kept columns)
        plus the bias into ``target`` (a view into ``out``), then finished: one compiled pass
        for 4-D views (count, filters, rows, columns) with contiguous rows."""
        flat_target = _flat(target) if target.dtype in FINISHED_TYPES else None
        flat_source = _flat(source) if flat_target is not None and source.dtype == target.dtype else None
        rows = None
        if bias is not None and flat_source is not None:
            if bias.shape[:2] != target.shape[:2] or bias.size != target.shape[0] * target.shape[1]:
                flat_source = None
            else:
                rows = read_only(np.ascontiguousarray(bias.reshape(target.shape[:2]), dtype=target.dtype))
        if flat_source is None:
            if bias is None:
                np.copyto(target, source)
            else:
                np.add(source, bias, out=target)
            self(target)
            return
        base, target_strides = flat_target
        source_base, source_strides = flat_source
        residual = self._residual_of(target, base.size)
        low, high = self.clamp if self.clamp is not None else (-math.inf, math.inf)
        finish_from.dispatcher(base, source_base, target.shape, target_strides, source_strides,
                               _no_bias(target.dtype) if rows is None else rows, residual, low, high)
        if self.clamp is None and self.epilogue is not None:
            self.epilogue(target)

    def _residual_of(self, block: np.ndarray, size: int) -> np.ndarray:
        """The ``size`` residual values from ``block``'s offset into ``out`` (read-only, as
        every array these compiled passes only read: one compiled form whatever the caller's
        flags); empty without a residual."""
        if self.residual is None:
            return _no_residual(block.dtype)
        offset = (block.__array_interface__["data"][0] - self.out.__array_interface__["data"][0]) \
            // block.itemsize
        return read_only(self.residual[offset:offset + size])

    def _rows(self, block: np.ndarray, bias: np.ndarray | None
              ) -> tuple[np.ndarray, tuple[int, int, int], tuple[int, int], np.ndarray] | None:
        """The block as flat memory, three axes and two strides, and the bias per (axis 0,
        axis 1) row; None when the layout does not allow it."""
        if bias is None:
            rows = flat_rows(block)
            if rows is None:
                return None
            return (*rows, _no_bias(block.dtype))
        item = block.itemsize
        if (block.size == 0 or block.ndim != 3 or bias.shape != (*block.shape[:2], 1)
                or block.strides[2] != item or block.strides[0] <= 0 or block.strides[1] <= 0
                or block.strides[0] % item or block.strides[1] % item):
            return None
        strides = (block.strides[0] // item, block.strides[1] // item)
        if block.flags.c_contiguous:  # the usual block, a whole output: no strided view to make
            base = block.reshape(-1)
        else:
            span = (block.shape[0] - 1) * strides[0] + (block.shape[1] - 1) * strides[1] + block.shape[2]
            base = as_strided(block, shape=(span,), strides=(item,))
        rows = read_only(np.ascontiguousarray(bias.reshape(block.shape[:2]), dtype=block.dtype))
        return base, block.shape, strides, rows

    def _numpy(self, block: np.ndarray, bias: np.ndarray | None) -> None:
        if bias is not None:
            block += bias
        if self.residual is not None:
            start, item = self.out.__array_interface__["data"][0], self.out.itemsize
            offset = (block.__array_interface__["data"][0] - start) // item
            np.add(block, as_strided(self.residual[offset:], block.shape, block.strides, writeable=False),
                   out=block)
        if self.epilogue is not None:
            self.epilogue(block)


def fused_parts(epilogue: Callable[[np.ndarray], None] | None, dtype: np.dtype
                ) -> tuple[np.ndarray | None, tuple[float, float], tuple[int, float, float],
                           Callable[[np.ndarray], None] | None]:
    """What a compiled kernel that finishes its own output takes of a fused ``epilogue``:
    the residual (a :class:`Finish`'s, or None), the clamp bounds (``(-inf, inf)`` for none),
    the compiled activation as ``(code, alpha, beta)`` (code -1 for none; float32 only) and
    what is left to run after it on each finished block (or None)."""
    residual, clamp, after = None, (-math.inf, math.inf), epilogue
    if isinstance(epilogue, Finish):
        residual = epilogue.residual
        if epilogue.clamp is not None:
            clamp, after = epilogue.clamp, None
        else:
            after = epilogue.epilogue
    activation = (-1, 1.0, 0.0)
    if isinstance(after, InPlace) and np.dtype(dtype) == np.float32:
        activation, after = (after.code, after.alpha, after.beta), None
    return residual, clamp, activation, after
