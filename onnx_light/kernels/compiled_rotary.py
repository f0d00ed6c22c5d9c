"""Compiled rotary embedding of float32 heads: one pass, no temporaries.

:func:`rotate_pairs` writes, for each (batch, head, token) row of X and each pair ``(x1, x2)``
of its rotated features (the two halves of the first ``2 half`` features, or neighbours),
``x1 cos - x2 sin`` and ``x1 sin + x2 cos`` with the token's angles, and copies the other
features. Each product and each sum is rounded once to float32 and no multiply-add is fused
(no fast-math flag), so the values are numpy's in ``RotaryEmbedding.run``, bit for bit.
"""

from __future__ import annotations

import numpy as np

from .compiled import compiled

__all__ = ["rotate_pairs"]


@compiled
def rotate_pairs(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, out: np.ndarray,
                 step: int, offset: int) -> None:
    """out = X rotated: ``x`` and ``out`` float32 (batch, heads, sequence, size) (``x`` may be
    a strided view), ``cos`` and ``sin`` float32 (batch, sequence, half); feature ``j step``
    pairs with ``j step + offset`` (step 1 and offset ``half``: halves; 2 and 1: neighbours)."""
    batch, heads, sequence, size = x.shape
    half = cos.shape[2]
    for b in range(batch):
        for s in range(sequence):  # a token's angles for each head in turn
            for h in range(heads):
                # indexed in place: the four views a row made took 40 % of a call on
                # (1, 8, 64, 32) (docs/attention.md)
                if step == 1:  # halves: contiguous loads and stores, which LLVM vectorizes
                    for j in range(half):
                        c, n = cos[b, s, j], sin[b, s, j]
                        low, high = x[b, h, s, j], x[b, h, s, offset + j]
                        out[b, h, s, j] = c * low - n * high
                        out[b, h, s, offset + j] = n * low + c * high
                else:
                    for j in range(half):
                        c, n = cos[b, s, j], sin[b, s, j]
                        first, second = x[b, h, s, j * step], x[b, h, s, j * step + offset]
                        out[b, h, s, j * step] = c * first - n * second
                        out[b, h, s, j * step + offset] = n * first + c * second
                for i in range(2 * half, size):
                    out[b, h, s, i] = x[b, h, s, i]
