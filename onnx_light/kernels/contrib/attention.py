"""The transformer optimizer's attention operators: Attention (input projection fused in),
QAttention (its dynamically quantized form), MultiHeadAttention (projected Q, K and V) and
RotaryEmbedding.

Both attentions compute ``softmax(scale Q K^T + bias) V`` on (batch, heads, sequence, size)
tensors (``scale``: 1/sqrt(head size) by default) with one additive bias built as onnxruntime
builds it: masked keys get ``mask_filter_value`` (-10000 by default), so a fully
masked row is an even average rather than zeros; ``unidirectional`` masks the keys after
each query's position (past included); ``attention_bias`` (batch or 1, heads or 1, S, T)
is added. Key masks: lengths (batch), end and start positions (2 * batch), raw 0/1 masks
(batch, T) or (batch, S, T). The past key and value are prepended and returned as the present
ones (Attention's one ``(2, batch, heads, T, size)`` tensor, MultiHeadAttention's two).
RotaryEmbedding is ONNX RotaryEmbedding's kernel with onnxruntime's argument order and its
position offset (a one-element ``position_ids``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...tuning.keys import ElementType as T
from .. import attention as onnx_attention
from ..base import NodeContext, compute_dtype
from ..declaration import KernelDeclaration
from .base import FLOATS, ContribKernel, ValueType, declare_contrib, onnx_kernel
from .quantized_gemm import BYTES, PackedProduct, quantized_sums, real_scale

__all__ = ["DECLARATIONS", "softmax_attention"]

Arrays = list[np.ndarray]


def softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                      add: Callable[[np.ndarray], None]) -> np.ndarray:
    """``softmax(scale Q K^T + bias) V`` of (batch, heads, S, size) Q and (batch, heads, T,
    size) K and V in their (float) type; ``add`` adds the bias to the scores in place."""
    scores = np.matmul(q * q.dtype.type(scale), np.swapaxes(k, -1, -2))
    add(scores)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return np.matmul(scores, v)


def _split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    batch, sequence, hidden = x.shape
    return x.reshape(batch, sequence, heads, hidden // heads).transpose(0, 2, 1, 3)


class _Attention(ContribKernel):
    """What both attentions share: attributes, the bias and the product."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.heads = int(ctx.attribute("num_heads", 0))
        if self.heads < 1:
            raise ctx.error(f"attribute num_heads must be positive, got {self.heads}")
        self.unidirectional = bool(ctx.attribute("unidirectional", 0))
        self.filter = float(np.float32(ctx.attribute("mask_filter_value", -10000.0)))
        self.scale = float(ctx.attribute("scale", 0.0))

    def heads_of(self, name: str, x: np.ndarray) -> np.ndarray:
        if x.ndim != 3 or x.shape[2] % self.heads:
            raise self.ctx.error(f"{name} must be (batch, sequence, hidden) with hidden a multiple "
                                 f"of {self.heads} heads, got shape {list(x.shape)}")
        return _split_heads(x, self.heads)

    def key_mask(self, mask: np.ndarray, batch: int, q_length: int, total: int) -> np.ndarray:
        """A key mask as booleans (True: masked) broadcasting to (batch, 1, q_length, total)."""
        j = np.arange(total)
        if mask.ndim == 1 and mask.size == batch:
            return (j >= mask.reshape(-1, 1, 1, 1))
        if mask.ndim == 1 and mask.size == 2 * batch:
            end, start = mask[:batch].reshape(-1, 1, 1, 1), mask[batch:].reshape(-1, 1, 1, 1)
            return (j >= end) | (j < start)
        if mask.shape == (batch, total):
            return (mask == 0).reshape(batch, 1, 1, total)
        if mask.shape == (batch, q_length, total):
            return (mask == 0).reshape(batch, 1, q_length, total)
        raise self.ctx.error(f"the mask of shape {list(mask.shape)} is none of (batch), "
                             f"(2 * batch), (batch, {total}), (batch, {q_length}, {total}) "
                             f"for batch {batch}")

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
               attention_bias: np.ndarray | None, past: int) -> np.ndarray:
        """Attention of (batch, heads, S, size) Q over (batch, heads, T, size) K and V, as
        (batch, S, heads * value size)."""
        batch, _, q_length, _ = q.shape
        total = k.shape[2]
        compute = compute_dtype(q.dtype)
        masked = np.zeros((1, 1, q_length, total), bool)
        if mask is not None:
            masked = masked | self.key_mask(mask, batch, q_length, total)
        if self.unidirectional:
            masked = masked | (np.arange(total) > past + np.arange(q_length).reshape(-1, 1))
        bias = np.where(masked, compute.type(self.filter), compute.type(0))

        def add(scores: np.ndarray) -> None:
            try:
                scores += bias
                if attention_bias is not None:
                    scores += attention_bias.astype(compute, copy=False)
            except ValueError:
                given = None if attention_bias is None else list(attention_bias.shape)
                raise self.ctx.error(f"the mask and attention_bias ({given}) must broadcast to the "
                                     f"scores' shape {list(scores.shape)} (batch, heads, {q_length}, "
                                     f"{total})") from None

        y = softmax_attention(q.astype(compute, copy=False), k.astype(compute, copy=False),
                              v.astype(compute, copy=False), self.scale or 1 / np.sqrt(q.shape[3]), add)
        return y.transpose(0, 2, 1, 3).reshape(batch, q_length, -1).astype(q.dtype, copy=False)


class Attention(_Attention):
    """Multi-head self-attention with the input projection: ``input @ weights + bias`` split
    into Q, K and V (``qkv_hidden_sizes``, equal thirds by default); ``mask_index``, ``past``
    (2, batch, heads, P, size) and ``attention_bias``; outputs the attention and ``present``."""

    op_type = "Attention"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        sizes = ctx.attribute("qkv_hidden_sizes")
        self.sizes = None if sizes is None else [int(s) for s in sizes]
        if self.sizes is not None and (len(self.sizes) != 3 or self.sizes[0] != self.sizes[1]
                                       or any(s % self.heads for s in self.sizes)):
            raise ctx.error(f"qkv_hidden_sizes must be three sizes, Q's and K's equal, each a "
                            f"multiple of {self.heads} heads; got {self.sizes}")
        for name in ("do_rotary", "past_present_share_buffer"):
            if ctx.attribute(name, 0):
                raise ctx.error(f"attribute {name}=1 is not supported")

    @classmethod
    def typed_outputs(cls, first: ValueType, attributes: Mapping[str, Any],
                      num_outputs: int) -> list[ValueType]:
        return [(first[0], None)] * num_outputs

    def run(self, x: np.ndarray, weights: np.ndarray, bias: np.ndarray | None = None,
            mask_index: np.ndarray | None = None, past: np.ndarray | None = None,
            attention_bias: np.ndarray | None = None,
            past_sequence_length: np.ndarray | None = None) -> Arrays:
        self.check_projection(x, weights, bias)
        compute = compute_dtype(x.dtype)
        projected = x.astype(compute) @ weights.astype(compute)
        if bias is not None:
            projected += bias.astype(compute)
        return self.self_attention(projected, x.dtype, mask_index, past, attention_bias)

    def check_projection(self, x: np.ndarray, weights: np.ndarray, bias: np.ndarray | None) -> None:
        if x.ndim != 3 or weights.ndim != 2 or weights.shape[0] != x.shape[2]:
            raise self.ctx.error(f"input (batch, sequence, {weights.shape[0]}) and weights (input "
                                 f"hidden, Q+K+V hidden) do not fit: {list(x.shape)}, {list(weights.shape)}")
        sizes = self.sizes or [weights.shape[1] // 3] * 3
        if sum(sizes) != weights.shape[1] or (bias is not None and bias.shape != (weights.shape[1],)):
            raise self.ctx.error(f"weights ({list(weights.shape)}) and bias must hold Q, K and V "
                                 f"hidden sizes {sizes}")

    def self_attention(self, projected: np.ndarray, dtype: np.dtype, mask_index: np.ndarray | None,
                       past: np.ndarray | None, attention_bias: np.ndarray | None) -> Arrays:
        """The outputs from the projected (batch, sequence, Q+K+V hidden) input, in ``dtype``."""
        sizes = self.sizes or [projected.shape[2] // 3] * 3
        q, k, v = np.split(projected, np.cumsum(sizes)[:2], axis=-1)
        q, k, v = self.heads_of("Q", q), self.heads_of("K", k), self.heads_of("V", v)
        past_length = 0
        if past is not None:
            if past.ndim != 5 or past.shape[0] != 2 or past.shape[1:3] != k.shape[:2]:
                raise self.ctx.error(f"past must be (2, batch, heads, past length, size), got "
                                     f"{list(past.shape)}")
            past_length = past.shape[3]
            k = np.concatenate([past[0].astype(k.dtype), k], axis=2)
            v = np.concatenate([past[1].astype(v.dtype), v], axis=2)
        y = self.attend(q, k, v, mask_index, attention_bias, past_length).astype(dtype)
        if self.ctx.num_outputs < 2:
            return [y]
        return [y, np.stack([k, v]).astype(dtype, copy=False)]


class QAttention(PackedProduct, Attention):
    """:class:`Attention` with a quantized input and weights (uint8 or int8, what the dynamic
    quantizer makes of Attention): the exact int32 product of ``input - input_zero_point``
    and ``weight - weight_zero_point`` (per tensor, or per column of the weights) times
    ``input_scale * weight_scale``, plus the float bias; float outputs."""

    op_type = "QAttention"
    b_inputs = (1, 7)  # the weights, packed at construction (:class:`PackedProduct`)

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        scale = inputs[3] if len(inputs) > 3 else None
        return [None if scale is None else (scale[0], None)] * num_outputs

    def run(self, x: np.ndarray, weights: np.ndarray, bias: np.ndarray, input_scale: np.ndarray,
            weight_scale: np.ndarray, mask_index: np.ndarray | None = None,
            input_zero_point: np.ndarray | None = None, weight_zero_point: np.ndarray | None = None,
            past: np.ndarray | None = None) -> Arrays:
        self.check_projection(x, weights, bias)
        sums = quantized_sums(self.ctx, x, input_zero_point, weights, weight_zero_point,
                              self.columns(weights, weight_zero_point))
        projected = sums.astype(np.float32) * real_scale(self.ctx, input_scale, weight_scale,
                                                         weights.shape[1])
        projected += bias.astype(np.float32, copy=False)
        return self.self_attention(projected, bias.dtype, mask_index, past, None)


class MultiHeadAttention(_Attention):
    """Multi-head attention of projected Q, K and V: (batch, S, hidden) each, K and V also
    (batch, heads, T, size), or Q packed with K and V (batch, S, heads, 3, size), or K packed
    with V (batch, T, heads, 2, size); the optional ``bias`` (Q, K and V hidden) is added to
    3-D ones. ``key_padding_mask``, ``attention_bias``, ``past_key`` and ``past_value``
    (batch, heads, P, size); outputs the attention and the present key and value."""

    op_type = "MultiHeadAttention"

    @classmethod
    def typed_outputs(cls, first: ValueType, attributes: Mapping[str, Any],
                      num_outputs: int) -> list[ValueType]:
        return [(first[0], None)] * num_outputs

    def run(self, query: np.ndarray, key: np.ndarray | None = None, value: np.ndarray | None = None,
            bias: np.ndarray | None = None, key_padding_mask: np.ndarray | None = None,
            attention_bias: np.ndarray | None = None, past_key: np.ndarray | None = None,
            past_value: np.ndarray | None = None, *rest: np.ndarray | None) -> Arrays:
        if any(r is not None for r in rest):
            raise self.ctx.error("past_sequence_length and cache_indirection are not supported")
        compute = compute_dtype(query.dtype)
        q, k, v = self._projections(query.astype(compute), key, value, bias, compute)
        if (past_key is None) != (past_value is None):
            raise self.ctx.error("past_key and past_value go together")
        past = 0
        if past_key is not None:
            past = past_key.shape[2]
            try:
                k = np.concatenate([past_key.astype(compute), k], axis=2)
                v = np.concatenate([past_value.astype(compute), v], axis=2)
            except ValueError:
                raise self.ctx.error(f"past_key {list(past_key.shape)} and past_value "
                                     f"{list(past_value.shape)} must be (batch, heads, P, size)") from None
        y = self.attend(q, k, v, key_padding_mask, attention_bias, past).astype(query.dtype)
        return [y, k.astype(query.dtype), v.astype(query.dtype)][:max(1, self.ctx.num_outputs)]

    def _projections(self, query: np.ndarray, key: np.ndarray | None, value: np.ndarray | None,
                     bias: np.ndarray | None, compute: np.dtype
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q, K and V as (batch, heads, sequence, size), the bias added."""
        if query.ndim == 5:  # packed (batch, S, heads, 3, size)
            if key is not None or value is not None or query.shape[2:4] != (self.heads, 3):
                raise self.ctx.error(f"packed QKV must be (batch, S, {self.heads}, 3, size) without "
                                     f"key and value, got {list(query.shape)}")
            if bias is not None:
                query = query + bias.astype(compute).reshape(3, self.heads, -1).transpose(1, 0, 2)
            q, k, v = (query[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
            return q, k, v
        q_bias, k_bias, v_bias = (None, None, None)
        if bias is not None:
            hidden = query.shape[-1]
            q_bias, k_bias, v_bias = bias[:hidden], bias[hidden:2 * hidden], bias[2 * hidden:]
        q = self.heads_of("query", query if q_bias is None else query + q_bias.astype(compute))
        if key is None:
            raise self.ctx.error("key is required unless query packs Q, K and V")
        if key.ndim == 5:  # packed (batch, T, heads, 2, size)
            if value is not None or key.shape[2:4] != (self.heads, 2):
                raise self.ctx.error(f"packed KV must be (batch, T, {self.heads}, 2, size) without "
                                     f"value, got {list(key.shape)}")
            k, v = (key[:, :, :, i].astype(compute).transpose(0, 2, 1, 3) for i in range(2))
            return q, k, v
        if value is None:
            raise self.ctx.error("value is required with a 3-D or 4-D key")
        if key.ndim == 4:  # already (batch, heads, T, size): no bias
            return q, key.astype(compute), value.astype(compute)
        k = key.astype(compute) + (0 if k_bias is None else k_bias.astype(compute))
        v = value.astype(compute) + (0 if v_bias is None else v_bias.astype(compute))
        return q, self.heads_of("key", k), self.heads_of("value", v)


class RotaryEmbedding(ContribKernel):
    """Rotary position embedding of (batch, S, hidden) or (batch, heads, S, size) inputs:
    ``position_ids`` (batch, S), or one offset for positions offset, offset + 1, ...;
    caches (max positions, rotary dimension / 2); ``interleaved`` pairs neighbours."""

    op_type = "RotaryEmbedding"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        if ctx.attribute("is_packed_batching", 0):
            raise ctx.error("attribute is_packed_batching=1 is not supported")
        if float(ctx.attribute("scale", 1.0)) != 1.0:
            raise ctx.error("attribute scale other than 1 is not supported")
        attributes = {name: ctx.attribute(name, 0) for name in
                      ("interleaved", "num_heads", "rotary_embedding_dim")}
        self.rotate = onnx_kernel(ctx, onnx_attention.RotaryEmbedding, 23, attributes,
                                  (*ctx.input_types[:1], T.FLOAT, T.FLOAT, T.INT64))

    def run(self, x: np.ndarray, position_ids: np.ndarray, cos_cache: np.ndarray,
            sin_cache: np.ndarray) -> Arrays:
        if x.ndim not in (3, 4):
            raise self.ctx.error(f"input must be 3-D or 4-D, got shape {list(x.shape)}")
        batch, sequence = x.shape[0], x.shape[1 if x.ndim == 3 else 2]
        if position_ids.size == 1:
            positions = int(position_ids.reshape(-1)[0]) + np.arange(sequence)
            position_ids = np.broadcast_to(positions, (batch, sequence))
        elif position_ids.shape != (batch, sequence):
            raise self.ctx.error(f"position_ids must be (batch, sequence) = {[batch, sequence]} or "
                                 f"one offset, got {list(position_ids.shape)}")
        return list(self.rotate.run(x, cos_cache, sin_cache, position_ids))


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare_contrib(Attention, FLOATS), declare_contrib(QAttention, BYTES),
    declare_contrib(MultiHeadAttention, FLOATS),
    declare_contrib(RotaryEmbedding, FLOATS),
)
