"""SqueezeExcite: a squeeze-and-excitation gate as one step, one compiled call.

Not an ONNX operator: ``runtime/se_fusion.py`` makes one of ``GlobalAveragePool(x)`` followed
by two 1x1 convolutions of constant weights on its 1x1 planes, each with its fused activation
(MobileNetV3's Relu and HardSigmoid, EfficientNet's SiLU and Sigmoid): the gate ``s`` (N, M,
1, ...) that the block's Mul (fused into the next convolution as its channel scale) reads.
Unfused, these are three steps of a few microseconds of arithmetic each and as many of Python
around it; here one compiled call (:func:`squeeze_excite`) computes the channel means
(:func:`~onnx_light.kernels.pooling.mean_rows`), then both products (:func:`gate_layer`: the
operations of :func:`~onnx_light.kernels.conv.pointwise.pointwise_vector` in its order), each
finished by its bias, clamp and compiled activation in one vectorised pass over its outputs
(where the unfused product finishes each filter's one output on its own: eleven times slower
for EfficientNet's 1152 Sigmoid gates, docs/conv.md): the same values, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import Kernel, NodeContext, Prepared, TensorSpec
from .compiled import compiled
from .compiled_activations import activate_run
from .conv.finish import FINISHED_TYPES
from .pooling import mean_rows

__all__ = ["SqueezeExcite", "SqueezeLayer", "gate_layer", "squeeze_excite"]


@dataclass(frozen=True)
class SqueezeLayer:
    """One 1x1 convolution of the gate: its weights as
    :func:`~onnx_light.kernels.conv.pointwise.vector_weights` lays them out (depth, filters),
    flat and read-only, its bias (empty for none), its clamp and its compiled activation
    ``(code, alpha, beta)`` (code -1 for none), as
    :func:`~onnx_light.kernels.conv.finish.fused_parts` gives them."""

    weights: np.ndarray
    bias: np.ndarray
    filters: int
    depth: int
    clamp: tuple[float, float]
    activation: tuple[int, float, float]


@compiled
def gate_layer(weights: np.ndarray, source: np.ndarray, out: np.ndarray, batch: int, filters: int,
               depth: int, bias: np.ndarray, low: float, high: float, activation: int, alpha: float,
               beta: float) -> None:
    """``out[n * filters + i] = f(clamp(sum_k weights[k * filters + i] source[n * depth + k] +
    bias[i]))``: the sum in the order of ``k``, a product then an addition each (the first
    product alone, so that a -0.0 stays -0.0), each step one vectorised pass over the filters,
    as :func:`~onnx_light.kernels.conv.pointwise.pointwise_vector` computes it; then the bias
    (an empty one is not added), numpy's clamp and the compiled activation ``f`` (code -1:
    none; float32) as one pass over the image's outputs."""
    count, terms = np.uintp(filters), np.uintp(depth)
    lo, hi = out.dtype.type(low), out.dtype.type(high)
    with_bias = bias.size > 0
    for n in range(np.uintp(batch)):
        o, s = n * count, n * terms
        first = source[s]
        for i in range(count):
            out[o + i] = weights[i] * first
        for k in range(np.uintp(1), terms):
            value = source[s + k]
            row = k * count
            for i in range(count):
                out[o + i] += weights[row + i] * value
        for i in range(count):
            v = out[o + i] + bias[i] if with_bias else out[o + i]
            v = lo if v < lo else v
            out[o + i] = hi if v > hi else v
        if activation >= 0:
            activate_run(out, o, count, activation, alpha, beta)


@compiled
def squeeze_excite(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, filters1: int, low1: float,
                   high1: float, code1: int, alpha1: float, beta1: float, w2: np.ndarray,
                   b2: np.ndarray, filters2: int, low2: float, high2: float, code2: int,
                   alpha2: float, beta2: float, out: np.ndarray) -> None:
    """The gate of C-contiguous ``x`` (N, C, ...) into ``out`` (N * filters2 elements, flat):
    the means of its planes (:func:`mean_rows`), then the two products (:func:`gate_layer`:
    depth C into ``filters1``, then into ``filters2``)."""
    batch, channels = x.shape[0], x.shape[1]
    rows = batch * channels
    means = np.empty(rows, out.dtype)
    mean_rows(x.reshape((rows, x.size // rows)), means)
    hidden = np.empty(batch * filters1, out.dtype)
    gate_layer(w1, means, hidden, batch, filters1, channels, b1, low1, high1, code1, alpha1, beta1)
    gate_layer(w2, hidden, out, batch, filters2, filters1, b2, low2, high2, code2, alpha2, beta2)


class SqueezeExcite(Kernel):
    """``GlobalAveragePool`` then the two convolutions ``first`` and ``second`` (see the module
    docstring): one input, X (N, C, D1, ...), of the type of the weights; one output (N, M, 1,
    ...)."""

    op_type: ClassVar[str] = "SqueezeExcite"

    def __init__(self, ctx: NodeContext, first: SqueezeLayer, second: SqueezeLayer) -> None:
        super().__init__(ctx)
        if first.filters != second.depth:
            raise ctx.error(f"the second convolution reads {second.depth} channels, the first "
                            f"makes {first.filters}")
        self.first, self.second = first, second
        self.dtype = first.weights.dtype
        one, two = first, second
        self._arguments = (one.weights, one.bias, one.filters, *one.clamp, *one.activation,
                           two.weights, two.bias, two.filters, *two.clamp, *two.activation)

    def _takes(self, shape: Sequence[int], dtype: np.dtype) -> bool:
        return len(shape) >= 3 and shape[1] == self.first.depth and dtype == self.dtype

    def _shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        return (shape[0], self.second.filters, *(1,) * (len(shape) - 2))

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        if not self._takes(x.shape, x.dtype):
            raise self.ctx.error(f"X must have shape (N, {self.first.depth}, D1, ...) and type "
                                 f"{self.dtype}, got {list(x.shape)} {x.dtype}")
        out = np.empty(self._shape(x.shape), self.dtype)
        if out.size:  # empty planes have NaN means, as GlobalAveragePool gives them
            squeeze_excite.dispatcher(np.ascontiguousarray(x), *self._arguments, out.reshape(-1))
        return (out,)

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The compiled call into the memory plan's buffer (compiled, or loaded from numba's
        cache, now) for X of a fixed shape with non-empty planes."""
        if len(inputs) != 1:
            return None
        shape, dtype = inputs[0]
        if not self._takes(shape, dtype) or math.prod(shape) == 0 or dtype not in FINISHED_TYPES:
            return None  # run reports it, or gives the empty output
        call, arguments = squeeze_excite.dispatcher, self._arguments
        for writeable in (True, False):  # a feed is read-only, another step's output is not
            x = np.zeros(shape, dtype)
            x.flags.writeable = writeable
            call(x, *arguments, np.empty(shape[0] * self.second.filters, dtype))

        def compute(x: np.ndarray, out: np.ndarray) -> None:
            call(x, *arguments, out.reshape(-1))

        return Prepared(compute, self._shape(shape), np.dtype(dtype))

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        """The elements read plus both products' multiply-adds."""
        x = input_shapes[0] if input_shapes else None
        if x is None:
            return None
        first, second = self.first, self.second
        return math.prod(x) + x[0] * (first.filters * first.depth + second.filters * second.depth)
