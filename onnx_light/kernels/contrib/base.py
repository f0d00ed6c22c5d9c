"""What the ``com.microsoft`` kernels share: their domain, version and declaration, and the
rule that gives their outputs' types.

onnxruntime defines these operators (docs/ContribOperators.md in its repository); each is at
version 1 and the installed onnx has no schema for it, so onnx's shape inference stops at such
a node. :meth:`ContribKernel.output_types` tells the runtime the element type (and shape, where
it is plain) of each output from its inputs' (``runtime/contrib_types.py``), so that the
nodes after it are typed and inferred as usual.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ...parallel import ThreadPool
from ...tuning.keys import ElementType as T
from ...tuning.schema import KernelTuningSchema, Value
from .. import base
from ..declaration import KernelDeclaration, declare

__all__ = ["DOMAIN", "FLOATS", "ContribKernel", "Shape", "ValueType", "broadcast_shape", "declare_contrib",
           "onnx_kernel"]

#: The ONNX domain of these kernels.
DOMAIN = "com.microsoft"
#: The float types the float operators take, as onnxruntime's CPU kernels do (float16 is
#: computed in float32 and rounded once).
FLOATS = (T.FLOAT, T.FLOAT16)
#: A tensor's dimensions (sizes, names or None), None where its rank is unknown.
Shape = tuple[int | str | None, ...] | None
#: A value's element type and shape; None where its type is unknown.
ValueType = tuple[int, Shape] | None


def broadcast_shape(*shapes: Shape) -> Shape:
    """The multidirectional broadcast of several shapes when all their sizes are known, else None."""
    known = [s for s in shapes if s is not None]
    if len(known) != len(shapes) or any(not isinstance(d, int) for s in known for d in s):
        return None
    try:
        return tuple(np.broadcast_shapes(*known))  # type: ignore[arg-type]
    except ValueError:
        return None


def onnx_kernel(ctx: base.NodeContext, kernel: type[base.Kernel], opset: int,
                attributes: Mapping[str, Any], input_types: Sequence[int | None],
                num_outputs: int = 1) -> base.Kernel:
    """The default domain's ``kernel`` (at ``opset``) for a contrib node to compute with,
    built from the node's context with the ONNX operator's attributes and input types."""
    return kernel(dataclasses.replace(
        ctx, op_type=kernel.op_type, domain="", opset=opset, attributes=dict(attributes),
        input_types=tuple(input_types), output_types=(None,) * num_outputs,
        num_inputs=len(input_types), num_outputs=num_outputs, omitted_inputs=frozenset()))


class ContribKernel(base.Kernel):
    """A ``com.microsoft`` kernel: ``output_types`` gives its outputs' types; the ONNX
    kernels it holds (:func:`onnx_kernel`) share its thread pool, and the one named by
    ``tuned_as`` (set before this class's ``__init__`` runs) gives the node its tuning key and
    takes the values the session resolves for it."""

    tuned_as: ClassVar[str | None] = None

    def tuning_schema(self) -> KernelTuningSchema | None:
        """The schema of the ONNX kernel the node is tuned as (``tuned_as``), or None."""
        return None if self.tuned_as is None else getattr(self, self.tuned_as).tuning_schema()

    def _configure(self, values: Mapping[str, Value]) -> None:
        if self.tuned_as is not None:
            getattr(self, self.tuned_as)._configure(values)

    def bind(self, pool: ThreadPool | None) -> ContribKernel:
        for value in vars(self).values():
            if isinstance(value, base.Kernel):
                value.bind(pool)
        return super().bind(pool)

    @classmethod
    def output_types(cls, inputs: Sequence[ValueType], attributes: Mapping[str, Any],
                     num_outputs: int) -> list[ValueType]:
        """The outputs' types from the inputs' (None where unknown) and the node's attributes:
        unknown while the first input's type is, else :meth:`typed_outputs`'s."""
        first = inputs[0] if inputs else None
        if first is None:
            return [None] * num_outputs
        return cls.typed_outputs(first, attributes, num_outputs)

    @classmethod
    def typed_outputs(cls, first: ValueType, attributes: Mapping[str, Any],
                      num_outputs: int) -> list[ValueType]:
        """The outputs' types given the first input's (``first``): by default the first output
        is typed as it, the others have its element type and an unknown shape."""
        return [first] + [(first[0], None)] * (num_outputs - 1)


def declare_contrib(kernel: type[ContribKernel], types: tuple[int, ...] | None = None
                    ) -> KernelDeclaration:
    """``kernel``'s declaration: version 1 of the ``com.microsoft`` domain, for ``types``
    (None: the kernel checks them)."""
    return declare(kernel, [1], types=types, domain=DOMAIN)
