"""Products with constant float32 weights packed once: ``A @ W (+ bias)`` by a register-blocked
compiled kernel instead of a BLAS call that packs W again on every call.

A MatMul or Gemm whose B is a constant (the weights of a linear layer) gets its B packed at
the session's construction (:class:`PackedWeights`): the columns in panels of ``NR``,
each panel ``(K, NR)`` contiguous and zero-padded past N, so that the micro-kernel reads one
contiguous row of a panel per step of the sum. The micro-kernel (:func:`_tile`, LLVM vector
code written through numba's ``intrinsic``) keeps an ``MR x NR`` block of the output in
vector registers, adds ``a[i, p] * panel[p, :]`` for p = 0..K-1 with fused multiply-adds,
then adds the bias (when there is one) and stores the block once. The block's shape is the
processor's (:func:`geometry`, :data:`GEOMETRIES`): 6 x 64 in 24 of AVX-512's 32 registers,
6 x 16 in 12 of AVX2's 16; one code path, the lanes, vectors per row and rows its constants.
Without AVX2 and FMA the products stay with BLAS (:func:`available`). A's rows go in blocks
of :data:`BLOCK_A_BYTES`, each repacked in ``MR``-row groups (one step's ``MR`` values
contiguous), that every panel passes over in turn (:func:`packed_rows`), and a caller may
split the rows across a thread pool in chunks of whole ``MR``-row blocks. The panels may also
be a matrix read in place, each step of a panel ``NR`` contiguous values of one of its rows
(``packed_rows``'s ``b_layout``: a 1x1 convolution's input rows, its columns past the last
whole panel packed by :func:`pack_panels`). :func:`panels_transposed` stores the blocks
transposed (the micro-kernel's rows become the output's columns), A read in place or packed
by :func:`pack_columns`: a 1x1 convolution on a small plane with its weights as the panels.

Numerics. Each output element is ``sum_p a[i, p] w[p, j]`` summed in order of p from +0 in
float32 with one rounding per fused multiply-add, then ``+ bias[j]`` rounded once: one of the
orders the BLAS bound of ``gemm.py`` covers (``|Y - exact| <= K u sum |a||w|`` to first
order), and the bias is added to the rounded product as the unfused Add does. NaN and
infinities propagate as IEEE arithmetic says; a sum of only negative zeros is +0, as BLAS
gives it. The blocks and chunks of rows change only who computes an element and when, never its
sum's order: the same bits at any block size and thread count, and at any vector width (a
lane's sum does not depend on how many lanes a vector has).
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..parallel import current_team
from . import team
from .compiled import CompiledConstant, CompiledIntrinsic, close_sum_loop, compiled, prange, target_flags
from .spin import claim, cycles_per_second, end_of_tasks
from .team import carray, float32_pointer, int64_pointer, task_function, team_region

__all__ = ["BLOCK_A_BYTES", "GEOMETRIES", "KC", "MR", "NR", "Geometry", "PackedWeights", "aligned_empty",
           "available", "geometry", "pack_columns", "pack_panels", "pack_rows", "packed_layout",
           "packed_rows", "panels_over_rows", "panels_transposed"]


@dataclass(frozen=True)
class Geometry:
    """The micro-kernel's block on one vector width: ``rows`` x ``vectors`` accumulators of
    ``lanes`` float32 each, which with the ``vectors`` loads of a step must fit the register
    file (docs/gemm.md measures the candidates)."""

    lanes: int  # float32 values per vector register
    vectors: int  # vectors per row of the block
    rows: int  # rows of the output block (MR)

    @property
    def columns(self) -> int:
        """The block's columns: the width of one panel of packed weights (NR)."""
        return self.lanes * self.vectors

    @property
    def heights(self) -> tuple[int, ...]:
        """The heights of blocks the micro-kernel has code for: ``rows``, and 4 and 2 below it
        (the last rows of A go to the smallest that holds them)."""
        return tuple(sorted({self.rows, *(height for height in (2, 4) if height < self.rows)}))


#: The block per instruction set, the first whose features the processor has: 24 512-bit
#: accumulators of AVX-512's 32 registers; 12 256-bit ones of AVX2's 16.
GEOMETRIES: tuple[tuple[frozenset[str], Geometry], ...] = (
    (frozenset({"avx512f"}), Geometry(lanes=16, vectors=4, rows=6)),
    (frozenset({"avx2", "fma"}), Geometry(lanes=8, vectors=2, rows=6)),
)


@functools.cache
def geometry() -> Geometry | None:
    """The block for the processor LLVM compiles for (:data:`GEOMETRIES`), None where it has
    none of their instruction sets or numba does not load."""
    features = target_flags()
    return next((shape for needs, shape in GEOMETRIES if needs <= features), None)


def available() -> bool:
    """Whether this process can run the packed products: numba loads and LLVM's host has
    AVX2 and FMA, or AVX-512F (:func:`geometry`)."""
    return geometry() is not None


def _geometry() -> Geometry:
    shape = geometry()
    if shape is None:
        raise RuntimeError("the packed products need AVX2 and FMA or AVX-512F; check available() first")
    return shape


#: The rows (MR), columns (NR), lanes and vectors of the micro-kernel's block, constants of
#: the compiled kernels (Python reads :func:`geometry`).
MR = CompiledConstant(lambda: _geometry().rows, "MR")
NR = CompiledConstant(lambda: _geometry().columns, "NR")
LANES = CompiledConstant(lambda: _geometry().lanes, "LANES")
VECTORS = CompiledConstant(lambda: _geometry().vectors, "VECTORS")
#: Bytes of a panel ahead of the current step that the first block of rows prefetches.
AHEAD_BYTES = 8192
_AHEAD = CompiledConstant(lambda: max(1, AHEAD_BYTES // (4 * _geometry().columns)), "_AHEAD")
#: Bytes of a panel per pass of the sum over the rows: a (KC, NR) part of a panel stays in L1.
PASS_BYTES = 32768
#: Steps of the sum per pass (128 at NR = 64, 512 at NR = 16): a pass's fixed cost (the
#: block's partial sums read and written again) spread over as many steps at any width.
KC = CompiledConstant(lambda: PASS_BYTES // (4 * _geometry().columns), "KC")
#: The size (in bytes) of the blocks of rows of A that every panel passes over in turn: a
#: block stays in the L2 cache while the panels stream past it.
BLOCK_A_BYTES = 1 << 19
_LINE = 16  # float32 values per cache line


def _build_tile(numba: Any, transposed: bool = False) -> Any:
    """numba's ``intrinsic`` ``_tile(a, b, out, bias, i0, b_start, b_step, b_ahead, bias_start,
    rows, out_row, out_column, with_bias, prefetch, start, stop, accumulate, vectors)``: the
    first ``rows`` rows (rows <= ``MR``) of block ``i0`` of A packed by :func:`pack_rows`
    (``a``: (blocks, K, MR)) times steps ``start..stop-1`` of a panel of B, the ``NR``
    contiguous values of its step p at ``b``'s element ``b_start + p * b_step`` (a packed
    panel of (P, K, NR) ``panels``: ``b_start = panel * K * NR``, ``b_step = NR``), added to
    the partial sums already in the output block when ``accumulate`` (else to +0), plus
    ``bias[bias_start:][:NR]`` when ``with_bias``, stored in ``out[out_row:out_row + rows,
    out_column:out_column + NR]``; ``prefetch`` fetches, at each step, the cache lines
    ``b_ahead`` elements further (``_AHEAD * NR`` in packed panels). Rows past ``rows`` read
    the last valid row of ``out`` and are not stored. With ``vectors`` below the geometry's
    the block is that many vectors wide (the panel's first columns). The block's shape comes
    from :func:`geometry`: one loop per height of :attr:`Geometry.heights` and width of
    1..``vectors`` vectors, the call picking one by ``rows`` and ``vectors``.

    ``transposed``: the intrinsic ``_tile_transposed(a, b, out, bias, a_start, a_step, b_start,
    b_step, b_ahead, bias_start, rows, out_row, out_column, with_bias, prefetch, stop, vectors,
    width)`` instead, for a product stored transposed: row r of A at step p is ``a``'s element
    ``a_start + p * a_step + r`` (A read in place, a matrix's ``rows`` consecutive columns;
    rows past ``rows`` read row ``rows - 1``), all steps ``0..stop-1`` in one pass from +0,
    and the block's element (r, c) goes to ``out[out_column + c, out_row + r]`` for r <
    ``rows`` and c < ``width``: the block's rows are the output's columns."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    shape = _geometry()
    lanes = shape.lanes
    f32 = ir.FloatType()
    vector = ir.VectorType(f32, lanes)
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    zero = ir.Constant(vector, [0.0] * lanes)
    broadcast = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)

    def constant(value: int) -> ir.Constant:
        return ir.Constant(i64, value)

    def load_vector(builder: Any, pointer: Any, offset: int) -> Any:
        return builder.load(builder.bitcast(builder.gep(pointer, [constant(offset)]),
                                            vector.as_pointer()), align=4)

    def block(builder: Any, values: dict[str, Any], height: int, vectors: int) -> None:
        """The loop of one ``height`` x ``vectors`` block, from the current block of code."""
        a_data, b_data, out_data, bias_data, k, ldc = (values[name] for name in (
            "a", "b", "out", "bias", "k", "ldc"))
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector, [vector, vector, vector]), f"llvm.fma.v{lanes}f32")
        fetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8.as_pointer(), i32, i32, i32]),
            "llvm.prefetch")
        rows_v = values["rows"]
        last = builder.sub(rows_v, constant(1))
        clamped = [builder.select(builder.icmp_signed("<", constant(r), rows_v), constant(r), last)
                   for r in range(height)]
        if transposed:
            a_first = builder.gep(a_data, [values["a_start"]])
            initial = [zero] * (height * vectors)
        else:
            a_first = builder.gep(a_data, [builder.mul(values["i0"], builder.mul(k, constant(shape.rows)))])
            targets = [builder.gep(out_data, [builder.add(builder.mul(
                builder.add(values["out_row"], row), ldc), values["out_column"])]) for row in clamped]
            # the partial sums of the steps before ``start``, read only when there are some: a
            # first pass must not wait for the output's (cold) lines before its first step
            with builder.if_else(values["accumulate"]) as (stored, fresh):
                with stored:
                    partial = [load_vector(builder, target, lanes * q) for target in targets
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
        panel_start = builder.gep(b_data, [values["b_start"]])
        entry = builder.block
        loop = builder.append_basic_block("tile.loop")
        done = builder.append_basic_block("tile.done")
        start_v = constant(0) if transposed else values["start"]
        stop_v = values["stop"]
        builder.cbranch(builder.icmp_signed(">", stop_v, start_v), loop, done)
        builder.position_at_end(loop)
        p = builder.phi(i64)
        p.add_incoming(start_v, entry)
        sums = []
        for value in initial:
            phi = builder.phi(vector)
            phi.add_incoming(value, entry)
            sums.append(phi)
        step = builder.gep(panel_start, [builder.mul(p, values["b_step"])])
        with builder.if_then(values["prefetch"]):
            for line in range(-(-vectors * lanes // _LINE)):
                ahead = builder.gep(step, [builder.add(values["b_ahead"], constant(_LINE * line))])
                builder.call(fetch, [builder.bitcast(ahead, i8.as_pointer()),
                                     ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        w = [load_vector(builder, step, lanes * q) for q in range(vectors)]
        a_step = builder.gep(a_first, [builder.mul(p, values["a_step"] if transposed
                                                   else constant(shape.rows))])
        updated = []
        for r in range(height):
            scalar = builder.load(builder.gep(a_step, [clamped[r] if transposed else constant(r)]))
            splat = builder.shuffle_vector(
                builder.insert_element(ir.Constant(vector, ir.Undefined), scalar, ir.Constant(i32, 0)),
                ir.Constant(vector, ir.Undefined), broadcast)
            for q in range(vectors):
                updated.append(builder.call(fma, [splat, w[q], sums[vectors * r + q]]))
        totals = close_sum_loop(builder, p, stop_v, sums, updated, initial, entry, loop, done)
        bias_start = builder.gep(bias_data, [values["bias_start"]])
        biases = [builder.select(values["with_bias"], load_vector(builder, bias_start, lanes * q), zero)
                  for q in range(vectors)]
        if transposed:
            store_transposed(builder, values, [builder.fadd(totals[vectors * r + q], biases[q])
                                               for r in range(height) for q in range(vectors)],
                             height, vectors)
            return
        for r in range(height):
            with builder.if_then(builder.icmp_signed("<", constant(r), rows_v)):
                for q in range(vectors):
                    builder.store(builder.fadd(totals[vectors * r + q], biases[q]),
                                  builder.bitcast(builder.gep(targets[r], [constant(lanes * q)]),
                                                  vector.as_pointer()), align=4)

    def store_transposed(builder: Any, values: dict[str, Any], sums: list[Any], height: int,
                         vectors: int) -> None:
        """Element (r, c) of the block (``sums[vectors * r + q]``'s lane ``c - lanes * q``)
        to ``out[out_column + c, out_row + r]`` for r < ``rows`` and c < ``width``: a whole
        block of ``MR`` rows as one vector of ``MR`` values per column (its vectors shuffled
        together, each column picked out), a partial one a scalar at a time."""
        ldc, width, rows_v = values["ldc"], values["width"], values["rows"]
        base = builder.gep(values["out"], [builder.add(builder.mul(values["out_column"], ldc),
                                                       values["out_row"])])
        columns = [builder.gep(base, [builder.mul(constant(c), ldc)]) for c in range(lanes * vectors)]

        def each_column(q: int, store: Any) -> None:
            """``store(lane, column)`` for the lanes of vector q inside ``width``."""
            whole = builder.icmp_signed("<=", constant(lanes * (q + 1)), width)
            with builder.if_else(whole) as (every, some):
                with every:
                    for lane in range(lanes):
                        store(lane, lanes * q + lane)
                with some:
                    for lane in range(lanes):
                        with builder.if_then(builder.icmp_signed("<", constant(lanes * q + lane), width)):
                            store(lane, lanes * q + lane)

        def scalars() -> None:
            for r in range(height):
                with builder.if_then(builder.icmp_signed("<", constant(r), rows_v)):
                    for q in range(vectors):
                        each_column(q, lambda lane, c, r=r, q=q: builder.store(
                            builder.extract_element(sums[vectors * r + q], ir.Constant(i32, lane)),
                            builder.gep(columns[c], [constant(r)])))

        if height < shape.rows:
            scalars()
            return
        with builder.if_else(builder.icmp_signed("==", rows_v, constant(height))) as (full, partial):
            with full:
                run = ir.VectorType(f32, height)
                for q in range(vectors):
                    joined = [sums[vectors * r + q] for r in range(height)]
                    while len(joined) > 1:  # the rows side by side: row r's lane l at r * lanes + l
                        if len(joined) % 2:
                            joined.append(ir.Constant(joined[0].type, ir.Undefined))
                        size = joined[0].type.count
                        joined = [builder.shuffle_vector(joined[i], joined[i + 1], ir.Constant(
                            ir.VectorType(i32, 2 * size), list(range(2 * size))))
                                  for i in range(0, len(joined), 2)]
                    every_row = joined[0]

                    def column(lane: int, c: int, every_row: Any = every_row) -> None:
                        mask = ir.Constant(ir.VectorType(i32, height),
                                           [r * lanes + lane for r in range(height)])
                        picked = builder.shuffle_vector(every_row, ir.Constant(every_row.type, ir.Undefined),
                                                        mask)
                        builder.store(picked, builder.bitcast(columns[c], run.as_pointer()), align=4)

                    each_column(q, column)
            with partial:
                scalars()

    if transposed:
        names = ("a_start", "a_step", "b_start", "b_step", "b_ahead", "bias_start", "rows", "out_row",
                 "out_column", "with_bias", "prefetch", "stop", "vectors", "width")
    else:
        names = ("i0", "b_start", "b_step", "b_ahead", "bias_start", "rows", "out_row", "out_column",
                 "with_bias", "prefetch", "start", "stop", "accumulate", "vectors")

    def typed(a: Any, b: Any, out: Any, bias: Any) -> Any:
        return types.void(a, b, out, bias, *[types.boolean if name in (
            "with_bias", "prefetch", "accumulate") else types.int64 for name in names])

    def codegen(context, builder, sig, args):
        arrays = [context.make_array(kind)(context, builder, value)
                  for kind, value in zip(sig.args[:4], args[:4], strict=True)]
        values = dict(zip(names, args[4:], strict=True))
        values.update(a=arrays[0].data, b=arrays[1].data, out=arrays[2].data, bias=arrays[3].data,
                      k=None if transposed else builder.extract_value(arrays[0].shape, 1),
                      ldc=builder.extract_value(arrays[2].shape, 1))
        # one loop per (height, vectors), the call's picked by a switch on both
        heights = shape.heights
        height_index = constant(0)
        for index, height in enumerate(heights[:-1]):
            height_index = builder.select(builder.icmp_signed(">", values["rows"], constant(height)),
                                          constant(index + 1), height_index)
        key = builder.add(builder.mul(height_index, constant(shape.vectors)),
                          builder.sub(values["vectors"], constant(1)))
        exit_block = builder.append_basic_block("tile.exit")
        cases = [(index, height, count) for index, height in enumerate(heights)
                 for count in range(1, shape.vectors + 1)]
        blocks = [builder.append_basic_block(f"tile.{height}x{count}") for _, height, count in cases]
        switch = builder.switch(key, blocks[-1])
        for (index, height, count), target in zip(cases, blocks, strict=True):
            switch.add_case(constant(index * shape.vectors + count - 1), target)
            builder.position_at_end(target)
            block(builder, values, height, count)
            builder.branch(exit_block)
        builder.position_at_end(exit_block)
        return context.get_dummy_value()

    if transposed:
        @intrinsic
        def tile(typingctx, a, b, out, bias, a_start, a_step, b_start, b_step, b_ahead, bias_start,
                 rows, out_row, out_column, with_bias, prefetch, stop, vectors, width):
            return typed(a, b, out, bias), codegen
    else:
        @intrinsic
        def tile(typingctx, a, b, out, bias, i0, b_start, b_step, b_ahead, bias_start, rows, out_row,
                 out_column, with_bias, prefetch, start, stop, accumulate, vectors):
            return typed(a, b, out, bias), codegen

    return tile


_tile = CompiledIntrinsic(_build_tile, "_tile")
_tile_transposed = CompiledIntrinsic(functools.partial(_build_tile, transposed=True), "_tile_transposed")


@compiled
def packed_rows(a: np.ndarray, b: np.ndarray, b_layout: tuple[int, int, int, int],
                bias: np.ndarray, with_bias: bool, out: np.ndarray, first: int, last: int,
                block: int, out_row: int, out_column: int, n: int) -> None:
    """Rows ``first..last-1`` of ``a @ B (+ bias)`` for C-contiguous float32 ``a`` (M, K) and B
    (K, n) in panels of ``NR`` columns read from ``b``, ``b_layout = (start, panel, step,
    ahead)``: panel q's step p is the ``NR`` contiguous values from element ``start + q * panel
    + p * step`` (every one of them readable, past n too), and the first block of rows
    prefetches the values ``ahead`` elements further (W packed in (P, K, NR) ``panels``:
    :func:`packed_layout`); ``bias`` padded to a multiple of NR values. Row i and column j
    land in ``out[out_row + i, out_column + j]`` (C-contiguous 2-D). The rows go in blocks of
    ``block``, each packed by :func:`pack_rows`: every panel passes over one block of A before
    the next block, so that the block stays in the L2 cache. Each element's sum runs in the
    same order whatever the rows and the block are."""
    for top in range(first, last, block):
        bottom = min(last, top + block)
        panels_over_rows(pack_rows(a, top, bottom), b, b_layout, bias, with_bias, out, 0,
                         bottom - top, out_row + top, out_column, n)


@compiled
def panels_over_rows(rows_a: np.ndarray, b: np.ndarray, b_layout: tuple[int, int, int, int],
                     bias: np.ndarray, with_bias: bool, out: np.ndarray, first: int, last: int,
                     out_row: int, out_column: int, n: int) -> None:
    """:func:`packed_rows` of rows ``first..last-1`` (``first`` a multiple of ``MR``) of A
    packed by :func:`pack_rows` (``rows_a``), every panel over all of them: for a caller that
    multiplies the same rows by several matrices (a 1x1 convolution's weights by its tiles)."""
    b_start, b_panel, b_step, b_ahead = b_layout
    k = rows_a.shape[1]
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
                    _tile(rows_a, b, out, bias, i0 // MR, start_b, b_step, b_ahead, column,
                          min(MR, last - i0), out_row + i0, out_column + column, finished,
                          i0 == first, start, stop, chunk > 0, VECTORS)
            continue
        vectors = -(-width // LANES)
        for i0 in range(first, last, MR):
            rows = min(MR, last - i0)
            for chunk in range(chunks):
                start, stop = chunk * KC, min(k, (chunk + 1) * KC)
                _tile(rows_a, b, edge, bias, i0 // MR, start_b, b_step, b_ahead, column, rows, 0,
                      0, with_bias and stop == k, i0 == first, start, stop, chunk > 0, vectors)
            for r in range(rows):
                for c in range(width):
                    out[out_row + i0 + r, out_column + column + c] = edge[r, c]


@compiled
def panels_transposed(a: np.ndarray, a_layout: tuple[int, int, int], m: int, panels: np.ndarray,
                      bias: np.ndarray, with_bias: bool, out: np.ndarray, out_row: int,
                      out_column: int, first: int, last: int, n: int) -> None:
    """Panels ``first..last-1`` of ``A @ W (+ bias)`` stored transposed: A (m, K) read from
    the flat ``a``, ``a_layout = (start, block, step)``: row i of block ``i // MR`` at step p
    is element ``start + (i // MR) * block + p * step + i % MR`` (rows packed by
    :func:`pack_columns`: ``(0, K * MR, MR)``; a matrix's m consecutive columns read in
    place: ``(offset, MR, stride)``); W (K, n) in ``panels`` (P, K, NR) as
    :class:`PackedWeights` packs it (K = the panels' second axis), ``bias`` padded to P x NR
    values; column j of the product and row i land in ``out[out_row + j, out_column + i]``
    (C-contiguous 2-D): a 1x1 convolution's NCHW output, the weights (transposed, packed
    once) as the panels and the positions as the rows. Each element is summed in one pass
    over p from +0, the order of :func:`packed_rows`: the same bits whatever the panels'
    split and the layout of A."""
    a_start, a_block, a_step = a_layout
    k = panels.shape[1]
    for panel in range(first, last):
        column = panel * NR
        width = min(NR, n - column)
        vectors = -(-width // LANES)
        for i0 in range(0, m, MR):
            _tile_transposed(a, panels, out, bias, a_start + i0 // MR * a_block, a_step, panel * k * NR,
                             NR, _AHEAD * NR, column, min(MR, m - i0), out_column + i0,
                             out_row + column, with_bias, i0 == 0, k, vectors, width)


@compiled
def pack_columns(source: np.ndarray, offset: int, stride: int, depth: int, columns: int,
                 packed: np.ndarray) -> None:
    """Columns ``0..columns-1`` of a (``depth``, ...) matrix read from the flat ``source``
    (element (p, j) at ``offset + p * stride + j``) as the rows of A in ``packed`` (blocks,
    depth, MR), each step's ``MR`` values contiguous (:func:`pack_rows`'s layout; zeros past
    ``columns``): what :func:`panels_transposed` reads at ``(0, depth * MR, MR)``."""
    whole = columns // MR
    count = columns - whole * MR  # in the last block, partly filled
    for p in range(depth):  # each row of the source read once, in order
        row = offset + p * stride
        for block in range(whole):
            for r in range(MR):
                packed[block, p, r] = source[row + block * MR + r]
        if count > 0:
            for r in range(MR):
                packed[whole, p, r] = source[row + whole * MR + r] if r < count else 0.0


@compiled(parallel=True)
def packed_panels_parallel(a: np.ndarray, b: np.ndarray, b_layout: tuple[int, int, int, int],
                           bias: np.ndarray, with_bias: bool, out: np.ndarray, block: int,
                           n: int, threads: int, group: int, wait: tuple[int, int]) -> None:
    """:func:`packed_rows` of all rows of ``a`` over ``threads`` numba threads (the caller
    has set their count): each block of rows is packed once, then its panels go ``group`` at
    a time to whichever thread asks next (an atomic counter), so that a thread that starts
    late, or runs slower, takes fewer. The thread that started the region, done with the
    panels, waits for the others by reading a counter, not asleep at the region's end (waking
    it costs tens of microseconds), for at most ``wait[0]`` cycles of the processor's counter
    and only while no two reads are more than ``wait[1]`` apart (a longer gap: it lost its
    processor to another task, and the machine is busy); with numba's OpenMP layer that
    thread runs the region's first iteration (with another layer the wait only ends sooner
    or later, never past those bounds). Each element's sum is
    the one :func:`packed_rows` computes, whichever thread computes it: the same bits."""
    b_start, b_panel, b_step, b_ahead = b_layout
    count = a.shape[0]
    panels = -(-n // NR)
    tasks = -(-panels // group)
    state = np.empty(2, np.int64)  # the next group of panels; the other threads that are done
    for top in range(0, count, block):
        bottom = min(count, top + block)
        rows_a = pack_rows(a, top, bottom)
        state[0] = 0
        state[1] = 0
        for thread in prange(threads):
            task = claim(state, 0)
            while task < tasks:
                panel = task * group
                column = panel * NR
                panels_over_rows(rows_a, b, (b_start + panel * b_panel, b_panel, b_step, b_ahead),
                                 bias[column:], with_bias, out, 0, bottom - top, top, column,
                                 min(n, column + group * NR) - column)
                task = claim(state, 0)
            end_of_tasks(state, thread, threads, wait)


#: The int64 slots of :func:`packed_panels_team`'s argument block, read by :func:`_panels_task`.
_ARGUMENTS = 19


@task_function
def _panels_task(arguments: int, task: int) -> None:
    """Task ``task`` of :func:`packed_panels_team`'s region: its ``group`` panels over the
    block of rows packed in the argument block's ``rows_a``."""
    values = carray(int64_pointer(arguments), _ARGUMENTS)
    rows_a = carray(float32_pointer(values[0]), (values[1], values[2], MR))
    b = carray(float32_pointer(values[3]), values[4])
    bias = carray(float32_pointer(values[5]), values[6])
    out = carray(float32_pointer(values[7]), (values[8], values[9]))
    b_start, b_panel, b_step, b_ahead = values[10], values[11], values[12], values[13]
    with_bias, rows, top, n, group = values[14] != 0, values[15], values[16], values[17], values[18]
    panel = task * group
    column = panel * NR
    panels_over_rows(rows_a, b, (b_start + panel * b_panel, b_panel, b_step, b_ahead), bias[column:],
                     with_bias, out, 0, rows, top, column, min(n, column + group * NR) - column)


@compiled
def packed_panels_team(a: np.ndarray, b: np.ndarray, b_layout: tuple[int, int, int, int],
                       bias: np.ndarray, with_bias: bool, out: np.ndarray, block: int, n: int,
                       group: int, state: np.ndarray, system: int, task: int) -> None:
    """:func:`packed_panels_parallel` on a native team (:mod:`.team`; ``state`` and ``system``
    its shared state and libc's ``syscall``, ``task`` the address of :func:`_panels_task`):
    each block of rows packed once by the calling thread, then its panels ``group`` at a time
    as the region's tasks, which the caller and the team's spinning workers claim in compiled
    code. Each element's sum is the one :func:`packed_rows` computes: the same bits. ``b``
    and ``out`` C-contiguous, ``out`` (rows of ``a``, ``n``)."""
    count = a.shape[0]
    panels = -(-n // NR)
    tasks = -(-panels // group)
    values = np.empty(_ARGUMENTS, np.int64)
    values[3], values[4] = b.ctypes.data, b.size
    values[5], values[6] = bias.ctypes.data, bias.size
    values[7], values[8], values[9] = out.ctypes.data, out.shape[0], out.shape[1]
    values[10], values[11], values[12], values[13] = b_layout
    values[14], values[17], values[18] = with_bias, n, group
    for top in range(0, count, block):
        bottom = min(count, top + block)
        rows_a = pack_rows(a, top, bottom)
        values[0], values[1], values[2] = rows_a.ctypes.data, rows_a.shape[0], rows_a.shape[1]
        values[15], values[16] = bottom - top, top
        team_region(state, system, task, values.ctypes.data, tasks)
        values[1] = rows_a.shape[0]  # rows_a lives until its region is over


@compiled
def pack_rows(a: np.ndarray, first: int, last: int) -> np.ndarray:
    """Rows ``first..last-1`` of ``a`` (M, K) as blocks of ``MR`` rows ``(blocks, K, MR)``,
    each step's ``MR`` values contiguous (zeros past ``last``): the micro-kernel then reads
    one step of its rows at one address, not ``MR`` rows ``K`` apart. The steps run outside
    the rows, so the stores go out in order (one scalar store ``MR`` values apart per element
    cost a 64x256x256 product 8 of its 104 us) while each row is read in order."""
    k = a.shape[1]
    blocks = -(-(last - first) // MR)
    packed = np.empty((blocks, k, MR), np.float32)
    flat = packed.reshape(-1)
    for block in range(blocks):
        top = first + block * MR
        base = np.uintp(block * k * MR)
        rows = np.uintp(min(MR, last - top))
        if rows == MR:
            for p in range(np.uintp(k)):
                target = base + p * np.uintp(MR)
                for r in range(np.uintp(MR)):
                    flat[target + r] = a[top + r, p]
        else:
            for p in range(np.uintp(k)):
                target = base + p * np.uintp(MR)
                for r in range(rows):
                    flat[target + r] = a[top + r, p]
                for r in range(rows, np.uintp(MR)):
                    flat[target + r] = 0.0
    return packed


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary (numpy's
    start 16 bytes past one): the micro-kernel's vector stores (64 or 32 bytes) then each stay
    in one cache line where the rows are multiples of 64 bytes, instead of straddling two."""
    dtype = np.dtype(dtype)
    raw = np.empty(math.prod(shape) * dtype.itemsize + 64, np.uint8)
    # the address through ctypes.c_char (a third of the time of raw.ctypes.data: a small
    # convolution allocates its output so on every run)
    start = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % 64
    return np.ndarray(shape, dtype, raw, start)


@compiled(inline="always")
def packed_layout(k: int) -> tuple[int, int, int, int]:
    """:func:`packed_rows`'s ``b_layout`` of panels (P, k, NR) packed contiguously."""
    return (0, k * NR, NR, _AHEAD * NR)


#: Rows of the source :func:`pack_panels` hands to every panel in turn (measured on
#: ConvNeXt-tiny's weights: 8 rows took 0.58 of the time of one row to every panel).
_PACK_ROWS = 8


@compiled
def pack_panels(source: np.ndarray, offset: int, stride: int, depth: int, columns: int,
                panels: np.ndarray) -> None:
    """Pack ``columns`` columns of a (``depth``, ...) matrix read from the flat ``source``
    (element (k, j) at ``offset + k * stride + j``) into the first ``ceil(columns / NR)``
    panels of ``panels`` (P, depth, NR), zero past ``columns``: the operand a caller packs per
    call (a convolution's input) rather than once. The whole panels go ``_PACK_ROWS`` rows at a
    time, each row of the group to every panel (the group's rows stay in the cache while the
    panels take them), a step's ``NR`` values copied as whole vectors; then the last panel,
    partly filled."""
    flat = panels.reshape(-1)
    whole = columns // NR
    for top in range(0, depth, _PACK_ROWS):
        bottom = min(depth, top + _PACK_ROWS)
        for panel in range(whole):
            for k in range(top, bottom):
                source_row = np.uintp(offset + k * stride + panel * NR)
                target_row = np.uintp((panel * depth + k) * NR)
                for c in range(np.uintp(NR)):
                    flat[target_row + c] = source[source_row + c]
    width = np.uintp(columns - whole * NR)
    if width > 0:
        for k in range(depth):
            source_row = np.uintp(offset + k * stride + whole * NR)
            target_row = np.uintp((whole * depth + k) * NR)
            for c in range(width):
                flat[target_row + c] = source[source_row + c]
            for c in range(width, np.uintp(NR)):
                flat[target_row + c] = 0.0


#: Multiply-adds per task of a parallel product (:func:`packed_panels_parallel`'s ``group``
#: of panels): about 11 us of one core here, a thirtieth of a transformer's larger products.
TASK_WORK = 1 << 19
#: How long the thread that started a parallel product waits for the others awake (reading
#: a counter) before it sleeps until they are done; and the longest gap between two of its
#: reads before it stops (it was preempted: the machine is busy), as the pool's hot regions
#: do (``parallel._PREEMPTED_US``).
WAIT_US = 100.0
PREEMPTED_US = 20.0


@functools.cache
def wait_cycles() -> tuple[int, int]:
    """:data:`WAIT_US` and :data:`PREEMPTED_US` in cycles of the processor's counter (0
    where it has none: no wait)."""
    rate = cycles_per_second() * 1e-6
    return int(rate * WAIT_US), int(rate * PREEMPTED_US)


def _pack_weights(w: np.ndarray, panels: np.ndarray) -> None:
    """W (K, N), float32 of any layout, into ``panels`` (P, K, NR) in one pass, zeros past N:
    a C-contiguous W row by row (:func:`pack_panels`), any other (the transpose of a
    C-contiguous B, Gemm's ``transB``) by numpy's copy from a view of its whole panels, which
    reads B in its own order; no transposed copy of W is made."""
    k, n = w.shape
    nr = panels.shape[2]
    if w.flags.c_contiguous:
        pack_panels.dispatcher(w.reshape(-1), 0, n, k, n, panels)
        return
    whole = n // nr
    rows, columns = w.strides
    np.copyto(panels[:whole], np.lib.stride_tricks.as_strided(
        w, (whole, k, nr), (nr * columns, rows, columns), writeable=False))
    if whole < panels.shape[0]:
        panels[whole, :, :n - whole * nr] = w[:, whole * nr:]
        panels[whole, :, n - whole * nr:] = 0.0


class PackedWeights:
    """A constant float32 matrix W (K, N) packed for :func:`packed_rows`, with an optional
    bias (N values) added to every row of the product."""

    def __init__(self, w: np.ndarray, bias: np.ndarray | None = None) -> None:
        shape = _geometry()
        k, n = w.shape
        nr, self.rows = shape.columns, shape.rows
        count = -(-n // nr)
        self.k, self.n = k, n
        self.panels = panels = np.empty((count, k, nr), np.float32)
        _pack_weights(w, panels)
        self.layout = packed_layout(k)
        self.bias = np.zeros(count * nr, np.float32)
        self.with_bias = bias is not None
        if bias is not None:
            self.bias[:n] = bias.reshape(-1)
        self.columns = nr
        self._function = packed_rows.dispatcher
        self.block = max(self.rows, BLOCK_A_BYTES // (4 * max(k, 1)) // self.rows * self.rows)

    def weights(self) -> np.ndarray:
        """W again (K, N), rebuilt from the panels (bit for bit: they are W's values), a new
        read-only array."""
        count, _, nr = self.panels.shape
        w = np.ascontiguousarray(self.panels.transpose(1, 0, 2).reshape(self.k, count * nr)[:, :self.n])
        w.flags.writeable = False
        return w

    def compile(self, threads: int = 1) -> None:
        """Compile (or load from numba's disk cache) the product now; with ``threads`` above 1
        its parallel regions too, numba's and the native team's (:meth:`multiply`)."""
        one = np.zeros((1, self.k), np.float32)
        self.multiply(one)
        if threads > 1:
            self.multiply(one, threads=threads)
            if team.available():  # a team taken (busy): the caller runs every task itself
                state = np.zeros(team.STATE_SLOTS, np.int64)
                state[team.BUSY] = 1
                self._team(one, np.empty((1, self.n), np.float32), state, 0)

    def multiply(self, a: np.ndarray, out: np.ndarray | None = None, threads: int = 1) -> np.ndarray:
        """``a @ W (+ bias)`` for float32 ``a`` (..., M, K), into ``out`` (..., M, N) when
        given (C-contiguous); with ``threads`` above 1 the panels are shared out among the
        native team of the calling thread's run where it has one
        (:func:`onnx_light.parallel.current_team`, :func:`packed_panels_team`), else among that
        many numba threads in one region (:func:`packed_panels_parallel`; the caller has set
        numba's thread count): the same values as one thread either way."""
        count = math.prod(a.shape[:-1])
        rows = np.ascontiguousarray(a).reshape(count, self.k)
        if out is None:
            out = np.empty((*a.shape[:-1], self.n), np.float32)
        out2 = out.reshape(count, self.n)
        if threads < 2:
            self._function(rows, self.panels, self.layout, self.bias, self.with_bias, out2, 0,
                           count, self.block, 0, 0, self.n)
            return out
        native = current_team()
        if native is not None:
            self._team(rows, out2, native.state, native.system)
            return out
        packed_panels_parallel.dispatcher(rows, self.panels, self.layout, self.bias, self.with_bias,
                                          out2, self.block, self.n, threads, self._group(count),
                                          wait_cycles())
        return out

    def _group(self, count: int) -> int:
        """Panels per task of a parallel product of ``count`` rows (:data:`TASK_WORK`)."""
        return max(1, TASK_WORK // max(1, min(count, self.block) * self.k * self.columns))

    def _team(self, rows: np.ndarray, out: np.ndarray, state: np.ndarray, system: int) -> None:
        """The product of ``rows`` (count, K) into ``out`` (count, N) on a native team."""
        packed_panels_team.dispatcher(rows, self.panels, self.layout, self.bias, self.with_bias, out,
                                      self.block, self.n, self._group(rows.shape[0]), state, system,
                                      _panels_task.address)
