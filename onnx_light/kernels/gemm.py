"""Gemm and MatMul: one BLAS call, serial or BLAS-threaded, the output split across the pool,
or BLAS calls on tiles inside one compiled parallel region.

Parameters (one schema per op and element type, see :func:`gemm_parameters`):

``parallel.minimum_flops``
    Multiply-adds (``batch * M * N * K``) from which more than one thread is used. Below it the
    kernel makes one BLAS call limited to one BLAS thread (the forced-serial path).
``parallel.mode``
    What "more than one thread" means: ``"tiles"`` (floats) cuts the batch of products into
    one tile per thread (batch items first, then the longer side) run in one compiled OpenMP
    region of numba (:mod:`.blas_tiles`), each tile one single-threaded call of numpy's BLAS,
    Gemm's bias added to each tile while it is in cache;
    ``"blas"`` makes one BLAS call with as many BLAS threads as the session's pool;
    ``"split_rows"`` / ``"split_columns"`` split the output's rows or columns into contiguous
    blocks run on the pool as a chunked region (``ThreadPool.parallel_chunks``: the caller
    starts on the first block and does not wait for a worker that wakes after it took every
    block), each block one BLAS call limited to one BLAS thread; ``"split"``
    picks whichever of the two gives more blocks, and on a tie the larger dimension (rows when
    M >= N), so that each block stays a wide product. Inputs with a batch axis of size 2 or
    more split that axis instead, in every split mode. A split that cannot make two blocks
    runs serially: split modes never use BLAS threads.
``split.minimum_rows``
    The smallest block of output rows or columns; it caps the number of blocks at
    ``dimension // minimum_rows`` (the smallest tile side in ``"tiles"`` mode).
``weights.product`` (float types)
    What multiplies constant float32 weights (a MatMul's or Gemm's B that is an initializer):
    ``"packed"`` packs them once at the session's construction for the packed micro-kernel
    (:mod:`.packed_gemm`, where the processor has AVX2 and FMA or AVX-512F; else BLAS),
    ``"blas"`` keeps them as they are for numpy's BLAS, which packs them again on every call.
    Other element types ignore it. From ``parallel.minimum_flops`` a packed product shares its
    panels among numba's threads in one region, at most one thread per ``split.minimum_rows``
    columns, whatever ``parallel.mode`` says (:func:`.packed_gemm.packed_panels_parallel`).

An epilogue given to the kernel (:attr:`Kernel.epilogue`, an in-place function such as the
runtime's fusion makes for a Relu or Gelu) runs on every plan's output before it is returned.
``accepts_epilogue`` stays False: whether the runtime fuses activations into products, and
on which of its paths, is the runtime's choice (``runtime/fusion.py``).

No rule ties the parameters together, so the schemas have no cross-parameter validator.
Integer schemas (int32, int64, uint32, uint64) have no ``"blas"`` mode: numpy multiplies
integers with its own loop, not BLAS, so the only way to use several threads is to split.

Numerics. Every configuration computes the same sums of products; they differ only in the
order in which the BLAS kernel adds the terms, and that order changes only through BLAS's own
choice of kernel for the block it is given (the K dimension is never split here, but a block of
one row goes to gemv instead of gemm, edge blocks use other micro-kernels, and so on). The
standard forward error bound of a dot product of length K under any summation order is
``K * u * sum(|a_ik| |b_kj|)`` (to first order, ``u`` the unit roundoff), so for every
configuration and every element::

    |Y - numpy.matmul| <= 2 * (K + 2) * u * (|alpha| * (|A| @ |B|) + |beta| * |C|)

with ``u`` the roundoff of the accumulation type (float32 for float16 and bfloat16), plus,
for float16 and bfloat16, one unit in the last place of the output type for the final cast.
Integer results are exact (wrapping like numpy on overflow) whatever the configuration.

float16 and bfloat16 accumulate in float32 and cast the result back: numpy's float16 matmul
is a scalar loop and bfloat16 has no BLAS at all; this is also more accurate than
accumulating in the narrow type.

BLAS threads. Kernels never use threadpoolctl's ``threadpool_limits`` (it rescans the loaded
libraries on every entry, costlier than a small product). Before its BLAS call(s) a kernel
reads :data:`BLAS`'s thread count and changes it only if it differs from what the plan needs
(1 for the serial and split paths, the pool's thread count for ``"blas"``), restoring it
afterwards, so the process's own setting is never left changed; a runtime that enters
``BLAS.scope(1)`` around a whole run leaves serial and split calls one read each. The limit
is process-wide for OpenBLAS with pthreads (concurrent sessions may see each other's setting:
speed changes, never results); while another thread holds a ``threadpool_limits`` block the
kernel's change is skipped (the user's limit wins). Calling BLAS from several pool threads
at once is safe: with one BLAS thread each call runs on its caller's thread.

The tiles plan holds BLAS at one thread around its region and runs on numba's threads, as
many as the pool has (at most numba's own count); called from inside a pool region it runs
its tiles on the calling thread, so threads never nest.

docs/gemm.md has the measurements: the costs of changing BLAS's threads, and the runs that
chose the portable defaults (why the default mode is ``"split"``, not ``"tiles"``) and what
calibration tries.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..parallel import BLAS, in_region
from ..tuning.calibration import Budget, CalibrationResult, configuration_search
from ..tuning.keys import ElementType, KernelTuningKey
from ..tuning.processor import CpuExecutionDescriptor
from ..tuning.schema import KernelTuningSchema, Parameter, Value
from . import blas_tiles, packed_gemm
from .base import Kernel, NodeContext, Prepared, TensorSpec, compute_dtype, numpy_dtype
from .calibration import GemmConfigurations, calibration_setup, without_compilation
from .compiled import load_numba
from .compiled_elementwise import numba_threads
from .declaration import KernelDeclaration, RequiredInput, declare, dispatch_table

__all__ = [
    "BLAS",
    "DECLARATIONS",
    "INTEGER_MODES",
    "KERNELS",
    "MINIMUM_FLOPS",
    "MINIMUM_ROWS",
    "MODE",
    "MODES",
    "NOT_CALIBRATED_MODES",
    "PLANS",
    "PRODUCT",
    "PRODUCTS",
    "TUNING_ABI",
    "GemmKernel",
    "MatMulKernel",
    "gemm_candidates",
    "gemm_parameters",
    "gemm_schema",
    "tuning_schemas",
]

T = ElementType
_FLOATS = (T.FLOAT, T.DOUBLE, T.FLOAT16, T.BFLOAT16)
_INTEGERS = (T.INT32, T.INT64, T.UINT32, T.UINT64)

# Element types each ONNX version of the operators takes.
_OLD = (T.FLOAT16, T.FLOAT, T.DOUBLE)
_V9 = _OLD + _INTEGERS
_V13 = (*_V9, T.BFLOAT16)

MODES = ("tiles", "blas", "split_rows", "split_columns", "split")
INTEGER_MODES = ("split_rows", "split_columns", "split")
PLANS = ("serial", "tiles", "blas", "split_rows", "split_columns", "split_batch")

MINIMUM_FLOPS = "parallel.minimum_flops"
MODE = "parallel.mode"
MINIMUM_ROWS = "split.minimum_rows"
PRODUCT = "weights.product"
PRODUCTS = ("packed", "blas")
# Version of the Gemm and MatMul schemas' meaning (history: docs/gemm.md); cache entries of
# another version are reported stale and not used.
TUNING_ABI = 2

# The portable defaults of floats (BLAS) and of integers (numpy's own loop); docs/gemm.md
# ("Parameters and portable defaults") has the measurements that chose them.
_FLOAT_DEFAULTS: dict[str, Value] = {MINIMUM_FLOPS: 1 << 25, MODE: "split", MINIMUM_ROWS: 16,
                                     PRODUCT: "packed"}
_INTEGER_DEFAULTS: dict[str, Value] = {MINIMUM_FLOPS: 1 << 19, MODE: "split", MINIMUM_ROWS: 16}
# Modes a calibration never adopts: "blas" leaves BLAS's threads spinning after the product,
# slowing the pool's next regions, which a search timing each candidate alone cannot see
# (docs/gemm.md, "What calibration tries"); "blas" stays a manual setting.
NOT_CALIBRATED_MODES = ("blas", "split_columns")


def _is_integer(element_type: int | None) -> bool:
    return element_type in _INTEGERS


def gemm_parameters(element_type: int | None = T.FLOAT) -> tuple[Parameter, ...]:
    """The parameters of the Gemm and MatMul schemas for ``element_type``."""
    integer = _is_integer(element_type)
    defaults = _INTEGER_DEFAULTS if integer else _FLOAT_DEFAULTS
    product = () if integer else (
        Parameter(PRODUCT, "str", defaults[PRODUCT], choices=PRODUCTS,
                  description="what multiplies constant float32 weights: 'packed' (packed once "
                              "for the packed micro-kernel; BLAS without AVX2 and FMA or "
                              "AVX-512F) or 'blas' (numpy's BLAS)"),)
    return (
        Parameter(MINIMUM_FLOPS, "int", defaults[MINIMUM_FLOPS], minimum=1,
                  description="multiply-adds (batch*M*N*K) from which more than one thread is used"),
        Parameter(MODE, "str", defaults[MODE], choices=INTEGER_MODES if integer else MODES,
                  description="above the threshold: 'tiles' runs single-threaded BLAS calls on "
                              "tiles in one compiled parallel region; 'blas' threads one BLAS "
                              "call; 'split_rows', 'split_columns' or 'split' (the axis giving "
                              "more blocks) split the output across the pool, one "
                              "single-threaded BLAS call per block"),
        Parameter(MINIMUM_ROWS, "int", defaults[MINIMUM_ROWS], minimum=1,
                  description="smallest block (or tile side) of output rows or columns when "
                              "splitting"),
        *product,
    )


def gemm_schema(op_type: str, element_type: int) -> KernelTuningSchema:
    """The schema of one op (``"Gemm"`` or ``"MatMul"``) and element type."""
    if op_type not in KERNELS:
        raise ValueError(f"no schema for {op_type!r}; valid: {sorted(KERNELS)}")
    return KERNELS[op_type][max(KERNELS[op_type])].declaration.schema(element_type)


def tuning_schemas() -> list[KernelTuningSchema]:
    """One schema per op and element type (from the declarations)."""
    return [schema for declaration in DECLARATIONS for schema in declaration.schemas()]


def gemm_candidates(element_type: int) -> list[dict[str, Any]]:
    """The configurations a calibration tries: each mode the schema allows but
    :data:`NOT_CALIBRATED_MODES` at three thresholds, and ``"tiles"`` at lower ones (its
    region costs microseconds, the pool's a hundred)."""
    modes = gemm_schema("Gemm", element_type).parameter(MODE).choices or ()
    found = [{MINIMUM_FLOPS: 1 << exponent, MODE: mode, MINIMUM_ROWS: 16}
             for mode in modes if mode not in (*NOT_CALIBRATED_MODES, "tiles")
             for exponent in (17, 21, 25)]
    if "tiles" in modes:
        found += [{MINIMUM_FLOPS: 1 << exponent, MODE: "tiles", MINIMUM_ROWS: 16}
                  for exponent in (16, 18, 20, 22)]
    if not _is_integer(element_type):  # the corpus has no constant weights: the product stays
        found = [{**values, PRODUCT: _FLOAT_DEFAULTS[PRODUCT]} for values in found]
    return found


def calibrate(declaration: KernelDeclaration, key: KernelTuningKey,
              descriptor: CpuExecutionDescriptor, budget: Budget) -> CalibrationResult:
    """The configuration search of Gemm or MatMul over :func:`gemm_candidates`; on one thread
    every candidate runs the same serial product, so the portable values stay unmeasured."""
    setup = calibration_setup(declaration, key, descriptor, budget)
    if setup.threads < 2:
        return CalibrationResult(key, setup.portable, portable_kept=True, diagnostics=[
            f"{key}: only {setup.threads} thread available; portable values kept"])
    problem = GemmConfigurations(declaration, key.element_type, setup.threads)
    return without_compilation(configuration_search, key, problem, setup.portable,
                               gemm_candidates(key.element_type), setup.budget)



Epilogue = Callable[[np.ndarray, slice, slice], np.ndarray]
_ALL = slice(None)


def _same(out: np.ndarray, result: np.ndarray) -> np.ndarray:
    """``result`` in the type of ``out`` (integer Gemm epilogues may return float64)."""
    return result if result.dtype == out.dtype else result.astype(out.dtype)


class _ProductKernel(Kernel):
    """What Gemm and MatMul share: the configuration, the plan and the blocked product."""

    tuning_abi: ClassVar[int] = TUNING_ABI
    trans_a = False  # Gemm's transA: A is (K, M)
    product = _FLOAT_DEFAULTS[PRODUCT]  # weights.product, set by configuration
    #: Constant float32 weights packed at construction (:meth:`_pack`).
    _packed: packed_gemm.PackedWeights | None = None

    def __init__(self, ctx: NodeContext) -> None:
        self._region: Any = None  # blas_tiles.region(), taken on first use of the tiles plan
        super().__init__(ctx)
        self.integer = _is_integer(self.element_type)

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.minimum_flops = int(values[MINIMUM_FLOPS])
        self.mode = str(values[MODE])
        self.minimum_rows = int(values[MINIMUM_ROWS])
        self.product = str(values.get(PRODUCT, _FLOAT_DEFAULTS[PRODUCT]))  # integers: none
        element_type = self.element_type
        if (self.mode == "tiles" and self.num_threads > 1 and element_type in _FLOATS
                and self._region is None):
            # Compile (or load) the region now, at the session's construction, not in a run.
            compute = compute_dtype(numpy_dtype(element_type))
            if blas_tiles.gemm_function(compute) is not None:
                one = np.ones((1, 1), compute)
                self._tiles(one, one, (), compute, 1.0, None, 1.0)

    def _pack(self, w: np.ndarray, bias: np.ndarray | None) -> Kernel | None:
        """A copy of this kernel whose serial float32 products multiply by ``w`` (K, N),
        packed now, and add ``bias`` (N values) in the same pass (:mod:`.packed_gemm`); None
        where ``weights.product`` is ``"blas"`` or the packed kernel cannot run (neither AVX2
        and FMA nor AVX-512F, no numba)."""
        if (self.product != "packed" or w.dtype != np.float32 or w.ndim != 2
                or not packed_gemm.available()):
            return None
        kernel = copy.copy(self)
        kernel._packed = packed = packed_gemm.PackedWeights(w, bias)
        # Compile (or load) the product now, and its regions too where runs may take them, on
        # a one-value W: the compiled code does not depend on W's size, and a product with all
        # of W would read all of it once more (about 20 ms for the 411 MB of VGG-19's first layer).
        tiny = packed_gemm.PackedWeights(np.zeros((1, 1), np.float32))
        tiny.compile(threads=2 if kernel._packed_threads(self.minimum_flops, packed) > 1 else 1)
        return kernel

    def packed_input(self, position: int) -> Callable[[], np.ndarray] | None:
        """For the input at ``position``: when it is B and this kernel holds it packed (and
        reads only its shape and type at run time), a function rebuilding B from the panels;
        else None."""
        packed = self._packed
        if packed is None or position != 1:
            return None
        return packed.weights

    def _packed_for(self, shape: Sequence[int], dtype: np.dtype) -> packed_gemm.PackedWeights | None:
        """The packed weights, when a float32 A of ``shape`` (..., M, K) multiplies them; else
        None (BLAS computes it)."""
        packed = self._packed
        if packed is None or dtype != np.float32 or len(shape) < 2 or shape[-1] != packed.k:
            return None
        return packed

    def _packed_product(self, packed: packed_gemm.PackedWeights, a: np.ndarray,
                        out: np.ndarray | None = None) -> np.ndarray:
        """``a @ W (+ bias)`` by the packed weights: from ``parallel.minimum_flops``
        multiply-adds the panels are shared out among numba's threads in one region, up to
        one thread per ``split.minimum_rows`` columns (not inside a pool region, nor where
        this process may not start numba's threads)."""
        return packed.multiply(a, out, self._packed_threads(math.prod(a.shape[:-1]), packed))

    def _packed_threads(self, rows: int, packed: packed_gemm.PackedWeights) -> int:
        """The threads a packed product of ``rows`` rows runs on (numba's count for the
        calling thread set to it when above 1)."""
        threads = min(self.num_threads, packed.n // self.minimum_rows)
        if (threads < 2 or rows * packed.n * packed.k < self.minimum_flops or in_region()
                or not numba_threads(threads)):
            return 1
        return min(threads, load_numba().config.NUMBA_NUM_THREADS)

    def plan(self, m: int, n: int, k: int, batch: Sequence[int] = (),
             compute: np.dtype | None = None) -> str:
        """How a product of ``batch`` (M, K) x (K, N) matrices computed in ``compute``
        (default: the kernel's own) runs: one of :data:`PLANS`. ``"tiles"`` falls back to
        ``"split"`` where numpy's BLAS offers no gemm to call from compiled code."""
        threads = self.num_threads
        if threads < 2 or math.prod(batch) * m * n * k < self.minimum_flops:
            return "serial"
        mode = self.mode
        if mode == "blas":
            return "blas"
        if mode == "tiles":
            if compute is None:
                compute = compute_dtype(numpy_dtype(self.element_type or T.FLOAT))
            if blas_tiles.gemm_function(compute) is not None:
                return "tiles"
            mode = "split"
        if max(batch, default=1) >= 2:
            return "split_batch"
        rows = min(threads, m // self.minimum_rows)
        columns = min(threads, n // self.minimum_rows)
        if mode == "split":
            mode = "split_rows" if rows > columns or (rows == columns and m >= n) else "split_columns"
        if (rows if mode == "split_rows" else columns) >= 2:
            return mode
        return "serial"

    def _product(self, a: np.ndarray, b: np.ndarray, epilogue: Epilogue | None = None,
                 alpha: float = 1.0, c: np.ndarray | None = None, beta: float = 1.0) -> np.ndarray:
        """``epilogue(a @ b)`` in the type of ``a``, then the runtime's fused activation
        (:attr:`epilogue`); a is (..., M, K), b is (..., K, N). ``alpha * a @ b + beta * c``
        (c (1 or M, 1 or N) or None) must be what ``epilogue`` computes: the tiles plan
        applies those inside its region instead."""
        m, k = a.shape[-2:]
        n = b.shape[-1]
        if b.shape[-2] != k:
            raise self.ctx.error(f"inner dimensions differ: A is {a.shape}, B is {b.shape}")
        if a.ndim == 2 and b.ndim == 2:
            batch: tuple[int, ...] = ()
        else:
            try:
                batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
            except ValueError:
                raise self.ctx.error(f"batch dimensions do not broadcast: A is {a.shape}, "
                                     f"B is {b.shape}") from None
        compute = compute_dtype(a.dtype)
        plan = self.plan(m, n, k, batch, compute)
        if plan == "tiles":
            out = self._tiles(a, b, batch, compute, alpha, c, beta)
        else:
            out = self._blas_product(plan, a, b, batch, compute, epilogue)
        if self.epilogue is not None:
            self.epilogue(out)
        return out

    def _blas_product(self, plan: str, a: np.ndarray, b: np.ndarray, batch: tuple[int, ...],
                      compute: np.dtype, epilogue: Epilogue | None) -> np.ndarray:
        """The serial, ``blas`` and pool-split plans of :meth:`_product`."""
        m, n = a.shape[-2], b.shape[-1]
        blas = compute.kind == "f"
        with BLAS.limited((self.num_threads if plan == "blas" else 1) if blas else None):
            if plan == "serial" or plan == "blas":
                if compute == a.dtype:  # the common path: no output to allocate up front
                    out = _rows_product(a, b) if b.ndim == 2 else np.matmul(a, b)
                    if epilogue is not None:
                        out = _same(out, epilogue(out, _ALL, _ALL))
                    return out
                out = np.empty((*batch, m, n), dtype=a.dtype)
                _block(a, b, out, compute, epilogue, _ALL, _ALL)
                return out
            out = np.empty((*batch, m, n), dtype=a.dtype)
            if plan == "split_batch":
                self._split_batch(a, b, out, compute, batch, blas)
            else:
                self._split_matrix(plan, a, b, out, compute, epilogue, blas)
        return out

    def _tiles(self, a: np.ndarray, b: np.ndarray, batch: tuple[int, ...], compute: np.dtype,
               alpha: float, c: np.ndarray | None, beta: float) -> np.ndarray:
        """The tiles plan: ``alpha * a @ b + beta * c`` by :func:`blas_tiles.tiled_product`."""
        m, k = a.shape[-2:]
        n = b.shape[-1]
        count = math.prod(batch)
        a3, a_batch, lda, trans_a = blas_tiles.blas_operand(
            _batched(a.astype(compute, copy=False), batch), count)
        b3, b_batch, ldb, trans_b = blas_tiles.blas_operand(
            _batched(b.astype(compute, copy=False), batch), count)
        threads = 1 if in_region() else min(self.num_threads, blas_tiles.max_threads())
        rows, columns = blas_tiles.tile_counts(count, m, n, threads, self.minimum_rows)
        if c is None:
            bias = _NO_BIAS[compute]
        else:
            bias = np.ascontiguousarray(c, dtype=compute)
            if beta != 1.0:
                bias = bias * beta
        out = np.empty((count, m, n), dtype=compute)
        region = self._region
        if region is None:
            region = self._region = blas_tiles.region()
        blas_tiles.use_threads(threads)
        with BLAS.limited(1):
            region(blas_tiles.gemm_function(compute), _TRANS[trans_a], _TRANS[trans_b],
                   a3.ctypes.data, a_batch, lda, b3.ctypes.data, b_batch, ldb, k, alpha, out,
                   bias, -(-m // rows), -(-n // columns))
        out = out.reshape(*batch, m, n)
        return out if out.dtype == a.dtype else out.astype(a.dtype)

    def _split_matrix(self, plan: str, a: np.ndarray, b: np.ndarray, out: np.ndarray,
                      compute: np.dtype, epilogue: Epilogue | None, blas: bool) -> None:
        per_thread = blas and BLAS.per_thread
        if plan == "split_rows":
            b = b.astype(compute, copy=False)  # shared by every block: cast once

            def block(start: int, stop: int) -> None:
                rows = slice(start, stop)
                _block(a[..., rows, :], b, out[..., rows, :], compute, epilogue, rows, _ALL,
                       per_thread)

            size = out.shape[-2]
        else:
            a = a.astype(compute, copy=False)

            def block(start: int, stop: int) -> None:
                columns = slice(start, stop)
                _block(a, b[..., columns], out[..., columns], compute, epilogue, _ALL, columns,
                       per_thread)

            size = out.shape[-1]
        self.pool.parallel_chunks(size, block, min(self.num_threads, size // self.minimum_rows))

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        """Multiply-adds: the output's elements times the reduced length of A."""
        written = super().work(input_shapes, output_shapes)
        a = input_shapes[0] if input_shapes else None
        if written is None or not a:
            return None
        return written * (a[0] if self.trans_a and len(a) == 2 else a[-1])

    def _split_batch(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, compute: np.dtype,
                     batch: tuple[int, ...], blas: bool) -> None:
        per_thread = blas and BLAS.per_thread
        # Broadcast operands are cast before they are broadcast, so each element is cast once.
        a = np.broadcast_to(a.astype(compute, copy=False), (*batch, *a.shape[-2:]))
        b = np.broadcast_to(b.astype(compute, copy=False), (*batch, *b.shape[-2:]))
        axis = int(np.argmax(batch))
        lead = (_ALL,) * axis

        def block(start: int, stop: int) -> None:
            index = (*lead, slice(start, stop))
            _block(a[index], b[index], out[index], compute, None, _ALL, _ALL, per_thread)

        self.pool.parallel_chunks(batch[axis], block, self.num_threads)


_TRANS = {False: 111, True: 112}  # CBLAS's NoTrans and Trans
_NO_BIAS = {np.dtype(t): np.empty((0, 0), t) for t in (np.float32, np.float64)}


def _rows_product(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` for a (..., M, K) and a matrix b (K, N): a C-contiguous A is one (rows, K)
    matrix, so the product is one BLAS call instead of numpy's call per batch item."""
    if a.ndim == 2 or not a.flags.c_contiguous:
        return np.matmul(a, b, out=out)
    shape = (*a.shape[:-1], b.shape[1])
    result = np.matmul(a.reshape(-1, a.shape[-1]), b,
                       out=None if out is None else out.reshape(-1, b.shape[1]))
    return result.reshape(shape)


def _batched(x: np.ndarray, batch: tuple[int, ...]) -> np.ndarray:
    """``x`` (..., R, C) as (count or 1, R, C) for the ``count = prod(batch)`` products."""
    if math.prod(x.shape[:-2]) == 1:
        return x.reshape(1, *x.shape[-2:])
    return np.broadcast_to(x, (*batch, *x.shape[-2:])).reshape(-1, *x.shape[-2:])


def _block(a: np.ndarray, b: np.ndarray, out: np.ndarray, compute: np.dtype,
           epilogue: Epilogue | None, rows: slice, columns: slice, per_thread: bool = False) -> None:
    """``out[...] = epilogue(a @ b)``, computing in ``compute`` (one BLAS call for floats)."""
    with BLAS.limited(1 if per_thread else None):
        if out.dtype == compute:
            np.matmul(a, b, out=out)
            result = out
        else:
            result = np.matmul(a.astype(compute, copy=False), b.astype(compute, copy=False))
        if epilogue is not None:
            result = epilogue(result, rows, columns)
        if result is not out:
            out[...] = result


class GemmKernel(_ProductKernel):
    """``Y = alpha * A' @ B' + beta * C`` (opsets 7, 9, 11, 13), A' = A.T if transA, etc.

    C broadcasts unidirectionally to (M, N); it is optional from opset 11. Like the ONNX
    reference, ``beta == 0`` ignores C. float16 and bfloat16 accumulate in float32 (and apply
    alpha and beta there) before the result is cast back. Integer types multiply exactly in
    their own type; when alpha or beta is not 0 or 1 the scaling is done in float64 and the
    result truncated back, as the reference does.
    """

    op_type: ClassVar[str] = "Gemm"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.alpha = float(ctx.attribute("alpha", 1.0))
        self.beta = float(ctx.attribute("beta", 1.0))
        self.trans_a = bool(ctx.attribute("transA", 0))
        self.trans_b = bool(ctx.attribute("transB", 0))

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
            raise self.ctx.error("needs inputs A and B")
        a, b = inputs[0], inputs[1]
        c = inputs[2] if len(inputs) > 2 else None
        if a.ndim != 2 or b.ndim != 2:
            raise self.ctx.error(f"A and B must be 2-D, got {a.shape} and {b.shape}")
        if b.dtype != a.dtype or (c is not None and c.dtype != a.dtype):
            types = [x.dtype for x in (a, b, c) if x is not None]
            raise self.ctx.error(f"A, B and C must have the same type, got {types}")
        packed = None if self.trans_a else self._packed_for(a.shape, a.dtype)
        if packed is not None:
            y = self._packed_product(packed, a)
            if self.epilogue is not None:
                self.epilogue(y)
            return (y,)
        if self.trans_a:
            a = a.T
        if self.trans_b:
            b = b.T
        m, n = a.shape[0], b.shape[1]
        alpha, beta = self.alpha, self.beta
        c2 = None
        if c is not None and beta != 0.0:
            c2 = _as_matrix(c, m, n)
            if c2 is None:
                raise self.ctx.error(f"C of shape {c.shape} does not broadcast to ({m}, {n})")
        if alpha == 1.0 and c2 is None:
            return (self._product(a, b),)
        if self.integer or a.dtype.kind in "iu":
            epilogue = _integer_epilogue(alpha, beta, c2)
        else:
            epilogue = _float_epilogue(alpha, beta, c2, compute_dtype(a.dtype))
        return (self._product(a, b, epilogue, alpha, c2, beta),)

    def packed_input(self, position: int) -> Callable[[], np.ndarray] | None:
        """As :meth:`_ProductKernel.packed_input`, B transposed back where ``transB`` packed
        its transpose."""
        rebuild = super().packed_input(position)
        if rebuild is None or not self.trans_b:
            return rebuild

        def transposed() -> np.ndarray:
            b = np.ascontiguousarray(rebuild().T)
            b.flags.writeable = False
            return b

        return transposed

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Constant float32 weights B packed once (:meth:`_pack`), with a constant C of one
        value per column as the bias, when alpha is 1 and A is not transposed."""
        b = constants[1] if len(constants) > 1 else None
        if (b is None or self.trans_a or self.alpha != 1.0 or b.ndim != 2
                or self.ctx.input_types[:1] != (T.FLOAT,)):
            return None
        w = b.T if self.trans_b else b
        c = None
        if self.ctx.given(2) and self.beta != 0.0:
            c = constants[2] if len(constants) > 2 else None
            if c is None:
                return None  # a C given at run time
        if c is not None and (self.beta != 1.0 or c.dtype != np.float32 or c.ndim > 2
                              or c.size != w.shape[1] or c.shape[-1] != w.shape[1]):
            return None
        return self._pack(w, c)  # packed from B's own layout: no transposed copy


def _as_matrix(c: np.ndarray, m: int, n: int) -> np.ndarray | None:
    """C as a 2-D view of shape (1 or M, 1 or N), or None if it does not broadcast to (M, N)."""
    if c.ndim > 2:
        return None
    c2 = c.reshape((1,) * (2 - c.ndim) + c.shape)
    rows, columns = c2.shape
    if rows not in (1, m) or columns not in (1, n):
        return None
    return c2


def _c_block(c: np.ndarray, rows: slice, columns: slice) -> np.ndarray:
    """The part of the (1 or M, 1 or N) matrix C that broadcasts to ``Y[rows, columns]``."""
    if rows is _ALL and columns is _ALL:
        return c
    return c[rows if c.shape[0] != 1 else _ALL, columns if c.shape[1] != 1 else _ALL]


def _float_epilogue(alpha: float, beta: float, c: np.ndarray | None, compute: np.dtype) -> Epilogue:
    def epilogue(y: np.ndarray, rows: slice, columns: slice) -> np.ndarray:
        if alpha != 1.0:
            y *= alpha
        if c is not None:
            block = _c_block(c, rows, columns).astype(compute, copy=False)
            if beta != 1.0:
                block = block * beta
            y += block
        return y

    return epilogue


def _integer_epilogue(alpha: float, beta: float, c: np.ndarray | None) -> Epilogue:
    exact = alpha == 1.0 and beta == 1.0

    def epilogue(y: np.ndarray, rows: slice, columns: slice) -> np.ndarray:
        if exact:  # c is not None here: alpha == 1 without C never gets an epilogue
            y += _c_block(c, rows, columns)
            return y
        scaled = y * alpha  # float64, as the reference computes
        if c is not None:
            scaled += _c_block(c, rows, columns) * beta
        return scaled

    return epilogue


class MatMulKernel(_ProductKernel):
    """``numpy.matmul`` semantics (opsets 1, 9, 13): batched, broadcasting batch dimensions.

    A 1-D A is promoted to a row (1, K) and a 1-D B to a column (K, 1); the added dimension
    is removed from the result. float16 and bfloat16 accumulate in float32 and the result is
    cast back.
    """

    op_type: ClassVar[str] = "MatMul"
    accepts_epilogue: ClassVar[bool] = True
    #: A (1, N) row the runtime's fusion adds to every row of the product (an ``Add`` of a
    #: constant bias after the node, ``runtime/matmul_fusion.py``), before the epilogue.
    bias: np.ndarray | None = None
    _split: tuple[int, ...] = ()
    _columns: tuple[slice, ...] = ()  # the groups' columns, made once (numpy's int64 ends
    # and a generator cost 25 us a call in a transformer's run)

    @property
    def split(self) -> tuple[int, ...]:
        """The widths of the groups of columns handed out as separate outputs, views of one
        product (sibling products of one input fused into one, ``runtime/sibling_fusion.py``):
        the node then reads A and one B per group, and multiplies A by the Bs side by side;
        empty: one output."""
        return self._split

    @split.setter
    def split(self, widths: Sequence[int]) -> None:
        self._split = tuple(int(width) for width in widths)
        ends = itertools.accumulate(self._split)
        self._columns = tuple(slice(end - width, end) for width, end in zip(self._split, ends, strict=True))

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        if self.split and len(inputs) == len(self.split) + 1 and all(x is not None for x in inputs):
            inputs = (inputs[0], inputs[1] if self._packed is not None else np.concatenate(inputs[1:], -1))
        if len(inputs) != 2 or inputs[0] is None or inputs[1] is None:
            raise self.ctx.error("needs exactly two inputs A and B")
        a, b = inputs
        if a.ndim == 0 or b.ndim == 0:
            raise self.ctx.error(f"inputs must have at least one dimension, got {a.shape} and {b.shape}")
        if b.dtype != a.dtype:
            raise self.ctx.error(f"A and B must have the same type, got {a.dtype} and {b.dtype}")
        vector_a, vector_b = a.ndim == 1, b.ndim == 1
        if vector_a:
            a = a[np.newaxis, :]
        if vector_b:
            b = b[:, np.newaxis]
        bias = self.bias
        packed = None if vector_b else self._packed_for(a.shape, a.dtype)
        if packed is not None:
            y = self._packed_product(packed, a)
            if self.epilogue is not None:
                self.epilogue(y)
        elif bias is None:
            y = self._product(a, b)
        else:
            if vector_b or bias.shape[1] != b.shape[-1] or bias.dtype != a.dtype:
                raise self.ctx.error(f"the fused bias of shape {list(bias.shape[1:])} does not fit "
                                     f"B of shape {list(b.shape)}")
            y = self._product(a, b, _float_epilogue(1.0, 1.0, bias, compute_dtype(a.dtype)), 1.0, bias)
        if vector_b:
            y = y[..., 0]
        if vector_a:
            y = y[..., 0, :] if not vector_b else y[..., 0]
        if self._columns:
            return tuple([y[..., columns] for columns in self._columns])
        return (y,)

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """One BLAS product (and the fused bias) into the given buffer: what :meth:`run`
        computes for A (..., M, K) and a matrix B of one type computed as it is, on a serial
        plan, without an epilogue; None otherwise."""
        if len(inputs) != 2 or self.epilogue is not None or self.split:
            return None
        (a, a_dtype), (b, b_dtype) = inputs
        packed = self._packed_for(a, a_dtype)
        if packed is not None and len(b) == 2 and b_dtype == a_dtype:

            def packed_product(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
                self._packed_product(packed, x, out)

            return Prepared(packed_product, (*a[:-1], packed.n), a_dtype)
        if (len(a) < 2 or len(b) != 2 or a_dtype != b_dtype or a[-1] != b[0]
                or compute_dtype(a_dtype) != a_dtype
                or self.plan(a[-2], b[1], a[-1], a[:-2]) != "serial"):
            return None
        bias = self.bias
        if bias is None:
            return Prepared(np.matmul if len(a) == 2 else _rows_product, (*a[:-1], b[1]), a_dtype)
        if bias.shape[1] != b[1] or bias.dtype != a_dtype:
            return None

        def with_bias(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
            _rows_product(x, w, out)
            out += bias

        return Prepared(with_bias, (*a[:-1], b[1]), a_dtype)

    def packed_input(self, position: int) -> Callable[[], np.ndarray] | None:
        """As for any product; a :attr:`split` product's B at ``position`` is its group of
        columns of the packed weights."""
        whole = super().packed_input(1)
        if not self.split or whole is None:
            return super().packed_input(position)
        if not 1 <= position <= len(self.split):
            return None
        stop = sum(self.split[:position])
        start = stop - self.split[position - 1]

        def columns() -> np.ndarray:
            w = np.ascontiguousarray(whole()[:, start:stop])
            w.flags.writeable = False
            return w

        return columns

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Constant float32 weights B (a matrix; the Bs side by side for a :attr:`split`
        product) packed once, with the fused bias (:meth:`_pack`)."""
        b = constants[1] if len(constants) > 1 else None
        if self.split:
            weights = constants[1:]
            if len(weights) != len(self.split) or any(w is None or w.ndim != 2 for w in weights):
                return None
            b = np.concatenate(weights, axis=1)
        if b is None or b.ndim != 2 or self.ctx.input_types[:1] != (T.FLOAT,):
            return None
        bias = self.bias
        if bias is not None and (bias.dtype != np.float32 or bias.shape[-1] != b.shape[1]):
            return None
        return self._pack(b, bias)


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(GemmKernel, (7, 9, 11, 13), types={7: _OLD, 9: _V9, 13: _V13},
            parameters=gemm_parameters, calibrate=calibrate,
            required=(RequiredInput(2, "C", before=11),)),
    declare(MatMulKernel, (1, 9, 13), types={1: _OLD, 9: _V9, 13: _V13},
            parameters=gemm_parameters, calibrate=calibrate),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
