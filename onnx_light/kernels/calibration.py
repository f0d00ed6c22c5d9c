"""Calibration callbacks of the elementwise kernels, on the core's shared crossover search.

Every elementwise op and element type gets a callback; they differ only in the
data they feed (:data:`DOMAINS`), so this is registration, not code per op.
The serial reference and the parallel candidate are the same kernel class,
configured with ``parallel.minimum_elements`` out of reach and at 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto

from ..parallel import get_pool
from ..tuning.calibration import Budget, CalibrationResult, crossover_search
from ..tuning.keys import KernelTuningKey
from ..tuning.processor import CpuExecutionDescriptor
from .base import LIBRARY, NodeContext, numpy_dtype
from .elementwise import (
    KERNELS,
    MINIMUM_ELEMENTS,
    OPS,
    UNARY,
    ElementwiseOp,
    default_minimum_elements,
)

__all__ = ["DOMAINS", "ElementwiseCrossover", "calibration_callbacks"]

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


def _values(rng: np.random.Generator, element_type: int, shape: tuple[int, ...],
            domain: tuple[float, float]) -> np.ndarray:
    """Seeded values of an ONNX type: both signs where the type has them, no overflow."""
    dtype = numpy_dtype(element_type)
    low, high = domain
    if element_type == TensorProto.BOOL:
        return rng.random(shape) < 0.5
    if element_type == TensorProto.STRING:
        return rng.integers(0, 10, size=shape).astype(str).astype(object)
    if dtype.kind in "iu":
        low = max(low, 0) if dtype.kind == "u" else low
        return rng.integers(int(np.floor(low * 2.5)), int(np.ceil(high * 2.5)) + 1,
                            size=shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.uniform(low, high, shape) + 1j * rng.uniform(low, high, shape)).astype(dtype)
    return rng.uniform(low, high, shape).astype(np.float32).astype(dtype)


class ElementwiseCrossover:
    """The shared search's problem for one elementwise op and element type."""

    def __init__(self, op: ElementwiseOp, element_type: int, num_threads: int) -> None:
        self.op, self.element_type = op, element_type
        self.inputs = 1 if op.arity is UNARY or op.arity.optional else max(2, op.arity.minimum)
        self.cases = ("equal",) if self.inputs == 1 else ("equal", "scalar", "broadcast")
        types = [element_type] * self.inputs
        if op.key_input:  # Where: the condition first
            types[0] = TensorProto.BOOL
        version = max(op.versions)
        ctx = NodeContext(f"calibrate_{op.op_type}", op.op_type, "", version,
                          input_types=tuple(types), num_inputs=self.inputs)
        pool = get_pool(num_threads)
        kernel_class = KERNELS[op.op_type][version]
        self._serial, self._parallel = kernel_class(ctx), kernel_class(ctx)
        self._serial.configure({MINIMUM_ELEMENTS: SERIAL}, pool)
        self._parallel.configure({MINIMUM_ELEMENTS: 1}, pool)
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


def _callback(op: ElementwiseOp) -> Callable[[KernelTuningKey, CpuExecutionDescriptor, Budget],
                                             CalibrationResult]:
    def calibrate(key: KernelTuningKey, descriptor: CpuExecutionDescriptor,
                  budget: Budget) -> CalibrationResult:
        threads = min(descriptor.num_threads, budget.max_threads)
        problem = ElementwiseCrossover(op, key.element_type, threads)
        portable = {MINIMUM_ELEMENTS: default_minimum_elements(op, key.element_type)}
        return crossover_search(key, problem, MINIMUM_ELEMENTS, portable,
                                Budget(budget.max_duration_s, budget.max_memory_bytes, threads))

    return calibrate


def calibration_callbacks() -> dict[KernelTuningKey, Callable[..., CalibrationResult]]:
    """One callback per elementwise op and element type."""
    return {
        KernelTuningKey(LIBRARY, op.op_type, "portable", element_type): _callback(op)
        for op in OPS
        for element_type in op.types
    }
