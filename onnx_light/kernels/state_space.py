"""Stateful sequence kernels of recent language models: CausalConvWithState, LinearAttention.

CausalConvWithState is a depthwise causal 1-D convolution whose left context is the carried
state (zeros without one): the state and the input are joined along the sequence, each of
the ``k`` taps is one multiply-add of a shifted view, and the last ``k - 1`` positions are
the new state. LinearAttention runs its recurrence token by token as the operator defines
it, each step one batched numpy update of the (batch, kv heads, d_k, d_v) state; query heads
share their group's key/value head. Both compute in float32 and round once. Not tunable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "CausalConvWithState", "LinearAttention"]

Arrays = Sequence[np.ndarray]
_TYPES = {27: (T.FLOAT, T.FLOAT16, T.BFLOAT16)}
_F32 = np.float32


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


class CausalConvWithState(Kernel):
    """ONNX CausalConvWithState (27): output and present_state of (batch, channels, length)
    input, (channels, 1, k) weight, optional bias and past_state, optional SiLU."""

    op_type: ClassVar[str] = "CausalConvWithState"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        activation = ctx.attribute("activation", "none")
        self.activation = activation.decode() if isinstance(activation, bytes) else str(activation)
        if self.activation not in ("silu", "swish", "none"):
            raise ctx.error(f"activation must be 'silu', 'swish' or 'none', got {self.activation!r}")

    def run(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
            past_state: np.ndarray | None = None) -> Arrays:
        if x.ndim != 3 or weight.ndim != 3 or weight.shape[:2] != (x.shape[1], 1):
            raise self.ctx.error(f"input {list(x.shape)} must be (batch, channels, length) and weight "
                                 f"{list(weight.shape)} (channels, 1, k)")
        batch, channels, length = x.shape
        k = weight.shape[2]
        context = (np.zeros((batch, channels, k - 1), _F32) if past_state is None
                   else past_state.astype(_F32))
        if context.shape != (batch, channels, k - 1):
            raise self.ctx.error(f"past_state must have shape {[batch, channels, k - 1]}, got "
                                 f"{list(context.shape)}")
        padded = np.concatenate([context, x.astype(_F32)], axis=2)
        taps = weight.astype(_F32)[:, 0]  # (channels, k)
        out = np.zeros((batch, channels, length), _F32)
        for j in range(k):
            out += taps[:, j:j + 1] * padded[:, :, j:j + length]
        if bias is not None:
            out += bias.astype(_F32).reshape(1, -1, 1)
        if self.activation != "none":
            out = _silu(out)
        state = padded[:, :, padded.shape[2] - (k - 1):]
        return [out.astype(x.dtype), np.ascontiguousarray(state).astype(x.dtype)]


_RULES = ("linear", "gated", "delta", "gated_delta")


class LinearAttention(Kernel):
    """ONNX LinearAttention (27): the linear, gated, delta or gated-delta recurrence of the
    (d_k, d_v) state per key/value head, and ``scale * q^T S`` per token and query head."""

    op_type: ClassVar[str] = "LinearAttention"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.q_heads = int(ctx.attribute("q_num_heads", 0))
        self.kv_heads = int(ctx.attribute("kv_num_heads", 0))
        if self.kv_heads < 1 or self.q_heads < 1 or self.q_heads % self.kv_heads:
            raise ctx.error(f"q_num_heads ({self.q_heads}) must be a positive multiple of kv_num_heads "
                            f"({self.kv_heads})")
        rule = ctx.attribute("update_rule", "gated_delta")
        self.rule = rule.decode() if isinstance(rule, bytes) else str(rule)
        if self.rule not in _RULES:
            raise ctx.error(f"update_rule must be one of {list(_RULES)}, got {self.rule!r}")
        self.scale = float(np.float32(ctx.attribute("scale", 0.0)))

    def run(self, query: np.ndarray, key: np.ndarray, value: np.ndarray, past_state: np.ndarray | None = None,
            decay: np.ndarray | None = None, beta: np.ndarray | None = None) -> Arrays:
        if query.ndim != 3 or key.ndim != 3 or value.ndim != 3 or query.shape[2] % self.q_heads \
                or key.shape[2] % self.kv_heads or value.shape[2] % self.kv_heads:
            raise self.ctx.error(f"query {list(query.shape)}, key {list(key.shape)} and value "
                                 f"{list(value.shape)} must be (B, T, heads * size)")
        batch, steps = query.shape[:2]
        dk, dv = query.shape[2] // self.q_heads, value.shape[2] // self.kv_heads
        group = self.q_heads // self.kv_heads
        gated, delta = self.rule in ("gated", "gated_delta"), self.rule in ("delta", "gated_delta")
        if (gated and decay is None) or (delta and beta is None):
            missing = "decay" if gated and decay is None else "beta"
            raise self.ctx.error(f"update_rule {self.rule!r} needs the input {missing!r}")
        q = query.astype(_F32).reshape(batch, steps, self.kv_heads, group, dk)
        k = key.astype(_F32).reshape(batch, steps, self.kv_heads, dk)
        v = value.astype(_F32).reshape(batch, steps, self.kv_heads, dv)
        g = None if not gated else \
            decay.astype(_F32).reshape(batch, steps, self.kv_heads, -1)[..., np.newaxis]
        b = None if not delta else np.broadcast_to(beta.astype(_F32).reshape(batch, steps, -1, 1, 1),
                                                    (batch, steps, self.kv_heads, 1, 1))
        state = (np.zeros((batch, self.kv_heads, dk, dv), _F32) if past_state is None
                 else past_state.astype(_F32).copy())
        if state.shape != (batch, self.kv_heads, dk, dv):
            raise self.ctx.error(f"past_state must have shape {[batch, self.kv_heads, dk, dv]}, got "
                                 f"{list(state.shape)}")
        scale = self.scale or 1 / np.sqrt(dk)
        out = np.empty((batch, steps, self.kv_heads, group, dv), _F32)
        for t in range(steps):
            if gated:
                state = np.exp(g[:, t]) * state
            kt, vt = k[:, t], v[:, t]
            if delta:
                recalled = np.einsum("bhkv,bhk->bhv", state, kt)
                state = state + b[:, t] * kt[..., np.newaxis] * (vt - recalled)[:, :, np.newaxis]
            else:
                state = state + kt[..., np.newaxis] * vt[:, :, np.newaxis]
            out[:, t] = scale * np.einsum("bhgk,bhkv->bhgv", q[:, t], state)
        return [out.reshape(batch, steps, -1).astype(query.dtype), state.astype(query.dtype)]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(CausalConvWithState, (27,), types=_TYPES),
    declare(LinearAttention, (27,), types=_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
