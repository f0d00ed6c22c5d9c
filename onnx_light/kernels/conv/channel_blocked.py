"""Conv's ``depthwise_blocked`` algorithm: a float32 2-D depthwise convolution that computes
L channels at once, one per lane of a vector register, for the small planes and strided
convolutions where the per-channel kernel (:mod:`~onnx_light.kernels.conv.depthwise`) spends
more on each channel's fixed cost than on its arithmetic (rows of 7 to 14 floats fill less
than one vector).

L is the host's float32 vector width (:func:`vector_lanes`): 16 with AVX-512 (zmm), 8 with
AVX2 and FMA (ymm); one code path, built for L. Per block of L channels of one image
(:func:`blocked_channels`):

* the block's input is transposed into a channel-last *tile* ``(Hp, Wp, L)`` with a zero
  border (the padding): L positions of the L channels at a time, transposed in registers
  (:data:`_transpose_in`);
* each output position is the bias plus the sum over its window's taps of L-lane fused
  multiply-adds, L positions at a time in L vector registers (:data:`_positions_out`),
  then clamped (a fused Relu or Clip), a fused HardSigmoid or HardSwish computed in
  registers (:func:`register_gate`), transposed back and stored into the channels' NCHW
  planes; another fused compiled activation (SiLU, Sigmoid) follows on the block's channels
  while they are in cache.

A plane whose tile would exceed :data:`BAND_BYTES` (the first-level cache) is computed by
bands of output rows instead (:func:`banded_channels`): the tile holds the input rows of one
band, transposed row by row, and stays in cache while the band's outputs read it. At more
than one thread (plan ``region``) one compiled call splits the blocks over numba's threads
(:func:`blocked_channels_parallel`), each with its own tile.

L positions in registers fit either register file: 16 of AVX-512's 32 zmm, 8 of AVX2's 16
ymm (16 would leave no register for the weights' vector: the sums would spill), the rest
for the weights and the taps' loads; the block of sums is then square, one in-register
transpose. The chunks of L positions and their places in the tile are the same for every
block: computed once per call (:func:`output_chunks`), not per block (where they cost as
much as the arithmetic). :mod:`~onnx_light.kernels.conv.filter_blocked` computes stems with
the lanes over filters (:data:`_positions_broadcast`) or over output columns
(:data:`_columns_broadcast`, with :data:`_split_pairs` for stride 2).

The weights are arranged once per weight set as ``(C/L, K*K, L)`` (:func:`blocked_weights`;
channels past C are zero), the bias as ``(C/L * L,)``. numba does not vectorise an L-lane
loop over arrays that may alias, so the vector code is LLVM IR written through numba's
``intrinsic``; where the processor has neither AVX-512 nor AVX2 with FMA, ``depthwise``
computes these convolutions. A plane's last L positions overlap the chunk before them
(computed and written again, the same values), and a plane of fewer than L goes through an
L x L scratch block, so that no vector reads or writes outside the arrays.

Numerics: every output is ``bias``, then plus ``w[kh, kw] * x[...]`` for the taps in row-major
order (kh, then kw), each step one fused multiply-add (one rounding), from the bias: within the
bound of :mod:`~onnx_light.kernels.conv.numerics` (a sum of K*K + 1 terms). NaN and infinities
propagate as IEEE arithmetic says (the padding is zeros times the weights, as the reference's
padded input), the clamp keeps NaN. A lane's sum never depends on the other lanes, the block,
the thread that computes it or L: the same bits at any thread count, with AVX2 or AVX-512.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from ..compiled import CompiledIntrinsic, close_sum_loop, compiled, prange, target_flags
from ..compiled_activations import HARD_SIGMOID, HARD_SWISH, activate_run
from .blocks import _Algorithm
from .depthwise import EPILOGUE_BLOCK_BYTES, bound_entry, read_only, region_threads
from .finish import fused_parts
from .problem import _Problem

#: The largest tile (bytes) of one block of channels: a larger plane is computed by bands of
#: output rows whose input rows fit it, which then stay in the first-level cache.
BAND_BYTES = 1 << 15

#: The vectors of output columns of ``columns_broadcast`` (the stems' intrinsic), each of L
#: columns: with L/2 filters, 12 sums in registers with AVX2.
COLUMN_VECTORS = 3

__all__ = ["BAND_BYTES", "COLUMN_VECTORS", "BlockedCall", "band_rows", "banded_channels",
           "blocked_applies", "blocked_call", "blocked_channels", "blocked_channels_parallel",
           "blocked_weights", "compile_blocked", "output_chunks", "padded_bias", "register_gate",
           "vector_lanes"]


@functools.cache
def vector_lanes() -> int:
    """The channels of a block on this processor: the float32 lanes of its widest vector
    with fused multiply-adds, 16 with AVX-512F, 8 with AVX2 and FMA; 0 (the kernel does not
    apply) with neither, or where numba does not load (numba's target machine's features:
    :func:`~onnx_light.kernels.compiled.target_flags`)."""
    flags = target_flags()
    if "avx512f" in flags:
        return 16
    return 8 if {"avx2", "fma"} <= flags else 0


def blocked_applies(dtype: np.dtype, window_rank: int, group_channels: int, groups: int,
                    filters: int, dilations: tuple[int, ...]) -> bool:
    """Whether ``depthwise_blocked`` computes a convolution: float32, 2-D, one input channel
    and one filter per group, dilation 1, on a processor with AVX-512 or AVX2 and FMA."""
    return (np.dtype(dtype) == np.float32 and window_rank == 2 and group_channels == 1
            and groups > 1 and filters == groups and all(d == 1 for d in dilations)
            and vector_lanes() > 0)


def blocked_weights(w: np.ndarray) -> np.ndarray:
    """Weights (M, C, KH, KW) (depthwise: C = 1) as ``(ceil(M/L), C*KH*KW, L)`` float32 for
    this processor's L (:func:`vector_lanes`), the filters past M zero (read-only): one
    contiguous vector per block and tap."""
    lanes = vector_lanes()
    channels, taps = w.shape[0], math.prod(w.shape[1:])
    blocks = -(-channels // lanes)
    arranged = np.zeros((blocks * lanes, taps), np.float32)
    arranged[:channels] = w.reshape(channels, taps)
    return read_only(np.ascontiguousarray(arranged.reshape(blocks, lanes, taps).transpose(0, 2, 1)))


def padded_bias(b: np.ndarray | None, channels: int) -> np.ndarray:
    """The bias of ``channels`` channels (zeros for none) padded with zeros to whole blocks
    of :func:`vector_lanes` (read-only)."""
    lanes = vector_lanes()
    if b is not None and channels % lanes == 0:
        return read_only(b.reshape(-1))
    padded = np.zeros(-(-channels // lanes) * lanes, np.float32)
    if b is not None:
        padded[:channels] = b
    return read_only(padded)


def _transpose(builder: Any, rows: list[Any]) -> list[Any]:
    """L vectors of L lanes transposed (lane j of vector i to lane i of vector j): log2(L)
    butterfly stages, each swapping one bit of the lane and vector indices."""
    from llvmlite import ir

    lanes = len(rows)
    mask_type = ir.VectorType(ir.IntType(32), lanes)
    rows = list(rows)
    bit = 1
    while bit < lanes:
        low = ir.Constant(mask_type, [j if not j & bit else lanes + (j ^ bit) for j in range(lanes)])
        high = ir.Constant(mask_type, [lanes + j if j & bit else j ^ bit for j in range(lanes)])
        for i in range(lanes):
            if not i & bit:
                a, b = rows[i], rows[i | bit]
                rows[i], rows[i | bit] = (builder.shuffle_vector(a, b, low),
                                          builder.shuffle_vector(a, b, high))
        bit *= 2
    return rows


@functools.cache
def _build(numba: ModuleType) -> dict[str, Any]:
    """The intrinsics for this processor's :func:`vector_lanes` (built once, when
    numba is loaded)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    lanes = vector_lanes()
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vector = ir.VectorType(f32, lanes)
    zero = ir.Constant(vector, [0.0] * lanes)

    def data(context: Any, builder: Any, array_type: Any, array: Any) -> Any:
        return context.make_array(array_type)(context, builder, array).data

    def vector_at(builder: Any, base: Any, offset: Any) -> Any:
        return builder.bitcast(builder.gep(base, [offset]), vector.as_pointer())

    def splat(builder: Any, scalar: Any) -> Any:
        single = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar,
                                        ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(single, ir.Constant(vector, ir.Undefined),
                                      ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))

    def is_float_array(value: Any) -> bool:
        return isinstance(value, types.Array) and value.dtype == types.float32

    def finish(builder: Any, sums: list[Any], low: Any, high: Any, gate: Any, alpha: Any,
               beta: Any) -> list[Any]:
        """The sums clamped into [low, high] (numpy's maximum then minimum, NaN kept: a
        comparison and a select each), then, for ``gate`` 1 (HardSigmoid) or 2 (HardSwish),
        ``h = min(max(s * alpha + beta, 0), 1)`` (NaN kept; a multiplication and an addition,
        two roundings) and ``h`` or ``h * s``: the operations of
        :func:`~onnx_light.kernels.compiled_activations.activate_run`, in registers."""
        low_vector, high_vector = splat(builder, low), splat(builder, high)
        clamped = []
        for value in sums:
            value = builder.select(builder.fcmp_ordered("<", value, low_vector), low_vector, value)
            clamped.append(builder.select(builder.fcmp_ordered(">", value, high_vector),
                                          high_vector, value))
        entry = builder.block
        gated = builder.append_basic_block("gate")
        done = builder.append_basic_block("gate.done")
        builder.cbranch(builder.icmp_signed(">", gate, ir.Constant(i64, 0)), gated, done)
        builder.position_at_end(gated)
        alpha_vector, beta_vector = splat(builder, alpha), splat(builder, beta)
        one, nothing = ir.Constant(vector, [1.0] * lanes), zero
        swish = builder.icmp_signed("==", gate, ir.Constant(i64, 2))
        activated = []
        for value in clamped:
            h = builder.fadd(builder.fmul(value, alpha_vector), beta_vector)
            h = builder.select(builder.fcmp_unordered("<", h, one), h, one)  # h < 1 or NaN
            h = builder.select(builder.fcmp_unordered(">", h, nothing), h, nothing)
            activated.append(builder.select(swish, builder.fmul(h, value), h))
        gated_end = builder.block
        builder.branch(done)
        builder.position_at_end(done)
        results = []
        for before, after in zip(clamped, activated, strict=True):
            phi = builder.phi(vector)
            phi.add_incoming(before, entry)
            phi.add_incoming(after, gated_end)
            results.append(phi)
        return results

    @intrinsic
    def lane_count(typingctx: Any) -> Any:
        """L, a constant of the compiled kernel."""
        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            return ir.Constant(i64, lanes)

        return types.int64(), codegen

    @intrinsic
    def transpose_in(typingctx: Any, x: Any, x_at: Any, plane: Any, rows: Any, tile: Any,
                     targets: Any, targets_at: Any, count: Any, base: Any) -> Any:
        """Rows ``x[x_at + r * plane:][:L]`` for r < ``rows`` (zeros for the others: the
        channels past C) transposed, position j < ``count`` stored at
        ``tile[(base + targets[targets_at + j]) * L:][:L]``."""
        if not (is_float_array(x) and is_float_array(tile)):
            return None
        signature = types.void(x, types.int64, types.int64, types.int64, tile, targets, types.int64,
                               types.int64, types.int64)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            (x_value, x_at_v, plane_v, rows_v, tile_value, targets_value, targets_at_v, count_v,
             base_v) = args
            source = data(context, builder, sig.args[0], x_value)
            target = data(context, builder, sig.args[4], tile_value)
            offsets = builder.gep(data(context, builder, sig.args[5], targets_value), [targets_at_v])
            loaded = []
            for r in range(lanes):
                valid = builder.icmp_signed("<", ir.Constant(i64, r), rows_v)
                row = builder.select(valid, ir.Constant(i64, r), ir.Constant(i64, 0))
                at = builder.add(x_at_v, builder.mul(row, plane_v))
                value = builder.load(vector_at(builder, source, at), align=4)
                loaded.append(builder.select(valid, value, zero))
            for j, column in enumerate(_transpose(builder, loaded)):
                with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, j), count_v)):
                    into = builder.mul(builder.add(base_v, builder.load(
                        builder.gep(offsets, [ir.Constant(i64, j)]))), ir.Constant(i64, lanes))
                    builder.store(column, vector_at(builder, target, into), align=4)
            return context.get_dummy_value()

        return signature, codegen

    def positions(broadcast: bool) -> Any:
        """``positions_out`` (``broadcast`` False: the tile holds L channels per position) or
        ``positions_broadcast`` (True: the tile holds one value per position, every lane's
        input, broadcast; the lanes are L filters of a full convolution)."""
        scale = ir.Constant(i64, 1 if broadcast else lanes)

        @intrinsic
        def positions_out(typingctx: Any, tile: Any, bases: Any, bases_at: Any, offsets: Any,
                          weights: Any, w_at: Any, bias: Any, b_at: Any, low: Any, high: Any,
                          gate: Any, alpha: Any, beta: Any, out: Any, out_at: Any, plane: Any,
                          rows: Any) -> Any:
            """L output positions of L channels: position j's sum starts from
            ``bias[b_at:][:L]`` and adds ``weights[w_at + t * L:][:L]`` times
            ``tile[(bases[bases_at + j] + offsets[t]) * L:][:L]`` (broadcast: ``tile[bases[bases_at
            + j] + offsets[t]]`` in every lane) for each tap t in order, one fused multiply-add
            each; clamped into [low, high], ``gate`` 1 or 2: HardSigmoid or HardSwish (``alpha``,
            ``beta``; :func:`finish`), transposed, channel r < ``rows`` stored at
            ``out[out_at + r * plane:][:L]``."""
            if not all(map(is_float_array, (tile, weights, bias, out))):
                return None
            signature = types.void(tile, bases, types.int64, offsets, weights, types.int64, bias,
                                   types.int64, types.float32, types.float32, types.int64,
                                   types.float32, types.float32, out, types.int64, types.int64,
                                   types.int64)

            def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
                (tile_value, bases_value, bases_at_v, offsets_value, weights_value, w_at_v, bias_value,
                 b_at_v, low_v, high_v, gate_v, alpha_v, beta_v, out_value, out_at_v, plane_v,
                 rows_v) = args
                source = data(context, builder, sig.args[0], tile_value)
                base_data = builder.gep(data(context, builder, sig.args[1], bases_value), [bases_at_v])
                offset_data = data(context, builder, sig.args[3], offsets_value)
                taps_v = builder.extract_value(
                    context.make_array(sig.args[3])(context, builder, offsets_value).shape, 0)
                weight_data = builder.gep(data(context, builder, sig.args[4], weights_value), [w_at_v])
                bias_vector = builder.load(
                    vector_at(builder, data(context, builder, sig.args[6], bias_value), b_at_v), align=4)
                target = data(context, builder, sig.args[13], out_value)
                fma = cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(vector, [vector, vector, vector]),
                    f"llvm.fma.v{lanes}f32")
                # each position's window as a pointer: a tap's load is then one addressing mode
                windows = [builder.gep(source, [builder.mul(
                    builder.load(builder.gep(base_data, [ir.Constant(i64, j)])), scale)])
                    for j in range(lanes)]
                entry = builder.block
                loop = builder.append_basic_block("taps.loop")
                done = builder.append_basic_block("taps.done")
                builder.cbranch(builder.icmp_signed(">", taps_v, ir.Constant(i64, 0)), loop, done)
                builder.position_at_end(loop)
                t = builder.phi(i64)
                t.add_incoming(ir.Constant(i64, 0), entry)
                sums = []
                for _ in range(lanes):
                    phi = builder.phi(vector)
                    phi.add_incoming(bias_vector, entry)
                    sums.append(phi)
                w = builder.load(vector_at(builder, weight_data, builder.mul(t, ir.Constant(i64, lanes))),
                                 align=4)
                shift = builder.mul(builder.load(builder.gep(offset_data, [t])), scale)
                if broadcast:
                    values = [splat(builder, builder.load(builder.gep(window, [shift]), align=4))
                              for window in windows]
                else:
                    values = [builder.load(vector_at(builder, window, shift), align=4)
                              for window in windows]
                updated = [builder.call(fma, [w, value, total])
                           for value, total in zip(values, sums, strict=True)]
                finished = close_sum_loop(builder, t, taps_v, sums, updated,
                                          [bias_vector] * len(updated), entry, loop, done)
                totals = finish(builder, finished, low_v, high_v, gate_v, alpha_v, beta_v)
                for r, channel in enumerate(_transpose(builder, totals)):
                    with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, r), rows_v)):
                        at = builder.add(out_at_v, builder.mul(ir.Constant(i64, r), plane_v))
                        builder.store(channel, vector_at(builder, target, at), align=4)
                return context.get_dummy_value()

            return signature, codegen

        return positions_out

    @intrinsic
    def split_pairs(typingctx: Any, x: Any, x_at: Any, tile: Any, even_at: Any, odd_at: Any) -> Any:
        """The 2L values ``x[x_at:][:2L]`` split: the even ones to ``tile[even_at:][:L]``, the
        odd ones to ``tile[odd_at:][:L]`` (two loads, two shuffles, two stores: a row's
        columns into a stride 2's phases)."""
        if not (is_float_array(x) and is_float_array(tile)):
            return None
        signature = types.void(x, types.int64, tile, types.int64, types.int64)
        mask = ir.VectorType(ir.IntType(32), lanes)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            x_value, x_at_v, tile_value, even_v, odd_v = args
            source = data(context, builder, sig.args[0], x_value)
            target = data(context, builder, sig.args[2], tile_value)
            low = builder.load(vector_at(builder, source, x_at_v), align=4)
            high = builder.load(vector_at(builder, source, builder.add(x_at_v, ir.Constant(i64, lanes))),
                                align=4)
            for start, at in ((0, even_v), (1, odd_v)):
                part = builder.shuffle_vector(low, high, ir.Constant(
                    mask, [start + 2 * j for j in range(lanes)]))
                builder.store(part, vector_at(builder, target, at), align=4)
            return context.get_dummy_value()

        return signature, codegen

    @intrinsic
    def columns_broadcast(typingctx: Any, tile: Any, window: Any, offsets: Any, weights: Any,
                          w_at: Any, bias: Any, b_at: Any, low: Any, high: Any, gate: Any,
                          alpha: Any, beta: Any, out: Any, out_at: Any, plane: Any, rows: Any) -> Any:
        """:data:`COLUMN_VECTORS` x L consecutive output columns of L/2 filters of a full
        convolution (the lanes over the columns): filter r's sums start from
        ``bias[b_at + r]`` and add ``weights[w_at + t * L + r]`` (broadcast) times the
        values ``tile[window + offsets[t] + stride * j]`` (vectors: loaded, at stride 2 two
        loaded and their even lanes taken) for each tap t in order, one fused multiply-add
        each; clamped into [low, high], filter r < ``rows`` stored at
        ``out[out_at + r * plane:][:COLUMN_VECTORS * L]``. Reads up to ``stride *
        COLUMN_VECTORS * L`` values from a tap's first. L/2 filters by three vectors: 12
        sums in AVX2's 16 registers, each tap's broadcasts and loads fewer than its fused
        multiply-adds."""
        if not all(map(is_float_array, (tile, weights, bias, out))):
            return None
        signature = types.void(tile, types.int64, offsets, weights, types.int64, bias,
                               types.int64, types.float32, types.float32, types.int64,
                               types.float32, types.float32, out, types.int64, types.int64,
                               types.int64)
        filters, count = lanes // 2, COLUMN_VECTORS

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            (tile_value, window_v, offsets_value, weights_value, w_at_v, bias_value, b_at_v,
             low_v, high_v, gate_v, alpha_v, beta_v, out_value, out_at_v, plane_v, rows_v) = args
            source = builder.gep(data(context, builder, sig.args[0], tile_value), [window_v])
            offset_data = data(context, builder, sig.args[2], offsets_value)
            taps_v = builder.extract_value(
                context.make_array(sig.args[2])(context, builder, offsets_value).shape, 0)
            weight_data = builder.gep(data(context, builder, sig.args[3], weights_value), [w_at_v])
            bias_data = builder.gep(data(context, builder, sig.args[5], bias_value), [b_at_v])
            initial = []
            for r in range(filters):
                value = splat(builder, builder.load(builder.gep(bias_data, [ir.Constant(i64, r)]),
                                                    align=4))
                initial += [value] * count
            target = data(context, builder, sig.args[12], out_value)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vector, [vector, vector, vector]),
                f"llvm.fma.v{lanes}f32")
            entry = builder.block
            loop = builder.append_basic_block("taps.loop")
            done = builder.append_basic_block("taps.done")
            builder.cbranch(builder.icmp_signed(">", taps_v, ir.Constant(i64, 0)), loop, done)
            builder.position_at_end(loop)
            t = builder.phi(i64)
            t.add_incoming(ir.Constant(i64, 0), entry)
            sums = []
            for value in initial:
                phi = builder.phi(vector)
                phi.add_incoming(value, entry)
                sums.append(phi)
            first = builder.gep(source, [builder.load(builder.gep(offset_data, [t]))])
            values = [builder.load(vector_at(builder, first, ir.Constant(i64, v * lanes)), align=4)
                      for v in range(count)]
            weights_t = builder.gep(weight_data, [builder.mul(t, ir.Constant(i64, lanes))])
            updated = []
            for r in range(filters):
                w = splat(builder, builder.load(builder.gep(weights_t, [ir.Constant(i64, r)]), align=4))
                updated += [builder.call(fma, [w, value, sums[r * count + v]])
                            for v, value in enumerate(values)]
            finished = close_sum_loop(builder, t, taps_v, sums, updated, initial, entry, loop, done)
            totals = finish(builder, finished, low_v, high_v, gate_v, alpha_v, beta_v)
            for r in range(filters):
                with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, r), rows_v)):
                    at = builder.add(out_at_v, builder.mul(ir.Constant(i64, r), plane_v))
                    for v in range(count):
                        builder.store(totals[r * count + v], vector_at(builder, target, builder.add(
                            at, ir.Constant(i64, v * lanes))), align=4)
            return context.get_dummy_value()

        return signature, codegen

    return {"lane_count": lane_count, "transpose_in": transpose_in,
            "positions_out": positions(False), "positions_broadcast": positions(True),
            "columns_broadcast": columns_broadcast, "split_pairs": split_pairs}


_lane_count = CompiledIntrinsic(lambda numba: _build(numba)["lane_count"], "lane_count")
_transpose_in = CompiledIntrinsic(lambda numba: _build(numba)["transpose_in"], "transpose_in")
_positions_out = CompiledIntrinsic(lambda numba: _build(numba)["positions_out"], "positions_out")
_positions_broadcast = CompiledIntrinsic(lambda numba: _build(numba)["positions_broadcast"],
                                         "positions_broadcast")
_columns_broadcast = CompiledIntrinsic(lambda numba: _build(numba)["columns_broadcast"],
                                       "columns_broadcast")
_split_pairs = CompiledIntrinsic(lambda numba: _build(numba)["split_pairs"], "split_pairs")


@compiled(inline="always")
def register_gate(code: int) -> int:
    """The ``gate`` of the intrinsics for activation ``code`` of
    :data:`~onnx_light.kernels.compiled_activations.ACTIVATIONS` (-1: none): 1 for
    HardSigmoid, 2 for HardSwish, computed in registers before the sums are stored; 0 for
    none and for the others (Sigmoid, SiLU), which :func:`activate_run` applies after."""
    if code == HARD_SIGMOID:
        return 1
    return 2 if code == HARD_SWISH else 0


@compiled
def output_chunks(positions: int, out_w: int, strides: tuple[int, int], tile_w: int,
                  lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """The chunks of ``lanes`` output positions of ``positions`` (whole rows of ``out_w``):
    each chunk's first position and the tile positions of its windows' first taps (the
    tile's rows ``tile_w`` apart, the windows ``strides`` apart). The last chunk overlaps the
    one before (computed and written again, the same values); fewer than ``lanes``
    positions are one chunk, its lanes past them the last position again."""
    chunks = -(-positions // lanes)
    firsts, bases = np.empty(chunks, np.int64), np.empty(chunks * lanes, np.int64)
    for chunk in range(chunks):
        q0 = min(chunk * lanes, positions - lanes) if positions > lanes else 0
        firsts[chunk] = q0
        for j in range(lanes):
            q = q0 + min(j, positions - 1)
            bases[chunk * lanes + j] = (q // out_w) * strides[0] * tile_w + (q % out_w) * strides[1]
    return firsts, bases


@compiled
def banded_channels(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, out: np.ndarray,
                    first: int, last: int, channels: int, size: tuple[int, int],
                    output: tuple[int, int], strides: tuple[int, int], pads: tuple[int, int],
                    tile_w: int, offsets: np.ndarray, band: int, low: float, high: float,
                    code: int, alpha: float, beta: float) -> None:
    """:func:`blocked_channels` by bands of ``band`` output rows (fewer than OH, at least L
    positions; the input at least L wide): per block and band, the input rows the band's
    windows read are transposed into a tile of those rows only (row by row, L positions at a
    time, a row's last L overlapping the ones before), which stays in the first-level cache
    while the band's outputs read it. The last band overlaps the one before (its rows
    computed again, the same values). The same sums, in the same order, as the whole
    plane's tile."""
    lanes = _lane_count()
    height, width = size
    out_h, out_w = output
    taps = offsets.shape[0]
    kernel_h = offsets[taps - 1] // tile_w + 1
    tile = np.zeros(((band - 1) * strides[0] + kernel_h) * tile_w * lanes, np.float32)
    plane, out_plane = height * width, out_h * out_w
    blocks = -(-channels // lanes)
    row_chunks = -(-width // lanes)
    row_firsts = np.empty(row_chunks, np.int64)
    row_targets = np.empty(row_chunks * lanes, np.int64)  # in tile row 0
    for chunk in range(row_chunks):
        c0 = min(chunk * lanes, width - lanes)
        row_firsts[chunk] = c0
        for j in range(lanes):
            row_targets[chunk * lanes + j] = pads[1] + c0 + j
    firsts, bases = output_chunks(band * out_w, out_w, strides, tile_w, lanes)
    low32, high32 = np.float32(low), np.float32(high)
    gate, alpha32, beta32 = register_gate(code), np.float32(alpha), np.float32(beta)
    for item in range(first, last):
        n, k = item // blocks, item % blocks
        c0 = k * lanes
        rows = min(lanes, channels - c0)
        x_at = (n * channels + c0) * plane
        out_at = (n * channels + c0) * out_plane
        w_at = k * taps * lanes
        for start in range(0, out_h, band):
            b0 = min(start, out_h - band)  # the last band overlaps the one before: L positions
            for t in range((band - 1) * strides[0] + kernel_h):
                ih = b0 * strides[0] + t - pads[0]
                if 0 <= ih < height:
                    for chunk in range(row_chunks):
                        _transpose_in(x, x_at + ih * width + row_firsts[chunk], plane, rows, tile,
                                      row_targets, chunk * lanes, lanes, t * tile_w)
                else:  # a padding row (an earlier band may have held input there)
                    # unsigned: numba then emits no negative-index fix-up
                    into = np.uintp((t * tile_w + pads[1]) * lanes)
                    for j in range(np.uintp(width * lanes)):
                        tile[into + j] = 0.0
            at = out_at + b0 * out_w
            for chunk in range(firsts.shape[0]):
                _positions_out(tile, bases, chunk * lanes, offsets, weights, w_at, bias, c0, low32,
                               high32, gate, alpha32, beta32, out, at + firsts[chunk], out_plane,
                               rows)
            if code >= 0 and gate == 0:  # on the band while in cache (an overlap computed again)
                for r in range(rows):
                    activate_run(out, np.uintp(at + r * out_plane), np.uintp(band * out_w), code,
                                 alpha, beta)


@compiled
def blocked_channels(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, out: np.ndarray,
                     first: int, last: int, channels: int, size: tuple[int, int],
                     output: tuple[int, int], strides: tuple[int, int], pads: tuple[int, int],
                     tile_size: tuple[int, int], offsets: np.ndarray, band: int, low: float,
                     high: float, code: int, alpha: float, beta: float) -> None:
    """Blocks ``first:last`` (block ``n * ceil(C/L) + k``: channels Lk:Lk+L of image n) of
    ``out`` (flat N x C x OH x OW) from ``x`` (flat N x C x H x W), ``weights`` and ``bias``
    arranged by :func:`blocked_weights`; ``tile_size`` (Hp, Wp) holds the padded input and
    every window, ``offsets`` (KH*KW,) are the taps' positions in it (``kh * Wp + kw``).
    The result is clamped into [low, high], then activation ``code`` of
    :data:`~onnx_light.kernels.compiled_activations.ACTIVATIONS` (-1: none) is applied.
    ``band`` > 0: by bands of that many output rows (:func:`banded_channels`)."""
    if band > 0:
        banded_channels(x, weights, bias, out, first, last, channels, size, output, strides, pads,
                        tile_size[1], offsets, band, low, high, code, alpha, beta)
        return
    lanes = _lane_count()
    height, width = size
    out_h, out_w = output
    tile_h, tile_w = tile_size
    plane, out_plane = height * width, out_h * out_w
    blocks = -(-channels // lanes)
    taps = offsets.shape[0]
    tile = np.zeros(tile_h * tile_w * lanes, np.float32)
    scratch = np.zeros(lanes * lanes, np.float32)  # a plane of fewer than L positions, padded
    # The chunks of L positions, the same for every block: the input's first position and
    # where each goes in the tile (a plane's last chunk overlaps the one before; a plane of
    # fewer than L positions is one chunk of all of them), the output's (output_chunks).
    chunks_in, chunks_out = -(-plane // lanes), -(-out_plane // lanes)
    firsts_in = np.empty(chunks_in, np.int64)
    targets = np.empty(chunks_in * lanes, np.int64)
    firsts_out, bases = output_chunks(out_plane, out_w, strides, tile_w, lanes)
    for chunk in range(chunks_in):
        p0 = min(chunk * lanes, plane - lanes) if plane > lanes else 0
        firsts_in[chunk] = p0
        for j in range(min(lanes, plane)):
            targets[chunk * lanes + j] = ((p0 + j) // width + pads[0]) * tile_w + (p0 + j) % width + pads[1]
    low32, high32 = np.float32(low), np.float32(high)
    gate, alpha32, beta32 = register_gate(code), np.float32(alpha), np.float32(beta)
    for item in range(first, last):
        n, k = item // blocks, item % blocks
        c0 = k * lanes
        rows = min(lanes, channels - c0)
        x_at = (n * channels + c0) * plane
        if plane >= lanes:
            for chunk in range(chunks_in):
                _transpose_in(x, x_at + firsts_in[chunk], plane, rows, tile, targets, chunk * lanes,
                              lanes, 0)
        else:
            for r in range(rows):
                for j in range(plane):
                    scratch[r * lanes + j] = x[x_at + r * plane + j]
            _transpose_in(scratch, 0, lanes, rows, tile, targets, 0, plane, 0)
        out_at = (n * channels + c0) * out_plane
        w_at = k * taps * lanes
        if out_plane >= lanes:
            for chunk in range(chunks_out):
                _positions_out(tile, bases, chunk * lanes, offsets, weights, w_at, bias, c0, low32,
                               high32, gate, alpha32, beta32, out, out_at + firsts_out[chunk],
                               out_plane, rows)
        else:
            _positions_out(tile, bases, 0, offsets, weights, w_at, bias, c0, low32, high32, gate,
                           alpha32, beta32, scratch, 0, lanes, rows)
            for r in range(rows):
                for j in range(out_plane):
                    out[out_at + r * out_plane + j] = scratch[r * lanes + j]
        if code >= 0 and gate == 0:
            # unsigned: numba then emits no negative-index fix-up, and LLVM vectorises the run
            activate_run(out, np.uintp(out_at), np.uintp(rows * out_plane), code, alpha, beta)


@compiled(parallel=True)
def blocked_channels_parallel(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, out: np.ndarray,
                              first: int, last: int, channels: int, size: tuple[int, int],
                              output: tuple[int, int], strides: tuple[int, int],
                              pads: tuple[int, int], tile_size: tuple[int, int], offsets: np.ndarray,
                              band: int, low: float, high: float, code: int, alpha: float,
                              beta: float, threads: int) -> None:
    """:func:`blocked_channels` with blocks ``first:last`` split in ``threads`` contiguous
    ranges run by numba's threads (the caller has set their count), each with its own tile:
    the same values, whichever thread computes a block."""
    count = last - first
    for t in prange(threads):
        start, stop = first + t * count // threads, first + (t + 1) * count // threads
        if start < stop:
            blocked_channels(x, weights, bias, out, start, stop, channels, size, output, strides,
                             pads, tile_size, offsets, band, low, high, code, alpha, beta)


@functools.lru_cache(maxsize=256)
def tile_geometry(size: tuple[int, int], output: tuple[int, int], kernel: tuple[int, int],
                  strides: tuple[int, int], pads: tuple[int, int]) -> tuple[tuple[int, int], np.ndarray]:
    """The tile (Hp, Wp) that holds the padded input and every window, and the taps' offsets
    in it (row-major, read-only). Cached: a model has few geometries, and each run needs its
    own."""
    tile = tuple(max(p + s, (o - 1) * t + k)
                 for s, o, k, t, p in zip(size, output, kernel, strides, pads, strict=True))
    offsets = np.array([kh * tile[1] + kw for kh in range(kernel[0]) for kw in range(kernel[1])],
                       np.int64)
    offsets.flags.writeable = False
    return (tile[0], tile[1]), offsets


def band_rows(size: tuple[int, int], output: tuple[int, int], kernel: tuple[int, int],
              strides: tuple[int, int], tile: tuple[int, int]) -> int:
    """The output rows of :func:`banded_channels`' bands: as many as keep the band's tile
    within :data:`BAND_BYTES` (at least one row, and L positions); 0 (the whole plane's tile)
    where the plane's tile fits, the input is narrower than L or one band is every row."""
    lanes = vector_lanes()
    row_bytes = tile[1] * lanes * 4
    if tile[0] * row_bytes <= BAND_BYTES or size[1] < lanes:
        return 0
    band = max(1, (BAND_BYTES // row_bytes - kernel[0]) // strides[0] + 1, -(-lanes // output[1]))
    return band if band < output[0] else 0


def compile_blocked(threads: int = 1) -> None:
    """Compile :func:`blocked_channels` (or load it from numba's cache), and
    :func:`blocked_channels_parallel` for more than one thread: a session does it at
    construction, not in its first run."""
    x = read_only(np.zeros(20, np.float32))
    weights = blocked_weights(np.zeros((1, 1, 1, 1), np.float32))
    bias = read_only(np.zeros(vector_lanes(), np.float32))
    tile, offsets = tile_geometry((4, 5), (4, 5), (1, 1), (1, 1), (0, 0))
    arguments = (x, weights, bias, np.empty(20, np.float32), 0, 1, 1, (4, 5), (4, 5), (1, 1), (0, 0),
                 tile, offsets, 0, -np.inf, np.inf, -1, 1.0, 0.0)
    blocked_channels.dispatcher(*arguments)
    if region_threads(threads) > 1:
        blocked_channels_parallel.dispatcher(*arguments, 1)


@dataclass(frozen=True)
class BlockedCall:
    """The geometry of ``depthwise_blocked`` for one problem (the tile, the taps' offsets, the
    bands), made once per problem (:func:`blocked_call`), and its calls over a range of
    (image, channel) pairs (:meth:`run`): what :class:`_BlockedDepthwise`'s blocks call, and
    what a Conv kernel calls directly without the algorithm object
    (:meth:`~onnx_light.kernels.conv.kernel.ConvKernel._run_depthwise`)."""

    channels: int
    lanes: int
    size: tuple[int, int]
    output: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int]
    tile: tuple[int, int]
    offsets: np.ndarray
    band: int

    def run(self, x: np.ndarray, arranged: np.ndarray, bias: np.ndarray, out: np.ndarray,
            start: int, stop: int, clamp: tuple[float, float], activation: tuple[int, float, float],
            epilogue: Callable[[np.ndarray], None] | None, threads: int) -> None:
        """The blocks of channels whose first (image, channel) pair is in ``start:stop``, from
        flat read-only ``x``, the weights and bias arranged by :func:`blocked_weights` and
        :func:`padded_bias`, into flat float32 ``out``, clamped, then the compiled
        ``activation``; with an ``epilogue``, by blocks of about
        :data:`~onnx_light.kernels.conv.depthwise.EPILOGUE_BLOCK_BYTES`, each finished by it
        (on the output's channel planes) while in cache; on ``threads`` numba threads
        (:func:`~onnx_light.kernels.conv.depthwise.region_threads`) where a call has work
        for two."""
        channels, lanes = self.channels, self.lanes
        blocks = -(-channels // lanes)
        step = 1 << 62
        if epilogue is not None:
            step = max(1, EPILOGUE_BLOCK_BYTES // (lanes * math.prod(self.output) * 4))
            planes = out.reshape(-1, *self.output)
        for n in range(start // channels, (stop - 1) // channels + 1):
            lo = -(-max(start - n * channels, 0) // lanes)
            hi = -(-min(stop - n * channels, channels) // lanes)
            for first in range(n * blocks + lo, n * blocks + hi, step):
                last = min(n * blocks + hi, first + step)
                arguments = (x, arranged, bias, out, first, last, channels, self.size, self.output,
                             self.strides, self.pads, self.tile, self.offsets, self.band, *clamp,
                             *activation)
                if min(threads, last - first) > 1:  # a region only with work for two
                    blocked_channels_parallel.dispatcher(*arguments, min(threads, last - first))
                else:
                    blocked_channels.dispatcher(*arguments)
                if epilogue is not None:
                    c0, c1 = (first - n * blocks) * lanes, min(channels, (last - n * blocks) * lanes)
                    epilogue(planes[n * channels + c0:n * channels + c1])

    def bind(self, arranged: np.ndarray, bias: np.ndarray, pairs: int, clamp: tuple[float, float],
             activation: tuple[int, float, float], epilogue: Callable[[np.ndarray], None] | None,
             threads: int) -> Callable[[np.ndarray, np.ndarray], None]:
        """:meth:`run` over (image, channel) pairs ``0:pairs`` bound to these weights, bias and
        fused parts: ``bound(x, out)``, ``x`` flat float32 and ``out`` flat float32 of this
        call's shapes (not checked). Without an epilogue and with one numba thread
        (``threads``; plan ``region``'s count is set on each call, per calling thread), one
        compiled call over all the pairs' blocks through its compiled entry
        (:func:`~onnx_light.kernels.conv.depthwise.compiled_entry`): each block's values do
        not depend on the call that computes it, so the bits of :meth:`run`."""
        if epilogue is not None or threads > 1:
            def bound(x: np.ndarray, out: np.ndarray) -> None:
                self.run(read_only(x), arranged, bias, out, 0, pairs, clamp, activation, epilogue,
                         region_threads(threads))

            return bound
        blocks = pairs // self.channels * -(-self.channels // self.lanes)
        tail = (0, blocks, self.channels, self.size, self.output, self.strides, self.pads, self.tile,
                self.offsets, self.band, *clamp, *activation)
        return bound_entry(blocked_channels.dispatcher, read_only(np.zeros(1, np.float32)), arranged, bias,
                           np.empty(1, np.float32), tail)


@functools.lru_cache(maxsize=1024)
def blocked_call(problem: _Problem) -> BlockedCall:
    """The :class:`BlockedCall` of ``problem`` (a ``depthwise_blocked`` one), remembered per
    problem."""
    window = problem.window
    size, output = tuple(window.input), tuple(window.output)
    strides, pads = tuple(window.strides), tuple(window.begin)
    tile, offsets = tile_geometry(size, output, tuple(window.kernel), strides, pads)
    return BlockedCall(problem.channels, vector_lanes(), size, output, strides, pads, tile,
                       offsets, band_rows(size, output, tuple(window.kernel), strides, tile))


class _BlockedDepthwise(_Algorithm):
    """``depthwise_blocked``: the (image, channel) pairs a block of the plan covers computed
    by blocks of :func:`vector_lanes` channels, each block by the range holding its first
    channel (so that the ranges of a split cover every block once), through its
    :class:`BlockedCall`. ``arranged`` are the weights of :func:`blocked_weights` when the
    kernel arranged them once (constant weights); ``threads`` (the ``region`` plan) the numba
    threads each compiled call splits its blocks over."""

    uses_blas: ClassVar[bool] = False

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None,
                 arranged: np.ndarray | None = None, threads: int = 1) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        self.threads = region_threads(threads)
        self.call = blocked_call(problem)
        self.x = read_only(x.reshape(-1))
        self.flat_out = out.reshape(-1)
        self.arranged = blocked_weights(w) if arranged is None else arranged
        self.padded_bias = padded_bias(b, problem.channels)
        residual, self.clamp, self.activation, self.epilogue = fused_parts(epilogue, np.float32)
        if residual is not None:  # the residual's addition runs with the epilogue, after
            self.clamp, self.activation, self.epilogue = (-np.inf, np.inf), (-1, 1.0, 0.0), epilogue

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        """The blocks of channels whose first (image, channel) pair is in ``start:stop``."""
        self.call.run(self.x, self.arranged, self.padded_bias, self.flat_out, start, stop,
                      self.clamp, self.activation, self.epilogue, self.threads)
