"""The Conv algorithms (one class per value of the ``algorithm`` parameter), each computing a
block of (image, group) pairs and output rows, or everything split by filters."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...parallel import ThreadPool
from ..window import pad_spatial
from . import winograd
from .blocks import Prologue, _Algorithm, _filter_ranges, _group_ranges, _limited, _rows_per_block, split
from .channel_blocked import _BlockedDepthwise
from .columns_blocked import _BlockedColumns
from .depthwise import _CompiledDepthwise, read_only
from .filter_blocked import _BlockedFilters
from .finish import fused_parts
from .im2col_units import _Im2colUnits
from .pointwise import pointwise_product, tile_columns, uses_packed
from .problem import _Problem


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
            self.complete(flat, g0, g1, lo, hi, 1)
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

                split(pool, channels, copy, threads)
                grouped = columns.reshape(groups, depth, width)

                def multiply(m0: int, m1: int, n: int = n, s: int = s, e: int = e,
                             grouped: np.ndarray = grouped, width: int = width) -> None:
                    for g, lo, hi in _filter_ranges(problem, m0, m1):
                        part = None
                        if scratch is not None:
                            first = (g * self.mg + lo) * width
                            part = scratch[first:first + (hi - lo) * width]
                        self.product(n, g, g + 1, lo, hi, s, e, grouped[g:g + 1], part)

                split(pool, problem.filters, functools.partial(_limited, per_thread, multiply), threads)


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

        split(pool, problem.filters, functools.partial(_limited, per_thread, multiply), threads)


class _Pointwise(_Algorithm):
    """1x1, stride 1, no padding: the weights times the input rows themselves, no buffer (a
    prologue maps each block of input rows into a new one first). Without a prologue, in
    float32 and float64, each block is one compiled call that multiplies and finishes it
    tile by tile (:mod:`onnx_light.kernels.conv.pointwise`), by BLAS or, for ``product`` =
    ``packed``, the packed micro-kernel (the ``pointwise.product`` parameter)."""

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None,
                 prologue: Prologue | None = None, product: str = "blas") -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        self.prologue = prologue
        window = self.window
        self.row_size = math.prod(window.output[1:])
        self.inputs = x.reshape(problem.batch, problem.groups, self.cg, window.output[0], self.row_size)
        self.outputs = out.reshape(problem.batch, problem.groups, self.mg, window.output[0], self.row_size)
        # per_filter (a subclass) keeps its one product per filter: equal filters, equal channels
        self.tiles = (pointwise_product(x.dtype, product)
                      if prologue is None and type(self) is _Pointwise else None)
        if self.tiles is not None:
            self._tiled(x, out, b, epilogue, uses_packed(x.dtype, product))

    def _tiled(self, x: np.ndarray, out: np.ndarray, b: np.ndarray | None,
               epilogue: Callable[[np.ndarray], None] | None, packed: bool) -> None:
        """What the compiled blocks take: flat read-only operands, the finishing pass's
        bias, residual and clamp, and the activation to run after it (if any)."""
        empty = read_only(np.empty(0, x.dtype))
        self.flat_x, self.flat_out = read_only(x.reshape(-1)), out.reshape(-1)
        self.tile_weights = read_only(self.weights)
        self.tile_bias = empty if b is None else read_only(b.reshape(-1))
        residual, self.clamp, self.activation, self.after = fused_parts(epilogue, x.dtype)
        self.residual = empty if residual is None else read_only(residual)
        self.plane = self.window.output[0] * self.row_size
        self.tile = tile_columns(self.mg, self.cg, self.plane, x.itemsize, packed) or self.plane

    def _product_tiles(self, n: int, g: int, lo: int, hi: int, r0: int, r1: int) -> None:
        """Filters lo:hi of group g, rows r0:r1, by the compiled tiles."""
        pair, first, filter0 = n * self.problem.groups + g, r0 * self.row_size, g * self.mg
        bias = self.tile_bias[filter0 + lo:filter0 + hi] if self.tile_bias.size else self.tile_bias
        self.tiles(
            self.tile_weights[g, lo:hi], self.flat_x, pair * self.cg * self.plane + first,
            self.plane, self.flat_out, (pair * self.mg + lo) * self.plane + first, self.plane, hi - lo,
            self.cg, (r1 - r0) * self.row_size, bias, self.residual, *self.clamp, *self.activation,
            self.tile)
        if self.after is not None:
            self.after(self.out[n, g:g + 1, lo:hi, r0:r1])

    def source(self, n: int, g0: int, g1: int, r0: int, r1: int) -> np.ndarray:
        """The input of groups g0:g1, rows r0:r1 as (count, C/group, rows * row size)."""
        count, width = g1 - g0, (r1 - r0) * self.row_size
        source = self.inputs[n, g0:g1, :, r0:r1].reshape(count, self.cg, width)
        if self.prologue is None:
            return source
        mapped = self.prologue.apply(source.reshape(count * self.cg, width), g0 * self.cg, g1 * self.cg)
        return mapped.reshape(source.shape)

    def product(self, n: int, g0: int, g1: int, lo: int, hi: int, r0: int, r1: int) -> None:
        if self.tiles is not None:
            for g in range(g0, g1):
                self._product_tiles(n, g, lo, hi, r0, r1)
            return
        count, width = g1 - g0, (r1 - r0) * self.row_size
        target = self.outputs[n, g0:g1, lo:hi, r0:r1].reshape(count, hi - lo, width)
        np.matmul(self.weights[g0:g1, lo:hi], self.source(n, g0, g1, r0, r1), out=target)
        self.complete(target, g0, g1, lo, hi, 1)

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        for n, g0, g1 in _group_ranges(self.problem, start, stop):
            self.product(n, g0, g1, 0, self.mg, r0, r1)

    def by_filters(self, pool: ThreadPool, threads: int, per_thread: bool) -> None:
        problem, rows = self.problem, self.window.output[0]
        for n in range(problem.batch):
            def multiply(m0: int, m1: int, n: int = n) -> None:
                for g, lo, hi in _filter_ranges(problem, m0, m1):
                    self.product(n, g, g + 1, lo, hi, 0, rows)

            split(pool, problem.filters, functools.partial(_limited, per_thread, multiply), threads)


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
        self.complete(target, g0, g1, lo, hi, 2)


class _Winograd(_Algorithm):
    """Winograd F(m x m, 3x3) (:mod:`onnx_light.kernels.conv.winograd`, m = ``tiling.tile``)
    for 2-D 3x3 convolutions with stride and dilation 1: per block of tile rows, the input
    transform of every channel, one batched product (alpha^2 x groups products of filters x
    channels times channels x tiles), then the output transform with the bias, written into
    the rows of the block.

    ``filters`` are the transformed filters (alpha^2, groups, filters, channels) when the
    kernel computed them once (constant weights); ``magnitudes`` runs the same passes with
    the absolute values of the matrices (for :func:`error_bound`, on absolute values).
    """

    def __init__(self, problem: _Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                 out: np.ndarray, block_bytes: int,
                 epilogue: Callable[[np.ndarray], None] | None = None,
                 filters: np.ndarray | None = None, magnitudes: bool = False,
                 tiling: winograd.Tiling = winograd.F2) -> None:
        super().__init__(problem, x, w, b, out, block_bytes, epilogue)
        window = self.window
        self.tiling = tiling
        self.row_unit = tiling.tile  # threads share no tile row
        self.tiles = tuple(-(-o // tiling.tile) for o in window.output)
        tail = tuple(tiling.tile * t - o for t, o in zip(self.tiles, window.output, strict=True))
        self.xp = read_only(pad_spatial(x, window, tail=tail))
        dtype = x.dtype
        self.input_matrix = read_only(
            (np.abs(tiling.input) if magnitudes else tiling.input).astype(dtype))
        self.output_matrix = read_only(
            (np.abs(tiling.output) if magnitudes else tiling.output).astype(dtype))
        self.bias_values = read_only(np.zeros(problem.filters, dtype) if b is None
                                     else np.ascontiguousarray(b))
        if filters is None:
            shaped = w.reshape(problem.groups, self.mg, self.cg, 3, 3)
            filters = winograd.transform_filters(shaped, dtype, tiling, magnitudes)
        self.filters = filters
        self.planes = out.reshape(-1, *window.output)
        self.transform_inputs = winograd.transform_inputs.dispatcher
        self.transform_outputs = winograd.transform_outputs.dispatcher

    def _tile_rows(self, r0: int, r1: int) -> tuple[int, int]:
        """The tile rows that cover output rows r0:r1."""
        return r0 // self.tiling.tile, -(-r1 // self.tiling.tile)

    def _step(self, channels: int, filters: int, tile_rows: int) -> int:
        """Tile rows per block: the transformed inputs and the products of one tile row
        within block_bytes."""
        squares = self.tiling.alpha ** 2
        per_row = self.xp.itemsize * squares * self.tiles[1] * (channels + filters)
        return _rows_per_block(self.block_bytes, per_row, tile_rows)

    def transform(self, n: int, c0: int, c1: int, into: int, a: int, b: int, out: np.ndarray) -> None:
        """The input transform of channels c0:c1 of image n, tile rows a:b, into channels
        ``into:into + c1 - c0`` of ``out`` (alpha^2, channels, tiles)."""
        self.transform_inputs(self.xp[n], self.input_matrix, out, c0, c1, into, a, b, self.tiling.tile)

    def finish(self, n: int, g0: int, g1: int, lo: int, hi: int, a: int, r0: int, r1: int,
               products: np.ndarray) -> None:
        """The output transform of ``products`` (alpha^2, groups g0:g1, filters lo:hi, tiles
        of rows from a), with the bias, into the output rows r0:r1 (which they cover)."""
        first = (n * self.problem.groups + g0) * self.mg + lo
        count = (g1 - g0) * (hi - lo)
        bias = self.bias_values[g0 * self.mg + lo:(g1 - 1) * self.mg + hi]  # planes first:+count
        self.transform_outputs(read_only(products.reshape(products.shape[0], count, -1)),
                               self.output_matrix, bias, self.planes, first, a, r0, r1)
        if self.epilogue is not None:
            self.epilogue(self.out[n, g0:g1, lo:hi, r0:r1])

    def block(self, start: int, stop: int, r0: int, r1: int) -> None:
        cg, mg, tw = self.cg, self.mg, self.tiles[1]
        squares = self.tiling.alpha ** 2
        first, last = self._tile_rows(r0, r1)
        tile = self.tiling.tile
        for n, g0, g1 in _group_ranges(self.problem, start, stop):
            count = g1 - g0
            step = self._step(count * cg, count * mg, last - first)
            for a in range(first, last, step):
                b = min(last, a + step)
                inputs = np.empty((squares, count * cg, (b - a) * tw), self.xp.dtype)
                self.transform(n, g0 * cg, g1 * cg, 0, a, b, inputs)
                products = np.matmul(self.filters[:, g0:g1],
                                     inputs.reshape(squares, count, cg, (b - a) * tw))
                self.finish(n, g0, g1, 0, mg, a, max(r0, tile * a), min(r1, tile * b), products)

    def by_filters(self, pool: ThreadPool, threads: int, per_thread: bool) -> None:
        """Per block of tile rows: the input transform split over the channels, then the
        products and the output transform split over the filters."""
        problem, tw, tile = self.problem, self.tiles[1], self.tiling.tile
        squares = self.tiling.alpha ** 2
        channels, rows = problem.channels, self.window.output[0]
        first, last = self._tile_rows(0, rows)
        step = self._step(channels, problem.filters, last - first)
        for n in range(problem.batch):
            for a in range(first, last, step):
                b = min(last, a + step)
                inputs = np.empty((squares, channels, (b - a) * tw), self.xp.dtype)

                def transform(c0: int, c1: int, n: int = n, a: int = a, b: int = b,
                              inputs: np.ndarray = inputs) -> None:
                    self.transform(n, c0, c1, c0, a, b, inputs)

                pool.parallel_for(channels, transform, max_blocks=threads)

                def multiply(m0: int, m1: int, n: int = n, a: int = a, b: int = b,
                             inputs: np.ndarray = inputs) -> None:
                    for g, lo, hi in _filter_ranges(problem, m0, m1):
                        group_inputs = inputs[:, g * self.cg:(g + 1) * self.cg]
                        products = np.matmul(self.filters[:, g, lo:hi], group_inputs)
                        self.finish(n, g, g + 1, lo, hi, a, tile * a, min(rows, tile * b), products)

                pool.parallel_for(problem.filters, functools.partial(_limited, per_thread, multiply),
                                  max_blocks=threads)


_ALGORITHMS: dict[str, type[_Algorithm]] = {
    "im2col": _Columns,
    "im2col_wide": _WideColumns,
    "direct_1x1": _Pointwise,
    "per_filter": _PerFilter,
    "depthwise": _CompiledDepthwise,
    "depthwise_blocked": _BlockedDepthwise,
    "filters_blocked": _BlockedFilters,
    "columns_blocked": _BlockedColumns,
    "im2col_units": _Im2colUnits,
    "winograd": _Winograd,
    "shifted": _Shifted,
}

