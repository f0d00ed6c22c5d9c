"""Signal processing kernels: the Hann, Hamming and Blackman windows, DFT, STFT and
MelWeightMatrix.

Signals are real (last axis 1) or complex (last axis 2: real, imaginary) tensors; the
transforms are numpy's FFT (pocketfft) in complex128 for float64 signals and complex64 for
the others (numpy's single precision transform, as ONNX's reference data is made), rounded
once to the input type. Windows and the mel filter bank are computed in float64 and cast to
``output_datatype`` (float32 by default). None of these kernels is tunable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import FLOAT_TYPES, NUMERIC_TYPES, Kernel, NodeContext, normalize_axis, numpy_dtype
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = [
    "DFT",
    "KERNELS",
    "STFT",
    "BlackmanWindow",
    "HammingWindow",
    "HannWindow",
    "MelWeightMatrix",
]

Arrays = Sequence[np.ndarray]


def _output_dtype(ctx: NodeContext) -> np.dtype:
    """The ``output_datatype`` attribute (float32 by default) as a numpy dtype."""
    element_type = int(ctx.attribute("output_datatype", T.FLOAT))
    if element_type not in NUMERIC_TYPES:
        raise ctx.error(f"output_datatype must be a numeric element type, got {element_type}")
    return numpy_dtype(element_type)


def _scalar(ctx: NodeContext, name: str, value: np.ndarray) -> float | int:
    array = np.asarray(value)
    if array.size != 1:
        raise ctx.error(f"input {name!r} must hold one value, got shape {list(array.shape)}")
    return array.reshape(-1)[0].item()


def _count(ctx: NodeContext, name: str, value: np.ndarray, minimum: int = 0) -> int:
    count = _scalar(ctx, name, value)
    if int(count) != count or count < minimum:
        raise ctx.error(f"input {name!r} must be an integer of at least {minimum}, got {count}")
    return int(count)


class _Window(Kernel):
    """A cosine-sum window of ``size`` points: sum of ``a_k cos(2 pi k n / N)`` with N the
    size (``periodic=1``) or the size minus one (symmetric)."""

    coefficients: ClassVar[tuple[float, ...]]

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.periodic = bool(ctx.attribute("periodic", 1))
        self.dtype = _output_dtype(ctx)

    @classmethod
    def element_type_of(cls, ctx: NodeContext) -> int | None:
        """The type of ``size`` (the declaration's): the output's is ``output_datatype``."""
        return ctx.input_types[0] if ctx.input_types else None

    def run(self, size: np.ndarray) -> Arrays:
        points = _count(self.ctx, "size", size)
        period = points if self.periodic else points - 1
        phase = 2 * np.pi * np.arange(points) / max(period, 1)
        window = sum(a * np.cos(k * phase) for k, a in enumerate(self.coefficients))
        return [np.asarray(window, np.float64).astype(self.dtype)]


class HannWindow(_Window):
    op_type: ClassVar[str] = "HannWindow"
    coefficients = (0.5, -0.5)


class HammingWindow(_Window):
    op_type: ClassVar[str] = "HammingWindow"
    coefficients = (25 / 46, -21 / 46)


class BlackmanWindow(_Window):
    op_type: ClassVar[str] = "BlackmanWindow"
    coefficients = (0.42, -0.5, 0.08)


def _complex(ctx: NodeContext, x: np.ndarray) -> np.ndarray:
    """A real (..., 1) or complex (..., 2) signal tensor as complex values (complex128 for
    float64, complex64 otherwise) without its last axis."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise ctx.error(f"the signal must have a last axis of 1 (real) or 2 (complex), got shape "
                        f"{list(x.shape)}")
    dtype = np.complex128 if x.dtype == np.float64 else np.complex64
    values = np.empty(x.shape[:-1], dtype)
    values.real = x[..., 0]
    values.imag = x[..., 1] if x.shape[-1] == 2 else 0
    return values


def _pairs(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Complex values as (..., 2) real, imaginary pairs of ``dtype``."""
    return np.stack([values.real, values.imag], axis=-1).astype(dtype)


class DFT(Kernel):
    """ONNX DFT (17, 20): the discrete Fourier transform (or its inverse, divided by the
    length) along one axis, zero-padded or cut to ``dft_length``; ``onesided`` keeps the
    first ``n // 2 + 1`` frequencies (the inverse then takes those and returns a real signal).
    The axis is an attribute (default 1) at 17, an input (default -2) from 20."""

    op_type: ClassVar[str] = "DFT"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.inverse = bool(ctx.attribute("inverse", 0))
        self.onesided = bool(ctx.attribute("onesided", 0))
        self.axis = int(ctx.attribute("axis", 1))

    def run(self, x: np.ndarray, dft_length: np.ndarray | None = None,
            axis: np.ndarray | None = None) -> Arrays:
        if self.ctx.opset < 20:
            given = self.axis
        else:
            given = -2 if axis is None else int(_scalar(self.ctx, "axis", axis))
        along = normalize_axis(self.ctx, given, x.ndim)
        if along == x.ndim - 1:
            raise self.ctx.error(f"axis {given} names the last (real, imaginary) axis")
        signal = _complex(self.ctx, x)
        if dft_length is not None:
            length = _count(self.ctx, "dft_length", dft_length, 1)
        else:
            length = 2 * (x.shape[along] - 1) if self.inverse and self.onesided else x.shape[along]
        if self.inverse and self.onesided:
            return [np.fft.irfft(signal, n=length, axis=along)[..., np.newaxis].astype(x.dtype)]
        result = (np.fft.ifft if self.inverse else np.fft.fft)(signal, n=length, axis=along)
        if self.onesided:
            result = np.take(result, np.arange(length // 2 + 1), axis=along)
        return [_pairs(result, x.dtype)]


class STFT(Kernel):
    """ONNX STFT (17): the DFT of each frame of ``frame_length`` samples, ``frame_step`` apart,
    times ``window``: (batch, frames, frequencies, 2)."""

    op_type: ClassVar[str] = "STFT"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.onesided = bool(ctx.attribute("onesided", 1))

    def run(self, signal: np.ndarray, frame_step: np.ndarray, window: np.ndarray | None = None,
            frame_length: np.ndarray | None = None) -> Arrays:
        if signal.ndim != 3:
            raise self.ctx.error(f"the signal must be (batch, length, 1 or 2), got {list(signal.shape)}")
        values = _complex(self.ctx, signal)
        step = _count(self.ctx, "frame_step", frame_step, 1)
        if window is None and frame_length is None:
            raise self.ctx.error("needs a window or a frame_length")
        if frame_length is None:
            length = window.shape[0]
        else:
            length = _count(self.ctx, "frame_length", frame_length, 1)
        weights = np.ones(length, values.real.dtype) if window is None else window.reshape(-1)
        if weights.size != length or length > values.shape[1]:
            raise self.ctx.error(f"window of {weights.size} points, frame_length {length} and a "
                                 f"signal of {values.shape[1]} samples do not fit")
        frames = 1 + (values.shape[1] - length) // step
        starts = np.arange(frames) * step
        framed = values[:, starts[:, None] + np.arange(length)] * weights.astype(values.real.dtype)
        spectrum = np.fft.fft(framed, axis=-1)
        if self.onesided:
            spectrum = spectrum[..., :length // 2 + 1]
        return [_pairs(spectrum, signal.dtype)]


class MelWeightMatrix(Kernel):
    """ONNX MelWeightMatrix (17): (dft_length // 2 + 1, num_mel_bins) triangular filters,
    equally spaced on the mel scale (2595 log10(1 + f / 700)) between the edge frequencies,
    each rising from 0 at its left neighbour's centre to 1 at its own and falling to 0 at its
    right neighbour's, on the bins ``floor((dft_length + 1) f / sample_rate)``."""

    op_type: ClassVar[str] = "MelWeightMatrix"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.dtype = _output_dtype(ctx)

    def run(self, num_mel_bins: np.ndarray, dft_length: np.ndarray, sample_rate: np.ndarray,
            lower_edge_hertz: np.ndarray, upper_edge_hertz: np.ndarray) -> Arrays:
        ctx = self.ctx
        mels, length = _count(ctx, "num_mel_bins", num_mel_bins, 1), _count(ctx, "dft_length", dft_length, 1)
        rate = _count(ctx, "sample_rate", sample_rate, 1)
        low, high = (float(_scalar(ctx, n, v)) for n, v in
                     (("lower_edge_hertz", lower_edge_hertz), ("upper_edge_hertz", upper_edge_hertz)))
        if not 0 <= low < high <= rate / 2:
            raise ctx.error(f"need 0 <= lower_edge_hertz ({low}) < upper_edge_hertz ({high}) <= "
                            f"sample_rate / 2 ({rate / 2})")
        low_mel, high_mel = (2595 * np.log10(1 + f / 700) for f in (low, high))
        step = (high_mel - low_mel) / (mels + 2)
        hertz = 700 * (10 ** ((np.arange(mels + 2) * step + low_mel) / 2595) - 1)
        edges = np.floor((length + 1) * hertz / rate).astype(np.int64)
        left, centre, right = edges[:-2], edges[1:-1], edges[2:]
        j = np.arange(length // 2 + 1)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            rising = np.where((j >= left) & (j < centre), (j - left) / (centre - left), 0.0)
            falling = np.where((j > centre) & (j < right), (right - j) / (right - centre), 0.0)
        weights = rising + falling + (j == centre)
        return [weights.astype(self.dtype)]


_WINDOWS = {"BlackmanWindow": BlackmanWindow, "HammingWindow": HammingWindow, "HannWindow": HannWindow}

# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    *(declare(cls, (17,), op_type=name, types=(T.INT32, T.INT64)) for name, cls in _WINDOWS.items()),
    declare(DFT, (17, 20), types=FLOAT_TYPES),
    declare(MelWeightMatrix, (17,)),
    declare(STFT, (17,), types=FLOAT_TYPES),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
