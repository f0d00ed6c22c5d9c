"""A tunable LpNormalization whose rows are split across the intra-op pool.

The worked example of docs/adding-a-tunable-kernel.md, executed by
tests/test_tunable_kernel_guide.py. It implements an operator the library already has
(``feature_normalization.LpNormalization``) under another implementation name, ``rows``,
so its tuning key cannot collide with a shipped one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from onnx_light.kernels.base import (
    FLOAT_TYPES,
    Kernel,
    NodeContext,
    compute_dtype,
    item_size,
    normalize_axis,
    numpy_dtype,
)
from onnx_light.kernels.declaration import KernelDeclaration, declare
from onnx_light.parallel import get_pool
from onnx_light.tuning.calibration import Budget, CalibrationResult, crossover_search
from onnx_light.tuning.keys import ElementType, KernelTuningKey
from onnx_light.tuning.processor import CpuExecutionDescriptor
from onnx_light.tuning.schema import Parameter, Value

MINIMUM_ELEMENTS = "parallel.minimum_elements"
# The portable default, in bytes of the element type: below it one thread is faster.
PORTABLE_MINIMUM_BYTES = 1 << 20
SERIAL = 1 << 62  # a threshold no input reaches: the forced-serial path


class RowsLpNormalization(Kernel):
    """ONNX LpNormalization (1, 22): X divided by its L1 or L2 norm along ``axis``, 0 where
    the norm is 0. The slices before ``axis`` are independent; from
    ``parallel.minimum_elements`` on they are split across the pool."""

    op_type: ClassVar[str] = "LpNormalization"
    implementation: ClassVar[str] = "rows"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)  # checks opset and element type, configures the portable defaults
        self.axis = int(ctx.attribute("axis", -1))
        self.p = int(ctx.attribute("p", 2))
        if self.p not in (1, 2):
            raise ctx.error(f"p must be 1 or 2, got {self.p}")

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.minimum_elements = int(values[MINIMUM_ELEMENTS])

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        outer, n = math.prod(x.shape[:axis]), x.shape[axis]
        rows = x.reshape(outer, n, math.prod(x.shape[axis + 1:]))
        y = np.empty(x.shape, x.dtype)
        out = y.reshape(rows.shape)
        compute = compute_dtype(x.dtype)

        def block(start: int, stop: int) -> None:  # the same function serves both paths
            data = rows[start:stop].astype(compute, copy=False)
            if self.p == 1:
                norm = np.sum(np.abs(data), axis=1, keepdims=True)
            else:
                norm = np.sqrt(np.sum(np.square(data), axis=1, keepdims=True))
            with np.errstate(invalid="ignore", divide="ignore"):
                out[start:stop] = np.where(norm == 0, 0, data / norm)

        if self.pool is not None and self.num_threads > 1 and x.size >= self.minimum_elements:
            self.pool.parallel_for(outer, block)
        else:
            block(0, outer)
        return [y]


def parameters(element_type: int | None) -> tuple[Parameter, ...]:
    """The schema factory: the portable threshold for ``element_type`` (None: float)."""
    size = item_size(ElementType.FLOAT if element_type is None else element_type)
    return (Parameter(MINIMUM_ELEMENTS, "int", max(1, PORTABLE_MINIMUM_BYTES // size), minimum=1,
                      description="input elements from which the rows are split across threads"),)


class RowsCrossover:
    """The shared crossover search's problem: the same kernel class, forced serial and
    forced parallel, on seeded inputs of rows of two widths."""

    cases = ("rows of 64", "rows of 1024")

    def __init__(self, declaration: KernelDeclaration, element_type: int, num_threads: int) -> None:
        ctx = NodeContext("calibrate_LpNormalization", declaration.op_type, "",
                          max(declaration.versions), input_types=(element_type,), num_inputs=1)
        pool = get_pool(num_threads)
        self.dtype = numpy_dtype(element_type)
        self._serial = declaration.kernel(ctx).bind(pool)
        self._serial.configure({MINIMUM_ELEMENTS: SERIAL})
        self._parallel = declaration.kernel(ctx).bind(pool)
        self._parallel.configure({MINIMUM_ELEMENTS: 1})

    def input_bytes(self, size: int, case: str) -> int:
        return 2 * size * self.dtype.itemsize  # the input and the output

    def make_inputs(self, size: int, case: str) -> np.ndarray:
        width = int(case.split()[-1])
        rng = np.random.default_rng([20261202, size, self.cases.index(case)])
        return rng.uniform(-4, 4, (max(1, size // width), width)).astype(self.dtype)

    def serial(self, x: np.ndarray) -> np.ndarray:
        return self._serial.run(x)[0]

    def candidate(self, x: np.ndarray) -> np.ndarray:
        return self._parallel.run(x)[0]

    def same_output(self, reference: np.ndarray, candidate: np.ndarray) -> bool:
        """Bit-exact: both paths run the same block function on the same rows."""
        return (reference.dtype == candidate.dtype and reference.shape == candidate.shape
                and reference.tobytes() == candidate.tobytes())


def calibrate(declaration: KernelDeclaration, key: KernelTuningKey,
              descriptor: CpuExecutionDescriptor, budget: Budget) -> CalibrationResult:
    """The calibration callback: the crossover search from the portable default."""
    threads = min(descriptor.num_threads, budget.max_threads)
    problem = RowsCrossover(declaration, key.element_type, threads)
    portable = dict(declaration.schema(key.element_type).defaults)
    return crossover_search(key, problem, MINIMUM_ELEMENTS, portable,
                            Budget(budget.max_duration_s, budget.max_memory_bytes, threads))


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(RowsLpNormalization, (1, 22), types=FLOAT_TYPES, parameters=parameters,
            calibrate=calibrate),
)
