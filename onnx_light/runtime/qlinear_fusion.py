"""Quantized residual additions, at session construction (called by ``fusion.fuse`` last).

The pattern: a ``QLinearAdd`` (onnxruntime's contrib operator, which the QDQ rewrite also
makes of ``DQ -> Add -> Q``) one of whose operands is the output of a ``QLinearConv`` that
nothing else reads and that is no graph output, the other operand not of another shape by
the inferred shapes (no broadcasting). The two steps become one
:class:`~onnx_light.kernels.quantized_residual.QLinearConvAdd` step at the Add's place,
whose packed convolution adds the residual to each strip of requantized rows while they are
in cache: the fused graph's values are the unfused graph's, bit for bit (the kernel's module
says how). When both operands are such convolutions, the Add's first one is fused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from ..kernels.base import Kernel
from ..kernels.contrib.qlinear import QLinearAdd
from ..kernels.quantized_products import QLinearConv
from ..kernels.quantized_residual import CONV_INPUTS, QLinearConvAdd

__all__ = ["fuse_qlinear_add"]

Slots = tuple[int | None, ...]
Step = tuple[Kernel, Slots, Slots]
Shapes = Mapping[int, Sequence[int | str | None]]


def fuse_qlinear_add(steps: Sequence[Step], keep: set[int], shapes: Shapes) -> list[Step]:
    """``steps`` with every QLinearConv and QLinearAdd of the module's pattern made one step."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    producer = {s: i for i, (_, _, outputs) in enumerate(steps) for s in outputs if s is not None}
    result: list[Step | None] = list(steps)
    for place, (add, inputs, outputs) in enumerate(steps):
        if (type(add) is not QLinearAdd or len(inputs) < 7 or len(outputs) != 1
                or None in (inputs[0], inputs[3])):
            continue
        for position in (0, 3):
            y, other = inputs[position], inputs[3 - position]
            index = producer.get(y)
            if index is None or y in keep or readers[y] != 1 or y == other or result[index] is None:
                continue
            conv, conv_inputs, conv_outputs = steps[index]
            if (type(conv) is not QLinearConv or len(conv_outputs) != 1 or len(conv_inputs) > CONV_INPUTS
                    or _broadcasts(shapes.get(y), shapes.get(other))):
                continue
            add_inputs = tuple(None if i == position else s for i, s in enumerate(_padded(inputs, 8)))
            result[index] = None
            result[place] = (QLinearConvAdd.of(conv, add, position),
                             (*_padded(conv_inputs, CONV_INPUTS), *add_inputs), outputs)
            break
    return [step for step in result if step is not None]


def _broadcasts(first: Sequence[int | str | None] | None, second: Sequence[int | str | None] | None) -> bool:
    """Whether two inferred shapes may differ (the Add would broadcast): either unknown, or
    not the same dimensions (numbers or names)."""
    return first is None or second is None or tuple(first) != tuple(second)


def _padded(slots: Slots, count: int) -> Slots:
    """``slots`` with None for the absent optional inputs up to ``count``."""
    return (*slots, *(None,) * (count - len(slots)))
