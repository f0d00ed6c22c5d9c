"""Operator fusion at session construction: fewer passes over the activations.

Runs after constant folding, over the steps left to run, in graph order, once Casts to their
input's own type are dropped (``runtime/identity_casts.py``):

1. **Channel affine chains.** Inference BatchNormalization, and Mul, Add or Sub of X by a
   constant that varies along the channel axis (axis 1) only, each compute
   ``Y = X * m + o`` per channel. Consecutive ones (each the only reader of the previous
   one's output) compose into one ``(m, o)``, computed in float64. When the chain directly
   follows a Conv with constant weights whose output nothing else reads (and that adds no
   residual), the whole chain is folded into the weights and the bias once
   (``W' = W * m``, ``B' = B * m + o``, rounded once into the weights' type); otherwise it
   runs as one
   :class:`~onnx_light.kernels.normalization.ChannelAffine` step.
2. **Activations.** An op that can compute in place (Relu, Tanh, LeakyRelu; Clip, whose
   bounds must be constants: see
   ``ElementwiseOp.in_place``) whose input is read by it alone is applied to every block of
   its producer's output while the block is in cache, if the producer accepts an epilogue
   (Conv, BatchNormalization, ChannelAffine, the elementwise ops).
3. **Pre-activations.** A ``ChannelAffine`` step (with its activation) whose output only a
   1x1 convolution with constant weights reads becomes that convolution's
   :class:`~onnx_light.kernels.conv.Prologue`: DenseNet's BatchNormalization + Relu before
   each 1x1 convolution then runs on each thread's block of the input as the product reads
   it, instead of as a serial pass over the whole input.
4. **Residual additions.** An Add or Sum of two tensors of the same shape, one of them the
   output of a Conv that nothing else reads and the other made before that Conv runs,
   becomes the Conv's ``residual`` input: each finished block of the convolution gets the
   other tensor's elements added while it is in cache (ResNet's shortcuts), and a following
   activation then fuses as usual. The sum is the same (one rounding either way).

Before those, in this order:

0. **Attention, RMSNorm, rotary embeddings** (done first): ``MatMul(Q, K^T)``, a scale, an
   additive mask, Softmax and ``MatMul(P, V)`` over heads become one step
   (``runtime/attention_fusion.py`` states the pattern); RMSNorm and rotary embeddings
   written out in elementary nodes become one step each (``runtime/rmsnorm_fusion.py``,
   ``runtime/rotary_fusion.py``).
5. **Elementwise chains** (next, before step 2 can make their activations epilogues
   of the nodes before them). Consecutive float32 elementwise nodes that a compiled program can
   compute (``compiled_elementwise.PROGRAM_OPS``), each reading the previous one's output as
   its only reader, become one
   :class:`~onnx_light.kernels.fused_elementwise.FusedElementwise` step at the place of the
   chain's last node: one pass over memory instead of one per node (GELU's Div, Erf, Add,
   Mul, Mul with the bias Add before it; the tanh form of GELU with its Pow), when it holds
   an op that numpy computes slowly (``compiled_elementwise.FUSION_WORTH``: chains of cheap
   ops such as Sigmoid and Mul, or a bias Add and Relu, measured faster as numpy calls). A
   chain reads at most four tensors; one-element constants become constants of the program.
6. **MatMul bias** (then, before step 1, which would make the bias a ChannelAffine step): a
   MatMul whose output only an Add of a constant bias row reads adds the bias itself
   (``runtime/matmul_fusion.py``), and an activation after it then becomes its epilogue
   (step 2); a small 2-D product of constant weights (``matmul_bias.SMALL_WORK``
   multiply-adds by the inferred shapes) becomes one
   :class:`~onnx_light.kernels.matmul_bias.MatMulBias` step instead, one compiled loop;
   a MatMul (with its bias) whose output only an Add of another tensor of the same shape
   reads becomes one ``MatMulAdd`` step that adds it in place (a transformer's residual).
7. **Squeeze-and-excitation gates** (after steps 1-4, whose activations they take as
   epilogues): GlobalAveragePool and the two 1x1 convolutions after it become one
   :class:`~onnx_light.kernels.squeeze_excite.SqueezeExcite` step, one compiled call
   (``runtime/se_fusion.py`` states the pattern; the values are the unfused steps').
8. **Sibling products** (last): MatMuls of one input by constant weights (the query, key
   and value projections, with their biases) become one product over the weights side by
   side whose column groups are their outputs (``runtime/sibling_fusion.py``); a gate
   product with its SiLU, the up product of the same input and the Mul of their outputs
   (LLaMA's MLP) become one :class:`~onnx_light.kernels.gated_matmul.GatedMatMul` step.
9. **Quantized residual additions** (after them): a QLinearAdd of a QLinearConv's output
   becomes one step that adds it in the convolution's epilogue (``runtime/qlinear_fusion.py``).

Only float and double tensors are fused (chains: float32). A fused graph computes the same function with
different rounding: folding a chain into a Conv rounds the products ``W * m`` once, and a
composed chain rounds ``X * m + o`` once instead of after every node, so each output moves by
a few units in the last place of its terms (``W * X`` products, the per-channel parameters);
activations fuse exactly. A chain keeps its intermediates in float64 and rounds once, so its
output is within a float32 unit or two of the node-by-node result (and closer to the exact
one). ``RuntimeSession(..., fuse=False)`` runs the graph as written.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from ..kernels.base import Kernel
from ..kernels.compiled_activations import in_place
from ..kernels.compiled_elementwise import (
    ADD,
    FUSION_WORTH,
    MAX_INPUTS,
    MUL,
    PROGRAM_OPS,
    Program,
    emit,
)
from ..kernels.conv import ConvKernel, Prologue
from ..kernels.elementwise import ElementwiseKernel, default_minimum_elements
from ..kernels.fused_elementwise import FusedElementwise
from ..kernels.normalization import BatchNormalization, ChannelAffine, batch_norm_affine
from .attention_fusion import fuse_attention
from .identity_casts import drop_identity_casts
from .matmul_fusion import fuse_matmul_bias
from .qlinear_fusion import fuse_qlinear_add
from .rmsnorm_fusion import fuse_rms_norm
from .rotary_fusion import fuse_rotary
from .se_fusion import fuse_squeeze_excite
from .sibling_fusion import fuse_siblings

__all__ = ["FusionResult", "fuse"]

FUSED_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE)

Slots = tuple[int | None, ...]
Step = tuple[Kernel, Slots, Slots]


@dataclass
class FusionResult:
    """The fused steps, the constants they added (slot -> array) and the constant slots the
    fusion read (a run that overrides one of them must take the unfused plan). Every fused
    node is one step fewer."""

    steps: list[Step]
    constants: dict[int, np.ndarray]
    sources: set[int]


@dataclass(frozen=True)
class _Affine:
    """One node as ``Y = X * multiplier + offset`` per channel; ``constants`` its parameter slots."""

    x: int
    multiplier: np.ndarray
    offset: np.ndarray
    constants: tuple[int, ...]


def fuse(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
         shapes: Mapping[int, Sequence[int | str | None]],
         add_constant: Callable[[np.ndarray], int]) -> FusionResult:
    """Fuse ``steps`` (kernel, input slots, output slots, in graph order).

    ``known`` holds the constant values by slot, ``keep`` the slots that must stay observable
    (graph outputs), ``shapes`` the inferred shapes by slot, and ``add_constant`` stores a new
    constant and returns its slot.
    """
    sources: set[int] = set()
    steps = drop_identity_casts(steps, keep)
    steps = fuse_attention(steps, known, keep, shapes, sources)
    steps = fuse_rms_norm(steps, known, keep, shapes, sources)
    steps, caches = fuse_rotary(steps, known, keep, shapes, sources, add_constant)
    steps = _fuse_chains(steps, known, keep, shapes, sources)
    steps = fuse_matmul_bias(steps, known, keep, shapes, sources)
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    known = {**known, **caches}  # and the constants fusion adds
    result: list[list] = []
    producer: dict[int, int] = {}
    added: dict[int, np.ndarray] = dict(caches)
    pending: dict[int, _ConvFold] = {}  # result index -> the affine map its Conv's weights take

    def private(slot: int) -> int | None:
        """The result index of the step whose only output ``slot`` is read by one step only."""
        index = producer.get(slot)
        if index is None or slot in keep or readers[slot] != 1:
            return None
        outputs = result[index][2]
        return index if len(outputs) == 1 and outputs[0] == slot else None

    def absorb(index: int, kernel: Kernel, inputs: Slots, outputs: Slots) -> None:
        result[index][0:3] = [kernel, inputs, outputs]
        for s in outputs:
            if s is not None:
                producer[s] = index

    for kernel, inputs, outputs in steps:
        affine = _affine(kernel, inputs, known, shapes)
        if affine is not None:
            index = private(affine.x)
            previous = result[index][0] if index is not None else None
            if isinstance(previous, ConvKernel) and previous.epilogue is None and not previous.residual:
                fold = pending.get(index) or _ConvFold.of(result[index][1], known)
                if fold is not None and fold.takes(affine):
                    pending[index] = fold.then(affine)
                    sources.update(fold.used, affine.constants)
                    absorb(index, previous, result[index][1], outputs)
                    continue
            if isinstance(previous, ChannelAffine) and previous.epilogue is None:
                composed = ChannelAffine(previous.ctx, previous.multiplier * affine.multiplier,
                                         previous.offset * affine.multiplier + affine.offset
                                         ).bind(previous.pool)
                sources.update(affine.constants)
                absorb(index, composed, result[index][1], outputs)
                continue
            replacement = ChannelAffine(dataclasses.replace(kernel.ctx, op_type="ChannelAffine"),
                                        affine.multiplier, affine.offset).bind(kernel.pool)
            sources.update(affine.constants)
            kernel, inputs = replacement, (affine.x,)
        elif isinstance(kernel, ConvKernel) and len(inputs) > 1 and inputs[0] is not None:
            index = private(inputs[0])
            previous = result[index][0] if index is not None else None
            w = known.get(inputs[1])
            scaled = _channel_scale(kernel, inputs, w, previous,
                                    result[index][1] if previous is not None else (), shapes)
            if scaled is not None:
                kernel, inputs = scaled
                result[index] = None  # the scaling runs inside the convolution now
            elif (isinstance(previous, ChannelAffine) and kernel.prologue is None
                    and w is not None and kernel.accepts_prologue(w.shape)
                    and {previous.multiplier.size, previous.offset.size} <= {1, w.shape[1] * kernel.group}):
                kernel = kernel.variant(prologue=Prologue(previous.multiplier, previous.offset,
                                                          previous.epilogue))
                inputs = (result[index][1][0], *inputs[1:])
                result[index] = None  # the affine step runs inside the convolution now
        elif (isinstance(kernel, ElementwiseKernel) and kernel.ctx.op_type in ("Add", "Sum")
              and (fused := _residual(inputs, outputs, private, producer, result, shapes)) is not None):
            index, conv, conv_inputs = fused
            absorb(index, conv, conv_inputs, outputs)
            continue
        elif (isinstance(kernel, ElementwiseKernel) and kernel.ctx.op_type == "Mul"
              and (gated := _silu(inputs, keep, readers, producer, result)) is not None):
            index, epilogue = gated
            absorb(index, result[index][0].variant(epilogue=epilogue), result[index][1], outputs)
            continue
        elif (isinstance(kernel, ElementwiseKernel) and inputs and inputs[0] is not None
              and all(s is None or s in known for s in inputs[1:])):
            index = private(inputs[0])
            if index is not None:
                previous = result[index][0]
                element_type = previous.ctx.output_types[0] if previous.ctx.output_types else None
                constants = [None if s is None else known[s] for s in inputs[1:]]
                function = (kernel.in_place_function(element_type, constants)
                            if previous.accepts_epilogue and previous.epilogue is None
                            and element_type in FUSED_TYPES else None)
                if function is not None:
                    extra = {}
                    if isinstance(previous, ConvKernel):
                        extra["clamp"] = _clamp(kernel, constants)
                    # the unfused plan keeps the original
                    with_epilogue = previous.variant(epilogue=function, **extra)
                    absorb(index, with_epilogue, result[index][1], outputs)
                    continue
        result.append([kernel, inputs, outputs])
        for s in outputs:
            if s is not None:
                producer[s] = len(result) - 1
    for index, fold in pending.items():  # each Conv's weights and bias made once
        made = []
        for array in fold.weights(known):
            array.flags.writeable = False
            made.append(add_constant(array))
            added[made[-1]] = array
        conv_inputs = result[index][1]
        result[index][1] = (conv_inputs[0], *made, *conv_inputs[3:])
    steps_out: list[Step] = [(k, i, o) for k, i, o in filter(None, result)]
    steps_out = fuse_squeeze_excite(steps_out, known, keep, shapes, sources)
    steps_out = fuse_siblings(steps_out, known, keep, sources)
    steps_out = fuse_qlinear_add(steps_out, keep, shapes)
    return FusionResult(steps_out, added, sources)


@dataclass
class _Chain:
    """A chain of elementwise nodes being built into one program."""

    program: Program
    input_slots: list[int]
    registers: dict[int, int]  # slot -> register: the inputs and every node's output
    result: int  # the register of the last node's output
    nodes: list[Step]
    positions: list[int]  # the nodes' places in the step list
    folded: dict[int, np.ndarray]  # one-element constants the program holds as constants

    @staticmethod
    def start(step: Step, position: int, known: Mapping[int, np.ndarray],
              shapes: Mapping[int, Sequence[int | str | None]]) -> _Chain | None:
        return _Chain(Program(), [], {}, -1, [], [], {}).extend(step, position, known, shapes)

    def extend(self, step: Step, position: int, known: Mapping[int, np.ndarray],
               shapes: Mapping[int, Sequence[int | str | None]]) -> _Chain | None:
        """This chain with ``step`` appended, or None when a program cannot compute it."""
        kernel, inputs, outputs = step
        chain = _Chain(self.program.copy(), list(self.input_slots), dict(self.registers),
                       self.result, [*self.nodes, step], [*self.positions, position],
                       dict(self.folded))
        program = chain.program
        out_shape = shapes.get(outputs[0])
        operands, values = [], []
        for slot in inputs:
            value = known.get(slot)
            values.append(value)
            if slot in chain.registers:
                operands.append(chain.registers[slot])
            elif (value is not None and value.size == 1 and value.dtype.kind in "fiu"
                  and (value.ndim == 0 or (out_shape is not None and value.ndim <= len(out_shape)))):
                operands.append(program.constant(float(value.reshape(-1)[0])))
                chain.folded[slot] = value
            elif len(chain.input_slots) < MAX_INPUTS:
                chain.registers[slot] = register = program.load(len(chain.input_slots))
                chain.input_slots.append(slot)
                operands.append(register)
            else:
                return None
        if isinstance(kernel, ChannelAffine):  # x * m + o, one value each (see _chainable)
            scaled = program.binary(MUL, operands[0], program.constant(float(kernel.multiplier[0])))
            result = program.binary(ADD, scaled, program.constant(float(kernel.offset[0])))
        else:
            result = emit(program, kernel.ctx.op_type, operands, dict(kernel.attributes), values)
        if result is None:
            return None
        chain.result = chain.registers[outputs[0]] = result
        return chain

    def feeds_only(self, step: Step, readers: Mapping[int, int], keep: set[int]) -> bool:
        """Whether ``step`` alone reads this chain's output and nothing outside reads its
        intermediate values."""
        output = self.nodes[-1][2][0]
        return (output not in keep and readers[output] == step[1].count(output)
                and self.closed(readers, keep))

    def join(self, other: _Chain, known: Mapping[int, np.ndarray],
             shapes: Mapping[int, Sequence[int | str | None]]) -> _Chain | None:
        """This chain with ``other``'s nodes appended (replayed on this program), or None."""
        chain: _Chain | None = self
        for node, position in zip(other.nodes, other.positions, strict=True):
            chain = chain.extend(node, position, known, shapes)
            if chain is None:
                return None
        return chain

    def worth(self) -> bool:
        """Whether the chain holds an op that makes the program faster than numpy's calls."""
        return any(kernel.ctx.op_type in FUSION_WORTH for kernel, _, _ in self.nodes)

    def closed(self, readers: Mapping[int, int], keep: set[int]) -> bool:
        """Whether nothing outside the chain reads a value made inside it but its output."""
        inside = Counter(s for _, inputs, _ in self.nodes for s in inputs)
        return all(s not in keep and readers[s] == inside[s]
                   for _, _, outputs in self.nodes[:-1] for s in outputs)

    def step(self) -> Step:
        """The chain as one FusedElementwise step, tuned as its node of the smallest portable
        threshold (the most expensive op; the first such in graph order) that is not a Pow:
        the session's tuning step configures it from that node's key (a worthy chain holds an
        elementwise node). A program computes Pow only as products or a square root
        (``compiled_elementwise._POWERS``), while Pow's key is timed on numpy's general
        power, many times dearer: tuned as its Pow, GPT-2's GELU-tanh chain ran as a
        two-thread region at 65536 elements, 1.6x slower than serially (docs/elementwise.md,
        "Two threads")."""
        first = self.nodes[0][0]
        ctx = dataclasses.replace(first.ctx, op_type=FusedElementwise.op_type,
                                  num_inputs=len(self.input_slots))
        elementwise = [k for k, _, _ in self.nodes if isinstance(k, ElementwiseKernel)]
        priced = [k for k in elementwise if k.ctx.op_type != "Pow"] or elementwise
        tuned = min(priced, key=lambda k: default_minimum_elements(k.op, k.element_type))
        kernel = FusedElementwise(ctx, self.program.finish(self.result), tuple(self.input_slots),
                                  self.nodes, self.folded, tuned).bind(first.pool)
        return kernel, tuple(self.input_slots), self.nodes[-1][2]


def _chainable(kernel: Kernel, inputs: Slots, outputs: Slots, known: Mapping[int, np.ndarray]) -> bool:
    """Whether a node may be part of an elementwise chain: one float32 output, every input
    given, and an elementwise op of the default domain that a program computes (or a
    one-value ChannelAffine, what step 1 made of a Mul or Add by a scalar)."""
    ctx = kernel.ctx
    if (kernel.epilogue is not None or len(outputs) != 1 or outputs[0] is None or None in inputs
            or ctx.output_types[:1] != (TensorProto.FLOAT,) or ctx.domain not in ("", "ai.onnx")):
        return False
    if isinstance(kernel, ChannelAffine):
        return kernel.multiplier.size == 1 and kernel.offset.size == 1
    return (isinstance(kernel, ElementwiseKernel) and ctx.op_type in PROGRAM_OPS
            and all(t == TensorProto.FLOAT or s in known
                    for s, t in zip(inputs, ctx.input_types, strict=False)))


def _fuse_chains(steps: Sequence[Step], known: Mapping[int, np.ndarray], keep: set[int],
                 shapes: Mapping[int, Sequence[int | str | None]], sources: set[int]) -> list[Step]:
    """Step 5 of the module docstring (run before the others): chains of two or more
    elementwise nodes become one FusedElementwise step each, at the place of their last node
    (``sources`` gets the constants the programs hold). A node joins the chain that made one
    of its inputs; a chain whose intermediate values something outside it reads stays as it
    was."""
    readers = Counter(s for _, inputs, _ in steps for s in inputs if s is not None)
    chains: list[_Chain | None] = []
    chain_of: dict[int, int] = {}  # slot -> the chain whose node made it
    for position, step in enumerate(steps):
        kernel, inputs, outputs = step
        if not _chainable(kernel, inputs, outputs, known):
            continue
        chain = None
        candidates = list(dict.fromkeys(chain_of[s] for s in inputs if s in chain_of))
        for index in candidates:
            # Another chain whose output only this node reads joins first (GPT-2's GELU: the
            # x * 0.5 and the tanh chain meet in the last Mul), so that one program holds both.
            joined, base = [], chains[index]
            for other in candidates:
                if other != index and base is not None and chains[other].feeds_only(step, readers, keep):
                    merged = base.join(chains[other], known, shapes)
                    if merged is not None:
                        base = merged
                        joined.append(other)
            chain = base.extend(step, position, known, shapes) if base is not None else None
            if chain is not None:
                chains[index] = chain
                for other in joined:
                    chains[other] = None
                    chain_of.update({s: index for s, i in chain_of.items() if i == other})
                break
        if chain is None:
            chain = _Chain.start(step, position, known, shapes)
            if chain is None:
                continue
            chains.append(chain)
            index = len(chains) - 1
        chain_of[outputs[0]] = index
    result: list[Step | None] = list(steps)
    for chain in filter(None, chains):
        if len(chain.nodes) > 1 and chain.worth() and chain.closed(readers, keep):
            for position in chain.positions[:-1]:
                result[position] = None
            result[chain.positions[-1]] = chain.step()
            sources.update(chain.folded)
    return [step for step in result if step is not None]


def _residual(inputs: Slots, outputs: Slots, private: Callable[[int], int | None],
              producer: Mapping[int, int], result: list[list],
              shapes: Mapping[int, Sequence[int | str | None]]) -> tuple[int, Kernel, Slots] | None:
    """For ``a + b`` (same static shapes, float types): the result index of the Conv that
    makes one operand and reads nothing else into an epilogue, a copy of it that adds the
    other operand as its residual, and its new inputs; or None."""
    if len(inputs) != 2 or None in inputs or len(outputs) != 1 or inputs[0] == inputs[1]:
        return None
    shape = shapes.get(outputs[0])
    if (shape is None or not all(isinstance(d, int) for d in shape)
            or any(shapes.get(s) != shape for s in inputs)):
        return None
    for mine, other in (inputs, inputs[::-1]):
        index = private(mine)
        conv = result[index][0] if index is not None else None
        if (not isinstance(conv, ConvKernel) or conv.epilogue is not None or conv.residual
                or not conv.ctx.output_types or conv.ctx.output_types[0] not in FUSED_TYPES
                or producer.get(other, -1) > index):  # the other operand comes later
            continue
        fused = conv.variant(residual=True)  # the unfused plan keeps the original
        conv_inputs = result[index][1]
        bias = conv_inputs[2] if len(conv_inputs) > 2 else None
        return index, fused, (conv_inputs[0], conv_inputs[1], bias, other, *conv_inputs[4:])
    return None


def _clamp(kernel: Kernel, constants: Sequence[np.ndarray | None]) -> tuple[float, float] | None:
    """The activation as the bounds of a clamp (Relu, Clip with constant bounds), or None."""
    op_type = kernel.ctx.op_type
    if op_type == "Relu":
        return 0.0, math.inf
    if op_type != "Clip":
        return None
    attributes = kernel.attributes if isinstance(kernel, ElementwiseKernel) else {}
    bounds = [attributes.get("min"), attributes.get("max")] if not constants else [*constants, None]
    low, high = bounds[0], bounds[1]
    if any(b is not None and np.asarray(b).size != 1 for b in (low, high)):
        return None
    return (-math.inf if low is None else float(np.asarray(low).reshape(-1)[0]),
            math.inf if high is None else float(np.asarray(high).reshape(-1)[0]))


def _silu(inputs: Slots, keep: set[int], readers: Mapping[int, int], producer: Mapping[int, int],
          result: list[list]) -> tuple[int, Callable[[np.ndarray], None]] | None:
    """For ``x * Sigmoid(x)`` (SiLU as exporters write it; the Sigmoid read by this Mul only,
    ``x`` by the two of them): the result index of the step that makes ``x``, when it takes an
    epilogue and has none, and the in-place SiLU (the Sigmoid's step is dropped); or None."""
    if len(inputs) != 2 or None in inputs or inputs[0] == inputs[1]:
        return None
    for gate, x in (inputs, inputs[::-1]):
        sigmoid_index, index = producer.get(gate), producer.get(x)
        if sigmoid_index is None or index is None or result[sigmoid_index] is None or result[index] is None:
            continue
        sigmoid, sigmoid_inputs, sigmoid_outputs = result[sigmoid_index]
        previous, _, previous_outputs = result[index]
        if (not isinstance(sigmoid, ElementwiseKernel) or sigmoid.ctx.op_type != "Sigmoid"
                or tuple(sigmoid_inputs) != (x,) or tuple(sigmoid_outputs) != (gate,)
                or readers[gate] != 1 or readers[x] != 2 or gate in keep or x in keep
                or tuple(previous_outputs) != (x,) or not previous.accepts_epilogue
                or previous.epilogue is not None or not previous.ctx.output_types):
            continue
        element_type = previous.ctx.output_types[0]
        function = sigmoid.in_place_function(element_type) if element_type in FUSED_TYPES else None
        if function is None:
            continue
        result[sigmoid_index] = None
        swish = _swish(function)
        if element_type == TensorProto.FLOAT:  # one compiled pass
            swish = in_place("Swish", {"alpha": 1.0}, swish) or swish
        return index, swish
    return None


def _swish(sigmoid: Callable[[np.ndarray], None]) -> Callable[[np.ndarray], None]:
    """``x * sigmoid(x)`` in place with the Sigmoid's and the Mul's operations (the double
    type, and float blocks of a layout the compiled pass does not take)."""

    def swish(block: np.ndarray) -> None:
        gate = block.copy()
        sigmoid(gate)
        np.multiply(block, gate, out=block)

    return swish


def _channel_scale(conv: ConvKernel, inputs: Slots, w: np.ndarray | None, previous: Kernel | None,
                   previous_inputs: Slots, shapes: Mapping[int, Sequence[int | str | None]]
                   ) -> tuple[ConvKernel, Slots] | None:
    """Squeeze-and-excitation's ``x * s`` (``s`` one value per image and channel, shape
    (N, C, 1, ...)) read only by a 1x1 convolution with constant weights: the convolution
    with the scale as an input (``ConvKernel.channel_scale``: it scales the weights' input
    channels instead of ``x``) and its new inputs (x, W, B, no residual, s); or None."""
    if (not isinstance(previous, ElementwiseKernel) or previous.ctx.op_type != "Mul"
            or w is None or w.ndim < 3 or any(k != 1 for k in w.shape[2:])
            or conv.prologue is not None or conv.channel_scale or conv.residual
            or not conv.ctx.output_types or conv.ctx.output_types[0] not in FUSED_TYPES
            or len(previous_inputs) != 2 or None in previous_inputs):
        return None
    for x, s in (previous_inputs, previous_inputs[::-1]):
        x_shape, s_shape = shapes.get(x), shapes.get(s)
        if (x_shape is None or s_shape is None or len(x_shape) != w.ndim or len(s_shape) != w.ndim
                or not all(isinstance(d, int) for d in (*x_shape, *s_shape))):
            continue
        if (s_shape[:2] == x_shape[:2] and all(d == 1 for d in s_shape[2:])
                and any(d != 1 for d in x_shape[2:])):
            bias = inputs[2] if len(inputs) > 2 else None
            return conv.variant(channel_scale=True), (x, inputs[1], bias, None, s)
    return None


def _affine(kernel: Kernel, inputs: Slots, known: Mapping[int, np.ndarray],
            shapes: Mapping[int, Sequence[int | str | None]]) -> _Affine | None:
    """The node as a per-channel affine map of its one non-constant input, or None."""
    ctx = kernel.ctx
    if ctx.domain not in ("", "ai.onnx") or ctx.num_outputs != 1:
        return None
    if not ctx.output_types or ctx.output_types[0] not in FUSED_TYPES:
        return None
    if isinstance(kernel, BatchNormalization):
        parameters = [known.get(s) if s is not None else None for s in inputs[1:]]
        if (kernel.training or len(inputs) != 5 or inputs[0] is None or inputs[0] in known
                or any(p is None or p.ndim != 1 for p in parameters)):
            return None
        multiplier, offset = batch_norm_affine(*parameters, kernel.epsilon, np.float64)
        return _Affine(inputs[0], multiplier, offset, tuple(inputs[1:]))
    if ctx.op_type not in ("Mul", "Add", "Sub") or len(inputs) != 2 or None in inputs:
        return None
    variable = [i for i in (0, 1) if inputs[i] not in known]
    if len(variable) != 1:
        return None
    v = variable[0]
    x, c = inputs[v], known[inputs[1 - v]]
    per_channel = _per_channel(c, shapes.get(x))
    if per_channel is None:
        return None
    # A Mul's offset is -0.0, which leaves every product as it is (+0.0 would turn -0.0
    # into +0.0), so that ChannelAffine may skip adding it: the Mul's values, bit for bit.
    one, zero = np.ones(1), np.full(1, -0.0)
    multiplier, offset = {
        "Mul": (per_channel, zero),
        "Add": (one, per_channel),
        "Sub": (one, -per_channel) if v == 0 else (-one, per_channel),
    }[ctx.op_type]
    return _Affine(x, multiplier, offset, (inputs[1 - v],))


def _per_channel(c: np.ndarray, x_shape: Sequence[int | str | None] | None) -> np.ndarray | None:
    """``c`` as float64 values along axis 1 of X (shape (1,) or (C,)), when broadcasting it
    against X leaves X's shape unchanged and varies along axis 1 only; else None."""
    if x_shape is None or c.dtype.kind != "f" or c.dtype.itemsize < 4:
        return None
    rank = len(x_shape)
    if rank < 2 or c.ndim > rank:
        return None
    padded = c.shape if c.ndim == rank else (1,) * (rank - c.ndim) + c.shape
    if any(extent != 1 for axis, extent in enumerate(padded) if axis != 1):
        return None
    if padded[1] != 1 and x_shape[1] != padded[1]:
        return None  # X's channel count is unknown or differs: the output could grow
    return c.astype(np.float64).reshape(-1)


@dataclass(frozen=True)
class _ConvFold:
    """An affine map ``Y * multiplier + offset`` (float64, one value per filter) on the output
    of a Conv with constant weights (``w``) and bias (``b``, or None), folded into new weights
    and bias once the chain after the Conv is known: ``W' = W * m``, ``B' = B * m + o``."""

    w: int
    b: int | None
    filters: int
    multiplier: np.ndarray
    offset: np.ndarray

    @staticmethod
    def of(conv_inputs: Slots, known: Mapping[int, np.ndarray]) -> _ConvFold | None:
        """The identity map on a Conv whose weights and bias are constants that can take one."""
        if len(conv_inputs) < 2 or conv_inputs[1] not in known:
            return None
        w = known[conv_inputs[1]]
        b = conv_inputs[2] if len(conv_inputs) > 2 else None
        if (b is not None and b not in known) or w.dtype not in (np.float32, np.float64) or w.ndim < 3:
            return None
        filters = w.shape[0]
        return _ConvFold(conv_inputs[1], b, filters, np.ones(filters), np.zeros(filters))

    @property
    def used(self) -> tuple[int, ...]:
        """The constant slots the folded weights and bias are made from."""
        return (self.w,) if self.b is None else (self.w, self.b)

    def takes(self, affine: _Affine) -> bool:
        """Whether ``affine`` has one value or one per filter."""
        return {affine.multiplier.size, affine.offset.size} <= {1, self.filters}

    def then(self, affine: _Affine) -> _ConvFold:
        """This map followed by ``affine``."""
        return dataclasses.replace(self, multiplier=self.multiplier * affine.multiplier,
                                   offset=self.offset * affine.multiplier + affine.offset)

    def weights(self, known: Mapping[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The new weights and bias, each product computed in float64 and rounded once into
        the weights' type."""
        w = known[self.w]
        new_w = np.empty_like(w)
        np.multiply(w, self.multiplier.reshape((self.filters,) + (1,) * (w.ndim - 1)), out=new_w,
                    dtype=np.float64, casting="same_kind")
        bias = np.zeros(self.filters) if self.b is None else known[self.b].astype(np.float64)
        return new_w, (bias * self.multiplier + self.offset).astype(w.dtype)
