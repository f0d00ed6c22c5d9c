"""Conv's ``depthwise_blocked`` algorithm: a float32 2-D depthwise convolution that computes
16 channels at once, one per lane of an AVX-512 vector, for the small planes and strided
convolutions where the per-channel kernel (:mod:`~onnx_light.kernels.conv.depthwise`) spends
more on each channel's fixed cost than on its arithmetic (rows of 7 to 14 floats fill less
than one vector).

Per block of 16 channels of one image (:func:`blocked_channels`):

* the block's input is transposed into a channel-last *tile* ``(Hp, Wp, 16)`` with a zero
  border (the padding): 16 positions of the 16 channels at a time, transposed in registers
  (:data:`_transpose_in`);
* each output position is the bias plus the sum over its window's taps of 16-lane fused
  multiply-adds, 16 positions at a time in 16 vector registers (:data:`_positions_out`),
  then clamped (a fused Relu or Clip), transposed back and stored into the channels' NCHW
  planes; a fused compiled activation (SiLU, HardSwish, ...) follows on the block's
  channels while they are in cache.

The weights are arranged once per weight set as ``(C/16, K*K, 16)`` (:func:`blocked_weights`;
channels past C are zero), the bias as ``(C/16 * 16,)``. numba does not vectorise a 16-lane
loop over arrays that may alias, so the vector code is LLVM IR written through numba's
``intrinsic``; it needs AVX-512 (:func:`available`), where
it is not, ``depthwise`` computes these convolutions. A plane's last 16 positions overlap
the chunk before them (computed and written again, the same values), and a plane of fewer
than 16 goes through a 16 x 16 scratch block, so that no vector reads or writes outside the
arrays.

Numerics: every output is ``bias``, then plus ``w[kh, kw] * x[...]`` for the taps in row-major
order (kh, then kw), each step one fused multiply-add (one rounding), from the bias: within the
bound of :mod:`~onnx_light.kernels.conv.numerics` (a sum of K*K + 1 terms). NaN and infinities
propagate as IEEE arithmetic says (the padding is zeros times the weights, as the reference's
padded input), the clamp keeps NaN. A lane's sum never depends on the other lanes, the block
or the thread that computes it: the same bits at any thread count.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from ..compiled import CompiledIntrinsic, compiled, host_features
from ..compiled_activations import activate_run
from .blocks import _Algorithm
from .depthwise import EPILOGUE_BLOCK_BYTES, read_only
from .finish import fused_parts
from .problem import _Problem

__all__ = ["LANES", "available", "blocked_applies", "blocked_channels", "blocked_weights",
           "compile_blocked"]

LANES = 16  # channels per block: float32 lanes of one AVX-512 vector


def available() -> bool:
    """Whether the processor LLVM compiles for has AVX-512F (the kernel's 16-lane vectors)."""
    return "avx512f" in host_features()


def blocked_applies(dtype: np.dtype, window_rank: int, group_channels: int, groups: int,
                    filters: int, dilations: tuple[int, ...]) -> bool:
    """Whether ``depthwise_blocked`` computes a convolution: float32, 2-D, one input channel
    and one filter per group, dilation 1, on a processor with AVX-512."""
    return (np.dtype(dtype) == np.float32 and window_rank == 2 and group_channels == 1
            and groups > 1 and filters == groups and all(d == 1 for d in dilations)
            and available())


def blocked_weights(w: np.ndarray) -> np.ndarray:
    """Depthwise weights (C, 1, KH, KW) as ``(ceil(C/16), KH*KW, 16)`` float32, the channels
    past C zero (read-only): one contiguous vector per block and tap."""
    channels, taps = w.shape[0], math.prod(w.shape[2:])
    blocks = -(-channels // LANES)
    arranged = np.zeros((blocks * LANES, taps), np.float32)
    arranged[:channels] = w.reshape(channels, taps)
    return read_only(np.ascontiguousarray(arranged.reshape(blocks, LANES, taps).transpose(0, 2, 1)))


def _transpose(builder: Any, rows: list[Any]) -> list[Any]:
    """16 vectors of 16 lanes transposed (lane j of vector i to lane i of vector j): four
    butterfly stages, each swapping one bit of the lane and vector indices."""
    from llvmlite import ir

    mask_type = ir.VectorType(ir.IntType(32), LANES)
    rows = list(rows)
    for bit in (1, 2, 4, 8):
        low = ir.Constant(mask_type, [j if not j & bit else LANES + (j ^ bit) for j in range(LANES)])
        high = ir.Constant(mask_type, [LANES + j if j & bit else j ^ bit for j in range(LANES)])
        for i in range(LANES):
            if not i & bit:
                a, b = rows[i], rows[i | bit]
                rows[i], rows[i | bit] = (builder.shuffle_vector(a, b, low),
                                          builder.shuffle_vector(a, b, high))
    return rows


@functools.cache
def _build(numba: ModuleType) -> dict[str, Any]:
    """The two intrinsics (built once, when numba is loaded)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    f32, i64 = ir.FloatType(), ir.IntType(64)
    vector = ir.VectorType(f32, LANES)
    zero = ir.Constant(vector, [0.0] * LANES)

    def data(context: Any, builder: Any, array_type: Any, array: Any) -> Any:
        return context.make_array(array_type)(context, builder, array).data

    def vector_at(builder: Any, base: Any, offset: Any) -> Any:
        return builder.bitcast(builder.gep(base, [offset]), vector.as_pointer())

    def splat(builder: Any, scalar: Any) -> Any:
        single = builder.insert_element(ir.Constant(vector, ir.Undefined), scalar,
                                        ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(single, ir.Constant(vector, ir.Undefined),
                                      ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))

    def is_float_array(value: Any) -> bool:
        return isinstance(value, types.Array) and value.dtype == types.float32

    @intrinsic
    def transpose_in(typingctx: Any, x: Any, x_at: Any, plane: Any, rows: Any, tile: Any,
                     targets: Any, count: Any) -> Any:
        """Rows ``x[x_at + r * plane:][:16]`` for r < ``rows`` (zeros for the others: the
        channels past C) transposed, position j < ``count`` stored at
        ``tile[targets[j] * 16:][:16]``."""
        if not (is_float_array(x) and is_float_array(tile)):
            return None
        signature = types.void(x, types.int64, types.int64, types.int64, tile, targets, types.int64)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            x_value, x_at_v, plane_v, rows_v, tile_value, targets_value, count_v = args
            source = data(context, builder, sig.args[0], x_value)
            target = data(context, builder, sig.args[4], tile_value)
            offsets = data(context, builder, sig.args[5], targets_value)
            loaded = []
            for r in range(LANES):
                valid = builder.icmp_signed("<", ir.Constant(i64, r), rows_v)
                row = builder.select(valid, ir.Constant(i64, r), ir.Constant(i64, 0))
                at = builder.add(x_at_v, builder.mul(row, plane_v))
                value = builder.load(vector_at(builder, source, at), align=4)
                loaded.append(builder.select(valid, value, zero))
            for j, column in enumerate(_transpose(builder, loaded)):
                with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, j), count_v)):
                    into = builder.mul(builder.load(builder.gep(offsets, [ir.Constant(i64, j)])),
                                       ir.Constant(i64, LANES))
                    builder.store(column, vector_at(builder, target, into), align=4)
            return context.get_dummy_value()

        return signature, codegen

    @intrinsic
    def positions_out(typingctx: Any, tile: Any, bases: Any, offsets: Any, weights: Any,
                      w_at: Any, bias: Any, b_at: Any, low: Any, high: Any, out: Any,
                      out_at: Any, plane: Any, rows: Any) -> Any:
        """16 output positions of 16 channels: position j's sum starts from
        ``bias[b_at:][:16]`` and adds ``weights[w_at + t * 16:][:16]`` times
        ``tile[(bases[j] + offsets[t]) * 16:][:16]`` for each tap t in order, one fused
        multiply-add each; clamped into [low, high], transposed, channel r < ``rows``
        stored at ``out[out_at + r * plane:][:16]``."""
        if not all(map(is_float_array, (tile, weights, bias, out))):
            return None
        signature = types.void(tile, bases, offsets, weights, types.int64, bias, types.int64,
                               types.float32, types.float32, out, types.int64, types.int64,
                               types.int64)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            (tile_value, bases_value, offsets_value, weights_value, w_at_v, bias_value, b_at_v,
             low_v, high_v, out_value, out_at_v, plane_v, rows_v) = args
            source = data(context, builder, sig.args[0], tile_value)
            base_data = data(context, builder, sig.args[1], bases_value)
            offset_data = data(context, builder, sig.args[2], offsets_value)
            taps_v = builder.extract_value(
                context.make_array(sig.args[2])(context, builder, offsets_value).shape, 0)
            weight_data = builder.gep(data(context, builder, sig.args[3], weights_value), [w_at_v])
            bias_vector = builder.load(
                vector_at(builder, data(context, builder, sig.args[5], bias_value), b_at_v), align=4)
            target = data(context, builder, sig.args[9], out_value)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vector, [vector, vector, vector]), "llvm.fma.v16f32")
            bases = [builder.mul(builder.load(builder.gep(base_data, [ir.Constant(i64, j)])),
                                 ir.Constant(i64, LANES)) for j in range(LANES)]
            entry = builder.block
            loop = builder.append_basic_block("taps.loop")
            done = builder.append_basic_block("taps.done")
            builder.cbranch(builder.icmp_signed(">", taps_v, ir.Constant(i64, 0)), loop, done)
            builder.position_at_end(loop)
            t = builder.phi(i64)
            t.add_incoming(ir.Constant(i64, 0), entry)
            sums = []
            for _ in range(LANES):
                phi = builder.phi(vector)
                phi.add_incoming(bias_vector, entry)
                sums.append(phi)
            w = builder.load(vector_at(builder, weight_data, builder.mul(t, ir.Constant(i64, LANES))),
                             align=4)
            shift = builder.mul(builder.load(builder.gep(offset_data, [t])), ir.Constant(i64, LANES))
            updated = [builder.call(fma, [w, builder.load(vector_at(builder, source,
                                                                    builder.add(base, shift)),
                                                          align=4), total])
                       for base, total in zip(bases, sums, strict=True)]
            following = builder.add(t, ir.Constant(i64, 1))
            body_end = builder.block
            t.add_incoming(following, body_end)
            for phi, value in zip(sums, updated, strict=True):
                phi.add_incoming(value, body_end)
            builder.cbranch(builder.icmp_signed("<", following, taps_v), loop, done)
            builder.position_at_end(done)
            finished = []
            for value in updated:
                phi = builder.phi(vector)
                phi.add_incoming(bias_vector, entry)
                phi.add_incoming(value, body_end)
                finished.append(phi)
            low_vector, high_vector = splat(builder, low_v), splat(builder, high_v)
            totals = []
            for phi in finished:
                # numpy's maximum then minimum, NaN kept: a comparison and a select each
                clamped = builder.select(builder.fcmp_ordered("<", phi, low_vector), low_vector, phi)
                totals.append(builder.select(builder.fcmp_ordered(">", clamped, high_vector),
                                             high_vector, clamped))
            for r, channel in enumerate(_transpose(builder, totals)):
                with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, r), rows_v)):
                    at = builder.add(out_at_v, builder.mul(ir.Constant(i64, r), plane_v))
                    builder.store(channel, vector_at(builder, target, at), align=4)
            return context.get_dummy_value()

        return signature, codegen

    return {"transpose_in": transpose_in, "positions_out": positions_out}


_transpose_in = CompiledIntrinsic(lambda numba: _build(numba)["transpose_in"], "transpose_in")
_positions_out = CompiledIntrinsic(lambda numba: _build(numba)["positions_out"], "positions_out")


@compiled
def blocked_channels(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, out: np.ndarray,
                     first: int, last: int, channels: int, size: tuple[int, int],
                     output: tuple[int, int], strides: tuple[int, int], pads: tuple[int, int],
                     tile_size: tuple[int, int], offsets: np.ndarray, low: float, high: float,
                     code: int, alpha: float, beta: float) -> None:
    """Blocks ``first:last`` (block ``n * ceil(C/16) + k``: channels 16k:16k+16 of image n) of
    ``out`` (flat N x C x OH x OW) from ``x`` (flat N x C x H x W), ``weights`` and ``bias``
    arranged by :func:`blocked_weights`; ``tile_size`` (Hp, Wp) holds the padded input and
    every window, ``offsets`` (KH*KW,) are the taps' positions in it (``kh * Wp + kw``).
    The result is clamped into [low, high], then activation ``code`` of
    :data:`~onnx_light.kernels.compiled_activations.ACTIVATIONS` (-1: none) is applied."""
    height, width = size
    out_h, out_w = output
    tile_h, tile_w = tile_size
    plane, out_plane = height * width, out_h * out_w
    blocks = -(-channels // 16)
    taps = offsets.shape[0]
    tile = np.zeros(tile_h * tile_w * 16, np.float32)
    scratch = np.zeros(16 * 16, np.float32)  # a plane of fewer than 16 positions, padded
    targets = np.empty(16, np.int64)
    bases = np.empty(16, np.int64)
    low32, high32 = np.float32(low), np.float32(high)
    for item in range(first, last):
        n, k = item // blocks, item % blocks
        c0 = k * 16
        rows = min(16, channels - c0)
        x_at = (n * channels + c0) * plane
        for start in range(0, plane, 16):
            # the last 16 positions overlap the chunk before (written again, the same values)
            p0 = max(0, min(start, plane - 16))
            count = min(16, plane - p0)
            ih, iw = p0 // width, p0 % width
            for j in range(count):
                targets[j] = (ih + pads[0]) * tile_w + iw + pads[1]
                iw += 1
                if iw == width:
                    ih, iw = ih + 1, 0
            if count == 16:
                _transpose_in(x, x_at + p0, plane, rows, tile, targets, count)
            else:  # a plane of fewer than 16 positions
                for r in range(rows):
                    for j in range(count):
                        scratch[r * 16 + j] = x[x_at + r * plane + j]
                _transpose_in(scratch, 0, 16, rows, tile, targets, count)
        out_at = (n * channels + c0) * out_plane
        for start in range(0, out_plane, 16):
            q0 = max(0, min(start, out_plane - 16))
            count = min(16, out_plane - q0)
            oh, ow = q0 // out_w, q0 % out_w
            for j in range(16):
                bases[j] = oh * strides[0] * tile_w + ow * strides[1]
                if j < count - 1:
                    ow += 1
                    if ow == out_w:
                        oh, ow = oh + 1, 0
            if count == 16:
                _positions_out(tile, bases, offsets, weights, k * taps * 16, bias, c0, low32, high32,
                               out, out_at + q0, out_plane, rows)
            else:
                _positions_out(tile, bases, offsets, weights, k * taps * 16, bias, c0, low32, high32,
                               scratch, 0, 16, rows)
                for r in range(rows):
                    for j in range(count):
                        out[out_at + r * out_plane + j] = scratch[r * 16 + j]
        if code >= 0:
            # unsigned: numba then emits no negative-index fix-up, and LLVM vectorises the run
            activate_run(out, np.uintp(out_at), np.uintp(rows * out_plane), code, alpha, beta)


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


def compile_blocked() -> None:
    """Compile :func:`blocked_channels` (or load it from numba's cache): a session does it at
    construction, not in its first run."""
    x = read_only(np.zeros(20, np.float32))
    weights = blocked_weights(np.zeros((1, 1, 1, 1), np.float32))
    bias = read_only(np.zeros(16, np.float32))
    tile, offsets = tile_geometry((4, 5), (4, 5), (1, 1), (1, 1), (0, 0))
    blocked_channels.dispatcher(x, weights, bias, np.empty(20, np.float32), 0, 1, 1, (4, 5), (4, 5),
                                (1, 1), (0, 0), tile, offsets, -np.inf, np.inf, -1, 1.0, 0.0)


class _BlockedDepthwise(_Algorithm):
    """``depthwise_blocked``: the (image, channel) pairs a block of the plan covers computed
    by 16-channel blocks, each block by the range holding its first channel (so that the
    ranges of a split cover every block once). ``arranged`` are the weights of
    :func:`blocked_weights` when the kernel arranged them once (constant weights)."""

    uses_blas: ClassVar[bool] = False

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None,
                 arranged: np.ndarray | None = None) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        window = problem.window
        channels = problem.channels
        self.channels = channels
        self.blocks = -(-channels // LANES)
        self.x = read_only(x.reshape(-1))
        self.flat_out = out.reshape(-1)
        self.planes = out.reshape(-1, *problem.window.output)
        self.arranged = blocked_weights(w) if arranged is None else arranged
        if b is not None and channels % LANES == 0:
            self.padded_bias = read_only(b.reshape(-1))
        else:
            padded = np.zeros(self.blocks * LANES, np.float32)
            if b is not None:
                padded[:channels] = b
            self.padded_bias = read_only(padded)
        self.size, self.output = tuple(window.input), tuple(window.output)
        self.strides, self.pads = tuple(window.strides), tuple(window.begin)
        self.tile, self.offsets = tile_geometry(self.size, self.output, tuple(window.kernel),
                                                self.strides, self.pads)
        residual, self.clamp, self.activation, self.epilogue = fused_parts(epilogue, np.float32)
        if residual is not None:  # the residual's addition runs with the epilogue, after
            self.clamp, self.activation, self.epilogue = (-np.inf, np.inf), (-1, 1.0, 0.0), epilogue
        block_bytes_out = LANES * math.prod(self.output) * 4
        self.step = (max(1, EPILOGUE_BLOCK_BYTES // block_bytes_out) if self.epilogue is not None
                     else 1 << 62)
        self.kernel = blocked_channels.dispatcher

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        """The 16-channel blocks whose first (image, channel) pair is in ``start:stop``."""
        channels, blocks = self.channels, self.blocks
        for n in range(start // channels, (stop - 1) // channels + 1):
            lo = -(-max(start - n * channels, 0) // LANES)
            hi = -(-min(stop - n * channels, channels) // LANES)
            for first in range(n * blocks + lo, n * blocks + hi, self.step):
                last = min(n * blocks + hi, first + self.step)
                self.kernel(self.x, self.arranged, self.padded_bias, self.flat_out, first, last,
                            channels, self.size, self.output, self.strides, self.pads, self.tile,
                            self.offsets, *self.clamp, *self.activation)
                if self.epilogue is not None:
                    c0, c1 = (first - n * blocks) * LANES, min(channels, (last - n * blocks) * LANES)
                    self.epilogue(self.planes[n * channels + c0:n * channels + c1])
