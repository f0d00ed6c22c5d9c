"""The feeds a run takes and the graph's inputs and outputs as a caller sees them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ..kernels.base import TensorSpec, numpy_dtype
from ..tuning.keys import element_type_name
from .loading import tensor_element_type, tensor_shape
from .values import ValueFeed
from .values import type_text as value_type_text

__all__ = ["Feed", "InvalidInputError", "NodeArg", "node_arg"]

class InvalidInputError(ValueError):
    """Feeds that do not fit the model: unknown or missing names, wrong type, rank or shape."""


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output: name, ``tensor(<type>)`` and shape (ints, names or None)."""

    name: str
    type: str
    shape: list[int | str | None] | None


# The element kinds a Python feed (list, tuple, scalar) may take, by the kind numpy reads it as.
_PYTHON_TARGET_KINDS = {"b": "biuf", "i": "iuf", "f": "f"}


@dataclass(frozen=True)
class Feed:
    """One graph input as a run takes it: its slot and what its declared type asks for,
    read from the model once; ``contiguous``: the run hands the plan a C-contiguous array
    (a copy of a feed that is not), as prepared steps reading it require."""

    name: str
    slot: int
    type_text: str | None  # tensor(<type>); None: not declared
    dtype: np.dtype | None
    rank: int | None
    dimensions: tuple[tuple[int, int], ...]  # (axis, size) of the fixed dimensions
    shape: list[int | str | None] | None
    contiguous: bool = False

    @property
    def spec(self) -> TensorSpec | None:
        """The feed's shape and dtype when :meth:`check` fixes both for every run (a tensor
        type with every dimension a positive size), else None."""
        shape, dtype = self.shape, self.dtype
        if (shape is None or dtype is None or dtype.kind == "O"
                or not all(isinstance(d, int) and d > 0 for d in shape)):
            return None
        return tuple(shape), dtype

    @classmethod
    def of(cls, info: onnx.ValueInfoProto, slot: int) -> Feed | ValueFeed:
        kind = info.type.WhichOneof("value")
        if kind in ("sequence_type", "optional_type"):
            element = onnx.ValueInfoProto(name=info.name, type=getattr(info.type, kind).elem_type)
            return ValueFeed(kind, cls.of(element, slot))
        element_type = tensor_element_type(info.type)
        shape = tensor_shape(info.type)
        return cls(info.name, slot,
                   None if element_type is None else f"tensor({element_type_name(element_type)})",
                   None if element_type is None else numpy_dtype(element_type),
                   None if shape is None else len(shape),
                   () if shape is None else tuple((axis, size) for axis, size in enumerate(shape)
                                                  if isinstance(size, int) and size > 0),
                   shape)

    def check(self, value: Any) -> np.ndarray:
        """The feed as the plan sees it: a read-only ndarray (so no run can write the
        caller's data, and views of it are read-only too) of the input's type and shape.

        An ndarray subclass gives its data as a plain ndarray (a masked array its data, as
        onnxruntime takes it; np.matrix its 2-d array); an array in the other byte order its
        values in the native one; Python lists, tuples and scalars the input's element type
        when that keeps their values' kind (bools and ints to ints or floats, within range;
        floats to floats, not to ints). Arrays and numpy scalars must have the element type
        exactly."""
        try:
            array = value if type(value) is np.ndarray else np.asarray(value)
        except (ValueError, TypeError) as exc:  # ragged nested lists, say
            raise InvalidInputError(f"input {self.name!r}: not an array: {exc}") from None
        expected = self.dtype
        if (expected is not None and array.dtype != expected
                and not (expected.kind == "O" and array.dtype.kind in "OU")):
            array = self._converted(value, array, expected)
        if self.rank is not None:
            if array.ndim != self.rank:
                raise InvalidInputError(f"input {self.name!r}: expected rank {self.rank} "
                                        f"(shape {self.shape}), got rank {array.ndim} {array.shape}")
            for axis, size in self.dimensions:
                if array.shape[axis] != size:
                    raise InvalidInputError(f"input {self.name!r}: dimension {axis} must be "
                                            f"{size}, got shape {array.shape}")
        if self.contiguous and not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        if array.flags.writeable:
            array = array.view()
            array.flags.writeable = False
        return array

    def _converted(self, value: Any, array: np.ndarray, expected: np.dtype) -> np.ndarray:
        """A feed of another dtype in the input's type, or an error naming the input."""
        if array.dtype.newbyteorder("=") == expected:
            return array.astype(expected)
        python = not isinstance(value, (np.ndarray, np.generic))
        if python and expected.kind in _PYTHON_TARGET_KINDS.get(array.dtype.kind, ""):
            try:
                return np.asarray(value, dtype=expected)
            except OverflowError as exc:  # an int out of the type's range
                raise InvalidInputError(f"input {self.name!r}: {exc}") from None
        raise InvalidInputError(f"input {self.name!r}: expected element type {self.type_text} "
                                f"({expected}), got {array.dtype}")


def node_arg(info: onnx.ValueInfoProto) -> NodeArg:
    """A graph input or output as ``get_inputs``/``get_outputs`` describe it."""
    element_type = tensor_element_type(info.type)
    type_text = (f"tensor({element_type_name(element_type)})" if element_type
                 else value_type_text(info.type) or "unknown")
    return NodeArg(info.name, type_text, tensor_shape(info.type))
