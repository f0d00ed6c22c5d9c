"""The plan's value kinds at its edges: tensors, sequences and optionals, fed and handed over.

Inside a plan a tensor is an ndarray, a sequence a list of them and an optional its element
or None (``onnx_light.kernels.sequences``). A feed of a sequence or optional type is checked
element by element as a tensor feed is (:class:`ValueFeed`); what a run hands to its caller
is an array of its own, inside lists too (:func:`hand_over`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnx

from ..tuning.keys import element_type_name

__all__ = ["ValueFeed", "hand_over", "type_text"]


class _ElementFeed(Protocol):
    name: str
    slot: int

    def check(self, value: Any) -> Any: ...


def type_text(type_proto: onnx.TypeProto) -> str | None:
    """A value type as onnxruntime spells it (``seq(tensor(float))``); None if not known."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type" and type_proto.tensor_type.elem_type:
        return f"tensor({element_type_name(type_proto.tensor_type.elem_type)})"
    if kind in ("sequence_type", "optional_type"):
        inner = type_text(getattr(type_proto, kind).elem_type)
        return None if inner is None else f"{'seq' if kind == 'sequence_type' else 'optional'}({inner})"
    if kind == "map_type" and type_proto.map_type.key_type:
        inner = type_text(type_proto.map_type.value_type)
        key = element_type_name(type_proto.map_type.key_type)
        return None if inner is None else f"map({key},{inner})"
    return None


@dataclass(frozen=True)
class ValueFeed:
    """A graph input of a sequence or optional type: a list (or tuple) of tensors, or None
    or the element, each element checked by ``element`` (the tensor or sequence feed of the
    element type)."""

    kind: str  # "sequence_type" or "optional_type"
    element: _ElementFeed

    @property
    def name(self) -> str:
        return self.element.name

    @property
    def slot(self) -> int:
        return self.element.slot

    @property
    def spec(self) -> None:
        """No fixed shape and dtype: prepared steps never read a sequence or optional."""
        return None

    def check(self, value: Any) -> Any:
        if self.kind == "optional_type":
            return None if value is None else self.element.check(value)
        if not isinstance(value, (list, tuple)):
            from .feeds import InvalidInputError  # feeds imports this module

            raise InvalidInputError(
                f"input {self.name!r}: expected a sequence (a list of arrays), got {type(value).__name__}"
            )
        return [self.element.check(item) for item in value]


def hand_over(value: Any, copy: bool) -> Any:
    """An output as a caller gets it: an array (copied when ``copy`` says it may share memory,
    or when read-only), a list of such, a dict of its own (ZipMap's rows, whose values are
    Python scalars, as onnxruntime gives them), or None (an empty optional)."""
    if isinstance(value, list):
        return [hand_over(item, copy) for item in value]
    if isinstance(value, dict):
        return {key: hand_over(item, copy) for key, item in value.items()}
    if value is None or not isinstance(value, np.ndarray):
        return value
    return value.copy() if copy or not value.flags.writeable else value
