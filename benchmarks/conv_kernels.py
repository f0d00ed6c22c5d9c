"""Conv's compiled kernels alone, without a session: each forced algorithm's ``ConvKernel.run``
on one thread, timed in the calling thread's CPU time (what the load of a shared machine
disturbs least), the algorithms of a shape interleaved, medians of the samples.

Depthwise shapes (those of ``conv_mobile.py``): the per-channel ``depthwise`` against the
channel-blocked ``depthwise_blocked`` (where the processor has AVX-512, or AVX2 and FMA); the
ratio blocked / per channel finds ``depthwise.blocked_outputs``' crossover. Stems and other
full convolutions with few input channels: ``im2col`` against ``filters_blocked``.

``--activation HardSwish`` (or ``Swish``, ``HardSigmoid``) fuses that compiled activation
into every kernel, as a session fuses MobileNetV3's and EfficientNet's.

Run: ``python benchmarks/conv_kernels.py [--samples 11] [--depthwise 0 1] [--full 0 1]
[--activation HardSwish]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from onnx import TensorProto

from onnx_light.kernels import conv
from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.compiled_activations import ACTIVATIONS, in_place
from onnx_light.kernels.conv.channel_blocked import vector_lanes
from onnx_light.parallel import ThreadPool

# (channels, size, kernel, stride): MobileNetV2's, EfficientNet-B0's, MobileNetV3-small's and
# ShuffleNetV2's depthwise convolutions (a selection; the plane sizes span 7x7 to 112x112)
DEPTHWISE = [
    (32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 1), (144, 56, 3, 2), (192, 28, 3, 1),
    (192, 28, 3, 2), (384, 14, 3, 1), (576, 14, 3, 2), (960, 7, 3, 1), (240, 28, 5, 1),
    (672, 14, 5, 2), (576, 7, 5, 1), (16, 112, 3, 2), (72, 56, 3, 2), (88, 28, 3, 1),
    (96, 28, 5, 2), (116, 14, 3, 1), (232, 14, 3, 2),
]
# (channels, filters, size, kernel, stride): the stems of MobileNetV3-small, ShuffleNetV2 and
# MobileNetV2 (3x3 stride 2), ResNet-50's 7x7 and AlexNet's 11x11 ones, small 3x3 ones
FULL = [
    (3, 16, 224, 3, 2), (3, 24, 224, 3, 2), (3, 32, 224, 3, 2), (3, 64, 224, 7, 2),
    (3, 96, 224, 11, 4), (1, 32, 28, 3, 1), (3, 32, 32, 3, 1),
]
SAMPLE_S = 0.02  # each sample: runs for about this long (thread CPU time)


def kernel(attributes: dict, algorithm: str, w: np.ndarray, pool: ThreadPool,
           activation: str | None = None) -> conv.ConvKernel:
    """A configured float32 Conv kernel forced to ``algorithm``, specialised for ``w``, with
    the compiled ``activation`` (an operator name of ``ACTIVATIONS``) fused."""
    ctx = NodeContext("conv", "Conv", "", 22, attributes, (TensorProto.FLOAT,) * 3,
                      (TensorProto.FLOAT,), 3, 1)
    configured = conv.ConvKernel(ctx).bind(pool)
    configured.configure({conv.ALGORITHM: algorithm, conv.MINIMUM_FLOPS: 1 << 62})
    if activation is not None:
        configured = configured.variant(epilogue=in_place(activation, {}, lambda block: None))
    return configured.specialize([None, w, None]) or configured


def medians(kernels: dict[str, conv.ConvKernel], inputs: tuple[np.ndarray, ...],
            samples: int) -> dict[str, float]:
    """Median microseconds per run of each kernel, the kernels interleaved."""
    for each in kernels.values():
        each.run(*inputs)
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(samples):
        for name, each in kernels.items():
            start, count = time.thread_time(), 0
            while count < 3 or time.thread_time() - start < SAMPLE_S:
                each.run(*inputs)
                count += 1
            times[name].append((time.thread_time() - start) / count * 1e6)
    return {name: float(np.median(values)) for name, values in times.items()}


def constants(rng: np.random.Generator, *shapes: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    arrays = tuple(rng.uniform(-1, 1, shape).astype(np.float32) for shape in shapes)
    for array in arrays:
        array.flags.writeable = False
    return arrays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=11)
    parser.add_argument("--depthwise", type=int, nargs="*", default=None,
                        help="indices into DEPTHWISE (default all)")
    parser.add_argument("--full", type=int, nargs="*", default=None,
                        help="indices into FULL (default all)")
    parser.add_argument("--activation", choices=sorted(ACTIVATIONS),
                        help="a compiled activation fused into every kernel")
    args = parser.parse_args(argv)
    if not vector_lanes():
        print("no AVX-512 and no AVX2 with FMA: the blocked kernels do not apply")
        return 0
    depthwise = DEPTHWISE if args.depthwise is None else [DEPTHWISE[i] for i in args.depthwise]
    full = FULL if args.full is None else [FULL[i] for i in args.full]
    rng = np.random.default_rng(0)
    print(f"{vector_lanes()} lanes; load average {os.getloadavg()[0]:.1f}; one thread, thread CPU "
          f"time, us per run, medians of {args.samples} interleaved samples; fused activation: "
          f"{args.activation or 'none'}")
    with ThreadPool(1) as pool:
        if depthwise:
            print("\n| C x H x W, k, stride | outputs | per channel | blocked | blocked / per channel |"
                  "\n|---|---:|---:|---:|---:|")
        for channels, size, k, stride in depthwise:
            attributes = {"group": channels, "strides": [stride] * 2, "pads": [k // 2] * 4}
            x, w, b = constants(rng, (1, channels, size, size), (channels, 1, k, k), (channels,))
            kernels = {name: kernel(attributes, name, w, pool, args.activation)
                       for name in ("depthwise", "depthwise_blocked")}
            m = medians(kernels, (x, w, b), args.samples)
            outputs = (-(-size // stride)) ** 2
            print(f"| {channels} x {size} x {size}, {k}, {stride} | {outputs} | {m['depthwise']:.0f} "
                  f"| {m['depthwise_blocked']:.0f} | {m['depthwise_blocked'] / m['depthwise']:.2f} |",
                  flush=True)
        if full:
            print("\n| C -> M x H x W, k, stride | im2col | filters_blocked | blocked / im2col |"
                  "\n|---|---:|---:|---:|")
        for channels, filters, size, k, stride in full:
            attributes = {"strides": [stride] * 2, "pads": [k // 2] * 4}
            x, w, b = constants(rng, (1, channels, size, size), (filters, channels, k, k), (filters,))
            kernels = {name: kernel(attributes, name, w, pool, args.activation)
                       for name in ("im2col", "filters_blocked")}
            m = medians(kernels, (x, w, b), args.samples)
            print(f"| {channels} -> {filters} x {size} x {size}, {k}, {stride} | {m['im2col']:.0f} "
                  f"| {m['filters_blocked']:.0f} | {m['filters_blocked'] / m['im2col']:.2f} |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
