"""The transformer optimizer's fused normalizations: SkipLayerNormalization,
SkipSimplifiedLayerNormalization, EmbedLayerNormalization (and QEmbedLayerNormalization, its
dynamically quantized form), and SimplifiedLayerNormalization and LayerNormalization below
opset 17, which onnxruntime registers in the default domain (see ``runtime/contrib_types.py``).

Each normalizes over the last axis the sum of its inputs: ``input + skip (+ bias)`` (skip of
the input's shape, or (1, S, H) or (S, H) for every batch entry), or the word, position and
segment embeddings of the token ids. The layer norms run through ONNX LayerNormalization's
kernel (:class:`~onnx_light.kernels.normalization.LayerNormalization`, compiled for float32);
the simplified ones divide by the root mean square (no mean subtracted, no beta), whose mean
output onnxruntime fills with zeros. Optional outputs: the mean and 1/sqrt(variance + epsilon)
per row (B, S, 1), and the sum before normalization.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...tuning.keys import ElementType as T
from ..base import NodeContext, compute_dtype, normalize_axis
from ..declaration import KernelDeclaration
from ..normalization import LayerNormalization
from .base import FLOATS, ContribKernel, ValueType, declare_contrib, onnx_kernel
from .qlinear import dequantize

__all__ = ["DECLARATIONS"]

Arrays = list[np.ndarray]


def _layer_norm(ctx: NodeContext) -> LayerNormalization:
    """ONNX LayerNormalization over the last axis with the node's epsilon, three outputs."""
    attributes = {"axis": -1, "epsilon": ctx.attribute("epsilon", 1e-12)}
    return onnx_kernel(ctx, LayerNormalization, 17, attributes, (T.FLOAT,) * 3, num_outputs=3)


def _row_statistics(first: ValueType, num_outputs: int) -> list[ValueType]:
    """Outputs: normalized (input 0's type, ``first``), mean and inverse deviation (B, S, 1,
    float32), and the sum (input 0's type)."""
    shape = first[1]
    rows = None if shape is None else (*shape[:-1], 1)
    return [first, (T.FLOAT, rows), (T.FLOAT, rows), first][:num_outputs]


class _SkipNormalization(ContribKernel):
    """What both skip normalizations share: ``input + skip (+ bias)`` and the outputs."""

    simplified = False

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.epsilon = float(np.float32(ctx.attribute("epsilon", 1e-12)))
        self.layer_norm = _layer_norm(ctx)

    @classmethod
    def typed_outputs(cls, first: ValueType, attributes: Mapping[str, Any],
                      num_outputs: int) -> list[ValueType]:
        return _row_statistics(first, num_outputs)

    def skip_sum(self, x: np.ndarray, skip: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        if x.ndim != 3 or skip.shape not in (x.shape, (1, *x.shape[1:]), x.shape[1:]):
            raise self.ctx.error(f"input must be (batch, sequence, hidden) and skip of its shape, "
                                 f"(1, sequence, hidden) or (sequence, hidden); got "
                                 f"{list(x.shape)} and {list(skip.shape)}")
        if bias is not None and bias.shape != x.shape[-1:]:
            raise self.ctx.error(f"bias must have shape {list(x.shape[-1:])}, got {list(bias.shape)}")
        compute = compute_dtype(x.dtype)
        total = x.astype(compute) + skip.astype(compute, copy=False)
        return total if bias is None else total + bias.astype(compute, copy=False)

    def normalize(self, total: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None) -> Arrays:
        hidden = total.shape[-1]
        for name, value in (("gamma", gamma), ("beta", beta)):
            if value is not None and value.shape != (hidden,):
                raise self.ctx.error(f"{name} must have shape [{hidden}], got {list(value.shape)}")
        data = total.astype(np.float32, copy=False)
        if not self.simplified:
            y, mean, inverse = self.layer_norm.run(data, gamma.astype(np.float32, copy=False),
                                                   None if beta is None else beta.astype(np.float32))
            return [y, mean, inverse]
        mean_square = np.mean(np.square(data), axis=-1, keepdims=True)
        inverse = (1 / np.sqrt(mean_square + np.float32(self.epsilon))).astype(np.float32)
        y = data * inverse * gamma.astype(np.float32, copy=False)
        return [y, np.zeros_like(inverse), inverse]

    def outputs(self, x: np.ndarray, total: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None
                ) -> Arrays:
        y, mean, inverse = self.normalize(total, gamma, beta)
        outputs = [y.astype(x.dtype, copy=False), mean, inverse, total.astype(x.dtype, copy=False)]
        return outputs[:max(1, self.ctx.num_outputs)]


class SkipLayerNormalization(_SkipNormalization):
    """LayerNormalization of ``input + skip + bias`` with gamma and the optional beta."""

    op_type = "SkipLayerNormalization"

    def run(self, x: np.ndarray, skip: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None = None,
            bias: np.ndarray | None = None) -> Arrays:
        return self.outputs(x, self.skip_sum(x, skip, bias), gamma, beta)


class SkipSimplifiedLayerNormalization(_SkipNormalization):
    """RMS normalization of ``input + skip + bias`` times gamma."""

    op_type = "SkipSimplifiedLayerNormalization"
    simplified = True

    def run(self, x: np.ndarray, skip: np.ndarray, gamma: np.ndarray,
            bias: np.ndarray | None = None) -> Arrays:
        return self.outputs(x, self.skip_sum(x, skip, bias), gamma, None)


class EmbedLayerNormalization(_SkipNormalization):
    """LayerNormalization of word, position and segment embeddings of (batch, sequence)
    token ids; ``mask_index`` is each sentence's count of mask ones (zeros without a mask);
    the positions are 0, 1, ... or ``position_ids`` (one row for every batch entry, or one each)."""

    op_type = "EmbedLayerNormalization"

    @staticmethod
    def _shapes(inputs: Sequence[ValueType]) -> tuple[tuple | None, tuple | None]:
        """The embeddings' shape (batch, sequence, hidden) and ``mask_index``'s (batch,), where known."""
        ids, words = inputs[0], inputs[2] if len(inputs) > 2 else None
        shape = None
        if ids is not None and words is not None and ids[1] is not None and words[1] is not None:
            shape = (*ids[1], words[1][-1])
        return shape, None if ids is None or ids[1] is None else (ids[1][0],)

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        shape, batch = cls._shapes(inputs)
        words = inputs[2] if len(inputs) > 2 else None
        element_type = None if words is None else words[0]
        embedded = None if element_type is None else (element_type, shape)
        return [embedded, (T.INT32, batch), embedded][:num_outputs]

    def run(self, input_ids: np.ndarray, segment_ids: np.ndarray | None, word_embedding: np.ndarray,
            position_embedding: np.ndarray, segment_embedding: np.ndarray | None, gamma: np.ndarray,
            beta: np.ndarray, mask: np.ndarray | None = None,
            position_ids: np.ndarray | None = None) -> Arrays:
        if input_ids.ndim != 2:
            raise self.ctx.error(f"input_ids must be (batch, sequence), got {list(input_ids.shape)}")
        batch, sequence = input_ids.shape
        if (segment_ids is None) != (segment_embedding is None):
            raise self.ctx.error("segment_ids and segment_embedding go together")
        positions = (np.broadcast_to(np.arange(sequence), input_ids.shape) if position_ids is None
                     else np.broadcast_to(position_ids, input_ids.shape))
        total = self._gather("word_embedding", word_embedding, input_ids)
        total = total + self._gather("position_embedding", position_embedding, positions)
        if segment_ids is not None:
            total = total + self._gather("segment_embedding", segment_embedding, segment_ids)
        y, _, _ = self.normalize(total, gamma, beta)
        if mask is None:
            mask_index = np.zeros(batch, np.int32)
        elif mask.shape != input_ids.shape:
            raise self.ctx.error(f"mask must have input_ids' shape {list(input_ids.shape)}, got "
                                 f"{list(mask.shape)}")
        else:
            mask_index = np.count_nonzero(mask, axis=1).astype(np.int32)
        dtype = word_embedding.dtype
        return [y.astype(dtype, copy=False), mask_index, total.astype(dtype, copy=False)][
            :max(1, self.ctx.num_outputs)]

    def _gather(self, name: str, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if table.ndim != 2:
            raise self.ctx.error(f"{name} must be a matrix, got shape {list(table.shape)}")
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise self.ctx.error(f"ids into {name} must lie in [0, {table.shape[0]})")
        return table.astype(compute_dtype(table.dtype), copy=False)[ids]


class LegacyLayerNormalization(ContribKernel):
    """LayerNormalization as onnxruntime runs it at opsets below 17 (where onnx does not define
    it): ONNX LayerNormalization-17's kernel, the same attributes, inputs and outputs."""

    op_type = "LayerNormalization"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.layer_norm = onnx_kernel(ctx, LayerNormalization, 17, ctx.attributes, ctx.input_types,
                                      num_outputs=max(1, ctx.num_outputs))

    @classmethod
    def typed_outputs(cls, first: ValueType, attributes: Mapping[str, Any],
                      num_outputs: int) -> list[ValueType]:
        return [first, *[(attributes.get("stash_type", T.FLOAT), None)] * 2][:num_outputs]

    def run(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None) -> Arrays:
        return list(self.layer_norm.run(x, scale, bias))


class SimplifiedLayerNormalization(ContribKernel):
    """RMS normalization over the axes from ``axis`` (-1 by default) on, times ``scale``,
    computed in ``stash_type`` (float32); the optional second output is
    1/sqrt(mean square + epsilon), of the input's shape with the normalized axes 1."""

    op_type = "SimplifiedLayerNormalization"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = int(ctx.attribute("axis", -1))
        self.epsilon = float(np.float32(ctx.attribute("epsilon", 1e-5)))
        stash = int(ctx.attribute("stash_type", T.FLOAT))
        if stash not in (T.FLOAT, T.DOUBLE):
            raise ctx.error(f"stash_type must be 1 (float) or 11 (double), got {stash}")
        self.stash = np.dtype(np.float32 if stash == T.FLOAT else np.float64)

    @classmethod
    def typed_outputs(cls, first: ValueType, attributes: Mapping[str, Any],
                      num_outputs: int) -> list[ValueType]:
        stash = attributes.get("stash_type", T.FLOAT)
        return [first, (stash, None)][:num_outputs]

    def run(self, x: np.ndarray, scale: np.ndarray) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        axes = tuple(range(axis, x.ndim))
        data = x.astype(self.stash, copy=False)
        mean_square = np.mean(np.square(data), axis=axes, keepdims=True)
        inverse = 1 / np.sqrt(mean_square + self.stash.type(self.epsilon))
        try:
            y = data * inverse * scale.astype(self.stash, copy=False)
        except ValueError:
            raise self.ctx.error(f"scale of shape {list(scale.shape)} does not broadcast to the "
                                 f"normalized axes {list(x.shape[axis:])}") from None
        return [y.astype(x.dtype, copy=False), inverse][:max(1, self.ctx.num_outputs)]


class QEmbedLayerNormalization(EmbedLayerNormalization):
    """:class:`EmbedLayerNormalization` with quantized (uint8 or int8, per tensor) embedding
    tables, gamma and beta, each dequantized to float32 first (what the dynamic quantizer makes
    of EmbedLayerNormalization); outputs the normalized embeddings and ``mask_index``."""

    op_type = "QEmbedLayerNormalization"

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        """EmbedLayerNormalization's shapes; the embeddings are float32 whatever the tables' type."""
        shape, batch = cls._shapes(inputs)
        return [(T.FLOAT, shape), (T.INT32, batch)][:num_outputs]

    def run(self, input_ids: np.ndarray, segment_ids: np.ndarray | None, *rest: np.ndarray | None
            ) -> Arrays:
        names = ("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta")
        if len(rest) > 16:
            raise self.ctx.error(f"expected at most 18 inputs (ids, segments, 5 quantized tensors, "
                                 f"mask, their 5 scales and 5 zero points), got {len(rest) + 2}")
        rest = (*rest, *[None] * (16 - len(rest)))
        tensors, mask, scales, zeros = rest[:5], rest[5], rest[6:11], rest[11:]
        real = [None if tensor is None else dequantize(self.ctx, name, tensor, scale, zero)
                for name, tensor, scale, zero in zip(names, tensors, scales, zeros, strict=True)]
        return super().run(input_ids, segment_ids, *real[:5], mask)[:max(1, self.ctx.num_outputs)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare_contrib(LegacyLayerNormalization, FLOATS),
    declare_contrib(SimplifiedLayerNormalization, FLOATS),
    declare_contrib(SkipLayerNormalization, FLOATS),
    declare_contrib(SkipSimplifiedLayerNormalization, FLOATS),
    declare_contrib(EmbedLayerNormalization), declare_contrib(QEmbedLayerNormalization),
)
