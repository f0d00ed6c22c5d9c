"""GatedMatMul: ``Swish(A @ Wg) * (A @ Wu)`` as one step, the gate and up projections of a
LLaMA-style MLP (SiLU: Swish with alpha 1).

Not an ONNX operator: ``runtime/sibling_fusion.py`` makes one of two products of one A by
constant weights of one shape, the first with the Swish epilogue the runtime fused into it
(``x * Sigmoid(x)``), read by one Mul alone. The weights are packed once side by side, a
panel of the gate's columns followed by the panel of the same columns of up
(:class:`~onnx_light.kernels.packed_gemm.PackedWeights` of ``(K, 2 P NR)``, zero columns past
N), so that one compiled pass computes both panels of a group of columns over every row
(:func:`~onnx_light.kernels.packed_gemm.panels_over_rows`) into a small scratch block that
stays in L1, and writes ``swish(g) * u`` for them at once: one product and one output
instead of two products, an in-place pass and a Mul over three tensors.

Numerics. Each product element's sum is the packed product's (the packed kernel sums every
column in the same order whatever N), the Swish is the fused epilogue's
(:func:`~onnx_light.kernels.compiled_activations.swish_product`), and the product with up is
rounded once as the Mul does: the values of the steps this one replaces, bit for bit, and the
same at any thread count (the threads share out groups of columns, never a sum).
Without packed weights (no AVX2 and FMA, ``weights.product`` = ``blas``, inputs of other
shapes or types) the step runs those steps' kernels one after the other.
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
from .compiled import compiled, prange
from .compiled_activations import swish_product
from .gemm import MatMulKernel
from .packed_gemm import NR, pack_rows, panels_over_rows
from .spin import claim, end_of_tasks

__all__ = ["GatedMatMul", "gated_parallel", "gated_rows"]

#: Tasks (groups of pairs of panels) per thread of the parallel pass: fewer, larger tasks
#: than the packed product's (about 11 us each) measured faster here, 64 x 256 x 2 x 688 at
#: 2 threads taking 352 us with 4 tasks per thread against 390 us with one pair per task
#: (docs/gemm.md, "Gated products").
TASKS_PER_THREAD = 4
_ONE = np.float32(1.0)


@compiled(inline="always")
def _pair(rows_a: np.ndarray, panels: np.ndarray, layout: tuple[int, int, int, int],
          bias: np.ndarray, with_bias: bool, scratch: np.ndarray, out: np.ndarray, top: int,
          rows: int, pair: int, n: int, alpha: float) -> None:
    """Columns ``pair * NR`` to ``pair * NR + NR`` (at most n) of rows ``top..top+rows-1`` of
    the output: the gate's and up's panels over the packed rows into ``scratch`` (rows, 2 NR),
    then ``swish(g) * u`` into ``out`` (:func:`_swish_times`)."""
    b_start, b_panel, b_step, b_ahead = layout
    column = pair * NR
    panels_over_rows(rows_a, panels, (b_start + 2 * pair * b_panel, b_panel, b_step, b_ahead),
                     bias[2 * column:], with_bias, scratch, 0, rows, 0, 0, 2 * NR)
    width = min(NR, n - column)
    if alpha == _ONE:  # SiLU: the constant, as the fused epilogue's loop has it
        _swish_times(scratch, out, top, rows, column, width, _ONE)
    else:
        _swish_times(scratch, out, top, rows, column, width, alpha)


@compiled(fastmath={"contract"})
def _swish_times(scratch: np.ndarray, out: np.ndarray, top: int, rows: int, column: int,
                 width: int, alpha: float) -> None:
    """``out[top + r, column + c] = swish(scratch[r, c]) * scratch[r, NR + c]`` for r < rows,
    c < width; a whole panel's row (``width`` = NR) in a loop of constant length, which LLVM
    vectorizes, the gate's exp included (a call of the in-place epilogue per row of 16 values
    cost 6 ns a value). Its own function, compiled with contraction as the in-place epilogue
    is: inlined into the pass, a few values came out one unit apart from the epilogue's."""
    for r in range(rows):
        target = out[top + r, column:]
        values = scratch[r]
        if width == NR:
            for c in range(NR):
                target[c] = swish_product(values[c], values[NR + c], alpha)
        else:
            for c in range(width):
                target[c] = swish_product(values[c], values[NR + c], alpha)


@compiled
def gated_rows(a: np.ndarray, panels: np.ndarray, layout: tuple[int, int, int, int],
               bias: np.ndarray, with_bias: bool, out: np.ndarray, block: int, n: int,
               alpha: float) -> None:
    """``out = swish(a @ Wg + bg) * (a @ Wu + bu)`` for C-contiguous float32 ``a`` (M, K) and
    ``out`` (M, n), the weights interleaved by panel in ``panels`` (2 P, K, NR) (``layout``:
    :func:`~onnx_light.kernels.packed_gemm.packed_layout`), rows in blocks of ``block``."""
    count = a.shape[0]
    pairs = -(-n // NR)
    scratch = np.empty((min(block, count), 2 * NR), np.float32)
    for top in range(0, count, block):
        bottom = min(count, top + block)
        rows_a = pack_rows(a, top, bottom)
        for pair in range(pairs):
            _pair(rows_a, panels, layout, bias, with_bias, scratch, out, top, bottom - top, pair,
                  n, alpha)


@compiled(parallel=True)
def gated_parallel(a: np.ndarray, panels: np.ndarray, layout: tuple[int, int, int, int],
                   bias: np.ndarray, with_bias: bool, out: np.ndarray, block: int, n: int,
                   alpha: float, threads: int, group: int, wait: tuple[int, int]) -> None:
    """:func:`gated_rows` over ``threads`` numba threads (the caller has set their count):
    each block of rows is packed once, then its pairs of panels go ``group`` at a time to
    whichever thread asks next (an atomic counter). The thread that started the region waits
    for the others reading a counter, bounded by ``wait`` (cycles in all, and between two
    reads), as :func:`~onnx_light.kernels.packed_gemm.packed_panels_parallel` does, rather
    than asleep at the region's end. The same values as one thread."""
    count = a.shape[0]
    pairs = -(-n // NR)
    tasks = -(-pairs // group)
    state = np.zeros(2, np.int64)  # the next group of pairs; the other threads that are done
    for top in range(0, count, block):
        bottom = min(count, top + block)
        rows_a = pack_rows(a, top, bottom)
        state[0] = 0
        state[1] = 0
        for thread in prange(threads):
            scratch = np.empty((bottom - top, 2 * NR), np.float32)
            task = claim(state, 0)
            while task < tasks:
                for pair in range(task * group, min(pairs, (task + 1) * group)):
                    _pair(rows_a, panels, layout, bias, with_bias, scratch, out, top,
                          bottom - top, pair, n, alpha)
                task = claim(state, 0)
            end_of_tasks(state, thread, threads, wait)



def _interleaved(gate: np.ndarray, up: np.ndarray, columns: int) -> np.ndarray:
    """(..., N) gate and up as (..., 2 P columns): each group of ``columns`` of the gate, then
    the same group of up, zeros past N."""
    *lead, n = gate.shape
    pairs = -(-n // columns)
    both = np.zeros((*lead, pairs, 2, columns), np.float32)
    for index, part in enumerate((gate, up)):
        padded = np.zeros((*lead, pairs * columns), np.float32)
        padded[..., :n] = part
        both[..., index, :] = padded.reshape(*lead, pairs, columns)
    return both.reshape(*lead, 2 * pairs * columns)


class GatedMatMul(Kernel):
    """``gate`` (a MatMul kernel with the Swish epilogue) and ``up`` (one without) of one A,
    and the Mul of their outputs, as one step reading A, Wg and Wu. Tuned as the gate's
    MatMul node (its key; both products read the values)."""

    op_type: ClassVar[str] = "GatedMatMul"

    def __init__(self, ctx: NodeContext, gate: MatMulKernel, up: MatMulKernel, alpha: float) -> None:
        super().__init__(ctx)
        self.gate, self.up, self.alpha = gate, up, float(alpha)
        #: Both weights packed by :meth:`specialize`, and the width N of each.
        self._packed: packed_gemm.PackedWeights | None = None
        self._n = 0

    def tuning_schema(self) -> KernelTuningSchema | None:
        """The gate's MatMul schema: the session resolves and checks its values for this step."""
        return self.gate.tuning_schema()

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.gate._configure(values)
        self.up._configure(values)

    def bind(self, pool: ThreadPool | None) -> GatedMatMul:
        """This step and both products on ``pool`` (the session binds its steps' kernels
        only: the gate's pool decides the parallel pass's threads)."""
        self.gate.bind(pool)
        self.up.bind(pool)
        return super().bind(pool)

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Wg and Wu (and the products' biases) packed once, interleaved by panel, when both
        are float32 matrices of one shape, the gate's ``weights.product`` is ``packed`` and
        the processor runs the packed kernel; compiled now."""
        wg, wu = (constants[1], constants[2]) if len(constants) == 3 else (None, None)
        gate, up = self.gate, self.up
        if (wg is None or wu is None or wg.ndim != 2 or wg.shape != wu.shape
                or wg.dtype != np.float32 or wu.dtype != np.float32 or gate.product != "packed"
                or (gate.bias is None) != (up.bias is None) or not packed_gemm.available()):
            return None
        columns = packed_gemm.geometry().columns
        bias = (None if gate.bias is None
                else _interleaved(gate.bias.reshape(-1), up.bias.reshape(-1), columns))
        kernel = copy.copy(self)
        kernel._packed = packed = packed_gemm.PackedWeights(_interleaved(wg, wu, columns), bias)
        kernel._n = wg.shape[1]
        kernel._compute(np.zeros((1, packed.k), np.float32), np.empty((1, kernel._n), np.float32))
        if gate._packed_threads(1 << 40, packed) > 1:  # the parallel region compiled now too
            kernel._compute(np.zeros((1, packed.k), np.float32), np.empty((1, kernel._n), np.float32), 2)
        return kernel

    def _compute(self, a: np.ndarray, out: np.ndarray, threads: int | None = None) -> None:
        """``out`` (..., M, N) = the step's value for float32 ``a`` (..., M, K) by the packed
        weights; from ``parallel.minimum_flops`` multiply-adds on numba's threads."""
        packed = self._packed
        assert packed is not None
        count = math.prod(a.shape[:-1])
        rows = np.ascontiguousarray(a).reshape(count, packed.k)
        out2 = out.reshape(count, self._n)
        if threads is None:
            threads = self.gate._packed_threads(count, packed)
        alpha = np.float32(self.alpha)
        if threads < 2:
            gated_rows.dispatcher(rows, packed.panels, packed.layout, packed.bias, packed.with_bias,
                                  out2, packed.block, self._n, alpha)
            return
        pairs = -(-self._n // packed.columns)
        group = max(1, -(-pairs // (TASKS_PER_THREAD * threads)))
        gated_parallel.dispatcher(rows, packed.panels, packed.layout, packed.bias, packed.with_bias,
                                  out2, packed.block, self._n, alpha, threads, group,
                                  packed_gemm.wait_cycles())

    def _fits(self, a_shape: Sequence[int], a_dtype: np.dtype, w_shapes: Sequence[Sequence[int]]) -> bool:
        """Whether the packed weights compute the step for these inputs."""
        packed = self._packed
        return (packed is not None and a_dtype == np.float32 and len(a_shape) >= 2
                and a_shape[-1] == packed.k
                and all(tuple(shape) == (packed.k, self._n) for shape in w_shapes))

    def run(self, a: np.ndarray, wg: np.ndarray, wu: np.ndarray) -> Sequence[np.ndarray]:
        if self._fits(a.shape, a.dtype, (wg.shape, wu.shape)) and wg.dtype == wu.dtype == a.dtype:
            out = np.empty((*a.shape[:-1], self._n), np.float32)
            self._compute(a, out)
            return (out,)
        (g,) = self.gate.run(a, wg)
        (u,) = self.up.run(a, wu)
        return (np.multiply(g, u),)

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The packed pass into the given buffer, for specs the packed weights fit."""
        if len(inputs) != 3:
            return None
        (a_shape, a_dtype), *weights = inputs
        if (not self._fits(a_shape, a_dtype, [shape for shape, _ in weights])
                or any(dtype != np.float32 for _, dtype in weights)):
            return None
        compute = self._compute

        def gated(a: np.ndarray, wg: np.ndarray, wu: np.ndarray, out: np.ndarray) -> None:
            compute(a, out)

        return Prepared(gated, (*a_shape[:-1], self._n), np.dtype(np.float32))

    def packed_input(self, position: int) -> Callable[[], np.ndarray] | None:
        """Wg (position 1) or Wu (2) rebuilt from the interleaved panels, when packed."""
        packed = self._packed
        if packed is None or position not in (1, 2):
            return None
        n = self._n

        def weights() -> np.ndarray:
            both = packed.weights()
            w = both.reshape(packed.k, -1, 2, packed.columns)[:, :, position - 1, :]
            w = np.ascontiguousarray(w.reshape(packed.k, -1)[:, :n])
            w.flags.writeable = False
            return w

        return weights

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        """Both products' multiply-adds."""
        written = super().work(input_shapes, output_shapes)
        a = input_shapes[0] if input_shapes else None
        return None if written is None or not a else 2 * written * a[-1]
