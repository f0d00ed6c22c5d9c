"""Calibration problems of the kernel library, on the tuning core's searches.

Elementwise kernels use the shared crossover search (:func:`calibrate_elementwise`, the
callback every elementwise declaration names): the ops differ only in the data they feed
(:data:`DOMAINS`), so this is registration, not code per op. The serial reference and the
parallel candidate are the same kernel class, configured with the threshold out of reach
and at 1.

Gemm and MatMul use the multi-parameter configuration search over a fixed corpus of shapes
(:data:`GEMM_CORPUS`) and the grid of configurations their module chooses; each
configuration's output must stay within the kernels' stated error bound of the portable
configuration's. The problems take the kernel's declaration (its class, versions and
schema), so this module imports no kernel module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..parallel import get_pool
from ..tuning.calibration import (
    Budget,
    CalibrationResult,
    crossover_search,
)
from ..tuning.keys import ElementType, KernelTuningKey
from ..tuning.processor import CpuExecutionDescriptor
from ..tuning.schema import Value
from .base import NodeContext, numpy_dtype
from .compiled import clock_without_compilation, process_compile_seconds
from .declaration import KernelDeclaration

__all__ = [
    "DOMAINS",
    "GEMM_CORPUS",
    "CalibrationSetup",
    "ElementwiseCrossover",
    "GemmConfigurations",
    "RowsCrossover",
    "calibrate_elementwise",
    "calibration_setup",
]

SERIAL = 1 << 62
SEED = 20261129
# Value ranges (low, high) per op and input index where the default (-4, 4) leaves the domain.
DOMAINS: dict[str, dict[int, tuple[float, float]]] = {
    "Log": {0: (0.1, 4.0)},
    "Sqrt": {0: (0.1, 4.0)},
    "Reciprocal": {0: (0.5, 4.0)},
    "Asin": {0: (-0.9, 0.9)},
    "Acos": {0: (-0.9, 0.9)},
    "Atanh": {0: (-0.9, 0.9)},
    "Acosh": {0: (1.1, 4.0)},
    "Div": {1: (1.0, 4.0)},
    "Mod": {1: (1.0, 4.0)},
    "Pow": {0: (0.5, 2.0), 1: (0.0, 3.0)},
}


class CalibrationSetup(NamedTuple):
    """What a calibration callback starts from (:func:`calibration_setup`)."""

    threads: int
    portable: dict[str, Value]
    budget: Budget


def without_compilation(search: Callable[..., CalibrationResult], *args: Any,
                        **options: Any) -> CalibrationResult:
    """``search(*args, **options)`` (the core's crossover or configuration search) timed by a
    clock that stands still while numba compiles on any thread (a parallel candidate compiles
    on the pool's threads), so that a cold compile cache costs the search no candidates; the
    seconds compiled become the result's
    ``setup_s``, which the tuning API does not count against the duration budget."""
    compiled_before = process_compile_seconds()
    result = search(*args, timer=clock_without_compilation, **options)
    result.setup_s = process_compile_seconds() - compiled_before
    return result


def calibration_setup(declaration: KernelDeclaration, key: KernelTuningKey,
                      descriptor: CpuExecutionDescriptor, budget: Budget) -> CalibrationSetup:
    """The threads a callback measures on (the descriptor's, at most the budget's, at least
    one), the portable values of the key's schema (where every search starts) and the budget
    limited to those threads: the setup every calibration callback shares."""
    threads = max(1, min(descriptor.num_threads, budget.max_threads))
    return CalibrationSetup(threads, dict(declaration.schema(key.element_type).defaults),
                            dataclasses.replace(budget, max_threads=threads))


def _values(rng: np.random.Generator, element_type: int, shape: tuple[int, ...],
            domain: tuple[float, float]) -> np.ndarray:
    """Seeded values of an ONNX type: both signs where the type has them, no overflow."""
    dtype = numpy_dtype(element_type)
    low, high = domain
    if element_type == ElementType.BOOL:
        return rng.random(shape) < 0.5
    if element_type == ElementType.STRING:
        return rng.integers(0, 10, size=shape).astype(str).astype(object)
    if dtype.kind in "iu":
        low = max(low, 0) if dtype.kind == "u" else low
        return rng.integers(int(np.floor(low * 2.5)), int(np.ceil(high * 2.5)) + 1,
                            size=shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.uniform(low, high, shape) + 1j * rng.uniform(low, high, shape)).astype(dtype)
    return rng.uniform(low, high, shape).astype(np.float32).astype(dtype)


class ElementwiseCrossover:
    """The shared search's problem for one elementwise kernel (its declaration) and element
    type; the threshold searched is the schema's one parameter."""

    def __init__(self, declaration: KernelDeclaration, element_type: int, num_threads: int) -> None:
        op = declaration.kernel.op
        self.op, self.element_type = op, element_type
        self.parameter = declaration.schema(element_type).names[0]
        self.inputs = 1 if op.arity.maximum == 1 or op.arity.optional else max(2, op.arity.minimum)
        self.cases = ("equal",) if self.inputs == 1 else ("equal", "scalar", "broadcast")
        types = [element_type] * self.inputs
        if op.key_input:  # Where: the condition first
            types[0] = ElementType.BOOL
        ctx = NodeContext(f"calibrate_{op.op_type}", op.op_type, "", max(declaration.versions),
                          input_types=tuple(types), num_inputs=self.inputs)
        pool = get_pool(num_threads)
        kernel_class = declaration.kernel
        self._serial, self._parallel = kernel_class(ctx).bind(pool), kernel_class(ctx).bind(pool)
        self._serial.configure({self.parameter: SERIAL})
        self._parallel.configure({self.parameter: 1})
        self._types = types

    def _shapes(self, size: int, case: str) -> list[tuple[int, ...]]:
        if case == "equal":
            return [(size,)] * self.inputs
        if case == "scalar":
            return [(size,)] + [()] * (self.inputs - 1)
        rows = 1 << (size.bit_length() // 2)  # multidirectional: (rows, 1) with (1, cols)
        return [(rows, 1)] + [(1, size // rows)] * (self.inputs - 1)

    def input_bytes(self, size: int, case: str) -> int:
        itemsize = max(numpy_dtype(t).itemsize for t in self._types)
        return itemsize * size * (self.inputs + 1)

    def make_inputs(self, size: int, case: str) -> list[np.ndarray]:
        rng = np.random.default_rng([SEED, size, self.cases.index(case)])
        domains = DOMAINS.get(self.op.op_type, {})
        return [_values(rng, t, shape, domains.get(i, (-4.0, 4.0)))
                for i, (t, shape) in enumerate(zip(self._types, self._shapes(size, case),
                                                   strict=True))]

    def serial(self, inputs: list[np.ndarray]) -> np.ndarray:
        return self._serial.run(*inputs)[0]

    def candidate(self, inputs: list[np.ndarray]) -> np.ndarray:
        return self._parallel.run(*inputs)[0]

    def same_output(self, reference: Any, candidate: Any) -> bool:
        """Bit-exact: same dtype, shape and bytes (NaNs included)."""
        if reference.dtype != candidate.dtype or reference.shape != candidate.shape:
            return False
        if reference.dtype.kind == "O":
            return bool(np.array_equal(reference, candidate))
        return reference.tobytes() == candidate.tobytes()


def calibrate_elementwise(declaration: KernelDeclaration, key: KernelTuningKey,
                          descriptor: CpuExecutionDescriptor, budget: Budget) -> CalibrationResult:
    """The crossover search of an elementwise kernel's threshold, from its portable default."""
    setup = calibration_setup(declaration, key, descriptor, budget)
    problem = ElementwiseCrossover(declaration, key.element_type, setup.threads)
    return without_compilation(crossover_search, key, problem, problem.parameter, setup.portable,
                               setup.budget)


class RowsCrossover:
    """The shared search's problem for a kernel computing rows of its one float input
    independently (Softmax): X of ``size`` elements in rows of each case's length, the
    threshold the schema parameter the callback names."""

    LENGTHS = {"rows of 64": 64, "rows of 1024": 1024}

    def __init__(self, declaration: KernelDeclaration, element_type: int, num_threads: int,
                 parameter: str) -> None:
        self.element_type, self.parameter = element_type, parameter
        self.cases = tuple(self.LENGTHS)
        op_type = declaration.op_type
        ctx = NodeContext(f"calibrate_{op_type}", op_type, "", max(declaration.versions),
                          input_types=(element_type,), output_types=(element_type,), num_inputs=1)
        pool = get_pool(num_threads)
        self._serial = declaration.kernel(ctx).bind(pool)
        self._parallel = declaration.kernel(ctx).bind(pool)
        self._serial.configure({parameter: SERIAL})
        self._parallel.configure({parameter: 1})

    def input_bytes(self, size: int, case: str) -> int:
        return 2 * size * numpy_dtype(self.element_type).itemsize

    def make_inputs(self, size: int, case: str) -> list[np.ndarray]:
        length = self.LENGTHS[case]
        rng = np.random.default_rng([SEED, size, self.cases.index(case)])
        return [_values(rng, self.element_type, (max(1, size // length), length), (-8.0, 8.0))]

    def serial(self, inputs: list[np.ndarray]) -> np.ndarray:
        return self._serial.run(*inputs)[0]

    def candidate(self, inputs: list[np.ndarray]) -> np.ndarray:
        return self._parallel.run(*inputs)[0]

    def same_output(self, reference: Any, candidate: Any) -> bool:
        """Bit-exact: every row is computed the same way on either path."""
        return (reference.dtype == candidate.dtype and reference.shape == candidate.shape
                and reference.tobytes() == candidate.tobytes())


# (name, M, K, N, transA, transB): small, skinny, square, wide, tall, transposed, and products
# real models make (a classifier head, AlexNet's fc6, an im2col'd 3x3 convolution, a transformer's
# projection at batch 2 x 32 tokens and its feed-forward product at 2 x 128, hidden 768).
GEMM_CORPUS: tuple[tuple[str, int, int, int, bool, bool], ...] = (
    ("small 16x16x16", 16, 16, 16, False, False),
    ("row 1x1024x1024", 1, 1024, 1024, False, False),
    ("column 1024x1024x1", 1024, 1024, 1, False, False),
    ("square 128", 128, 128, 128, False, False),
    ("square 384", 384, 384, 384, False, False),
    ("square 384 transA transB", 384, 384, 384, True, True),
    ("wide 64x256x2048", 64, 256, 2048, False, False),
    ("tall 2048x256x64 transB", 2048, 256, 64, False, True),
    ("head 1x2048x1000 transB", 1, 2048, 1000, False, True),
    ("fc 4x4096x4096 transB", 4, 4096, 4096, False, True),
    ("conv 784x576x128", 784, 576, 128, False, False),
    ("projection 64x256x256", 64, 256, 256, False, False),
    ("feed-forward 256x768x3072 transB", 256, 768, 3072, False, True),
)


class _GemmInputs(NamedTuple):
    case: str
    arrays: list[np.ndarray]
    magnitude: np.ndarray  # |alpha| |A| @ |B| + |beta| |C|, for the error bound
    k: int


class GemmConfigurations:
    """The configuration search's problem for Gemm or MatMul (its declaration) of one
    element type."""

    def __init__(self, declaration: KernelDeclaration, element_type: int, num_threads: int) -> None:
        op_type = declaration.op_type
        self.declaration, self.op_type, self.element_type = declaration, op_type, element_type
        self.dtype = numpy_dtype(element_type)
        self.pool = get_pool(num_threads)
        self.corpus = {entry[0]: entry for entry in GEMM_CORPUS
                       if op_type == "Gemm" or not (entry[4] or entry[5])}
        self.cases = tuple(self.corpus)
        self._kernels: dict[tuple[str, tuple[Any, ...]], Any] = {}

    def _kernel(self, values: dict[str, Any], case: str) -> Any:
        trans = self.corpus[case][4:]
        cache_key = (case if self.op_type == "Gemm" else "", tuple(sorted(values.items())))
        kernel = self._kernels.get(cache_key)
        if kernel is None:
            attributes = {"transA": int(trans[0]), "transB": int(trans[1])} \
                if self.op_type == "Gemm" else {}
            version = max(self.declaration.versions)
            count = 3 if self.op_type == "Gemm" else 2
            ctx = NodeContext(f"calibrate_{self.op_type}", self.op_type, "", version, attributes,
                              (self.element_type,) * count, (self.element_type,), count)
            kernel = self.declaration.kernel(ctx).bind(self.pool)
            kernel.configure(values)
            self._kernels[cache_key] = kernel
        return kernel

    def work(self, case: str) -> int:
        _, m, k, n, _, _ = self.corpus[case]
        return m * k * n

    def input_bytes(self, case: str) -> int:
        _, m, k, n, _, _ = self.corpus[case]
        return 4 * self.dtype.itemsize * (m * k + k * n + 2 * m * n)

    def make_inputs(self, case: str) -> _GemmInputs:
        _, m, k, n, trans_a, trans_b = self.corpus[case]
        rng = np.random.default_rng([SEED, self.cases.index(case)])
        a = _values(rng, self.element_type, (k, m) if trans_a else (m, k), (-1.0, 1.0))
        b = _values(rng, self.element_type, (n, k) if trans_b else (k, n), (-1.0, 1.0))
        inputs = [a, b]
        if self.op_type == "Gemm":
            inputs.append(_values(rng, self.element_type, (n,), (-1.0, 1.0)))
        a64 = np.abs(a.astype(np.float64).T if trans_a else a.astype(np.float64))
        b64 = np.abs(b.astype(np.float64).T if trans_b else b.astype(np.float64))
        magnitude = a64 @ b64 + (np.abs(inputs[2].astype(np.float64)) if len(inputs) == 3 else 0)
        return _GemmInputs(case, inputs, magnitude, k)

    def run(self, values: dict[str, Any], inputs: _GemmInputs) -> tuple[np.ndarray, _GemmInputs]:
        return self._kernel(values, inputs.case).run(*inputs.arrays)[0], inputs

    def same_output(self, reference: Any, candidate: Any) -> bool:
        """Within the kernels' stated bound: 2 (K + 2) u (|A||B| + |C|), plus one output ulp."""
        (expected, inputs), (got, _) = reference, candidate
        magnitude, k = inputs.magnitude, inputs.k
        if expected.shape != got.shape or expected.dtype != got.dtype:
            return False
        if expected.dtype.kind in "iu":
            return bool(np.array_equal(expected, got))
        accumulate = np.float64 if expected.dtype == np.float64 else np.float32
        bound = 2 * (k + 2) * np.finfo(accumulate).eps * magnitude
        if expected.dtype.itemsize < 4:  # float16, bfloat16: one unit of the final rounding
            import ml_dtypes  # here: its import is costly (docs/benchmarks.md), and bfloat16 rare

            bound = bound + np.abs(expected.astype(np.float64)) * float(ml_dtypes.finfo(expected.dtype).eps)
        difference = np.abs(expected.astype(np.float64) - got.astype(np.float64))
        return bool(np.all(difference <= bound))
