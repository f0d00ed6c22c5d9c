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
        for h in range(heads):
            for s in range(sequence):
                row = x[b, h, s]
                target = out[b, h, s]
                c = cos[b, s]
                n = sin[b, s]
                if step == 1:  # halves: contiguous loads and stores, which LLVM vectorizes
                    low = row[:half]
                    high = row[offset:offset + half]
                    out_low = target[:half]
                    out_high = target[offset:offset + half]
                    for j in range(half):
                        out_low[j] = c[j] * low[j] - n[j] * high[j]
                        out_high[j] = n[j] * low[j] + c[j] * high[j]
                else:
                    for j in range(half):
                        first = row[j * step]
                        second = row[j * step + offset]
                        target[j * step] = c[j] * first - n[j] * second
                        target[j * step + offset] = n[j] * first + c[j] * second
                for i in range(2 * half, size):
                    target[i] = row[i]
