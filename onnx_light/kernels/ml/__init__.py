"""Kernels of the ``ai.onnx.ml`` domain: the classic machine-learning operators that
scikit-learn models converted by skl2onnx use (linear models, tree ensembles, SVMs, scalers,
encoders, feature extractors).

One module per family; :data:`DECLARATIONS` gathers their declarations (each with
``domain='ai.onnx.ml'``) for :mod:`onnx_light.kernels`, and :data:`KERNELS` is the domain's
``op_type -> {since_version: kernel class}``.
"""

from __future__ import annotations

from ..base import Kernel
from ..declaration import KernelDeclaration, dispatch_table
from . import encoders, features, linear, preprocessing, svm, trees
from .transforms import DOMAIN

__all__ = ["DECLARATIONS", "DOMAIN", "KERNELS"]

DECLARATIONS: tuple[KernelDeclaration, ...] = (
    *linear.DECLARATIONS, *trees.DECLARATIONS, *preprocessing.DECLARATIONS, *encoders.DECLARATIONS,
    *features.DECLARATIONS, *svm.DECLARATIONS,
)

KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
