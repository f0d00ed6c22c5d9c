"""FusedConv and FusedGemm: a convolution or a Gemm with its activation fused in, as
onnxruntime's graph optimizer writes them into the models it saves (``optimized_model_filepath``).

``Y = activation(Conv(X, W, B) + Z)``: the Conv kernel itself (:class:`~onnx_light.kernels.
conv.ConvKernel`, tuned under Conv's keys: a FusedConv is a Conv for the tuning cache), Z as
its ``residual`` input and the activation as its ``epilogue``, applied to each finished block.
``Y = activation(alpha A' B' + beta C)``: the Gemm kernel (:class:`~onnx_light.kernels.gemm.
GemmKernel`, under Gemm's keys) with the activation as its epilogue. The activations: Relu,
Tanh, Sigmoid, LeakyRelu (alpha), Clip (min, max) or HardSigmoid (alpha, beta), through the
elementwise kernels of those operators; FusedConv gives their parameters in
``activation_params``, FusedGemm in ``activation_alpha`` and ``activation_beta``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ...tuning.schema import KernelTuningSchema
from ..base import NodeContext, numpy_dtype
from ..conv import DECLARATIONS as CONV_DECLARATIONS
from ..conv import ConvKernel
from ..declaration import KernelDeclaration
from ..elementwise import KERNELS as ELEMENTWISE
from ..gemm import DECLARATIONS as GEMM_DECLARATIONS
from ..gemm import GemmKernel
from .base import FLOATS, declare_contrib, onnx_kernel

__all__ = ["DECLARATIONS"]

# Each activation's ONNX version and its attributes from ``activation_params``, in order
# (Clip's bounds are inputs).
_ACTIVATIONS: dict[str, tuple[int, tuple[str, ...]]] = {
    "Relu": (14, ()), "Tanh": (13, ()), "Sigmoid": (13, ()), "LeakyRelu": (16, ("alpha",)),
    "HardSigmoid": (22, ("alpha", "beta")), "Clip": (13, ()),
}
_CONV = CONV_DECLARATIONS[0]
_GEMM = next(d for d in GEMM_DECLARATIONS if d.op_type == "Gemm")


def _epilogue(ctx: NodeContext, parameters: list[float]) -> Callable[[np.ndarray], None]:
    """The node's activation (with ``parameters`` in order) as ``f(block)``, in place."""
    name = ctx.attribute("activation")
    if name not in _ACTIVATIONS:
        raise ctx.error(f"activation must be one of {sorted(_ACTIVATIONS)}, got {name!r}")
    version, names = _ACTIVATIONS[name]
    expected = 2 if name == "Clip" else len(names)
    if len(parameters) not in ((expected,) if name == "Clip" else (0, expected)):
        raise ctx.error(f"activation {name} takes {expected} activation_params, got {parameters}")
    element_type = ctx.input_types[0] if ctx.input_types else None
    attributes = dict(zip(names, parameters, strict=False))  # none given: the defaults
    activation = onnx_kernel(ctx, ELEMENTWISE[name][version], version, attributes,
                             (element_type, *([element_type] * 2 if name == "Clip" else [])))
    dtype = numpy_dtype(element_type) if element_type else np.dtype(np.float32)
    bounds = [np.asarray(p, dtype) for p in parameters] if name == "Clip" else []
    in_place = activation.in_place_function(element_type, bounds) if element_type else None
    if in_place is not None:
        return in_place

    def apply(block: np.ndarray) -> None:
        np.copyto(block, activation.run(block, *bounds)[0])

    return apply


class FusedConv(ConvKernel):
    """See the module docstring."""

    op_type = "FusedConv"

    def __init__(self, ctx: NodeContext) -> None:
        if ctx.num_inputs > 4:
            raise ctx.error(f"expects 2 to 4 inputs (X, W, optional B and Z), the node has "
                            f"{ctx.num_inputs}")
        super().__init__(dataclasses.replace(ctx, num_inputs=min(ctx.num_inputs, 3)))
        self.residual = ctx.given(3)
        self.epilogue = _epilogue(ctx, [float(p) for p in ctx.attribute("activation_params", [])])

    def tuning_schema(self) -> KernelTuningSchema | None:
        """Conv's schema: a FusedConv is tuned as the Conv it is."""
        element_type = self.element_type
        return None if element_type is None else _CONV.schema(element_type)


class FusedGemm(GemmKernel):
    """See the module docstring."""

    op_type = "FusedGemm"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        name = ctx.attribute("activation")
        given = [ctx.attribute(f"activation_{p}") for p in ("alpha", "beta")]
        count = 2 if name in ("Clip", "HardSigmoid") else 1 if name == "LeakyRelu" else 0
        self.epilogue = _epilogue(ctx, [float(p) for p in given[:count] if p is not None])

    def tuning_schema(self) -> KernelTuningSchema | None:
        """Gemm's schema: a FusedGemm is tuned as the Gemm it is."""
        element_type = self.element_type
        return None if element_type is None else _GEMM.schema(element_type)


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare_contrib(FusedConv, FLOATS), declare_contrib(FusedGemm, FLOATS),
)
