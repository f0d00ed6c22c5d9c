"""Conv's tuning parameters, their schema per element type and the typed configuration.

Parameters (one schema per element type, key ``onnx_light/Conv/portable/<type>``):

``algorithm``
    How the products are arranged: ``im2col``, ``im2col_wide``, ``direct_1x1``,
    ``per_filter``, ``depthwise``, ``depthwise_blocked``, ``filters_blocked``,
    ``columns_blocked``, ``im2col_units``, ``winograd``, ``shifted`` (each described where it
    is implemented,
    :mod:`onnx_light.kernels.conv.algorithms` and, compiled,
    :mod:`onnx_light.kernels.conv.depthwise`, :mod:`onnx_light.kernels.conv.channel_blocked`,
    :mod:`onnx_light.kernels.conv.filter_blocked`,
    :mod:`onnx_light.kernels.conv.columns_blocked` and
    :mod:`onnx_light.kernels.conv.im2col_units`)
    or ``auto``, whose rule is
    ``ConvKernel._algorithm`` (:mod:`onnx_light.kernels.conv.kernel`). An algorithm forced
    where it does not apply falls back to ``im2col``, which applies to every convolution.
``im2col.block_bytes``
    The largest buffer (bytes) one block of output rows may use: the im2col buffer, the
    wide product's result, winograd's transforms, shifted's sum and term. It bounds the
    memory a convolution needs beyond its output; a block holds at least one row.
``auto.depthwise``
    What ``auto`` computes a depthwise convolution (1-D or 2-D, one input channel per group)
    with: ``depthwise`` (compiled) or ``im2col_wide`` (one batched BLAS product over the
    groups).
``depthwise.blocked_outputs``
    Where ``auto`` computes a depthwise convolution with the compiled kernels, it uses the
    channel-blocked one (``depthwise_blocked``, :mod:`onnx_light.kernels.conv.channel_blocked`:
    float32, 2-D, one filter per channel, dilation 1, AVX-512 or AVX2 with FMA) where the
    output plane has at most this many positions, the per-channel one (``depthwise``)
    elsewhere; 0: never.
``filters_blocked.maximum_taps``
    ``auto`` computes a full (group 1) float32 2-D convolution that is not 1x1 and has at
    most three input channels (an image's: a CNN's stem) with ``filters_blocked``
    (:mod:`onnx_light.kernels.conv.filter_blocked`: AVX-512, or AVX2 and FMA) where it has at
    most this many taps per output (input channels x kernel positions); 0: never.
``columns_blocked.maximum_channels``
    ``auto`` computes a float32 1-D convolution that is neither 1x1 nor depthwise (a speech
    model's first convolution on the waveform and its grouped positional convolution) with
    ``columns_blocked`` (:mod:`onnx_light.kernels.conv.columns_blocked`: AVX-512, or AVX2 and
    FMA; at least 3 x L output columns) where a group has at most this many input channels;
    0: never. With more (128 channels at kernel 3 or 2), im2col's one deep BLAS product per
    group is faster (docs/model-zoo.md, "wav2vec2").
``columns_blocked.tile_bytes``
    ``columns_blocked`` computes bands of output columns whose phase-split input (the tile)
    takes about this many bytes, read from cache by every block of filters.
``im2col_units.columns``
    ``auto`` computes the other 1-D convolutions of one group (float32 and float64) with
    ``im2col_units`` (:mod:`onnx_light.kernels.conv.im2col_units`: im2col in one compiled
    call, units of about this many output columns, each copied, multiplied by numpy's BLAS
    and finished in cache; the units shared by the session's threads in one numba region
    from ``parallel.region_flops``); 0: never (im2col).
``winograd.minimum_channels``, ``winograd.minimum_outputs``
    ``auto`` uses ``winograd`` where each group has at least ``minimum_channels`` input
    channels and as many filters, and the output at least ``minimum_outputs`` positions:
    below, the transforms and the repacking of the transformed filters outweigh the
    products saved.
``winograd.large_tile_channels``, ``winograd.large_tile_outputs``
    ``winograd`` (forced, or picked by ``auto`` whatever the two thresholds above) computes
    F(4x4, 3x3) instead of F(2x2, 3x3) (:mod:`onnx_light.kernels.conv.winograd`) where each
    group has at least ``large_tile_channels`` input channels and as many filters, and the
    output at least ``large_tile_outputs`` positions: with fewer tiles its 36 products are
    too narrow for BLAS, and its transformed filters (four times the weights) are streamed
    for too little work.
``pointwise.product``
    What computes ``direct_1x1``'s float32 products: ``blas`` (numpy's own BLAS, a call per
    tile of positions, :func:`~onnx_light.kernels.conv.pointwise.pointwise_tiles`) or
    ``packed`` (the packed micro-kernel of :mod:`onnx_light.kernels.packed_gemm` reading the
    input's rows as its panels, :func:`~onnx_light.kernels.conv.pointwise.pointwise_packed`;
    BLAS where the processor has neither AVX2 and FMA nor AVX-512F). Neither for 1x1 planes,
    which take :func:`~onnx_light.kernels.conv.pointwise.pointwise_vector` on the calling
    thread (this parameter and the next apply to none of them).
``pointwise.minimum_flops``
    Multiply-adds from which a 1x1 convolution of one group computed by ``direct_1x1``'s
    BLAS units (:func:`~onnx_light.kernels.conv.pointwise.product_units`) shares them
    among the session's threads in one numba region (25-100 us here when the other
    processor has gone idle and its thread must be woken, docs/conv.md); below, and
    wherever it has a single unit, it runs on the calling thread.
    The units, and so the results, are the same either way. It replaces
    ``parallel.split`` and ``parallel.minimum_flops`` for those convolutions (but a
    ``parallel.split`` of ``blas``).
``pointwise.transposed_positions``
    float32 1x1 convolutions of one group with constant weights, on planes of 2 up to this
    many positions, compute their product with the packed micro-kernel transposed
    (:func:`~onnx_light.kernels.conv.pointwise.pointwise_transposed`: the weights, packed
    once as its panels, the positions as its rows read in place, the block stored
    transposed into the NCHW output), whatever ``pointwise.product``; 0: never. Their
    units (panels of filters) are shared by the session's threads from
    ``pointwise.minimum_flops`` as the BLAS units are, with the same bits.
``pointwise.rows_positions``
    float32 1x1 convolutions of one group with constant weights, on planes of at least this
    many positions, compute their product with the packed micro-kernel, the weights packed once
    as its rows and the input's rows read in place as its panels
    (:func:`~onnx_light.kernels.conv.pointwise_rows.pointwise_rows`), before
    ``pointwise.transposed_positions`` and whatever ``pointwise.product``; 0: never. Their
    units (an image's tiles of positions) are shared by the session's threads from
    ``pointwise.minimum_flops``, with the same bits.
``parallel.split``
    How the pool's threads share the work: ``"batch_and_groups"`` splits the (image, group)
    pairs, ``"output_rows"`` the rows of the first output spatial axis, ``"filters"`` the
    filters (one shared buffer), all with one BLAS thread per block; ``"blas"`` runs blocks
    in order on the calling thread and lets BLAS use the session's threads (a manual
    setting: OpenBLAS's spinning threads make it fragile on a shared machine). ``"auto"``'s
    rule is ``_plan`` (:mod:`onnx_light.kernels.conv.problem`).
``parallel.minimum_flops``
    Multiply-adds below which the kernel runs on the calling thread with one BLAS thread
    (not for the compiled depthwise and stem kernels: ``parallel.region_flops``).
``parallel.region_flops``
    Multiply-adds (times :data:`DEPTHWISE_COST` for ``depthwise`` and ``depthwise_blocked``)
    from which the compiled kernels ``depthwise``, ``depthwise_blocked``,
    ``filters_blocked``, ``columns_blocked`` and ``im2col_units`` split their work over the
    session's threads
    inside their compiled call (plan ``region``: one numba ``prange`` region,
    docs/parallel.md), never on the pool; below, and with ``parallel.split = blas``, they run
    on the calling thread.

The reference configuration is :data:`REFERENCE`: ``im2col`` on one thread, one block. Why
the portable defaults are what they are, with the measurements: ``docs/conv.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...tuning.keys import ElementType
from ...tuning.schema import Parameter, Value

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
LARGE_TILE_CHANNELS = "winograd.large_tile_channels"
LARGE_TILE_OUTPUTS = "winograd.large_tile_outputs"
AUTO_DEPTHWISE = "auto.depthwise"
BLOCKED_OUTPUTS = "depthwise.blocked_outputs"
FILTERS_BLOCKED_TAPS = "filters_blocked.maximum_taps"
POINTWISE_PRODUCT = "pointwise.product"
POINTWISE_MINIMUM_FLOPS = "pointwise.minimum_flops"
POINTWISE_TRANSPOSED = "pointwise.transposed_positions"
COLUMNS_CHANNELS = "columns_blocked.maximum_channels"
COLUMNS_TILE = "columns_blocked.tile_bytes"
UNITS_COLUMNS = "im2col_units.columns"
POINTWISE_ROWS = "pointwise.rows_positions"
REGION_FLOPS = "parallel.region_flops"
# Version of the Conv schemas' meaning (history: docs/conv.md); cache entries of another
# version are reported stale and not used.
TUNING_ABI = 9

ALGORITHMS = ("auto", "im2col", "im2col_wide", "direct_1x1", "per_filter", "depthwise",
              "depthwise_blocked", "filters_blocked", "columns_blocked", "im2col_units", "winograd",
              "shifted")
SPLITS = ("auto", "batch_and_groups", "output_rows", "filters", "blas")
DEPTHWISE_ALGORITHMS = ("depthwise", "im2col_wide")
POINTWISE_PRODUCTS = ("blas", "packed")

# Portable defaults: the choices that held up on the calibration corpus and the nine light
# models (measurements: docs/conv.md).
_DEFAULTS: dict[str, Value] = {
    ALGORITHM: "auto",
    BLOCK_BYTES: 1 << 24,
    SPLIT: "auto",
    MINIMUM_FLOPS: 1 << 22,
    WINOGRAD_CHANNELS: 256,
    WINOGRAD_OUTPUTS: 784,
    LARGE_TILE_CHANNELS: 64,
    LARGE_TILE_OUTPUTS: 3136,
    AUTO_DEPTHWISE: "depthwise",
    BLOCKED_OUTPUTS: 3136,
    # 3x3 over RGB is 27 taps; ResNet-50's 7x7 stem (147) was barely faster than im2col,
    # AlexNet's 11x11 (363) slower (docs/conv.md)
    FILTERS_BLOCKED_TAPS: 75,
    POINTWISE_PRODUCT: "blas",
    POINTWISE_MINIMUM_FLOPS: 1 << 23,
    POINTWISE_TRANSPOSED: 0,
    POINTWISE_ROWS: 0,
    REGION_FLOPS: 1 << 23,
    COLUMNS_CHANNELS: 16,
    COLUMNS_TILE: 1 << 16,
    UNITS_COLUMNS: 0,
}
# The reference configuration every other one is compared with: the general path, serial.
REFERENCE: dict[str, Value] = {
    ALGORITHM: "im2col",
    BLOCK_BYTES: 1 << 40,
    SPLIT: "blas",
    MINIMUM_FLOPS: 1 << 62,
    WINOGRAD_CHANNELS: 256,
    WINOGRAD_OUTPUTS: 784,
    LARGE_TILE_CHANNELS: 64,
    LARGE_TILE_OUTPUTS: 3136,
    AUTO_DEPTHWISE: "im2col_wide",
    BLOCKED_OUTPUTS: 0,
    FILTERS_BLOCKED_TAPS: 0,
    POINTWISE_PRODUCT: "blas",
    POINTWISE_MINIMUM_FLOPS: 1 << 62,
    POINTWISE_TRANSPOSED: 0,
    POINTWISE_ROWS: 0,
    REGION_FLOPS: 1 << 62,
    COLUMNS_CHANNELS: 0,
    COLUMNS_TILE: 1 << 16,
    UNITS_COLUMNS: 0,
}
NEVER = 1 << 40  # a threshold no convolution reaches (e.g. winograd.minimum_channels)
_WIDE_OVERHEAD = 1.25  # im2col_wide only while computed columns / needed columns <= this
# auto: shifted where a group has at most 1/SHIFTED_FILTERS as many filters as channels and the
# output at least SHIFTED_OUTPUTS positions (ConvKernel._algorithm)
SHIFTED_FILTERS = 2
SHIFTED_OUTPUTS = 784
# auto: filters_blocked only for a full convolution with at most this many input channels
# (an image's: a CNN's stem), and filters_blocked.maximum_taps taps
FILTERS_BLOCKED_CHANNELS = 3
# auto: an im2col convolution splits its output rows while there are this many per thread
# (each thread copies its own windows); with fewer, the last thread's share is too uneven and
# many filters split the filters instead (one shared copy).
ROWS_PER_THREAD = 4
# A split plan cuts its range into this many chunks per thread, taken by whichever thread is
# free (ThreadPool.parallel_chunks): a thread that wakes late (its processor busy with another
# program) takes none, instead of the region waiting for its fixed share. More chunks balance
# a slow thread better but cost CPU time on every run (each chunk's product packs the weights
# again): 2, 3 and 4 per thread measured 7%, 11% and 16% more CPU time (docs/conv.md).
CHUNKS_PER_THREAD = 1
# A multiply-add of the compiled depthwise kernel is slower than one inside a large BLAS
# product: it counts this many times against parallel.region_flops (docs/conv.md).
DEPTHWISE_COST = 4


def conv_parameters(element_type: int | None = None) -> tuple[Parameter, ...]:
    """The parameters of the Conv schema: the same for every element type (the schema factory
    of Conv's declaration)."""
    return (
        Parameter(ALGORITHM, "str", _DEFAULTS[ALGORITHM], choices=ALGORITHMS,
                  description="'im2col', 'im2col_wide' (whole padded rows), 'direct_1x1' (one "
                              "product, 1x1 stride 1 unpadded), 'per_filter', 'depthwise' "
                              "(compiled, 1-D or 2-D, one input channel per group), "
                              "'depthwise_blocked' (compiled, a vector's 8 or 16 channels at once: "
                              "float32, 2-D, one filter per channel, dilation 1, AVX-512 or "
                              "AVX2 with FMA), 'filters_blocked' (compiled, a vector's 8 or 16 "
                              "filters at once: float32, 2-D, group 1, dilation 1), "
                              "'columns_blocked' (compiled, a vector's 8 or 16 output columns at "
                              "once: float32, 1-D, at least 3 vectors of outputs), "
                              "'im2col_units' (1-D, group 1: im2col in one compiled call, units of "
                              "columns each a BLAS product), 'winograd' "
                              "(F(2x2,3x3) or F(4x4,3x3); 2-D 3x3 stride 1 dilation 1), "
                              "'shifted' (one product per kernel position, stride 1), or 'auto' "
                              "(ConvKernel._algorithm's rule); inapplicable -> im2col"),
        Parameter(BLOCK_BYTES, "int", _DEFAULTS[BLOCK_BYTES], minimum=1,
                  description="largest buffer (bytes) of one block of output rows"),
        Parameter(SPLIT, "str", _DEFAULTS[SPLIT], choices=SPLITS,
                  description="'batch_and_groups', 'output_rows' or 'filters' split the work "
                              "across the pool (one BLAS thread per block), 'blas' threads BLAS "
                              "instead, 'auto' (the rule of conv.problem._plan)"),
        Parameter(MINIMUM_FLOPS, "int", _DEFAULTS[MINIMUM_FLOPS], minimum=1,
                  description="multiply-adds from which more than one thread is used"),
        Parameter(WINOGRAD_CHANNELS, "int", _DEFAULTS[WINOGRAD_CHANNELS], minimum=1,
                  description="auto uses winograd where a group has at least this many input "
                              "channels and filters"),
        Parameter(WINOGRAD_OUTPUTS, "int", _DEFAULTS[WINOGRAD_OUTPUTS], minimum=1,
                  description="... and the output has at least this many positions"),
        Parameter(LARGE_TILE_CHANNELS, "int", _DEFAULTS[LARGE_TILE_CHANNELS], minimum=1,
                  description="winograd computes F(4x4,3x3), not F(2x2,3x3), where a group has "
                              "at least this many input channels and filters (and auto uses "
                              "it there whatever winograd.minimum_channels) ..."),
        Parameter(LARGE_TILE_OUTPUTS, "int", _DEFAULTS[LARGE_TILE_OUTPUTS], minimum=1,
                  description="... and the output has at least this many positions"),
        Parameter(AUTO_DEPTHWISE, "str", _DEFAULTS[AUTO_DEPTHWISE], choices=DEPTHWISE_ALGORITHMS,
                  description="what auto computes a 1-D or 2-D depthwise convolution with: "
                              "'depthwise' (compiled) or 'im2col_wide' (one batched product)"),
        Parameter(BLOCKED_OUTPUTS, "int", _DEFAULTS[BLOCKED_OUTPUTS], minimum=0,
                  description="auto's compiled depthwise convolutions are channel-blocked "
                              "('depthwise_blocked': float32, 2-D, dilation 1, AVX-512 or AVX2) where the "
                              "output plane has at most this many positions, per channel "
                              "('depthwise') elsewhere; 0: never"),
        Parameter(FILTERS_BLOCKED_TAPS, "int", _DEFAULTS[FILTERS_BLOCKED_TAPS], minimum=0,
                  description="auto computes a full float32 2-D convolution, not 1x1, with at "
                              "most 3 input channels (a stem) by 'filters_blocked' (AVX-512 or "
                              "AVX2) where it has at most this many taps per output (channels "
                              "x kernel positions); 0: never"),
        Parameter(POINTWISE_PRODUCT, "str", _DEFAULTS[POINTWISE_PRODUCT], choices=POINTWISE_PRODUCTS,
                  description="what computes direct_1x1's float32 products: 'blas' (a BLAS call "
                              "per tile of positions) or 'packed' (the packed micro-kernel; "
                              "blas without AVX2 and FMA or AVX-512F)"),
        Parameter(POINTWISE_MINIMUM_FLOPS, "int", _DEFAULTS[POINTWISE_MINIMUM_FLOPS], minimum=1,
                  description="multiply-adds from which direct_1x1's BLAS units of a 1x1 "
                              "convolution of one group run on the session's threads (one "
                              "numba region; the same results at every thread count)"),
        Parameter(POINTWISE_TRANSPOSED, "int", _DEFAULTS[POINTWISE_TRANSPOSED], minimum=0,
                  description="float32 1x1 convolutions of one group with constant weights whose "
                              "planes have at most this many positions (and more than 1) compute "
                              "with the packed micro-kernel transposed (the weights packed once "
                              "as its panels, the positions as its rows; AVX2 and FMA or "
                              "AVX-512F), whatever pointwise.product; 0: never"),
        Parameter(POINTWISE_ROWS, "int", _DEFAULTS[POINTWISE_ROWS], minimum=0,
                  description="float32 1x1 convolutions of one group with constant weights whose "
                              "planes have at least this many positions compute with the packed "
                              "micro-kernel, the weights packed once as its rows and the input's "
                              "rows read in place as its panels (AVX2 and FMA or AVX-512F), "
                              "before pointwise.transposed_positions, whatever pointwise.product; "
                              "0: never"),
        Parameter(REGION_FLOPS, "int", _DEFAULTS[REGION_FLOPS], minimum=1,
                  description="multiply-adds (x DEPTHWISE_COST for the depthwise ones) from "
                              "which the compiled depthwise and stem kernels ('depthwise', "
                              "'depthwise_blocked', 'filters_blocked') split their work over "
                              "the session's threads inside their compiled call (one numba "
                              "region); below, one thread"),
        Parameter(COLUMNS_CHANNELS, "int", _DEFAULTS[COLUMNS_CHANNELS], minimum=0,
                  description="auto computes a float32 1-D convolution, neither 1x1 nor "
                              "depthwise, by 'columns_blocked' (AVX-512 or AVX2) where a group "
                              "has at most this many input channels; 0: never"),
        Parameter(COLUMNS_TILE, "int", _DEFAULTS[COLUMNS_TILE], minimum=1,
                  description="bytes of phase-split input per band of output columns of "
                              "'columns_blocked'"),
        Parameter(UNITS_COLUMNS, "int", _DEFAULTS[UNITS_COLUMNS], minimum=0,
                  description="auto computes the other 1-D convolutions of one group by "
                              "'im2col_units', units of about this many output columns (shared "
                              "by the session's threads from parallel.region_flops); 0: never"),
    )


@dataclass(frozen=True)
class ConvConfig:
    """The typed configuration :meth:`ConvKernel.run` reads."""

    algorithm: str = str(_DEFAULTS[ALGORITHM])
    block_bytes: int = int(_DEFAULTS[BLOCK_BYTES])
    split: str = str(_DEFAULTS[SPLIT])
    minimum_flops: int = int(_DEFAULTS[MINIMUM_FLOPS])
    winograd_channels: int = int(_DEFAULTS[WINOGRAD_CHANNELS])
    winograd_outputs: int = int(_DEFAULTS[WINOGRAD_OUTPUTS])
    large_tile_channels: int = int(_DEFAULTS[LARGE_TILE_CHANNELS])
    large_tile_outputs: int = int(_DEFAULTS[LARGE_TILE_OUTPUTS])
    auto_depthwise: str = str(_DEFAULTS[AUTO_DEPTHWISE])
    blocked_outputs: int = int(_DEFAULTS[BLOCKED_OUTPUTS])
    filters_blocked_taps: int = int(_DEFAULTS[FILTERS_BLOCKED_TAPS])
    pointwise_product: str = str(_DEFAULTS[POINTWISE_PRODUCT])
    pointwise_minimum_flops: int = int(_DEFAULTS[POINTWISE_MINIMUM_FLOPS])
    pointwise_transposed: int = int(_DEFAULTS[POINTWISE_TRANSPOSED])
    region_flops: int = int(_DEFAULTS[REGION_FLOPS])
    columns_channels: int = int(_DEFAULTS[COLUMNS_CHANNELS])
    columns_tile: int = int(_DEFAULTS[COLUMNS_TILE])
    units_columns: int = int(_DEFAULTS[UNITS_COLUMNS])
    pointwise_rows: int = int(_DEFAULTS[POINTWISE_ROWS])

    @classmethod
    def from_values(cls, values: Mapping[str, Value]) -> ConvConfig:
        """The configuration of a complete set of values (checked against the schema by
        :meth:`~onnx_light.kernels.base.Kernel.configure`)."""
        return cls(str(values[ALGORITHM]), int(values[BLOCK_BYTES]), str(values[SPLIT]),
                   int(values[MINIMUM_FLOPS]), int(values[WINOGRAD_CHANNELS]),
                   int(values[WINOGRAD_OUTPUTS]), int(values[LARGE_TILE_CHANNELS]),
                   int(values[LARGE_TILE_OUTPUTS]), str(values[AUTO_DEPTHWISE]),
                   int(values[BLOCKED_OUTPUTS]), int(values[FILTERS_BLOCKED_TAPS]),
                   str(values[POINTWISE_PRODUCT]), int(values[POINTWISE_MINIMUM_FLOPS]),
                   int(values[POINTWISE_TRANSPOSED]), int(values[REGION_FLOPS]),
                   int(values[COLUMNS_CHANNELS]), int(values[COLUMNS_TILE]),
                   int(values[UNITS_COLUMNS]), int(values[POINTWISE_ROWS]))

