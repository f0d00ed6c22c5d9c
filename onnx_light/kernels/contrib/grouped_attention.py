"""GroupQueryAttention: the causal grouped-query attention of decoder language models, with its
key-value cache, as onnxruntime's model builder writes it.

Q (batch, S, heads * size) and K, V (batch, S, kv heads * size), or the three packed in the
query; each group of ``num_heads / kv_num_heads`` query heads reads one key-value head. The
past key and value are a buffer (batch, kv heads, P, size) whose first entries hold each
sequence's cache; the present ones (batch, kv heads, max(P, total_sequence_length), size) hold
them followed by the new keys and values, zeros after (so a buffer of the maximal length can be
fed back as the next past: onnxruntime's shared past and present buffers).
``seqlens_k`` gives each sequence's total length minus one. The first prompt is a run whose S
equals ``total_sequence_length``: no past is read, and a sequence's keys from its length on are
padding. Otherwise sequence b's cache holds ``seqlens_k[b] + 1 - S`` entries (each sequence its
own, a padded batch), its new keys go after them and its queries sit at those positions.
``do_rotary`` rotates the first ``2 * cos_cache.shape[1]`` features of each head of Q and K
by ``cos_cache``/``sin_cache`` at those positions (ONNX RotaryEmbedding's kernel).
Scores are ``scale Q K^T`` (1/sqrt(size) by default), capped by ``softcap`` when given, plus
``attention_bias``, masked causally (and to ``local_window_size`` keys before each query) with
the lowest float32; softmax; times V.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...tuning.keys import ElementType as T
from .. import attention as onnx_attention
from ..base import NodeContext, compute_dtype
from ..declaration import KernelDeclaration
from .attention import softmax_attention
from .base import FLOATS, ContribKernel, ValueType, declare_contrib, onnx_kernel

__all__ = ["DECLARATIONS"]

Arrays = list[np.ndarray]


class GroupQueryAttention(ContribKernel):
    """See the module docstring."""

    op_type = "GroupQueryAttention"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.heads = int(ctx.attribute("num_heads", 0))
        self.kv_heads = int(ctx.attribute("kv_num_heads", 0))
        if self.heads < 1 or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ctx.error(f"num_heads ({self.heads}) must be a positive multiple of kv_num_heads "
                            f"({self.kv_heads})")
        self.scale = float(ctx.attribute("scale", 0.0))
        self.softcap = float(ctx.attribute("softcap", 0.0))
        self.window = int(ctx.attribute("local_window_size", -1))
        for name in ("smooth_softmax", "qk_output"):
            if ctx.attribute(name, 0):
                raise ctx.error(f"attribute {name} other than 0 is not supported")
        self.rotate = None
        if ctx.attribute("do_rotary", 0):
            self.rotate = onnx_kernel(ctx, onnx_attention.RotaryEmbedding, 23,
                                      {"interleaved": ctx.attribute("rotary_interleaved", 0)},
                                      (T.FLOAT, T.FLOAT, T.FLOAT, T.INT64))

    @classmethod
    def typed_outputs(cls, first: ValueType, attributes: Mapping[str, Any],
                      num_outputs: int) -> list[ValueType]:
        return [(first[0], None)] * num_outputs

    def _heads(self, query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q, K and V as (batch, heads, S, size)."""
        if query.ndim != 3:
            raise self.ctx.error(f"query must be (batch, S, hidden), got {list(query.shape)}")
        batch, length, _ = query.shape
        if key is None:
            if value is not None:
                raise self.ctx.error("value needs key")
            width = query.shape[2] // (self.heads + 2 * self.kv_heads)
            if width * (self.heads + 2 * self.kv_heads) != query.shape[2]:
                raise self.ctx.error(f"packed QKV's hidden size {query.shape[2]} is not "
                                     f"(num_heads + 2 kv_num_heads) heads")
            query, key, value = np.split(query, [self.heads * width, (self.heads + self.kv_heads) * width],
                                         axis=2)
        if value is None:
            raise self.ctx.error("key needs value")
        out = []
        for name, x, heads in (("query", query, self.heads), ("key", key, self.kv_heads),
                               ("value", value, self.kv_heads)):
            if x.ndim != 3 or x.shape[:2] != (batch, length) or x.shape[2] % heads:
                raise self.ctx.error(f"{name} must be (batch, S, {heads} heads * size) with the "
                                     f"query's batch and S, got {list(x.shape)}")
            out.append(x.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3))
        return out[0], out[1], out[2]

    def _cache_lengths(self, lengths: np.ndarray, length: int, total: int, buffer: int) -> np.ndarray:
        """Each sequence's number of cached entries (0 in the first prompt), checked against
        the past buffer and ``total_sequence_length``."""
        if length == total:
            if np.any(lengths > length) or np.any(lengths < 1):
                raise self.ctx.error(f"in the first prompt (S = total_sequence_length = {total}), "
                                     f"seqlens_k + 1 must be within 1..S, got {lengths.tolist()}")
            return np.zeros_like(lengths)
        pasts = lengths - length
        if np.any(pasts < 0) or np.any(pasts > buffer) or np.any(lengths > max(buffer, total)):
            raise self.ctx.error(f"with S = {length} new tokens, a past buffer of {buffer} and "
                                 f"total_sequence_length {total}, seqlens_k + 1 ({lengths.tolist()}) "
                                 f"must be within S..S + {buffer} and at most {max(buffer, total)}")
        return pasts

    @staticmethod
    def _present(past: np.ndarray | None, new: np.ndarray, pasts: np.ndarray, present: int,
                 compute: np.dtype) -> np.ndarray:
        """The present keys or values: each sequence's cached entries, then its new ones, then
        zeros, (batch, kv heads, ``present``, size)."""
        batch, heads, length, size = new.shape
        out = np.zeros((batch, heads, present, size), compute)
        for b, cached in enumerate(pasts.tolist()):
            if cached:
                out[b, :, :cached] = past[b, :, :cached]
            out[b, :, cached:cached + length] = new[b]
        return out

    def run(self, query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None,
            past_key: np.ndarray | None, past_value: np.ndarray | None, seqlens_k: np.ndarray,
            total_sequence_length: np.ndarray, cos_cache: np.ndarray | None = None,
            sin_cache: np.ndarray | None = None, position_ids: np.ndarray | None = None,
            attention_bias: np.ndarray | None = None, *rest: np.ndarray | None) -> Arrays:
        if position_ids is not None or any(r is not None for r in rest):
            raise self.ctx.error("position_ids and head_sink are not supported")
        compute = compute_dtype(query.dtype)
        q, k, v = (x.astype(compute, copy=False) for x in self._heads(query, key, value))
        batch, _, length, _ = q.shape
        lengths = np.asarray(seqlens_k, np.int64).reshape(-1) + 1
        if lengths.size != batch:
            raise self.ctx.error(f"seqlens_k must hold {batch} values, got {lengths.size}")
        if (past_key is None) != (past_value is None):
            raise self.ctx.error("past_key and past_value go together")
        buffer = 0 if past_key is None else past_key.shape[2]
        total = int(np.asarray(total_sequence_length).reshape(-1)[0])
        pasts = self._cache_lengths(lengths, length, total, buffer)
        if self.rotate is not None:
            if cos_cache is None or sin_cache is None:
                raise self.ctx.error("do_rotary needs cos_cache and sin_cache")
            positions = pasts.reshape(-1, 1) + np.arange(length)
            rotate = self.rotate.variant(rotary_dim=2 * cos_cache.shape[-1])
            q = rotate.run(q, cos_cache, sin_cache, positions)[0]
            k = rotate.run(k, cos_cache, sin_cache, positions)[0]
        present = max(buffer, total)
        k = self._present(past_key, k, pasts, present, compute)
        v = self._present(past_value, v, pasts, present, compute)
        present_key, present_value = k.astype(query.dtype), v.astype(query.dtype)
        group = self.heads // self.kv_heads
        span = max(total, int(lengths.max()))  # the keys any query may read
        keys, values = (np.repeat(x[:, :, :span], group, axis=1) if group > 1 else x[:, :, :span]
                        for x in (k, v))
        position = pasts.reshape(-1, 1, 1, 1) + np.arange(length).reshape(-1, 1)
        j = np.arange(span)
        masked = (j > position) | (j >= lengths.reshape(-1, 1, 1, 1))
        if self.window >= 0:
            masked = masked | (j <= position - self.window)
        lowest = np.finfo(compute).min

        def add(scores: np.ndarray) -> None:
            if self.softcap > 0:
                np.tanh(scores / self.softcap, out=scores)
                scores *= self.softcap
            if attention_bias is not None:
                try:
                    scores += attention_bias.astype(compute, copy=False)
                except ValueError:
                    raise self.ctx.error(f"attention_bias of shape {list(attention_bias.shape)} does "
                                         f"not broadcast to {list(scores.shape)}") from None
            np.copyto(scores, lowest, where=np.broadcast_to(masked, scores.shape))

        y = softmax_attention(q, keys, values, self.scale or 1 / np.sqrt(q.shape[3]), add)
        y = y.transpose(0, 2, 1, 3).reshape(batch, length, -1).astype(query.dtype, copy=False)
        return [y, present_key, present_value][:max(1, self.ctx.num_outputs)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (declare_contrib(GroupQueryAttention, FLOATS),)
