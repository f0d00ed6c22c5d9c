"""What an elementwise op is, as data: its arity, its attributes and the row that describes it.

:mod:`.elementwise` holds the table of rows and the machinery that runs them;
:mod:`.activations` and :mod:`.bitwise` add rows of their own on the same machinery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .base import NodeContext

__all__ = ["BINARY", "TERNARY", "UNARY", "UNARY_WITH_BOUNDS", "VARIADIC", "Arity", "Attribute",
           "ElementwiseOp", "Precision", "Warns"]

Precision = Literal["native", "float32", "float64"]
Warns = Literal["never", "float", "always"]


@dataclass(frozen=True)
class Arity:
    """How many inputs an op takes (``maximum`` None: any number from ``minimum`` on).

    With ``optional`` the inputs after the first ``minimum`` may be omitted (None).
    """

    name: str
    minimum: int
    maximum: int | None
    optional: bool = False


UNARY = Arity("unary", 1, 1)
BINARY = Arity("binary", 2, 2)
TERNARY = Arity("ternary", 3, 3)
VARIADIC = Arity("variadic", 1, None)
# Clip: the input, then optional scalar min and max (attributes before opset 11).
UNARY_WITH_BOUNDS = Arity("unary with optional bounds", 1, 3, optional=True)


@dataclass(frozen=True)
class Attribute:
    """An ONNX attribute an op reads once when the kernel is built, with ONNX's default.

    Float attributes are float32 in ONNX and are rounded to float32 here too; ``before``
    limits the attribute to opsets below it (Clip's min and max became inputs at 11).
    """

    name: str
    default: float | int | str
    choices: tuple[int | str, ...] | None = None
    before: int | None = None

    def read(self, ctx: NodeContext) -> float | int | str:
        """The node's value (or the default), typed like the default and checked."""
        value = ctx.attribute(self.name, self.default)
        try:
            if isinstance(self.default, float):
                value = float(np.float32(value))
            elif isinstance(self.default, int):
                value = int(value)
            else:
                value = value.decode() if isinstance(value, bytes) else str(value)
        except (TypeError, ValueError):
            raise ctx.error(f"attribute {self.name!r} must be a {type(self.default).__name__}, "
                            f"got {value!r}") from None
        if self.choices is not None and value not in self.choices:
            raise ctx.error(f"attribute {self.name!r} must be one of {list(self.choices)}, "
                            f"got {value!r}")
        return value


@dataclass(frozen=True)
class ElementwiseOp:
    """One elementwise op: everything that differs between ops, as data.

    * ``types``: the element types ONNX allows for the op's type parameter (the input at
      ``key_input``: the base for Pow, X for Where); they name the tuning schemas.
    * ``output``: ``"same"`` as the key input, or ``"bool"``.
    * ``compute(*blocks, out=block, **attributes)`` writes the result into ``out``; an
      omitted optional input is passed as None.
    * ``precision``: float16, bfloat16 and float8 inputs are cast to float32 (``"float32"``),
      and with ``"float64"`` float32 too is cast to float64, before ``compute``; the result is
      rounded once into the output. ``"native"`` computes in the input type (single ufuncs,
      whose half-precision loops already compute in float32 and round once).
    * ``warns``: whether numpy may emit floating point warnings (overflow, invalid, divide)
      that ONNX semantics ignore: ``"float"`` for floating types only, ``"always"`` also for
      integers (division by zero). ml_dtypes types warn on NaN comparisons, so their blocks
      always run under ``np.errstate(all="ignore")``.
    * ``cost``: ``"cheap"`` (a few passes of arithmetic or selection: memory-bound) or
      ``"transcendental"``; selects the portable default of ``parallel.minimum_elements``
      (see :func:`default_minimum_elements`).
    * ``versions``: ONNX's since_versions of the op that this kernel implements.
    * ``in_place``: ``compute(x, out=x)`` is correct (each element is read before it is
      written): the runtime may fuse the op into the node that produces ``x``.
    """

    op_type: str
    arity: Arity
    types: tuple[int, ...]
    compute: Callable[..., Any]
    versions: tuple[int, ...]
    output: Literal["same", "bool"] = "same"
    attributes: tuple[Attribute, ...] = ()
    precision: Precision = "native"
    warns: Warns = "float"
    cost: Literal["cheap", "transcendental"] = "cheap"
    key_input: int = 0
    in_place: bool = False
