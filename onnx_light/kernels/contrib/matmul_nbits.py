"""MatMulNBits: a float matrix times block-quantized weights (2, 4 or 8 bits), as onnxruntime's
weight-only quantizer writes the MatMuls of language models.

B holds, for each of the N output columns, the K weights in ``ceil(K / block_size)`` blocks,
packed little end first (two 4-bit values a byte, the first in the low bits); each block has
a scale and a zero point (packed the same way per column, or floats like the scales; without
them ``2 ** (bits - 1)``); ``g_idx`` may give each of the K rows its block. The weights are
dequantized to a float32 (K, N) matrix, ``(q - zero_point) * scale``, once when they are
constants of the plan, and ``Y = A @ W + bias``. onnxruntime's ``accuracy_level`` 4 computes
with A quantized to int8; onnx_light always computes in float32 (accuracy levels 0-3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..base import NodeContext
from ..declaration import KernelDeclaration
from .base import FLOATS, ContribKernel, ValueType, declare_contrib

__all__ = ["DECLARATIONS", "unpack_bits"]

Arrays = list[np.ndarray]


def unpack_bits(packed: np.ndarray, bits: int) -> np.ndarray:
    """The ``bits``-wide unsigned values packed in the bytes of ``packed``, lowest bits first,
    along a new last axis merged with the bytes' (``8 // bits`` values a byte)."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8)
    values = (packed[..., np.newaxis] >> shifts) & np.uint8((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1)


class MatMulNBits(ContribKernel):
    """``A @ dequantize(B) + bias`` (see the module docstring)."""

    op_type = "MatMulNBits"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.k, self.n = int(ctx.attribute("K", 0)), int(ctx.attribute("N", 0))
        self.bits = int(ctx.attribute("bits", 4))
        self.block = int(ctx.attribute("block_size", 0))
        if self.k < 1 or self.n < 1:
            raise ctx.error(f"attributes K and N must be positive, got K={self.k}, N={self.n}")
        if self.bits not in (2, 4, 8):
            raise ctx.error(f"bits must be 2, 4 or 8, got {self.bits}")
        if self.block < 16 or self.block & (self.block - 1):
            raise ctx.error(f"block_size must be a power of 2 of at least 16, got {self.block}")
        self.blocks = -(-self.k // self.block)
        # The constant B, scales, zero points and g_idx, and their dequantized weights.
        self.weights: tuple[tuple[np.ndarray | None, ...], np.ndarray] | None = None

    @classmethod
    def typed_outputs(cls, first: ValueType, attributes: Mapping[str, Any],
                      num_outputs: int) -> list[ValueType]:
        shape = None if first[1] is None else (*first[1][:-1], int(attributes.get("N", 0)) or None)
        return [(first[0], shape)]

    def specialize(self, constants: Sequence[np.ndarray | None]) -> MatMulNBits | None:
        """Dequantize constant weights once."""
        given = [constants[i] if i < len(constants) else None for i in range(1, 5)]
        b, scales = given[0], given[1]
        if b is None or scales is None or any(
                self.ctx.given(i + 1) and given[i] is None for i in (2, 3)):
            return None
        return self.variant(weights=(tuple(given), self.dequantized(*given)))

    def dequantized(self, b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                    g_idx: np.ndarray | None) -> np.ndarray:
        """The float32 (K, N) weights."""
        per_block = self.block * self.bits // 8
        if b.dtype != np.uint8 or b.size != self.n * self.blocks * per_block:
            raise self.ctx.error(f"B must be uint8 of shape [{self.n}, {self.blocks}, {per_block}] "
                                 f"(N, blocks, bytes a block), got {b.dtype} {list(b.shape)}")
        if scales.size != self.n * self.blocks:
            raise self.ctx.error(f"scales must hold N * blocks = {self.n * self.blocks} values, "
                                 f"got shape {list(scales.shape)}")
        q = unpack_bits(b.reshape(self.n, self.blocks * per_block), self.bits)[:, :self.k]
        scale = scales.reshape(self.n, self.blocks).astype(np.float32)
        if zero_points is None:
            zero = np.full((self.n, self.blocks), 1 << (self.bits - 1), np.float32)
        elif zero_points.dtype == np.uint8:
            row = math.ceil(self.blocks * self.bits / 8)
            if zero_points.size != self.n * row:
                raise self.ctx.error(f"packed zero_points must hold N * {row} bytes, got shape "
                                     f"{list(zero_points.shape)}")
            zero = unpack_bits(zero_points.reshape(self.n, row), self.bits)[:, :self.blocks]
            zero = zero.astype(np.float32)
        elif zero_points.size == self.n * self.blocks:
            zero = zero_points.reshape(self.n, self.blocks).astype(np.float32)
        else:
            raise self.ctx.error(f"zero_points must be packed uint8 or hold one value a block, got "
                                 f"{zero_points.dtype} {list(zero_points.shape)}")
        if g_idx is None:
            block_of = np.arange(self.k) // self.block
        else:
            block_of = np.asarray(g_idx, np.int64).reshape(-1)
            if (block_of.size != self.k or block_of.min(initial=0) < 0
                    or block_of.max(initial=0) >= self.blocks):
                raise self.ctx.error(f"g_idx must give each of the K={self.k} rows a block in "
                                     f"[0, {self.blocks})")
        real = (q.astype(np.float32) - zero[:, block_of]) * scale[:, block_of]
        return np.ascontiguousarray(real.T)

    def run(self, a: np.ndarray, b: np.ndarray, scales: np.ndarray,
            zero_points: np.ndarray | None = None, g_idx: np.ndarray | None = None,
            bias: np.ndarray | None = None) -> Arrays:
        if a.shape[-1:] != (self.k,):
            raise self.ctx.error(f"A's last axis must be K={self.k}, got shape {list(a.shape)}")
        given = (b, scales, zero_points, g_idx)
        if self.weights is not None and all(x is y for x, y in zip(self.weights[0], given, strict=True)):
            weights = self.weights[1]
        else:
            weights = self.dequantized(*given)
        y = np.matmul(a.astype(np.float32, copy=False), weights)
        if bias is not None:
            if bias.shape != (self.n,):
                raise self.ctx.error(f"bias must have shape [{self.n}], got {list(bias.shape)}")
            y += bias.astype(np.float32, copy=False)
        return [y.astype(a.dtype, copy=False)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (declare_contrib(MatMulNBits, FLOATS),)
