"""What every Conv algorithm shares: the block interface, the ranges a block covers, how a
plan runs the blocks on the pool, and the fused input map (:class:`Prologue`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ...parallel import BLAS, ThreadPool
from .config import CHUNKS_PER_THREAD
from .finish import Finish
from .problem import _Problem


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


def _execute(problem: _Problem, algorithm: _Algorithm, pool: ThreadPool | None, threads: int) -> None:
    """Fill the algorithm's output (N, M, *output) with the convolution, following
    ``problem.plan``."""
    items, rows = problem.batch * problem.groups, problem.window.output[0]
    plan = problem.plan
    with BLAS.limited(threads if plan == "blas" else 1) if algorithm.uses_blas else nullcontext():
        if plan in ("serial", "blas", "region") or pool is None:  # region: inside the call
            algorithm.block(0, items, 0, rows)
            return
        per_thread = BLAS.per_thread and algorithm.uses_blas
        if plan == "filters":
            algorithm.by_filters(pool, threads, per_thread)
        elif plan == "batch_and_groups":
            def run_items(start: int, stop: int) -> None:
                _limited(per_thread, algorithm.block, start, stop, 0, rows)

            split(pool, items, run_items, threads)
        else:
            unit = algorithm.row_unit

            def run_rows(start: int, stop: int) -> None:
                _limited(per_thread, algorithm.block, 0, items, start * unit, min(stop * unit, rows))

            split(pool, -(-rows // unit), run_rows, threads)


def split(pool: ThreadPool, n: int, fn: Callable[[int, int], None], threads: int) -> None:
    """``fn`` over ``range(n)`` on the pool in :data:`CHUNKS_PER_THREAD` chunks per thread,
    each taken by the first free thread: a thread whose processor another program holds
    takes fewer, instead of the region waiting for its fixed half."""
    pool.parallel_chunks(n, fn, threads * CHUNKS_PER_THREAD)


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
    uses_blas: ClassVar[bool] = True  # whether its blocks call BLAS (which then gets its limit)

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

    def complete(self, target: np.ndarray, g0: int, g1: int, lo: int, hi: int, trailing: int) -> None:
        """The bias of groups g0:g1, filters lo:hi (broadcast over ``trailing`` axes) added to
        ``target``, then the epilogue: one pass when the epilogue is a
        :class:`~onnx_light.kernels.conv.finish.Finish`."""
        bias = self.bias_of(g0, g1, lo, hi, trailing)
        epilogue = self.epilogue
        if isinstance(epilogue, Finish):
            epilogue(target, bias)
            return
        if bias is not None:
            target += bias
        if epilogue is not None:
            epilogue(target)

    def write(self, target: np.ndarray, computed: np.ndarray, g0: int, g1: int, lo: int, hi: int,
              trailing: int) -> None:
        """``computed`` plus the bias of groups g0:g1, filters lo:hi (broadcast over ``trailing``
        axes) into ``target``, one pass; then the epilogue (with a
        :class:`~onnx_light.kernels.conv.finish.Finish`, the same pass)."""
        bias = self.bias_of(g0, g1, lo, hi, trailing)
        if isinstance(self.epilogue, Finish):
            self.epilogue.copy(target, computed, bias)
            return
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


