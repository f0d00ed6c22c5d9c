"""Elementwise kernels: one machinery for unary and binary ops, serial and parallel paths.

Each tunable elementwise kernel has one parameter, ``parallel.minimum_elements``:
below it the kernel makes one numpy call on the calling thread; at or above it
the output is split into contiguous blocks computed on the intra-op pool.
"""

from __future__ import annotations

from onnx import TensorProto

from ..tuning.keys import KernelTuningKey
from ..tuning.schema import KernelTuningSchema, Parameter
from .base import LIBRARY, NUMERIC_TYPES

__all__ = ["ELEMENTWISE_TYPES", "MINIMUM_ELEMENTS", "tuning_schemas"]

MINIMUM_ELEMENTS = "parallel.minimum_elements"
# A first estimate; benchmarks/elementwise_crossover.py measures the real crossover.
DEFAULT_MINIMUM_ELEMENTS = 1 << 16

ELEMENTWISE_TYPES: dict[str, tuple[int, ...]] = {
    "Abs": NUMERIC_TYPES,
    "Add": NUMERIC_TYPES,
    "Not": (TensorProto.BOOL,),
}


def elementwise_parameters(default: int = DEFAULT_MINIMUM_ELEMENTS) -> tuple[Parameter, ...]:
    """The schema parameters shared by every elementwise kernel."""
    return (
        Parameter(MINIMUM_ELEMENTS, "int", default, minimum=1,
                  description="output elements from which the parallel path is used"),
    )


def tuning_schemas() -> list[KernelTuningSchema]:
    """One schema per elementwise op and element type."""
    return [
        KernelTuningSchema(KernelTuningKey(LIBRARY, op, "portable", element_type),
                           elementwise_parameters())
        for op, types in ELEMENTWISE_TYPES.items()
        for element_type in types
    ]
