"""Pooling kernels: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool and LRN.

Windows follow :class:`~onnx_light.kernels.window.WindowAttributes` (the geometry Conv uses):
``kernel_shape``, ``strides``, ``dilations``, ``pads``, ``auto_pad`` and ``ceil_mode``. A
window position outside the input holds no value: MaxPool pads with the type's lowest value
(-inf for floats), AveragePool with 0 and divides by the number of positions that count,
those inside the input, or with ``count_include_pad`` those inside the explicitly padded
input (positions that only ceil_mode adds never count, as in ONNX's reference).

A 2-D MaxPool without Indices on floats or bytes is compiled (:func:`max_pool_planes`: per
output row, the kernel rows' maximum into a padded row buffer, then the kernel columns'
maximum, in vectors of the host's width, no padded copy; docs/real-models.md measures it
against onnxruntime).
The others take numpy calls: MaxPool (without Indices) and AveragePool reduce one
spatial axis at a time (separable windows): K1 + ... + Kk shifted views of the padded input seen as
one flat array, each combined with one numpy call (:func:`_separable`); MaxPool with
Indices loops over the K1 * ... * Kk window positions. LRN computes ``t^-0.75`` (its usual
exponent) as ``1 / (sqrt(t) sqrt(sqrt(t)))``. When
the output is large (:data:`PARALLEL_MINIMUM` output elements times window positions) the
(image, channel) planes (LRN: the rows of the first spatial axis) are split across the pool,
each block computing its planes with the same calls as the serial path, so both paths give
identical results. These kernels are not tunable.

MaxPool is exact in every type. AveragePool, LRN and GlobalAveragePool compute float16 and
bfloat16 in float32 and round once; float32 sums in float32 (a window has few terms). A float
GlobalAveragePool is compiled (:func:`mean_rows`: one vectorised float64 sum per plane,
rounded once; ReduceMean over trailing axes shares it, :func:`mean_of_rows`), as fast as a
plane is read; numpy's reduction of many short planes (the
squeeze-and-excitation pools of MobileNetV3 and EfficientNet) is a few times slower.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext, Prepared, TensorSpec, compute_dtype
from .compiled import CompiledIntrinsic, compiled, vector_bytes, vector_lanes, wide_vectors
from .declaration import KernelDeclaration, declare, dispatch_table
from .window import Window, WindowAttributes, pad_spatial

__all__ = [
    "KERNELS",
    "LRN",
    "MEAN_ROWS_TYPES",
    "PARALLEL_MINIMUM",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "MaxPool",
    "mean_of_rows",
]

# Output elements x window positions from which the planes are split across the pool: below
# it one parallel region (tens of microseconds) costs more than it saves.
PARALLEL_MINIMUM = 1 << 17

_FLOATS = (T.FLOAT16, T.FLOAT, T.DOUBLE)
_COMPILED_TYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: The types :func:`mean_of_rows` takes (GlobalAveragePool's and ReduceMean's compiled means).
MEAN_ROWS_TYPES = _COMPILED_TYPES
_MAX_POOL_TYPES = (*_COMPILED_TYPES, np.dtype(np.int8), np.dtype(np.uint8))  # MaxPool's compiled planes
_FLOATS_22 = (*_FLOATS, T.BFLOAT16)


def _position_slices(window: Window, position: Sequence[int]) -> tuple[slice, ...]:
    """The strided slice of the padded input that window position ``position`` reads."""
    return tuple(slice(k * d, k * d + (o - 1) * s + 1, s) for k, d, o, s in
                 zip(position, window.dilations, window.output, window.strides, strict=True))


def _positions(window: Window) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(k) for k in window.kernel)))


def _separable(source: np.ndarray, window: Window, combine: np.ufunc, target: np.ndarray) -> None:
    """Reduce every window of ``source`` (planes, *padded spatial) into ``target`` (planes,
    *output) with ``combine`` (``np.maximum``, ``np.add``), one spatial axis at a time, the
    last first (K1 + ... + Kk - k calls instead of K1 * ... * Kk - 1), each at stride 1 on
    the whole (contiguous) array seen as one flat array: a window tap along an axis is the
    array shifted by that axis' element stride, so every call runs one long contiguous loop
    (numpy's short strided loops over rows cost 1.3 to 2 times more in total here, stride-2
    windows included although stride 1 computes 4 times the outputs). Windows that straddle
    a row or a plane end are computed too and never read: the strided view that picks the
    outputs (and applies the strides) skips them."""
    source = np.ascontiguousarray(source)
    planes, padded = source.shape[0], source.shape[1:]
    steps = [math.prod(padded[axis + 1:]) for axis in range(len(padded))]
    current = source.reshape(-1)
    buffers: list[np.ndarray | None] = [None, None]
    for index, axis in enumerate(reversed(range(len(padded)))):
        k, d, step = window.kernel[axis], window.dilations[axis], steps[axis]
        length = current.size - (k - 1) * d * step
        if buffers[index % 2] is None:
            buffers[index % 2] = np.empty(length, source.dtype)
        destination = buffers[index % 2][:length]
        if k == 1:
            np.copyto(destination, current[:length])
        else:
            combine(current[:length], current[d * step:d * step + length], out=destination)
        for tap in range(2, k):
            combine(destination, current[tap * d * step:tap * d * step + length], out=destination)
        current = destination
    item = source.itemsize
    strides = (math.prod(padded) * item, *(step * stride * item for step, stride in
                                          zip(steps, window.strides, strict=True)))
    picked = np.lib.stride_tricks.as_strided(current, (planes, *window.output), strides, writeable=False)
    np.copyto(target, picked)


def _planes(kernel: Kernel, count: int, work: int, block: Callable[[int, int], None]) -> None:
    """``block(start, stop)`` over ``count`` planes, split across the pool when ``work`` pays
    (the blocks of ``parallel_for``, claimed by whichever thread is free)."""
    pool = kernel.pool
    if pool is not None and pool.num_threads > 1 and count > 1 and work >= PARALLEL_MINIMUM:
        pool.parallel_chunks(count, block, pool.num_threads)
    else:
        block(0, count)


class _Pool(Kernel):
    """What MaxPool and AveragePool share: attributes, geometry, input checks."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.attributes = WindowAttributes.read(ctx, ceil_mode=bool(ctx.attribute("ceil_mode", 0)))
        if self.attributes.kernel_shape is None:
            raise ctx.error("attribute kernel_shape is required")

    def window(self, x: np.ndarray) -> Window:
        if x.ndim < 3:
            raise self.ctx.error(f"X must have shape (N, C, D1, ...), got {list(x.shape)}")
        return self.attributes.window(self.ctx, x.shape[2:])


def _lowest(dtype: np.dtype) -> object:
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return -np.inf


@compiled(inline="always")
def _nan_max(m: float, v: float) -> float:
    """numpy's maximum of ``m`` and ``v`` (NaN wins), for the positions the vectors of
    :func:`_build_vector_max` (which compute the same) leave: ``|``, not ``or``, so that LLVM
    sees two compares and a select, not a branch."""
    return v if (v > m) | (v != v) else m


@functools.cache
def _build_vector_max(numba: ModuleType, parts: int) -> Any:
    """The intrinsic ``vector_max(source, start, step, rows, first, second, at, fresh)``: the
    maximum (:func:`_nan_max`) of the ``parts * L`` values at ``source[start + r * step:]``
    over ``r < rows`` (``L``: one 64-byte vector of the type; ``rows`` >= 1), kept in
    registers, dealt to ``parts`` (1 or 2) targets (``parts`` 2: the even ones to ``first``,
    the odd ones to ``second``, by two shuffles; ``parts`` 1 ignores ``second``), each
    target's ``L`` values stored at ``target[at:]`` when ``fresh``, else combined with them.
    LLVM does not vectorize a loop of stride-2 reads, nor a unit-stride loop shorter than its
    4 unrolled vectors (64 float32 columns: wider than most pools' rows)."""
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def vector_max(typingctx: Any, source: Any, start: Any, step: Any, rows: Any, first: Any, second: Any,
                   at: Any, fresh: Any) -> Any:
        if not all(isinstance(a, types.Array) and a.dtype == source.dtype for a in (first, second)):
            return None
        signature = types.void(source, types.uintp, types.uintp, types.uintp, first, second, types.uintp,
                               types.boolean)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            def data(index: int) -> Any:
                return context.make_array(sig.args[index])(context, builder, args[index]).data

            element = context.get_value_type(sig.args[0].dtype)
            lanes = vector_bytes() // context.get_abi_sizeof(element)
            vector = ir.VectorType(element, lanes)
            i32, i64 = ir.IntType(32), ir.IntType(64)

            def at(base: Any, offset: Any) -> Any:
                return builder.bitcast(builder.gep(base, [offset]), vector.as_pointer())

            dtype = sig.args[0].dtype

            def maximum(old: Any, value: Any) -> Any:
                if isinstance(dtype, types.Integer):
                    compare = builder.icmp_signed if dtype.signed else builder.icmp_unsigned
                    return builder.select(compare(">", value, old), value, old)
                take = builder.or_(builder.fcmp_ordered(">", value, old),
                                   builder.fcmp_unordered("uno", value, value))
                return builder.select(take, value, old)

            def load(row: Any) -> list[Any]:
                read = builder.gep(data(0), [builder.add(args[1], builder.mul(row, args[2]))])
                return [builder.load(at(read, ir.Constant(i64, h * lanes)), align=1) for h in range(parts)]

            sums = [cgutils.alloca_once_value(builder, value) for value in load(ir.Constant(i64, 0))]
            with cgutils.for_range(builder, builder.sub(args[3], ir.Constant(i64, 1))) as loop:
                row = builder.add(loop.index, ir.Constant(i64, 1))
                for total, value in zip(sums, load(row), strict=True):
                    builder.store(maximum(builder.load(total), value), total)
            loaded = [builder.load(total) for total in sums]
            for part in range(parts):
                value = loaded[0]
                if parts == 2:
                    picks = [2 * k + part for k in range(lanes)]
                    value = builder.shuffle_vector(*loaded, ir.Constant(ir.VectorType(i32, lanes), picks))
                target = at(data(4 + part), args[6])
                combined = maximum(builder.load(target, align=1), value)
                builder.store(builder.select(args[7], value, combined), target, align=1)
            return context.get_dummy_value()

        return signature, codegen

    return vector_max


_vector_max = CompiledIntrinsic(functools.partial(_build_vector_max, parts=1), "vector_max")
_deinterleave = CompiledIntrinsic(functools.partial(_build_vector_max, parts=2), "deinterleave")


@compiled
def _combine(target: np.ndarray, at: int, source: np.ndarray, start: int, count: int, fresh: bool,
             step: int = 0, rows: int = 1) -> None:
    """``target[at:][:count]`` = the maximum (:func:`_nan_max`) of ``source[start + r *
    step:][:count]`` over ``r < rows``, stored (``fresh``) or combined with ``target``'s values:
    64-byte vectors (:data:`_vector_max`), the last one overlapping the one before when
    ``count`` is not a multiple (storing or combining a value twice changes nothing), shorter
    runs one by one."""
    into, read, lanes = np.uintp(at), np.uintp(start), vector_lanes(source)
    if count >= lanes:
        whole = np.uintp(count) // lanes
        for b in range(whole):
            _vector_max(source, read + b * lanes, np.uintp(step), np.uintp(rows), target, target,
                        into + b * lanes, fresh)
        if np.uintp(count) % lanes:
            last = np.uintp(count) - lanes
            _vector_max(source, read + last, np.uintp(step), np.uintp(rows), target, target, into + last,
                        fresh)
    else:
        for j in range(np.uintp(count)):
            value = source[read + j]
            for r in range(1, rows):
                value = _nan_max(value, source[read + np.uintp(r * step) + j])
            target[into + j] = value if fresh else _nan_max(target[into + j], value)


@compiled
def _split_row(source: np.ndarray, read: int, step: int, rows: int, evens: np.ndarray, odds: np.ndarray,
               low: int, high: int) -> None:
    """Positions ``low:high`` of a padded row (position p: the maximum of ``source[read + r *
    step + p]`` over ``r < rows``) stored into ``evens[p // 2]`` (p even) and ``odds[p // 2]``
    (p odd): 64-byte blocks of pairs by :data:`_deinterleave` (the last overlapping the one
    before), the ends and short rows one by one (inline: calling :func:`_combine` for them
    cost reference counting of the arrays at every call)."""
    lanes = vector_lanes(source)
    p = low + low % 2  # the first even position
    pairs = np.uintp(max(0, (high - p) // 2))
    start, at = np.uintp(read + p), np.uintp(p // 2)
    vectors_from, vectors_to = high, high  # the positions the blocks cover
    if pairs >= lanes:
        for b in range(pairs // lanes):
            _deinterleave(source, start + 2 * b * lanes, np.uintp(step), np.uintp(rows), evens, odds,
                          at + b * lanes, True)
        if pairs % lanes:
            last = pairs - lanes
            _deinterleave(source, start + 2 * last, np.uintp(step), np.uintp(rows), evens, odds, at + last,
                          True)
        vectors_from, vectors_to = p, p + 2 * pairs
    for end in range(2):
        for position in range(low, vectors_from) if end == 0 else range(vectors_to, high):
            read_at = np.uintp(read + position)
            value = source[read_at]
            for r in range(1, rows):
                value = _nan_max(value, source[read_at + np.uintp(r * step)])
            if position % 2 == 0:
                evens[position // 2] = value
            else:
                odds[position // 2] = value


@compiled
def max_pool_planes(x: np.ndarray, out: np.ndarray, first: int, last: int,
                    kernel: tuple[int, int], strides: tuple[int, int],
                    dilations: tuple[int, int], begin: tuple[int, int], lowest: Any = None) -> None:
    """Planes ``first:last`` of ``out`` (planes, OH, OW): the maximum over each window of
    ``x`` (planes, H, W), positions outside ``x`` skipped (as the lowest value pads them; a
    window with none is ``lowest``: -inf for floats, the type's lowest for integers, which
    must give it), NaN propagated as numpy's maximum does. Separable, per output row: the
    maximum of its kernel rows inside ``x`` into a padded row buffer (``lowest`` around the
    input's columns), contiguous and full width; then the maximum of the kernel columns' taps
    into the output row. At a column stride of 2 the buffer is kept as its even and its odd
    positions (:func:`_split_row`), so that every tap reads at unit stride; other strides
    read the buffer at their stride, one by one. The maxima run in vectors of the host's
    width (:func:`~onnx_light.kernels.compiled.vector_bytes`) written with llvmlite
    (:func:`_combine`): LLVM left the loops scalar."""
    wide_vectors()
    height, width = x.shape[1], x.shape[2]
    out_h, out_w = out.shape[1], out.shape[2]
    source, target = x.reshape(-1), out.reshape(-1)
    stride_w, step_w = strides[1], dilations[1]
    span = (out_w - 1) * stride_w + (kernel[1] - 1) * step_w + 1  # the padded row the windows read
    low, high = min(begin[1], span), min(begin[1] + width, span)  # the input's columns in it
    split = stride_w == 2
    fill = -np.inf if lowest is None else lowest
    evens = np.full((span + 1) // 2 if split else span, fill, out.dtype)  # the row (split: even p)
    odds = np.full((span + 1) // 2 if split else 0, fill, out.dtype)
    for plane in range(first, last):
        base = plane * height * width
        done = plane * out_h * out_w
        for oh in range(out_h):
            top = oh * strides[0] - begin[0]  # the input row of kernel row 0
            k0 = max(0, -(top // dilations[0]))  # the kernel rows inside x: k0:k1
            k1 = min(kernel[0], (height - 1 - top) // dilations[0] + 1) if top < height else 0
            if k0 < k1:
                read = base + (top + k0 * dilations[0]) * width - low  # position p at read + p
                step, rows = dilations[0] * width, k1 - k0
                if split:
                    _split_row(source, read, step, rows, evens, odds, low, high)
                else:
                    _combine(evens, low, source, read + low, high - low, True, step, rows)
            else:  # no kernel row inside x: the windows hold no value
                evens[:] = fill
                odds[:] = fill
            into = done + oh * out_w
            if split:  # tap kw reads position kw * step_w + 2 * ow: evens or odds at kw * step_w // 2 + ow
                if step_w % 2 == 0:
                    _combine(target, into, evens, 0, out_w, True, step_w // 2, kernel[1])
                else:  # even taps in evens, odd ones in odds
                    _combine(target, into, evens, 0, out_w, True, step_w, (kernel[1] + 1) // 2)
                    if kernel[1] > 1:
                        _combine(target, into, odds, step_w // 2, out_w, False, step_w, kernel[1] // 2)
            elif stride_w == 1:
                _combine(target, into, evens, 0, out_w, True, step_w, kernel[1])
            else:
                for ow in range(np.uintp(out_w)):
                    at = np.uintp(ow * stride_w)
                    value = evens[at]
                    for kw in range(1, kernel[1]):
                        value = _nan_max(value, evens[at + np.uintp(kw * step_w)])
                    target[np.uintp(into) + ow] = value


class MaxPool(_Pool):
    """ONNX MaxPool (1, 8, 10, 11, 12, 22), with the optional Indices output (since 8).

    Indices are flat positions in X (``storage_order`` 0: row-major spatial axes, 1:
    column-major), the first maximum of a window in row-major window order.
    """

    op_type: ClassVar[str] = "MaxPool"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.storage_order = int(ctx.attribute("storage_order", 0))
        if self.storage_order not in (0, 1):
            raise ctx.error(f"storage_order must be 0 or 1, got {self.storage_order}")
        self.indices = ctx.num_outputs > 1

    def _compiled(self, dtype: np.dtype) -> bool:
        """Whether runs on ``dtype`` take :func:`max_pool_planes`: 2-D, no Indices, float or byte."""
        return (not self.indices and self.attributes.kernel_shape is not None
                and len(self.attributes.kernel_shape) == 2 and np.dtype(dtype) in _MAX_POOL_TYPES)

    @staticmethod
    def _lowest_argument(dtype: np.dtype) -> tuple[Any, ...]:
        """:func:`max_pool_planes`'s ``lowest`` for ``dtype``: none for floats (-inf)."""
        return () if dtype.kind == "f" else (dtype.type(np.iinfo(dtype).min),)

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile :func:`max_pool_planes` for the input's type (at construction)."""
        dtype = self.ctx.input_dtype(0)
        if dtype is not None and self._compiled(dtype):
            dtype = np.dtype(dtype)
            max_pool_planes.dispatcher(np.zeros((1, 1, 1), dtype), np.empty((1, 1, 1), dtype), 0, 1,
                                       (1, 1), (1, 1), (1, 1), (0, 0), *self._lowest_argument(dtype))
        return None

    def _run_compiled(self, x: np.ndarray, window: Window) -> np.ndarray:
        n, c = x.shape[:2]
        out = np.empty((n, c, *window.output), x.dtype)
        planes_in = np.ascontiguousarray(x).reshape(n * c, *x.shape[2:])
        planes_out = out.reshape(n * c, *window.output)
        kernel = max_pool_planes.dispatcher
        geometry = (tuple(window.kernel), tuple(window.strides), tuple(window.dilations), tuple(window.begin),
                    *self._lowest_argument(x.dtype))

        def block(start: int, stop: int) -> None:
            kernel(planes_in, planes_out, start, stop, *geometry)

        if out.size:
            _planes(self, n * c, out.size * math.prod(window.kernel), block)
        return out

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        window = self.window(x)
        if self._compiled(x.dtype) and x.ndim == 4:
            return (self._run_compiled(x, window),)
        lowest = _lowest(x.dtype)
        xp = pad_spatial(x, window, lowest)
        n, c = x.shape[:2]
        out = np.empty((n, c, *window.output), x.dtype)
        positions = _positions(window)
        planes_in = xp.reshape(n * c, *xp.shape[2:])
        planes_out = out.reshape(n * c, *window.output)
        work = out.size * len(positions)
        if not self.indices:
            def block(start: int, stop: int) -> None:
                _separable(planes_in[start:stop], window, np.maximum, planes_out[start:stop])

            if out.size:
                _planes(self, n * c, work, block)
            return (out,)
        indices = np.empty(out.shape, np.int64)
        planes_indices = indices.reshape(n * c, *window.output)
        offsets = [self._flat_offsets(window, position) for position in positions]
        plane_size = math.prod(window.input)

        def indexed_block(start: int, stop: int) -> None:
            target = planes_out[start:stop]
            where = planes_indices[start:stop]
            for index, position in enumerate(positions):
                view = planes_in[(slice(start, stop), *_position_slices(window, position))]
                if index == 0:
                    np.copyto(target, view)
                    where[...] = offsets[0]
                else:
                    better = view > target
                    np.copyto(target, view, where=better)
                    np.copyto(where, offsets[index], where=better)
            where += (np.arange(start, stop, dtype=np.int64) * plane_size).reshape(
                (-1,) + (1,) * len(window.output))

        if out.size:
            _planes(self, n * c, work, indexed_block)
        return (out, indices)

    def _flat_offsets(self, window: Window, position: Sequence[int]) -> np.ndarray:
        """Flat spatial index (in X, unpadded) each output position reads at ``position``."""
        rank = len(window.input)
        if self.storage_order == 0:
            steps = [math.prod(window.input[axis + 1:]) for axis in range(rank)]
        else:
            steps = [math.prod(window.input[:axis]) for axis in range(rank)]
        total = np.zeros(window.output, np.int64)
        for axis in range(rank):
            coordinate = (np.arange(window.output[axis], dtype=np.int64) * window.strides[axis]
                          - window.begin[axis] + position[axis] * window.dilations[axis])
            shape = [1] * rank
            shape[axis] = -1
            total = total + (coordinate * steps[axis]).reshape(shape)
        return total


class AveragePool(_Pool):
    """ONNX AveragePool (1, 7, 10, 11, 19, 22): count_include_pad (7), ceil_mode (10),
    dilations (19)."""

    op_type: ClassVar[str] = "AveragePool"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.count_include_pad = bool(ctx.attribute("count_include_pad", 0))

    def divisor(self, window: Window) -> np.ndarray:
        """How many positions of each output's window count, shaped like the output."""
        rank = len(window.input)
        total = np.ones(window.output, np.float64)
        for axis in range(rank):
            low = -window.begin[axis] if self.count_include_pad else 0
            high = window.input[axis] + (window.end[axis] if self.count_include_pad else 0)
            starts = np.arange(window.output[axis]) * window.strides[axis] - window.begin[axis]
            taps = starts[:, None] + np.arange(window.kernel[axis]) * window.dilations[axis]
            counts = np.count_nonzero((taps >= low) & (taps < high), axis=1).astype(np.float64)
            shape = [1] * rank
            shape[axis] = -1
            total = total * counts.reshape(shape)
        return total

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        window = self.window(x)
        compute = compute_dtype(x.dtype)
        xp = pad_spatial(x.astype(compute, copy=False), window, 0)
        n, c = x.shape[:2]
        out = np.empty((n, c, *window.output), compute)
        positions = _positions(window)
        planes_in = xp.reshape(n * c, *xp.shape[2:])
        planes_out = out.reshape(n * c, *window.output)
        divisor = self.divisor(window).astype(compute)
        with np.errstate(divide="ignore", invalid="ignore"):
            reciprocal = (1 / divisor).astype(compute)

        uniform = divisor.size > 0 and bool(np.all(divisor == divisor.flat[0]))

        def block(start: int, stop: int) -> None:
            target = planes_out[start:stop]
            _separable(planes_in[start:stop], window, np.add, target)
            if uniform:
                target *= reciprocal.flat[0]
            else:
                target /= divisor

        if out.size:
            _planes(self, n * c, out.size * len(positions), block)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)


class _GlobalPool(Kernel):
    """A reduction over every spatial axis of (N, C, ...), kept as size 1 (opsets 1, 22)."""

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        if x.ndim < 2:
            raise self.ctx.error(f"X must have shape (N, C, ...), got {list(x.shape)}")
        return (self._reduce(x, tuple(range(2, x.ndim))),)

    def _reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError


@compiled(fastmath={"reassoc"})
def mean_rows(x: np.ndarray, out: np.ndarray) -> None:
    """``out[r]``: the mean of row ``r`` of ``x`` (rows, n), summed in float64 (in any order:
    LLVM vectorises the sum) and rounded once to ``out``'s type."""
    n = x.shape[1]
    for r in range(x.shape[0]):
        total = 0.0
        for j in range(n):
            total += np.float64(x[r, j])
        out[r] = total / n


class GlobalAveragePool(_GlobalPool):
    """ONNX GlobalAveragePool: the mean (computed in float32 for half types; float32 and
    float64 by :func:`mean_rows`, in float64). With a fixed input spec it is prepared
    (:meth:`prepare`): one compiled call writing the means into the memory plan's buffer."""

    op_type: ClassVar[str] = "GlobalAveragePool"

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile :func:`mean_rows` for the input's type (at construction)."""
        dtype = self.ctx.input_dtype(0)
        if dtype is not None and np.dtype(dtype) in MEAN_ROWS_TYPES:
            mean_of_rows(np.zeros((1, 1), dtype))
        return None

    def _reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        if x.dtype in MEAN_ROWS_TYPES and x.size and x.ndim > 2:
            means = mean_of_rows(x.reshape(x.shape[0] * x.shape[1], -1))
            return means.reshape(x.shape[:2] + (1,) * (x.ndim - 2))
        result = np.mean(x, axis=axes, dtype=compute_dtype(x.dtype), keepdims=True)
        return result.astype(x.dtype, copy=False)

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """:func:`mean_rows` straight into the buffer for a float32 or float64 X (N, C, D1,
        ...) of a fixed shape with non-empty planes (its versions for a writeable and a
        read-only X compiled, or loaded, now): the values of :meth:`run`."""
        if len(inputs) != 1:
            return None
        shape, dtype = inputs[0]
        if len(shape) < 3 or np.dtype(dtype) not in MEAN_ROWS_TYPES or math.prod(shape) == 0:
            return None
        rows = (shape[0] * shape[1], math.prod(shape[2:]))
        means = mean_rows.dispatcher
        for writeable in (True, False):  # another step's output, a feed
            x = np.zeros((1, 1), dtype)
            x.flags.writeable = writeable
            means(x, np.empty(1, dtype))

        def compute(x: np.ndarray, out: np.ndarray) -> None:
            means(x.reshape(rows), out.reshape(rows[0]))

        return Prepared(compute, (*shape[:2], *(1,) * (len(shape) - 2)), np.dtype(dtype))


def mean_of_rows(rows: np.ndarray) -> np.ndarray:
    """The mean of each row of ``rows`` (2-D, float32 or float64, any strides) by
    :func:`mean_rows`, in its type."""
    rows = np.ascontiguousarray(rows)
    if rows.flags.writeable:
        rows = rows.view()
        rows.flags.writeable = False  # one compiled version, whether the input is writable or not
    out = np.empty(rows.shape[0], rows.dtype)
    mean_rows.dispatcher(rows, out)
    return out


class GlobalMaxPool(_GlobalPool):
    """ONNX GlobalMaxPool: the maximum."""

    op_type: ClassVar[str] = "GlobalMaxPool"

    def _reduce(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return np.max(x, axis=axes, keepdims=True)


class LRN(Kernel):
    """ONNX LRN (1, 13): ``y = x / (bias + alpha / size * sum of x^2 over nearby channels)^beta``.

    The sum runs over channels ``c - floor((size - 1) / 2)`` to ``c + ceil((size - 1) / 2)``
    (clipped to the tensor).
    """

    op_type: ClassVar[str] = "LRN"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        size = ctx.attribute("size")
        if size is None or int(size) < 1:
            raise ctx.error(f"attribute size must be a positive int, got {size!r}")
        self.size = int(size)
        self.alpha = float(np.float32(ctx.attribute("alpha", 1e-4)))
        self.beta = float(np.float32(ctx.attribute("beta", 0.75)))
        self.bias = float(np.float32(ctx.attribute("bias", 1.0)))

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        if x.ndim < 3:
            raise self.ctx.error(f"X must have shape (N, C, D1, ...), got {list(x.shape)}")
        compute = compute_dtype(x.dtype)
        data = x.astype(compute, copy=False)
        channels = x.shape[1]
        before = (self.size - 1) // 2
        out = np.empty(x.shape, compute)
        scale = compute.type(self.alpha / self.size)
        bias, exponent = compute.type(self.bias), compute.type(-self.beta)

        def block(start: int, stop: int) -> None:
            rows = (slice(None), slice(None), slice(start, stop))
            part = data[rows]
            square = np.square(part)
            padded = np.zeros((x.shape[0], channels + self.size - 1, *square.shape[2:]), compute)
            padded[:, before:before + channels] = square
            total = np.zeros(square.shape, compute)
            for shift in range(self.size):
                total += padded[:, shift:shift + channels]
            total *= scale
            total += bias
            if self.beta == 0.75:  # t^0.75 = sqrt(t) * sqrt(sqrt(t)): two sqrt for one pow
                root = np.sqrt(total)
                np.sqrt(root, out=total)
                total *= root
                np.divide(part, total, out=out[rows])
            else:
                np.power(total, exponent, out=total)
                np.multiply(part, total, out=out[rows])

        rows = x.shape[2]
        if out.size:
            _planes(self, rows, out.size * self.size * 4, block)
        return (out if out.dtype == x.dtype else out.astype(x.dtype),)


_POOL_TYPES = {1: _FLOATS, 22: _FLOATS_22}
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(AveragePool, (1, 7, 10, 11, 19, 22), types=_POOL_TYPES),
    declare(GlobalAveragePool, (1, 22), types=_POOL_TYPES),
    declare(GlobalMaxPool, (1, 22), types=_POOL_TYPES),
    declare(LRN, (1, 13), types={1: _FLOATS, 13: _FLOATS_22}),
    declare(MaxPool, (1, 8, 10, 11, 12, 22),
            types={1: _FLOATS, 12: (*_FLOATS, T.INT8, T.UINT8), 22: (*_FLOATS_22, T.INT8, T.UINT8)}),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
