"""Packed products whose consumer runs inside the product's own pass: GELU of a block of the
product while it is in L1 (:func:`gelu_product`), LayerNormalization of whole rows of the
product plus a residual (:func:`norm_product`).

Both multiply float32 A (M, K) by constant weights packed once
(:class:`~onnx_light.kernels.packed_gemm.PackedWeights`, their bias added in the micro-kernel's
store) with :func:`~onnx_light.kernels.packed_gemm.panels_over_rows`, called as it is, into a
scratch block, then write the consumer's output from the block: the product is never written
to memory of its own, and one call (one parallel region at more than one thread) does what
two or three steps did.

* GELU: the tasks are groups of panels (``group`` x NR columns) over a block of rows (the
  packed product's blocks of :data:`~onnx_light.kernels.packed_gemm.BLOCK_A_BYTES`); a task's
  product goes to a (rows, group x NR) scratch block, then ``GELU`` (the erf form or the tanh
  form, :mod:`.float32_math`, four rows at a time as the compiled GELU rows do) into its
  columns of the output. At more than one thread every (block, group) task goes to whichever
  thread asks next (an atomic counter) in one region for all blocks, A packed once before it.
* LayerNormalization: a task is a chunk of whole rows (every panel), its product plus R in a
  (rows, N) scratch block, then :func:`~onnx_light.kernels.normalization.layer_norm_range`
  on its rows. At more than one thread the chunks (as many as threads, whole blocks of MR
  rows) go to whichever thread asks next; each thread packs its own rows.

Numerics: each product element is the packed product's (its order of sums does not depend on
the task, block, group or thread), the bias added once, the residual added once (the Add's
rounding), GELU and LayerNormalization the compiled kernels' own functions: the values of the
steps these replace, bit for bit, at any thread count. Threads wait for each other at the
end as the packed products do (:func:`~onnx_light.kernels.spin.end_of_tasks`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import numpy as np

from ..parallel import ThreadPool
from ..tuning.schema import KernelTuningSchema, Value
from . import packed_gemm
from .base import Kernel, NodeContext, Prepared, TensorSpec
from .compiled import compiled, prange, wide_vectors
from .float32_math import gelu32, gelu32_lanes, gelu_tanh32, gelu_tanh32_lanes
from .gemm import MatMulKernel
from .matmul_bias import MatMulAdd
from .normalization import LayerNormalization, layer_norm_range
from .packed_gemm import MR, NR, pack_rows, panels_over_rows
from .spin import claim, end_of_tasks

__all__ = ["MatMulAddNorm", "MatMulGelu", "gelu_product", "gelu_product_parallel", "norm_product",
           "norm_product_parallel"]

#: Panels of a GELU task at least: the GELU of a block runs four rows of this many columns
#: at a time.
GELU_PANELS = 2


@compiled(fastmath={"contract"})
def _gelu_store(scratch: np.ndarray, out: np.ndarray, top: int, rows: int, column: int,
                width: int, tanh: bool) -> None:
    """``out[top + r, column + c] = GELU(scratch[r, c])`` for r < rows and c < width: four
    rows at a time (:func:`.gelu32_lanes`), the last rows one value at a time, the same values."""
    wide_vectors()
    for r in range(0, rows - 3, 4):
        s0, s1, s2, s3 = scratch[r], scratch[r + 1], scratch[r + 2], scratch[r + 3]
        o0 = out[top + r, column:column + width]
        o1 = out[top + r + 1, column:column + width]
        o2 = out[top + r + 2, column:column + width]
        o3 = out[top + r + 3, column:column + width]
        if tanh:
            for c in range(width):
                o0[c], o1[c], o2[c], o3[c] = gelu_tanh32_lanes(s0[c], s1[c], s2[c], s3[c])
        else:
            for c in range(width):
                o0[c], o1[c], o2[c], o3[c] = gelu32_lanes(s0[c], s1[c], s2[c], s3[c])
    for r in range(rows - rows % 4, rows):
        source, target = scratch[r], out[top + r, column:column + width]
        if tanh:
            for c in range(width):
                target[c] = gelu_tanh32(source[c])
        else:
            for c in range(width):
                target[c] = gelu32(source[c])


@compiled
def _gelu_task(rows_a: np.ndarray, panels: np.ndarray, layout: tuple[int, int, int, int],
               bias: np.ndarray, with_bias: bool, scratch: np.ndarray, out: np.ndarray, first: int,
               rows: int, panel: int, count: int, n: int, tanh: bool, top: int) -> None:
    """Panels ``panel..panel+count-1`` of rows ``first..first+rows-1`` of the packed
    ``rows_a``: the product into ``scratch``, then GELU into rows ``top..top+rows-1`` of
    ``out``."""
    b_start, b_panel, b_step, b_ahead = layout
    column = panel * NR
    width = min(count * NR, n - column)
    panels_over_rows(rows_a, panels, (b_start + panel * b_panel, b_panel, b_step, b_ahead),
                     bias[column:], with_bias, scratch, first, first + rows, -first, 0, width)
    _gelu_store(scratch, out, top, rows, column, width, tanh)


@compiled
def gelu_product(a: np.ndarray, panels: np.ndarray, layout: tuple[int, int, int, int],
                 bias: np.ndarray, with_bias: bool, out: np.ndarray, block: int, n: int, group: int,
                 tanh: bool) -> None:
    """``out = GELU(a @ W (+ bias))`` for C-contiguous float32 ``a`` (M, K) and ``out`` (M, n),
    W packed in ``panels`` (``layout``: :func:`~onnx_light.kernels.packed_gemm.packed_layout`),
    the rows in blocks of ``block``, ``group`` panels at a time; ``tanh``: the tanh form."""
    count = a.shape[0]
    total = -(-n // NR)
    scratch = np.empty((min(block, count), group * NR), np.float32)
    for top in range(0, count, block):
        rows = min(block, count - top)
        rows_a = pack_rows(a, top, top + rows)
        for panel in range(0, total, group):
            _gelu_task(rows_a, panels, layout, bias, with_bias, scratch, out, 0, rows, panel,
                       min(group, total - panel), n, tanh, top)


@compiled
def _gelu_tasks(rows_a: np.ndarray, panels: np.ndarray, layout: tuple[int, int, int, int],
                bias: np.ndarray, with_bias: bool, out: np.ndarray, block: int, n: int, group: int,
                tanh: bool, state: np.ndarray) -> None:
    """The (block of rows, group of panels) tasks of :func:`gelu_product_parallel` that the
    calling thread claims from ``state[0]``, until none is left."""
    count = out.shape[0]
    total = -(-n // NR)
    groups = -(-total // group)
    tasks = -(-count // block) * groups
    scratch = np.empty((min(block, count), group * NR), np.float32)
    task = claim(state, 0)
    while task < tasks:
        top = task // groups * block
        panel = task % groups * group
        _gelu_task(rows_a, panels, layout, bias, with_bias, scratch, out, top, min(block, count - top),
                   panel, min(group, total - panel), n, tanh, top)
        task = claim(state, 0)


@compiled(parallel=True)
def gelu_product_parallel(a: np.ndarray, panels: np.ndarray, layout: tuple[int, int, int, int],
                          bias: np.ndarray, with_bias: bool, out: np.ndarray, block: int, n: int,
                          group: int, tanh: bool, threads: int, wait: tuple[int, int]) -> None:
    """:func:`gelu_product` over ``threads`` numba threads (the caller has set their count) in
    one region: A packed once before it, then the (block of rows, group of panels) tasks, the
    blocks in order, to whichever thread asks next. The same values as one thread. (The
    region's body only calls the serial :func:`_gelu_tasks`: numba's parallel lowering of the
    loop itself made it a quarter slower per thread.)"""
    rows_a = pack_rows(a, 0, a.shape[0])
    state = np.zeros(2, np.int64)  # the next task; the other threads that are done
    for thread in prange(threads):
        _gelu_tasks(rows_a, panels, layout, bias, with_bias, out, block, n, group, tanh, state)
        end_of_tasks(state, thread, threads, wait)


@compiled
def _norm_rows(a: np.ndarray, panels: np.ndarray, layout: tuple[int, int, int, int],
               bias: np.ndarray, with_bias: bool, residual: np.ndarray, scale: np.ndarray,
               shift: np.ndarray, with_shift: bool, epsilon: float, out: np.ndarray,
               first: int, last: int, block: int, scratch: np.ndarray, statistics: np.ndarray) -> None:
    """Rows ``first..last-1`` of ``out = LayerNorm(a @ W (+ bias) + residual)`` (``scale``,
    ``shift`` when ``with_shift``), in blocks of ``block`` rows through ``scratch``."""
    n = out.shape[1]
    for top in range(first, last, block):
        rows = min(block, last - top)
        sums = scratch[:rows]
        panels_over_rows(pack_rows(a, top, top + rows), panels, layout, bias, with_bias, sums, 0,
                         rows, 0, 0, n)
        for r in range(rows):
            target, added = sums[r], residual[top + r]
            for j in range(n):
                target[j] += added[j]
        layer_norm_range(sums, scale, shift, with_shift, epsilon, out[top:top + rows],
                         statistics[0], statistics[1], 0, rows)


@compiled
def norm_product(a: np.ndarray, panels: np.ndarray, layout: tuple[int, int, int, int],
                 bias: np.ndarray, with_bias: bool, residual: np.ndarray, scale: np.ndarray,
                 shift: np.ndarray, with_shift: bool, epsilon: float, out: np.ndarray,
                 block: int) -> None:
    """``out = LayerNormalization(a @ W (+ bias) + residual)`` over the rows (``scale``, and
    ``shift`` when ``with_shift``) for C-contiguous float32 ``a`` (M, K), ``residual`` and
    ``out`` (M, N), W packed in ``panels``; the rows in blocks of ``block``."""
    count, n = out.shape
    rows = min(block, count)
    _norm_rows(a, panels, layout, bias, with_bias, residual, scale, shift, with_shift, epsilon,
               out, 0, count, block, np.empty((rows, n), np.float32),
               np.empty((2, rows), np.float32))


@compiled(parallel=True)
def norm_product_parallel(a: np.ndarray, panels: np.ndarray, layout: tuple[int, int, int, int],
                          bias: np.ndarray, with_bias: bool, residual: np.ndarray,
                          scale: np.ndarray, shift: np.ndarray, with_shift: bool, epsilon: float,
                          out: np.ndarray, block: int, threads: int, wait: tuple[int, int]) -> None:
    """:func:`norm_product` over ``threads`` numba threads (the caller has set their count) in
    one region: ``threads`` chunks of whole blocks of MR rows, each to whichever thread asks
    next (a late thread takes none). The same values as one thread."""
    count, n = out.shape
    blocks = -(-count // MR)
    chunk = -(-blocks // threads) * MR
    tasks = -(-count // chunk)
    state = np.zeros(2, np.int64)
    for thread in prange(threads):
        rows = min(block, chunk)
        scratch = np.empty((rows, n), np.float32)
        statistics = np.empty((2, rows), np.float32)
        task = claim(state, 0)
        while task < tasks:
            _norm_rows(a, panels, layout, bias, with_bias, residual, scale, shift, with_shift,
                       epsilon, out, task * chunk, min(count, (task + 1) * chunk), block, scratch,
                       statistics)
            task = claim(state, 0)
        end_of_tasks(state, thread, threads, wait)


class _PackedEpilogue(Kernel):
    """What the two steps share: the product (a MatMul kernel, its bias fused or not) whose
    weights :meth:`specialize` packs, tuned as its MatMul node (its key, and the values it
    reads at run time: ``parallel.minimum_flops``, ``split.minimum_rows``)."""

    def __init__(self, ctx: NodeContext, product: MatMulKernel, *replaced: Kernel) -> None:
        super().__init__(ctx)
        self.product = product
        self.replaced = replaced  # the steps it stands for, run where the packed weights do not fit

    def tuning_schema(self) -> KernelTuningSchema | None:
        """The MatMul node's schema: the session resolves and checks its values for this step."""
        return self.product.tuning_schema()

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.product._configure(values)

    def bind(self, pool: ThreadPool | None) -> _PackedEpilogue:
        """This step, its product and the steps it replaces on ``pool`` (the product's pool
        decides the threads)."""
        for kernel in (self.product, *self.replaced):
            kernel.bind(pool)
        return super().bind(pool)

    @property
    def packed(self) -> packed_gemm.PackedWeights | None:
        """The product's packed weights (after :meth:`specialize`), else None."""
        return self.product._packed

    def packed_input(self, position: int) -> Callable[[], np.ndarray] | None:
        """The product's packed weights (position 1), rebuilt."""
        return self.product.packed_input(position) if position == 1 else None

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """A copy whose product packed W (``constants[1]``) once (with the bias), its passes
        compiled now (:meth:`_warm`, at two threads too where runs may split); None where the
        product does not pack W."""
        product = self.product.specialize(constants[:2])
        if product is None or product._packed is None:
            return None
        kernel = copy.copy(self)
        kernel.product, packed = product, product._packed
        for threads in (1, 2) if product._packed_threads(1 << 40, packed) > 1 else (1,):
            kernel._warm(packed, threads)
        return kernel

    def _warm(self, packed: packed_gemm.PackedWeights, threads: int) -> None:
        """Compile (or load) the step's passes at ``threads`` on a one-row input."""
        raise NotImplementedError

    def _fits(self, a_shape: Sequence[int], a_dtype: np.dtype, w_shape: Sequence[int]) -> bool:
        """Whether the packed weights compute the product of an A and W of these specs."""
        packed = self.packed
        return (packed is not None and a_dtype == np.float32 and len(a_shape) >= 2
                and a_shape[-1] == packed.k and tuple(w_shape) == (packed.k, packed.n))

    def _threads(self, rows: int) -> int:
        """The threads the packed product of ``rows`` rows runs on (numba's count set)."""
        packed = self.packed
        assert packed is not None
        return self.product._packed_threads(rows, packed)

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        """The product's multiply-adds."""
        return self.product.work(input_shapes[:2], output_shapes)


class MatMulGelu(_PackedEpilogue):
    """``GELU(A @ W + bias)`` (erf or tanh form; bias optional) as one step: ``product`` is
    the MatMul node's kernel with the bias the GELU chain added (``runtime/matmul_fusion.py``),
    ``chain`` the fused GELU step and ``operands`` its inputs (0 for the product's output, 1
    for the bias ``constant``), which run after ``matmul`` (the MatMul without that bias)
    where the packed weights do not fit the inputs."""

    op_type: ClassVar[str] = "MatMulGelu"

    def __init__(self, ctx: NodeContext, product: MatMulKernel, tanh: bool, matmul: MatMulKernel,
                 chain: Kernel, operands: Sequence[int], constant: np.ndarray | None) -> None:
        super().__init__(ctx, product, matmul, chain)
        self.tanh = tanh
        self.matmul, self.chain = matmul, chain
        self.operands, self.constant = tuple(operands), constant

    def _warm(self, packed: packed_gemm.PackedWeights, threads: int) -> None:
        self._compute(np.zeros((1, packed.k), np.float32), np.empty((1, packed.n), np.float32), threads)

    def _compute(self, a: np.ndarray, out: np.ndarray, threads: int | None = None) -> None:
        """``out`` (..., M, N) = the step's value for float32 ``a`` (..., M, K)."""
        packed = self.packed
        assert packed is not None
        count = math.prod(a.shape[:-1])
        rows = np.ascontiguousarray(a).reshape(count, packed.k)
        out2 = out.reshape(count, packed.n)
        if threads is None:
            threads = self._threads(count)
        block = min(packed.block, -(-count // packed.rows) * packed.rows)
        group = max(GELU_PANELS, packed_gemm.TASK_WORK // max(1, block * packed.k * packed.columns))
        operands = (rows, packed.panels, packed.layout, packed.bias, packed.with_bias, out2,
                    packed.block, packed.n, group, self.tanh)
        if threads < 2:
            gelu_product.dispatcher(*operands)
        else:
            gelu_product_parallel.dispatcher(*operands, threads, packed_gemm.wait_cycles())

    def run(self, a: np.ndarray, w: np.ndarray) -> Sequence[np.ndarray]:
        if self._fits(a.shape, a.dtype, w.shape) and w.dtype == np.float32:
            out = np.empty((*a.shape[:-1], w.shape[1]), np.float32)
            self._compute(a, out)
            return (out,)
        (y,) = self.matmul.run(a, w)
        return self.chain.run(*(y if index == 0 else self.constant for index in self.operands))

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The packed pass into the given buffer, for specs the packed weights fit."""
        if len(inputs) != 2:
            return None
        (a_shape, a_dtype), (w_shape, w_dtype) = inputs
        if not self._fits(a_shape, a_dtype, w_shape) or w_dtype != np.float32:
            return None
        compute = self._compute

        def gelu(a: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
            compute(a, out)

        return Prepared(gelu, (*a_shape[:-1], w_shape[1]), np.dtype(np.float32))


class MatMulAddNorm(_PackedEpilogue):
    """``LayerNormalization(A @ W (+ bias) + R, scale, shift)`` over the last axis as one step
    (a post-norm transformer's residual connection and its normalization): ``residual`` is
    the MatMulAdd step (its product the MatMul with the bias fused), ``norm`` the
    LayerNormalization node's kernel, which run one after the other where the packed weights
    do not fit the inputs. Inputs: A, W, R, scale (N,) and shift (N,) if the node has one."""

    op_type: ClassVar[str] = "MatMulAddNorm"

    def __init__(self, ctx: NodeContext, residual: MatMulAdd, norm: LayerNormalization) -> None:
        product = residual.matmul
        assert isinstance(product, MatMulKernel)
        super().__init__(ctx, product, residual, norm)
        self.residual, self.norm = residual, norm

    def _warm(self, packed: packed_gemm.PackedWeights, threads: int) -> None:
        zeros, ones = np.zeros((1, packed.k), np.float32), np.ones(packed.n, np.float32)
        y = np.zeros((1, packed.n), np.float32)
        for shift in (ones, None):  # with and without the LayerNormalization's bias
            self._compute(zeros, y, ones, shift, y.copy(), threads)

    def _compute(self, a: np.ndarray, residual: np.ndarray, scale: np.ndarray,
                 shift: np.ndarray | None, out: np.ndarray, threads: int | None = None) -> None:
        """``out`` (..., M, N) = the step's value for float32 ``a`` (..., M, K) and C-contiguous
        float32 ``residual`` of the output's shape, ``scale`` and ``shift`` of N values."""
        packed = self.packed
        assert packed is not None
        count = math.prod(a.shape[:-1])
        rows = np.ascontiguousarray(a).reshape(count, packed.k)
        n = packed.n
        if threads is None:
            threads = self._threads(count)
        operands = (rows, packed.panels, packed.layout, packed.bias, packed.with_bias,
                    residual.reshape(count, n), scale.reshape(n),
                    scale.reshape(n) if shift is None else shift.reshape(n), shift is not None,
                    self.norm.epsilon, out.reshape(count, n), packed.block)
        if threads < 2:
            norm_product.dispatcher(*operands)
        else:
            norm_product_parallel.dispatcher(*operands, threads, packed_gemm.wait_cycles())

    def _fits_all(self, a: TensorSpec, w: TensorSpec, residual: TensorSpec,
                  parameters: Sequence[TensorSpec]) -> bool:
        """Whether the packed pass computes the step for inputs of these specs."""
        (a_shape, a_dtype), (w_shape, w_dtype) = a, w
        if not self._fits(a_shape, a_dtype, w_shape) or w_dtype != np.float32:
            return False
        n = w_shape[1]
        return (tuple(residual[0]) == (*a_shape[:-1], n) and residual[1] == np.float32
                and all(tuple(shape) == (n,) and dtype == np.float32 for shape, dtype in parameters))

    def run(self, a: np.ndarray, w: np.ndarray, residual: np.ndarray, scale: np.ndarray,
            shift: np.ndarray | None = None) -> Sequence[np.ndarray]:
        parameters = [p for p in (scale, shift) if p is not None]
        if self._fits_all((a.shape, a.dtype), (w.shape, w.dtype), (residual.shape, residual.dtype),
                          [(p.shape, p.dtype) for p in parameters]):
            out = np.empty(residual.shape, np.float32)
            self._compute(a, np.ascontiguousarray(residual), np.ascontiguousarray(scale),
                          None if shift is None else np.ascontiguousarray(shift), out)
            return (out,)
        (y,) = self.residual.run(a, w, residual)
        return self.norm.run(y, *parameters)

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The packed pass into the given buffer, for specs the packed weights fit."""
        if len(inputs) not in (4, 5):
            return None
        a, w, residual, *parameters = inputs
        if not self._fits_all(a, w, residual, parameters):
            return None
        compute = self._compute

        def norm(a: np.ndarray, w: np.ndarray, residual: np.ndarray, scale: np.ndarray,
                 shift: np.ndarray | None = None, *, out: np.ndarray) -> None:
            compute(a, residual, scale, shift, out)

        return Prepared(norm, tuple(residual[0]), np.dtype(np.float32))
