"""Conv: 1-D, 2-D and 3-D convolution as a tunable kernel, and its calibration callback.

The package's modules, one job each: :mod:`~onnx_light.kernels.conv.config` (parameters,
schema, typed configuration), :mod:`~onnx_light.kernels.conv.problem` (one call's shapes and
parallel plan), :mod:`~onnx_light.kernels.conv.blocks` (what the algorithms share, how a plan
runs them), :mod:`~onnx_light.kernels.conv.algorithms` (one class per algorithm),
:mod:`~onnx_light.kernels.conv.depthwise` (the compiled depthwise convolution, one channel at
a time), :mod:`~onnx_light.kernels.conv.channel_blocked` (the same, a vector's 8 or 16 channels at a time),
:mod:`~onnx_light.kernels.conv.columns_blocked` (the compiled 1-D convolution, a vector's
output columns at a time),
:mod:`~onnx_light.kernels.conv.im2col_units` (1-D im2col in one compiled call, units of
columns shared by the threads),
:mod:`~onnx_light.kernels.conv.winograd` (Winograd's F(2x2, 3x3) and F(4x4, 3x3)
arithmetic),
:mod:`~onnx_light.kernels.conv.kernel` (:class:`ConvKernel`),
:mod:`~onnx_light.kernels.conv.numerics` (:func:`error_bound`) and
:mod:`~onnx_light.kernels.conv.calibration` (the calibration callback and its corpus). The
window geometry, shared with pooling, is :mod:`onnx_light.kernels.window`. Measurements and
history behind the defaults: ``docs/conv.md``.
"""

from __future__ import annotations

from ...tuning.schema import KernelTuningSchema
from ..base import Kernel
from ..declaration import KernelDeclaration, declare, dispatch_table
from ..window import Window, WindowAttributes
from .blocks import Prologue
from .calibration import (
    CORPUS,
    ConvCalibrationProblem,
    CorpusCase,
    calibrate_conv,
    candidate_grid,
)
from .config import (
    ALGORITHM,
    ALGORITHMS,
    AUTO_DEPTHWISE,
    BLOCK_BYTES,
    BLOCKED_OUTPUTS,
    COLUMNS_CHANNELS,
    COLUMNS_TILE,
    CONV_TYPES,
    FILTERS_BLOCKED_TAPS,
    LARGE_TILE_CHANNELS,
    LARGE_TILE_OUTPUTS,
    MINIMUM_FLOPS,
    NEVER,
    OPSET_TYPES,
    POINTWISE_MINIMUM_FLOPS,
    POINTWISE_PRODUCT,
    POINTWISE_PRODUCTS,
    POINTWISE_ROWS,
    POINTWISE_TRANSPOSED,
    REFERENCE,
    REGION_FLOPS,
    SPLIT,
    SPLITS,
    TUNING_ABI,
    UNITS_COLUMNS,
    WINOGRAD_CHANNELS,
    WINOGRAD_OUTPUTS,
    ConvConfig,
    conv_parameters,
)
from .kernel import ConvKernel
from .numerics import error_bound

__all__ = [
    "ALGORITHM",
    "ALGORITHMS",
    "AUTO_DEPTHWISE",
    "BLOCKED_OUTPUTS",
    "BLOCK_BYTES",
    "COLUMNS_CHANNELS",
    "COLUMNS_TILE",
    "CONV_TYPES",
    "CORPUS",
    "DECLARATIONS",
    "FILTERS_BLOCKED_TAPS",
    "KERNELS",
    "LARGE_TILE_CHANNELS",
    "LARGE_TILE_OUTPUTS",
    "MINIMUM_FLOPS",
    "NEVER",
    "POINTWISE_MINIMUM_FLOPS",
    "POINTWISE_PRODUCT",
    "POINTWISE_PRODUCTS",
    "POINTWISE_ROWS",
    "POINTWISE_TRANSPOSED",
    "REFERENCE",
    "REGION_FLOPS",
    "SPLIT",
    "SPLITS",
    "TUNING_ABI",
    "UNITS_COLUMNS",
    "WINOGRAD_CHANNELS",
    "WINOGRAD_OUTPUTS",
    "ConvCalibrationProblem",
    "ConvConfig",
    "ConvKernel",
    "CorpusCase",
    "Prologue",
    "Window",
    "WindowAttributes",
    "calibrate_conv",
    "candidate_grid",
    "conv_parameters",
    "conv_schema",
    "error_bound",
    "tuning_schemas",
]

DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(ConvKernel, (1, 11, 22), types=OPSET_TYPES, parameters=conv_parameters,
            calibrate=calibrate_conv),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)


def conv_schema(element_type: int) -> KernelTuningSchema:
    """The Conv schema of one element type (from the declaration)."""
    return DECLARATIONS[0].schema(element_type)


def tuning_schemas() -> list[KernelTuningSchema]:
    """One Conv schema per element type (from the declaration)."""
    return DECLARATIONS[0].schemas()
