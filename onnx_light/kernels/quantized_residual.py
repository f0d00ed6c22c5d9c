"""A QLinearConv and the QLinearAdd that alone reads its output, as one step: the residual
connection of a quantized ResNet or MobileNetV2 block (the runtime's fusion makes it:
``runtime/qlinear_fusion.py``).

The convolution writes its requantized bytes as it always does, and the addition is applied
to each strip of them while they are in cache
(:func:`~onnx_light.kernels.integer_loops.add_residual`, called by the packed product's
loop), instead of by a second pass over the whole output: QLinearAdd's arithmetic on the
convolution's bytes and the residual's, so the fused step's output is the unfused pair's, bit
for bit (no other rounding: the convolution's output byte is still rounded and saturated
before it is added). A convolution whose path has no such loop (depthwise, the swapped
product, the ``blas`` and ``compiled`` algorithms) adds the residual in one compiled pass
after it (:func:`~onnx_light.kernels.quantized_products.add_whole`); a run the fused
arithmetic does not cover (fed scales or zero points, a residual of another shape or type,
scales whose ratios are not finite) runs the two kernels one after the other.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..parallel import ThreadPool
from ..tuning.schema import KernelTuningSchema, Value
from .base import Kernel, NodeContext
from .contrib.qlinear import QLinearAdd
from .integer_loops import add_residual
from .quantized_products import QLinearConv, add_whole

__all__ = ["CONV_INPUTS", "QLinearConvAdd"]

#: Inputs of the convolution in the fused step (X to B, absent ones None); the addition's
#: eight follow, the convolution's output among them left None.
CONV_INPUTS = 9
_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))


class QLinearConvAdd(Kernel):
    """``add`` (a QLinearAdd) of ``conv``'s output (a QLinearConv; the addition's input at
    ``position``, 0 or 3) and another tensor of its shape. The step is tuned as the
    convolution."""

    op_type: ClassVar[str] = "QLinearConvAdd"

    def __init__(self, ctx: NodeContext, conv: QLinearConv, add: QLinearAdd, position: int) -> None:
        super().__init__(ctx)
        self.conv, self.add, self.position = conv, add, position
        # the addition's constant inputs (by position) and its parameters for
        # :func:`~onnx_light.kernels.integer_loops.add_residual`, held by :meth:`specialize`
        self.add_constants: tuple[np.ndarray | None, ...] | None = None
        self.combine: np.ndarray | None = None
        self.byte_type: np.dtype | None = None  # the convolution's output and the residual's
        self.output_shape: tuple[int, ...] | None = None  # the settled one (:meth:`settle`)

    @classmethod
    def of(cls, conv: QLinearConv, add: QLinearAdd, position: int) -> QLinearConvAdd:
        """The fused step of ``conv`` and ``add`` (reading the convolution's output at
        ``position``), bound to the convolution's pool."""
        types = (*conv.ctx.input_types, *(None,) * CONV_INPUTS)[:CONV_INPUTS]
        add_types = (*add.ctx.input_types, *(None,) * 8)[:8]
        ctx = dataclasses.replace(add.ctx, op_type=cls.op_type, domain=conv.ctx.domain,
                                  num_inputs=CONV_INPUTS + 8, input_types=(*types, *add_types),
                                  omitted_inputs=frozenset())
        return cls(ctx, conv, add, position).bind(conv.pool)

    def tuning_schema(self) -> KernelTuningSchema | None:
        """The convolution's schema: the session resolves and checks its values for this step."""
        return self.conv.tuning_schema()

    def _configure(self, values: Mapping[str, Value]) -> None:
        self.conv._configure(values)

    def bind(self, pool: ThreadPool | None) -> QLinearConvAdd:
        """This step and its two kernels on ``pool``."""
        self.conv.bind(pool)
        self.add.bind(pool)
        return super().bind(pool)

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        work = self.conv.work(input_shapes[:CONV_INPUTS], output_shapes)
        if work is None or not output_shapes or output_shapes[0] is None:
            return work
        return work + math.prod(output_shapes[0])

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """The convolution's own specialization, and the addition's parameters when its
        scales and zero points are constants the fused arithmetic covers."""
        constants = (*constants, *(None,) * (CONV_INPUTS + 8))[:CONV_INPUTS + 8]
        conv = self.conv.specialize(constants[:CONV_INPUTS])
        add_constants = constants[CONV_INPUTS:]
        combine = self._combine(add_constants)
        if conv is None and combine is None:
            return None
        byte_type = self.add.ctx.input_dtype(self.position)
        if combine is not None:
            add_residual(np.zeros((1, 1), byte_type), np.zeros((1, 1), byte_type), 0, 1, 0, 1, combine)
        return self.variant(conv=conv or self.conv, add_constants=add_constants, combine=combine,
                            byte_type=byte_type)

    def _combine(self, add_constants: Sequence[np.ndarray | None]) -> np.ndarray | None:
        """:func:`~onnx_light.kernels.integer_loops.add_residual`'s parameters for the
        addition's constant scales and zero points (QLinearAdd's compiled pass's: float32 per
        tensor scales, zero points of the operands' byte type, a byte output of the
        convolution's type), or None."""
        conv_type = self.add.ctx.input_dtype(self.position)
        a_scale, a_zero, b_scale, b_zero, c_scale, c_zero = (add_constants[i] for i in (1, 2, 4, 5, 6, 7))
        scales = (a_scale, b_scale, c_scale)
        if conv_type not in _BYTES or any(s is None or s.dtype != np.float32 or s.size != 1 for s in scales):
            return None
        for index, zero in ((2, a_zero), (5, b_zero)):
            if zero is None and self.add.ctx.given(index):
                return None  # fed
            if zero is not None and (zero.dtype != conv_type or zero.size != 1):
                return None
        if (c_zero is None and self.add.ctx.given(7)) or (
                c_zero is not None and (c_zero.dtype != conv_type or c_zero.size != 1)):
            return None
        a, b, c = (np.float32(s.reshape(-1)[0]) for s in scales)
        with np.errstate(all="ignore"):
            if not (np.isfinite([a / c, b / c]).all() and math.isfinite(c)):
                return None
        info = np.iinfo(conv_type)
        zeros = [0 if z is None else z.reshape(-1)[0] for z in (a_zero, b_zero, c_zero)]
        # the roles of QLinearAdd's compiled pass on operands of one shape: B first, A second
        return np.array([b, zeros[1], a, zeros[0], c, zeros[2], info.min, info.max,
                         1 if self.position == 3 else 0], np.float32)

    def settle(self, input_shapes: Sequence[tuple[int, ...] | None]) -> Kernel | None:
        """The convolution's settled kernel (its plans and route) and the output shape the
        residual must have for the fused route."""
        conv = self.conv.settle(input_shapes[:CONV_INPUTS])
        if conv is None:
            return None
        shape = input_shapes[0]
        w = conv.constants[3] if conv.constants is not None and len(conv.constants) > 3 else None
        output = None
        if w is not None and shape is not None and len(shape) == w.ndim:
            output = (shape[0], w.shape[0], *conv.window(tuple(shape[2:]), w.shape[2:]).output)
        return self.variant(conv=conv, output_shape=output)

    def run(self, *inputs: np.ndarray | None) -> list[np.ndarray]:
        conv_inputs = inputs[:CONV_INPUTS]
        add_inputs = list(inputs[CONV_INPUTS:])
        residual = add_inputs[3 - self.position]
        held, combine = self.add_constants, self.combine
        if (combine is not None and residual is not None and residual.dtype == self.byte_type
                and residual.flags.c_contiguous
                and all(add_inputs[i] is held[i] for i in (1, 2, 4, 5, 6, 7))):
            x = conv_inputs[0]
            route = self.conv.routed(x, conv_inputs[1:]) if self.output_shape == residual.shape else None
            if route is not None and route.call is not None and _output_type(route) == self.byte_type:
                return [route.call(x, (residual, combine))]
            (y,) = self.conv.run(*conv_inputs)
            if y.shape == residual.shape and y.dtype == residual.dtype:
                add_whole(y, (residual, combine))
                return [y]
        else:
            (y,) = self.conv.run(*conv_inputs)
        add_inputs[self.position] = y
        return list(self.add.run(*add_inputs))



def _output_type(route: Any) -> np.dtype:
    """The output type of a QLinearConv's run along ``route`` (its output zero point's type,
    else the input's)."""
    y_zero = route.constants[6]
    return route.dtype if y_zero is None else y_zero.dtype
