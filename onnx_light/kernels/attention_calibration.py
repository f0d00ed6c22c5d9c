"""Softmax's calibration: the compiled rows' crossover, then the fused attention's.

Softmax's schema holds two thresholds: ``parallel.minimum_elements`` (from which a Softmax
node's rows are split over the threads) and ``attention.minimum_flops`` (from which the
attention step the runtime fuses around a Softmax runs as compiled tasks, over the threads
in one region, :mod:`.fused_attention`). :func:`calibrate_softmax` searches both with the shared crossover
search, one after the other within the key's budget, and returns one result for the key.
The heads' problem (:class:`AttentionHeadsCrossover`) times the fused step itself, its BLAS
products on one thread against its compiled tasks over the threads in one region, on
self-attention shapes of encoders; its sizes are the multiply-adds of the
two products, the threshold's unit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..parallel import get_pool
from ..tuning.calibration import Budget, CalibrationResult, crossover_search
from ..tuning.keys import ElementType, KernelTuningKey
from ..tuning.processor import CpuExecutionDescriptor
from .base import NodeContext
from .calibration import SEED, SERIAL, RowsCrossover, calibration_setup, without_compilation
from .declaration import KernelDeclaration
from .fused_attention import FusedAttention

__all__ = ["ATTENTION_SIZES", "AttentionHeadsCrossover", "calibrate_softmax"]

#: Multiply-adds of the two products measured: 2^20 (two heads of 64 tokens, head size 64)
#: to 2^27 (256 such heads).
ATTENTION_SIZES = tuple(1 << e for e in range(20, 28))


class AttentionHeadsCrossover:
    """The shared search's problem for the fused attention's compiled tasks: ``heads`` of
    ``tokens`` queries and keys with head size ``width`` (as many heads as the size allows, at
    least two), a key-padding mask broadcast over heads and queries as encoders give it; the
    threshold is ``parameter`` of the Softmax schema."""

    SHAPES = {"64 tokens, head size 64": (64, 64), "128 tokens, head size 32": (128, 32)}

    def __init__(self, declaration: KernelDeclaration, num_threads: int, parameter: str) -> None:
        self.cases = tuple(self.SHAPES)
        pool = get_pool(num_threads)
        self._serial = self._step(declaration, pool, {parameter: SERIAL})
        self._split = self._step(declaration, pool, {parameter: 1})

    @staticmethod
    def _step(declaration: KernelDeclaration, pool: Any, values: dict[str, Any]) -> FusedAttention:
        ctx = NodeContext("calibrate_attention_softmax", declaration.op_type, "", max(declaration.versions),
                          attributes={"axis": -1}, input_types=(ElementType.FLOAT,),
                          output_types=(ElementType.FLOAT,), num_inputs=1)
        softmax = declaration.kernel(ctx).bind(pool)
        step_ctx = dataclasses.replace(ctx, name="calibrate_attention", op_type=FusedAttention.op_type,
                                       num_inputs=4, input_types=(ElementType.FLOAT,) * 4)
        step = FusedAttention(step_ctx, softmax, 0.125, (None, None, None), (0, 1, 2, 3), (), {})
        step.bind(pool).configure(values)
        return step

    def _heads(self, size: int, case: str) -> tuple[int, int, int]:
        tokens, width = self.SHAPES[case]
        return max(2, size // (tokens * tokens * 2 * width)), tokens, width

    def input_bytes(self, size: int, case: str) -> int:
        heads, tokens, width = self._heads(size, case)
        return 4 * heads * tokens * (4 * width + tokens)  # Q, K^T, V, the output and the scores

    def make_inputs(self, size: int, case: str) -> list[np.ndarray]:
        heads, tokens, width = self._heads(size, case)
        rng = np.random.default_rng([SEED, size, self.cases.index(case)])
        q, k_t, v = (rng.standard_normal(shape, dtype=np.float32)
                     for shape in ((heads, tokens, width), (heads, width, tokens), (heads, tokens, width)))
        mask = np.where(np.arange(tokens) < tokens - tokens // 8, 0.0, -10000.0).astype(np.float32)
        return [q, k_t, v, mask.reshape(1, 1, tokens)]

    def serial(self, inputs: list[np.ndarray]) -> np.ndarray:
        return self._serial.run(*inputs)[0]

    def candidate(self, inputs: list[np.ndarray]) -> np.ndarray:
        return self._split.run(*inputs)[0]

    def same_output(self, reference: Any, candidate: Any) -> bool:
        """Within the bound of products summed in two orders (BLAS's below the threshold, the
        packed micro-kernel's from it on: :mod:`.compiled_attention`), 2e-5 relative plus
        2e-6 absolute as tests/test_attention_fusion.py checks against the unfused graph."""
        return (reference.dtype == candidate.dtype and reference.shape == candidate.shape
                and bool(np.allclose(reference, candidate, rtol=2e-5, atol=2e-6)))


def calibrate_softmax(rows_parameter: str, heads_parameter: str) -> Any:
    """The calibration callback of Softmax's keys: the rows' crossover (``rows_parameter``, on
    half the duration budget) then the fused attention's (``heads_parameter``, on what is
    left); float32 only for the second, the one type the fused step takes."""

    def calibrate(declaration: KernelDeclaration, key: KernelTuningKey,
                  descriptor: CpuExecutionDescriptor, budget: Budget) -> CalibrationResult:
        setup = calibration_setup(declaration, key, descriptor, budget)
        half = dataclasses.replace(setup.budget, max_duration_s=setup.budget.max_duration_s / 2)
        rows_problem = RowsCrossover(declaration, key.element_type, setup.threads, rows_parameter)
        rows = without_compilation(crossover_search, key, rows_problem, rows_parameter, setup.portable, half)
        if key.element_type != ElementType.FLOAT or setup.threads < 2:
            return rows
        left = dataclasses.replace(setup.budget,
                                   max_duration_s=max(setup.budget.max_duration_s - rows.duration_s, 1e-3))
        heads = without_compilation(
            crossover_search, key, AttentionHeadsCrossover(declaration, setup.threads, heads_parameter),
            heads_parameter, setup.portable, left, sizes=ATTENTION_SIZES)
        return _joined(rows, heads, heads_parameter)

    return calibrate


def _joined(rows: CalibrationResult, heads: CalibrationResult, heads_parameter: str) -> CalibrationResult:
    """One result for the key: the rows' values with the heads' threshold, every measurement
    and diagnostic of both; ``crossover`` stays the rows' (the schema's first value)."""
    values = {**rows.values, heads_parameter: heads.values[heads_parameter]}
    return dataclasses.replace(
        rows, values=values, portable_kept=rows.portable_kept and heads.portable_kept,
        measurements=[*rows.measurements, *heads.measurements],
        diagnostics=[*rows.diagnostics, *heads.diagnostics],
        duration_s=rows.duration_s + heads.duration_s, setup_s=rows.setup_s + heads.setup_s)
