"""Conv's calibration callback: a configuration search over a corpus of convolution shapes
from the nine ONNX real models, every candidate validated with the error bound first."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...parallel import ThreadPool, get_pool
from ...tuning.calibration import Budget, CalibrationResult, configuration_search
from ...tuning.keys import ElementType as T
from ...tuning.keys import KernelTuningKey
from ...tuning.processor import CpuExecutionDescriptor
from ...tuning.schema import Value
from .. import packed_gemm
from ..base import NodeContext, compute_dtype
from ..calibration import calibration_setup, without_compilation
from ..declaration import KernelDeclaration
from ..window import Window, WindowAttributes
from .config import (
    _DEFAULTS,
    ALGORITHM,
    AUTO_DEPTHWISE,
    BLOCK_BYTES,
    BLOCKED_OUTPUTS,
    FILTERS_BLOCKED_TAPS,
    LARGE_TILE_CHANNELS,
    LARGE_TILE_OUTPUTS,
    MINIMUM_FLOPS,
    NEVER,
    POINTWISE_MINIMUM_FLOPS,
    POINTWISE_PRODUCT,
    POINTWISE_PRODUCTS,
    POINTWISE_TRANSPOSED,
    REGION_FLOPS,
    SPLIT,
    WINOGRAD_CHANNELS,
)
from .kernel import ConvKernel
from .numerics import error_bound

__all__ = ["CORPUS", "ConvCalibrationProblem", "CorpusCase", "calibrate_conv", "candidate_grid"]


@dataclass(frozen=True)
class CorpusCase:
    """One convolution shape of the calibration corpus (batch 1)."""

    name: str
    source: str
    channels: int
    size: tuple[int, int]
    filters: int
    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    group: int = 1

    @property
    def flops(self) -> int:
        """Multiply-adds."""
        depth = (self.channels // self.group) * math.prod(self.kernel)
        return self.filters * math.prod(self.window().output) * depth

    def attributes(self) -> dict[str, Any]:
        return {"strides": list(self.strides), "pads": list(self.pads), "group": self.group}

    def window(self) -> Window:
        ctx = NodeContext(self.name, "Conv", "", 22, self.attributes())
        return WindowAttributes.read(ctx).window(ctx, self.size, self.kernel)


# Shapes from the nine ONNX real models (light_*.onnx), MobileNetV2 and EfficientNet-B0, batch 1.
CORPUS: tuple[CorpusCase, ...] = (
    CorpusCase("resnet50_stem_7x7s2", "ResNet-50 conv1", 3, (224, 224), 64, (7, 7), (2, 2),
               (3, 3, 3, 3)),
    CorpusCase("mobilenetv2_stem_3x3s2", "MobileNetV2 (torchvision) conv 0 (filters_blocked)", 3,
               (224, 224), 32, (3, 3), (2, 2), (1, 1, 1, 1)),
    CorpusCase("resnet50_1x1_reduce", "ResNet-50 res2 branch2a", 256, (56, 56), 64, (1, 1)),
    CorpusCase("resnet50_3x3", "ResNet-50 res2 branch2b", 64, (56, 56), 64, (3, 3),
               pads=(1, 1, 1, 1)),
    CorpusCase("resnet50_1x1_s2", "ResNet-50 res3 branch1", 256, (56, 56), 512, (1, 1), (2, 2)),
    CorpusCase("resnet50_3x3_28", "ResNet-50 res3 branch2b", 128, (28, 28), 128, (3, 3),
               pads=(1, 1, 1, 1)),
    CorpusCase("shufflenet_depthwise", "ShuffleNet stage 2", 136, (28, 28), 136, (3, 3),
               pads=(1, 1, 1, 1), group=136),
    CorpusCase("mobilenetv2_depthwise_56", "MobileNetV2 (torchvision) block 3", 144, (56, 56), 144,
               (3, 3), pads=(1, 1, 1, 1), group=144),
    CorpusCase("mobilenetv2_depthwise_s2", "MobileNetV2 (torchvision) block 4", 144, (56, 56), 144,
               (3, 3), (2, 2), (1, 1, 1, 1), group=144),
    CorpusCase("mobilenetv2_depthwise_14_s2", "MobileNetV2 (torchvision) block 14", 576, (14, 14),
               576, (3, 3), (2, 2), (1, 1, 1, 1), group=576),
    CorpusCase("efficientnet_depthwise_5x5_14", "EfficientNet-B0 block 5", 672, (14, 14), 672,
               (5, 5), pads=(2, 2, 2, 2), group=672),
    CorpusCase("mobilenetv2_1x1_project_56", "MobileNetV2 (torchvision) block 3 projection", 144,
               (56, 56), 24, (1, 1)),
    CorpusCase("mobilenetv2_1x1_expand_14", "MobileNetV2 (torchvision) block 12 expansion", 96,
               (14, 14), 576, (1, 1)),
    CorpusCase("mobilenetv2_1x1_expand_7", "MobileNetV2 (torchvision) block 15 expansion", 160,
               (7, 7), 960, (1, 1)),
    CorpusCase("shufflenet_group4_1x1", "ShuffleNet stage 3", 272, (14, 14), 272, (1, 1), group=4),
    CorpusCase("alexnet_11x11s4", "AlexNet conv1", 3, (224, 224), 96, (11, 11), (4, 4)),
    CorpusCase("alexnet_5x5_group2", "AlexNet conv2", 96, (26, 26), 256, (5, 5), pads=(2, 2, 2, 2),
               group=2),
    CorpusCase("vgg19_3x3_14x14", "VGG-19 conv5", 512, (14, 14), 512, (3, 3), pads=(1, 1, 1, 1)),
    CorpusCase("vgg19_3x3_28x28", "VGG-19 conv4_1 (winograd by default)", 256, (28, 28), 512, (3, 3),
               pads=(1, 1, 1, 1)),
)


def candidate_grid() -> list[dict[str, Value]]:
    """The configurations the calibration compares with the portable one: each parameter
    varied alone around the portable values (21 candidates, and ``pointwise.product`` and
    ``pointwise.transposed_positions`` where the packed micro-kernel can run; not yet
    ``pointwise.rows_positions``: docs/conv.md). Never the ``blas`` split: it
    leaves BLAS's threads spinning, which slows the pool's next regions in a model, which a
    search of one kernel cannot see (see
    :data:`onnx_light.kernels.calibration.NOT_CALIBRATED_MODES`)."""
    base = dict(_DEFAULTS)
    grid: list[dict[str, Value]] = []
    for split in ("batch_and_groups", "output_rows", "filters"):
        grid.append({**base, SPLIT: split})
    for block_bytes in (1 << 21, 1 << 23, 1 << 25):
        grid.append({**base, BLOCK_BYTES: block_bytes})
    grid.append({**base, ALGORITHM: "im2col"})
    grid.append({**base, AUTO_DEPTHWISE: "im2col_wide"})
    # depthwise: the per-channel kernel everywhere, and the channel-blocked one up to 28x28
    # outputs only (the corpus has no depthwise output above the portable 56x56)
    for outputs in (0, 784):
        grid.append({**base, BLOCKED_OUTPUTS: outputs})
    grid.append({**base, FILTERS_BLOCKED_TAPS: 0})  # stems by im2col
    for minimum in (1 << 20, 1 << 24):
        grid.append({**base, MINIMUM_FLOPS: minimum})
    for minimum in (1 << 21, NEVER):  # 1x1 units shared from 2**21, or never
        grid.append({**base, POINTWISE_MINIMUM_FLOPS: minimum})
    for minimum in (1 << 21, 1 << 25):  # the compiled depthwise and stem kernels' region
        grid.append({**base, REGION_FLOPS: minimum})
    for channels in (64, NEVER):
        grid.append({**base, WINOGRAD_CHANNELS: channels})
    grid.append({**base, LARGE_TILE_CHANNELS: NEVER})  # F(4x4, 3x3) nowhere
    grid.append({**base, LARGE_TILE_OUTPUTS: 784})  # F(4x4, 3x3) from 28x28
    if packed_gemm.available():
        for product in POINTWISE_PRODUCTS:
            grid.append({**base, POINTWISE_PRODUCT: product})
        for positions in (49, 784):  # the transposed product on 7x7, or up to 28x28, planes
            grid.append({**base, POINTWISE_TRANSPOSED: positions})
    return [c for c in grid if c != base]


class ConvCalibrationProblem:
    """The Conv corpus as a :class:`~onnx_light.tuning.calibration.ConfigurationProblem`."""

    def __init__(self, element_type: int, pool: ThreadPool,
                 corpus: Sequence[CorpusCase] = CORPUS) -> None:
        import ml_dtypes

        self.element_type = element_type
        self.dtype = np.dtype(ml_dtypes.bfloat16) if element_type == T.BFLOAT16 else np.dtype(
            {T.FLOAT: np.float32, T.DOUBLE: np.float64, T.FLOAT16: np.float16}[element_type])
        self.pool = pool
        self.corpus = {case.name: case for case in corpus}
        self.cases = [case.name for case in corpus]
        self._kernels: dict[tuple[str, tuple[tuple[str, Value], ...]], ConvKernel] = {}

    def work(self, case: str) -> int:
        return self.corpus[case].flops

    def input_bytes(self, case: str) -> int:
        spec = self.corpus[case]
        window = spec.window()
        item = max(self.dtype.itemsize, 4)
        x = spec.channels * math.prod(window.padded_shape()) * item
        w = spec.filters * (spec.channels // spec.group) * math.prod(spec.kernel) * item
        y = spec.filters * math.prod(window.output) * 8 * 3  # output, magnitude, bound
        buffers = (1 << 25) * 2 * self.pool.num_threads  # the largest block_bytes in the grid
        return x * 3 + w * 2 + y + buffers

    def make_inputs(self, case: str) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        spec = self.corpus[case]
        rng = np.random.default_rng(sum(map(ord, case)))
        x = rng.uniform(-1, 1, (1, spec.channels, *spec.size)).astype(self.dtype)
        w = rng.uniform(-1, 1, (spec.filters, spec.channels // spec.group, *spec.kernel)).astype(self.dtype)
        b = rng.uniform(-1, 1, spec.filters).astype(self.dtype)
        compute = compute_dtype(self.dtype)
        bound = error_bound(x, w, b, group=spec.group, compute_dtype=compute, output_dtype=self.dtype,
                            strides=list(spec.strides), pads=list(spec.pads))
        return case, x, w, b, bound

    def _kernel(self, case: str, values: dict[str, Value], x: np.ndarray, w: np.ndarray) -> ConvKernel:
        """The case's kernel for ``values``, specialized for its (constant) weights ``w`` (the
        winograd transform) and settled for the shapes of ``x`` and ``w`` (a 1x1
        convolution's transposed weights) as a session would."""
        key = (case, tuple(sorted(values.items())))
        kernel = self._kernels.get(key)
        if kernel is None:
            spec = self.corpus[case]
            et = self.element_type
            ctx = NodeContext(case, "Conv", "", 22, spec.attributes(), (et, et, et), (et,), 3, 1)
            kernel = ConvKernel(ctx).bind(self.pool)
            kernel.configure(values)
            kernel = kernel.specialize([None, w, None]) or kernel
            kernel = kernel.settle([x.shape, w.shape]) or kernel
            self._kernels[key] = kernel
        return kernel

    def run(self, values: dict[str, Value], inputs: tuple[Any, ...]) -> tuple[np.ndarray, np.ndarray]:
        case, x, w, b, bound = inputs
        return self._kernel(case, values, x, w).run(x, w, b)[0], bound

    def same_output(self, reference: tuple[np.ndarray, np.ndarray],
                    candidate: tuple[np.ndarray, np.ndarray]) -> bool:
        expected, bound = reference
        got = candidate[0]
        if got.shape != expected.shape or got.dtype != expected.dtype:
            return False
        difference = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        return bool(np.all(difference <= bound))


SAMPLES = 3  # interleaved samples per case (what the corpus's search costs: docs/conv.md)


def calibrate_conv(declaration: KernelDeclaration, key: KernelTuningKey,
                   descriptor: CpuExecutionDescriptor, budget: Budget, *,
                   timer: Callable[[], float] | None = None,
                   corpus: Sequence[CorpusCase] = CORPUS) -> CalibrationResult:
    """Conv's calibration callback (its declaration names it): :func:`configuration_search`
    over :data:`CORPUS`.

    Runs on the process-wide pool of ``min(descriptor.num_threads, budget.max_threads)``
    threads, timed without numba's compilations (:func:`without_compilation`; ``timer``, for
    tests, replaces that clock); every
    candidate of :func:`candidate_grid` is validated against the portable configuration with
    :func:`error_bound` before it is timed.
    """
    setup = calibration_setup(declaration, key, descriptor, budget)
    problem = ConvCalibrationProblem(key.element_type, get_pool(setup.threads), corpus)
    if timer is None:
        result = without_compilation(configuration_search, key, problem, setup.portable, candidate_grid(),
                                     setup.budget, samples=SAMPLES)
    else:
        result = configuration_search(key, problem, setup.portable, candidate_grid(), setup.budget,
                                      samples=SAMPLES, timer=timer)
    result.diagnostics.insert(0, f"{key}: corpus of {len(corpus)} convolutions, "
                                 f"{len(candidate_grid())} candidates, {setup.threads} thread(s)")
    return result

