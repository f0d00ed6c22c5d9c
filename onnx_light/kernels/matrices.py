"""Matrix kernels without tuning: EyeLike, Einsum, Det.

Einsum is numpy's ``einsum``, whose equation language is ONNX's (explicit ``->`` output,
implicit output in alphabetical order, ``...`` for broadcast axes), with its contraction
order optimised; half-precision types compute in float32. Det is LAPACK's LU determinant
through ``numpy.linalg.det``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import FLOAT_TYPES, INTEGER_TYPES, NUMERIC_TYPES, Kernel, NodeContext, compute_dtype, numpy_dtype
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "Det", "Einsum", "EyeLike"]

Arrays = list[np.ndarray]
_EYE_TYPES = (*NUMERIC_TYPES, T.BOOL)
_EINSUM_TYPES = {12: (*INTEGER_TYPES, T.FLOAT16, T.FLOAT, T.DOUBLE), 28: NUMERIC_TYPES}


class EyeLike(Kernel):
    """ONNX EyeLike (9, 22): ones on the ``k``-th diagonal of a matrix shaped like the input,
    of the type ``dtype`` (the input's by default)."""

    op_type: ClassVar[str] = "EyeLike"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.k = int(ctx.attribute("k", 0))
        dtype = ctx.attribute("dtype")
        if dtype is not None and dtype not in _EYE_TYPES:
            raise ctx.error(f"dtype must be a numeric or bool element type, got {dtype}")
        self.dtype = None if dtype is None else numpy_dtype(dtype)

    def run(self, x: np.ndarray) -> Arrays:
        if x.ndim != 2:
            raise self.ctx.error(f"input must be 2-D, got shape {list(x.shape)}")
        return [np.eye(*x.shape, k=self.k, dtype=self.dtype or x.dtype)]


class Einsum(Kernel):
    """ONNX Einsum (12, 28): a sum of products over the axes ``equation`` names."""

    op_type: ClassVar[str] = "Einsum"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        equation = ctx.attribute("equation")
        if equation is None:
            raise ctx.error("attribute 'equation' is required")
        self.equation = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(" ", "")
        terms = self.equation.split("->")[0].split(",")
        if ctx.num_inputs and len(terms) != ctx.num_inputs:
            raise ctx.error(f"equation {self.equation!r} has {len(terms)} operands, the node has "
                            f"{ctx.num_inputs} inputs")

    def run(self, *inputs: np.ndarray) -> Arrays:
        dtype = inputs[0].dtype
        operands = [x.astype(compute_dtype(x.dtype), copy=False) for x in inputs]
        try:
            result = np.einsum(self.equation, *operands, optimize=len(operands) > 2)
        except ValueError as error:
            shapes = [list(x.shape) for x in inputs]
            raise self.ctx.error(f"equation {self.equation!r} does not fit shapes {shapes}: "
                                 f"{error}") from None
        return [np.asarray(result).astype(dtype, copy=False)]


class Det(Kernel):
    """ONNX Det (11, 22): the determinant of each square matrix of the last two axes."""

    op_type: ClassVar[str] = "Det"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)

    def run(self, x: np.ndarray) -> Arrays:
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise self.ctx.error(f"input must be square matrices (..., M, M), got shape {list(x.shape)}")
        data = x.astype(compute_dtype(x.dtype), copy=False)
        return [np.asarray(np.linalg.det(data)).astype(x.dtype)]


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(Det, (11, 22), types=FLOAT_TYPES),
    declare(Einsum, (12, 28), types=_EINSUM_TYPES),
    declare(EyeLike, (9, 22), types=_EYE_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
