"""Feature preprocessing of ai.onnx.ml: Scaler, Normalizer, Binarizer, Imputer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..base import Kernel, NodeContext
from ..declaration import KernelDeclaration, declare, dispatch_table
from .transforms import DOMAIN, NUMERIC_INPUTS

__all__ = ["DECLARATIONS", "KERNELS", "Binarizer", "Imputer", "Normalizer", "Scaler"]



def _per_feature(ctx: NodeContext, name: str, values: Sequence[float] | None, features: int) -> None:
    """A per-feature attribute must hold one value or one per feature."""
    if values is not None and len(values) not in (1, features):
        raise ctx.error(f"{name} has {len(values)} value(s) for an input with {features} feature(s)")


class Scaler(Kernel):
    """Y = (X - offset) * scale, per feature (the last axis); float32 out."""

    op_type = "Scaler"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.offset = np.asarray(ctx.attribute("offset", [0.0]), dtype=np.float32)
        self.scale = np.asarray(ctx.attribute("scale", [1.0]), dtype=np.float32)

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        features = x.shape[-1] if x.ndim else 1
        _per_feature(self.ctx, "offset", self.offset, features)
        _per_feature(self.ctx, "scale", self.scale, features)
        return ((x.astype(np.float32) - self.offset) * self.scale,)


class Normalizer(Kernel):
    """Each row divided by its MAX, L1 or L2 norm; float32 out."""

    op_type = "Normalizer"
    NORMS = ("MAX", "L1", "L2")

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.norm = ctx.attribute("norm", "MAX")
        if self.norm not in self.NORMS:
            raise ctx.error(f"norm must be one of {list(self.NORMS)}, got {self.norm!r}")

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        values = x.astype(np.float32).reshape(1, -1) if x.ndim == 1 else x.astype(np.float32)
        if self.norm == "MAX":
            norm = values.max(axis=1, keepdims=True)
        elif self.norm == "L1":
            norm = np.abs(values).sum(axis=1, keepdims=True)
        else:
            norm = np.sqrt((values * values).sum(axis=1, keepdims=True))
        out = np.divide(values, norm, out=np.zeros_like(values), where=norm != 0) \
            if self.norm != "MAX" else values / norm
        return (out.reshape(x.shape) if x.ndim == 1 else out,)


class Binarizer(Kernel):
    """1 where X > threshold, else 0, in X's type."""

    op_type = "Binarizer"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.threshold = float(ctx.attribute("threshold", 0.0))

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        return ((x > self.threshold).astype(x.dtype),)


class Imputer(Kernel):
    """Replaces ``replaced_value_float`` (NaN by default) or ``replaced_value_int64`` by the
    imputed value of its feature."""

    op_type = "Imputer"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        floats, ints = ctx.attribute("imputed_value_floats"), ctx.attribute("imputed_value_int64s")
        if bool(floats) == bool(ints):
            raise ctx.error("exactly one of imputed_value_floats and imputed_value_int64s must be set")
        self.imputed = np.asarray(floats or ints, dtype=np.float32 if floats else np.int64)
        self.replaced_float = float(ctx.attribute("replaced_value_float", 0.0))
        self.replaced_int = int(ctx.attribute("replaced_value_int64", 0))

    def run(self, x: np.ndarray) -> Sequence[np.ndarray]:
        features = x.shape[-1] if x.ndim else 1
        _per_feature(self.ctx, "the imputed values", self.imputed, features)
        if x.dtype.kind == "f":
            replaced = np.isnan(x) if np.isnan(self.replaced_float) else x == self.replaced_float
        else:
            replaced = x == self.replaced_int
        return (np.where(replaced, self.imputed.astype(x.dtype), x),)


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(Scaler, (1,), types=NUMERIC_INPUTS, domain=DOMAIN),
    declare(Normalizer, (1,), types=NUMERIC_INPUTS, domain=DOMAIN),
    declare(Binarizer, (1,), types=NUMERIC_INPUTS, domain=DOMAIN),
    declare(Imputer, (1,), types=NUMERIC_INPUTS, domain=DOMAIN),
)

KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
