"""What each finished block of a convolution's output gets, in one compiled pass: the bias,
the fused residual addition and the fused activation when it is a clamp (Relu, Clip).

numpy needs one pass over the block for each (``block += bias``, ``block += residual``,
``maximum(block, 0)``); on a 1x1 convolution with few input channels those passes cost as
much as the product (docs/conv.md, "The finishing pass"). :func:`finish_rows` makes them one
pass, with numpy's operations in numpy's order in the output's type (no contraction): the
same values as the separate passes, bitwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..compiled import compiled
from ..compiled_activations import flat_rows

__all__ = ["FINISHED_TYPES", "Finish", "compile_finish", "finish_rows"]

#: The output types the compiled pass takes.
FINISHED_TYPES = (np.dtype(np.float32), np.dtype(np.float64))


@compiled
def finish_rows(base: np.ndarray, shape: tuple[int, int, int], strides: tuple[int, int],
                bias: np.ndarray, residual: np.ndarray, low: float, high: float) -> None:
    """``base[o] = clamp(base[o] + bias[i, j] + residual[o])`` for the offsets
    ``o = i * strides[0] + j * strides[1] + k`` of ``shape``; an empty ``bias`` or
    ``residual`` is not added; the clamp is numpy's maximum with ``low``, then minimum with
    ``high`` (NaN kept)."""
    lo, hi = base.dtype.type(low), base.dtype.type(high)
    with_bias, with_residual = bias.size > 0, residual.size > 0
    n = np.uintp(shape[2])
    for i in range(np.uintp(shape[0])):
        for j in range(np.uintp(shape[1])):
            start = i * np.uintp(strides[0]) + j * np.uintp(strides[1])
            if with_bias and with_residual:
                b = bias[i, j]
                for k in range(n):
                    v = (base[start + k] + b) + residual[start + k]
                    v = v if v > lo or v != v else lo
                    base[start + k] = v if v < hi or v != v else hi
            elif with_bias:
                b = bias[i, j]
                for k in range(n):
                    v = base[start + k] + b
                    v = v if v > lo or v != v else lo
                    base[start + k] = v if v < hi or v != v else hi
            elif with_residual:
                for k in range(n):
                    v = base[start + k] + residual[start + k]
                    v = v if v > lo or v != v else lo
                    base[start + k] = v if v < hi or v != v else hi
            else:
                for k in range(n):
                    v = base[start + k]
                    v = v if v > lo or v != v else lo
                    base[start + k] = v if v < hi or v != v else hi


def compile_finish(dtype: np.dtype) -> None:
    """Compile :func:`finish_rows` for ``dtype`` (or load it from numba's cache): a session
    does it at construction, not in its first run."""
    if np.dtype(dtype) in FINISHED_TYPES:
        Finish(np.zeros((1, 1, 1), dtype), None, None, (-math.inf, math.inf))(
            np.zeros((1, 1, 1), dtype), np.zeros((1, 1, 1), dtype))


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
        rows = self._rows(block, bias) if block.dtype in FINISHED_TYPES else None
        if rows is None:
            self._numpy(block, bias)
            return
        base, shape, strides, bias_rows = rows
        empty = base[:0]
        residual = empty
        if self.residual is not None:
            offset = (block.__array_interface__["data"][0] - self.out.__array_interface__["data"][0]) \
                // block.itemsize
            residual = self.residual[offset:offset + base.size]
        low, high = self.clamp if self.clamp is not None else (-math.inf, math.inf)
        finish_rows.dispatcher(base, shape, strides, bias_rows, residual, low, high)
        if self.clamp is None and self.epilogue is not None:
            self.epilogue(block)

    def _rows(self, block: np.ndarray, bias: np.ndarray | None
              ) -> tuple[np.ndarray, tuple[int, int, int], tuple[int, int], np.ndarray] | None:
        """The block as flat memory, three axes and two strides, and the bias per (axis 0,
        axis 1) row; None when the layout does not allow it."""
        if bias is None:
            rows = flat_rows(block)
            if rows is None:
                return None
            return (*rows, np.empty((0, 0), block.dtype))
        item = block.itemsize
        if (block.ndim != 3 or bias.shape != (*block.shape[:2], 1) or block.strides[2] != item
                or block.strides[0] <= 0 or block.strides[1] <= 0 or block.strides[0] % item
                or block.strides[1] % item):
            return None
        strides = (block.strides[0] // item, block.strides[1] // item)
        span = (block.shape[0] - 1) * strides[0] + (block.shape[1] - 1) * strides[1] + block.shape[2]
        base = as_strided(block, shape=(span,), strides=(item,))
        rows = np.ascontiguousarray(bias.reshape(block.shape[:2]), dtype=block.dtype)
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
