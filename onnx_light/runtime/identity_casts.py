"""Casts to the type their input already has, dropped at session construction (called first by
``fusion.fuse``).

Such a Cast returns its input as it is (``structural.Cast.run``), yet costs a step of the plan
each run: LLaMA's exported RMSNorm starts with ``Cast(x, to=FLOAT)`` of a float32 ``x`` that the
residual Add reads too, so the RMSNorm fusion cannot absorb it (eight steps in the model zoo's
LLaMA). The readers of its output read its input instead. A Cast whose output is a graph
output stays (the hand-off copies it, as it copies any view of a feed or of another output),
and so does one to or from a string, whose ``run`` makes new objects.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnx import TensorProto

from ..kernels.base import Kernel

__all__ = ["drop_identity_casts"]

Slots = tuple[int | None, ...]
Step = tuple[Kernel, Slots, Slots]


def _identity(kernel: Kernel, inputs: Slots, outputs: Slots, keep: set[int]) -> bool:
    """Whether the step is a Cast of a tensor to its own (known, not string) type whose output
    the caller does not receive."""
    if kernel.ctx.op_type != "Cast" or len(inputs) != 1 or inputs[0] is None or outputs[0] in keep:
        return False
    to = getattr(kernel, "to", None)
    return (to not in (None, TensorProto.UNDEFINED, TensorProto.STRING)
            and tuple(kernel.ctx.input_types[:1]) == (to,))


def drop_identity_casts(steps: Sequence[Step], keep: set[int]) -> list[Step]:
    """``steps`` without their identity Casts (``keep``: the graph outputs' slots), each reader
    of a dropped Cast's output reading the Cast's input."""
    source: dict[int, int] = {}
    result: list[Step] = []
    for kernel, inputs, outputs in steps:
        inputs = tuple(source.get(s, s) if s is not None else None for s in inputs)
        if _identity(kernel, inputs, outputs, keep):
            source[outputs[0]] = inputs[0]
        else:
            result.append((kernel, inputs, outputs))
    return result
