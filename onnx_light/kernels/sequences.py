"""Sequences and optionals: the plan's two value kinds besides tensors.

A sequence value is a Python ``list`` of arrays (never changed once made: every operator
here returns a new list), an optional value is its element (a tensor or a sequence) or
``None`` when empty. The kernels keep the arrays they are given (a sequence holds its
inputs, SequenceAt returns one of its elements), so :meth:`~Kernel.views` says which
inputs an output may hold and the runtime copies what it hands to a caller. None is
tunable; the element types are checked by the ONNX checker that every session runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Kernel, NodeContext, normalize_axis
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS"]

Values = list[Any]


def _position(ctx: NodeContext, position: np.ndarray | None, length: int, default: int,
              insert: bool = False) -> int:
    """A position input as an index into a sequence of ``length`` elements (``default`` when
    omitted); ``insert`` allows one past the end. Out of range is the node's error."""
    if position is None:
        return default
    if np.size(position) != 1:
        raise ctx.error(f"position must hold one value, got shape {list(np.shape(position))}")
    value = int(np.asarray(position).reshape(-1)[0])
    stop = length + 1 if insert else length
    if not -length <= value < stop:
        raise ctx.error(f"position {value} is out of range for a sequence of {length} "
                        f"element(s) (valid: {-length} to {stop - 1})")
    return value + length if value < 0 else value


def _sequence(ctx: NodeContext, value: Any, what: str = "input") -> list[Any]:
    if not isinstance(value, list):
        raise ctx.error(f"{what} must be a sequence, got {type(value).__name__}")
    return value


class _Holding(Kernel):
    """A kernel whose output may hold (or be) its inputs themselves."""

    def views(self) -> Sequence[Sequence[int]]:
        return (tuple(range(self.ctx.num_inputs)),) * max(1, self.ctx.num_outputs)


class SequenceEmpty(Kernel):
    op_type = "SequenceEmpty"

    def run(self) -> Values:
        return [[]]


class SequenceConstruct(_Holding):
    op_type = "SequenceConstruct"

    def run(self, *tensors: np.ndarray) -> Values:
        return [list(tensors)]


class SequenceAt(_Holding):
    op_type = "SequenceAt"

    def run(self, sequence: list[Any], position: np.ndarray) -> Values:
        sequence = _sequence(self.ctx, sequence)
        if not sequence:
            raise self.ctx.error("the sequence is empty")
        return [sequence[_position(self.ctx, position, len(sequence), 0)]]


class SequenceErase(_Holding):
    op_type = "SequenceErase"

    def run(self, sequence: list[Any], position: np.ndarray | None = None) -> Values:
        sequence = _sequence(self.ctx, sequence)
        if not sequence:
            raise self.ctx.error("cannot erase from an empty sequence")
        index = _position(self.ctx, position, len(sequence), len(sequence) - 1)
        return [sequence[:index] + sequence[index + 1:]]


class SequenceInsert(_Holding):
    op_type = "SequenceInsert"

    def run(self, sequence: list[Any], tensor: np.ndarray,
            position: np.ndarray | None = None) -> Values:
        sequence = _sequence(self.ctx, sequence)
        index = _position(self.ctx, position, len(sequence), len(sequence), insert=True)
        return [[*sequence[:index], tensor, *sequence[index:]]]


class SequenceLength(Kernel):
    op_type = "SequenceLength"

    def run(self, sequence: list[Any]) -> Values:
        return [np.array(len(_sequence(self.ctx, sequence)), dtype=np.int64)]


class SplitToSequence(_Holding):
    """``split`` omitted: pieces of one along ``axis`` (squeezed unless ``keepdims``); a
    scalar: pieces of that length (the last one shorter); a 1-d tensor: those lengths."""

    op_type = "SplitToSequence"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = int(ctx.attribute("axis", 0))
        self.keepdims = bool(ctx.attribute("keepdims", 1))

    def run(self, x: np.ndarray, split: np.ndarray | None = None) -> Values:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        size = x.shape[axis]
        if split is None:
            pieces = [np.take(x, [i], axis=axis) for i in range(size)]
            return [pieces if self.keepdims else [np.squeeze(p, axis) for p in pieces]]
        lengths = [int(v) for v in np.asarray(split).reshape(-1)]
        if np.ndim(split) == 0:
            if lengths[0] <= 0:
                raise self.ctx.error(f"split must be positive, got {lengths[0]}")
            lengths = [lengths[0]] * (size // lengths[0]) + ([size % lengths[0]]
                                                             if size % lengths[0] else [])
        elif any(n < 0 for n in lengths) or sum(lengths) != size:
            raise self.ctx.error(f"split {lengths} must be non-negative lengths adding up to "
                                 f"dimension {axis}'s {size}")
        bounds = np.cumsum(lengths)[:-1]
        return [list(np.split(x, bounds, axis=axis))]


class ConcatFromSequence(Kernel):
    """Concatenate the sequence's tensors along ``axis``, or stack them on a new axis."""

    op_type = "ConcatFromSequence"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = ctx.attribute("axis")
        if self.axis is None:
            raise ctx.error("attribute 'axis' is required")
        self.new_axis = bool(ctx.attribute("new_axis", 0))

    def run(self, sequence: list[Any]) -> Values:
        tensors = _sequence(self.ctx, sequence)
        if not tensors:
            raise self.ctx.error("the sequence is empty: nothing to concatenate")
        rank = tensors[0].ndim + self.new_axis
        axis = normalize_axis(self.ctx, int(self.axis), rank)
        try:
            joined = np.stack(tensors, axis) if self.new_axis else np.concatenate(tensors, axis)
        except ValueError as exc:
            raise self.ctx.error(f"the sequence's tensors do not fit together: {exc}") from None
        return [joined]


class Optional(_Holding):
    """An optional holding the input, or an empty one (None) when the input is omitted."""

    op_type = "Optional"

    def run(self, value: Any = None) -> Values:
        return [value]


class OptionalHasElement(Kernel):
    op_type = "OptionalHasElement"

    def run(self, value: Any = None) -> Values:
        return [np.array(value is not None)]


class OptionalGetElement(_Holding):
    """The optional's element (from opset 18 a tensor or sequence is taken as it is)."""

    op_type = "OptionalGetElement"

    def run(self, value: Any) -> Values:
        if value is None:
            raise self.ctx.error("the optional is empty")
        return [value]


# One class serves every since-version: later versions only take more element types.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(SequenceEmpty, (11,)),
    declare(SequenceConstruct, (11,)),
    declare(SequenceAt, (11,)),
    declare(SequenceErase, (11,)),
    declare(SequenceInsert, (11,)),
    declare(SequenceLength, (11,)),
    declare(SplitToSequence, (11, 24)),
    declare(ConcatFromSequence, (11,)),
    declare(Optional, (15, 28)),
    declare(OptionalHasElement, (15, 18, 28)),
    declare(OptionalGetElement, (15, 18, 28)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
