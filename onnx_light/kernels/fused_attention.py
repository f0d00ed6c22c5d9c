"""FusedAttention: scaled dot-product attention over float32 heads as one step.

Not an ONNX operator: ``runtime/attention_fusion.py`` makes one of the nodes exporters write
for ``softmax(Q K^T * scale + mask) V`` (the pattern is stated there). For each of the
(broadcast) batch of heads the step computes the scores ``Q K^T`` with BLAS (``np.matmul``,
float32, as the MatMul node does), the softmax of ``scale * scores + mask`` along the keys in
place with the compiled rows of :mod:`.compiled_softmax` (float64 inside, rounded once), and
the product with V (BLAS). Q, K and V may be given as the inputs of Transposes the exporter
wrote (``perms``): the step applies them as views, which BLAS reads with strides.

Below ``minimum_flops`` multiply-adds of the two products the three parts run serially over
the whole batch. From there on (where the packed products run: :func:`.packed_gemm.available`)
the step is one compiled call instead (:mod:`.compiled_attention`: the products by the
packed micro-kernel, in tasks of query rows whose scores stay in the cache), and with more
than one thread its tasks are handed out to numba's threads in one parallel region. The
compiled tasks compute their rows the same way on any thread: the same bits at any thread
count; their products sum in another order than BLAS's, within the same bound.

K and V may also be given before the repetition of grouped-query attention (LLaMA's
``repeat_kv``: Unsqueeze, Expand, Reshape giving each of G key/value heads to R query heads,
``repeats`` the Expand's and the Reshape's shapes): the step then views Q's H = G R heads as
(G, R) and lets the products broadcast K and V over R, so the repeated K and V are never
made; each head's products and softmax are those of the repeated graph.

For inputs of shapes fixed for the session (the memory plan's), :meth:`FusedAttention.prepare`
takes the shapes' decisions once (:meth:`FusedAttention.layout`) and writes the product with V
into the step's buffer, for serial runs; the values are :meth:`FusedAttention.run`'s.

When the inputs at run time are not float32, the mask does not broadcast to the scores
along their last axis, or the repetition's shapes do not repeat K's and V's heads in place,
the original nodes run one after another instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from ..parallel import BLAS
from ..tuning.schema import KernelTuningSchema, Value
from . import packed_gemm
from .base import Kernel, NodeContext, Prepared, TensorSpec
from .compiled_attention import block_rows, entry
from .compiled_elementwise import numba_threads
from .compiled_softmax import MASK_NONE, NO_MASK, SoftmaxRows, mask_layout

__all__ = ["ATTENTION_MINIMUM_FLOPS", "FusedAttention"]

Slots = tuple[int | None, ...]

#: Multiply-adds of the two products (``heads * queries * keys * (head size + value size)``)
#: from which the step runs as compiled tasks, over numba's threads with more than one
#: (docs/attention.md).
ATTENTION_MINIMUM_FLOPS = 1 << 25

_FLOAT32 = np.dtype(np.float32)

#: The shapes of a repetition of grouped-query attention: the Expand's and the Reshape's.
Repeat = tuple[tuple[int, ...], tuple[int, ...]]


def repeat_count(shape: tuple[int, ...], repeat: Repeat) -> int | None:
    """R when ``Reshape(Expand(Unsqueeze(x, axis -3), expand), reshape)`` (Reshape without
    ``allowzero``) repeats each head of an ``x`` of ``shape`` (..., G, N, D) R times in place,
    giving (..., G R, N, D); else None."""
    expand, reshape = repeat
    if len(shape) < 3:
        return None
    unsqueezed = (*shape[:-2], 1, *shape[-2:])
    try:
        target = np.broadcast_shapes(unsqueezed, expand)
    except ValueError:
        return None
    count = target[-3]
    if len(reshape) != len(shape) or target != (*shape[:-2], count, *shape[-2:]):
        return None
    dims = [target[i] if d == 0 else d for i, d in enumerate(reshape)]
    if dims.count(-1) == 1:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = math.prod(target) // known if known else -1
    return count if tuple(dims) == (*shape[:-3], shape[-3] * count, *shape[-2:]) else None


def _four(x: np.ndarray, heads: tuple[int, ...]) -> np.ndarray:
    """``x`` (..., rows, columns) broadcast to ``heads`` and viewed as 4-D (batch, heads[-1],
    rows, columns): the compiled tasks' operand (a view unless merging the leading axes copies)."""
    shape = (*heads, *x.shape[-2:])
    if x.shape != shape:
        x = np.broadcast_to(x, shape)
    return x if x.ndim == 4 else x.reshape(-1, *shape[-3:])


class Layout(NamedTuple):
    """What the shapes of Q, K, V and the mask decide (:meth:`FusedAttention.layout`):
    R of grouped-query attention (None without), the broadcast batch of heads of the
    products, the scores' shape, the graph's heads, the mask row of each score row, and the
    sizes of Q's and V's rows."""

    count: int | None
    batch: tuple[int, ...]
    scores_shape: tuple[int, ...]
    heads: tuple[int, ...]
    rows: np.ndarray
    depth: int
    width: int


class FusedAttention(Kernel):
    """``softmax(scale * Q K^T + mask) V``: inputs Q, K^T, V (or the Transposes' inputs,
    ``perms`` their permutations, None where not absorbed) and the optional mask; ``nodes``
    (kernel, input slots, output slots) and ``constants`` the original nodes, run when the
    fused computation cannot be. The step is tuned as the pattern's Softmax node
    (``softmax``): its key, and its values read at run time (``minimum_elements``,
    ``minimum_flops``)."""

    op_type: ClassVar[str] = "FusedAttention"

    def __init__(self, ctx: NodeContext, softmax: Kernel, scale: float,
                 perms: tuple[tuple[int, ...] | None, ...], input_slots: Slots,
                 nodes: Sequence[tuple[Kernel, Slots, Slots]],
                 constants: Mapping[int, np.ndarray],
                 repeats: tuple[Repeat | None, Repeat | None] = (None, None)) -> None:
        super().__init__(ctx)
        self.softmax = softmax
        self.scale = scale
        self.perms = perms
        self.repeats = repeats
        self.input_slots = input_slots
        self.nodes = tuple(nodes)
        self.constants = dict(constants)

    def tuning_schema(self) -> KernelTuningSchema | None:
        """The Softmax node's schema: the session resolves and checks its values for this step."""
        return self.softmax.tuning_schema()

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.softmax._configure(values)

    @property
    def node_types(self) -> tuple[str, ...]:
        """The op types of the fused nodes, in graph order."""
        return tuple(kernel.ctx.op_type for kernel, _, _ in self.nodes)

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile the softmax rows and the compiled tasks' entries (serial, and over numba's
        threads with more than one) now, at session construction (a warm cache loads them):
        a run of shapes :meth:`prepare` did not see calls them too."""
        SoftmaxRows(self.num_threads, self.softmax.minimum_elements).compile()
        if packed_gemm.available():
            entry(False)
            if self.num_threads > 1:
                entry(True)
        return None

    def run(self, q: np.ndarray, k: np.ndarray, v: np.ndarray,
            mask: np.ndarray | None = None) -> Sequence[np.ndarray]:
        out = self._fused(q, k, v, mask)
        return [out] if out is not None else self._unfused(q, k, v, mask)

    def _fused(self, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               mask: np.ndarray | None) -> np.ndarray | None:
        if any(x.dtype != _FLOAT32 for x in (q, k, v)) or (mask is not None and mask.dtype != _FLOAT32):
            return None
        layout = self.layout(q.shape, k.shape, v.shape, None if mask is None else mask.shape)
        if layout is None:
            return None
        mask = None if mask is None else np.ascontiguousarray(mask)
        if self._compiled(layout):
            out = np.empty((math.prod(layout.heads), layout.scores_shape[-2], layout.width), np.float32)
            self._tasks(q, k, v, mask, layout, out)
            return out.reshape(*layout.heads, *out.shape[-2:])
        q, k, v = self._views(q, k, v, layout.count)
        out = self._heads(q, k, v, mask, layout.rows, layout.scores_shape)
        return out.reshape(*layout.heads, *out.shape[-2:]) if layout.count else out

    def _compiled(self, layout: Layout) -> bool:
        """Whether the step runs as compiled tasks: from ``minimum_flops`` multiply-adds of
        the two products on, where the packed products run, every size above 0."""
        scores = layout.scores_shape
        flops = math.prod(scores) * (layout.depth + layout.width)
        return (flops >= self.softmax.minimum_flops and min(*scores, layout.depth, layout.width) > 0
                and packed_gemm.available())

    def _tasks(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
               layout: Layout, out: np.ndarray) -> None:
        """The compiled tasks (:mod:`.compiled_attention`) into ``out`` (heads, queries, width),
        in one region of numba's threads with more than one thread."""
        q, k, v = (x if perm is None or len(perm) != x.ndim else x.transpose(perm)
                   for x, perm in zip((q, k, v), self.perms, strict=True))
        heads = layout.heads or (1,)
        groups = k.shape[-3] if layout.count else heads[-1]
        q4 = _four(q, heads)
        k4, v4 = _four(k, (*heads[:-1], groups)), _four(v, (*heads[:-1], groups))
        mask2 = NO_MASK if mask is None else mask.reshape(-1, layout.scores_shape[-1])
        block, tasks = self._blocks(layout)
        if self.num_threads > 1 and tasks > 1 and numba_threads(self.num_threads):
            entry(True)(q4, k4, v4, self.scale, mask2, layout.rows, out, block,
                        min(self.num_threads, tasks), packed_gemm.wait_cycles())
        else:
            entry(False)(q4, k4, v4, self.scale, mask2, layout.rows, out, block)

    @staticmethod
    def _blocks(layout: Layout) -> tuple[int, int]:
        """The compiled tasks' query rows per task, and their count."""
        queries, keys = layout.scores_shape[-2:]
        block = block_rows(queries, keys, packed_gemm.geometry().rows)
        return block, math.prod(layout.heads) * -(-queries // block)

    def layout(self, q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...],
               mask: tuple[int, ...] | None) -> Layout | None:
        """The decisions for inputs of these shapes, or None where the fused computation
        cannot take them."""
        counts = {repeat_count(x, repeat) for x, repeat in zip((k, v), self.repeats, strict=True)
                  if repeat is not None}
        if None in counts or len(counts) > 1:
            return None
        q, k, v = (x if perm is None or len(perm) != len(x) else tuple(x[p] for p in perm)
                   for x, perm in zip((q, k, v), self.perms, strict=True))
        count = None
        if counts:  # grouped-query attention: Q's heads as (G, R), K and V broadcast over R
            (count,) = counts
            groups = k[-3]
            if len(q) < 3 or len(v) < 3 or q[-3] != groups * count or v[-3] != groups:
                return None
            q = (*q[:-3], groups, count, *q[-2:])
            k, v = (*k[:-2], 1, *k[-2:]), (*v[:-2], 1, *v[-2:])
        if min(len(q), len(k), len(v)) < 2 or q[-1] != k[-2] or k[-1] != v[-2]:
            return None
        try:
            batch = np.broadcast_shapes(q[:-2], k[:-2], v[:-2])
        except ValueError:
            return None
        scores_shape = (*batch, q[-2], k[-1])
        heads = (*batch[:-2], batch[-2] * batch[-1]) if counts else batch  # the graph's heads
        rows = MASK_NONE
        if mask is not None:
            rows = mask_layout(mask, (*heads, *scores_shape[-2:]))
            if rows is None:
                return None
        return Layout(count, batch, scores_shape, heads, rows, q[-1], v[-1])

    def _views(self, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               count: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Q, K^T and V as the products read them: the absorbed Transposes applied, and with
        grouped-query attention Q's heads as (G, R) and K, V with an axis of 1 for R."""
        q, k, v = (x if perm is None or len(perm) != x.ndim else np.transpose(x, perm)
                   for x, perm in zip((q, k, v), self.perms, strict=True))
        if count:
            q = q.reshape(*q.shape[:-3], k.shape[-3], count, *q.shape[-2:])
            k, v = k[..., None, :, :], v[..., None, :, :]
        return q, k, v

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """For float32 inputs the fused computation takes: the decisions :meth:`layout`
        makes taken once and the product with V written into the buffer; None otherwise."""
        if len(inputs) not in (3, 4) or any(dtype != _FLOAT32 for _, dtype in inputs):
            return None
        shapes = [tuple(shape) for shape, _ in inputs]
        layout = self.layout(*shapes[:3], shapes[3] if len(shapes) == 4 else None)
        if layout is None:
            return None
        shape = (*layout.heads, layout.scores_shape[-2], layout.width)
        if self._compiled(layout):
            tasks = self._tasks
            entry(self.num_threads > 1 and self._blocks(layout)[1] > 1)  # compiled now, not in a run

            def compiled(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, *,
                         out: np.ndarray) -> None:
                mask = None if mask is None else np.ascontiguousarray(mask)
                tasks(q, k, v, mask, layout, out.reshape(-1, *shape[-2:]))

            return Prepared(compiled, shape, _FLOAT32)
        count, batch, scores_shape = layout.count, layout.batch, layout.scores_shape
        out_shape = (*batch, *shape[-2:])
        views, heads = self._views, self._heads

        def compute(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None, *,
                    out: np.ndarray) -> None:
            q, k, v = views(q, k, v, count)
            heads(q, k, v, mask, layout.rows, scores_shape, out.reshape(out_shape))

        return Prepared(compute, shape, _FLOAT32)

    def _heads(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
               rows: np.ndarray, scores_shape: tuple[int, ...], out: np.ndarray | None = None) -> np.ndarray:
        """The three parts over the (broadcast) batch of heads, serially: the products by
        BLAS on one thread, the softmax by the compiled rows."""
        with BLAS.limited(1 if self.num_threads > 1 else None):  # a 1-thread session holds 1
            scores = np.matmul(q, k)
            if scores.shape != scores_shape:  # a 2-D Q and K under a batched V
                scores = np.ascontiguousarray(np.broadcast_to(scores, scores_shape))
            SoftmaxRows(1, 1 << 62)(scores, scores, self.scale, mask, rows)
            return np.matmul(scores, v, out=out)

    def _unfused(self, *inputs: np.ndarray | None) -> list[np.ndarray]:
        values: dict[int | None, np.ndarray | None] = {None: None, **self.constants}
        values.update(zip(self.input_slots, inputs, strict=False))
        for kernel, node_inputs, node_outputs in self.nodes:
            results = kernel.run(*(values[s] for s in node_inputs))
            values.update(zip(node_outputs, results, strict=False))
        return [values[self.nodes[-1][2][0]]]
