"""MatMul with its bias, at session construction (called by ``fusion.fuse``).

The pattern: ``Y = MatMul(A, B)`` (float32 or float64, A and B of rank 2 or more) whose
output only an ``Add`` reads, the Add's other operand a constant of Y's type holding one
value per column of Y (shape ``(N,)``, ``(1, N)``, ``(1, 1, N)``, ...: it broadcasts along
Y's last axis without enlarging Y). The MatMul step then adds the bias itself
(:attr:`~onnx_light.kernels.gemm.MatMulKernel.bias`) to each block of the product while it
is in cache, and writes the Add's output; an activation after it fuses into it in turn
(``fusion.fuse``, step 2). The sum is the one the Add computes (one rounding either way), so
the fused graph's values are the unfused graph's, bit for bit.

A small 2-D product of constant weights (at most :data:`~onnx_light.kernels.matmul_bias.SMALL_WORK`
multiply-adds by the inferred shapes) becomes a
:class:`~onnx_light.kernels.matmul_bias.MatMulBias` step instead: product and bias in one
compiled loop, so that a chain of tiny layers costs one call per layer (its sums are ordered
as written, so within a unit or so in the last place of BLAS's).

Bias Adds that an elementwise chain took first (GELU's, ``fusion.fuse`` step 5) stay there.

Then residual connections: ``Y = MatMul(A, B)`` (with or without its fused bias, no
activation) whose output only an ``Add(Y, R)`` (either order) reads, R not constant and of
Y's static shape and type, becomes one :class:`~onnx_light.kernels.matmul_bias.MatMulAdd`
step at the Add's place that adds R into the product in place and writes the Add's output:
the Add's value bit for bit.

Then the products' epilogues (:mod:`~onnx_light.kernels.product_epilogues`), both of
float32 MatMuls of constant 2-D weights the packed kernel multiplies: a fused GELU chain
(``GELU(Y + bias)`` or ``GELU(Y)``, erf or tanh form) that alone reads Y becomes one
``MatMulGelu`` step (the chain's bias packed with the weights), up to
:data:`GELU_EPILOGUE_MAXIMUM` output elements; a LayerNormalization over the last axis (float32,
Y alone, no Mean or InvStdDev) that alone reads a MatMulAdd step's output becomes one
``MatMulAddNorm`` step (a post-norm encoder's residual and normalization, BERT's and
DistilBERT's). Both give the values of the steps they replace bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from onnx import TensorProto

from ..kernels.base import Kernel
from ..kernels.compiled_elementwise import GELU
from ..kernels.elementwise import ElementwiseKernel
from ..kernels.fused_elementwise import FusedElementwise
from ..kernels.gemm import MatMulKernel
from ..kernels.matmul_bias import SMALL_WORK, MatMulAdd, MatMulBias
from ..kernels.normalization import LayerNormalization
from ..kernels.product_epilogues import MatMulAddNorm, MatMulGelu

__all__ = ["GELU_EPILOGUE_MAXIMUM", "fuse_matmul_bias"]

#: The largest product (output elements) whose GELU chain becomes the product's epilogue:
#: BERT's 64 x 1024 runs 2-4% faster as one step at one thread and as fast at two, ViT's
#: 197 x 3072 5% slower at both (the GELU on narrow blocks of the panels; docs/model-zoo.md,
#: "Encoders").
GELU_EPILOGUE_MAXIMUM = 1 << 17

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}

Slots = tuple[int | None, ...]
Step = tuple[Kernel, Slots, Slots]
Shapes = Mapping[int, Sequence[int | str | None]]


def fuse_matmul_bias(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
                     shapes: Shapes, sources: set[int]) -> list[Step]:
    """``steps`` with every MatMul and bias Add of the module's pattern made one step
    (``sources`` gets the bias constants)."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    producer = {s: i for i, (_, _, outputs) in enumerate(steps) for s in outputs if s is not None}
    result: list[Step | None] = list(steps)
    for position, (kernel, inputs, outputs) in enumerate(steps):
        if not (isinstance(kernel, ElementwiseKernel) and kernel.ctx.op_type == "Add"
                and len(inputs) == 2 and None not in inputs and kernel.epilogue is None):
            continue
        for y, c in (inputs, inputs[::-1]):
            index = producer.get(y)
            if index is None or y in keep or readers[y] != 1 or c not in known or result[index] is None:
                continue
            matmul, matmul_inputs, _ = steps[index]
            bias = _bias(matmul, matmul_inputs, known[c], shapes.get(y), shapes)
            if bias is not None:
                result[index] = None
                fused = (MatMulBias(dataclasses.replace(matmul.ctx, op_type=MatMulBias.op_type), matmul,
                                    bias).bind(matmul.pool)
                         if _small(matmul_inputs, known, shapes) else matmul.variant(bias=bias))
                result[position] = (fused, matmul_inputs, outputs)
                sources.add(c)
                break
    steps = _fuse_gelu([step for step in result if step is not None], known, keep, shapes, sources)
    return _fuse_norms(_fuse_residuals(steps, known, keep, shapes), known, keep, shapes)


def _packable(matmul: Kernel, inputs: Slots, known: Mapping[int, np.ndarray]) -> bool:
    """Whether ``matmul`` is a float32 MatMul of constant 2-D weights with neither an
    epilogue nor groups of columns (what a product's epilogue step takes)."""
    return (type(matmul) is MatMulKernel and matmul.epilogue is None and not matmul.split
            and len(inputs) == 2 and None not in inputs and inputs[1] in known
            and known[inputs[1]].ndim == 2 and known[inputs[1]].dtype == np.float32
            and matmul.ctx.output_types[:1] == (TensorProto.FLOAT,))


def _fuse_gelu(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
               shapes: Shapes, sources: set[int]) -> list[Step]:
    """``steps`` with every GELU chain (a fused ``GELU(Y)`` or ``GELU(Y + bias)``, either
    form) of the output Y of a product of constant float32 weights, which only it reads, of
    at most :data:`GELU_EPILOGUE_MAXIMUM` elements by the inferred shapes, made one
    :class:`~onnx_light.kernels.product_epilogues.MatMulGelu` step."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    producer = {s: i for i, (_, _, outputs) in enumerate(steps) for s in outputs if s is not None}
    result: list[Step | None] = list(steps)
    for position, (kernel, inputs, outputs) in enumerate(steps):
        form = kernel.program.gelu_form if isinstance(kernel, FusedElementwise) else None
        if form is None or None in inputs or len(inputs) != 1 + form[1]:
            continue
        for index_y, y in enumerate(inputs):
            index = producer.get(y)
            if index is None or y in keep or readers[y] != 1 or result[index] is None:
                continue
            matmul, matmul_inputs, _ = steps[index]
            y_shape = shapes.get(y)
            if (not _packable(matmul, matmul_inputs, known) or not y_shape
                    or not all(isinstance(d, int) for d in y_shape)
                    or math.prod(y_shape) > GELU_EPILOGUE_MAXIMUM):
                continue
            constant, product = None, matmul
            if form[1]:
                c = inputs[1 - index_y]
                bias = _bias(matmul, matmul_inputs, known[c], shapes.get(y), shapes) if c in known else None
                if bias is None:
                    continue
                constant, product = known[c], matmul.variant(bias=bias)
                sources.add(c)
            ctx = dataclasses.replace(matmul.ctx, op_type=MatMulGelu.op_type)
            operands = [0 if s == y else 1 for s in inputs]
            fused = MatMulGelu(ctx, product, form[0] != GELU, matmul, kernel, operands, constant)
            result[index] = None
            result[position] = (fused.bind(matmul.pool), matmul_inputs, outputs)
            break
    return [step for step in result if step is not None]


def _fuse_norms(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
                shapes: Shapes) -> list[Step]:
    """``steps`` with every LayerNormalization over the last axis (float32, Y alone, scale
    and shift of the normalized shape) of the output of a MatMulAdd step of constant float32
    weights, which only it reads, made one
    :class:`~onnx_light.kernels.product_epilogues.MatMulAddNorm` step."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    producer = {s: i for i, (_, _, outputs) in enumerate(steps) for s in outputs if s is not None}
    result: list[Step | None] = list(steps)
    for position, (kernel, inputs, outputs) in enumerate(steps):
        if (type(kernel) is not LayerNormalization or len(outputs) != 1 or len(inputs) not in (2, 3)
                or None in inputs or kernel.ctx.num_outputs != 1 or kernel.stash != np.float32):
            continue
        x = inputs[0]
        index, x_shape = producer.get(x), shapes.get(x)
        if (index is None or x in keep or readers[x] != 1 or result[index] is None or not x_shape
                or kernel.axis not in (-1, len(x_shape) - 1)):
            continue
        residual, residual_inputs, _ = steps[index]
        if (type(residual) is not MatMulAdd or not _packable(residual.matmul, residual_inputs[:2], known)
                or kernel.ctx.input_types[:1] != (TensorProto.FLOAT,)):
            continue
        ctx = dataclasses.replace(residual.ctx, op_type=MatMulAddNorm.op_type,
                                  num_inputs=3 + len(inputs) - 1,
                                  input_types=(*residual.ctx.input_types, *kernel.ctx.input_types[1:]))
        fused = MatMulAddNorm(ctx, residual, kernel).bind(residual.pool)
        result[index] = None
        result[position] = (fused, (*residual_inputs, *inputs[1:]), outputs)
    return [step for step in result if step is not None]


def _fuse_residuals(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
                    shapes: Shapes) -> list[Step]:
    """``steps`` with every MatMul and residual Add of the module's pattern made one step."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    producer = {s: i for i, (_, _, outputs) in enumerate(steps) for s in outputs if s is not None}
    result: list[Step | None] = list(steps)
    for position, (kernel, inputs, outputs) in enumerate(steps):
        if not (isinstance(kernel, ElementwiseKernel) and kernel.ctx.op_type == "Add"
                and len(inputs) == 2 and None not in inputs and inputs[0] != inputs[1]
                and kernel.epilogue is None and len(outputs) == 1):
            continue
        for y, r in (inputs, inputs[::-1]):
            index = producer.get(y)
            if index is None or y in keep or readers[y] != 1 or r in known or result[index] is None:
                continue
            matmul, matmul_inputs, _ = steps[index]
            y_shape, r_shape = shapes.get(y), shapes.get(r)
            if (type(matmul) is not MatMulKernel or matmul.epilogue is not None or matmul.split
                    or len(matmul_inputs) != 2 or None in matmul_inputs or not y_shape
                    or not all(isinstance(d, int) for d in y_shape) or r_shape is None
                    or tuple(r_shape) != tuple(y_shape) or matmul.ctx.output_types[:1] not in (
                        (TensorProto.FLOAT,), (TensorProto.DOUBLE,))
                    or kernel.ctx.input_types[:2] != matmul.ctx.output_types[:1] * 2):
                continue
            ctx = dataclasses.replace(matmul.ctx, op_type=MatMulAdd.op_type, num_inputs=3,
                                      input_types=(*matmul.ctx.input_types[:2], matmul.ctx.output_types[0]))
            result[index] = None
            result[position] = (MatMulAdd(ctx, matmul).bind(matmul.pool), (*matmul_inputs, r), outputs)
            break
    return [step for step in result if step is not None]


def _bias(matmul: Kernel, inputs: Slots, c: np.ndarray, y_shape: Sequence[int | str | None] | None,
          shapes: Shapes) -> np.ndarray | None:
    """``c`` as the (1, N) bias row of the MatMul, or None when the pattern does not hold."""
    if (type(matmul) is not MatMulKernel or matmul.bias is not None or matmul.epilogue is not None
            or len(inputs) != 2 or None in inputs or not y_shape):
        return None
    a_shape, b_shape = shapes.get(inputs[0]), shapes.get(inputs[1])
    columns = y_shape[-1]
    if (a_shape is None or b_shape is None or len(a_shape) < 2 or len(b_shape) < 2
            or not isinstance(columns, int) or c.ndim > len(y_shape) or c.size != columns
            or c.shape[-1:] != (columns,) or matmul.ctx.output_types[:1] != (_TYPES.get(c.dtype),)):
        return None
    bias = np.ascontiguousarray(c.reshape(1, columns))
    bias.flags.writeable = False
    return bias


def _small(inputs: Slots, known: Mapping[int, np.ndarray], shapes: Shapes) -> bool:
    """Whether the product is 2-D, of constant 2-D weights, and at most ``SMALL_WORK``
    multiply-adds by the inferred shapes (the MatMulBias loop's case)."""
    a, w = inputs
    weights = known.get(w)
    a_shape = known[a].shape if a in known else shapes.get(a)
    return (weights is not None and weights.ndim == 2 and a_shape is not None and len(a_shape) == 2
            and all(isinstance(d, int) for d in a_shape)
            and a_shape[0] * a_shape[1] * weights.shape[1] <= SMALL_WORK)
