"""The onnx_light kernel library: its dispatch table, tuning schemas and profiles.

:data:`KERNELS` is the one table the runtime dispatches through:
``op_type -> {since_version: kernel class}`` for the default ONNX domain.
:func:`register` hands everything tunable to a registry of the tuning core in
one all-or-nothing batch.
"""

from __future__ import annotations

from ..tuning.registry import KernelTuningRegistry
from . import (
    activations,
    attention,
    bitwise,
    calibration,
    conv,
    detection,
    elementwise,
    feature_normalization,
    gemm,
    indexing,
    losses,
    matrices,
    norm_pooling,
    normalization,
    pooling,
    rearrangement,
    reductions,
    sampling,
    scans,
    signal_processing,
    sorting,
    state_space,
    strings,
    structural,
    unpooling,
)
from .base import Kernel
from .profiles import processor_profiles

__all__ = ["KERNELS", "register"]

KernelTable = dict[str, dict[int, type[Kernel]]]


def _merge(*tables: KernelTable) -> KernelTable:
    merged: KernelTable = {}
    for table in tables:
        for op_type, versions in table.items():
            if op_type in merged:
                raise RuntimeError(f"operator {op_type} is implemented by two kernel modules")
            merged[op_type] = dict(versions)
    return merged


KERNELS: KernelTable = _merge(
    elementwise.KERNELS, gemm.KERNELS, structural.KERNELS, reductions.KERNELS,
    conv.KERNELS, pooling.KERNELS, normalization.KERNELS,
    indexing.KERNELS, scans.KERNELS, sorting.KERNELS, matrices.KERNELS, activations.KERNELS,
    feature_normalization.KERNELS, bitwise.KERNELS, rearrangement.KERNELS,
    signal_processing.KERNELS, norm_pooling.KERNELS, unpooling.KERNELS, losses.KERNELS,
    attention.KERNELS, detection.KERNELS, strings.KERNELS, sampling.KERNELS,
    state_space.KERNELS,
)


def register(registry: KernelTuningRegistry) -> int:
    """Register the library's schemas, shipped processor profiles and calibration callbacks
    in one batch; returns the generation."""
    schemas = [*elementwise.tuning_schemas(), *gemm.tuning_schemas(), *conv.tuning_schemas()]
    callbacks = {**calibration.calibration_callbacks(), **conv.calibration_callbacks()}
    return registry.register(schemas=schemas, profiles=processor_profiles(), callbacks=callbacks)
