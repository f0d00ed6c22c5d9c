"""DynamicQuantizeLSTM: what ``quantize_dynamic`` makes of an LSTM.

The weights W (directions, input size, 4 * hidden) and R (directions, hidden, 4 * hidden) are
int8 or uint8, transposed relative to ONNX LSTM's, with a scale and zero point per direction
or per direction and column. They are dequantized and the rest is ONNX LSTM's kernel
(:class:`~onnx_light.kernels.recurrent.LSTM`, the same attributes and optional inputs) in
float32. onnxruntime also quantizes the input and hidden state at every step, which onnx_light
does not: the two differ by about that rounding (see the tests' bound).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...tuning.keys import ElementType as T
from ..base import NodeContext
from ..declaration import KernelDeclaration
from ..quantization import quantized_type
from ..recurrent import LSTM
from .base import ContribKernel, ValueType, declare_contrib, onnx_kernel

__all__ = ["DECLARATIONS"]

BYTES = (T.UINT8, T.INT8)


class DynamicQuantizeLSTM(ContribKernel):
    """ONNX LSTM with quantized, transposed W and R (see the module docstring)."""

    op_type = "DynamicQuantizeLSTM"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.lstm = onnx_kernel(ctx, LSTM, 14, ctx.attributes, (T.FLOAT,) * 3,
                                num_outputs=max(1, ctx.num_outputs))

    @classmethod
    def typed_outputs(cls, first: ValueType, attributes: Mapping[str, Any],
                      num_outputs: int) -> list[ValueType]:
        return [(first[0], None)] * num_outputs

    def _weights(self, name: str, q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """``q`` (directions, rows, 4 * hidden) dequantized as ONNX's (directions, 4 * hidden, rows)."""
        if q.ndim != 3 or quantized_type(q.dtype) not in BYTES:
            raise self.ctx.error(f"{name} must be a uint8 or int8 (directions, rows, 4 * hidden) "
                                 f"tensor, got {q.dtype} of shape {list(q.shape)}")
        if zero.dtype != q.dtype:
            raise self.ctx.error(f"{name}_zero_point's type {zero.dtype} differs from {name}'s {q.dtype}")
        for what, value in (("scale", scale), ("zero_point", zero)):
            if value.shape not in ((q.shape[0],), (q.shape[0], q.shape[2])):
                raise self.ctx.error(f"{name}_{what} must have shape [{q.shape[0]}] or "
                                     f"[{q.shape[0]}, {q.shape[2]}], got {list(value.shape)}")
        per_column = (q.shape[0], 1, -1)
        shifted = q.astype(np.int32) - zero.astype(np.int32).reshape(per_column)
        real = shifted.astype(np.float32) * scale.astype(np.float32).reshape(per_column)
        return np.ascontiguousarray(real.transpose(0, 2, 1))

    def run(self, x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None = None,
            sequence_lens: np.ndarray | None = None, initial_h: np.ndarray | None = None,
            initial_c: np.ndarray | None = None, p: np.ndarray | None = None,
            w_scale: np.ndarray | None = None, w_zero_point: np.ndarray | None = None,
            r_scale: np.ndarray | None = None, r_zero_point: np.ndarray | None = None
            ) -> Sequence[np.ndarray]:
        if any(v is None for v in (w_scale, w_zero_point, r_scale, r_zero_point)):
            raise self.ctx.error("W_scale, W_zero_point, R_scale and R_zero_point are required")
        weights = self._weights("W", w, w_scale, w_zero_point)
        recurrence = self._weights("R", r, r_scale, r_zero_point)
        return self.lstm.run(x, weights, recurrence, b, sequence_lens, initial_h, initial_c, p)


DECLARATIONS: tuple[KernelDeclaration, ...] = (declare_contrib(DynamicQuantizeLSTM, (T.FLOAT,)),)
