"""Category encoders of ai.onnx.ml: OneHotEncoder, LabelEncoder (opsets 1, 2 and 4) and
CategoryMapper. Each builds its lookup once; string keys go through a dict, numeric ones
through a sorted array (searchsorted over the whole input)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...tuning.keys import ElementType as T
from ..base import Kernel, NodeContext
from ..declaration import KernelDeclaration, declare, dispatch_table
from .transforms import DOMAIN, NUMERIC_INPUTS

__all__ = ["DECLARATIONS", "KERNELS", "CategoryMapper", "LabelEncoder", "Lookup", "OneHotEncoder"]



class Lookup:
    """``keys[i] -> values[i]`` over whole arrays; a key not found gives ``default`` (or, for
    ``positions``, -1). NaN keys match NaN."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, default: Any) -> None:
        self.strings = keys.dtype == object
        self.values, self.default = values, default
        if self.strings:
            self.index = {key: i for i, key in reversed(list(enumerate(keys.tolist())))}
        else:
            self.order = np.argsort(keys, kind="stable")
            self.sorted = keys[self.order]

    def positions(self, x: np.ndarray) -> np.ndarray:
        """The index of each element's key (-1: not a key)."""
        if self.strings:
            flat = [self.index.get(v, -1) for v in x.reshape(-1).tolist()]
            return np.asarray(flat, dtype=np.int64).reshape(x.shape)
        if not self.sorted.size:
            return np.full(x.shape, -1, dtype=np.int64)
        found = np.minimum(np.searchsorted(self.sorted, x), self.sorted.size - 1)
        candidates = self.sorted[found]
        hit = (candidates == x) | (np.isnan(candidates) & np.isnan(x)
                                    if self.sorted.dtype.kind == "f" else False)
        return np.where(hit, self.order[found], -1)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        positions = self.positions(x)
        out = self.values[np.maximum(positions, 0)] if self.values.size else \
            np.empty(x.shape, self.values.dtype)
        out = np.where(positions >= 0, out, np.asarray(self.default, dtype=self.values.dtype))
        return out.astype(self.values.dtype, copy=False)


def _array(values: Any, dtype: Any) -> np.ndarray:
    return np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=dtype)


class OneHotEncoder(Kernel):
    """One float32 indicator per category, on a new last axis."""

    op_type = "OneHotEncoder"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        ints, strings = ctx.attribute("cats_int64s"), ctx.attribute("cats_strings")
        if bool(ints) == bool(strings):
            raise ctx.error("exactly one of cats_int64s and cats_strings must be set")
        keys = _array(strings, object) if strings else _array(ints, np.int64)
        self.lookup = Lookup(keys, np.arange(len(keys)), -1)
        self.categories = len(keys)
        self.zeros = bool(ctx.attribute("zeros", 1))

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        if self.lookup.strings != (x.dtype.kind in "OU"):
            raise self.ctx.error(f"input of type {x.dtype} does not match the categories' type")
        keys = x.astype(object) if self.lookup.strings else x.astype(np.int64)
        positions = self.lookup.positions(keys)
        if not self.zeros and (positions < 0).any():
            unknown = keys.reshape(-1)[int(np.argmax(positions.reshape(-1) < 0))].item()
            raise self.ctx.error(f"category {unknown!r} is not one of the categories (zeros=0)")
        out = np.zeros((*x.shape, self.categories), dtype=np.float32)
        flat = out.reshape(-1, self.categories)
        rows = np.flatnonzero(positions.reshape(-1) >= 0)
        flat[rows, positions.reshape(-1)[rows]] = 1.0
        return (out,)


# LabelEncoder's key and value attributes by element kind, and their defaults.
_LABEL_KINDS = {"strings": (object, "default_string", "_Unused"),
                "int64s": (np.int64, "default_int64", -1),
                "floats": (np.float32, "default_float", -0.0)}


class LabelEncoder(Kernel):
    """Maps each element through ``keys_* -> values_*`` (opset 1: ``classes_strings``, the
    strings to their positions and back); a missing key gives the default."""

    op_type = "LabelEncoder"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        if ctx.opset < 2:
            classes = _array(ctx.attribute("classes_strings", ()), object)
            self.forward = Lookup(classes, np.arange(len(classes), dtype=np.int64),
                                  ctx.attribute("default_int64", -1))
            self.backward = Lookup(np.arange(len(classes), dtype=np.int64), classes,
                                   ctx.attribute("default_string", "_Unused"))
            return
        keys, _ = self._attribute(ctx, "keys")
        values, value_kind = self._attribute(ctx, "values")
        if len(keys) != len(values):
            raise ctx.error(f"{len(keys)} keys for {len(values)} values")
        default = ctx.attribute("default_tensor")
        if default is not None:
            default = np.asarray(default).reshape(-1)[0]
        else:
            _, name, fallback = _LABEL_KINDS.get(value_kind, (None, "default_int64", -1))
            default = ctx.attribute(name, fallback)
        self.forward = self.backward = Lookup(keys, values, default)

    @staticmethod
    def _attribute(ctx: NodeContext, which: str) -> tuple[np.ndarray, str]:
        given = [(kind, ctx.attribute(f"{which}_{kind}")) for kind in _LABEL_KINDS]
        given = [(kind, value) for kind, value in given if value is not None]
        tensor = ctx.attribute(f"{which}_tensor")
        if tensor is not None:
            given.append(("tensor", tensor))
        if len(given) != 1:
            raise ctx.error(f"exactly one of {which}_strings, {which}_int64s, {which}_floats and "
                            f"{which}_tensor must be set, got {len(given)}")
        kind, value = given[0]
        if kind == "tensor":
            array = np.asarray(value).reshape(-1)
            return (array.astype(object) if array.dtype.kind in "OUS" else array), kind
        return _array(value, _LABEL_KINDS[kind][0]), kind

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        lookup = self.backward if x.dtype.kind in "iu" and self.forward is not self.backward \
            else self.forward
        keys = x.astype(object) if lookup.strings else x
        return (lookup(keys),)


class CategoryMapper(Kernel):
    """Strings to int64s or int64s to strings, through the pairs ``cats_strings[i] <->
    cats_int64s[i]``; a missing one gives ``default_int64`` or ``default_string``."""

    op_type = "CategoryMapper"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        strings = _array(ctx.attribute("cats_strings", ()), object)
        ints = _array(ctx.attribute("cats_int64s", ()), np.int64)
        if len(strings) != len(ints):
            raise ctx.error(f"cats_strings has {len(strings)} value(s), cats_int64s {len(ints)}")
        self.to_ints = Lookup(strings, ints, int(ctx.attribute("default_int64", -1)))
        self.to_strings = Lookup(ints, strings, ctx.attribute("default_string", "_Unused"))

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        if x.dtype.kind in "OU":
            return (self.to_ints(x.astype(object)),)
        return (self.to_strings(x.astype(np.int64)),)


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(OneHotEncoder, (1,), types=(*NUMERIC_INPUTS, T.STRING), domain=DOMAIN),
    declare(LabelEncoder, (1, 2, 4), domain=DOMAIN),
    declare(CategoryMapper, (1,), types=(T.STRING, T.INT64), domain=DOMAIN),
)

KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
