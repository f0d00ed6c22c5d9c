"""Transformer kernels: Attention (23, 24, 25) and RotaryEmbedding (23).

Attention is scaled dot-product attention over 3-D or 4-D Q, K and V. The kernel follows the
operator's pattern in numpy: heads split out of 3-D inputs, the past key and value prepended
(and returned as the present ones), key and value heads repeated for grouped-query attention,
``(Q sqrt(scale)) (K sqrt(scale))^T`` as one batched matmul, the optional soft cap, one
additive bias (the boolean or float ``attn_mask``, padded to the total length with -inf;
``is_causal``'s offset-aware lower triangle; the padding ``nonpad_kv_seqlen`` marks; opset
25's sliding windows), a softmax along the keys in ``softmax_precision`` (fully masked rows
give zeros, not NaN), and the product with V. RotaryEmbedding rotates pairs of features by
the angles of its cosine and sine caches (for float32 inputs of fixed shapes, a compiled pass:
:mod:`.compiled_rotary`). float16 and bfloat16 compute in float32 and round
once. Neither is tunable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import FLOAT_TYPES, Kernel, NodeContext, Prepared, TensorSpec, compute_dtype, numpy_dtype
from .compiled_rotary import rotate_pairs
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "Attention", "RotaryEmbedding"]

Arrays = Sequence[np.ndarray]
_SOFTMAX_PRECISIONS = (0, T.FLOAT, T.FLOAT16, T.DOUBLE, T.BFLOAT16)


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """(batch, sequence, heads * size) as (batch, heads, sequence, size)."""
    batch, sequence, hidden = x.shape
    return x.reshape(batch, sequence, heads, hidden // heads).transpose(0, 2, 1, 3)


class Attention(Kernel):
    """ONNX Attention (23, 24, 25); see the module docstring."""

    op_type: ClassVar[str] = "Attention"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.causal = bool(ctx.attribute("is_causal", 0))
        self.q_heads = int(ctx.attribute("q_num_heads", 0))
        self.kv_heads = int(ctx.attribute("kv_num_heads", 0))
        self.mode = int(ctx.attribute("qk_matmul_output_mode", 0))
        if self.mode not in (0, 1, 2, 3):
            raise ctx.error(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {self.mode}")
        scale = ctx.attribute("scale")
        self.scale = None if scale is None else float(np.float32(scale))
        self.softcap = float(np.float32(ctx.attribute("softcap", 0.0)))
        if self.softcap < 0:
            raise ctx.error(f"softcap must not be negative, got {self.softcap}")
        precision = int(ctx.attribute("softmax_precision", 0))
        if precision not in _SOFTMAX_PRECISIONS:
            raise ctx.error(f"softmax_precision must be one of {list(_SOFTMAX_PRECISIONS)}, got {precision}")
        self.softmax_dtype = None if precision == 0 else numpy_dtype(precision)
        windows = (int(ctx.attribute("left_window_size", -1)), int(ctx.attribute("right_window_size", -1)))
        if min(windows) < -1:
            raise ctx.error(f"left_window_size and right_window_size must be -1 or more, got {list(windows)}")
        self.left, self.right = windows

    def run(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, attn_mask: np.ndarray | None = None,
            past_key: np.ndarray | None = None, past_value: np.ndarray | None = None,
            nonpad_kv_seqlen: np.ndarray | None = None) -> Arrays:
        three_d = q.ndim == 3
        if three_d:
            if self.q_heads < 1 or self.kv_heads < 1 or k.ndim != 3 or v.ndim != 3:
                raise self.ctx.error("3-D Q, K and V need q_num_heads and kv_num_heads")
            for name, x, heads in (("Q", q, self.q_heads), ("K", k, self.kv_heads), ("V", v, self.kv_heads)):
                if x.shape[2] % heads:
                    raise self.ctx.error(f"{name}'s hidden size {x.shape[2]} is not a multiple of "
                                         f"{heads} heads")
            q, k, v = _heads(q, self.q_heads), _heads(k, self.kv_heads), _heads(v, self.kv_heads)
        elif q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
            raise self.ctx.error(f"Q, K and V must be all 3-D or all 4-D, got shapes "
                                 f"{[list(x.shape) for x in (q, k, v)]}")
        if (past_key is None) != (past_value is None):
            raise self.ctx.error("past_key and past_value go together")
        past = 0
        if past_key is not None:
            past = past_key.shape[2]
            k, v = np.concatenate([past_key, k], axis=2), np.concatenate([past_value, v], axis=2)
        present_key, present_value = k, v
        batch, q_heads, q_length, size = q.shape
        kv_heads, total = k.shape[1], k.shape[2]
        if q_heads % kv_heads or k.shape[3] != size or v.shape[:3] != k.shape[:3] or k.shape[0] != batch:
            raise self.ctx.error(f"Q {list(q.shape)}, K {list(k.shape)} and V {list(v.shape)} do not "
                                 "fit (batch, heads, sequence, head size)")
        compute = compute_dtype(q.dtype)
        group = q_heads // kv_heads
        keys = np.repeat(k, group, axis=1) if group > 1 else k
        values = np.repeat(v, group, axis=1) if group > 1 else v
        root = math.sqrt(self.scale if self.scale is not None else 1 / math.sqrt(size))
        scaled_keys = keys.astype(compute) * compute.type(root)
        scores = (q.astype(compute) * compute.type(root)) @ np.swapaxes(scaled_keys, -1, -2)
        raw = scores
        if self.softcap > 0:
            scores = self.softcap * np.tanh(scores / self.softcap)
        capped = scores
        scores = scores + self._bias(attn_mask, nonpad_kv_seqlen, batch, q_heads, q_length, total, past,
                                     compute)
        biased = scores
        softmax = scores.astype(self.softmax_dtype or compute)
        top = np.max(softmax, axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", over="ignore"):
            exp = np.exp(softmax - np.where(np.isfinite(top), top, 0))
            probabilities = exp / np.sum(exp, axis=-1, keepdims=True)
        probabilities = np.where(np.isneginf(top), 0, probabilities).astype(compute)
        y = (probabilities @ values.astype(compute)).astype(q.dtype)
        if three_d:
            y = y.transpose(0, 2, 1, 3).reshape(batch, q_length, -1)
        qk = (raw, capped, biased, probabilities)[self.mode].astype(q.dtype)
        return [y, present_key, present_value, qk][:max(1, self.ctx.num_outputs)]

    def _bias(self, mask: np.ndarray | None, nonpad: np.ndarray | None, batch: int, heads: int,
              q_length: int, total: int, past: int, compute: np.dtype) -> np.ndarray:
        """The additive bias of shape broadcasting to (batch, heads, q_length, total)."""
        bias = np.zeros((1, 1, q_length, total), compute)
        if mask is not None:
            if mask.shape[-1] > total:
                raise self.ctx.error(f"attn_mask's last axis ({mask.shape[-1]}) is longer than the "
                                     f"total sequence ({total})")
            term = (np.where(mask, 0, -np.inf).astype(compute) if mask.dtype == np.bool_
                    else mask.astype(compute))
            if term.shape[-1] < total:
                padding = np.full((*term.shape[:-1], total - term.shape[-1]), -np.inf, compute)
                term = np.concatenate([term, padding], axis=-1)
            try:
                bias = bias + term
            except ValueError:
                raise self.ctx.error(f"attn_mask of shape {list(mask.shape)} does not broadcast to "
                                     f"{[batch, heads, q_length, total]}") from None
        j = np.arange(total)
        offset = np.full((1, 1, 1, 1), past)
        if nonpad is not None:
            lengths = np.asarray(nonpad, np.int64).reshape(-1)
            if lengths.size != batch:
                raise self.ctx.error(f"nonpad_kv_seqlen must hold {batch} lengths, got {lengths.size}")
            bias = bias + np.where(j < lengths.reshape(-1, 1, 1, 1), 0, -np.inf).astype(compute)
            if past == 0:
                offset = (lengths - q_length).reshape(-1, 1, 1, 1)
        position = offset + np.arange(q_length).reshape(1, 1, -1, 1)  # absolute query positions
        allowed = np.ones(np.broadcast_shapes(position.shape, (total,)), bool)
        if self.causal:
            allowed &= j <= position
        if self.left >= 0:
            allowed &= j >= position - self.left
        if self.right >= 0:
            allowed &= j <= position + self.right
        return bias + np.where(allowed, 0, -np.inf).astype(compute)


class RotaryEmbedding(Kernel):
    """ONNX RotaryEmbedding (23): the first ``rotary_embedding_dim`` features of each head
    (all by default) rotated pairwise by the angles whose cosines and sines the caches hold,
    per token (indexed by ``position_ids`` when given); pairs are the two halves of those
    features, or neighbours with ``interleaved``. The other features pass unchanged."""

    op_type: ClassVar[str] = "RotaryEmbedding"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.interleaved = bool(ctx.attribute("interleaved", 0))
        self.num_heads = int(ctx.attribute("num_heads", 0))
        self.rotary_dim = int(ctx.attribute("rotary_embedding_dim", 0))
        if self.num_heads < 0 or self.rotary_dim < 0 or self.rotary_dim % 2:
            raise ctx.error(f"num_heads ({self.num_heads}) must not be negative and "
                            f"rotary_embedding_dim ({self.rotary_dim}) must be even and not negative")

    def run(self, x: np.ndarray, cos_cache: np.ndarray, sin_cache: np.ndarray,
            position_ids: np.ndarray | None = None) -> Arrays:
        if x.ndim == 4:  # (batch, heads, sequence, size) -> (batch, sequence, heads, size)
            tokens = x.transpose(0, 2, 1, 3)
        elif x.ndim == 3:
            if self.num_heads < 1 or x.shape[2] % self.num_heads:
                raise self.ctx.error(f"a 3-D input of hidden size {x.shape[2]} needs num_heads dividing it")
            tokens = x.reshape(*x.shape[:2], self.num_heads, -1)
        else:
            raise self.ctx.error(f"input must be 3-D or 4-D, got shape {list(x.shape)}")
        size = tokens.shape[3]
        dim = self.rotary_dim or size
        if dim > size or dim % 2:
            raise self.ctx.error(f"rotary_embedding_dim {dim} must be even and at most the head size {size}")
        if position_ids is not None:
            ids = np.asarray(position_ids, np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= cos_cache.shape[0]):
                raise self.ctx.error(f"position_ids must lie in [0, {cos_cache.shape[0]})")
            cos_cache, sin_cache = cos_cache[ids], sin_cache[ids]
        for name, cache in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
            if cache.shape != (*tokens.shape[:2], dim // 2):
                raise self.ctx.error(f"{name} gives angles of shape {list(cache.shape)}, the input needs "
                                     f"{[*tokens.shape[:2], dim // 2]}")
        compute = compute_dtype(x.dtype)
        cos = cos_cache.astype(compute)[:, :, np.newaxis]
        sin = sin_cache.astype(compute)[:, :, np.newaxis]
        rotated = tokens[..., :dim].astype(compute)
        first, second = ((rotated[..., 0::2], rotated[..., 1::2]) if self.interleaved
                         else (rotated[..., :dim // 2], rotated[..., dim // 2:]))
        out = tokens.astype(compute)  # a copy: the input is never written
        pairs = (cos * first - sin * second, sin * first + cos * second)
        if self.interleaved:
            out[..., 0:dim:2], out[..., 1:dim:2] = pairs
        else:
            out[..., :dim // 2], out[..., dim // 2:dim] = pairs
        out = out.transpose(0, 2, 1, 3) if x.ndim == 4 else out.reshape(x.shape)
        return [np.ascontiguousarray(out, dtype=x.dtype)]

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """For float32 X and caches without ``position_ids``, of shapes :meth:`run` accepts:
        the compiled one-pass rotation (:func:`.compiled_rotary.rotate_pairs`, :meth:`run`'s
        values bit for bit), compiled now; None otherwise."""
        if len(inputs) != 3 or any(dtype != np.float32 for _, dtype in inputs):
            return None
        (shape, _), (cos_shape, _), (sin_shape, _) = inputs
        if len(shape) == 4:
            batch, heads, sequence, size = shape
        elif len(shape) == 3 and self.num_heads > 0 and shape[2] % self.num_heads == 0:
            batch, sequence, heads, size = *shape[:2], self.num_heads, shape[2] // self.num_heads
        else:
            return None
        dim = self.rotary_dim or size
        if dim > size or dim % 2 or not cos_shape == sin_shape == (batch, sequence, dim // 2):
            return None
        step, offset = (2, 1) if self.interleaved else (1, dim // 2)
        split = (batch, sequence, heads, size)

        def heads_first(array: np.ndarray) -> np.ndarray:
            """(batch, heads, sequence, size) view of a 3-D input or output."""
            return array.reshape(split).transpose(0, 2, 1, 3) if len(shape) == 3 else array

        def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, out: np.ndarray) -> None:
            rotate_pairs.dispatcher(heads_first(x), cos, sin, heads_first(out), step, offset)

        zeros = np.zeros(shape, np.float32)
        caches = np.zeros(cos_shape, np.float32)
        frozen = caches.copy()
        frozen.flags.writeable = False  # constant caches (the fused pattern's) type apart
        for cache in (caches, frozen):
            rotate(zeros, cache, cache, np.empty_like(zeros))
        return Prepared(rotate, tuple(shape), np.dtype(np.float32))


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(Attention, (23, 24, 25), types=FLOAT_TYPES),
    declare(RotaryEmbedding, (23,), types=FLOAT_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
