"""Feature assembly of ai.onnx.ml: ArrayFeatureExtractor, FeatureVectorizer, DictVectorizer,
and ZipMap, which turns the score matrix into one ``{label: score}`` dict per row.

ZipMap's output and DictVectorizer's input are not tensors: the plan carries them as Python
values (a list of dicts; a dict, which a feed may hand over as a 0-d object array).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...tuning.keys import ElementType as T
from ..base import Kernel, NodeContext, numpy_dtype
from ..declaration import KernelDeclaration, declare, dispatch_table
from .transforms import DOMAIN, NUMERIC_INPUTS, class_labels

__all__ = [
    "DECLARATIONS", "KERNELS", "ArrayFeatureExtractor", "DictVectorizer", "FeatureVectorizer", "ZipMap",
]



class ArrayFeatureExtractor(Kernel):
    """The elements of the last axis at the given indices (a 1-d input as one row)."""

    op_type = "ArrayFeatureExtractor"

    def run(self, x: np.ndarray, indices: np.ndarray) -> Sequence[np.ndarray]:
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        size = x.shape[-1] if x.ndim else 0
        if index.size and (index.min() < -size or index.max() >= size):
            raise self.ctx.error(f"indices {index.tolist()} out of range for a last axis of {size}")
        data = x.reshape(1, -1) if x.ndim == 1 else x
        return (np.ascontiguousarray(data[..., index]),)


class FeatureVectorizer(Kernel):
    """The inputs side by side as float32 columns, each cut or zero-padded to its entry of
    ``inputdimensions``."""

    op_type = "FeatureVectorizer"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.dimensions = [int(d) for d in ctx.attribute("inputdimensions", ())]
        if len(self.dimensions) != ctx.num_inputs:
            raise ctx.error(f"inputdimensions has {len(self.dimensions)} value(s) for "
                            f"{ctx.num_inputs} input(s)")

    def run(self, *inputs: np.ndarray) -> Sequence[np.ndarray]:
        columns = []
        for position, (x, width) in enumerate(zip(inputs, self.dimensions, strict=True)):
            matrix = x.reshape(-1, 1) if x.ndim == 1 else x
            if matrix.ndim != 2:
                raise self.ctx.error(f"input {position} must have 1 or 2 dimensions, got {x.shape}")
            block = np.zeros((matrix.shape[0], width), dtype=np.float32)
            block[:, :min(width, matrix.shape[1])] = matrix[:, :width]
            columns.append(block)
        rows = {block.shape[0] for block in columns}
        if len(rows) > 1:
            raise self.ctx.error(f"the inputs have different row counts {sorted(rows)}")
        return (np.concatenate(columns, axis=1),)


def _mapping(ctx: NodeContext, value: Any) -> Mapping[Any, Any]:
    if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 0:
        value = value.item()
    if not isinstance(value, Mapping):
        raise ctx.error(f"input must be a map (a dict), got {type(value).__name__}")
    return value


class DictVectorizer(Kernel):
    """A map as one row [1, V] over the vocabulary; a key not in it is left out, a missing
    one is 0 (the output's type is the map's value type)."""

    op_type = "DictVectorizer"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        ints, strings = ctx.attribute("int64_vocabulary"), ctx.attribute("string_vocabulary")
        if bool(ints) == bool(strings):
            raise ctx.error("exactly one of int64_vocabulary and string_vocabulary must be set")
        vocabulary = list(strings or ints)
        self.columns = {key: i for i, key in reversed(list(enumerate(vocabulary)))}
        self.width = len(vocabulary)
        output = ctx.output_types[0] if ctx.output_types else None
        self.dtype = numpy_dtype(output) if output else None

    def run(self, x: Any) -> Sequence[np.ndarray]:
        mapping = _mapping(self.ctx, x)
        values = list(mapping.values())
        dtype = self.dtype or np.asarray(values[:1] or [0.0]).dtype
        row = np.full((1, self.width), "" if np.dtype(dtype).kind == "O" else 0, dtype=dtype)
        for key, value in mapping.items():
            column = self.columns.get(key.item() if isinstance(key, np.generic) else key)
            if column is not None:
                row[0, column] = value
        return (row,)


class ZipMap(Kernel):
    """Each row of scores as a dict ``{class label: score}``: a list of N dicts."""

    op_type = "ZipMap"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        labels = class_labels(ctx, "classlabels_int64s", "classlabels_strings")
        if labels is None:
            raise ctx.error("one of classlabels_int64s and classlabels_strings must be set")
        self.labels = labels.tolist()

    def run(self, x: np.ndarray) -> Sequence[list[dict[Any, float]]]:
        scores = x.reshape(1, -1) if x.ndim == 1 else x
        if scores.ndim != 2 or scores.shape[1] != len(self.labels):
            raise self.ctx.error(f"scores of shape {list(x.shape)} for {len(self.labels)} class labels")
        return ([dict(zip(self.labels, row, strict=True)) for row in scores.tolist()],)


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(ArrayFeatureExtractor, (1,), types=(*NUMERIC_INPUTS, T.STRING), domain=DOMAIN),
    declare(FeatureVectorizer, (1,), types=NUMERIC_INPUTS, domain=DOMAIN),
    declare(DictVectorizer, (1,), domain=DOMAIN),
    declare(ZipMap, (1,), types=(T.FLOAT,), domain=DOMAIN),
)

KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
