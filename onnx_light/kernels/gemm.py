"""Gemm and MatMul: a multi-parameter schema over BLAS, serial or split across the pool."""

from __future__ import annotations

from ..tuning.keys import KernelTuningKey
from ..tuning.schema import KernelTuningSchema, Parameter
from .base import FLOAT_TYPES, LIBRARY

__all__ = ["GEMM_TYPES", "tuning_schemas"]

GEMM_TYPES: dict[str, tuple[int, ...]] = {"Gemm": FLOAT_TYPES, "MatMul": FLOAT_TYPES}
MODES = ("blas", "split_rows", "split_columns")


def gemm_parameters() -> tuple[Parameter, ...]:
    """The parameters of every Gemm and MatMul schema."""
    return (
        Parameter("parallel.minimum_flops", "int", 1 << 22, minimum=1,
                  description="multiply-adds (M*N*K) from which more than one thread is used"),
        Parameter("parallel.mode", "str", "blas", choices=MODES,
                  description="above the threshold: BLAS threads itself, or split rows or "
                              "columns of the output across the pool with serial BLAS per block"),
        Parameter("split.minimum_rows", "int", 1, minimum=1,
                  description="smallest block of output rows or columns when splitting"),
    )


def tuning_schemas() -> list[KernelTuningSchema]:
    """One schema per op and floating element type."""
    return [
        KernelTuningSchema(KernelTuningKey(LIBRARY, op, "portable", element_type),
                           gemm_parameters())
        for op, types in GEMM_TYPES.items()
        for element_type in types
    ]
