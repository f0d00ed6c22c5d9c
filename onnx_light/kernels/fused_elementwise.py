"""FusedElementwise: a chain of elementwise nodes run as one compiled program.

Not an ONNX operator: ``runtime/fusion.py`` makes one of a chain of float32 elementwise nodes
whose intermediate values nothing else reads (GELU's Div, Erf, Add, Mul, Mul; a bias Add and
its activation; Sigmoid and the Mul by its input). The program
(:mod:`~onnx_light.kernels.compiled_elementwise`) reads each input once and writes the output
once, with every intermediate in float64 registers. When the inputs at run time are not
float32, or broadcast in a way the program does not take, the node runs its original kernels
one after another instead: the same function, computed as the graph wrote it.

The step is tuned as the chain's node it stands for (``tuned``, chosen by ``runtime/fusion.py``:
the one whose op has the smallest portable ``parallel.minimum_elements``, the most expensive):
the session's tuning step resolves that node's key and configures the step with its values,
which the program reads at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from ..tuning.schema import KernelTuningSchema, Value
from .base import Kernel, NodeContext, Prepared, TensorSpec
from .compiled_elementwise import CompiledProgram, broadcast
from .elementwise import ElementwiseKernel

__all__ = ["FusedElementwise"]

Slots = tuple[int | None, ...]


class FusedElementwise(Kernel):
    """``program`` over ``inputs`` (slots); ``nodes`` (kernel, input slots, output slots) and
    ``constants`` (slot -> value) are the original chain, run when the program cannot be;
    ``tuned`` (one of the nodes' kernels) gives the step its key and its
    ``parallel.minimum_elements``."""

    op_type: ClassVar[str] = "FusedElementwise"
    accepts_epilogue: ClassVar[bool] = False

    def __init__(self, ctx: NodeContext, program: CompiledProgram, inputs: Slots,
                 nodes: Sequence[tuple[Kernel, Slots, Slots]],
                 constants: Mapping[int, np.ndarray], tuned: ElementwiseKernel) -> None:
        super().__init__(ctx)
        self.program = program
        self.input_slots = inputs
        self.nodes = tuple(nodes)
        self.constants = dict(constants)
        self.tuned = tuned

    def tuning_schema(self) -> KernelTuningSchema | None:
        """The tuned node's schema: the session resolves and checks its values for this step."""
        return self.tuned.tuning_schema()

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.tuned._configure(values)

    @property
    def minimum_elements(self) -> int:
        """The tuned node's configured ``parallel.minimum_elements``."""
        return self.tuned.minimum_elements

    @property
    def node_types(self) -> tuple[str, ...]:
        """The op types of the fused nodes, in graph order."""
        return tuple(kernel.ctx.op_type for kernel, _, _ in self.nodes)

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile the program now, at session construction (a warm cache loads it)."""
        self.program.compile(parallel=self.num_threads > 1)
        return None

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The program writing into the memory plan's buffer, for float32 inputs of these
        shapes broadcast as the program takes them (what :meth:`run` computes for them);
        None otherwise (the original chain may run)."""
        if len(inputs) != len(self.input_slots) or any(d != np.float32 for _, d in inputs):
            return None
        try:
            shape = np.broadcast_shapes(*(s for s, _ in inputs))
        except ValueError:
            return None
        if any(broadcast(s, shape) is None for s, _ in inputs):
            return None
        program, threads, minimum = self.program, self.num_threads, self.minimum_elements

        def prepared(*operands: np.ndarray, out: np.ndarray) -> None:
            program.run(operands, threads, minimum, out=out)

        return Prepared(prepared, tuple(shape), np.dtype(np.float32))

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        arrays = [x for x in inputs if isinstance(x, np.ndarray)]
        if len(arrays) == len(inputs):
            out = self.program.run(arrays, self.num_threads, self.minimum_elements)
            if out is not None:
                return [out]
        values: dict[int | None, np.ndarray | None] = {None: None, **self.constants}
        values.update(zip(self.input_slots, inputs, strict=True))
        for kernel, node_inputs, node_outputs in self.nodes:
            results = kernel.run(*(values[s] for s in node_inputs))
            values.update(zip(node_outputs, results, strict=False))
        return [values[self.nodes[-1][2][0]]]
