"""Normalization kernels: BatchNormalization, InstanceNormalization, LayerNormalization.

BatchNormalization in inference mode folds its four per-channel inputs into one scale and one
shift, ``a = scale / sqrt(var + epsilon)`` and ``b = B - mean * a`` (C values, computed in the
compute type), then computes ``Y = X * a + b`` in two whole passes, one numpy call each on the
(image, channel) planes viewed as rows (cache-sized chunks measured slower: their call
overhead outweighed the reuse). Inputs of :data:`PARALLEL_MINIMUM` elements or more split
their planes across the pool, each block making the same calls as the serial path; below it
two threads were no faster on this memory-bound pass (measured at 400K elements: 0.7-1.1x).
:class:`ChannelAffine`, what the runtime's fusion makes of affine chains, shares the code.

float16 and bfloat16 compute in float32 and round once; float64 in float64; float32 in
float32. Statistics (training-mode BatchNormalization, InstanceNormalization, numpy's
LayerNormalization) are accumulated in float64 for float32 inputs too, then used in the
compute type. None of these kernels is tunable.

LayerNormalization of float32 data with the default float32 stash runs a compiled pass per
row (:func:`layer_norm_rows`: the mean, then the variance of the centred row, then the
output, in float32, twice the lanes of float64, within the bound docs/elementwise.md states
and tests/float32_bounds.py checks), over numba's threads from
:data:`LAYER_NORM_PARALLEL_MINIMUM` elements on when the session has more than one thread;
other types and layouts take the numpy path. float32 InstanceNormalization runs a pass per
(image, channel) plane (:func:`instance_norm_rows`, the channel's scale and bias) with its
statistics in float64, rounded once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext, Prepared, TensorSpec, compute_dtype, numpy_dtype
from .compiled import compiled, prange, read_only
from .compiled_elementwise import numba_threads
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "LAYER_NORM_PARALLEL_MINIMUM", "PARALLEL_MINIMUM", "BatchNormalization",
           "ChannelAffine", "InstanceNormalization", "LayerNormalization", "batch_norm_affine",
           "instance_norm_rows", "layer_norm_range", "layer_norm_rows"]

PARALLEL_MINIMUM = 1 << 20
# Elements of X from which the compiled LayerNormalization (and InstanceNormalization) splits
# its rows over the threads: a numba region costs 75-100 us on a KVM machine whose idle vCPU
# halts at once, more than this memory-bound pass takes below about 2^20 elements
# (docs/elementwise.md, "Compiled kernels" and "Two threads").
LAYER_NORM_PARALLEL_MINIMUM = 1 << 20

_FLOATS = (T.FLOAT16, T.FLOAT, T.DOUBLE)
_FLOATS_BF16 = (*_FLOATS, T.BFLOAT16)


def _per_channel(value: np.ndarray, ndim: int, compute: np.dtype) -> np.ndarray:
    """A (C,) parameter shaped (1, C, 1, ...); a (C, D1, ...) one (spatial=0) shaped (1, C, D1, ...)."""
    value = value.astype(compute, copy=False)
    if value.ndim == 1:
        return value.reshape((1, -1) + (1,) * (ndim - 2))
    return value.reshape((1, *value.shape))


def batch_norm_affine(scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray,
                      epsilon: float, compute: np.dtype | type) -> tuple[np.ndarray, np.ndarray]:
    """Inference BatchNormalization as ``Y = X * a + b``: ``a = scale / sqrt(var + epsilon)``
    and ``b = B - mean * a``, computed in ``compute``."""
    compute = np.dtype(compute)
    a = scale.astype(compute) / np.sqrt(var.astype(compute) + compute.type(epsilon))
    return a, bias.astype(compute) - mean.astype(compute) * a


def _affine(kernel: Kernel, x: np.ndarray, a: np.ndarray, b: np.ndarray, compute: np.dtype,
            add: bool = True) -> np.ndarray:
    """``x * a + b`` (then the kernel's epilogue) with a, b broadcasting over (N, C, ...):
    three whole passes (a multiply, an add unless not ``add``, the epilogue), each one numpy
    call per block of (image, channel) planes; large inputs split their planes across the
    pool."""
    out = np.empty(x.shape, compute)
    epilogue = kernel.epilogue
    if x.ndim < 2 or out.size == 0 or a.size != x.shape[1] or b.size != x.shape[1]:
        np.multiply(x, a, out=out, casting="unsafe")  # per activation (spatial=0) or 1-D
        if add:
            out += b
        if epilogue is not None:
            epilogue(out)
        return out
    n, c = x.shape[:2]
    planes = n * c
    x2, out2 = x.reshape(planes, -1), out.reshape(planes, -1)
    a2 = np.broadcast_to(a.reshape(1, c), (n, c)).reshape(planes, 1)
    b2 = np.broadcast_to(b.reshape(1, c), (n, c)).reshape(planes, 1)

    def block(start: int, stop: int) -> None:
        target = out2[start:stop]
        np.multiply(x2[start:stop], a2[start:stop], out=target, casting="unsafe")
        if add:
            np.add(target, b2[start:stop], out=target)
        if epilogue is not None:
            epilogue(target)

    pool = kernel.pool
    if pool is not None and pool.num_threads > 1 and planes > 1 and out.size >= PARALLEL_MINIMUM:
        pool.parallel_for(planes, block)
    else:
        block(0, planes)
    return out


class BatchNormalization(Kernel):
    """ONNX BatchNormalization (1, 6, 7, 9, 14, 15).

    Inference mode everywhere: the ``spatial`` attribute of versions 1 to 7 (0: parameters
    per activation, shaped like X without N) and ``consumed_inputs``/``is_test`` of versions
    1 and 6 are accepted. From version 14, ``training_mode=1`` normalizes with the batch's
    statistics and also returns the running mean and variance updated with ``momentum``.
    Training-mode outputs of earlier versions are not supported.
    """

    op_type: ClassVar[str] = "BatchNormalization"
    accepts_epilogue: ClassVar[bool] = True

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.epsilon = float(np.float32(ctx.attribute("epsilon", 1e-5)))
        self.momentum = float(np.float32(ctx.attribute("momentum", 0.9)))
        self.training = ctx.opset >= 14 and bool(ctx.attribute("training_mode", 0))
        if ctx.opset < 14 and ctx.num_outputs > 1:
            legacy_test = ctx.opset < 7 and bool(ctx.attribute("is_test", 0))
            if not legacy_test:
                raise ctx.error("training-mode outputs (mean, var, saved_mean, saved_var) are "
                                f"supported from opset 14 only, the model uses opset {ctx.opset}")
        if ctx.num_inputs and ctx.num_inputs != 5:
            raise ctx.error(f"expects 5 inputs (X, scale, B, mean, var), the node has {ctx.num_inputs}")

    def views(self) -> Sequence[Sequence[int]]:
        # Legacy is_test graphs list the statistics (inputs mean and var) as outputs.
        return () if self.training else ((), (3,), (4,), (3,), (4,))

    def run(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray,
            var: np.ndarray) -> Sequence[np.ndarray]:
        if x.ndim < 2:
            raise self.ctx.error(f"X must have shape (N, C, ...), got {list(x.shape)}")
        compute = compute_dtype(x.dtype)
        if self.training:
            return self._train(x, scale, bias, mean, var, compute)
        channels = x.shape[1]
        for name, value in (("scale", scale), ("B", bias), ("mean", mean), ("var", var)):
            if value.shape[:1] != (channels,):
                raise self.ctx.error(f"{name} must have {channels} values (one per channel), "
                                     f"got shape {list(value.shape)}")
        a, b = batch_norm_affine(scale, bias, mean, var, self.epsilon, compute)
        a, b = _per_channel(a, x.ndim, compute), _per_channel(b, x.ndim, compute)
        y = _affine(self, x, a, b, compute)
        outputs = [y if y.dtype == x.dtype else y.astype(x.dtype)]
        if self.ctx.num_outputs > 1:  # is_test legacy graphs list the statistics as outputs
            outputs += [mean, var, mean, var][:self.ctx.num_outputs - 1]
        return outputs

    def _train(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray,
               var: np.ndarray, compute: np.dtype) -> Sequence[np.ndarray]:
        axes = (0, *range(2, x.ndim))
        batch_mean = np.mean(x, axis=axes, dtype=np.float64)
        batch_var = np.var(x, axis=axes, dtype=np.float64)
        a = _per_channel(scale.astype(np.float64) / np.sqrt(batch_var + self.epsilon), x.ndim, compute)
        b = _per_channel(bias.astype(np.float64) - batch_mean * scale.astype(np.float64)
                         / np.sqrt(batch_var + self.epsilon), x.ndim, compute)
        y = _affine(self, x, a, b, compute).astype(x.dtype, copy=False)
        momentum = self.momentum
        running_mean = (mean.astype(np.float64) * momentum + batch_mean * (1 - momentum)).astype(mean.dtype)
        running_var = (var.astype(np.float64) * momentum + batch_var * (1 - momentum)).astype(var.dtype)
        return [y, running_mean, running_var][:max(1, self.ctx.num_outputs)]


class ChannelAffine(Kernel):
    """``Y = X * multiplier + offset`` per channel (axis 1): not an ONNX operator, but what the
    runtime makes of a chain of inference BatchNormalization and per-channel Mul, Add and Sub
    nodes with constant parameters when no convolution precedes them to absorb it
    (``runtime/fusion.py``). ``multiplier`` and ``offset`` have shape () or (C,).
    """

    op_type: ClassVar[str] = "ChannelAffine"
    accepts_epilogue: ClassVar[bool] = True

    def __init__(self, ctx: NodeContext, multiplier: np.ndarray, offset: np.ndarray) -> None:
        super().__init__(ctx)
        self.multiplier = np.asarray(multiplier, np.float64).reshape(-1)
        self.offset = np.asarray(offset, np.float64).reshape(-1)

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        compute = compute_dtype(x.dtype)
        channels = x.shape[1] if x.ndim >= 2 else 0
        for name, value in (("multiplier", self.multiplier), ("offset", self.offset)):
            if value.size not in (1, channels):
                raise self.ctx.error(f"{name} has {value.size} values, X has {channels} channels "
                                     f"(shape {list(x.shape)})")
        ndim = max(x.ndim, 2)
        a = _per_channel(self.multiplier, ndim, compute)
        b = _per_channel(self.offset, ndim, compute)
        y = _affine(self, x, a, b, compute, add=not self.adds_nothing)
        return (y if y.dtype == x.dtype else y.astype(x.dtype),)

    @property
    def adds_nothing(self) -> bool:
        """Whether every offset is -0.0 (a Mul's), which adding leaves any value as it is."""
        return bool(np.all((self.offset == 0) & np.signbit(self.offset)))

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The serial per-channel pass of :meth:`run` (a multiply, an add, the epilogue) with
        the parameters shaped once, for an X computed in its own type; None otherwise. The
        add is left out where it adds nothing (:attr:`adds_nothing`)."""
        ((shape, dtype),) = inputs
        size = math.prod(shape)
        if (len(shape) < 2 or size == 0 or compute_dtype(dtype) != dtype
                or not {self.multiplier.size, self.offset.size} <= {1, shape[1]}
                or (self.num_threads > 1 and shape[0] * shape[1] > 1 and size >= PARALLEL_MINIMUM)):
            return None
        a = _per_channel(self.multiplier, len(shape), dtype)
        b = _per_channel(self.offset, len(shape), dtype)
        epilogue, multiply, add = self.epilogue, np.multiply, np.add
        if not np.all(a == 1) and self.adds_nothing:
            def affine(x: np.ndarray, out: np.ndarray) -> None:
                multiply(x, a, out=out)
                if epilogue is not None:
                    epilogue(out)
        elif not np.all(a == 1):
            def affine(x: np.ndarray, out: np.ndarray) -> None:
                multiply(x, a, out=out)
                add(out, b, out=out)
                if epilogue is not None:
                    epilogue(out)
        elif epilogue is None:  # x * 1 is x, bit for bit: a fused Add needs no multiply
            def affine(x: np.ndarray, out: np.ndarray) -> None:
                add(x, b, out=out)
        else:
            def affine(x: np.ndarray, out: np.ndarray) -> None:
                add(x, b, out=out)
                epilogue(out)

        return Prepared(affine, shape, dtype)


class InstanceNormalization(Kernel):
    """ONNX InstanceNormalization (1, 6, 22): per (image, channel) over the spatial axes."""

    op_type: ClassVar[str] = "InstanceNormalization"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.epsilon = float(np.float32(ctx.attribute("epsilon", 1e-5)))

    def run(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> Sequence[np.ndarray]:
        if x.ndim < 3:
            raise self.ctx.error(f"X must have shape (N, C, D1, ...), got {list(x.shape)}")
        if (x.dtype == scale.dtype == bias.dtype == np.float32 and x.size
                and scale.size == bias.size == x.shape[1]):
            return (self._compiled(x, scale.reshape(-1), bias.reshape(-1)),)
        compute = compute_dtype(x.dtype)
        axes = tuple(range(2, x.ndim))
        mean = np.mean(x, axis=axes, dtype=np.float64, keepdims=True)
        var = np.var(x, axis=axes, dtype=np.float64, keepdims=True)
        gamma = scale.astype(np.float64).reshape((1, -1) + (1,) * len(axes))
        a = gamma / np.sqrt(var + self.epsilon)
        b = bias.astype(np.float64).reshape(gamma.shape) - mean * a
        y = x.astype(compute) * a.astype(compute) + b.astype(compute)
        return (y.astype(x.dtype, copy=False),)

    def _compiled(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
        """float32 planes by :func:`instance_norm_rows`, over numba's threads from
        :data:`LAYER_NORM_PARALLEL_MINIMUM` elements on."""
        planes = read_only(np.ascontiguousarray(x).reshape(x.shape[0] * x.shape[1], -1))
        scale, bias = read_only(scale), read_only(bias)
        out = np.empty(planes.shape, np.float32)
        if (self.num_threads > 1 and x.size >= LAYER_NORM_PARALLEL_MINIMUM and planes.shape[0] > 1
                and numba_threads(self.num_threads)):
            _instance_norm_rows_parallel.dispatcher(planes, scale, bias, self.epsilon, out)
        else:
            instance_norm_rows.dispatcher(planes, scale, bias, self.epsilon, out)
        return out.reshape(x.shape)

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile the compiled pass now, at session construction, for a float32 node."""
        if self.ctx.input_types[:1] == (T.FLOAT,):
            one = read_only(np.ones(1, np.float32))
            x = np.zeros((1, 1, 2), np.float32)
            self._compiled(x, one, one)
            if self.num_threads > 1 and numba_threads(self.num_threads):
                _instance_norm_rows_parallel.dispatcher(read_only(x[0]), one, one, 1e-5, x[0].copy())
        return None


@compiled(fastmath={"contract", "reassoc"})
def _row_sum(x: np.ndarray, row: int) -> float:
    """The float64 sum of ``x[row]``, in the order LLVM's vectorized loop adds it (the same
    order for every row and thread: reassociation only, no NaN, infinity or zero flag)."""
    values = x[row]
    total = 0.0
    for j in range(values.shape[0]):
        total += np.float64(values[j])
    return total


@compiled(fastmath={"contract", "reassoc"})
def _row_squares(x: np.ndarray, row: int, mu: float) -> float:
    """The float64 sum of ``(x[row] - mu)^2``, vectorized as :func:`_row_sum`."""
    values = x[row]
    total = 0.0
    for j in range(values.shape[0]):
        d = np.float64(values[j]) - mu
        total += d * d
    return total


@compiled(fastmath={"contract"})
def _row_moments(x: np.ndarray, row: int, epsilon: float) -> tuple[float, float]:
    """The mean of ``x[row]`` and 1/sqrt(variance + epsilon), the variance of the centred
    row, both summed in float64."""
    n = x.shape[1]
    mu = _row_sum(x, row) / n
    return mu, 1.0 / np.sqrt(_row_squares(x, row, mu) / n + epsilon)


@compiled(fastmath={"contract", "reassoc"})
def _sum32(values: np.ndarray) -> np.float32:
    """The float32 sum of ``values``, in the order LLVM's vectorized loop adds it (partial
    sums per lane, the same order for every row and thread: reassociation only)."""
    total = np.float32(0.0)
    for j in range(values.shape[0]):
        total += values[j]
    return total


@compiled(fastmath={"contract", "reassoc"})
def _squares32(values: np.ndarray, mu: np.float32) -> np.float32:
    """The float32 sum of ``(values - mu)^2``, vectorized as :func:`_sum32`."""
    total = np.float32(0.0)
    for j in range(values.shape[0]):
        d = values[j] - mu
        total += d * d
    return total


@compiled(fastmath={"contract"})
def layer_norm_range(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, with_bias: bool,
                      epsilon: float, out: np.ndarray, mean: np.ndarray, inverse: np.ndarray,
                      start: int, stop: int) -> None:
    """Rows ``start`` to ``stop`` in float32, each: the mean, the variance of the centred row
    (1/sqrt(variance + epsilon) in float64, rounded once), then the output (docs/elementwise.md
    states the bound). The row loop is here, not in a function called per row: a call per
    96-value row cost as much as the row."""
    for row in range(start, stop):
        values, target = x[row], out[row]
        n = values.shape[0]
        mu = _sum32(values) / np.float32(n)
        inv = np.float32(1.0 / np.sqrt(np.float64(_squares32(values, mu)) / n + epsilon))
        mean[row] = mu
        inverse[row] = inv
        if with_bias:
            for j in range(n):
                target[j] = (values[j] - mu) * inv * scale[j] + bias[j]
        else:
            for j in range(n):
                target[j] = (values[j] - mu) * inv * scale[j]


@compiled(fastmath={"contract"})
def _instance_norm_row(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, epsilon: float,
                       out: np.ndarray, row: int) -> None:
    channel = row % scale.shape[0]
    mu, inv = _row_moments(x, row, epsilon)
    a = inv * np.float64(scale[channel])
    b = np.float64(bias[channel])
    values, target = x[row], out[row]
    for j in range(values.shape[0]):
        target[j] = (values[j] - mu) * a + b


@compiled
def instance_norm_rows(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, epsilon: float,
                       out: np.ndarray) -> None:
    """InstanceNormalization of the float32 (image, channel) planes, the rows of ``x``, into
    ``out``: channel ``row % C`` scales and shifts row ``row``; in float64, rounded once."""
    for row in range(x.shape[0]):
        _instance_norm_row(x, scale, bias, epsilon, out, row)


@compiled(parallel=True)
def _instance_norm_rows_parallel(x: np.ndarray, scale: np.ndarray, bias: np.ndarray,
                                 epsilon: float, out: np.ndarray) -> None:
    for row in prange(x.shape[0]):
        _instance_norm_row(x, scale, bias, epsilon, out, row)


@compiled
def layer_norm_rows(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, with_bias: bool,
                    epsilon: float, out: np.ndarray, mean: np.ndarray, inverse: np.ndarray) -> None:
    """LayerNormalization of each row of the float32 matrix ``x`` into ``out`` (``bias``
    added when ``with_bias``), with each row's mean and 1/sqrt(variance + epsilon), in
    float32 (:func:`layer_norm_range`)."""
    layer_norm_range(x, scale, bias, with_bias, epsilon, out, mean, inverse, 0, x.shape[0])


@compiled(parallel=True)
def _layer_norm_rows_parallel(x: np.ndarray, scale: np.ndarray, bias: np.ndarray,
                              with_bias: bool, epsilon: float, out: np.ndarray, mean: np.ndarray,
                              inverse: np.ndarray, threads: int) -> None:
    """:func:`layer_norm_rows` with the rows split in ``threads`` ranges run by numba's
    threads (the caller has set their count): the same values, whichever thread computes them."""
    rows = x.shape[0]
    for t in prange(threads):
        layer_norm_range(x, scale, bias, with_bias, epsilon, out, mean, inverse,
                          t * rows // threads, (t + 1) * rows // threads)


_NO_BIAS = read_only(np.zeros(1, np.float32))


class LayerNormalization(Kernel):
    """ONNX LayerNormalization (17): over the axes from ``axis`` on; optional Mean and
    InvStdDev outputs in the ``stash_type`` precision (float32 by default)."""

    op_type: ClassVar[str] = "LayerNormalization"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = int(ctx.attribute("axis", -1))
        self.epsilon = float(np.float32(ctx.attribute("epsilon", 1e-5)))
        stash = int(ctx.attribute("stash_type", T.FLOAT))
        if stash not in (T.FLOAT, T.DOUBLE, T.FLOAT16, T.BFLOAT16):
            raise ctx.error(f"stash_type must be a floating point type, got {stash}")
        self.stash = numpy_dtype(stash)

    def run(self, x: np.ndarray, scale: np.ndarray,
            bias: np.ndarray | None = None) -> Sequence[np.ndarray]:
        if not -x.ndim <= self.axis < x.ndim:
            raise self.ctx.error(f"axis {self.axis} is out of range for rank {x.ndim}")
        axis = self.axis % x.ndim
        if x.dtype == np.float32 and self.stash == np.float32 and x.size:
            outputs = self._compiled(x, scale, bias, axis)
            if outputs is not None:
                return outputs[:max(1, self.ctx.num_outputs)]
        axes = tuple(range(axis, x.ndim))
        stash = self.stash if self.stash in (np.float32, np.float64) else np.dtype(np.float32)
        data = x.astype(stash, copy=False)
        mean = np.mean(data, axis=axes, keepdims=True)
        centered = data - mean
        variance = np.mean(np.square(centered), axis=axes, keepdims=True)
        inverse = (1 / np.sqrt(variance + stash.type(self.epsilon))).astype(stash, copy=False)
        y = centered * inverse * scale.astype(stash, copy=False)
        if bias is not None:
            y = y + bias.astype(stash, copy=False)
        outputs = [y.astype(x.dtype, copy=False), mean.astype(self.stash, copy=False),
                   inverse.astype(self.stash, copy=False)]
        return outputs[:max(1, self.ctx.num_outputs)]

    def _compiled(self, x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None,
                  axis: int) -> list[np.ndarray] | None:
        """The three outputs from :func:`layer_norm_rows`, or None when scale or bias are not
        float32 or do not broadcast to the normalized shape (the numpy path then decides)."""
        normalized = x.shape[axis:]
        given = [p for p in (scale, bias) if p is not None]
        if all(p.shape == normalized and p.dtype == np.float32 and p.flags.c_contiguous for p in given):
            parameters = [p.reshape(-1) for p in given]  # the usual case: no copies
        else:
            try:
                parameters = [np.ascontiguousarray(np.broadcast_to(p, normalized)).reshape(-1)
                              for p in given]
            except ValueError:
                return None
            if any(p.dtype != np.float32 for p in parameters):
                return None
        scale_row = read_only(parameters[0])
        bias_row = read_only(parameters[1]) if bias is not None else _NO_BIAS
        rows = math.prod(x.shape[:axis])
        matrix = read_only(np.ascontiguousarray(x).reshape(rows, -1))
        out = np.empty(matrix.shape, np.float32)
        stats_shape = x.shape[:axis] + (1,) * len(normalized)
        mean, inverse = np.empty(rows, np.float32), np.empty(rows, np.float32)
        if (self.num_threads > 1 and x.size >= LAYER_NORM_PARALLEL_MINIMUM and rows > 1
                and numba_threads(self.num_threads)):
            _layer_norm_rows_parallel.dispatcher(matrix, scale_row, bias_row, bias is not None,
                                                 self.epsilon, out, mean, inverse, self.num_threads)
        else:
            layer_norm_rows.dispatcher(matrix, scale_row, bias_row, bias is not None, self.epsilon,
                                       out, mean, inverse)
        return [out.reshape(x.shape), mean.reshape(stats_shape), inverse.reshape(stats_shape)]

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """Y alone (no Mean or InvStdDev asked for) of float32 X, scale and bias of the
        normalized shape, serially: :func:`layer_norm_rows` into the buffer."""
        if self.ctx.num_outputs != 1 or len(inputs) not in (2, 3) or self.stash != np.float32:
            return None
        (x, _), *parameters = inputs
        if not x or any(d != np.float32 for _, d in inputs):
            return None
        axis = self.axis % len(x) if -len(x) <= self.axis < len(x) else None
        if axis is None or any(tuple(shape) != tuple(x[axis:]) for shape, _ in parameters):
            return None
        rows, n = math.prod(x[:axis]), math.prod(x[axis:])
        if rows == 0 or n == 0 or (self.num_threads > 1 and rows * n >= LAYER_NORM_PARALLEL_MINIMUM):
            return None
        function, epsilon = layer_norm_rows.dispatcher, self.epsilon
        with_bias = len(parameters) == 2

        def compute(x: np.ndarray, scale: np.ndarray, bias: np.ndarray = _NO_BIAS, *,
                    out: np.ndarray) -> None:
            function(read_only(x.reshape(rows, n)), read_only(scale.reshape(n)), read_only(bias.reshape(-1)),
                     with_bias, epsilon,
                     out.reshape(rows, n), np.empty(rows, np.float32), np.empty(rows, np.float32))

        return Prepared(compute, tuple(x), np.dtype(np.float32))

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile the compiled pass now, at session construction, for a float32 node."""
        if self.ctx.input_types[:1] == (T.FLOAT,) and self.stash == np.float32:
            x = np.zeros((2, 2), np.float32)
            self._compiled(x, np.ones(2, np.float32), None, 1)
            if self.num_threads > 1 and numba_threads(self.num_threads):
                _layer_norm_rows_parallel.dispatcher(read_only(x), read_only(x[0]), _NO_BIAS, False, 1e-5,
                                                     x.copy(), x[0].copy(), x[0].copy(), self.num_threads)
        return None


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(BatchNormalization, (1, 6, 7, 9, 14, 15), types={1: _FLOATS, 15: _FLOATS_BF16}),
    declare(InstanceNormalization, (1, 6, 22), types={1: _FLOATS, 22: _FLOATS_BF16}),
    declare(LayerNormalization, (17,), types=_FLOATS_BF16),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
