"""Structural kernels: constants, casts, shape manipulation, indexing, padding.

Every kernel here moves or converts data without arithmetic worth tuning, so none is
tunable. One class serves every opset version of its op and branches on ``ctx.opset``
where ONNX turned an attribute into an input (Squeeze/Unsqueeze/Split axes and sizes,
Slice bounds, Pad pads, Reshape shape).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..tuning.keys import ELEMENT_TYPE_CODES
from ..tuning.keys import ElementType as TensorProto
from .base import (
    Kernel,
    KernelError,
    NodeContext,
    Prepared,
    TensorSpec,
    compute_dtype,
    ints,
    normalize_axes,
    normalize_axis,
    numpy_dtype,
)
from .declaration import KernelDeclaration, Required, declare, dispatch_table

__all__ = ["KERNELS", "cast"]

Arrays = list[np.ndarray]


# ---------------------------------------------------------------- shared helpers

def ints_since(ctx: NodeContext, name: str, value: np.ndarray | None, since: int) -> list[int] | None:
    """An int list that is the input ``value`` from opset ``since`` on and attribute ``name`` before."""
    return ints(value) if ctx.opset >= since else ints(ctx.attribute(name))


def zero(dtype: np.dtype) -> Any:
    """The padding value of a type: 0, False, or the empty string."""
    return "" if dtype.kind == "O" else np.zeros((), dtype)[()]


def outputs_of(ctx: NodeContext, *arrays: np.ndarray) -> Arrays:
    """As many of ``arrays`` as the node has outputs (at least one)."""
    return list(arrays[:max(1, ctx.num_outputs)])


# ---------------------------------------------------------------- Cast

_SATURATING = {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
               TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}
_ROUND_MODES = ("up", "down", "nearest")
_ELEMENT_TYPES = ELEMENT_TYPE_CODES


def _string_to_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return int(float(text))  # "100.5" -> 100: undefined by ONNX, truncation here


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float8e8m0 (a power of two) from the float32 exponent, rounded by the mantissa."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    if round_mode == "up":
        exponent = exponent + (mantissa != 0)
    elif round_mode == "nearest":
        exponent = exponent + (mantissa >= 0x400000)
    exponent = np.where(exponent > 0xFE, 0xFE if saturate else 0xFF, exponent)
    exponent = np.where((bits >> 23) & 0xFF == 0xFF, 0xFF, exponent)  # NaN and infinity
    return exponent.astype(np.uint8).view(numpy_dtype(TensorProto.FLOAT8E8M0))


def cast(x: np.ndarray, to: int, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    """ONNX Cast of ``x`` to element type ``to``.

    Strings parse as Python numbers ("INF", "-inf", "NaN", "1E8"); integer targets
    parse integers exactly and truncate decimals; bool targets go through float
    (so "0" is False). Numbers format as numpy's shortest repr. float8 targets
    saturate to their largest finite value unless ``saturate`` is false. A float out of an
    integer target's range (NaN, infinities) is undefined by ONNX: it becomes whatever numpy
    or ml_dtypes make of it, without a warning.
    """
    if to == TensorProto.STRING:
        text = [str(v) for v in x.reshape(-1)]  # numpy scalars print their own precision
        return np.array(text, object).reshape(x.shape)
    dtype = numpy_dtype(to)
    if x.dtype.kind == "O":
        x = (np.vectorize(_string_to_int, otypes=[object])(x) if dtype.kind in "iu"
             else x.astype(np.float64))
    if to == TensorProto.FLOAT8E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if to in _SATURATING and saturate:
        import ml_dtypes  # here, not at import: docs/benchmarks.md (import time)

        limit = float(ml_dtypes.finfo(dtype).max)
        x = np.clip(x if x.dtype.kind == "f" else x.astype(np.float32), -limit, limit)
    with np.errstate(all="ignore"):
        return x.astype(dtype)


def _cast_options(ctx: NodeContext) -> tuple[bool, str]:
    round_mode = ctx.attribute("round_mode", "up")
    if round_mode not in _ROUND_MODES:
        raise ctx.error(f"round_mode must be one of {_ROUND_MODES}, got {round_mode!r}")
    return bool(ctx.attribute("saturate", 1)), round_mode


class Cast(Kernel):
    op_type = "Cast"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.saturate, self.round_mode = _cast_options(ctx)
        to = ctx.attribute("to")
        if isinstance(to, str):  # Cast-1 names the type
            to = _ELEMENT_TYPES.get(to.upper(), to)
        if not isinstance(to, int) or to == TensorProto.UNDEFINED or to not in _ELEMENT_TYPES.values():
            raise ctx.error(f"attribute 'to' must be an ONNX element type, got {ctx.attribute('to')!r}")
        self.to = to

    def views(self) -> Sequence[Sequence[int]]:
        return ((0,),)  # a cast to the input's own numeric type is the input

    def run(self, x: np.ndarray) -> Arrays:
        if x.dtype.kind != "O" and x.dtype == numpy_dtype(self.to):
            return [x]
        return [cast(x, self.to, self.saturate, self.round_mode)]


class CastLike(Kernel):
    op_type = "CastLike"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.saturate, self.round_mode = _cast_options(ctx)

    def run(self, x: np.ndarray, like: np.ndarray) -> Arrays:
        from onnx import helper

        to = helper.np_dtype_to_tensor_dtype(like.dtype)  # object -> STRING
        return [cast(x, to, self.saturate, self.round_mode)]


# ---------------------------------------------------------------- constants

def _tensor_value(value: Any) -> np.ndarray:
    """A ``value``/``sparse_value`` attribute as an array (sparse tensors made dense)."""
    import onnx

    return _dense(value) if isinstance(value, onnx.SparseTensorProto) else np.asarray(value)


def _dense(sparse: Any) -> np.ndarray:
    from onnx import numpy_helper

    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices)
    dense = np.zeros(tuple(sparse.dims), values.dtype)
    if indices.ndim == 2:  # [NNZ, rank] coordinates
        dense[tuple(indices.T)] = values
    else:  # [NNZ] linear indices
        dense.reshape(-1)[indices] = values
    return dense


_CONSTANT_FORMS = {
    "value": _tensor_value,
    "sparse_value": _tensor_value,
    "value_float": lambda v: np.array(v, np.float32),
    "value_floats": lambda v: np.array(v, np.float32),
    "value_int": lambda v: np.array(v, np.int64),
    "value_ints": lambda v: np.array(v, np.int64),
    "value_string": lambda v: np.array(v, object),
    "value_strings": lambda v: np.array(list(v), object).reshape(-1),
}


class Constant(Kernel):
    op_type = "Constant"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        given = [name for name in _CONSTANT_FORMS if name in ctx.attributes]
        if len(given) != 1:
            raise ctx.error(f"needs exactly one of the attributes {list(_CONSTANT_FORMS)}, got {given}")
        self.value = _CONSTANT_FORMS[given[0]](ctx.attributes[given[0]])
        self.value.flags.writeable = False  # every run returns this array

    def run(self) -> Arrays:
        return [self.value]


class ConstantOfShape(Kernel):
    op_type = "ConstantOfShape"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        value = np.asarray(ctx.attribute("value", np.zeros(1, np.float32)))
        if value.size != 1:
            raise ctx.error(f"attribute 'value' must hold one element, got shape {list(value.shape)}")
        self.value = value.reshape(-1)[0]

    def _dims(self, shape: np.ndarray) -> list[int]:
        dims = ints(shape)
        if any(d < 0 for d in dims):
            raise self.ctx.error(f"shape {dims} has a negative dimension")
        return dims

    def output_elements(self, inputs: Sequence[np.ndarray | None]) -> int | None:
        return math.prod(self._dims(inputs[0]))

    def run(self, shape: np.ndarray) -> Arrays:
        return [np.full(self._dims(shape), self.value)]


class InputView(Kernel):
    """A kernel whose outputs are its data input or views of it (its first input)."""

    def views(self) -> Sequence[Sequence[int]]:
        return ((0,),) * max(1, self.ctx.num_outputs)


class Identity(InputView):
    op_type = "Identity"

    def run(self, x: Any) -> list[Any]:
        return [x]


class Dropout(Kernel):
    """Identity in inference; a random mask (seeded by ``seed``) when ``training_mode`` is true."""

    op_type = "Dropout"

    def views(self) -> Sequence[Sequence[int]]:
        return ((0,),)  # in inference; the mask is made anew

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.ratio = float(ctx.attribute("ratio", 0.5))
        self.seed = ctx.attribute("seed")

    def run(self, x: np.ndarray, ratio: np.ndarray | None = None,
            training_mode: np.ndarray | None = None) -> Arrays:
        ratio_value = self.ratio if ratio is None else float(ratio)
        if training_mode is None or not bool(training_mode) or ratio_value == 0:
            mask = np.ones(x.shape, bool if self.ctx.opset >= 10 else x.dtype)
            return outputs_of(self.ctx, x, mask)
        if not 0 <= ratio_value < 1:
            raise self.ctx.error(f"ratio must be in [0, 1), got {ratio_value}")
        # numpy's legacy Mersenne Twister stream, as ONNX's own test data draws it for a given seed
        mask = np.random.RandomState(self.seed).uniform(0.0, 1.0, x.shape) >= ratio_value
        output = (mask * x * (1 / (1 - ratio_value))).astype(x.dtype)
        return outputs_of(self.ctx, output, mask)


# ---------------------------------------------------------------- shapes

class Shape(Kernel):
    op_type = "Shape"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.start = ctx.attribute("start", 0)
        self.end = ctx.attribute("end")

    def run(self, x: np.ndarray) -> Arrays:
        return [np.array(x.shape[self.start:self.end], np.int64)]

    def outputs_of_shapes(self, shapes: Sequence[tuple[int, ...] | None]) -> list[np.ndarray] | None:
        return None if shapes[0] is None else [np.array(shapes[0][self.start:self.end], np.int64)]


class Size(Kernel):
    op_type = "Size"

    def run(self, x: np.ndarray) -> Arrays:
        return [np.array(x.size, np.int64)]

    def outputs_of_shapes(self, shapes: Sequence[tuple[int, ...] | None]) -> list[np.ndarray] | None:
        return None if shapes[0] is None else [np.array(math.prod(shapes[0]), np.int64)]


class Reshape(InputView):
    op_type = "Reshape"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.allowzero = bool(ctx.attribute("allowzero", 0))

    #: The constant shape (:meth:`specialize`), and the positions where its 0 copies the
    #: input's dimension.
    _dims: tuple[int, ...] | None = None
    _copied: tuple[int, ...] = ()

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """With a constant shape, a copy that keeps it checked once: a run fills in the
        dimensions its 0s copy and hands it to numpy's reshape, which infers the -1; an input
        it does not fit goes the checking way, for the node's error."""
        if self.ctx.opset >= 5 and (len(constants) < 2 or constants[1] is None):
            return None
        dims = ints_since(self.ctx, "shape", constants[1] if len(constants) > 1 else None, 5)
        copied = () if self.allowzero else tuple(i for i, d in enumerate(dims) if d == 0)
        if dims.count(-1) > 1 or any(d < -1 for d in dims):
            return None
        kernel = copy.copy(self)
        kernel._dims, kernel._copied = tuple(dims), copied
        return kernel

    def run(self, x: np.ndarray, shape: np.ndarray | None = None) -> Arrays:
        dims = self._dims
        if dims is not None and (not self._copied or self._copied[-1] < x.ndim):
            if self._copied:
                filled = list(dims)
                for i in self._copied:
                    filled[i] = x.shape[i]
                dims = tuple(filled)
            if -1 not in dims or math.prod(dims) != 0:
                try:
                    return [x.reshape(dims)]
                except ValueError:
                    pass  # the checking way names the problem
        return self._reshape(x, shape)

    def _reshape(self, x: np.ndarray, shape: np.ndarray | None) -> Arrays:
        dims = ints_since(self.ctx, "shape", shape, 5)
        if not self.allowzero:
            if any(d == 0 and i >= x.ndim for i, d in enumerate(dims)):
                raise self.ctx.error(f"shape {dims} copies a dimension the input of shape "
                                     f"{list(x.shape)} does not have")
            dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
        if dims.count(-1) > 1 or any(d < -1 for d in dims):
            raise self.ctx.error(f"shape {dims} may hold one -1 and no other negative value")
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            if known == 0 or x.size % known:
                raise self.ctx.error(f"cannot infer the -1 of shape {dims} for {x.size} elements")
            dims[dims.index(-1)] = x.size // known
        if math.prod(dims) != x.size:
            raise self.ctx.error(f"cannot reshape {list(x.shape)} to {dims}")
        return [x.reshape(dims)]


class Flatten(InputView):
    op_type = "Flatten"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = ctx.attribute("axis", 1)

    def run(self, x: np.ndarray) -> Arrays:
        if not -x.ndim <= self.axis <= x.ndim:
            raise self.ctx.error(f"axis {self.axis} is out of range [{-x.ndim}, {x.ndim}]")
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


class Transpose(InputView):
    op_type = "Transpose"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.perm = ints(ctx.attribute("perm"))

    def run(self, x: np.ndarray) -> Arrays:
        perm = list(range(x.ndim))[::-1] if self.perm is None else self.perm
        if sorted(perm) != list(range(x.ndim)):
            raise self.ctx.error(f"perm {perm} is not a permutation of the {x.ndim} axes")
        return [np.transpose(x, perm)]


class Squeeze(InputView):
    op_type = "Squeeze"

    def run(self, x: np.ndarray, axes: np.ndarray | None = None) -> Arrays:
        given = ints_since(self.ctx, "axes", axes, 13)
        if given is None:
            return [np.squeeze(x)]
        normalised = normalize_axes(self.ctx, given, x.ndim)
        if any(x.shape[a] != 1 for a in normalised):
            raise self.ctx.error(f"cannot squeeze axes {given} of shape {list(x.shape)}")
        return [np.squeeze(x, axis=normalised)]


class Unsqueeze(InputView):
    op_type = "Unsqueeze"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)

    def run(self, x: np.ndarray, axes: np.ndarray | None = None) -> Arrays:
        given = ints_since(self.ctx, "axes", axes, 13)
        if given is None:
            raise self.ctx.error("input 'axes' is required")
        return [np.expand_dims(x, normalize_axes(self.ctx, given, x.ndim + len(given)))]


class Expand(Kernel):
    op_type = "Expand"

    def _target(self, x: np.ndarray, shape: np.ndarray) -> tuple[int, ...]:
        try:
            return np.broadcast_shapes(x.shape, tuple(ints(shape)))
        except ValueError:
            raise self.ctx.error(f"cannot expand shape {list(x.shape)} to {ints(shape)}") from None

    def output_elements(self, inputs: Sequence[np.ndarray | None]) -> int | None:
        return math.prod(self._target(inputs[0], inputs[1]))

    def run(self, x: np.ndarray, shape: np.ndarray) -> Arrays:
        return [np.broadcast_to(x, self._target(x, shape)).copy()]


class Tile(Kernel):
    op_type = "Tile"

    def _repeats(self, x: np.ndarray, repeats: np.ndarray, axis: np.ndarray | None) -> list[int]:
        if self.ctx.opset < 6:  # Tile-1: a count of copies along one axis
            reps = [1] * x.ndim
            reps[normalize_axis(self.ctx, int(axis), x.ndim)] = int(repeats)
        else:
            reps = ints(repeats)
        if len(reps) != x.ndim or min(reps, default=0) < 0:
            raise self.ctx.error(f"repeats {reps} must be {x.ndim} non-negative counts")
        return reps

    def output_elements(self, inputs: Sequence[np.ndarray | None]) -> int | None:
        x, repeats, *axis = inputs
        return x.size * math.prod(self._repeats(x, repeats, axis[0] if axis else None))

    def run(self, x: np.ndarray, repeats: np.ndarray, axis: np.ndarray | None = None) -> Arrays:
        return [np.tile(x, self._repeats(x, repeats, axis))]


# ---------------------------------------------------------------- joining and splitting

class Concat(Kernel):
    op_type = "Concat"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = ctx.attribute("axis", 1 if ctx.opset < 4 else None)
        if self.axis is None:
            raise ctx.error("attribute 'axis' is required")

    def run(self, *inputs: np.ndarray) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, inputs[0].ndim)
        try:
            return [np.concatenate(inputs, axis=axis)]
        except ValueError:
            shapes = [list(x.shape) for x in inputs]
            raise self.ctx.error(f"cannot concatenate shapes {shapes} on axis {self.axis}") from None


class Split(InputView):
    op_type = "Split"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = ctx.attribute("axis", 0)
        self.num_outputs = ctx.attribute("num_outputs")
        if self.num_outputs is not None and self.num_outputs != ctx.num_outputs:
            raise ctx.error(f"num_outputs is {self.num_outputs} but the node has {ctx.num_outputs} outputs")

    def run(self, x: np.ndarray, split: np.ndarray | None = None) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        dim, count = x.shape[axis], self.ctx.num_outputs
        from_input = self.ctx.opset >= 13 or split is not None  # Split-1 takes either
        sizes = ints(split) if from_input else ints(self.ctx.attribute("split"))
        if not sizes and self.num_outputs is not None:  # opset 18: the last part may be smaller
            chunk = -(-dim // count)
            sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(count)]
        elif not sizes:
            if dim % count:
                raise self.ctx.error(f"cannot split dimension {dim} into {count} equal parts")
            sizes = [dim // count] * count
        if len(sizes) != count or sum(sizes) != dim or min(sizes) < 0:
            raise self.ctx.error(f"split {sizes} does not cut dimension {dim} into {count} parts")
        parts, start = [], 0
        index: list[slice] = [slice(None)] * x.ndim
        for size in sizes:
            index[axis] = slice(start, start + size)
            parts.append(x[tuple(index)])
            start += size
        return parts


# ---------------------------------------------------------------- indexing

def _slice(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX Slice bounds: negative values count from the end, then clamp by the step's sign."""
    start += dim if start < 0 else 0
    end += dim if end < 0 else 0
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


class Slice(InputView):
    """ONNX Slice: a view of the data. Bounds that are constants (every input after the data
    given and fixed) are read once, at construction, and the view's index kept per data
    shape: reading them took about 13 us a run, more than the view (ShuffleNetV2's chunks)."""

    op_type = "Slice"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self._fixed: tuple[list[int], list[int], list[int], list[int]] | None = None
        self._indices: dict[tuple[int, ...], tuple[slice, ...]] = {}

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """A copy that reads constant bounds once (None when one is not constant or they are
        invalid: the runs then read them and raise)."""
        given = list(constants[1:self.ctx.num_inputs])
        if self.ctx.opset < 10 or len(given) < 2 or any(c is None for c in given):
            return None
        try:
            fixed = self._bounds(*given)
        except KernelError:
            return None
        specialized = copy.copy(self)
        specialized._fixed, specialized._indices = fixed, {}
        return specialized

    def _bounds(self, starts: np.ndarray | None = None, ends: np.ndarray | None = None,
                axes: np.ndarray | None = None, steps: np.ndarray | None = None
                ) -> tuple[list[int], list[int], list[int], list[int]]:
        """The starts, ends, axes (not yet normalised) and steps, checked."""
        begin, end = ints_since(self.ctx, "starts", starts, 10), ints_since(self.ctx, "ends", ends, 10)
        axes_list = ints_since(self.ctx, "axes", axes, 10)
        axes_list = list(range(len(begin))) if axes_list is None else axes_list
        step = [1] * len(begin) if steps is None else ints(steps)
        if not len(begin) == len(end) == len(axes_list) == len(step):
            raise self.ctx.error(f"starts {begin}, ends {end}, axes {axes_list} and steps {step} "
                                 "must have one length")
        if 0 in step:
            raise self.ctx.error("steps must not be 0")
        return begin, end, axes_list, step

    def run(self, x: np.ndarray, starts: np.ndarray | None = None, ends: np.ndarray | None = None,
            axes: np.ndarray | None = None, steps: np.ndarray | None = None) -> Arrays:
        if self._fixed is None:
            return [x[self._index(x.shape, self._bounds(starts, ends, axes, steps))]]
        index = self._indices.get(x.shape)
        if index is None:
            index = self._indices[x.shape] = self._index(x.shape, self._fixed)
        return [x[index]]

    def _index(self, shape: tuple[int, ...], bounds: tuple[list[int], list[int], list[int], list[int]]
               ) -> tuple[slice, ...]:
        begin, end, axes, step = bounds
        index = [slice(None)] * len(shape)
        for b, e, a, s in zip(begin, end, normalize_axes(self.ctx, axes, len(shape)), step, strict=True):
            index[a] = _slice(b, e, s, shape[a])
        return tuple(index)


def _indices(ctx: NodeContext, indices: np.ndarray, dim: int) -> np.ndarray:
    """Indices with negative values counted from the end; any outside [-dim, dim) is an error."""
    indices = np.asarray(indices, np.int64)
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise ctx.error(f"indices must lie in [{-dim}, {dim - 1}], got [{indices.min()}, {indices.max()}]")
    return np.where(indices < 0, indices + dim, indices)


class Gather(Kernel):
    op_type = "Gather"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = ctx.attribute("axis", 0)

    def run(self, x: np.ndarray, indices: np.ndarray) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        return [np.take(x, _indices(self.ctx, indices, x.shape[axis]), axis=axis)]

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """Rows of a numeric table by int64 indices (an embedding): one range check and one
        copy into the plan's buffer, where :meth:`run` makes the indices anew and allocates
        the output. None for other axes, index types or empty tables and indices."""
        (x_shape, x_dtype), (i_shape, i_dtype) = inputs
        if (len(x_shape) == 0 or x_shape[0] == 0 or math.prod(i_shape) == 0 or i_dtype != np.int64
                or x_dtype.kind not in "biufc" or normalize_axis(self.ctx, self.axis, len(x_shape)) != 0):
            return None
        dim, ctx = x_shape[0], self.ctx
        add, take = np.add, np.take

        def gather(x: np.ndarray, indices: np.ndarray, out: np.ndarray) -> None:
            # i + dim, read unsigned, is below 2 * dim exactly when -dim <= i < dim (sums that
            # wrap past the int64 range read as huge)
            if add(indices, dim).view(np.uint64).max() >= 2 * dim:
                _indices(ctx, indices, dim)  # raises, naming the range
            take(x, indices, axis=0, out=out, mode="wrap")

        return Prepared(gather, (*i_shape, *x_shape[1:]), x_dtype)


class GatherElements(Gather):
    op_type = "GatherElements"
    prepare = Kernel.prepare  # not Gather's rows of a table

    def run(self, x: np.ndarray, indices: np.ndarray) -> Arrays:
        axis = normalize_axis(self.ctx, self.axis, x.ndim)
        if indices.ndim != x.ndim or any(indices.shape[i] > x.shape[i] for i in range(x.ndim) if i != axis):
            raise self.ctx.error(f"indices of shape {list(indices.shape)} for data of shape {list(x.shape)}")
        # indices may be shorter than the data on the other axes: cut the data to match
        x = x[tuple(slice(None) if i == axis else slice(0, n) for i, n in enumerate(indices.shape))]
        return [np.take_along_axis(x, _indices(self.ctx, indices, x.shape[axis]), axis=axis)]


class NonZero(Kernel):
    op_type = "NonZero"

    def run(self, x: np.ndarray) -> Arrays:
        if x.ndim == 0:  # numpy refuses 0-d nonzero
            return [np.zeros((0, int(bool(x))), np.int64)]
        return [np.array(np.nonzero(x), np.int64).reshape(x.ndim, -1)]


class OneHot(Kernel):
    op_type = "OneHot"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.axis = ctx.attribute("axis", -1)

    def run(self, indices: np.ndarray, depth: np.ndarray, values: np.ndarray) -> Arrays:
        depth_value = int(np.asarray(depth).reshape(-1)[0])
        if depth_value < 1 or values.size != 2:
            raise self.ctx.error(f"depth must be positive ({depth_value}) and values hold two "
                                 f"elements ({values.size})")
        axis = normalize_axis(self.ctx, self.axis, indices.ndim + 1)
        with np.errstate(invalid="ignore"):
            positions = indices.astype(np.int64)
        if self.ctx.opset >= 11:
            positions = np.where(positions < 0, positions + depth_value, positions)
        classes = np.arange(depth_value).reshape([-1 if i == axis else 1 for i in range(indices.ndim + 1)])
        off, on = values.reshape(-1)
        return [np.where(np.expand_dims(positions, axis) == classes, on, off).astype(values.dtype)]


class Trilu(Kernel):
    op_type = "Trilu"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.upper = bool(ctx.attribute("upper", 1))

    def run(self, x: np.ndarray, k: np.ndarray | None = None) -> Arrays:
        if x.ndim < 2:
            raise self.ctx.error(f"input must have rank 2 or more, got {x.ndim}")
        keep = np.ones(x.shape[-2:], bool)
        keep = (np.triu if self.upper else np.tril)(keep, 0 if k is None else int(k))
        return [np.where(keep, x, zero(x.dtype)).astype(x.dtype)]


# ---------------------------------------------------------------- generating and padding

class Range(Kernel):
    op_type = "Range"

    def _count(self, start: np.ndarray, limit: np.ndarray, delta: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, int]:
        """The first value and the step (in the type computed in) and the count."""
        dtype = start.dtype
        stash = self.ctx.opset >= 27 and self.ctx.attribute("stash_type", 1) == 1
        compute = compute_dtype(dtype) if stash else dtype
        first, last, step = (np.asarray(v).astype(compute).reshape(()) for v in (start, limit, delta))
        if step == 0 or not all(np.isfinite(v) for v in (first, last, step)):
            raise self.ctx.error(f"cannot count from {first} to {last} by {step}")
        if dtype.kind in "iu":
            count = -((int(first) - int(last)) // int(step))
        else:
            count = math.ceil((float(last) - float(first)) / float(step))
        return first, step, max(count, 0)

    def output_elements(self, inputs: Sequence[np.ndarray | None]) -> int | None:
        return self._count(*inputs)[2]

    def run(self, start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> Arrays:
        first, step, count = self._count(start, limit, delta)
        with np.errstate(over="ignore"):
            values = first + np.arange(count, dtype=first.dtype) * step
        return [values.astype(start.dtype)]


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


class Pad(Kernel):
    op_type = "Pad"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.mode = ctx.attribute("mode", "constant")
        modes = _PAD_MODES if ctx.opset >= 19 else _PAD_MODES[:3]
        if self.mode not in modes:
            raise ctx.error(f"mode must be one of {modes}, got {self.mode!r}")

    def run(self, x: np.ndarray, pads: np.ndarray | None = None, constant_value: np.ndarray | None = None,
            axes: np.ndarray | None = None) -> Arrays:
        if self.ctx.opset < 11:
            amounts = ints(self.ctx.attribute("paddings" if self.ctx.opset < 2 else "pads"))
            value = self.ctx.attribute("value", 0.0)
        else:
            amounts = ints(pads)
            value = constant_value.reshape(-1)[0] if constant_value is not None and constant_value.size \
                else zero(x.dtype)
        axes_list = normalize_axes(self.ctx, range(x.ndim) if axes is None else ints(axes), x.ndim)
        if len(amounts) != 2 * len(axes_list):
            raise self.ctx.error(f"pads {amounts} must hold two values for each of the axes {axes_list}")
        widths = [(0, 0)] * x.ndim
        for i, axis in enumerate(axes_list):
            widths[axis] = (amounts[i], amounts[i + len(axes_list)])
        # negative pads crop first
        x = x[tuple(slice(max(-b, 0), n - max(-e, 0)) for (b, e), n in zip(widths, x.shape, strict=True))]
        widths = [(max(b, 0), max(e, 0)) for b, e in widths]
        if self.mode == "constant":
            return [np.pad(x, widths, constant_values=np.array(value, x.dtype)[()])]
        if any(n == 0 and (b or e) for (b, e), n in zip(widths, x.shape, strict=True)):
            raise self.ctx.error(f"mode {self.mode!r} cannot pad an empty axis")
        return [np.pad(x, widths, mode=self.mode)]


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(Cast, (1, 6, 9, 13, 19, 21, 23, 24, 25, 28)),
    declare(CastLike, (15, 19, 21, 23, 24, 25)),
    declare(Concat, (1, 4, 11, 13)),
    declare(Constant, (1, 9, 11, 12, 13, 19, 21, 23, 24, 25)),
    declare(ConstantOfShape, (9, 20, 21, 23, 24, 25)),
    declare(Dropout, (1, 6, 7, 10, 12, 13, 22)),
    declare(Expand, (8, 13)),
    declare(Flatten, (1, 9, 11, 13, 21, 23, 24, 25)),
    declare(Gather, (1, 11, 13)),
    declare(GatherElements, (11, 13)),
    declare(Identity, (1, 13, 14, 16, 19, 21, 23, 24, 25)),
    declare(NonZero, (9, 13)),
    declare(OneHot, (9, 11, 28)),
    declare(Pad, (1, 2, 11, 13, 18, 19, 21, 23, 24, 25),
            required=(Required("paddings", before=2), Required("pads", before=11, since=2))),
    declare(Range, (11, 27)),
    declare(Reshape, (1, 5, 13, 14, 19, 21, 23, 24, 25), required=(Required("shape", before=5),)),
    declare(Shape, (1, 13, 15, 19, 21, 23, 24, 25)),
    declare(Size, (1, 13, 19, 21, 23, 24, 25)),
    declare(Slice, (1, 10, 11, 13),
            required=(Required("starts", before=10), Required("ends", before=10))),
    declare(Split, (1, 2, 11, 13, 18)),
    declare(Squeeze, (1, 11, 13, 21, 23, 24, 25)),
    declare(Tile, (1, 6, 13)),
    declare(Transpose, (1, 13, 21, 23, 24, 25)),
    declare(Trilu, (14,)),
    declare(Unsqueeze, (1, 11, 13, 21, 23, 24, 25), required=(Required("axes", before=13),)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)

