"""Scaled dot-product attention of float32 heads in one compiled call (or one parallel region).

:func:`attention_tasks` computes ``softmax(scale * Q K^T + mask) V`` for every (batch, head)
pair of 4-D operands, in tasks of ``block`` query rows. A task packs its rows of Q, multiplies
them by K^T with the register-blocked micro-kernel of :mod:`.packed_gemm`
(:func:`~.packed_gemm.panels_over_rows`) into a block of scores that stays in the cache, runs
the compiled softmax rows on it (:func:`.compiled_softmax.softmax_packed_rows`: scale and mask
in one rounding, float64 sum), which write the probabilities packed for the micro-kernel, and
multiplies them by V into the output's rows. K^T and V are packed into panels once per
(batch, key/value head) and thread: consecutive tasks of a thread reuse them, and with
grouped-query attention the ``heads // groups`` query heads of one key/value head share
them. Q, K^T and V are read in place through their strides (Transposes applied as views,
batch broadcasts as zero strides): nothing is copied but the packed operands.

:func:`attention_parallel` hands the same tasks out to numba's threads in one region, an
atomic counter giving each thread the next task, so that a thread that starts late takes
fewer: the whole step is one region, where splitting the heads over the pool was a pool
region around three calls per block (docs/attention.md measures both against BLAS's products).

Numerics: each score is ``sum_p q[i, p] k[p, j]`` in order of p from +0 with one rounding per
fused multiply-add, each output ``sum_j P[i, j] v[j, c]`` likewise: one of the summation
orders the BLAS bound covers (``|error| <= n u sum |a||b|`` to first order, n the length of
the sum); with the softmax's 2 units, tests/test_attention_fusion.py states and checks the
bound against the unfused graph. A task computes its rows the same way whichever thread runs
it: the same bits at any thread count.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .compiled import compiled, load_numba, prange
from .compiled_softmax import softmax_packed_rows
from .packed_gemm import MR, NR, packed_layout, panels_over_rows
from .spin import claim, end_of_tasks

__all__ = ["SCORES_BYTES", "attention_parallel", "attention_serial", "attention_tasks", "block_rows",
           "entry"]

#: Bytes of the block of scores a task computes (its rows: a multiple of the micro-kernel's
#: height): the block, its packed copy and the panels of K and V stay in the L2 cache.
SCORES_BYTES = 1 << 15


def block_rows(queries: int, keys: int, rows: int) -> int:
    """The query rows of one task: as many as :data:`SCORES_BYTES` of scores hold, a multiple
    of ``rows`` (the micro-kernel's height), at least ``rows``, at most ``queries`` rounded
    up to a multiple of ``rows``."""
    fit = max(rows, SCORES_BYTES // (4 * max(keys, 1)) // rows * rows)
    return min(fit, -(-queries // rows) * rows)


@compiled
def _pack_rows(x: np.ndarray, first: int, last: int, packed: np.ndarray) -> None:
    """Rows ``first..last-1`` of the 2-D ``x`` (any strides) into ``packed`` (blocks, depth,
    MR): each step's ``MR`` values contiguous, zeros past ``last`` in the last block."""
    depth = x.shape[1]
    blocks = -(-(last - first) // MR)
    for block in range(blocks):
        for r in range(MR):
            row = first + block * MR + r
            if row < last:
                for p in range(depth):
                    packed[block, p, r] = x[row, p]
            else:
                for p in range(depth):
                    packed[block, p, r] = 0.0


@compiled
def _pack_columns(x: np.ndarray, panels: np.ndarray) -> None:
    """The 2-D ``x`` (depth, columns), any strides, into ``panels`` (P, depth, NR): panel q's
    step p holds ``x[p, q NR : (q + 1) NR]``, zeros past the last column. The loops read
    along ``x``'s smaller stride (K^T is a transposed view: its columns are K's rows)."""
    depth, columns = x.shape
    full = columns // NR * NR
    if x.strides[0] < x.strides[1]:
        for column in range(columns):
            panel, c = column // NR, column % NR
            for p in range(depth):
                panels[panel, p, c] = x[p, column]
    else:
        for p in range(depth):
            for column in range(columns):
                panels[column // NR, p, column % NR] = x[p, column]
    if full < columns:
        for p in range(depth):
            for c in range(columns - full, NR):
                panels[full // NR, p, c] = 0.0


@compiled
def attention_tasks(q: np.ndarray, kt: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray,
                    mask_rows: np.ndarray, out: np.ndarray, block: int, state: np.ndarray) -> None:
    """The tasks claimed from ``state[0]`` (an atomic counter; each thread of a region calls
    this with the same ``state``) of ``out[b H + h] = softmax(scale * q[b, h] @ kt[b, g] +
    mask[mask_rows[...]]) @ v[b, g]``, ``g = h // (H // G)``: ``q`` (B, H, queries, depth),
    ``kt`` (B, G, depth, keys), ``v`` (B, G, keys, width), ``out`` (B H, queries, width)
    C-contiguous; ``mask_rows`` the mask row of each of the B H queries score rows (empty: no
    mask). A task is ``block`` rows (a multiple of ``MR``) of one pair's queries."""
    batch, heads, queries, depth = q.shape
    groups, keys, width = kt.shape[1], kt.shape[3], v.shape[3]
    repeat = heads // groups
    blocks = -(-queries // block)
    tasks = batch * heads * blocks
    masked = mask_rows.shape[0] > 0
    key_panels = np.empty((-(-keys // NR), depth, NR), np.float32)
    value_panels = np.empty((-(-width // NR), keys, NR), np.float32)
    bias = np.zeros(NR * max(key_panels.shape[0], value_panels.shape[0]), np.float32)
    rows_q = np.empty((block // MR, depth, MR), np.float32)
    rows_p = np.zeros((block // MR, keys, MR), np.float32)  # rows past a task's: finite
    scores = np.empty((block, keys), np.float32)
    key_layout, value_layout = packed_layout(depth), packed_layout(keys)
    packed = -1
    task = claim(state, 0)
    while task < tasks:
        pair = task // blocks
        b, h = pair // heads, pair % heads
        g = h // repeat
        if b * groups + g != packed:
            _pack_columns(kt[b, g], key_panels)
            _pack_columns(v[b, g], value_panels)
            packed = b * groups + g
        top = task % blocks * block
        rows = min(block, queries - top)
        _pack_rows(q[b, h], top, top + rows, rows_q)
        panels_over_rows(rows_q, key_panels, key_layout, bias, False, scores, 0, rows, 0, 0, keys)
        first = pair * queries + top
        if masked:
            softmax_packed_rows(scores, scale, mask, mask_rows[first:first + rows], 0, rows, rows_p)
        else:
            softmax_packed_rows(scores, scale, mask, mask_rows, 0, rows, rows_p)
        panels_over_rows(rows_p, value_panels, value_layout, bias, False, out[pair], 0, rows, top, 0, width)
        task = claim(state, 0)


@compiled
def attention_serial(q: np.ndarray, kt: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray,
                     mask_rows: np.ndarray, out: np.ndarray, block: int) -> None:
    """:func:`attention_tasks`, every task on the calling thread."""
    attention_tasks(q, kt, v, scale, mask, mask_rows, out, block, np.zeros(1, np.int64))


@compiled(parallel=True)
def attention_parallel(q: np.ndarray, kt: np.ndarray, v: np.ndarray, scale: float, mask: np.ndarray,
                       mask_rows: np.ndarray, out: np.ndarray, block: int, threads: int,
                       wait: tuple[int, int]) -> None:
    """:func:`attention_tasks` over ``threads`` numba threads in one region (the caller has
    set their count), each claiming the next task. The thread that started the region, done
    with the tasks, waits for the others by reading a counter rather than asleep at the
    region's end, for at most ``wait[0]`` cycles of the processor's counter and while no two
    reads are more than ``wait[1]`` apart (a longer gap: it was preempted, the machine is
    busy), as :func:`.packed_gemm.packed_panels_parallel` does."""
    state = np.zeros(2, np.int64)  # the next task; the other threads that are done
    for thread in prange(threads):
        attention_tasks(q, kt, v, scale, mask, mask_rows, out, block, state)
        end_of_tasks(state, thread, threads, wait)



@functools.cache
def entry(parallel: bool) -> Any:
    """numba's dispatcher of :func:`attention_parallel` or :func:`attention_serial`, compiled
    (or loaded from the disk cache) for one signature: any strides of Q, K^T, V and the mask,
    read-only or not, convert to it, so that their layouts never compile another version."""
    load_numba()
    from numba import types

    operand = types.Array(types.float32, 4, "A", readonly=True)
    common = (operand, operand, operand, types.float64, types.Array(types.float32, 2, "A", readonly=True),
              types.Array(types.int64, 1, "A", readonly=True), types.Array(types.float32, 3, "C"),
              types.int64)
    if parallel:
        dispatcher = attention_parallel.dispatcher
        dispatcher.compile((*common, types.int64, types.UniTuple(types.int64, 2)))
    else:
        dispatcher = attention_serial.dispatcher
        dispatcher.compile(common)
    dispatcher.disable_compile()
    return dispatcher
