"""Rotary embeddings written out, at session construction (called by ``fusion.fuse``).

The pattern, as PyTorch exports LLaMA-style ``q * cos + rotate_half(q) * sin``, every value
float32, X of static shape (batch, heads, sequence, size) with an even size 2h::

    A = Mul(X, cos)                                  either order
    X1 = Slice(X, 0:h) and X2 = Slice(X, h:end) on the last axis (steps 1)
    R = Concat(Neg(X2), X1) on the last axis
    B = Mul(R, sin)                                  either order
    O = Add(A, B)                                    either order

where cos and sin are constants that broadcast to (1 or batch, 1, sequence, size) and hold
the same angles in both halves of the last axis (``cat(freqs, freqs)``). It becomes one ONNX
RotaryEmbedding step (the halves rotated, ``interleaved`` 0) on X and caches of shape
(batch, sequence, h) made from the constants. Every value between X and O must be read by
the pattern only and must not be a graph output. The step computes ``x1 cos - x2 sin`` and
``x2 cos + x1 sin`` with the graph's roundings (one per product and one per sum).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from onnx import TensorProto

from ..kernels.attention import RotaryEmbedding
from ..kernels.base import Kernel

__all__ = ["fuse_rotary"]

Slots = tuple[int | None, ...]
Step = tuple[Kernel, Slots, Slots]
Shapes = Mapping[int, Sequence[int | str | None]]
_FLOAT = (TensorProto.FLOAT,)


def fuse_rotary(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
                shapes: Shapes, sources: set[int], add_constant: Callable[[np.ndarray], int]
                ) -> tuple[list[Step], dict[int, np.ndarray]]:
    """``steps`` with every instance of the module's pattern made one RotaryEmbedding step,
    and the caches the steps read (slot -> array); ``sources`` gets cos and sin."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    producer = {s: i for i, (_, _, outputs) in enumerate(steps) for s in outputs if s is not None}
    result: list[Step | None] = list(steps)
    added: dict[int, np.ndarray] = {}
    for position, (kernel, inputs, outputs) in enumerate(steps):
        if kernel.ctx.op_type != "Add" or len(inputs) != 2 or kernel.ctx.output_types[:1] != _FLOAT:
            continue
        match = _match(inputs, steps, known, keep, shapes, readers, producer)
        if match is None or any(result[i] is None for i in match[0]):
            continue
        positions, x, cos, sin, used = match
        slots = []
        for cache in (cos, sin):
            cache.flags.writeable = False
            slot = add_constant(cache)
            added[slot] = cache
            slots.append(slot)
        for i in positions:
            result[i] = None
        ctx = dataclasses.replace(kernel.ctx, op_type="RotaryEmbedding", opset=23, num_inputs=3,
                                  attributes={}, input_types=_FLOAT * 3, omitted_inputs=frozenset())
        result[position] = (RotaryEmbedding(ctx).bind(kernel.pool), (x, *slots), outputs)
        sources.update(used)
    return [step for step in result if step is not None], added


def _match(inputs: Slots, steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
           shapes: Shapes, readers: Counter, producer: Mapping[int, int]
           ) -> tuple[list[int], int, np.ndarray, np.ndarray, list[int]] | None:
    """For the Add of ``inputs``: the places of the other fused nodes, X, the cos and sin
    caches and the constant slots read; or None."""

    def private(slot: int | None, op_type: str) -> tuple[int, Slots] | None:
        index = producer.get(slot) if slot is not None else None
        if index is None or slot in keep or readers[slot] != 1:
            return None
        kernel, node_inputs, outputs = steps[index]
        if kernel.ctx.op_type != op_type or len(outputs) != 1 or kernel.ctx.output_types[:1] != _FLOAT:
            return None
        return index, node_inputs

    for a, b in (inputs, inputs[::-1]):
        direct, rotated = private(a, "Mul"), private(b, "Mul")
        if direct is None or rotated is None:
            continue
        for x, cos_slot in (direct[1], direct[1][::-1]):
            if cos_slot not in known or x in known:
                continue
            for r, sin_slot in (rotated[1], rotated[1][::-1]):
                concat = private(r, "Concat")
                if sin_slot not in known or concat is None:
                    continue
                found = _halves(concat, x, private, steps, known, shapes)
                if found is None:
                    continue
                caches = _caches(known[cos_slot], known[sin_slot], shapes.get(x))
                if caches is None:
                    continue
                positions = [direct[0], rotated[0], concat[0], *found[0]]
                return positions, x, *caches, [cos_slot, sin_slot, *found[1]]
    return None


def _halves(concat: tuple[int, Slots], x: int, private: Callable, steps: Sequence[Step],
            known: Mapping[int, np.ndarray], shapes: Shapes) -> tuple[list[int], list[int]] | None:
    """For ``Concat(Neg(X2), X1)`` on the last axis with X1, X2 the halves of X: the places
    of Neg and the Slices, and the Slices' constant inputs; or None."""
    shape = shapes.get(x)
    if not shape or len(shape) != 4 or not all(isinstance(d, int) for d in shape) or shape[-1] % 2:
        return None
    rank, half = len(shape), shape[-1] // 2
    if len(concat[1]) != 2 or steps[concat[0]][0].ctx.attribute("axis") not in (-1, rank - 1):
        return None
    negated, first = concat[1]
    neg = private(negated, "Neg")
    low, high = private(first, "Slice"), private(neg[1][0], "Slice") if neg is not None else None
    if neg is None or low is None or high is None:
        return None
    used = []
    for (_, slice_inputs), (start, end) in ((low, (0, half)), (high, (half, None))):
        values = [known.get(s) if s is not None else None for s in slice_inputs[1:]]
        if slice_inputs[0] != x or len(values) < 3 or any(v is None for v in values[:3]):
            return None
        starts, ends, axes = (int(np.asarray(v).reshape(-1)[0]) if np.asarray(v).size == 1 else None
                              for v in values[:3])
        steps_value = values[3] if len(values) > 3 else None
        if (axes not in (-1, rank - 1) or starts != start
                or (ends != end if end is not None else ends < 2 * half)
                or (steps_value is not None and np.asarray(steps_value).reshape(-1).tolist() != [1])):
            return None
        used += [s for s in slice_inputs[1:] if s is not None]
    return [neg[0], low[0], high[0]], used


def _caches(cos: np.ndarray, sin: np.ndarray, shape: Sequence[int | str | None] | None
            ) -> tuple[np.ndarray, np.ndarray] | None:
    """(batch, sequence, h) caches from cos and sin constants that broadcast to (1 or batch,
    1, sequence, 2h) with equal halves; None otherwise."""
    batch, _, sequence, size = shape
    half = size // 2
    caches = []
    for value in (cos, sin):
        if value.dtype != np.float32 or value.ndim > 4:
            return None
        padded = value.reshape((1,) * (4 - value.ndim) + value.shape)
        if (padded.shape[1] != 1 or padded.shape[0] not in (1, batch)
                or padded.shape[2] not in (1, sequence) or padded.shape[3] != size):
            return None
        if not np.array_equal(padded[..., :half], padded[..., half:]):
            return None
        angles = np.broadcast_to(padded[:, 0, :, :half], (batch, sequence, half))
        caches.append(np.ascontiguousarray(angles))
    return caches[0], caches[1]
