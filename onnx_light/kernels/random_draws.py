"""Random number kernels: RandomUniform, RandomNormal (and Like), Bernoulli, Multinomial.

Every run draws from numpy's legacy Mersenne Twister (``np.random.RandomState``), as
Dropout does: seeded by the node's ``seed`` attribute, so a seeded node gives the same draws
on every run (as ONNX's reference evaluator does), and by fresh entropy without one. A run
builds its own generator, so concurrent runs share no state. Draws are made in float64 and
cast to the output type. The constant folder never folds these operators
(``onnx_light.runtime.folding.NONDETERMINISTIC``). Not tunable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from ..tuning.keys import element_type_name
from .base import FLOAT_TYPES, NUMERIC_TYPES, Kernel, NodeContext, ints, numpy_dtype
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = [
    "KERNELS",
    "Bernoulli",
    "Multinomial",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
]

Arrays = Sequence[np.ndarray]
# bfloat16 from since-version 22 on
_DRAW_TYPES = {1: (T.FLOAT16, T.FLOAT, T.DOUBLE), 22: FLOAT_TYPES}


def _dtype(ctx: NodeContext, default: int | None, allowed: Sequence[int]) -> np.dtype | None:
    """The ``dtype`` attribute (``default`` when unset; None: the input's type) as a numpy
    dtype, refused unless it is one of ``allowed``."""
    element_type = ctx.attribute("dtype", default)
    if element_type is None:
        return None
    if int(element_type) not in allowed:
        raise ctx.error(
            f"dtype {element_type} is not supported; it must be one of "
            f"{[element_type_name(t) for t in allowed]}"
        )
    return numpy_dtype(int(element_type))


class _Draw(Kernel):
    """A kernel drawing from a generator seeded by ``seed`` (fresh entropy when unset)."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        seed = ctx.attribute("seed")
        # ONNX's seed is a float; numpy takes a 32-bit unsigned integer
        self.seed = None if seed is None else int(seed) % 2**32

    def generator(self) -> np.random.RandomState:
        return np.random.RandomState(self.seed)


class _Distribution(_Draw):
    """RandomUniform and RandomNormal, of the ``shape`` attribute or (Like) the input's shape,
    in ``dtype`` (float32, or the input's type for Like)."""

    like: ClassVar[bool] = False

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.dtype = _dtype(ctx, None if self.like else T.FLOAT, FLOAT_TYPES)
        given = ctx.input_types[0] if self.like and ctx.input_types else None
        if self.dtype is None and given and given not in FLOAT_TYPES:
            raise ctx.error(
                f"the input's type {element_type_name(given)} cannot hold the draws; "
                "set dtype to a floating point type"
            )
        self.shape = None if self.like else ints(ctx.attribute("shape"))
        if not self.like and self.shape is None:
            raise ctx.error("attribute 'shape' is required")
        if self.shape is not None and any(d < 0 for d in self.shape):
            raise ctx.error(f"shape must not hold negative dimensions, got {list(self.shape)}")

    def draw(self, generator: np.random.RandomState, shape: tuple[int, ...]) -> np.ndarray:
        raise NotImplementedError

    def run(self, x: np.ndarray | None = None) -> Arrays:
        shape = tuple(self.shape) if x is None else x.shape
        dtype = self.dtype or x.dtype
        if dtype not in [numpy_dtype(t) for t in FLOAT_TYPES]:
            raise self.ctx.error(
                f"cannot draw values of type {dtype} (the input's); set dtype to a floating point type"
            )
        return [self.draw(self.generator(), shape).astype(dtype)]


class _Uniform(_Distribution):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.low = float(ctx.attribute("low", 0.0))
        self.high = float(ctx.attribute("high", 1.0))
        if not self.low <= self.high:
            raise ctx.error(f"low ({self.low}) must not exceed high ({self.high})")

    def draw(self, generator: np.random.RandomState, shape: tuple[int, ...]) -> np.ndarray:
        return generator.uniform(self.low, self.high, shape)


class _Normal(_Distribution):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.mean = float(ctx.attribute("mean", 0.0))
        self.scale = float(ctx.attribute("scale", 1.0))
        if self.scale < 0:
            raise ctx.error(f"scale must not be negative, got {self.scale}")

    def draw(self, generator: np.random.RandomState, shape: tuple[int, ...]) -> np.ndarray:
        return generator.normal(self.mean, self.scale, shape)


class RandomUniform(_Uniform):
    """ONNX RandomUniform (1): values uniform in [low, high) of the ``shape`` attribute."""

    op_type = "RandomUniform"


class RandomUniformLike(_Uniform):
    """ONNX RandomUniformLike (1): RandomUniform of the input's shape."""

    op_type = "RandomUniformLike"
    like = True


class RandomNormal(_Normal):
    """ONNX RandomNormal (1): normal values of ``mean`` and ``scale`` of the ``shape``
    attribute."""

    op_type = "RandomNormal"


class RandomNormalLike(_Normal):
    """ONNX RandomNormalLike (1): RandomNormal of the input's shape."""

    op_type = "RandomNormalLike"
    like = True


class Bernoulli(_Draw):
    """ONNX Bernoulli (15): 1 with probability ``x``, else 0, in ``dtype`` (the input's type
    by default)."""

    op_type = "Bernoulli"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.dtype = _dtype(ctx, None, (*NUMERIC_TYPES, T.BOOL))

    def run(self, x: np.ndarray) -> Arrays:
        ones = self.generator().uniform(0.0, 1.0, x.shape) < x
        return [ones.astype(self.dtype or x.dtype)]


class Multinomial(_Draw):
    """ONNX Multinomial (7): ``sample_size`` class indices per row of a [batch, classes]
    tensor of unnormalized log-probabilities, in ``dtype`` (int32 by default, or int64)."""

    op_type = "Multinomial"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.dtype = _dtype(ctx, T.INT32, (T.INT32, T.INT64))
        self.sample_size = int(ctx.attribute("sample_size", 1))
        if self.sample_size < 1:
            raise ctx.error(f"sample_size must be positive, got {self.sample_size}")

    def run(self, x: np.ndarray) -> Arrays:
        if x.ndim != 2 or x.shape[1] == 0:
            raise self.ctx.error(
                f"input must have shape [batch, classes] with classes > 0, got {list(x.shape)}"
            )
        logits = x.astype(np.float64)
        weights = np.exp(logits - logits.max(axis=1, keepdims=True))
        cumulative = np.cumsum(weights, axis=1)
        draws = self.generator().uniform(0.0, 1.0, (x.shape[0], self.sample_size))
        indices = [
            np.searchsorted(row, u * row[-1], side="right") for row, u in zip(cumulative, draws, strict=True)
        ]
        samples = np.minimum(np.array(indices).reshape(draws.shape), x.shape[1] - 1)
        return [samples.astype(self.dtype)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(RandomUniform, (1, 22), types=_DRAW_TYPES),
    declare(RandomNormal, (1, 22), types=_DRAW_TYPES),
    declare(RandomUniformLike, (1, 22)),
    declare(RandomNormalLike, (1, 22)),
    declare(Bernoulli, (15, 22), types=_DRAW_TYPES),
    declare(Multinomial, (7, 22), types=_DRAW_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
