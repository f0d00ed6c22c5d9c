"""Scaled dot-product attention fusion, at session construction (called by ``fusion.fuse``).

The pattern, as exporters write attention over heads (BERT, DistilBERT, GPT-2, LLaMA, ViT,
wav2vec2 from PyTorch), every value float32::

    [Q = Transpose(q)]  [KT = Transpose(k)]  [V = Transpose(v)]
    S  = MatMul(Q, KT)
    [S = Mul(S, c) | Mul(c, S) | Div(S, c)]      c a one-element constant
    [S = Add(S, M) | Add(M, S)]                  M the additive mask
    P  = Softmax(S) along the last axis          (axis = rank - 1; any opset)
    [P = Cast(P, to=FLOAT)] ...                  float-to-float Casts, as GPT-2 and ViT have
    O  = MatMul(P, V)

where K and V (before their Transposes) may each be the repetition of grouped-query
attention, as LLaMA's export writes ``repeat_kv`` (shapes constant)::

    k = Reshape(Expand(Unsqueeze(k4, axes=[-3 of 5]), shape), shape')   k4 (..., G, N, D)

becomes one :class:`~onnx_light.kernels.fused_attention.FusedAttention` step at the place of
the last MatMul, reading q, k, v (a Transpose is absorbed when only this pattern reads its
output, and a repetition when only this pattern reads its values and the Transpose after it,
if any, keeps the heads' axis) and M. Every value between the first MatMul and the last must
be read by the next node of the pattern only and must not be a graph output; otherwise
nothing is fused. The
fusion is refused when the scores' rank is unknown (the Softmax axis cannot be checked), the
axis is not the last, the types are not float32, or the mask's static shape does not
broadcast to the scores' along their last axis without enlarging them. The step is tuned as
the Softmax node (its key, ``parallel.minimum_elements`` for the rows and
``attention.minimum_flops`` for splitting the heads).

The fused step computes the scale, the mask and the softmax in float64 and rounds once
(the graph rounds after each node), so its output is within a few float32 units of the
unfused graph's (tests/test_attention_fusion.py states the bound).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from onnx import TensorProto

from ..kernels.base import Kernel
from ..kernels.compiled_softmax import mask_layout
from ..kernels.fused_attention import FusedAttention, Repeat
from ..kernels.reductions import Softmax

__all__ = ["fuse_attention"]

Slots = tuple[int | None, ...]
Step = tuple[Kernel, Slots, Slots]
Shapes = Mapping[int, Sequence[int | str | None]]


def fuse_attention(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
                   shapes: Shapes, sources: set[int]) -> list[Step]:
    """``steps`` with every instance of the module's pattern made one step (``sources`` gets
    the scale constants the steps hold)."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    producer = {s: i for i, (_, _, outputs) in enumerate(steps) for s in outputs if s is not None}
    result: list[Step | None] = list(steps)
    for position, step in enumerate(steps):
        if step[0].ctx.op_type == "Softmax" and isinstance(step[0], Softmax):
            match = _match(position, steps, known, keep, shapes, readers, producer)
            if match is not None and all(result[i] is not None for i in match.positions):
                for i in match.positions[:-1]:
                    result[i] = None
                result[match.positions[-1]] = match.step(steps)
                sources.update(match.constants)
    return [step for step in result if step is not None]


@dataclasses.dataclass
class _Match:
    softmax: Softmax
    positions: list[int]  # the fused nodes' places, in graph order
    inputs: tuple[int | None, ...]  # q, k, v, mask
    perms: tuple[tuple[int, ...] | None, ...]
    scale: float
    constants: dict[int, np.ndarray]
    repeats: tuple[Repeat | None, Repeat | None]

    def step(self, steps: Sequence[Step]) -> Step:
        softmax = self.softmax
        nodes = [steps[i] for i in self.positions]
        ctx = dataclasses.replace(softmax.ctx, op_type=FusedAttention.op_type, num_inputs=4,
                                  input_types=(TensorProto.FLOAT,) * 4)
        kernel = FusedAttention(ctx, softmax, self.scale, self.perms, self.inputs, nodes,
                                self.constants, self.repeats).bind(softmax.pool)
        return kernel, self.inputs, nodes[-1][2]


def _float32(kernel: Kernel) -> bool:
    return kernel.ctx.output_types[:1] == (TensorProto.FLOAT,) and kernel.ctx.domain in ("", "ai.onnx")


def _match(position: int, steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
           shapes: Shapes, readers: Counter, producer: Mapping[int, int]) -> _Match | None:
    """The pattern around the Softmax at ``position``, or None."""
    softmax, (x,), (p,) = steps[position][0], steps[position][1], steps[position][2]
    rank = len(shapes.get(p) or ())
    axis = softmax.axis
    if rank < 2 or not _float32(softmax) or not -rank <= axis < rank or axis % rank != rank - 1:
        return None

    def private(slot: int | None, op_type: str) -> int | None:
        """The place of the step of ``op_type`` making ``slot``, read once and not kept."""
        index = producer.get(slot) if slot is not None else None
        if index is None or slot in keep or readers[slot] != 1:
            return None
        kernel, _, outputs = steps[index]
        return index if kernel.ctx.op_type == op_type and len(outputs) == 1 and _float32(kernel) else None

    def scaled_scores(x: int | None) -> tuple[list[int], float, dict[int, np.ndarray], Slots] | None:
        """Back from ``x``: the optional scale by a constant, then the MatMul of Q and K^T."""
        positions, constants, scale = [], {}, 1.0
        for op_type in ("Mul", "Div"):
            index = private(x, op_type)
            if index is None:
                continue
            a, b = steps[index][1]
            constant = b if b in known else a if op_type == "Mul" and a in known else None
            if constant is None or known[constant].size != 1 or known[constant].dtype != np.float32:
                return None
            value = float(known[constant].reshape(-1)[0])
            scale = value if op_type == "Mul" else 1.0 / value
            constants[constant] = known[constant]
            positions.append(index)
            x = a if constant == b else b
            break
        first = private(x, "MatMul")
        if first is None or len(steps[first][1]) != 2:
            return None
        return [first, *positions], scale, constants, steps[first][1]

    mask = None
    index = private(x, "Add")
    if index is None:
        found = scaled_scores(x)
    else:
        a, b = steps[index][1]
        found = scaled_scores(a)
        mask = b
        if found is None:
            found, mask = scaled_scores(b), a
        if found is None or mask is None or not _mask_fits(shapes.get(mask), shapes.get(x)):
            return None
        found[0].append(index)
    if found is None:
        return None
    positions, scale, constants, (q, k) = found
    positions.append(position)
    # Forward: float Casts, then the MatMul with V.
    out = p
    while True:
        readers_of = [i for i, (_, inputs, _) in enumerate(steps) if out in inputs]
        if out in keep or readers[out] != 1 or len(readers_of) != 1:
            return None
        (index,) = readers_of
        kernel, inputs, outputs = steps[index]
        if kernel.ctx.op_type == "Cast" and getattr(kernel, "to", None) == TensorProto.FLOAT:
            positions.append(index)
            out = outputs[0]
            continue
        if kernel.ctx.op_type != "MatMul" or not _float32(kernel) or len(inputs) != 2 or inputs[0] != out:
            return None
        positions.append(index)
        v = inputs[1]
        break
    operands, perms, repeats = [], [], []
    for slot in (q, k, v):
        index = private(slot, "Transpose")
        perm = getattr(steps[index][0], "perm", None) if index is not None else None
        if perm is None:
            operands.append(slot)
            perms.append(None)
        else:
            positions.append(index)
            operands.append(steps[index][1][0])
            perms.append(tuple(perm))
    for i in (1, 2):  # K and V: a repetition of grouped-query attention before the Transpose
        perm = perms[i]
        found = _repetition(operands[i], steps, known, shapes, private)
        if found is not None and (perm is None or list(perm[:-2]) == list(range(len(perm) - 2))):
            operands[i], repeat, nodes, shape_constants = found
            positions += nodes
            constants.update(shape_constants)
            repeats.append(repeat)
        else:
            repeats.append(None)
    if any(s is None for s in operands):
        return None
    return _Match(softmax, sorted(positions), (*operands, mask), tuple(perms), scale, constants,
                  (repeats[0], repeats[1]))


def _repetition(slot: int | None, steps: Sequence[Step], known: Mapping[int, np.ndarray], shapes: Shapes,
                private: Callable[[int | None, str], int | None]
                ) -> tuple[int, Repeat, list[int], dict[int, np.ndarray]] | None:
    """Back from ``slot``: ``Reshape(Expand(Unsqueeze(x, axis -3 of the result), shape),
    shape')`` with constant shapes, each value read once: (x, the two shapes, the nodes'
    places, the constants they read); None otherwise (the kernel checks at run time that the
    shapes repeat x's heads in place)."""
    reshape = private(slot, "Reshape")
    expand = private(steps[reshape][1][0], "Expand") if reshape is not None else None
    unsqueeze = private(steps[expand][1][0], "Unsqueeze") if expand is not None else None
    if unsqueeze is None or getattr(steps[reshape][0], "allowzero", 0):
        return None
    kernel, inputs, _ = steps[unsqueeze]
    x, rank = inputs[0], len(shapes.get(inputs[0]) or ())
    axes_slot = inputs[1] if len(inputs) > 1 else None
    axes = known.get(axes_slot) if axes_slot is not None else kernel.ctx.attribute("axes")
    shape_slots = (steps[expand][1][1], steps[reshape][1][1])
    if (rank < 3 or axes is None or [int(a) % (rank + 1) for a in np.ravel(axes)] != [rank - 2]
            or any(s not in known for s in shape_slots)):
        return None
    expand_shape, reshape_shape = (tuple(int(d) for d in known[s].reshape(-1)) for s in shape_slots)
    constants = {s: known[s] for s in (*shape_slots, axes_slot) if s is not None}
    return x, (expand_shape, reshape_shape), [unsqueeze, expand, reshape], constants


def _mask_fits(mask_shape: Sequence[int | str | None] | None,
               scores_shape: Sequence[int | str | None] | None) -> bool:
    """False when both static shapes are known and the mask does not broadcast to the scores
    along their last axis; unknown shapes are checked at run time."""
    if mask_shape is None or scores_shape is None:
        return True
    if not all(isinstance(d, int) for d in (*mask_shape, *scores_shape)):
        return True
    return mask_layout(tuple(mask_shape), tuple(scores_shape)) is not None
