"""Operator fusion at session construction: fewer passes over the activations.

Runs after constant folding, over the steps left to run, in graph order:

1. **Channel affine chains.** Inference BatchNormalization, and Mul, Add or Sub of X by a
   constant that varies along the channel axis (axis 1) only, each compute
   ``Y = X * m + o`` per channel. Consecutive ones (each the only reader of the previous
   one's output) compose into one ``(m, o)``, computed in float64. When the chain directly
   follows a Conv with constant weights whose output nothing else reads, it is folded into
   the weights and the bias (``W' = W * m``, ``B' = B * m + o``, rounded once into the
   weights' type); otherwise it runs as one
   :class:`~onnx_light.kernels.normalization.ChannelAffine` step.
2. **Activations.** A unary op that can compute in place (Relu, Tanh, LeakyRelu: see
   ``ElementwiseOp.in_place``) whose input is read by it alone is applied to every block of
   its producer's output while the block is in cache, if the producer accepts an epilogue
   (Conv, BatchNormalization, ChannelAffine, the elementwise ops).
3. **Pre-activations.** A ``ChannelAffine`` step (with its activation) whose output only a
   1x1 convolution with constant weights reads becomes that convolution's
   :class:`~onnx_light.kernels.conv.Prologue`: DenseNet's BatchNormalization + Relu before
   each 1x1 convolution then runs on each thread's block of the input as the product reads
   it, instead of as a serial pass over the whole input.
4. **Residual additions.** An Add or Sum of two tensors of the same shape, one of them the
   output of a Conv that nothing else reads and the other made before that Conv runs,
   becomes the Conv's ``residual`` input: each finished block of the convolution gets the
   other tensor's elements added while it is in cache (ResNet's shortcuts), and a following
   activation then fuses as usual. The sum is the same (one rounding either way).

Only float and double tensors are fused. A fused graph computes the same function with
different rounding: folding a chain into a Conv rounds the products ``W * m`` once, and a
composed chain rounds ``X * m + o`` once instead of after every node, so each output moves by
a few units in the last place of its terms (``W * X`` products, the per-channel parameters);
activations fuse exactly. ``RuntimeSession(..., fuse=False)`` runs the graph as written.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from ..kernels.base import Kernel
from ..kernels.conv import ConvKernel, Prologue
from ..kernels.elementwise import ElementwiseKernel
from ..kernels.normalization import BatchNormalization, ChannelAffine, batch_norm_affine

__all__ = ["FusionResult", "fuse"]

FUSED_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE)

Slots = tuple[int | None, ...]
Step = tuple[Kernel, Slots, Slots]


@dataclass
class FusionResult:
    """The fused steps, the constants they added (slot -> array) and the constant slots the
    fusion read (a run that overrides one of them must take the unfused plan). Every fused
    node is one step fewer."""

    steps: list[Step]
    constants: dict[int, np.ndarray]
    sources: set[int]


@dataclass(frozen=True)
class _Affine:
    """One node as ``Y = X * multiplier + offset`` per channel; ``constants`` its parameter slots."""

    x: int
    multiplier: np.ndarray
    offset: np.ndarray
    constants: tuple[int, ...]


def fuse(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
         shapes: Mapping[int, Sequence[int | str | None]],
         add_constant: Callable[[np.ndarray], int]) -> FusionResult:
    """Fuse ``steps`` (kernel, input slots, output slots, in graph order).

    ``known`` holds the constant values by slot, ``keep`` the slots that must stay observable
    (graph outputs), ``shapes`` the inferred shapes by slot, and ``add_constant`` stores a new
    constant and returns its slot.
    """
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    known = dict(known)  # and the constants fusion adds
    result: list[list] = []
    producer: dict[int, int] = {}
    added: dict[int, np.ndarray] = {}
    sources: set[int] = set()

    def private(slot: int) -> int | None:
        """The result index of the step whose only output ``slot`` is read by one step only."""
        index = producer.get(slot)
        if index is None or slot in keep or readers[slot] != 1:
            return None
        outputs = result[index][2]
        return index if len(outputs) == 1 and outputs[0] == slot else None

    def absorb(index: int, kernel: Kernel, inputs: Slots, outputs: Slots) -> None:
        result[index][0:3] = [kernel, inputs, outputs]
        for s in outputs:
            if s is not None:
                producer[s] = index

    for kernel, inputs, outputs in steps:
        affine = _affine(kernel, inputs, known, shapes)
        if affine is not None:
            index = private(affine.x)
            previous = result[index][0] if index is not None else None
            if isinstance(previous, ConvKernel) and previous.epilogue is None:
                folded = _fold_into_conv(result[index][1], known, affine, add_constant)
                if folded is not None:
                    conv_inputs, new_constants, used = folded
                    sources.update((s for s in used if s not in added), affine.constants)
                    added.update(new_constants)
                    known.update(new_constants)
                    absorb(index, previous, conv_inputs, outputs)
                    continue
            if isinstance(previous, ChannelAffine) and previous.epilogue is None:
                composed = ChannelAffine(previous.ctx, previous.multiplier * affine.multiplier,
                                         previous.offset * affine.multiplier + affine.offset
                                         ).bind(previous.pool)
                sources.update(affine.constants)
                absorb(index, composed, result[index][1], outputs)
                continue
            replacement = ChannelAffine(dataclasses.replace(kernel.ctx, op_type="ChannelAffine"),
                                        affine.multiplier, affine.offset).bind(kernel.pool)
            sources.update(affine.constants)
            kernel, inputs = replacement, (affine.x,)
        elif isinstance(kernel, ConvKernel) and len(inputs) > 1 and inputs[0] is not None:
            index = private(inputs[0])
            previous = result[index][0] if index is not None else None
            w = known.get(inputs[1])
            if (isinstance(previous, ChannelAffine) and kernel.prologue is None
                    and w is not None and kernel.accepts_prologue(w.shape)
                    and {previous.multiplier.size, previous.offset.size} <= {1, w.shape[1] * kernel.group}):
                kernel = kernel.variant(prologue=Prologue(previous.multiplier, previous.offset,
                                                          previous.epilogue))
                inputs = (result[index][1][0], *inputs[1:])
                result[index] = None  # the affine step runs inside the convolution now
        elif (isinstance(kernel, ElementwiseKernel) and kernel.ctx.op_type in ("Add", "Sum")
              and (fused := _residual(inputs, outputs, private, producer, result, shapes)) is not None):
            index, conv, conv_inputs = fused
            absorb(index, conv, conv_inputs, outputs)
            continue
        elif isinstance(kernel, ElementwiseKernel) and len(inputs) == 1 and inputs[0] is not None:
            index = private(inputs[0])
            if index is not None:
                previous = result[index][0]
                element_type = previous.ctx.output_types[0] if previous.ctx.output_types else None
                function = (kernel.in_place_function(element_type)
                            if previous.accepts_epilogue and previous.epilogue is None
                            and element_type in FUSED_TYPES else None)
                if function is not None:
                    with_epilogue = previous.variant(epilogue=function)  # the unfused plan keeps the original
                    absorb(index, with_epilogue, result[index][1], outputs)
                    continue
        result.append([kernel, inputs, outputs])
        for s in outputs:
            if s is not None:
                producer[s] = len(result) - 1
    steps_out: list[Step] = [(k, i, o) for k, i, o in filter(None, result)]
    return FusionResult(steps_out, added, sources)


def _residual(inputs: Slots, outputs: Slots, private: Callable[[int], int | None],
              producer: Mapping[int, int], result: list[list],
              shapes: Mapping[int, Sequence[int | str | None]]) -> tuple[int, Kernel, Slots] | None:
    """For ``a + b`` (same static shapes, float types): the result index of the Conv that
    makes one operand and reads nothing else into an epilogue, a copy of it that adds the
    other operand as its residual, and its new inputs; or None."""
    if len(inputs) != 2 or None in inputs or len(outputs) != 1 or inputs[0] == inputs[1]:
        return None
    shape = shapes.get(outputs[0])
    if (shape is None or not all(isinstance(d, int) for d in shape)
            or any(shapes.get(s) != shape for s in inputs)):
        return None
    for mine, other in (inputs, inputs[::-1]):
        index = private(mine)
        conv = result[index][0] if index is not None else None
        if (not isinstance(conv, ConvKernel) or conv.epilogue is not None or conv.residual
                or not conv.ctx.output_types or conv.ctx.output_types[0] not in FUSED_TYPES
                or producer.get(other, -1) > index):  # the other operand comes later
            continue
        fused = conv.variant(residual=True)  # the unfused plan keeps the original
        conv_inputs = result[index][1]
        bias = conv_inputs[2] if len(conv_inputs) > 2 else None
        return index, fused, (conv_inputs[0], conv_inputs[1], bias, other)
    return None


def _affine(kernel: Kernel, inputs: Slots, known: Mapping[int, np.ndarray],
            shapes: Mapping[int, Sequence[int | str | None]]) -> _Affine | None:
    """The node as a per-channel affine map of its one non-constant input, or None."""
    ctx = kernel.ctx
    if ctx.domain not in ("", "ai.onnx") or ctx.num_outputs != 1:
        return None
    if not ctx.output_types or ctx.output_types[0] not in FUSED_TYPES:
        return None
    if isinstance(kernel, BatchNormalization):
        parameters = [known.get(s) if s is not None else None for s in inputs[1:]]
        if (kernel.training or len(inputs) != 5 or inputs[0] is None or inputs[0] in known
                or any(p is None or p.ndim != 1 for p in parameters)):
            return None
        multiplier, offset = batch_norm_affine(*parameters, kernel.epsilon, np.float64)
        return _Affine(inputs[0], multiplier, offset, tuple(inputs[1:]))
    if ctx.op_type not in ("Mul", "Add", "Sub") or len(inputs) != 2 or None in inputs:
        return None
    variable = [i for i in (0, 1) if inputs[i] not in known]
    if len(variable) != 1:
        return None
    v = variable[0]
    x, c = inputs[v], known[inputs[1 - v]]
    per_channel = _per_channel(c, shapes.get(x))
    if per_channel is None:
        return None
    one, zero = np.ones(1), np.zeros(1)
    multiplier, offset = {
        "Mul": (per_channel, zero),
        "Add": (one, per_channel),
        "Sub": (one, -per_channel) if v == 0 else (-one, per_channel),
    }[ctx.op_type]
    return _Affine(x, multiplier, offset, (inputs[1 - v],))


def _per_channel(c: np.ndarray, x_shape: Sequence[int | str | None] | None) -> np.ndarray | None:
    """``c`` as float64 values along axis 1 of X (shape (1,) or (C,)), when broadcasting it
    against X leaves X's shape unchanged and varies along axis 1 only; else None."""
    if x_shape is None or c.dtype.kind != "f" or c.dtype.itemsize < 4:
        return None
    rank = len(x_shape)
    if rank < 2 or c.ndim > rank:
        return None
    padded = c.shape if c.ndim == rank else (1,) * (rank - c.ndim) + c.shape
    if any(extent != 1 for axis, extent in enumerate(padded) if axis != 1):
        return None
    if padded[1] != 1 and x_shape[1] != padded[1]:
        return None  # X's channel count is unknown or differs: the output could grow
    return c.astype(np.float64).reshape(-1)


def _fold_into_conv(conv_inputs: Slots, known: Mapping[int, np.ndarray], affine: _Affine,
                    add_constant: Callable[[np.ndarray], int]
                    ) -> tuple[Slots, dict[int, np.ndarray], tuple[int, ...]] | None:
    """The Conv's inputs with ``affine`` folded into new constant weights and bias."""
    if len(conv_inputs) < 2 or conv_inputs[1] not in known:
        return None
    w = known[conv_inputs[1]]
    b_slot = conv_inputs[2] if len(conv_inputs) > 2 else None
    if b_slot is not None and b_slot not in known:
        return None
    if w.dtype not in (np.float32, np.float64) or w.ndim < 3:
        return None
    filters = w.shape[0]
    if affine.multiplier.size not in (1, filters) or affine.offset.size not in (1, filters):
        return None
    multiplier = np.broadcast_to(affine.multiplier, (filters,))
    bias = np.zeros(filters) if b_slot is None else known[b_slot].astype(np.float64)
    new_w = (w.astype(np.float64) * multiplier.reshape((filters,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    new_b = (bias * multiplier + affine.offset).astype(w.dtype)
    constants = {}
    slots = []
    for array in (new_w, new_b):
        array.flags.writeable = False
        slot = add_constant(array)
        constants[slot] = array
        slots.append(slot)
    used = tuple(s for s in conv_inputs[1:3] if s is not None)
    return (conv_inputs[0], slots[0], slots[1]), constants, used
