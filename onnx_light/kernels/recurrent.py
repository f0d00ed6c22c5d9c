"""Recurrent network kernels: RNN, GRU and LSTM.

The input part of every gate, ``X @ W^T + Wb``, is one matrix product over all time steps
and the whole batch at once; the recurrent part, ``H @ R^T``, is one product per time step
over the batch. ``sequence_lens`` is applied per batch entry: an entry whose sequence is
shorter keeps its state past its end and gets zeros in ``Y`` there; the reverse direction
starts each entry at its own last step. Gate pre-activations are clipped to
``[-clip, clip]`` when ``clip`` is set. ``layout=1`` (opset 14) puts the batch axis first in
X, the initial states and the outputs.

float16 and bfloat16 compute in float32 and round the outputs once; float32 and float64 in
their own type. None of these kernels is tunable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext, compute_dtype
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["ACTIVATIONS", "GRU", "KERNELS", "LSTM", "RNN"]

_FLOATS = (T.FLOAT16, T.FLOAT, T.DOUBLE)
_FLOATS_BF16 = (*_FLOATS, T.BFLOAT16)

Activation = Callable[[np.ndarray], np.ndarray]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x)


# name (lower case) -> (default alpha, default beta or None, function of (x, alpha, beta)); an
# activation with a default alpha (beta) takes the next value of activation_alpha (_beta).
ACTIVATIONS: dict[str, tuple[float | None, float | None,
                             Callable[[np.ndarray, float, float], np.ndarray]]] = {
    "relu": (None, None, lambda x, a, b: np.maximum(x, 0)),
    "tanh": (None, None, lambda x, a, b: np.tanh(x)),
    "sigmoid": (None, None, lambda x, a, b: _sigmoid(x)),
    "affine": (1.0, 0.0, lambda x, a, b: x * a + b),
    "leakyrelu": (0.01, None, lambda x, a, b: np.where(x >= 0, x, x * a)),
    "thresholdedrelu": (1.0, None, lambda x, a, b: np.where(x > a, x, 0)),
    "scaledtanh": (1.0, 1.0, lambda x, a, b: a * np.tanh(b * x)),
    "hardsigmoid": (0.2, 0.5, lambda x, a, b: np.clip(a * x + b, 0, 1)),
    "elu": (1.0, None, lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1))),
    "softsign": (None, None, lambda x, a, b: x / (1 + np.abs(x))),
    "softplus": (None, None, lambda x, a, b: _softplus(x)),
}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _activations(ctx: NodeContext, defaults: tuple[str, ...], directions: int) -> list[list[Activation]]:
    """The activation functions of each direction, read from ``activations`` and
    ``activation_alpha``/``activation_beta`` (consumed in order by the functions that take them)."""
    names = [_text(n) for n in ctx.attribute("activations", ())] or list(defaults) * directions
    if len(names) == len(defaults) and directions == 2:
        names = names * 2
    if len(names) != len(defaults) * directions:
        raise ctx.error(f"activations has {len(names)} names, expected {len(defaults)} per "
                        f"direction ({len(defaults) * directions} for {directions} direction(s))")
    alphas = [float(a) for a in ctx.attribute("activation_alpha", ())]
    betas = [float(b) for b in ctx.attribute("activation_beta", ())]
    functions: list[Activation] = []
    for name in names:
        entry = ACTIVATIONS.get(name.lower())
        if entry is None:
            raise ctx.error(f"unknown activation {name!r}; valid: {sorted(ACTIVATIONS)}")
        alpha, beta, function = entry
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        functions.append(lambda x, f=function, a=alpha, b=beta: f(x, a, b))
    if alphas or betas:
        raise ctx.error(f"activation_alpha/activation_beta have {len(alphas)}/{len(betas)} "
                        f"values more than the activations {names} take")
    per = len(defaults)
    return [functions[d * per:(d + 1) * per] for d in range(directions)]


class _Recurrent(Kernel):
    """What RNN, GRU and LSTM share: attributes, input checks, the time loop."""

    gates: ClassVar[int] = 1
    default_activations: ClassVar[tuple[str, ...]] = ("Tanh",)
    # Inputs after initial_h: LSTM's initial_c and P.
    extra_inputs: ClassVar[tuple[str, ...]] = ()
    max_outputs: ClassVar[int] = 2  # Y, Y_h (and LSTM's Y_c)

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        direction = _text(ctx.attribute("direction", "forward"))
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ctx.error(f"direction must be forward, reverse or bidirectional, got {direction!r}")
        self.direction = direction
        self.directions = 2 if direction == "bidirectional" else 1
        hidden = ctx.attribute("hidden_size")
        self.hidden_size = None if hidden is None else int(hidden)
        if self.hidden_size is not None and self.hidden_size < 1:
            raise ctx.error(f"hidden_size must be positive, got {self.hidden_size}")
        clip = ctx.attribute("clip")
        self.clip = None if clip is None else float(clip)
        if self.clip is not None and not self.clip > 0:
            raise ctx.error(f"clip must be positive, got {self.clip}")
        self.layout = int(ctx.attribute("layout", 0))
        if self.layout not in (0, 1):
            raise ctx.error(f"layout must be 0 or 1, got {self.layout}")
        if self.layout and ctx.opset < 14:
            raise ctx.error(f"layout is an attribute from opset 14 on, the model uses opset {ctx.opset}")
        self.activations = _activations(ctx, self.default_activations, self.directions)
        if ctx.num_outputs > self.max_outputs:
            raise ctx.error(f"has {ctx.num_outputs} outputs, at most {self.max_outputs}")

    def _clip(self, x: np.ndarray) -> np.ndarray:
        return x if self.clip is None else np.clip(x, -self.clip, self.clip)

    def _shape(self, name: str, value: np.ndarray | None, shape: tuple[int, ...]) -> None:
        if value is not None and value.shape != shape:
            raise self.ctx.error(f"{name} must have shape {list(shape)}, got {list(value.shape)}")

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        if len(inputs) < 3 or any(v is None for v in inputs[:3]):
            raise self.ctx.error("needs inputs X, W and R")
        x, w, r = inputs[:3]
        optional = [*inputs[3:], *(None,) * (3 + len(self.extra_inputs))]
        bias, lengths, initial_h = optional[:3]
        extras = optional[3:3 + len(self.extra_inputs)]
        if x.ndim != 3 or w.ndim != 3 or r.ndim != 3:
            raise self.ctx.error(f"X, W and R must be 3-D, got shapes {list(x.shape)}, "
                                 f"{list(w.shape)} and {list(r.shape)}")
        directions, gates, hidden = self.directions, self.gates, r.shape[-1]
        if self.hidden_size is not None and hidden != self.hidden_size:
            raise self.ctx.error(f"R has hidden size {hidden}, the attribute hidden_size is "
                                 f"{self.hidden_size}")
        if self.layout:
            x = x.transpose(1, 0, 2)
            initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
            if extras and extras[0] is not None:
                extras[0] = extras[0].transpose(1, 0, 2)
        steps, batch, width = x.shape
        self._shape("W", w, (directions, gates * hidden, width))
        self._shape("R", r, (directions, gates * hidden, hidden))
        self._shape("B", bias, (directions, 2 * gates * hidden))
        self._shape("initial_h", initial_h, (directions, batch, hidden))
        if extras:
            self._shape("initial_c", extras[0], (directions, batch, hidden))
            self._shape("P", extras[1], (directions, 3 * hidden))
        if lengths is not None:
            lengths = lengths.astype(np.int64).reshape(-1)
            if lengths.shape != (batch,) or np.any(lengths < 0) or np.any(lengths > steps):
                raise self.ctx.error(f"sequence_lens must hold {batch} lengths in [0, {steps}], "
                                     f"got {lengths.tolist()}")
        compute = compute_dtype(x.dtype)
        x, w, r = (v.astype(compute, copy=False) for v in (x, w, r))
        bias = (np.zeros((directions, 2 * gates * hidden), compute) if bias is None
                else bias.astype(compute, copy=False))
        zeros = np.zeros((directions, batch, hidden), compute)
        states = [zeros if initial_h is None else initial_h.astype(compute, copy=False)]
        if extras:
            states.append(zeros if extras[0] is None else extras[0].astype(compute, copy=False))
        y = np.zeros((steps, directions, batch, hidden), compute)
        finals = [np.empty((directions, batch, hidden), compute) for _ in states]
        for d in range(directions):
            reverse = self.direction == "reverse" or d == 1
            inputs_part = x @ w[d].T + bias[d, :gates * hidden]
            state = [s[d] for s in states]
            state = self._sequence(d, reverse, inputs_part, r[d], bias[d, gates * hidden:],
                                   state, extras, lengths, y)
            for final, value in zip(finals, state, strict=True):
                final[d] = value
        if self.layout:
            y = y.transpose(2, 0, 1, 3)
            finals = [f.transpose(1, 0, 2) for f in finals]
        outputs = [y, *finals][:max(1, self.ctx.num_outputs)]
        return [np.ascontiguousarray(o, dtype=inputs[0].dtype) for o in outputs]

    def _sequence(self, d: int, reverse: bool, inputs_part: np.ndarray, r: np.ndarray,
                  recurrent_bias: np.ndarray, state: list[np.ndarray],
                  extras: list[np.ndarray | None], lengths: np.ndarray | None,
                  y: np.ndarray) -> list[np.ndarray]:
        """Run one direction over the time steps, writing ``y[:, d]``; returns the final states."""
        steps, batch = inputs_part.shape[:2]
        peepholes = None
        if extras and extras[1] is not None:
            peepholes = extras[1][d].astype(inputs_part.dtype, copy=False)
        functions = self.activations[d]
        rows = np.arange(batch)
        full = lengths is None or bool(np.all(lengths == steps))
        for s in range(steps):
            if full:
                t = steps - 1 - s if reverse else s
                new = self._cell(inputs_part[t], r, recurrent_bias, state, peepholes, functions)
                y[t, d] = new[0]
                state = new
                continue
            active = s < lengths
            if not active.any():
                break
            times = np.where(active, lengths - 1 - s if reverse else s, 0)
            new = self._cell(inputs_part[times, rows], r, recurrent_bias, state, peepholes,
                             functions)
            state = [np.where(active[:, None], n, o) for n, o in zip(new, state, strict=True)]
            y[times[active], d, rows[active]] = new[0][active]
        return state

    def _cell(self, gates_x: np.ndarray, r: np.ndarray, rb: np.ndarray, state: list[np.ndarray],
              peepholes: np.ndarray | None, functions: list[Activation]) -> list[np.ndarray]:
        """One time step over the batch: the new states from the input part of the gates."""
        raise NotImplementedError


class RNN(_Recurrent):
    """ONNX RNN (1, 7, 14, 22): ``H = f(X W^T + H R^T + Wb + Rb)``, f Tanh by default."""

    op_type: ClassVar[str] = "RNN"

    def _cell(self, gates_x: np.ndarray, r: np.ndarray, rb: np.ndarray, state: list[np.ndarray],
              peepholes: np.ndarray | None, functions: list[Activation]) -> list[np.ndarray]:
        return [functions[0](self._clip(gates_x + state[0] @ r.T + rb))]


class GRU(_Recurrent):
    """ONNX GRU (1, 3, 7, 14, 22): gates z, r, h; ``linear_before_reset`` applies the reset
    gate after the recurrent product of the hidden gate. f Sigmoid, g Tanh by default."""

    op_type: ClassVar[str] = "GRU"
    gates: ClassVar[int] = 3
    default_activations: ClassVar[tuple[str, ...]] = ("Sigmoid", "Tanh")

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.linear_before_reset = bool(ctx.attribute("linear_before_reset", 0))

    def _cell(self, gates_x: np.ndarray, r: np.ndarray, rb: np.ndarray, state: list[np.ndarray],
              peepholes: np.ndarray | None, functions: list[Activation]) -> list[np.ndarray]:
        h = state[0]
        size = h.shape[-1]
        f, g = functions
        update_reset = gates_x[:, :2 * size] + h @ r[:2 * size].T + rb[:2 * size]
        z = f(self._clip(update_reset[:, :size]))
        reset = f(self._clip(update_reset[:, size:]))
        if self.linear_before_reset:
            recurrent = reset * (h @ r[2 * size:].T + rb[2 * size:])
        else:
            recurrent = (reset * h) @ r[2 * size:].T + rb[2 * size:]
        candidate = g(self._clip(gates_x[:, 2 * size:] + recurrent))
        return [(1 - z) * candidate + z * h]


class LSTM(_Recurrent):
    """ONNX LSTM (1, 7, 14, 22): gates i, o, f, c with optional peepholes P (i, o, f);
    ``input_forget`` couples the forget gate to the input gate (``f = 1 - i``).
    f Sigmoid, g and h Tanh by default."""

    op_type: ClassVar[str] = "LSTM"
    gates: ClassVar[int] = 4
    default_activations: ClassVar[tuple[str, ...]] = ("Sigmoid", "Tanh", "Tanh")
    extra_inputs: ClassVar[tuple[str, ...]] = ("initial_c", "P")
    max_outputs: ClassVar[int] = 3

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.input_forget = bool(ctx.attribute("input_forget", 0))

    def _cell(self, gates_x: np.ndarray, r: np.ndarray, rb: np.ndarray, state: list[np.ndarray],
              peepholes: np.ndarray | None, functions: list[Activation]) -> list[np.ndarray]:
        h, c = state
        size = h.shape[-1]
        f, g, output = functions
        gates = gates_x + h @ r.T + rb
        i_part, o_part, f_part, c_part = (gates[:, k * size:(k + 1) * size] for k in range(4))
        if peepholes is not None:
            p_i, p_o, p_f = peepholes[:size], peepholes[size:2 * size], peepholes[2 * size:]
            i_part, f_part = i_part + p_i * c, f_part + p_f * c
        i = f(self._clip(i_part))
        forget = 1 - i if self.input_forget else f(self._clip(f_part))
        c = forget * c + i * g(self._clip(c_part))
        if peepholes is not None:
            o_part = o_part + p_o * c
        return [f(self._clip(o_part)) * output(c), c]


DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(RNN, (1, 7, 14, 22), types={1: _FLOATS, 22: _FLOATS_BF16}),
    declare(GRU, (1, 3, 7, 14, 22), types={1: _FLOATS, 22: _FLOATS_BF16}),
    declare(LSTM, (1, 7, 14, 22), types={1: _FLOATS, 22: _FLOATS_BF16}),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
