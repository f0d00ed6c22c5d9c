"""The onnx_light kernel library: its tuning schemas, profiles and the dispatch table.

:func:`register` hands everything tunable to a registry of the tuning core in
one all-or-nothing batch.
"""

from __future__ import annotations

from ..tuning.registry import KernelTuningRegistry
from . import elementwise, gemm
from .profiles import processor_profiles

__all__ = ["register"]


def register(registry: KernelTuningRegistry) -> int:
    """Register the library's schemas and shipped processor profiles; returns the generation."""
    schemas = [*elementwise.tuning_schemas(), *gemm.tuning_schemas()]
    return registry.register(schemas=schemas, profiles=processor_profiles())
