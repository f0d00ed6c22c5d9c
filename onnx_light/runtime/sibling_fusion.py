"""Sibling products of one input made one product, at session construction (called last by
``fusion.fuse``).

The pattern: two or more MatMul steps (each with or without the bias the MatMul fusion gave
it, ``runtime/matmul_fusion.py``, and no activation) reading the same float32 A and each a
constant float32 matrix B of the same K rows: the query, key and value projections of a
transformer's attention. They become one MatMul step at the place of the first, reading A and
the siblings' weights, that multiplies A by the weights side by side (``W = [W1 W2 ...]``,
packed once at specialization, with the biases side by side) by the packed product
(:mod:`~onnx_light.kernels.packed_gemm`), and hands out its column groups as the siblings'
outputs (:attr:`~onnx_light.kernels.gemm.MatMulKernel.split`): views of one buffer, so one
call instead of several, large enough for the pool's threads to pay (docs/gemm.md). Each
column's sum is the one the sibling's own packed product computes (the packed kernel sums
every column in the same order whatever N), so the values are the unfused graph's bit for
bit. The siblings' weights are let go as any packed weights are (``MatMulKernel.packed_input``
rebuilds each from its columns of the panels).

A sibling whose output is a graph output stays as it is (a caller's output is never a view
of another value), and so do products the packed kernel cannot run (no AVX2) and siblings
that differ from the others in having a bias (a zero bias would turn -0 into +0).

Before that, the gated pair of a LLaMA-style MLP::

    G = MatMul(A, Wg) with the Swish epilogue   (SiLU: x * Sigmoid(x), fused by ``fusion.fuse``)
    U = MatMul(A, Wu)                           Wg, Wu constant float32 matrices of one shape
    Y = Mul(G, U)                               either order; G and U read by it alone

(with or without a fused bias on both) becomes one
:class:`~onnx_light.kernels.gated_matmul.GatedMatMul` step at the Mul's place, reading A, Wg
and Wu: one packed product over both weights side by side whose epilogue is ``swish(g) *
u`` (the values of the three steps it replaces, bit for bit).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from onnx import TensorProto

from ..kernels import packed_gemm
from ..kernels.base import Kernel
from ..kernels.compiled_activations import ACTIVATIONS, InPlace
from ..kernels.elementwise import ElementwiseKernel
from ..kernels.gated_matmul import GatedMatMul
from ..kernels.gemm import MatMulKernel

__all__ = ["fuse_siblings"]

Slots = tuple[int | None, ...]
Step = tuple[Kernel, Slots, Slots]


def fuse_siblings(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
                  sources: set[int]) -> list[Step]:
    """``steps`` with every group of sibling products made one step, reading A and the
    siblings' weights (``sources`` gets the weights)."""
    if not packed_gemm.available():
        return list(steps)
    steps = _fuse_gated(steps, known, keep, sources)
    groups: dict[tuple[int, int, bool], list[int]] = {}
    for position, (kernel, inputs, outputs) in enumerate(steps):
        if _sibling(kernel, inputs, outputs, known, keep):
            key = (inputs[0], known[inputs[1]].shape[0], kernel.bias is not None)
            groups.setdefault(key, []).append(position)
    result: list[Step | None] = list(steps)
    for positions in groups.values():
        if len(positions) < 2:
            continue
        members = [steps[p] for p in positions]
        first = members[0][0]
        bias = (None if first.bias is None
                else np.concatenate([kernel.bias for kernel, _, _ in members], axis=1))
        fused = first.variant(bias=bias, split=tuple(known[inputs[1]].shape[1] for _, inputs, _ in members))
        for p in positions:
            result[p] = None
        result[positions[0]] = (fused, (members[0][1][0], *(inputs[1] for _, inputs, _ in members)),
                                tuple(outputs[0] for _, _, outputs in members))
        sources.update(inputs[1] for _, inputs, _ in members)
    return [step for step in result if step is not None]


def _fuse_gated(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
                sources: set[int]) -> list[Step]:
    """``steps`` with every gated pair of the module's pattern made one GatedMatMul step."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    producer = {s: i for i, (_, _, outputs) in enumerate(steps) for s in outputs if s is not None}
    result: list[Step | None] = list(steps)
    for position, (kernel, inputs, outputs) in enumerate(steps):
        if (not isinstance(kernel, ElementwiseKernel) or kernel.ctx.op_type != "Mul"
                or kernel.epilogue is not None or len(inputs) != 2 or None in inputs
                or inputs[0] == inputs[1] or len(outputs) != 1
                or kernel.ctx.output_types[:1] != (TensorProto.FLOAT,)):
            continue
        for g, u in (inputs, inputs[::-1]):
            gate_at, up_at = producer.get(g), producer.get(u)
            if (gate_at is None or up_at is None or result[gate_at] is None or result[up_at] is None
                    or readers[g] != 1 or readers[u] != 1):
                continue
            gate, gate_inputs, gate_outputs = steps[gate_at]
            up, up_inputs, up_outputs = steps[up_at]
            alpha = _swish_alpha(gate)
            if (alpha is None or not _sibling(gate, gate_inputs, gate_outputs, known, keep, swish=True)
                    or not _sibling(up, up_inputs, up_outputs, known, keep)
                    or gate_inputs[0] != up_inputs[0] or (gate.bias is None) != (up.bias is None)
                    or known[gate_inputs[1]].shape != known[up_inputs[1]].shape):
                continue
            ctx = dataclasses.replace(gate.ctx, op_type=GatedMatMul.op_type, num_inputs=3,
                                      input_types=(TensorProto.FLOAT,) * 3, omitted_inputs=frozenset())
            fused = GatedMatMul(ctx, gate, up, alpha).bind(gate.pool)
            result[gate_at] = result[up_at] = None
            result[position] = (fused, (gate_inputs[0], gate_inputs[1], up_inputs[1]), outputs)
            sources.update((gate_inputs[1], up_inputs[1]))
            break
    return [step for step in result if step is not None]


def _swish_alpha(kernel: Kernel) -> float | None:
    """The alpha of the compiled Swish epilogue the step applies, or None."""
    epilogue = getattr(kernel, "epilogue", None)
    if isinstance(epilogue, InPlace) and epilogue.code == ACTIVATIONS["Swish"]:
        return epilogue.alpha
    return None


def _sibling(kernel: Kernel, inputs: Slots, outputs: Slots, known: Mapping[int, np.ndarray],
             keep: set[int], swish: bool = False) -> bool:
    """Whether the step is a float32 MatMul of a non-constant A by a constant float32 matrix,
    without an activation (with the Swish epilogue when ``swish``), whose one output is not a
    graph output."""
    if (type(kernel) is not MatMulKernel or (kernel.epilogue is not None) != swish or kernel.split
            or len(inputs) != 2 or None in inputs or inputs[0] in known or inputs[1] not in known
            or len(outputs) != 1 or outputs[0] is None or outputs[0] in keep
            or kernel.ctx.input_types[:1] != (TensorProto.FLOAT,)):
        return False
    w = known[inputs[1]]
    return w.dtype == np.float32 and w.ndim == 2
