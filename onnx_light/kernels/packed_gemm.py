"""Products with constant float32 weights packed once: ``A @ W (+ bias)`` by a register-blocked
compiled kernel instead of a BLAS call that packs W again on every call.

A MatMul or Gemm whose B is a constant (the weights of a linear layer) gets its B packed at
the session's construction (:class:`PackedWeights`): the columns in panels of :data:`NR`,
each panel ``(K, NR)`` contiguous and zero-padded past N, so that the micro-kernel reads one
contiguous row of a panel per step of the sum. The micro-kernel (:func:`_tile`, LLVM vector
code written through numba's ``intrinsic``) keeps an ``MR x NR`` block of the output in 24
AVX-512 registers, adds ``a[i, p] * panel[p, :]`` for p = 0..K-1 with fused multiply-adds,
then adds the bias (when there is one) and stores the block once. It needs AVX-512
(:func:`available`): with fewer, wider-than-the-machine vectors would spill. A's rows go in
blocks of :data:`BLOCK_A_BYTES` that every panel passes over in turn (:func:`packed_rows`), and
a caller may split the rows across a thread pool in chunks of whole ``MR``-row blocks. The
panels may also be a matrix read in place, each step of a panel ``NR`` contiguous values of
one of its rows (``packed_rows``'s ``b_layout``: a 1x1 convolution's input rows, its columns
past the last whole panel packed by :func:`pack_panels`).

Numerics. Each output element is ``sum_p a[i, p] w[p, j]`` summed in order of p from +0 in
float32 with one rounding per fused multiply-add, then ``+ bias[j]`` rounded once: one of the
orders the BLAS bound of ``gemm.py`` covers (``|Y - exact| <= K u sum |a||w|`` to first
order), and the bias is added to the rounded product as the unfused Add does. NaN and
infinities propagate as IEEE arithmetic says; a sum of only negative zeros is +0, as BLAS
gives it. The blocks and chunks of rows change only who computes an element and when, never its
sum's order: the same bits at any block size and thread count.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from ..parallel import ThreadPool
from .compiled import CompiledFunction, compiled, load_numba

__all__ = ["BLOCK_A_BYTES", "MR", "NR", "PackedWeights", "aligned_empty", "available", "pack_panels",
           "packed_layout", "packed_rows"]

MR = 6  # rows of the output block the micro-kernel keeps in registers
_VECTORS = 4  # 16-float vectors per row of the block
NR = 16 * _VECTORS  # columns of the block: one panel of packed weights
_AHEAD = 32  # steps of the sum ahead that the first block of rows prefetches its panel
KC = 128  # steps of the sum per pass over the rows: a (KC, NR) part of a panel stays in L1
#: The size (in bytes) of the blocks of rows of A that every panel passes over in turn: a
#: block stays in the L2 cache while the panels stream past it.
BLOCK_A_BYTES = 1 << 19


@functools.cache
def available() -> bool:
    """Whether this process can run the packed products: numba loads and LLVM's host has
    AVX-512F (the micro-kernel's 24 accumulators are 512-bit registers)."""
    try:
        load_numba()
        from llvmlite import binding
    except ImportError:
        return False
    return bool(binding.get_host_cpu_features().get("avx512f", False))


def _build_tile(numba: Any, height: int = MR, vectors: int = _VECTORS) -> Any:
    """numba's ``intrinsic`` ``_tile(a, b, out, bias, i0, b_start, b_step, b_ahead, bias_start,
    rows, out_row, out_column, with_bias, prefetch, start, stop, accumulate)``: rows i0..i0+rows-1
    (rows <= ``height``) of ``a`` (M, K) times steps ``start..stop-1`` of a panel of B, the
    ``NR`` contiguous values of its step p at ``b``'s element ``b_start + p * b_step`` (a
    packed panel of (P, K, NR) ``panels``: ``b_start = panel * K * NR``, ``b_step = NR``), added
    to the partial sums already in the output block when ``accumulate`` (else to +0), plus
    ``bias[bias_start:][:NR]`` when ``with_bias``, stored in ``out[out_row:out_row + rows,
    out_column:out_column + NR]``; ``prefetch`` fetches, at each step, the ``NR`` values
    ``b_ahead`` elements further (``_AHEAD * NR`` in packed panels: :data:`_AHEAD` steps ahead).
    Rows past ``rows`` read the last valid row of ``a`` and ``out`` and are not stored. With
    ``vectors`` below 4 the block is ``16 * vectors`` columns wide (the panel's first ones)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    f32 = ir.FloatType()
    vector = ir.VectorType(f32, 16)
    i32, i64 = ir.IntType(32), ir.IntType(64)
    zero = ir.Constant(vector, [0.0] * 16)
    broadcast = ir.Constant(ir.VectorType(i32, 16), [0] * 16)

    def constant(value: int) -> ir.Constant:
        return ir.Constant(i64, value)

    def load_vector(builder: Any, pointer: Any, offset: int) -> Any:
        return builder.load(builder.bitcast(builder.gep(pointer, [constant(offset)]),
                                            vector.as_pointer()), align=4)

    @intrinsic
    def tile(typingctx, a, b, out, bias, i0, b_start, b_step, b_ahead, bias_start, rows, out_row,
             out_column, with_bias, prefetch, start, stop, accumulate):
        signature = types.void(a, b, out, bias, types.int64, types.int64, types.int64, types.int64,
                               types.int64, types.int64, types.int64, types.int64, types.boolean,
                               types.boolean, types.int64, types.int64, types.boolean)

        def codegen(context, builder, sig, args):
            a_value, panels_value, out_value, bias_value = args[:4]
            i0_v, b_start_v, b_step_v, ahead_offset, bias_start_v, rows_v, out_row_v = args[4:11]
            out_column_v, with_bias_v, prefetch_v, start_v, stop_v, accumulate_v = args[11:]
            a_array = context.make_array(sig.args[0])(context, builder, a_value)
            panel_array = context.make_array(sig.args[1])(context, builder, panels_value)
            out_array = context.make_array(sig.args[2])(context, builder, out_value)
            bias_array = context.make_array(sig.args[3])(context, builder, bias_value)
            k = builder.extract_value(a_array.shape, 1)
            ldc = builder.extract_value(out_array.shape, 1)
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vector, [vector, vector, vector]), "llvm.fma.v16f32")
            fetch = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]),
                "llvm.prefetch")
            last = builder.sub(rows_v, constant(1))
            a_rows, targets = [], []
            for r in range(height):
                row = builder.select(builder.icmp_signed("<", constant(r), rows_v), constant(r), last)
                a_rows.append(builder.gep(a_array.data, [builder.mul(builder.add(i0_v, row), k)]))
                offset = builder.add(builder.mul(builder.add(out_row_v, row), ldc), out_column_v)
                targets.append(builder.gep(out_array.data, [offset]))
            # the partial sums of the steps before ``start``, read only when there are some: a
            # first pass must not wait for the output's (cold) lines before its first step
            with builder.if_else(accumulate_v) as (stored, fresh):
                with stored:
                    partial = [load_vector(builder, target, 16 * q) for target in targets
                               for q in range(vectors)]
                    stored_block = builder.block
                with fresh:
                    fresh_block = builder.block
            initial = []
            for value in partial:
                phi = builder.phi(vector)
                phi.add_incoming(value, stored_block)
                phi.add_incoming(zero, fresh_block)
                initial.append(phi)
            panel_start = builder.gep(panel_array.data, [b_start_v])
            entry = builder.block
            loop = builder.append_basic_block("tile.loop")
            done = builder.append_basic_block("tile.done")
            builder.cbranch(builder.icmp_signed(">", stop_v, start_v), loop, done)
            builder.position_at_end(loop)
            p = builder.phi(i64)
            p.add_incoming(start_v, entry)
            sums = []
            for value in initial:
                phi = builder.phi(vector)
                phi.add_incoming(value, entry)
                sums.append(phi)
            step = builder.gep(panel_start, [builder.mul(p, b_step_v)])
            with builder.if_then(prefetch_v):
                for q in range(vectors):
                    ahead = builder.gep(step, [builder.add(ahead_offset, constant(16 * q))])
                    builder.call(fetch, [builder.bitcast(ahead, ir.IntType(8).as_pointer()),
                                         ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            w = [load_vector(builder, step, 16 * q) for q in range(vectors)]
            updated = []
            for r in range(height):
                scalar = builder.load(builder.gep(a_rows[r], [p]))
                splat = builder.shuffle_vector(
                    builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, ir.Constant(i32, 0)),
                    ir.Constant(vector, ir.Undefined), broadcast)
                for q in range(vectors):
                    updated.append(builder.call(fma, [splat, w[q], sums[vectors * r + q]]))
            following = builder.add(p, constant(1))
            body_end = builder.block
            p.add_incoming(following, body_end)
            for phi, value in zip(sums, updated, strict=True):
                phi.add_incoming(value, body_end)
            builder.cbranch(builder.icmp_signed("<", following, stop_v), loop, done)
            builder.position_at_end(done)
            totals = []
            for before, value in zip(initial, updated, strict=True):
                phi = builder.phi(vector)
                phi.add_incoming(before, entry)
                phi.add_incoming(value, body_end)
                totals.append(phi)
            bias_start = builder.gep(bias_array.data, [bias_start_v])
            biases = [builder.select(with_bias_v, load_vector(builder, bias_start, 16 * q), zero)
                      for q in range(vectors)]
            for r in range(height):
                with builder.if_then(builder.icmp_signed("<", constant(r), rows_v)):
                    for q in range(vectors):
                        builder.store(builder.fadd(totals[vectors * r + q], biases[q]),
                                      builder.bitcast(builder.gep(targets[r], [constant(16 * q)]),
                                                      vector.as_pointer()), align=4)
            return context.get_dummy_value()

        return signature, codegen

    return tile


class _Intrinsic(CompiledFunction):
    """A numba ``intrinsic`` built on first use, called by compiled kernels like one of them."""

    def __init__(self, build: Any) -> None:
        super().__init__(build, {})
        self.build = build

    @functools.cached_property
    def dispatcher(self) -> Any:
        return self.build(load_numba())


_tile = _Intrinsic(_build_tile)
_tile2 = _Intrinsic(functools.partial(_build_tile, height=2))  # the last 1 or 2 rows
_tile4 = _Intrinsic(functools.partial(_build_tile, height=4))  # the last 3 or 4 rows
# the last panel's first 16, 32 or 48 columns, where it has no more
_tile16 = _Intrinsic(functools.partial(_build_tile, vectors=1))
_tile32 = _Intrinsic(functools.partial(_build_tile, vectors=2))
_tile48 = _Intrinsic(functools.partial(_build_tile, vectors=3))


@compiled
def packed_rows(a: np.ndarray, b: np.ndarray, b_layout: tuple[int, int, int, int],
                bias: np.ndarray, with_bias: bool, out: np.ndarray, first: int, last: int,
                block: int, out_row: int, out_column: int, n: int) -> None:
    """Rows ``first..last-1`` of ``a @ B (+ bias)`` for C-contiguous float32 ``a`` (M, K) and B
    (K, n) in panels of ``NR`` columns read from ``b``, ``b_layout = (start, panel, step,
    ahead)``: panel q's step p is the ``NR`` contiguous values from element ``start + q * panel
    + p * step`` (every one of them readable, past n too), and the first block of rows
    prefetches the values ``ahead`` elements further (W packed in (P, K, NR) ``panels``:
    :func:`packed_layout`); ``bias``
    padded to a multiple of NR values. Row i and column j land in ``out[out_row + i,
    out_column + j]`` (C-contiguous 2-D). The rows go in blocks of ``block``: every panel passes
    over one block of A before the next block, so that the block stays in the L2 cache. Each
    element's sum runs in the same order whatever the rows and the block are."""
    for top in range(first, last, block):
        _panels_over_rows(a, b, b_layout, bias, with_bias, out, top, min(last, top + block),
                          out_row, out_column, n)


@compiled
def _panels_over_rows(a: np.ndarray, b: np.ndarray, b_layout: tuple[int, int, int, int],
                      bias: np.ndarray, with_bias: bool, out: np.ndarray, first: int, last: int,
                      out_row: int, out_column: int, n: int) -> None:
    """Rows ``first..last-1`` of the product, every panel over all of them."""
    b_start, b_panel, b_step, b_ahead = b_layout
    k = a.shape[1]
    chunks = max(1, -(-k // KC))
    edge = np.empty((MR, NR), np.float32)
    for panel in range(-(-n // NR)):
        column = panel * NR
        width = min(NR, n - column)
        start_b = b_start + panel * b_panel
        if width == NR:
            for chunk in range(chunks):
                start, stop = chunk * KC, min(k, (chunk + 1) * KC)
                finished = with_bias and stop == k
                for i0 in range(first, last, MR):
                    rows = min(MR, last - i0)
                    if rows > 4:
                        _tile(a, b, out, bias, i0, start_b, b_step, b_ahead, column, rows,
                              out_row + i0, out_column + column, finished, i0 == first, start, stop,
                              chunk > 0)
                    elif rows > 2:
                        _tile4(a, b, out, bias, i0, start_b, b_step, b_ahead, column, rows,
                               out_row + i0, out_column + column, finished, i0 == first, start, stop,
                               chunk > 0)
                    else:
                        _tile2(a, b, out, bias, i0, start_b, b_step, b_ahead, column, rows,
                               out_row + i0, out_column + column, finished, i0 == first, start, stop,
                               chunk > 0)
            continue
        vectors = -(-width // 16)
        for i0 in range(first, last, MR):
            rows = min(MR, last - i0)
            for chunk in range(chunks):
                start, stop = chunk * KC, min(k, (chunk + 1) * KC)
                finished, prefetch, accumulate = with_bias and stop == k, i0 == first, chunk > 0
                if vectors == 1:
                    _tile16(a, b, edge, bias, i0, start_b, b_step, b_ahead, column, rows, 0, 0,
                            finished, prefetch, start, stop, accumulate)
                elif vectors == 2:
                    _tile32(a, b, edge, bias, i0, start_b, b_step, b_ahead, column, rows, 0, 0,
                            finished, prefetch, start, stop, accumulate)
                elif vectors == 3:
                    _tile48(a, b, edge, bias, i0, start_b, b_step, b_ahead, column, rows, 0, 0,
                            finished, prefetch, start, stop, accumulate)
                else:
                    _tile(a, b, edge, bias, i0, start_b, b_step, b_ahead, column, rows, 0, 0,
                          finished, prefetch, start, stop, accumulate)
            for r in range(rows):
                for c in range(width):
                    out[out_row + i0 + r, out_column + column + c] = edge[r, c]


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary (numpy's
    start 16 bytes past one): the micro-kernel's 64-byte stores then each fill one cache line
    where the rows are multiples of 64 bytes, instead of straddling two."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    raw = np.empty(count * dtype.itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


@compiled(inline="always")
def packed_layout(k: int) -> tuple[int, int, int, int]:
    """:func:`packed_rows`'s ``b_layout`` of panels (P, k, NR) packed contiguously."""
    return (0, k * NR, NR, _AHEAD * NR)


@compiled
def pack_panels(source: np.ndarray, offset: int, stride: int, depth: int, columns: int,
                panels: np.ndarray) -> None:
    """Pack ``columns`` columns of a (``depth``, ...) matrix read from the flat ``source``
    (element (k, j) at ``offset + k * stride + j``) into the first ``ceil(columns / NR)``
    panels of ``panels`` (P, depth, NR), zero past ``columns``: the operand a caller packs per
    call (a convolution's input) rather than once."""
    flat = panels.reshape(-1)
    for panel in range(-(-columns // NR)):
        column = panel * NR
        width = np.uintp(min(NR, columns - column))
        for k in range(depth):
            source_row = np.uintp(offset + k * stride + column)
            target_row = np.uintp((panel * depth + k) * NR)
            for c in range(width):
                flat[target_row + c] = source[source_row + c]
            for c in range(width, np.uintp(NR)):
                flat[target_row + c] = 0.0


class PackedWeights:
    """A constant float32 matrix W (K, N) packed for :func:`packed_rows`, with an optional
    bias (N values) added to every row of the product."""

    def __init__(self, w: np.ndarray, bias: np.ndarray | None = None) -> None:
        k, n = w.shape
        count = -(-n // NR)
        panels = np.zeros((count, k, NR), np.float32)
        for panel in range(count):
            part = w[:, panel * NR:(panel + 1) * NR]
            panels[panel, :, :part.shape[1]] = part
        self.k, self.n = k, n
        self.panels = panels
        self.layout = packed_layout(k)
        self.bias = np.zeros(count * NR, np.float32)
        self.with_bias = bias is not None
        if bias is not None:
            self.bias[:n] = bias.reshape(-1)
        self._function = packed_rows.dispatcher
        self.block = max(MR, BLOCK_A_BYTES // (4 * max(k, 1)) // MR * MR)

    def weights(self) -> np.ndarray:
        """W again (K, N), rebuilt from the panels (bit for bit: they are W's values), a new
        read-only array."""
        w = np.ascontiguousarray(self.panels.transpose(1, 0, 2).reshape(self.k, -1)[:, :self.n])
        w.flags.writeable = False
        return w

    def compile(self) -> None:
        """Compile (or load from numba's disk cache) the product now."""
        self.multiply(np.zeros((1, self.k), np.float32))

    def multiply(self, a: np.ndarray, out: np.ndarray | None = None, pool: ThreadPool | None = None,
                 chunks: int = 1) -> np.ndarray:
        """``a @ W (+ bias)`` for float32 ``a`` (..., M, K), into ``out`` (..., M, N) when
        given (C-contiguous); the rows split into ``chunks`` chunks of whole micro-kernel
        blocks run on ``pool`` when given (the same values as one chunk)."""
        count = math.prod(a.shape[:-1])
        rows = np.ascontiguousarray(a).reshape(count, self.k)
        if out is None:
            out = np.empty((*a.shape[:-1], self.n), np.float32)
        out2 = out.reshape(count, self.n)
        function, panels, bias, with_bias, block = (self._function, self.panels, self.bias,
                                                    self.with_bias, self.block)
        if pool is None or chunks < 2:
            function(rows, panels, self.layout, bias, with_bias, out2, 0, count, block, 0, 0, self.n)
            return out

        def part(start: int, stop: int) -> None:
            function(rows, panels, self.layout, bias, with_bias, out2, start * MR,
                     min(count, stop * MR), block, 0, 0, self.n)

        pool.parallel_chunks(-(-count // MR), part, chunks)
        return out
