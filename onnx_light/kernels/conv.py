"""Conv: 1-D, 2-D and 3-D convolution as a tunable kernel, and its calibration callback.

The kernel (:class:`ConvKernel`, every ONNX version: 1, 11, 22) computes ``Y = W * X + B`` for
``X`` of shape (N, C, D1, ..., Dk), ``W`` (M, C / group, K1, ..., Kk) and an optional bias
(M,), with explicit ``pads`` or ``auto_pad`` (NOTSET, VALID, SAME_UPPER, SAME_LOWER),
``strides``, ``dilations`` and ``group`` (depthwise included). float32 and float64 compute in
their own type; float16 and bfloat16 compute in float32 and round the result once.

Parameters (one schema per element type, key ``onnx_light/Conv/portable/<type>``):

``algorithm``
    ``"im2col"`` copies, for a block of output rows, every window's input values into a
    (C/group * K1 * ... * Kk, rows * D2' * ... ) buffer through a strided view and makes one
    matrix product per block (one batched product over the groups of the block).
    ``"im2col_wide"`` (stride 1 on every spatial axis but the first, 2-D and 3-D only) copies
    whole padded rows instead: each buffer row is one long contiguous copy, the product also
    computes the ``(K - 1) * dilation`` columns per row that fall between two output rows,
    and those are dropped when the block is written out.
    ``"direct_1x1"`` (1x1 kernels, stride 1, no padding) multiplies the weights with the input
    itself: no buffer. ``"per_filter"`` (same cases) makes that product one filter at a time,
    in one batched call, so that equal filters give bitwise equal channels even when the
    weights are not constant (one blocked BLAS product rounds the rows of a tile in two
    different ways). ``"depthwise"`` (one input channel per group) accumulates the
    K1 * ... * Kk shifted input views, scaled per channel, over all channels of a block at
    once. ``"winograd"`` (2-D, 3x3, stride and dilation 1) is Winograd's F(2x2, 3x3)
    (:mod:`onnx_light.kernels.winograd`): 16 products per 2x2 output tile where the others
    make 36, as 16 batched products, plus input and output transforms of additions only; the
    weights' transform is computed once when they are constant (otherwise on every call: for
    256 x 256 filters about 7 ms, more than the 14x14 convolution saves). ``"shifted"``
    (stride 1 on every axis, 2-D and 3-D) makes one product per kernel position, of that
    position's taps with the padded input read in place, and accumulates them: no window
    buffer, but K1 * ... * Kk products and additions of the output. It wins where the
    filters are few against the channels (the copy im2col saves is channels x positions x
    kernel size, the additions it adds filters x positions x kernel size): 128 -> 32
    channels at 56x56 1.28x faster than im2col_wide on one thread and 1.33x on two, at 28x28
    1.1x, at 14x14 1.08x but 0.79x on two threads; 64 -> 64 at 56x56 within 6%; 16 -> 64 at
    55x55 0.72x. ``"auto"`` picks ``direct_1x1``, ``winograd`` (constant weights, within its
    thresholds, below), ``shifted`` (a group's filters at most half its channels, at least
    784 output positions: DenseNet-121's 3x3 convolutions at 56x56 and 28x28), ``im2col_wide``
    or ``im2col``, in that order, the first that applies (``im2col_wide`` only while the
    dropped columns are at most a quarter of the computed ones, but for depthwise
    convolutions, whose product is cheap next to their copy); depthwise convolutions too,
    as one batched product over their groups: ``depthwise`` makes two numpy passes per kernel
    position where im2col makes one copy, and measured 1.5-2x slower on ShuffleNet's shapes
    (ShuffleNet 0.85x the time without it), so it is used only when forced. An algorithm
    forced where it does not apply falls back to ``im2col``, which applies to every
    convolution.
``im2col.block_bytes``
    The largest buffer (bytes) one block of output rows may use: the im2col buffer, the
    wide product's result, the depthwise accumulator. It bounds the memory a convolution
    needs beyond its output. A block holds at least one row. Each block is one BLAS product,
    which packs all of the block's weights again, so small blocks cost most where the weights
    are large: 16 MiB measured 0.86x VGG-19's time at 2 MiB (one thread; ResNet-50 and
    Inception v1 within noise). For winograd a block is a run of tile rows whose transforms
    and products fit the same size; for shifted, rows whose sum and term buffers fit it.
``winograd.minimum_channels``, ``winograd.minimum_outputs``
    ``auto`` uses ``winograd`` where each group has at least ``minimum_channels`` (256) input
    channels and as many filters, and the output at least ``minimum_outputs`` (784, 28x28)
    positions. Below, the transforms (one numpy pass per term, proportional to channels
    times positions) or the repacking of the 16 transformed filter matrices for few tiles
    outweigh the products saved. Measured on one thread against im2col: 512 channels at
    28x28 1.7x faster, 256 at 56x56 1.5x, 512 at 14x14 1.3x, 128 at 56x56 1.25x, 256 at
    14x14 even; 512 at 7x7 0.8x, 192 at 13x13 0.8x, 64 at 224x224 0.75x. On two threads
    the smaller ones lose what they gain (each thread gets half of few tile rows, and
    repacks all the filters): whole ResNet-50, 2 threads, 9 rounds, 1.13x the time with
    thresholds of 128 and 196 against none, 1.0x with 256 and 784. VGG-19 0.72x the time
    at one thread and 0.79x at two.
``parallel.split``
    How the pool's threads share the work: ``"batch_and_groups"`` splits the (image, group)
    pairs, ``"output_rows"`` the rows of the first output spatial axis (every thread builds
    its own buffers and multiplies all the weights with its columns), ``"filters"`` the
    filters (the threads copy one shared buffer, then each multiplies its filters with all of
    it), all with one BLAS thread per block; ``"blas"`` runs blocks in order on the calling
    thread and lets BLAS use the session's threads. ``"auto"`` splits (image, group) pairs
    when there are at least as many as threads and they divide evenly or number at least
    four per thread; else the filters when a group has more filters than there are output
    positions (the weights are then the larger operand, and splitting the positions would
    make every thread pack all of them) and the convolution is 1x1 or has fewer than
    :data:`ROWS_PER_THREAD` output rows per thread (an im2col split by filters shares one
    copy of the windows but needs two pool regions: measured 10-25% slower than splitting
    the rows where there are enough); else the output rows. A split with fewer than two
    parts falls back to another split, then to ``"blas"``. ``"auto"`` never picks
    ``"blas"``: OpenBLAS's threads wait for each other by spinning, so a BLAS-threaded
    product collapses (10x and more, measured) when another process holds one of the cores,
    where the pool's blocking threads degrade gracefully; and its spinning threads slow the
    pool's next regions for about 0.1 s after it. Calibration does not try it either: a
    manual setting.
``parallel.minimum_flops``
    Multiply-adds (N * M * D1' * ... * C/group * K1 * ..., times :data:`DEPTHWISE_COST` for
    ``depthwise``) below which the kernel runs on the calling thread with one BLAS thread:
    the forced-serial path.

The reference configuration is :data:`REFERENCE`: ``im2col`` on one thread, one block.

Equal filters. When a session's weights are constant (:meth:`ConvKernel.specialize`) and some
filters are bitwise equal (group 1, float and double), each distinct filter is computed once
and its channel copied to the others: equal filters then give bitwise equal channels, which
one blocked BLAS product does not (it rounds the rows of a tile in two ways). ONNX's light
SqueezeNet needs this: its last 1x1 convolution has 1000 equal filters and a softmax of
logits near 1e10 follows, where one last-bit difference (1024) turns the expected uniform
output into a one-hot vector. Trained weights have no equal filters; the shipped light
models (every weight 0.02) do, so benchmarks run them with random weights.

Numerics. Every configuration but ``winograd`` computes each output as the bias plus the same
``K = C/group * K1 * ... * Kk`` products ``w * x`` in the compute type (float32 for float16
and bfloat16); configurations differ only in the order of the additions (BLAS blocking, which
depends on the block shape; the depthwise loop's fixed order; where the bias is added). The
forward error of such a sum under any order is at most ``(K + 1) * u * (|W| * |X| + |B|)``
(first order, ``u`` the unit roundoff of the compute type, ``*`` the convolution), so for any
two configurations and every output element::

    |Y - Y_reference| <= 2 * (K + 2) * u * ((|W| * |X|) + |B|)

plus, for float16 and bfloat16, one unit in the last place of the output type (each result
is rounded once into it). ``winograd`` sums other terms: the transformed inputs (two
roundings each), the transformed filters (rounded once from float64), their products summed
over the ``C/group`` channels, the output transform (four roundings) and the bias, so its
error is at most ``(C/group + 12) * u * (T + |B|)``, first order, with ``T`` the same passes
on absolute values, ``|A^T| [(|G| |w| |G^T|) * (|B^T| |x| |B|)] |A|`` summed over the
channels. Where ``winograd`` applies (2-D, 3x3, stride and dilation 1) the bound adds
``2 * (C/group + 12) * u * (T + |B|)``. Measured, the largest error relative to the largest
output is about the same as im2col's (5-7e-7 against 3-6e-7 in float32, 64-512 channels).
:func:`error_bound` computes the bound; the tests and the calibration's validation use it.

Tuning ABI 2 (:data:`TUNING_ABI`): the winograd and shifted algorithms and winograd's
thresholds; cached Conv values of ABI 1 are reported stale and not used (calibrate again).

BLAS threads follow :data:`onnx_light.parallel.BLAS`, the mechanism Gemm uses: one BLAS
thread on the serial and split paths, the session's thread count on the ``"blas"`` path, never
more, the previous count restored after each call.

Everything that depends only on the node (attributes, the configuration) is read when the
kernel is built and configured; ``run`` derives the geometry and the plan from the input
shapes (a few microseconds) and keeps nothing. Constant weights reach the kernel once, at
session construction, through :meth:`ConvKernel.specialize` (equal filters, above, or the
winograd transform of the filters); a runtime may also set ``epilogue`` (a fused
activation, applied to each finished block), ``prologue`` (a per-channel map of the input of
a 1x1 convolution, :class:`Prologue`) and ``residual`` (a fourth input, added to each
finished block before the epilogue: ResNet's shortcut).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..parallel import BLAS, ThreadPool, get_pool
from ..tuning.calibration import Budget, CalibrationResult, configuration_search
from ..tuning.keys import ElementType, KernelTuningKey, element_type_name
from ..tuning.processor import CpuExecutionDescriptor
from ..tuning.schema import KernelTuningSchema, Parameter, Value
from . import winograd
from .base import LIBRARY, Kernel, NodeContext, compute_dtype
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = [
    "ALGORITHM",
    "ALGORITHMS",
    "BLOCK_BYTES",
    "CONV_TYPES",
    "KERNELS",
    "MINIMUM_FLOPS",
    "REFERENCE",
    "SPLIT",
    "SPLITS",
    "TUNING_ABI",
    "WINOGRAD_CHANNELS",
    "WINOGRAD_OUTPUTS",
    "ConvConfig",
    "ConvKernel",
    "Window",
    "WindowAttributes",
    "calibration_callbacks",
    "conv_parameters",
    "conv_schema",
    "error_bound",
    "tuning_schemas",
]

T = ElementType
CONV_TYPES = (T.FLOAT, T.DOUBLE, T.FLOAT16, T.BFLOAT16)
# Element types each ONNX version of Conv accepts.
OPSET_TYPES: dict[int, tuple[int, ...]] = {
    1: (T.FLOAT16, T.FLOAT, T.DOUBLE),
    11: (T.FLOAT16, T.FLOAT, T.DOUBLE),
    22: CONV_TYPES,
}

ALGORITHM = "algorithm"
BLOCK_BYTES = "im2col.block_bytes"
SPLIT = "parallel.split"
MINIMUM_FLOPS = "parallel.minimum_flops"
WINOGRAD_CHANNELS = "winograd.minimum_channels"
WINOGRAD_OUTPUTS = "winograd.minimum_outputs"
# Version of the Conv schemas' meaning: 2 added the winograd and shifted algorithms
# (cache entries of version 1 are reported stale and not used).
TUNING_ABI = 2

ALGORITHMS = ("auto", "im2col", "im2col_wide", "direct_1x1", "per_filter", "depthwise", "winograd",
              "shifted")
SPLITS = ("auto", "batch_and_groups", "output_rows", "filters", "blas")

# Portable defaults: the choices that held up on the calibration corpus and the nine light
# models on a shared 2-core AMD EPYC VM with numpy's OpenBLAS (docs/real-models.md). The
# minimum: a pool region costs 70-100 us there, which a convolution of 2^21-2^22 multiply-adds
# (0.1-0.2 ms on one thread) does not win back (2^22 against 2^21, whole sessions: ShuffleNet
# 0.85x, SqueezeNet 0.92x, Inception v1 and v2, DenseNet-121 within 4% either way).
_DEFAULTS: dict[str, Value] = {
    ALGORITHM: "auto",
    BLOCK_BYTES: 1 << 24,
    SPLIT: "auto",
    MINIMUM_FLOPS: 1 << 22,
    WINOGRAD_CHANNELS: 256,
    WINOGRAD_OUTPUTS: 784,
}
# The reference configuration every other one is compared with: the general path, serial.
REFERENCE: dict[str, Value] = {
    ALGORITHM: "im2col",
    BLOCK_BYTES: 1 << 40,
    SPLIT: "blas",
    MINIMUM_FLOPS: 1 << 62,
    WINOGRAD_CHANNELS: 256,
    WINOGRAD_OUTPUTS: 784,
}
NEVER = 1 << 40  # a threshold no convolution reaches (e.g. winograd.minimum_channels)
_WIDE_OVERHEAD = 1.25  # im2col_wide only while computed columns / needed columns <= this
# auto: shifted where a group has at most 1/SHIFTED_FILTERS as many filters as channels and the
# output at least SHIFTED_OUTPUTS positions (module docstring)
SHIFTED_FILTERS = 2
SHIFTED_OUTPUTS = 784
# auto: an im2col convolution splits its output rows while there are this many per thread
# (each thread copies its own windows); with fewer, the last thread's share is too uneven and
# many filters split the filters instead (one shared copy).
ROWS_PER_THREAD = 4
# A depthwise multiply-add is a broadcast numpy multiply and add, about 16 times slower here
# than one inside a BLAS product: it counts 16 times against parallel.minimum_flops.
DEPTHWISE_COST = 16


def conv_parameters() -> tuple[Parameter, ...]:
    """The parameters of every Conv schema."""
    return (
        Parameter(ALGORITHM, "str", _DEFAULTS[ALGORITHM], choices=ALGORITHMS,
                  description="'im2col', 'im2col_wide' (whole padded rows), 'direct_1x1' (one "
                              "product, 1x1 stride 1 unpadded), 'per_filter', 'depthwise' (one "
                              "input channel per group), 'winograd' (F(2x2,3x3), 2-D 3x3 stride 1 "
                              "dilation 1), 'shifted' (one product per kernel position, stride "
                              "1), or 'auto' (the first of direct_1x1, winograd and shifted "
                              "within their thresholds, im2col_wide, im2col that applies); "
                              "inapplicable -> im2col"),
        Parameter(BLOCK_BYTES, "int", _DEFAULTS[BLOCK_BYTES], minimum=1,
                  description="largest buffer (bytes) of one block of output rows"),
        Parameter(SPLIT, "str", _DEFAULTS[SPLIT], choices=SPLITS,
                  description="'batch_and_groups' or 'output_rows' split the work across the pool "
                              "(one BLAS thread per block), 'blas' threads BLAS instead, 'auto' "
                              "splits (image, group) pairs when there are enough, else rows"),
        Parameter(MINIMUM_FLOPS, "int", _DEFAULTS[MINIMUM_FLOPS], minimum=1,
                  description="multiply-adds from which more than one thread is used"),
        Parameter(WINOGRAD_CHANNELS, "int", _DEFAULTS[WINOGRAD_CHANNELS], minimum=1,
                  description="auto uses winograd where a group has at least this many input "
                              "channels and filters"),
        Parameter(WINOGRAD_OUTPUTS, "int", _DEFAULTS[WINOGRAD_OUTPUTS], minimum=1,
                  description="... and the output has at least this many positions"),
    )


@functools.cache
def conv_schema(element_type: int) -> KernelTuningSchema:
    """The Conv schema of one element type."""
    if element_type not in CONV_TYPES:
        raise ValueError(f"no Conv schema for element type {element_type}; valid: "
                         f"{[element_type_name(t) for t in CONV_TYPES]}")
    return KernelTuningSchema(KernelTuningKey(LIBRARY, "Conv", "portable", element_type,
                                              tuning_abi=TUNING_ABI), conv_parameters())


def tuning_schemas() -> list[KernelTuningSchema]:
    """One Conv schema per element type."""
    return [conv_schema(element_type) for element_type in CONV_TYPES]


@dataclass(frozen=True)
class ConvConfig:
    """The validated, typed configuration :meth:`ConvKernel.run` reads."""

    algorithm: str = str(_DEFAULTS[ALGORITHM])
    block_bytes: int = int(_DEFAULTS[BLOCK_BYTES])
    split: str = str(_DEFAULTS[SPLIT])
    minimum_flops: int = int(_DEFAULTS[MINIMUM_FLOPS])
    winograd_channels: int = int(_DEFAULTS[WINOGRAD_CHANNELS])
    winograd_outputs: int = int(_DEFAULTS[WINOGRAD_OUTPUTS])

    @classmethod
    def from_values(cls, values: Mapping[str, Value], key: KernelTuningKey | None = None) -> ConvConfig:
        """Check every value against the schema's rules; unknown names are errors."""
        parameters = {p.name: p for p in conv_parameters()}
        unknown = sorted(set(values) - set(parameters))
        if unknown:
            raise ValueError(f"unknown Conv tuning parameter(s) {unknown}; valid: {sorted(parameters)}")
        merged = {**_DEFAULTS, **values}
        checked = {name: parameters[name].check(merged[name], key) for name in parameters}
        return cls(str(checked[ALGORITHM]), int(checked[BLOCK_BYTES]), str(checked[SPLIT]),
                   int(checked[MINIMUM_FLOPS]), int(checked[WINOGRAD_CHANNELS]),
                   int(checked[WINOGRAD_OUTPUTS]))


# --------------------------------------------------------------------------------------------
# Window geometry, shared with the pooling kernels


@dataclass(frozen=True)
class Window:
    """Where a sliding window goes along each spatial axis of one input shape.

    ``begin``/``end`` are the explicit (or auto_pad) paddings; ``extra`` is what ceil_mode
    adds after ``end`` so that the last window fits (it holds no input, padded or not).
    """

    input: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]
    extra: tuple[int, ...]
    output: tuple[int, ...]

    @property
    def extent(self) -> tuple[int, ...]:
        """Input positions one window spans along each axis: ``(K - 1) * dilation + 1``."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations, strict=True))

    @property
    def padded(self) -> bool:
        """Whether any padding (explicit, auto or ceil_mode) is needed."""
        return any(self.begin) or any(self.end) or any(self.extra)

    def padded_shape(self) -> tuple[int, ...]:
        """The spatial shape of the input once padded (ceil_mode extension included)."""
        return tuple(i + b + e + x for i, b, e, x in
                     zip(self.input, self.begin, self.end, self.extra, strict=True))


@dataclass(frozen=True)
class WindowAttributes:
    """The window attributes of a Conv or pooling node, read and checked once at build time."""

    kernel_shape: tuple[int, ...] | None
    strides: tuple[int, ...] | None
    dilations: tuple[int, ...] | None
    pads: tuple[int, ...] | None
    auto_pad: str
    ceil_mode: bool

    @classmethod
    def read(cls, ctx: NodeContext, *, ceil_mode: bool = False) -> WindowAttributes:
        """Read ``kernel_shape``, ``strides``, ``dilations``, ``pads``, ``auto_pad``."""

        def ints(name: str) -> tuple[int, ...] | None:
            value = ctx.attribute(name)
            return None if value is None else tuple(int(v) for v in np.asarray(value).reshape(-1))

        auto_pad = ctx.attribute("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
            raise ctx.error(f"auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER, got {auto_pad!r}")
        attributes = cls(ints("kernel_shape"), ints("strides"), ints("dilations"), ints("pads"),
                         auto_pad, ceil_mode)
        for name in ("kernel_shape", "strides", "dilations"):
            value = getattr(attributes, name)
            if value is not None and any(v < 1 for v in value):
                raise ctx.error(f"{name} must be positive, got {list(value)}")
        if attributes.pads is not None and any(p < 0 for p in attributes.pads):
            raise ctx.error(f"pads must not be negative, got {list(attributes.pads)}")
        return attributes

    def window(self, ctx: NodeContext, spatial: Sequence[int],
               kernel: Sequence[int] | None = None) -> Window:
        """The geometry for an input of spatial shape ``spatial`` (``kernel`` from the weights)."""
        rank = len(spatial)
        kernel = tuple(kernel) if kernel is not None else self.kernel_shape
        if kernel is None:
            raise ctx.error("attribute kernel_shape is required")
        if self.kernel_shape is not None and tuple(self.kernel_shape) != tuple(kernel):
            raise ctx.error(f"kernel_shape {list(self.kernel_shape)} differs from the weights' "
                            f"spatial shape {list(kernel)}")
        strides = self.strides or (1,) * rank
        dilations = self.dilations or (1,) * rank
        pads = self.pads or (0,) * (2 * rank)
        for name, value, size in (("kernel_shape", kernel, rank), ("strides", strides, rank),
                                  ("dilations", dilations, rank), ("pads", pads, 2 * rank)):
            if len(value) != size:
                raise ctx.error(f"{name} has {len(value)} values, the input has {rank} spatial "
                                f"axes (expected {size})")
        extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
        begin, end, extra, output = [], [], [], []
        for axis in range(rank):
            size, s, e = spatial[axis], strides[axis], extent[axis]
            if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                out = -(-size // s)
                total = max(0, (out - 1) * s + e - size)
                small, large = total // 2, total - total // 2
                b, f = (small, large) if self.auto_pad == "SAME_UPPER" else (large, small)
            else:
                b, f = (0, 0) if self.auto_pad == "VALID" else (pads[axis], pads[axis + rank])
                span = size + b + f - e
                if span < 0:
                    raise ctx.error(f"the window ({e} positions along spatial axis {axis}) does "
                                    f"not fit in the padded input ({size + b + f})")
                if self.ceil_mode:
                    out = -(-span // s) + 1
                    if (out - 1) * s >= size + b:  # the last window would start in the end padding
                        out -= 1
                else:
                    out = span // s + 1
            begin.append(b)
            end.append(f)
            extra.append(max(0, (out - 1) * s + e - (size + b + f)))
            output.append(out)
        return Window(tuple(spatial), tuple(kernel), tuple(strides), tuple(dilations),
                      tuple(begin), tuple(end), tuple(extra), tuple(output))


def pad_spatial(x: np.ndarray, window: Window, value: Any = 0, extra_value: Any = None,
                tail: Sequence[int] = ()) -> np.ndarray:
    """``x`` (N, C, *spatial) padded with ``value`` (and the ceil_mode extension with
    ``extra_value``, default ``value``), plus ``tail[i]`` more entries of ``value`` at the end
    of spatial axis ``i``; ``x`` itself when nothing is needed."""
    if not window.padded and not any(tail):
        return x
    shape = list(window.padded_shape())
    for axis, extra in enumerate(tail):
        shape[axis] += extra
    fill = value if extra_value is None else extra_value
    if fill == 0:
        padded = np.zeros((*x.shape[:2], *shape), x.dtype)
    else:
        padded = np.empty((*x.shape[:2], *shape), x.dtype)
        padded.fill(fill)
    if extra_value is not None and extra_value != value:
        inner = tuple(slice(0, i + b + f) for i, b, f in zip(window.input, window.begin, window.end,
                                                              strict=True))
        padded[(slice(None), slice(None), *inner)] = value
    core = tuple(slice(b, b + i) for b, i in zip(window.begin, window.input, strict=True))
    padded[(slice(None), slice(None), *core)] = x
    return padded


# --------------------------------------------------------------------------------------------
# The kernel


@dataclass(frozen=True)
class _Problem:
    """One call's shapes and choices; built at the start of :meth:`ConvKernel.run`."""

    window: Window
    batch: int
    channels: int
    groups: int
    filters: int
    algorithm: str
    plan: str  # "serial", "blas", "batch_and_groups", "output_rows"

    @property
    def group_channels(self) -> int:
        return self.channels // self.groups

    @property
    def group_filters(self) -> int:
        return self.filters // self.groups

    @property
    def depth(self) -> int:
        """K: products summed per output element."""
        return self.group_channels * math.prod(self.window.kernel)


@dataclass(frozen=True)
class Prologue:
    """``x * multiplier + offset`` per input channel, then an in-place activation, applied to
    the input as a 1x1 convolution reads it: the runtime fuses a pre-activation (DenseNet's
    BatchNormalization and Relu before each 1x1 convolution) into the convolution, so that it
    runs on each thread's block while the block is in cache. Same operations, in the same
    order and type, as the ``ChannelAffine`` step it replaces: the same mapped values."""

    multiplier: np.ndarray  # (C,) or (1,), float64
    offset: np.ndarray
    activation: Callable[[np.ndarray], None] | None

    def apply(self, x: np.ndarray, c0: int, c1: int) -> np.ndarray:
        """A new array: channels c0:c1 of the input (axis -2 of ``x``) mapped."""
        shape = (-1, 1)
        multiplier = self.multiplier if self.multiplier.size == 1 else self.multiplier[c0:c1]
        offset = self.offset if self.offset.size == 1 else self.offset[c0:c1]
        out = np.multiply(x, multiplier.astype(x.dtype).reshape(shape))
        np.add(out, offset.astype(x.dtype).reshape(shape), out=out)
        if self.activation is not None:
            self.activation(out)
        return out

    def whole(self, x: np.ndarray) -> np.ndarray:
        """The whole input (N, C, ...) mapped."""
        channels = x.reshape(x.shape[0], x.shape[1], -1)
        return self.apply(channels, 0, x.shape[1]).reshape(x.shape)


def _winograd_applies(kernel: Sequence[int], strides: Sequence[int] | None,
                      dilations: Sequence[int] | None) -> bool:
    """Whether winograd can compute a convolution: 2-D, 3x3, stride 1 and dilation 1."""
    return (tuple(kernel) == (3, 3) and all(s == 1 for s in strides or (1,))
            and all(d == 1 for d in dilations or (1,)))


@dataclass(frozen=True)
class _DistinctFilters:
    """What :meth:`ConvKernel.specialize` found: the constant weights, their distinct filters,
    per filter the index of its distinct one, and the kernel that multiplies the distinct ones."""

    weights: np.ndarray
    distinct: np.ndarray
    inverse: np.ndarray
    plain: ConvKernel


class ConvKernel(Kernel):
    """ONNX Conv (since versions 1, 11, 22), tunable; see the module docstring."""

    op_type: ClassVar[str] = "Conv"
    tuning_abi: ClassVar[int] = TUNING_ABI
    accepts_epilogue: ClassVar[bool] = True

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        element_type = self.element_type
        usable = [v for v in OPSET_TYPES if v <= ctx.opset]
        allowed = OPSET_TYPES[max(usable)] if usable else ()
        if element_type is not None and element_type not in allowed:
            raise ctx.error(f"element type {element_type_name(element_type)} is not allowed at "
                            f"opset {ctx.opset}; valid: {[element_type_name(t) for t in allowed]}")
        if ctx.num_inputs and ctx.num_inputs not in (2, 3):
            raise ctx.error(f"expects 2 or 3 inputs (X, W, optional B), the node has {ctx.num_inputs}")
        self.attributes = WindowAttributes.read(ctx)
        self.group = int(ctx.attribute("group", 1))
        if self.group < 1:
            raise ctx.error(f"group must be positive, got {self.group}")
        self.config = ConvConfig()
        self._distinct: _DistinctFilters | None = None  # set by specialize
        # (constant weights, their Winograd transform), set by specialize
        self._winograd: tuple[np.ndarray, np.ndarray] | None = None
        self.prologue: Prologue | None = None  # set by the runtime's fusion
        self.residual = False  # set by the runtime's fusion: a fourth input to add

    def accepts_prologue(self, w_shape: Sequence[int]) -> bool:
        """Whether a :class:`Prologue` can run inside this convolution with weights of this
        shape: 1x1, stride 1, no padding (what ``direct_1x1`` computes)."""
        attributes = self.attributes
        return (len(w_shape) >= 3 and all(k == 1 for k in w_shape[2:])
                and all(s == 1 for s in attributes.strides or (1,))
                and not any(attributes.pads or (0,)))

    def specialize(self, constants: Sequence[np.ndarray | None]) -> ConvKernel | None:
        """With constant weights: a kernel that computes each distinct filter once when
        filters repeat (group 1, float or double; see the module docstring), else one that
        keeps the weights' Winograd transform when its convolutions may use winograd."""
        w = constants[1] if len(constants) > 1 else None
        if w is None or w.ndim < 3:
            return None
        return self._with_distinct_filters(w) or self._with_winograd_filters(w)

    def _with_winograd_filters(self, w: np.ndarray) -> ConvKernel | None:
        if w.dtype.kind != "f" and w.dtype.name != "bfloat16":
            return None
        if not _winograd_applies(w.shape[2:], self.attributes.strides, self.attributes.dilations):
            return None
        algorithm = self.config.algorithm
        if algorithm == "auto":
            if not self._winograd_channels(w.shape[1], w.shape[0] // self.group):
                return None
        elif algorithm != "winograd":
            return None
        kernel = copy.copy(self)
        shaped = w.reshape(self.group, w.shape[0] // self.group, w.shape[1], 3, 3)
        kernel._winograd = (w, winograd.transform_filters(shaped, compute_dtype(w.dtype)))
        return kernel

    def _winograd_channels(self, group_channels: int, group_filters: int) -> bool:
        """Whether ``auto`` may use winograd for a group this wide (its channel threshold)."""
        return min(group_channels, group_filters) >= self.config.winograd_channels

    def _with_distinct_filters(self, w: np.ndarray) -> ConvKernel | None:
        if self.group != 1 or w.shape[0] < 2 or w.dtype not in (np.float32, np.float64):
            return None
        bits = w.reshape(w.shape[0], -1).view(np.int32 if w.dtype == np.float32 else np.int64)
        # Equal filters have equal sums of their bits: one pass groups them (and rules most
        # weights out); each filter is then compared bit for bit with the first of its group.
        first_of, inverse = np.unique(bits.sum(axis=1, dtype=np.int64), return_index=True,
                                      return_inverse=True)[1:]
        if len(first_of) == w.shape[0] or not np.array_equal(bits, bits[first_of[inverse]]):
            return None  # all distinct, or two distinct filters share a sum: keep it simple
        plain = copy.copy(self)  # the product of the distinct filters: no bias, no epilogue
        plain.epilogue, plain.residual = None, False
        kernel = copy.copy(self)
        kernel._distinct = _DistinctFilters(w, np.ascontiguousarray(w[first_of]), inverse.reshape(-1),
                                            plain)
        return kernel

    def _configure(self, values: Mapping[str, Value]) -> None:
        try:
            self.config = ConvConfig.from_values(values, self.tuning_key())
        except (KeyError, TypeError, ValueError) as exc:
            raise self.ctx.error(str(exc)) from None

    @property
    def num_threads(self) -> int:
        """Threads of the pool the kernel was configured with (1 without a pool)."""
        return self.pool.num_threads if self.pool is not None else 1

    # ---------------------------------------------------------------- planning

    def problem(self, x_shape: Sequence[int], w_shape: Sequence[int], transformed: bool = False) -> _Problem:
        """Check the shapes and decide the algorithm and the parallel plan of one call;
        ``transformed``: the kernel holds the Winograd transform of the call's weights."""
        ctx = self.ctx
        if len(x_shape) < 3:
            raise ctx.error(f"X must have shape (N, C, D1, ...), got {list(x_shape)}")
        if len(w_shape) != len(x_shape):
            raise ctx.error(f"W must have the rank of X ({len(x_shape)}), got shape {list(w_shape)}")
        batch, channels = int(x_shape[0]), int(x_shape[1])
        filters, group_channels = int(w_shape[0]), int(w_shape[1])
        groups = self.group
        if group_channels * groups != channels:
            raise ctx.error(f"X has {channels} channels but W expects {group_channels} per group "
                            f"x {groups} groups")
        if filters % groups:
            raise ctx.error(f"W's {filters} filters do not divide into {groups} groups")
        window = self.attributes.window(ctx, tuple(int(d) for d in x_shape[2:]),
                                        tuple(int(k) for k in w_shape[2:]))
        algorithm = self._algorithm(window, group_channels, groups, filters, transformed)
        config = self.config
        threads = self.num_threads
        flops = batch * filters * math.prod(window.output) * group_channels * math.prod(window.kernel)
        if algorithm == "depthwise":
            flops *= DEPTHWISE_COST
        problem = _Problem(window, batch, channels, groups, filters, algorithm, "serial")
        if threads < 2 or flops < config.minimum_flops:
            return problem
        return dataclasses.replace(problem, plan=_plan(config.split, problem, threads))

    def _algorithm(self, window: Window, group_channels: int, groups: int, channels_out: int,
                   transformed: bool) -> str:
        pointwise = (all(k == 1 for k in window.kernel) and all(s == 1 for s in window.strides)
                     and not window.padded)
        depthwise = group_channels == 1 and groups > 1
        wide = len(window.input) >= 2 and all(s == 1 for s in window.strides[1:])
        tiled = _winograd_applies(window.kernel, window.strides, window.dilations)
        choice = self.config.algorithm
        if choice == "auto":
            if pointwise:
                return "direct_1x1"
            if (tiled and transformed and self._winograd_channels(group_channels, channels_out // groups)
                    and math.prod(window.output) >= self.config.winograd_outputs):
                return "winograd"
            if (all(s == 1 for s in window.strides) and len(window.input) >= 2
                    and SHIFTED_FILTERS * (channels_out // groups) <= group_channels
                    and math.prod(window.output) >= SHIFTED_OUTPUTS):
                return "shifted"
            if wide:
                needed = math.prod(window.output[1:])
                computed = math.prod(p for p in window.padded_shape()[1:])
                # a depthwise product is cheap next to its copy, which whole rows make faster
                # (ShuffleNet's 544 channels at 7x7: 0.72x the time, 9 columns for 7)
                if depthwise or computed <= _WIDE_OVERHEAD * needed:
                    return "im2col_wide"
            return "im2col"
        unit_strides = len(window.input) >= 2 and all(s == 1 for s in window.strides)
        applies = {"im2col": True, "im2col_wide": wide, "direct_1x1": pointwise,
                   "per_filter": pointwise, "depthwise": depthwise, "winograd": tiled,
                   "shifted": unit_strides}
        return choice if applies[choice] else "im2col"

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        """Multiply-adds: each output element takes C/group x kernel size of them."""
        written = super().work(input_shapes, output_shapes)
        w = input_shapes[1] if len(input_shapes) > 1 else None
        if written is None or not w:
            return None
        return written * math.prod(w[1:])

    # ---------------------------------------------------------------- running

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
            raise self.ctx.error("needs inputs X and W")
        x, w = inputs[0], inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        residual = inputs[3] if self.residual and len(inputs) > 3 else None
        if self.residual and residual is None:
            raise self.ctx.error("needs the residual input (the fused addition's other operand)")
        if self._distinct is not None and w is self._distinct.weights:
            return self._run_distinct(x, b, residual)
        if w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
            raise self.ctx.error(f"X, W and B must have the same type, got "
                                 f"{[a.dtype for a in (x, w, b) if a is not None]}")
        if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
            raise self.ctx.error(f"X must be a floating point tensor, got {x.dtype}")
        transformed = self._winograd is not None and w is self._winograd[0]
        problem = self.problem(x.shape, w.shape, transformed)
        if b is not None and b.shape != (problem.filters,):
            raise self.ctx.error(f"B must have shape ({problem.filters},), got {list(b.shape)}")
        compute = compute_dtype(x.dtype)
        out = np.empty((problem.batch, problem.filters, *problem.window.output), compute)
        finish = self._finisher(out, residual)
        if out.size == 0:
            return (out.astype(x.dtype, copy=False),)
        if problem.depth == 0:
            out[...] = 0 if b is None else b.astype(compute).reshape((-1,) + (1,) * len(problem.window.input))
            if finish is not None:
                finish(out)
            return (out.astype(x.dtype, copy=False),)
        xc = np.ascontiguousarray(x, dtype=compute)
        wc = np.ascontiguousarray(w, dtype=compute)
        bc = None if b is None else b.astype(compute, copy=False)
        prologue = self.prologue
        if prologue is not None and (problem.algorithm not in ("direct_1x1", "per_filter")
                                     or problem.plan == "filters"):
            xc, prologue = prologue.whole(xc), None  # every thread would need all of it
        options: dict[str, Any] = {}
        if problem.algorithm == "winograd" and transformed:
            options["filters"] = self._winograd[1]
        if prologue is not None:  # direct_1x1 or per_filter
            options["prologue"] = prologue
        algorithm = _ALGORITHMS[problem.algorithm](problem, xc, wc, bc, out, self.config.block_bytes,
                                                   finish, **options)
        _execute(problem, algorithm, self.pool, self.num_threads)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)

    def _run_distinct(self, x: np.ndarray, b: np.ndarray | None,
                      residual: np.ndarray | None) -> Sequence[np.ndarray]:
        """Each distinct filter once, then its channel copied to every filter equal to it."""
        inverse = self._distinct.inverse
        if b is not None and (b.shape != inverse.shape or b.dtype != x.dtype):
            raise self.ctx.error(f"B must have shape ({inverse.size},) and X's type {x.dtype}, got "
                                 f"{list(b.shape)} {b.dtype}")
        channels = self._distinct.plain.run(x, self._distinct.distinct)[0]
        out = np.take(channels, inverse, axis=1)
        if b is not None:
            out += b.reshape((-1,) + (1,) * (out.ndim - 2))
        finish = self._finisher(out, residual)
        if finish is not None:
            finish(out)
        return (out,)

    def _finisher(self, out: np.ndarray, residual: np.ndarray | None
                  ) -> Callable[[np.ndarray], None] | None:
        """What each finished block of ``out`` gets: the residual's same elements added (a
        block is a view into ``out``; the residual, laid out like ``out``, is read through a
        view with the block's offset and strides), then the epilogue."""
        epilogue = self.epilogue
        if residual is None:
            return epilogue
        if residual.shape != out.shape or residual.dtype != out.dtype:
            raise self.ctx.error(f"the residual must have the output's shape {list(out.shape)} "
                                 f"and type {out.dtype}, got {list(residual.shape)} {residual.dtype}")
        flat = np.ascontiguousarray(residual).reshape(-1)
        start, item = out.__array_interface__["data"][0], out.itemsize

        def finish(block: np.ndarray) -> None:
            offset = (block.__array_interface__["data"][0] - start) // item
            np.add(block, as_strided(flat[offset:], block.shape, block.strides, writeable=False),
                   out=block)
            if epilogue is not None:
                epilogue(block)

        return finish


def _plan(split: str, problem: _Problem, threads: int) -> str:
    """The parallel plan of a call that is worth more than one thread."""
    if split == "blas":
        return "blas"
    items = problem.batch * problem.groups
    if problem.algorithm == "depthwise" and split == "filters":
        split = "batch_and_groups"  # a depthwise filter is one channel: the same split
    if split == "auto":
        many_filters = problem.group_filters > math.prod(problem.window.output)
        if items >= threads and (items % threads == 0 or items >= 4 * threads):
            split = "batch_and_groups"
        elif many_filters and (problem.algorithm in ("direct_1x1", "per_filter")
                               or problem.window.output[0] < ROWS_PER_THREAD * threads):
            split = "filters"  # few output positions: share them, split the weights
        else:
            split = "output_rows"
    sizes = {"batch_and_groups": items, "output_rows": problem.window.output[0],
             "filters": problem.filters if problem.algorithm != "depthwise" else 0}
    order = {"batch_and_groups": ("batch_and_groups", "output_rows", "filters"),
             "output_rows": ("output_rows", "filters", "batch_and_groups"),
             "filters": ("filters", "output_rows", "batch_and_groups")}[split]
    for plan in order:
        if sizes[plan] >= 2:
            return plan
    return "blas"


def _execute(problem: _Problem, algorithm: _Algorithm, pool: ThreadPool | None, threads: int) -> None:
    """Fill the algorithm's output (N, M, *output) with the convolution, following
    ``problem.plan``."""
    items, rows = problem.batch * problem.groups, problem.window.output[0]
    plan = problem.plan
    with BLAS.limited(threads if plan == "blas" else 1):
        if plan in ("serial", "blas") or pool is None:
            algorithm.block(0, items, 0, rows)
            return
        per_thread = BLAS.per_thread
        if plan == "filters":
            algorithm.by_filters(pool, threads, per_thread)
        elif plan == "batch_and_groups":
            def run_items(start: int, stop: int) -> None:
                _limited(per_thread, algorithm.block, start, stop, 0, rows)

            pool.parallel_for(items, run_items, max_blocks=threads)
        else:
            unit = algorithm.row_unit

            def run_rows(start: int, stop: int) -> None:
                _limited(per_thread, algorithm.block, 0, items, start * unit, min(stop * unit, rows))

            pool.parallel_for(-(-rows // unit), run_rows, max_blocks=threads)


def _limited(per_thread: bool, function: Callable[..., None], *arguments: int) -> None:
    """Run one block, with one BLAS thread on this thread when the limit is per thread."""
    with BLAS.limited(1 if per_thread else None):
        function(*arguments)


def _group_ranges(problem: _Problem, start: int, stop: int) -> list[tuple[int, int, int]]:
    """(image, first group, last group + 1) runs covering items ``start:stop``."""
    groups = problem.groups
    runs = []
    item = start
    while item < stop:
        n, g = divmod(item, groups)
        last = min(stop - n * groups, groups)
        runs.append((n, g, last))
        item = n * groups + last
    return runs


def _filter_ranges(problem: _Problem, start: int, stop: int) -> list[tuple[int, int, int]]:
    """(group, first filter, last filter + 1) within each group, covering filters ``start:stop``."""
    mg = problem.group_filters
    return [(g, max(start - g * mg, 0), min(stop - g * mg, mg))
            for g in range(start // mg, (stop - 1) // mg + 1)]


def _rows_per_block(block_bytes: int, bytes_per_row: int, rows: int) -> int:
    return max(1, min(rows, block_bytes // max(1, bytes_per_row)))


class _Algorithm:
    """One call's computation, cut into blocks of (image, group) pairs and output rows;
    ``epilogue`` (a fused activation) is applied to every finished block of the output."""

    row_unit: ClassVar[int] = 1  # the output rows the pool splits are multiples of this

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None) -> None:
        self.problem = problem
        self.epilogue = epilogue
        self.window = problem.window
        self.block_bytes = block_bytes
        self.mg = problem.group_filters
        self.cg = problem.group_channels
        self.weights = w.reshape(problem.groups, self.mg, problem.depth)
        self.bias = None if b is None else b.reshape(problem.groups, self.mg)
        self.out = out.reshape(problem.batch, problem.groups, self.mg, *self.window.output)
        self.inner = len(self.window.output) - 1

    def bias_of(self, g0: int, g1: int, lo: int, hi: int, trailing: int) -> np.ndarray | None:
        """The bias of groups g0:g1, filters lo:hi, shaped to broadcast over ``trailing`` axes."""
        if self.bias is None:
            return None
        return self.bias[g0:g1, lo:hi].reshape((g1 - g0, hi - lo) + (1,) * trailing)

    def write(self, target: np.ndarray, computed: np.ndarray, g0: int, g1: int, lo: int, hi: int,
              trailing: int) -> None:
        """``computed`` plus the bias of groups g0:g1, filters lo:hi (broadcast over ``trailing``
        axes) into ``target``, one pass; then the epilogue."""
        bias = self.bias_of(g0, g1, lo, hi, trailing)
        if bias is None:
            np.copyto(target, computed)
        else:
            np.add(computed, bias, out=target)
        if self.epilogue is not None:
            self.epilogue(target)

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        """Compute (image, group) pairs ``start:stop``, output rows ``r0:r1``."""
        raise NotImplementedError

    def by_filters(self, pool: ThreadPool, threads: int, per_thread: bool) -> None:
        """Compute everything, splitting the filters across the pool."""
        raise NotImplementedError


class _Columns(_Algorithm):
    """im2col: copy every window's inputs for a block of output rows, then one product.

    The exact variant gathers the windows of the needed output positions (any strides); the
    wide variant copies whole padded rows (stride 1 after the first spatial axis) and drops
    the columns between output rows when it writes the result.
    """

    wide: ClassVar[bool] = False

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        window = self.window
        # the wide variant's last rows reach one row further (into the columns it drops)
        self.xp = pad_spatial(x, window, tail=(1,) if self.wide else ())
        self.item = self.xp.itemsize
        strides = self.xp.strides
        kernel_strides = tuple(d * s for d, s in zip(window.dilations, strides[2:], strict=True))
        row_stride = window.strides[0] * strides[2]
        if self.wide:
            self.padded_inner = self.xp.shape[3:]
            self.row_size = math.prod(self.padded_inner)
            self.inner_shape: tuple[int, ...] = (self.row_size,)
            inner_strides: tuple[int, ...] = (self.item,)
            self.keep = tuple(slice(0, o) for o in window.output[1:])
        else:
            self.row_size = math.prod(window.output[1:])
            self.inner_shape = tuple(window.output[1:])
            inner_strides = tuple(s * t for s, t in zip(window.strides[1:], strides[3:], strict=True))
        self.view_strides = (strides[1], *kernel_strides, row_stride, *inner_strides)
        self.row_bytes = problem.depth * self.row_size * self.item  # one group's buffer row

    def source(self, n: int, c0: int, c1: int, s: int, e: int) -> np.ndarray:
        """The windows of channels c0:c1 for output rows s:e, shaped like the buffer."""
        window = self.window
        return as_strided(self.xp[n, c0:c1, s * window.strides[0]:],
                          shape=(c1 - c0, *window.kernel, e - s, *self.inner_shape),
                          strides=self.view_strides, writeable=False)

    def product(self, n: int, g0: int, g1: int, lo: int, hi: int, s: int, e: int,
                columns: np.ndarray, scratch: np.ndarray | None) -> None:
        """Filters lo:hi of groups g0:g1 times their columns (count, K, rows * row_size)."""
        count, width = g1 - g0, (e - s) * self.row_size
        weights = self.weights[g0:g1, lo:hi]
        target = self.out[n, g0:g1, lo:hi, s:e]
        if not self.wide:
            flat = target.reshape(count, hi - lo, width)
            np.matmul(weights, columns, out=flat)
            bias = self.bias_of(g0, g1, lo, hi, 1)
            if bias is not None:
                flat += bias
            if self.epilogue is not None:
                self.epilogue(flat)
            return
        product = scratch[:count * (hi - lo) * width].reshape(count, hi - lo, width)
        np.matmul(weights, columns, out=product)
        computed = product.reshape(count, hi - lo, e - s, *self.padded_inner)[(Ellipsis, *self.keep)]
        self.write(target, computed, g0, g1, lo, hi, self.inner + 1)

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        problem, cg, mg = self.problem, self.cg, self.mg
        for n, g0, g1 in _group_ranges(problem, start, stop):
            count = g1 - g0
            per_row = count * (self.row_bytes + (mg * self.row_size * self.item if self.wide else 0))
            rows = _rows_per_block(self.block_bytes, per_row, r1 - r0)
            buffer = np.empty(count * problem.depth * rows * self.row_size, self.xp.dtype)
            scratch = np.empty(count * mg * rows * self.row_size, self.xp.dtype) if self.wide else None
            for s in range(r0, r1, rows):
                e = min(r1, s + rows)
                source = self.source(n, g0 * cg, g1 * cg, s, e)
                columns = buffer[:source.size].reshape(source.shape)
                np.copyto(columns, source)
                self.product(n, g0, g1, 0, mg, s, e,
                             columns.reshape(count, problem.depth, (e - s) * self.row_size), scratch)

    def by_filters(self, pool: ThreadPool, threads: int, per_thread: bool) -> None:
        problem, window = self.problem, self.window
        groups, channels, depth = problem.groups, problem.channels, problem.depth
        per_row = groups * self.row_bytes + (problem.filters * self.row_size * self.item if self.wide else 0)
        rows = _rows_per_block(self.block_bytes, per_row, window.output[0])
        buffer = np.empty(groups * depth * rows * self.row_size, self.xp.dtype)
        scratch = np.empty(problem.filters * rows * self.row_size, self.xp.dtype) if self.wide else None
        for n in range(problem.batch):
            for s in range(0, window.output[0], rows):
                e = min(window.output[0], s + rows)
                width = (e - s) * self.row_size
                columns = buffer[:groups * depth * width].reshape(channels, *window.kernel, e - s,
                                                                   *self.inner_shape)

                def copy(c0: int, c1: int, n: int = n, s: int = s, e: int = e,
                         columns: np.ndarray = columns) -> None:
                    np.copyto(columns[c0:c1], self.source(n, c0, c1, s, e))

                pool.parallel_for(channels, copy, max_blocks=threads)
                grouped = columns.reshape(groups, depth, width)

                def multiply(m0: int, m1: int, n: int = n, s: int = s, e: int = e,
                             grouped: np.ndarray = grouped, width: int = width) -> None:
                    for g, lo, hi in _filter_ranges(problem, m0, m1):
                        part = None
                        if scratch is not None:
                            first = (g * self.mg + lo) * width
                            part = scratch[first:first + (hi - lo) * width]
                        self.product(n, g, g + 1, lo, hi, s, e, grouped[g:g + 1], part)

                pool.parallel_for(problem.filters, functools.partial(_limited, per_thread, multiply),
                                  max_blocks=threads)


class _WideColumns(_Columns):
    wide: ClassVar[bool] = True


class _Shifted(_Columns):
    """Stride 1 on every axis: one product per kernel position, of that position's filter
    taps with the padded input read in place (whole padded rows, a contiguous slice per
    channel starting at the position's offset), accumulated; no window buffer. The columns
    between output rows are computed and dropped, as in ``im2col_wide``."""

    wide: ClassVar[bool] = True

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        window = self.window
        element_strides = [stride // self.item for stride in self.xp.strides[2:]]
        self.offsets = [sum(k * d * s for k, d, s in zip(position, window.dilations, element_strides,
                                                         strict=True))
                        for position in itertools.product(*(range(k) for k in window.kernel))]
        taps = len(self.offsets)
        # (position, group, filter, channel): each position's taps as one contiguous matrix
        self.taps = np.ascontiguousarray(
            self.weights.reshape(problem.groups, self.mg, self.cg, taps).transpose(3, 0, 1, 2))
        self.flat = self.xp.reshape(problem.batch, problem.groups, self.cg, -1)

    def product(self, n: int, g0: int, g1: int, lo: int, hi: int, s: int, e: int,
                columns: np.ndarray, scratch: np.ndarray | None) -> None:
        """Filters lo:hi of groups g0:g1 for output rows s:e; ``columns`` and ``scratch`` are
        two buffers of (count, hi - lo, rows * row_size) (the sum and one position's term)."""
        count, width = g1 - g0, (e - s) * self.row_size
        total = columns[:count * (hi - lo) * width].reshape(count, hi - lo, width)
        term = scratch[:count * (hi - lo) * width].reshape(count, hi - lo, width)
        first = s * self.row_size
        for index, offset in enumerate(self.offsets):
            source = self.flat[n, g0:g1, :, first + offset:first + offset + width]
            np.matmul(self.taps[index, g0:g1, lo:hi], source, out=term if index else total)
            if index:
                total += term
        computed = total.reshape(count, hi - lo, e - s, *self.padded_inner)[(Ellipsis, *self.keep)]
        self.write(self.out[n, g0:g1, lo:hi, s:e], computed, g0, g1, lo, hi, self.inner + 1)

    def _buffers(self, filters: int, rows: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Rows per block for ``filters`` filters within block_bytes, and the two buffers."""
        step = _rows_per_block(self.block_bytes, 2 * filters * self.row_size * self.item, rows)
        size = filters * step * self.row_size
        return step, np.empty(size, self.xp.dtype), np.empty(size, self.xp.dtype)

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        for n, g0, g1 in _group_ranges(self.problem, start, stop):
            step, total, term = self._buffers((g1 - g0) * self.mg, r1 - r0)
            for s in range(r0, r1, step):
                self.product(n, g0, g1, 0, self.mg, s, min(r1, s + step), total, term)

    def by_filters(self, pool: ThreadPool, threads: int, per_thread: bool) -> None:
        """One region: each thread its filters, every row (no shared buffer to build)."""
        problem, rows = self.problem, self.window.output[0]

        def multiply(m0: int, m1: int) -> None:
            step, total, term = self._buffers(m1 - m0, rows)
            for n in range(problem.batch):
                for g, lo, hi in _filter_ranges(problem, m0, m1):
                    for s in range(0, rows, step):
                        self.product(n, g, g + 1, lo, hi, s, min(rows, s + step), total, term)

        pool.parallel_for(problem.filters, functools.partial(_limited, per_thread, multiply),
                          max_blocks=threads)


class _Pointwise(_Algorithm):
    """1x1, stride 1, no padding: the weights times the input rows themselves, no buffer (a
    prologue maps each block of input rows into a new one first)."""

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None,
                 prologue: Prologue | None = None) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        self.prologue = prologue
        window = self.window
        self.row_size = math.prod(window.output[1:])
        self.inputs = x.reshape(problem.batch, problem.groups, self.cg, window.output[0], self.row_size)
        self.outputs = out.reshape(problem.batch, problem.groups, self.mg, window.output[0], self.row_size)

    def source(self, n: int, g0: int, g1: int, r0: int, r1: int) -> np.ndarray:
        """The input of groups g0:g1, rows r0:r1 as (count, C/group, rows * row size)."""
        count, width = g1 - g0, (r1 - r0) * self.row_size
        source = self.inputs[n, g0:g1, :, r0:r1].reshape(count, self.cg, width)
        if self.prologue is None:
            return source
        mapped = self.prologue.apply(source.reshape(count * self.cg, width), g0 * self.cg, g1 * self.cg)
        return mapped.reshape(source.shape)

    def product(self, n: int, g0: int, g1: int, lo: int, hi: int, r0: int, r1: int) -> None:
        count, width = g1 - g0, (r1 - r0) * self.row_size
        target = self.outputs[n, g0:g1, lo:hi, r0:r1].reshape(count, hi - lo, width)
        np.matmul(self.weights[g0:g1, lo:hi], self.source(n, g0, g1, r0, r1), out=target)
        bias = self.bias_of(g0, g1, lo, hi, 1)
        if bias is not None:
            target += bias
        if self.epilogue is not None:
            self.epilogue(target)

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        for n, g0, g1 in _group_ranges(self.problem, start, stop):
            self.product(n, g0, g1, 0, self.mg, r0, r1)

    def by_filters(self, pool: ThreadPool, threads: int, per_thread: bool) -> None:
        problem, rows = self.problem, self.window.output[0]
        for n in range(problem.batch):
            def multiply(m0: int, m1: int, n: int = n) -> None:
                for g, lo, hi in _filter_ranges(problem, m0, m1):
                    self.product(n, g, g + 1, lo, hi, 0, rows)

            pool.parallel_for(problem.filters, functools.partial(_limited, per_thread, multiply),
                              max_blocks=threads)


class _PerFilter(_Pointwise):
    """``direct_1x1`` with one product per filter (a 1-row weight matrix times the input), all
    in one batched call: every filter goes through the same operations, so equal filters give
    bitwise equal channels, which one blocked product does not promise (OpenBLAS rounds the
    rows of a tile in two ways)."""

    def product(self, n: int, g0: int, g1: int, lo: int, hi: int, r0: int, r1: int) -> None:
        count, width = g1 - g0, (r1 - r0) * self.row_size
        target = self.outputs[n, g0:g1, lo:hi, r0:r1].reshape(count, hi - lo, 1, width)
        source = self.source(n, g0, g1, r0, r1).reshape(count, 1, self.cg, width)
        np.matmul(self.weights[g0:g1, lo:hi, None, :], source, out=target)
        bias = self.bias_of(g0, g1, lo, hi, 2)
        if bias is not None:
            target += bias
        if self.epilogue is not None:
            self.epilogue(target)


class _Depthwise(_Algorithm):
    """One input channel per group: the kernel's positions as scaled shifted views of the
    padded input, accumulated over every channel of a block at once.

    The views run over whole padded rows (like ``im2col_wide``, one row more of padding), so
    that with a stride of 1 along the first axis a block's rows form one long contiguous run
    per channel; other strides are applied when the block is written out.
    """

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        window = self.window
        self.xp = pad_spatial(x, window, tail=(1,))
        xp = self.xp
        self.item = xp.itemsize
        element_strides = [s // self.item for s in xp.strides]
        self.padded_inner = xp.shape[3:]
        self.row_size = math.prod(self.padded_inner)
        positions = list(itertools.product(*(range(k) for k in window.kernel)))
        self.offsets = [sum(k * d * s for k, d, s in zip(position, window.dilations, element_strides[2:],
                                                           strict=True)) for position in positions]
        flat = self.weights.reshape(problem.groups, self.mg, len(positions))
        self.scales = [np.ascontiguousarray(flat[:, :, p]).reshape(problem.groups, self.mg, 1)
                       for p in range(len(positions))]
        self.keep = tuple(slice(0, (o - 1) * s + 1, s) for o, s in
                          zip(window.output[1:], window.strides[1:], strict=True))
        self.channel_stride, self.image_stride = element_strides[1], element_strides[0]

    def view(self, n: int, g0: int, g1: int, s: int, e: int, offset: int) -> np.ndarray:
        """Input channels g0:g1 at one kernel position, for output rows s:e, whole padded rows."""
        step = self.window.strides[0]
        start = n * self.image_stride + g0 * self.channel_stride + s * step * self.row_size + offset
        item = self.item
        if step == 1:
            shape: tuple[int, ...] = (g1 - g0, 1, (e - s) * self.row_size)
            strides: tuple[int, ...] = (self.channel_stride * item, 0, item)
        else:
            shape = (g1 - g0, 1, e - s, self.row_size)
            strides = (self.channel_stride * item, 0, step * self.row_size * item, item)
        # A strided view straight onto the padded input's buffer (numpy checks the bounds).
        return np.ndarray(shape, self.xp.dtype, buffer=self.xp, offset=start * item, strides=strides)

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        mg, row_size, last = self.mg, self.row_size, len(self.offsets) - 1
        flat_rows = self.window.strides[0] == 1
        for n, g0, g1 in _group_ranges(self.problem, start, stop):
            count = g1 - g0
            rows = _rows_per_block(self.block_bytes, 2 * count * mg * row_size * self.item, r1 - r0)
            total = np.empty(count * mg * rows * row_size, self.xp.dtype)
            term = np.empty(count * mg * rows * row_size, self.xp.dtype)
            bias = self.bias_of(g0, g1, 0, mg, 1 if flat_rows else 2)
            for s in range(r0, r1, rows):
                e = min(r1, s + rows)
                size = count * mg * (e - s) * row_size
                shape = (count, mg, (e - s) * row_size) if flat_rows else (count, mg, e - s, row_size)
                accumulator = total[:size].reshape(shape)
                scratch = term[:size].reshape(shape)
                for index, offset in enumerate(self.offsets):
                    view = self.view(n, g0, g1, s, e, offset)
                    scale = self.scales[index][g0:g1]
                    if not flat_rows:
                        scale = scale[..., None]
                    if index == 0:
                        np.multiply(view, scale, out=accumulator)
                        if bias is not None:
                            accumulator += bias
                    if index == 0 and last == 0:
                        scratch.fill(0)
                    elif index:
                        np.multiply(view, scale, out=scratch)
                        if index < last:
                            accumulator += scratch
                # the last term is added while the result is written out
                target = self.out[n, g0:g1, :, s:e]
                keep = (Ellipsis, *self.keep)
                padded_shape = (count, mg, e - s, *self.padded_inner)
                np.add(accumulator.reshape(padded_shape)[keep], scratch.reshape(padded_shape)[keep],
                       out=target)
                if self.epilogue is not None:
                    self.epilogue(target)

    def by_filters(self, pool: ThreadPool, threads: int, per_thread: bool) -> None:
        rows = self.window.output[0]
        items = self.problem.batch * self.problem.groups
        pool.parallel_for(items, lambda start, stop: self.block(start, stop, 0, rows), max_blocks=threads)


class _Winograd(_Algorithm):
    """Winograd F(2x2, 3x3) (:mod:`onnx_light.kernels.winograd`) for 2-D 3x3 convolutions with
    stride and dilation 1: per block of tile rows, the input transform of every channel, one
    batched product (16 x groups products of filters x channels times channels x tiles), then
    the output transform, written into the rows of the block.

    ``filters`` are the transformed filters (16, groups, filters, channels) when the kernel
    computed them once (constant weights); ``magnitudes`` runs the same passes with the
    absolute values of the matrices (for :func:`error_bound`, on absolute values).
    """

    row_unit: ClassVar[int] = winograd.TILE  # threads share no tile row

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None,
                 filters: np.ndarray | None = None, magnitudes: bool = False) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        window = self.window
        self.tiles = tuple(-(-o // winograd.TILE) for o in window.output)
        tail = tuple(winograd.TILE * t - o for t, o in zip(self.tiles, window.output, strict=True))
        self.xp = pad_spatial(x, window, tail=tail)
        self.input_matrix = np.abs(winograd.INPUT) if magnitudes else winograd.INPUT
        self.output_matrix = np.abs(winograd.OUTPUT) if magnitudes else winograd.OUTPUT
        if filters is None:
            shaped = w.reshape(problem.groups, self.mg, self.cg, 3, 3)
            filters = (winograd.transform_filters(shaped, x.dtype, np.abs(winograd.FILTER))
                       if magnitudes else winograd.transform_filters(shaped, x.dtype))
        self.filters = filters

    def _tile_rows(self, r0: int, r1: int) -> tuple[int, int]:
        """The tile rows that cover output rows r0:r1."""
        return r0 // winograd.TILE, -(-r1 // winograd.TILE)

    def _step(self, channels: int, filters: int, tile_rows: int) -> int:
        """Tile rows per block: the transforms' buffers of one tile row within block_bytes."""
        tile, alpha, tw = winograd.TILE, winograd.ALPHA, self.tiles[1]
        width = tile * tw + alpha - tile
        per_row = self.xp.itemsize * (alpha * alpha * tw * (channels + filters) + alpha * channels * width
                                      + tile * alpha * filters * tw + filters * tile * tile * tw)
        return _rows_per_block(self.block_bytes, per_row, tile_rows)

    def transform(self, n: int, c0: int, c1: int, a: int, b: int, out: np.ndarray) -> None:
        """The input transform of channels c0:c1, tile rows a:b, into ``out`` (4, 4, C, th, tw)."""
        tile, alpha, tw = winograd.TILE, winograd.ALPHA, self.tiles[1]
        source = self.xp[n, c0:c1, tile * a:tile * b + alpha - tile]
        scratch = np.empty((alpha, c1 - c0, b - a, source.shape[-1]), self.xp.dtype)
        winograd.transform_inputs(source, (b - a, tw), out, scratch, self.input_matrix)

    def finish(self, n: int, g0: int, g1: int, lo: int, hi: int, a: int, b: int, r0: int, r1: int,
               products: np.ndarray) -> None:
        """The output transform of ``products`` (16, groups g0:g1, filters lo:hi, tiles of rows
        a:b), written with the bias into the output rows r0:r1 it covers."""
        tile, alpha, tw = winograd.TILE, winograd.ALPHA, self.tiles[1]
        count, filters, th = g1 - g0, (g1 - g0) * (hi - lo), b - a
        dtype = self.xp.dtype
        tiles = winograd.transform_outputs(
            products.reshape(alpha, alpha, filters, th, tw), np.empty((filters, th, tile, tw, tile), dtype),
            np.empty((tile, alpha, filters, th, tw), dtype), self.output_matrix)
        s, e = max(r0, tile * a), min(r1, tile * b)
        computed = tiles.reshape(count, hi - lo, tile * th, tile * tw)[
            :, :, s - tile * a:e - tile * a, :self.window.output[1]]
        self.write(self.out[n, g0:g1, lo:hi, s:e], computed, g0, g1, lo, hi, 2)

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        alpha, cg, mg, tw = winograd.ALPHA, self.cg, self.mg, self.tiles[1]
        squares = alpha * alpha
        first, last = self._tile_rows(r0, r1)
        for n, g0, g1 in _group_ranges(self.problem, start, stop):
            count = g1 - g0
            step = self._step(count * cg, count * mg, last - first)
            for a in range(first, last, step):
                b = min(last, a + step)
                inputs = np.empty((squares, count * cg, (b - a) * tw), self.xp.dtype)
                self.transform(n, g0 * cg, g1 * cg, a, b,
                               inputs.reshape(alpha, alpha, count * cg, b - a, tw))
                products = np.matmul(self.filters[:, g0:g1],
                                     inputs.reshape(squares, count, cg, (b - a) * tw))
                self.finish(n, g0, g1, 0, mg, a, b, r0, r1, products)

    def by_filters(self, pool: ThreadPool, threads: int, per_thread: bool) -> None:
        """Per block of tile rows: the input transform split over the channels, then the
        products and the output transform split over the filters."""
        problem, alpha, tw = self.problem, winograd.ALPHA, self.tiles[1]
        squares = alpha * alpha
        channels, rows = problem.channels, self.window.output[0]
        first, last = self._tile_rows(0, rows)
        step = self._step(channels, problem.filters, last - first)
        for n in range(problem.batch):
            for a in range(first, last, step):
                b = min(last, a + step)
                inputs = np.empty((squares, channels, (b - a) * tw), self.xp.dtype)
                shaped = inputs.reshape(alpha, alpha, channels, b - a, tw)

                def transform(c0: int, c1: int, n: int = n, a: int = a, b: int = b,
                              shaped: np.ndarray = shaped) -> None:
                    self.transform(n, c0, c1, a, b, shaped[:, :, c0:c1])

                pool.parallel_for(channels, transform, max_blocks=threads)

                def multiply(m0: int, m1: int, n: int = n, a: int = a, b: int = b,
                             inputs: np.ndarray = inputs) -> None:
                    for g, lo, hi in _filter_ranges(problem, m0, m1):
                        group_inputs = inputs[:, g * self.cg:(g + 1) * self.cg]
                        products = np.matmul(self.filters[:, g, lo:hi], group_inputs)
                        self.finish(n, g, g + 1, lo, hi, a, b, 0, rows, products)

                pool.parallel_for(problem.filters, functools.partial(_limited, per_thread, multiply),
                                  max_blocks=threads)


_ALGORITHMS: dict[str, type[_Algorithm]] = {
    "im2col": _Columns,
    "im2col_wide": _WideColumns,
    "direct_1x1": _Pointwise,
    "per_filter": _PerFilter,
    "depthwise": _Depthwise,
    "winograd": _Winograd,
    "shifted": _Shifted,
}


# --------------------------------------------------------------------------------------------
# Numerics


def error_bound(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, *, group: int = 1,
                compute_dtype: np.dtype | type = np.float32, output_dtype: np.dtype | type | None = None,
                reference: np.ndarray | None = None, **attributes: Any) -> np.ndarray:
    """The module's bound on ``|Y - Y_reference|`` for every output element.

    ``2 (K + 2) u (|W| * |X| + |B|)`` with ``u`` the unit roundoff of ``compute_dtype``, plus
    one unit in the last place of ``output_dtype`` (at ``reference``) when it is narrower.
    ``attributes`` are the node's window attributes (``pads``, ``strides``, ...).
    """
    import ml_dtypes

    ctx = NodeContext("bound", "Conv", "", 22, dict(attributes, group=group),
                      (T.DOUBLE, T.DOUBLE, T.DOUBLE), (T.DOUBLE,), 3 if b is not None else 2, 1)
    kernel = ConvKernel(ctx).bind(ThreadPool(1))
    kernel.configure(REFERENCE)
    absolute_x, absolute_w = np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64))
    absolute_b = None if b is None else np.abs(b.astype(np.float64))
    magnitude = kernel.run(absolute_x, absolute_w, absolute_b)[0]
    depth = w.shape[1] * math.prod(w.shape[2:])
    u = float(ml_dtypes.finfo(compute_dtype).eps) / 2
    bound = 2 * (depth + 2) * u * magnitude
    if _winograd_applies(w.shape[2:], attributes.get("strides"), attributes.get("dilations")):
        tiled = _winograd_magnitude(kernel, absolute_x, absolute_w)
        if absolute_b is not None:
            tiled += absolute_b.reshape(-1, 1, 1)
        bound = bound + 2 * (w.shape[1] + 12) * u * tiled
    if output_dtype is not None and np.dtype(output_dtype).itemsize < np.dtype(compute_dtype).itemsize:
        finfo = ml_dtypes.finfo(output_dtype)
        scale = np.abs(reference.astype(np.float64)) if reference is not None else magnitude
        bound = bound + 2 * float(finfo.eps) * scale + float(finfo.smallest_subnormal)
    return bound


def _winograd_magnitude(kernel: ConvKernel, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``|A^T| [(|G| w |G^T|) * (|B^T| x |B|)] |A|`` summed over the channels, for every
    output (``x`` and ``w`` non-negative float64): what the rounding errors of the winograd
    algorithm are relative to."""
    problem = dataclasses.replace(kernel.problem(x.shape, w.shape), algorithm="winograd", plan="serial")
    out = np.empty((problem.batch, problem.filters, *problem.window.output))
    if out.size:
        _Winograd(problem, x, w, None, out, 1 << 40, magnitudes=True).block(
            0, problem.batch * problem.groups, 0, problem.window.output[0])
    return out


# --------------------------------------------------------------------------------------------
# Calibration


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


# Shapes from the nine ONNX real models (light_*.onnx), batch 1.
CORPUS: tuple[CorpusCase, ...] = (
    CorpusCase("resnet50_stem_7x7s2", "ResNet-50 conv1", 3, (224, 224), 64, (7, 7), (2, 2),
               (3, 3, 3, 3)),
    CorpusCase("resnet50_1x1_reduce", "ResNet-50 res2 branch2a", 256, (56, 56), 64, (1, 1)),
    CorpusCase("resnet50_3x3", "ResNet-50 res2 branch2b", 64, (56, 56), 64, (3, 3),
               pads=(1, 1, 1, 1)),
    CorpusCase("resnet50_1x1_s2", "ResNet-50 res3 branch1", 256, (56, 56), 512, (1, 1), (2, 2)),
    CorpusCase("resnet50_3x3_28", "ResNet-50 res3 branch2b", 128, (28, 28), 128, (3, 3),
               pads=(1, 1, 1, 1)),
    CorpusCase("shufflenet_depthwise", "ShuffleNet stage 2", 136, (28, 28), 136, (3, 3),
               pads=(1, 1, 1, 1), group=136),
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
    varied alone around the portable values (11 candidates). Never the ``blas`` split: it
    leaves BLAS's threads spinning, which slows the pool's next regions in a model, which a
    search of one kernel cannot see (see
    :data:`onnx_light.kernels.gemm.NOT_CALIBRATED_MODES`)."""
    base = dict(_DEFAULTS)
    grid: list[dict[str, Value]] = []
    for split in ("batch_and_groups", "output_rows", "filters"):
        grid.append({**base, SPLIT: split})
    for block_bytes in (1 << 21, 1 << 23, 1 << 25):
        grid.append({**base, BLOCK_BYTES: block_bytes})
    grid.append({**base, ALGORITHM: "im2col"})
    for minimum in (1 << 20, 1 << 24):
        grid.append({**base, MINIMUM_FLOPS: minimum})
    for channels in (64, NEVER):
        grid.append({**base, WINOGRAD_CHANNELS: channels})
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

    def _kernel(self, case: str, values: dict[str, Value], w: np.ndarray) -> ConvKernel:
        """The case's kernel for ``values``, specialized for its (constant) weights ``w`` as a
        session would (the winograd transform)."""
        key = (case, tuple(sorted(values.items())))
        kernel = self._kernels.get(key)
        if kernel is None:
            spec = self.corpus[case]
            et = self.element_type
            ctx = NodeContext(case, "Conv", "", 22, spec.attributes(), (et, et, et), (et,), 3, 1)
            kernel = ConvKernel(ctx).bind(self.pool)
            kernel.configure(values)
            kernel = kernel.specialize([None, w, None]) or kernel
            self._kernels[key] = kernel
        return kernel

    def run(self, values: dict[str, Value], inputs: tuple[Any, ...]) -> tuple[np.ndarray, np.ndarray]:
        case, x, w, b, bound = inputs
        return self._kernel(case, values, w).run(x, w, b)[0], bound

    def same_output(self, reference: tuple[np.ndarray, np.ndarray],
                    candidate: tuple[np.ndarray, np.ndarray]) -> bool:
        expected, bound = reference
        got = candidate[0]
        if got.shape != expected.shape or got.dtype != expected.dtype:
            return False
        difference = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        return bool(np.all(difference <= bound))


SAMPLES = 3  # interleaved samples per case: the corpus of 12 configurations fits in about 4 s


def calibrate_conv(key: KernelTuningKey, descriptor: CpuExecutionDescriptor, budget: Budget, *,
                   timer: Callable[[], float] = time.perf_counter,
                   corpus: Sequence[CorpusCase] = CORPUS) -> CalibrationResult:
    """Conv's calibration callback: :func:`configuration_search` over :data:`CORPUS`.

    Runs on the process-wide pool of ``min(descriptor.num_threads, budget.max_threads)``
    threads; every candidate of :func:`candidate_grid` is validated against the portable
    configuration with :func:`error_bound` before it is timed.
    """
    threads = max(1, min(descriptor.num_threads, budget.max_threads))
    problem = ConvCalibrationProblem(key.element_type, get_pool(threads), corpus)
    portable = dict(conv_schema(key.element_type).defaults)
    result = configuration_search(key, problem, portable, candidate_grid(), budget, samples=SAMPLES,
                                  timer=timer)
    result.diagnostics.insert(0, f"{key}: corpus of {len(corpus)} convolutions, "
                                 f"{len(candidate_grid())} candidates, {threads} thread(s)")
    return result


def calibration_callbacks() -> dict[KernelTuningKey, Callable[..., CalibrationResult]]:
    """Conv's calibration callback for every element type's key."""
    return {schema.key: calibrate_conv for schema in tuning_schemas()}


def _calibrate(declaration: KernelDeclaration, key: KernelTuningKey,
               descriptor: CpuExecutionDescriptor, budget: Budget) -> CalibrationResult:
    return calibrate_conv(key, descriptor, budget)


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(ConvKernel, (1, 11, 22), types=OPSET_TYPES, parameters=lambda _: conv_parameters(),
            calibrate=_calibrate),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
