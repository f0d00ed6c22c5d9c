"""MatMulBias: a MatMul followed by the Add of a constant bias, as one step; MatMulAdd: a
MatMul followed by the Add of another tensor of the product's shape (a residual connection).

Not an ONNX operator: ``runtime/fusion.py`` makes one of ``MatMul(A, W)`` whose output only an
``Add`` of a constant ``B`` reads, where B holds one value per column of the product (shape
``(N,)``, ``(1, N)``, ...: the bias of a linear layer), when the inferred shapes make it a
small 2-D product (at most :data:`SMALL_WORK` multiply-adds): both happen in one compiled loop
that writes the output once, and a chain of tiny layers costs one call per layer instead of
a matrix product and an addition. Inputs outside that case (other shapes or types than the
plan's) run the MatMul kernel, then the addition in place.

The compiled loop sums each product's terms in order, in the inputs' type, and adds the bias
last, as the graph does; BLAS may order the sums otherwise, so the result may differ from the
unfused graph's by a unit or so in the last place of the products' terms (tested against it).

MatMulAdd (``runtime/matmul_fusion.py`` makes it of a MatMul whose output only an Add of a
tensor of the same shape reads, that tensor made before the MatMul: a transformer's residual
connection after its output projection) adds that tensor into the product's output in place:
one step and one pass fewer, and the graph's values bit for bit (the same product, then one
rounded addition, as the Add does).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import numpy as np

from ..parallel import ThreadPool
from ..tuning.schema import KernelTuningSchema, Value
from .base import Kernel, NodeContext, Prepared, TensorSpec
from .compiled import compiled

__all__ = ["SMALL_WORK", "MatMulAdd", "MatMulBias"]

#: Products of at most this many multiply-adds (M * K * N) run as one compiled loop.
SMALL_WORK = 1 << 14
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@compiled
def small_matmul_bias(a: np.ndarray, w: np.ndarray, bias: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ w + bias`` for C-contiguous 2-D ``a`` (M, K), ``w`` (K, N) and ``bias`` (N,)."""
    m, k = a.shape
    n = w.shape[1]
    for i in range(m):
        for j in range(n):
            out[i, j] = 0
        for p in range(k):
            x = a[i, p]
            for j in range(n):
                out[i, j] += x * w[p, j]
        for j in range(n):
            out[i, j] += bias[j]


class MatMulBias(Kernel):
    """``matmul`` (the MatMul node's kernel, bound as the session's) followed by the addition
    of ``bias`` (the Add's constant, one value per column, of the inputs' type). The step is
    tuned as the MatMul node: its key, and the values its product reads at run time."""

    op_type: ClassVar[str] = "MatMulBias"

    def __init__(self, ctx: NodeContext, matmul: Kernel, bias: np.ndarray) -> None:
        super().__init__(ctx)
        self.matmul = matmul
        self.bias = np.ascontiguousarray(bias.reshape(-1))
        self.bias.flags.writeable = False

    def tuning_schema(self) -> KernelTuningSchema | None:
        """The MatMul node's schema: the session resolves and checks its values for this step."""
        return self.matmul.tuning_schema()

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.matmul._configure(values)

    def _small(self, a_shape: Sequence[int], a_dtype: np.dtype, w_shape: Sequence[int],
               w_dtype: np.dtype) -> bool:
        """Whether the compiled loop computes a product of these 2-D specs."""
        return (len(a_shape) == 2 and len(w_shape) == 2 and a_dtype == w_dtype == self.bias.dtype
                and a_dtype in _FLOATS and a_shape[1] == w_shape[0] and w_shape[1] == self.bias.size
                and a_shape[0] * a_shape[1] * w_shape[1] <= SMALL_WORK)

    def run(self, a: np.ndarray, w: np.ndarray) -> Sequence[np.ndarray]:
        if (self._small(a.shape, a.dtype, w.shape, w.dtype) and a.flags.c_contiguous
                and w.flags.c_contiguous):
            out = np.empty((a.shape[0], w.shape[1]), a.dtype)
            small_matmul_bias(a, w, self.bias, out)
            return (out,)
        (y,) = self.matmul.run(a, w)
        return (np.add(y, self.bias, out=y) if y.flags.writeable else np.add(y, self.bias),)

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The compiled loop for a small product (compiled or loaded from numba's cache now);
        else the MatMul's prepared product followed by the addition in place."""
        if len(inputs) != 2:
            return None
        (a_shape, a_dtype), (w_shape, w_dtype) = inputs
        bias = self.bias
        if self._small(a_shape, a_dtype, w_shape, w_dtype):
            kernel = small_matmul_bias.dispatcher
            kernel(np.zeros(a_shape, a_dtype), np.zeros(w_shape, w_dtype), bias,  # compile now
                   np.empty((a_shape[0], w_shape[1]), a_dtype))

            def compute_small(a: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
                kernel(a, w, bias, out)

            return Prepared(compute_small, (a_shape[0], w_shape[1]), np.dtype(a_dtype))
        prepared = self.matmul.prepare(inputs)
        if prepared is None or prepared.dtype != bias.dtype:
            return None
        product, add = prepared.compute, np.add

        def compute_large(a: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
            product(a, w, out=out)
            add(out, bias, out=out)

        return Prepared(compute_large, prepared.shape, prepared.dtype)

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        work = self.matmul.work(input_shapes, output_shapes)
        if work is None or not output_shapes or output_shapes[0] is None:
            return work
        return work + math.prod(output_shapes[0])


class MatMulAdd(Kernel):
    """``matmul`` (the MatMul node's kernel, with its fused bias if any) of A and W, plus a
    third input R of the product's shape and type, added in place into the product. The
    step is tuned as the MatMul node."""

    op_type: ClassVar[str] = "MatMulAdd"

    def __init__(self, ctx: NodeContext, matmul: Kernel) -> None:
        super().__init__(ctx)
        self.matmul = matmul

    def tuning_schema(self) -> KernelTuningSchema | None:
        """The MatMul node's schema: the session resolves and checks its values for this step."""
        return self.matmul.tuning_schema()

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.matmul._configure(values)

    def bind(self, pool: ThreadPool | None) -> MatMulAdd:
        """This step and its MatMul on ``pool`` (the session binds its steps' kernels only)."""
        self.matmul.bind(pool)
        return super().bind(pool)

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """The MatMul's own specialization (packed weights) inside a new step."""
        matmul = self.matmul.specialize(constants[:2])
        if matmul is None:
            return None
        kernel = copy.copy(self)
        kernel.matmul = matmul
        return kernel

    def packed_input(self, position: int) -> Callable[[], np.ndarray] | None:
        """The MatMul's packed weights (position 1), rebuilt."""
        return self.matmul.packed_input(position) if position < 2 else None

    def run(self, a: np.ndarray, w: np.ndarray, residual: np.ndarray) -> Sequence[np.ndarray]:
        (y,) = self.matmul.run(a, w)
        if y.shape == residual.shape and y.dtype == residual.dtype and y.flags.writeable:
            return (np.add(y, residual, out=y),)
        return (np.add(y, residual),)

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The MatMul's prepared product into the buffer, then R added in place, for an R of
        the product's shape and type."""
        if len(inputs) != 3:
            return None
        prepared = self.matmul.prepare(inputs[:2])
        if prepared is None or tuple(inputs[2][0]) != tuple(prepared.shape) or inputs[2][1] != prepared.dtype:
            return None
        product, add = prepared.compute, np.add

        def compute(a: np.ndarray, w: np.ndarray, residual: np.ndarray, out: np.ndarray) -> None:
            product(a, w, out=out)
            add(out, residual, out=out)

        return Prepared(compute, prepared.shape, prepared.dtype)

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        work = self.matmul.work(input_shapes[:2], output_shapes)
        if work is None or not output_shapes or output_shapes[0] is None:
            return work
        return work + math.prod(output_shapes[0])
