"""Squeeze-and-excitation gates as one step, at session construction (called by ``fusion.fuse``
after its other rewrites, when the activations are already the convolutions' epilogues).

The pattern: ``g = GlobalAveragePool(x)`` (float32 or float64, X of rank 3 or more with a known
channel count), read by one 1x1 ``Conv`` only (group 1, stride 1, no padding, constant weights
and bias, no residual, prologue or channel scale), whose output another such Conv alone reads;
neither ``g`` nor the first Conv's output is a graph output, and each Conv's fused activation
is one its compiled finishing applies (none, a clamp such as Relu, or a compiled activation:
Sigmoid, SiLU, HardSigmoid, HardSwish). The three steps become one
:class:`~onnx_light.kernels.squeeze_excite.SqueezeExcite` step at the place of the second
Conv, computing the gate with the calls the unfused steps make (the means, then the two
matrix-vector products each finished alike): the fused graph's values are the unfused
graph's, bit for bit, where its Convs take ``direct_1x1`` (``algorithm`` ``auto``, the
default); a Conv tuned to another algorithm rounds its sums in another order.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from ..kernels.base import Kernel
from ..kernels.conv import ConvKernel
from ..kernels.conv.finish import FINISHED_TYPES, Finish, fused_parts
from ..kernels.conv.pointwise import vector_weights
from ..kernels.pooling import GlobalAveragePool
from ..kernels.squeeze_excite import SqueezeExcite, SqueezeLayer

__all__ = ["fuse_squeeze_excite"]

Slots = tuple[int | None, ...]
Step = tuple[Kernel, Slots, Slots]
Shapes = Mapping[int, Sequence[int | str | None]]


def fuse_squeeze_excite(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
                        shapes: Shapes, sources: set[int]) -> list[Step]:
    """``steps`` with every gate of the module's pattern made one step (``sources`` gets the
    weights and biases it read)."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    reader_of = {s: i for i, (_, inputs, _) in enumerate(steps) for s in inputs if s is not None}
    result: list[Step | None] = list(steps)
    for position, (pool, inputs, outputs) in enumerate(steps):
        if type(pool) is not GlobalAveragePool or len(inputs) != 1 or len(outputs) != 1:
            continue
        x_shape = shapes.get(inputs[0])
        chain, slot, layers = [position], outputs[0], []
        while len(layers) < 2 and slot is not None and slot not in keep and readers[slot] == 1:
            index = reader_of[slot]
            layer = _layer(*steps[index], slot, known, x_shape if not layers else None,
                           layers[-1][0] if layers else None)
            if layer is None:
                break
            chain.append(index)
            layers.append(layer)
            slot = steps[index][2][0]
        if len(layers) < 2:
            continue
        (first, first_used), (second, second_used) = layers
        ctx = dataclasses.replace(pool.ctx, op_type=SqueezeExcite.op_type)
        kernel = SqueezeExcite(ctx, first, second).bind(pool.pool)
        for index in chain[:-1]:
            result[index] = None
        result[chain[-1]] = (kernel, inputs, steps[chain[-1]][2])
        sources.update(first_used, second_used)
    return [step for step in result if step is not None]


def _layer(kernel: Kernel, inputs: Slots, outputs: Slots, slot: int, known: Mapping[int, np.ndarray],
           x_shape: Sequence[int | str | None] | None, previous: SqueezeLayer | None
           ) -> tuple[SqueezeLayer, tuple[int, ...]] | None:
    """The Conv step reading ``slot`` as a layer of the gate (the first: X of ``x_shape``; the
    second: reading ``previous``'s output) and the constant slots it read, or None."""
    if (type(kernel) is not ConvKernel or len(inputs) not in (2, 3) or inputs[0] != slot
            or len(outputs) != 1 or outputs[0] is None or kernel.group != 1
            or kernel.residual or kernel.channel_scale or kernel.prologue is not None):
        return None
    w = known.get(inputs[1])
    b_slot = inputs[2] if len(inputs) > 2 else None
    b = None if b_slot is None else known.get(b_slot)
    if (w is None or w.dtype not in FINISHED_TYPES or w.ndim < 3 or min(w.shape) < 1
            or not kernel.accepts_prologue(w.shape) or (b_slot is not None and b is None)
            or (b is not None and (b.shape != (w.shape[0],) or b.dtype != w.dtype))):
        return None
    if previous is None:
        if (x_shape is None or len(x_shape) != w.ndim or x_shape[1] != w.shape[1]
                or kernel.ctx.input_dtype(0) != w.dtype):
            return None
    elif previous.filters != w.shape[1] or previous.weights.dtype != w.dtype:
        return None
    _, clamp, activation, after = fused_parts(
        Finish(np.empty(0, w.dtype), None, kernel.epilogue, kernel.clamp), w.dtype)
    if after is not None:  # an activation the compiled finishing does not apply
        return None
    bias = np.empty(0, w.dtype) if b is None else np.ascontiguousarray(b)
    bias.flags.writeable = False
    layer = SqueezeLayer(vector_weights(w), bias, w.shape[0], w.shape[1], clamp, activation)
    return layer, tuple(s for s in inputs[1:] if s is not None)
