"""RMSNorm written out in elementary nodes, at session construction (called by ``fusion.fuse``).

The pattern, as PyTorch exports LLaMA-style RMSNorm, every value float32::

    [X = Cast(x, to=FLOAT)]                  x float32 too
    P = Pow(X, 2)
    M = ReduceMean(P) over the last axis, keepdims=1 (axes as attribute or constant input)
    A = Add(M, eps)                          eps a one-element constant (either order)
    S = Sqrt(A)
    R = Div(1, S) | Reciprocal(S)
    Y = Mul(X, R)                            either order
    [Y = Cast(Y, to=FLOAT)]
    O = Mul(w, Y)                            w a constant of the last axis's length (either order)

becomes one ONNX RMSNormalization step (axis -1, ``epsilon`` = eps, float32 stash) on x and
w, whose float32 path is compiled (``feature_normalization.rms_norm_rows``). Every value
between X and O must be read by the pattern only and must not be a graph output (X itself may
have other readers; the first Cast is absorbed only when Pow and the Mul alone read X). The
step computes in float64 and rounds once where the graph rounds after each node: its output
is within a few float32 units of the graph's (tests/test_rmsnorm_fusion.py).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from onnx import TensorProto

from ..kernels.base import Kernel
from ..kernels.feature_normalization import RMSNormalization

__all__ = ["fuse_rms_norm"]

Slots = tuple[int | None, ...]
Step = tuple[Kernel, Slots, Slots]
Shapes = Mapping[int, Sequence[int | str | None]]
_FLOAT = (TensorProto.FLOAT,)


def fuse_rms_norm(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
                  shapes: Shapes, sources: set[int]) -> list[Step]:
    """``steps`` with every instance of the module's pattern made one RMSNormalization step
    (``sources`` gets the constants the steps hold)."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    producer = {s: i for i, (_, _, outputs) in enumerate(steps) for s in outputs if s is not None}
    result: list[Step | None] = list(steps)
    for position, (kernel, _, _) in enumerate(steps):
        if kernel.ctx.op_type != "ReduceMean":
            continue
        match = _match(position, steps, known, keep, shapes, readers, producer)
        if match is not None and all(result[i] is not None for i in match[0]):
            positions, step, constants = match
            for i in positions[:-1]:
                result[i] = None
            result[positions[-1]] = step
            sources.update(constants)
    return [step for step in result if step is not None]


def _constant(known: Mapping[int, np.ndarray], slot: int | None) -> float | None:
    value = known.get(slot) if slot is not None else None
    if value is None or value.size != 1 or value.dtype != np.float32:
        return None
    return float(value.reshape(-1)[0])


def _match(position: int, steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
           shapes: Shapes, readers: Counter, producer: Mapping[int, int]
           ) -> tuple[list[int], Step, list[int]] | None:
    """The pattern around the ReduceMean at ``position``: the fused nodes' places (the last
    one's place takes the step), the step and the constant slots it read; or None."""

    def single(slot: int | None) -> tuple[int, Kernel, Slots, Slots] | None:
        """The one step reading ``slot`` (read once, not kept, float32 output)."""
        if slot is None or slot in keep or readers[slot] != 1:
            return None
        found = [i for i, (_, inputs, _) in enumerate(steps) if slot in inputs]
        if len(found) != 1:
            return None
        kernel, inputs, outputs = steps[found[0]]
        if len(outputs) != 1 or kernel.ctx.output_types[:1] != _FLOAT:
            return None
        return found[0], kernel, inputs, outputs

    def other(inputs: Slots, slot: int) -> int | None:
        return inputs[1] if len(inputs) == 2 and inputs[0] == slot else (
            inputs[0] if len(inputs) == 2 and inputs[1] == slot else None)

    mean, mean_inputs, (m,) = steps[position][0], steps[position][1], steps[position][2]
    p = mean_inputs[0]
    rank = len(shapes.get(p) or ())
    axes = mean.ctx.attribute("axes")
    if axes is None and len(mean_inputs) > 1:
        axes = known.get(mean_inputs[1])
    axes = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    if (rank < 1 or axes is None or len(axes) != 1 or axes[0] % rank != rank - 1
            or not mean.ctx.attribute("keepdims", 1) or mean.ctx.output_types[:1] != _FLOAT):
        return None
    pow_index = producer.get(p)
    if pow_index is None or p in keep or readers[p] != 1:
        return None
    pow_kernel, (x, exponent), _ = steps[pow_index]
    if pow_kernel.ctx.op_type != "Pow" or _constant(known, exponent) != 2.0:
        return None
    positions, constants = [pow_index, position], [exponent]
    add = single(m)
    if add is None or add[1].ctx.op_type != "Add" or _constant(known, other(add[2], m)) is None:
        return None
    epsilon_slot = other(add[2], m)
    epsilon = _constant(known, epsilon_slot)
    sqrt = single(add[3][0])
    if sqrt is None or sqrt[1].ctx.op_type != "Sqrt":
        return None
    inverse = single(sqrt[3][0])
    if inverse is None or not (inverse[1].ctx.op_type == "Reciprocal" or (
            inverse[1].ctx.op_type == "Div" and inverse[2][1] == sqrt[3][0]
            and _constant(known, inverse[2][0]) == 1.0)):
        return None
    product = single(inverse[3][0])
    if product is None or product[1].ctx.op_type != "Mul" or other(product[2], inverse[3][0]) != x:
        return None
    positions += [add[0], sqrt[0], inverse[0], product[0]]
    constants += [epsilon_slot] + ([inverse[2][0]] if inverse[1].ctx.op_type == "Div" else [])
    y = product[3][0]
    scaled = single(y)
    if (scaled is not None and scaled[1].ctx.op_type == "Cast"
            and getattr(scaled[1], "to", None) == TensorProto.FLOAT):
        positions.append(scaled[0])
        y = scaled[3][0]
        scaled = single(y)
    if scaled is None or scaled[1].ctx.op_type != "Mul":
        return None
    weight_slot = other(scaled[2], y)
    weight = known.get(weight_slot) if weight_slot is not None else None
    length = (shapes.get(p) or ())[-1]
    if (weight is None or weight.dtype != np.float32 or not isinstance(length, int)
            or weight.size != length or weight.shape[-1:] != (length,)):
        return None
    positions.append(scaled[0])
    source = x
    cast = producer.get(x)
    if (cast is not None and steps[cast][0].ctx.op_type == "Cast" and x not in keep
            and readers[x] == 2  # X read by Pow and the Mul only: the Cast goes too
            and getattr(steps[cast][0], "to", None) == TensorProto.FLOAT
            and steps[cast][0].ctx.input_types[:1] == _FLOAT):
        positions.append(cast)
        source = steps[cast][1][0]
    last = scaled[1]
    ctx = dataclasses.replace(last.ctx, op_type="RMSNormalization", opset=23, num_inputs=2,
                              attributes={"axis": -1, "epsilon": epsilon},
                              input_types=(TensorProto.FLOAT,) * 2, omitted_inputs=frozenset())
    kernel = RMSNormalization(ctx).bind(last.pool)
    return sorted(positions), (kernel, (source, weight_slot), scaled[3]), constants
