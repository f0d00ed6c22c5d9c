"""Kernels of onnxruntime's ``com.microsoft`` domain: the contrib operators its own tools
write, so that the models they produce run here: the quantizers' operators (QOperator format:
:mod:`.qlinear`, :mod:`.quantized_gemm`; dynamic: :mod:`.recurrent` and the quantized forms
of the fused encoder operators; weight-only: :mod:`.matmul_nbits`) and the transformer
optimizer's fusions.

One module per family; :data:`DECLARATIONS` gathers their declarations (each with
``domain='com.microsoft'``, version 1) for :mod:`onnx_light.kernels`, and :data:`KERNELS` is
the domain's ``op_type -> {since_version: kernel class}``.
"""

from __future__ import annotations

from ..base import Kernel
from ..declaration import KernelDeclaration, dispatch_table
from . import (
    activations,
    attention,
    fused_matmul,
    fused_products,
    grouped_attention,
    matmul_nbits,
    normalization,
    qlinear,
    quantized_gemm,
    recurrent,
)
from .base import DOMAIN

__all__ = ["DECLARATIONS", "DOMAIN", "KERNELS"]

DECLARATIONS: tuple[KernelDeclaration, ...] = (
    *qlinear.DECLARATIONS, *quantized_gemm.DECLARATIONS, *activations.DECLARATIONS,
    *normalization.DECLARATIONS, *attention.DECLARATIONS, *fused_matmul.DECLARATIONS,
    *recurrent.DECLARATIONS, *matmul_nbits.DECLARATIONS, *grouped_attention.DECLARATIONS,
    *fused_products.DECLARATIONS,
)

KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
