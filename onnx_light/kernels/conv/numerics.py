"""The bound on how far two Conv configurations' outputs may differ, for tests and calibration.

Every configuration but ``winograd`` computes each output as the bias plus the same
``K = C/group * K1 * ... * Kk`` products ``w * x`` in the compute type (float32 for float16
and bfloat16); configurations differ only in the order of the additions (BLAS blocking, which
depends on the block shape; the depthwise loop's fixed order; where the bias is added). The
forward error of such a sum under any order is at most ``(K + 1) * u * (|W| * |X| + |B|)``
(first order, ``u`` the unit roundoff of the compute type, ``*`` the convolution), so for any
two configurations and every output element::

    |Y - Y_reference| <= 2 * (K + 2) * u * ((|W| * |X|) + |B|)

plus, for float16 and bfloat16, one unit in the last place of the output type (each result
is rounded once into it). ``winograd`` sums other terms: the transformed inputs (two passes,
each a sum of at most ``b`` products, ``b`` the most nonzero entries in a row of ``B^T``),
the transformed filters (rounded once from float64), their products summed over the
``C/group`` channels, the output transform (two passes of at most ``a`` products, ``a`` for
``A^T``) and the bias, so its error is at most ``(C/group + R) * u * (T + |B|)``, first
order, with ``R = 2 b + 2 a + 2`` (:attr:`~onnx_light.kernels.conv.winograd.Tiling.roundings`:
12 for F(2x2, 3x3), 22 for F(4x4, 3x3)) and ``T`` the same passes on absolute values,
``|A^T| [(|G| |w| |G^T|) * (|B^T| |x| |B|)] |A|`` summed over the channels. Where
``winograd`` applies (2-D, 3x3, stride and dilation 1) the bound adds, elementwise, the
largest ``2 * (C/group + R) * u * (T + |B|)`` of the tilings asked for (``winograd_tiles``,
by default both). :func:`error_bound` computes the bound; the tests and the calibration's
validation use it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...parallel import ThreadPool
from ...tuning.keys import ElementType as T
from ..base import NodeContext
from .algorithms import _Winograd
from .config import REFERENCE
from .kernel import ConvKernel
from .problem import _winograd_applies
from .winograd import TILINGS, Tiling

__all__ = ["error_bound"]


def error_bound(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, *, group: int = 1,
                compute_dtype: np.dtype | type = np.float32, output_dtype: np.dtype | type | None = None,
                reference: np.ndarray | None = None, winograd_tiles: Sequence[int] = tuple(TILINGS),
                **attributes: Any) -> np.ndarray:
    """The module's bound on ``|Y - Y_reference|`` for every output element.

    ``2 (K + 2) u (|W| * |X| + |B|)`` with ``u`` the unit roundoff of ``compute_dtype``, plus
    the winograd term of the tilings ``winograd_tiles`` (2: F(2x2, 3x3), 4: F(4x4, 3x3)) where
    winograd applies, plus one unit in the last place of ``output_dtype`` (at ``reference``)
    when it is narrower. ``attributes`` are the node's window attributes (``pads``,
    ``strides``, ...).
    """
    import ml_dtypes

    ctx = NodeContext("bound", "Conv", "", 22, dict(attributes, group=group),
                      (T.DOUBLE, T.DOUBLE, T.DOUBLE), (T.DOUBLE,), 3 if b is not None else 2, 1)
    kernel = ConvKernel(ctx).bind(ThreadPool(1))
    kernel.configure(REFERENCE)
    absolute_x, absolute_w = np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64))
    absolute_b = None if b is None else np.abs(b.astype(np.float64))
    magnitude = kernel.run(absolute_x, absolute_w, absolute_b)[0]
    depth = w.shape[1] * math.prod(w.shape[2:])
    u = float(ml_dtypes.finfo(compute_dtype).eps) / 2
    bound = 2 * (depth + 2) * u * magnitude
    if _winograd_applies(w.shape[2:], attributes.get("strides"), attributes.get("dilations")):
        terms = []
        for tile in winograd_tiles:
            tiling = TILINGS[tile]
            tiled = _winograd_magnitude(kernel, absolute_x, absolute_w, absolute_b, tiling)
            terms.append(2 * (w.shape[1] + tiling.roundings) * u * tiled)
        bound = bound + np.maximum.reduce(terms)
    if output_dtype is not None and np.dtype(output_dtype).itemsize < np.dtype(compute_dtype).itemsize:
        finfo = ml_dtypes.finfo(output_dtype)
        scale = np.abs(reference.astype(np.float64)) if reference is not None else magnitude
        bound = bound + 2 * float(finfo.eps) * scale + float(finfo.smallest_subnormal)
    return bound


def _winograd_magnitude(kernel: ConvKernel, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                        tiling: Tiling) -> np.ndarray:
    """``|A^T| [(|G| w |G^T|) * (|B^T| x |B|)] |A| + b`` summed over the channels, for every
    output (``x``, ``w`` and ``b`` non-negative float64): what the rounding errors of the
    winograd algorithm with ``tiling`` are relative to."""
    problem = dataclasses.replace(kernel.problem(x.shape, w.shape), algorithm="winograd", plan="serial")
    out = np.empty((problem.batch, problem.filters, *problem.window.output))
    if out.size:
        _Winograd(problem, x, w, b, out, 1 << 40, magnitudes=True, tiling=tiling).block(
            0, problem.batch * problem.groups, 0, problem.window.output[0])
    return out


