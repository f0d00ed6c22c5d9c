"""The onnx_light kernel library: its declarations, dispatch table, tuning schemas and profiles.

:data:`DECLARATIONS` holds one
:class:`~onnx_light.kernels.declaration.KernelDeclaration` per operator, keyed by
``(domain, op_type)``: the default ONNX domain's (``''``), ``ai.onnx.ml``'s (the
:mod:`~onnx_light.kernels.ml` package) and onnxruntime's ``com.microsoft`` (the
:mod:`~onnx_light.kernels.contrib` package), gathered from the kernel modules; the runtime
dispatches through it, and everything else is derived from it: :data:`KERNELS` (the default
domain's ``op_type -> {since_version: kernel class}``; ``ml.KERNELS`` is ``ai.onnx.ml``'s) and
:func:`register`, which hands every schema and calibration callback to a registry of the
tuning core in one all-or-nothing batch, then the processor profiles of each file.
"""

from __future__ import annotations

from collections.abc import Callable

from ..tuning.calibration import CalibrationResult
from ..tuning.keys import KernelTuningKey
from ..tuning.registry import KernelTuningRegistry
from ..tuning.schema import KernelTuningSchema
from . import (
    activations,
    attention,
    bitwise,
    contrib,
    control_flow,
    conv,
    conv_transpose,
    deform_conv,
    detection,
    elementwise,
    feature_normalization,
    gemm,
    images,
    indexing,
    losses,
    matrices,
    ml,
    norm_pooling,
    normalization,
    pooling,
    quantization,
    quantized_products,
    random_draws,
    rearrangement,
    recurrent,
    reductions,
    resize,
    roi,
    sampling,
    scans,
    sequences,
    signal_processing,
    sorting,
    state_space,
    strings,
    structural,
    unpooling,
)
from .base import Kernel
from .declaration import KernelDeclaration, declarations_by_op, dispatch_table
from .profiles import register_profiles

__all__ = ["DECLARATIONS", "KERNELS", "calibration_callbacks", "register", "tuning_schemas"]

DECLARATIONS: dict[tuple[str, str], KernelDeclaration] = declarations_by_op(
    elementwise.DECLARATIONS, gemm.DECLARATIONS, structural.DECLARATIONS,
    reductions.DECLARATIONS, conv.DECLARATIONS, pooling.DECLARATIONS, normalization.DECLARATIONS,
    indexing.DECLARATIONS, scans.DECLARATIONS, sorting.DECLARATIONS, matrices.DECLARATIONS,
    activations.DECLARATIONS, feature_normalization.DECLARATIONS, bitwise.DECLARATIONS,
    rearrangement.DECLARATIONS, signal_processing.DECLARATIONS, norm_pooling.DECLARATIONS,
    unpooling.DECLARATIONS, losses.DECLARATIONS, detection.DECLARATIONS, strings.DECLARATIONS,
    attention.DECLARATIONS, sampling.DECLARATIONS, state_space.DECLARATIONS,
    recurrent.DECLARATIONS, conv_transpose.DECLARATIONS, roi.DECLARATIONS,
    quantization.DECLARATIONS, quantized_products.DECLARATIONS, resize.DECLARATIONS,
    sequences.DECLARATIONS, control_flow.DECLARATIONS, ml.DECLARATIONS,
    random_draws.DECLARATIONS, deform_conv.DECLARATIONS, images.DECLARATIONS, contrib.DECLARATIONS,
)

KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(
    d for d in DECLARATIONS.values() if not d.domain)


def tuning_schemas() -> list[KernelTuningSchema]:
    """Every tunable kernel's schema for each element type it takes."""
    return [schema for declaration in DECLARATIONS.values() for schema in declaration.schemas()]


def calibration_callbacks() -> dict[KernelTuningKey, Callable[..., CalibrationResult]]:
    """Every calibration callback under each of its kernel's keys."""
    return {key: callback for declaration in DECLARATIONS.values()
            for key, callback in declaration.callbacks().items()}


def register(registry: KernelTuningRegistry) -> int:
    """Register the library's schemas and calibration callbacks in one batch, then the
    shipped and the organisation's processor profiles, one batch per file (a bad file costs
    its profiles only: :func:`~onnx_light.kernels.profiles.register_profiles`); returns the
    generation."""
    registry.register(schemas=tuning_schemas(), callbacks=calibration_callbacks())
    register_profiles(registry)
    return registry.generation
