"""Compiled float32 activations applied in place: the fused epilogues of Sigmoid, Swish (SiLU:
``x * sigmoid(x)``, as exporters write it, Sigmoid and Mul), HardSigmoid and HardSwish.

A fused activation runs on each block of its producer's output while the block is in cache
(``runtime/fusion.py``). numpy computes these in four to ten passes with temporaries (the
exponential, the clamps, the product); one compiled pass over the block, which LLVM
vectorizes, costs a fraction of that (docs/conv.md, "Fused epilogues").

The values:

* **HardSigmoid, HardSwish** make numpy's operations in its order, in float32 and without
  contraction (``x * alpha``, ``+ beta``, the clamps, the product with x): bitwise the
  unfused nodes' results, NaN kept.
* **Sigmoid, Swish** compute ``exp(-|x|)`` in float32 (the exponent split off by rounding
  ``x log2 e`` to an integer, ``e^r`` by a degree-7 polynomial on ``|r| <= ln 2 / 2``), then
  ``1 / (1 + e)`` or ``e / (1 + e)``: within 4 float32 units in the last place of numpy's
  result (tests measure it), NaN kept, 0 below ``-87`` (where exp's result would be
  subnormal), so ``Swish(-inf)`` is NaN as Sigmoid then Mul give it.

A block is any view whose last axis is contiguous: the kernel indexes the flat memory from
the block's first element (unsigned offsets, no views, which LLVM vectorizes; docs/conv.md)
over at most three axes left after merging the adjacent ones the layout allows. Other
blocks, and other types, take the numpy function the caller passes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .compiled import CompiledIntrinsic, compiled

__all__ = ["ACTIVATIONS", "InPlace", "activate_run", "flat_rows", "in_place", "swish_product"]

SIGMOID, SWISH, HARD_SIGMOID, HARD_SWISH = range(4)
#: The op types with a compiled in-place version, and their codes.
ACTIVATIONS = {"Sigmoid": SIGMOID, "Swish": SWISH, "HardSigmoid": HARD_SIGMOID, "HardSwish": HARD_SWISH}

_F = np.float32
_ONE, _ZERO = _F(1.0), _F(0.0)
_LOW = _F(-87.0)  # exp(-87) is the smallest normal float32's order: the gate is 0 below
_LOG2E = _F(1.4426950408889634)
_LN2_HI = _F(0.693359375)  # ln 2 = _LN2_HI + _LN2_LO, _LN2_HI with few bits: k * _LN2_HI exact
_LN2_LO = _F(-2.12194440e-4)
_ROUND = _F(12582912.0)  # 1.5 * 2^23: v + _ROUND rounds v to an integer held in the low bits
_ROUND_BITS = np.int32(0x4B400000)  # the bits of _ROUND
# e^r - 1 - r = r^2 (1/2 + r/6 + ...): Taylor's coefficients from 1/2 to 1/7!
_P = tuple(_F(c) for c in (1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2))
_SIXTH = _F(1 / 6)  # HardSwish's alpha, as elementwise_compute rounds it
_HALF = _F(0.5)


@functools.cache
def _build_select(numba: ModuleType) -> Any:
    """The intrinsic ``_select(condition, a, b)``: LLVM's ``select``, ``a`` where ``condition``
    holds, else ``b`` (two floats, in the wider of their types). A conditional expression compiles to
    branches, which LLVM may turn into a conditional store (``HardSwish``'s ``1 * x`` is the
    value loaded: ``vmaskmovps``, slow on AMD's processors); a select stays a blend."""
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def select(typingctx: Any, condition: Any, a: Any, b: Any) -> Any:
        if not (isinstance(condition, types.Boolean) and isinstance(a, types.Float)
                and isinstance(b, types.Float)):
            return None
        wider = typingctx.unify_types(a, b)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.select(args[0], context.cast(builder, args[1], a, wider),
                                  context.cast(builder, args[2], b, wider))

        return wider(condition, a, b), codegen

    return select


_select = CompiledIntrinsic(_build_select, "select")


@compiled(fastmath={"contract"}, inline="always")
def _gate(v0: float, alpha: float) -> float:
    """sigmoid(alpha * v0) in float32."""
    w = alpha * v0
    v = -abs(w)
    v = _select(v > _LOW, v, _LOW)
    big = v * _LOG2E + _ROUND
    k = big - _ROUND
    r = v - k * _LN2_HI - k * _LN2_LO
    p = _P[0]
    p = p * r + _P[1]
    p = p * r + _P[2]
    p = p * r + _P[3]
    p = p * r + _P[4]
    p = p * r + _P[5]
    e = p * r * r + r + _ONE
    scale = (np.int32(np.float32(big).view(np.int32)) - _ROUND_BITS + np.int32(127)) << np.int32(23)
    t = e * np.int32(scale).view(np.float32)
    numerator = _select(w >= _ZERO, _ONE, t)
    s = numerator / (_ONE + t)
    s = _select(w >= _LOW, s, _ZERO)
    return _select(w == w, s, w)


@compiled(inline="always")
def _hard_gate(v0: float, alpha: float, beta: float) -> float:
    """numpy's max(min(v0 * alpha + beta, 1), 0) in float32, one rounding per operation (NaN
    kept: its comparisons are false)."""
    h = v0 * alpha
    h = h + beta
    h = _select(h >= _ONE, _ONE, h)
    return _select(h <= _ZERO, _ZERO, h)


@compiled(fastmath={"contract"}, inline="always")
def swish_product(g: float, u: float, alpha: float) -> float:
    """``swish(g) * u`` in float32, the Swish rounded once before the product (the fused
    epilogue then a Mul), for a kernel that joins two products' values in its own loop (the
    caller compiles with contraction, as :func:`_sigmoid_run`, so that the gate's roundings
    are the same)."""
    s = g * _gate(g, alpha)
    return s * u


@compiled(fastmath={"contract"})
def _sigmoid_run(base: np.ndarray, start: int, n: int, alpha: float, gated: bool) -> None:
    """sigmoid(alpha x), times x when ``gated``, in place over ``base[start:start + n]``; SiLU
    (alpha 1, gated) in a loop without the product ``1 * x``, which is x. (Not Sigmoid: its
    NaN would then be stored as loaded, and LLVM would make the store a masked one.)"""
    a = np.float32(alpha)
    if gated and a == _ONE:
        _sigmoid_loop(base, start, n, _ONE, True)
    else:
        _sigmoid_loop(base, start, n, a, gated)


@compiled(fastmath={"contract"}, inline="always")
def _sigmoid_loop(base: np.ndarray, start: int, n: int, a: float, gated: bool) -> None:
    """:func:`_sigmoid_run`'s loops (``a`` a constant where the caller knows it)."""
    if gated:
        for k in range(n):
            v = base[start + k]
            base[start + k] = v * _gate(v, a)
    else:
        for k in range(n):
            base[start + k] = _gate(base[start + k], a)


@compiled
def _hard_sigmoid_run(base: np.ndarray, start: int, n: int, alpha: float, beta: float,
                      gated: bool) -> None:
    """HardSigmoid(x), times x when ``gated`` (HardSwish), in place over ``base[start:start +
    n]`` (no contraction: numpy's roundings)."""
    a, b = np.float32(alpha), np.float32(beta)
    if gated:
        for k in range(n):
            v = base[start + k]
            base[start + k] = _hard_gate(v, a, b) * v
    else:
        for k in range(n):
            base[start + k] = _hard_gate(base[start + k], a, b)


@compiled
def activate_run(base: np.ndarray, start: int, n: int, code: int, alpha: float, beta: float) -> None:
    """Activation ``code`` of :data:`ACTIVATIONS` in place over ``base[start:start + n]``."""
    if code in (SIGMOID, SWISH):
        _sigmoid_run(base, start, n, alpha, code == SWISH)
    else:
        _hard_sigmoid_run(base, start, n, alpha, beta, code == HARD_SWISH)


@compiled
def _activate_rows(base: np.ndarray, shape: tuple[int, int, int], strides: tuple[int, int],
                   code: int, alpha: float, beta: float) -> None:
    """:func:`activate_run` over the rows of the block."""
    n = np.uintp(shape[2])
    for i in range(np.uintp(shape[0])):
        for j in range(np.uintp(shape[1])):
            activate_run(base, i * np.uintp(strides[0]) + j * np.uintp(strides[1]), n, code, alpha, beta)


def flat_rows(block: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int], tuple[int, int]] | None:
    """The block as (flat memory from its first element, three axes, the first two's strides
    in elements), its last axis contiguous; None when the layout does not allow it."""
    if block.size == 0:
        return None
    item = block.itemsize
    axes = []
    for n, stride in zip(block.shape, block.strides, strict=True):
        if n != 1:
            if stride <= 0 or stride % item:
                return None
            axes.append((n, stride // item))
    merged: list[tuple[int, int]] = []
    for n, s in axes:
        if merged and merged[-1][1] == n * s:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    if not merged:
        merged = [(1, 1)]
    if merged[-1][1] != 1 or len(merged) > 3:
        return None
    merged = [(1, 0)] * (3 - len(merged)) + merged
    span = sum((n - 1) * s for n, s in merged) + 1
    base = as_strided(block, shape=(span,), strides=(item,))
    return base, (merged[0][0], merged[1][0], merged[2][0]), (merged[0][1], merged[1][1])


@dataclass(frozen=True)
class InPlace:
    """A compiled in-place activation (:func:`in_place`): ``code`` (of :data:`ACTIVATIONS`),
    its ``alpha`` and ``beta``, so that a kernel may apply it inside its own compiled loop
    (:func:`activate_run`) instead of calling it on a finished block."""

    code: int
    alpha: float
    beta: float
    fallback: Callable[[np.ndarray], None]

    def __call__(self, block: np.ndarray) -> None:
        rows = flat_rows(block) if block.dtype == np.float32 else None
        if rows is None:
            self.fallback(block)
        else:
            _activate_rows.dispatcher(*rows, self.code, self.alpha, self.beta)


def in_place(op_type: str, attributes: Mapping[str, float],
             fallback: Callable[[np.ndarray], None]) -> InPlace | None:
    """``f(block)`` overwriting a float32 block with ``op_type``'s activation (of
    :data:`ACTIVATIONS`; ``attributes`` its alpha and beta), compiled here (at session
    construction, not in a run); ``fallback`` computes blocks of other layouts. None for
    other op types."""
    code = ACTIVATIONS.get(op_type)
    if code is None:
        return None
    if code in (SIGMOID, SWISH):
        alpha = float(attributes.get("alpha", 1.0)) if code == SWISH else 1.0
        beta = 0.0
    else:
        alpha, beta = ((float(attributes.get("alpha", 0.2)), float(attributes.get("beta", 0.5)))
                       if code == HARD_SIGMOID else (float(_SIXTH), float(_HALF)))
    apply = InPlace(code, alpha, beta, fallback)
    apply(np.zeros(1, np.float32))  # compile (or load from numba's cache) now
    return apply
