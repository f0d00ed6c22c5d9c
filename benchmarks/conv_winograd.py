"""3x3 stride-1 convolutions of ResNet-50 and VGG-19 (batch 1, C -> C channels, padded) in
onnx_light with winograd F(2x2, 3x3), winograd F(4x4, 3x3) and im2col (BLAS), and in
onnxruntime, at 1 and 2 threads, side by side, in one process.

Each model is one Conv with seeded random constant weights and a bias. onnx_light runs it
with ``algorithm=winograd`` and F(2x2, 3x3) or F(4x4, 3x3) (the ``winograd.large_tile_*``
thresholds out of reach or at 1), and with ``auto`` without winograd
(``winograd.minimum_channels`` out of reach: ``im2col_wide``, one BLAS product per block);
the sessions of a thread count run in the interleaved rounds of ``real_models.Rounds``, each
sample a loop of runs lasting a few milliseconds, and the table gives the fastest and the
median sample (time of one run) and the ratios of the fastest to onnxruntime's. The load
average is printed at the start and the end.

``--errors N`` measures instead the float32 error of im2col, F(2x2, 3x3) and F(4x4, 3x3)
against the float64 convolution on N random shapes (16-512 channels and filters, 4-60 rows
and columns, random pads and groups, uniform(-1, 1) data), relative to the largest output.

Run: ``python benchmarks/conv_winograd.py [--threads 1 2] [--rounds 7] [--shapes 0 3]`` or
``python benchmarks/conv_winograd.py --errors 40``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import numpy as np
from conv_mobile import conv_model, repeated
from conv_settings import registry_with
from onnx import TensorProto
from real_models import Rounds, onnxruntime_session

from onnx_light.kernels import conv
from onnx_light.kernels.base import NodeContext
from onnx_light.parallel import ThreadPool
from onnx_light.runtime.session import RuntimeSession

# (channels, size): ResNet-50's 3x3 convolutions (64x56x56 ... 512x7x7), then VGG-19's (its
# first convolution, 3 -> 64, aside).
SHAPES = [(64, 56), (128, 28), (256, 14), (512, 7), (64, 224), (128, 112), (256, 56), (512, 28),
          (512, 14)]
SETTINGS = {
    "F(2,3)": {conv.ALGORITHM: "winograd", conv.LARGE_TILE_OUTPUTS: conv.NEVER},
    "F(4,3)": {conv.ALGORITHM: "winograd", conv.LARGE_TILE_CHANNELS: 1, conv.LARGE_TILE_OUTPUTS: 1},
    "im2col": {conv.WINOGRAD_CHANNELS: conv.NEVER, conv.LARGE_TILE_CHANNELS: conv.NEVER},
}


def errors(count: int) -> None:
    """The table of ``--errors``: per algorithm, the median and largest relative error."""
    rng = np.random.default_rng(17)
    names = {"im2col": conv.REFERENCE, **{name: SETTINGS[name] for name in ("F(2,3)", "F(4,3)")}}
    found: dict[str, list[float]] = {name: [] for name in names}

    def kernel(attributes: dict, element_type: int, values: dict) -> conv.ConvKernel:
        ctx = NodeContext("conv", "Conv", "", 22, attributes, (element_type,) * 3, (element_type,), 3, 1)
        built = conv.ConvKernel(ctx)
        built.bind(ThreadPool(1)).configure(values)
        return built

    for _ in range(count):
        groups = int(rng.choice([1, 1, 1, 2, 4]))
        channels = int(rng.integers(16, 513)) // groups * groups
        filters = int(rng.integers(16, 513)) // groups * groups
        height, width = (int(v) for v in rng.integers(4, 61, 2))
        attributes = {"pads": [int(p) for p in rng.integers(0, 2, 4)], "group": groups}
        x = rng.uniform(-1, 1, (1, channels, height, width))
        w = rng.uniform(-1, 1, (filters, channels // groups, 3, 3))
        b = rng.uniform(-1, 1, filters)
        exact = kernel(attributes, TensorProto.DOUBLE, conv.REFERENCE).run(x, w, b)[0]
        scale = np.abs(exact).max()
        single = [a.astype(np.float32) for a in (x, w, b)]
        for name, values in names.items():
            got = kernel(attributes, TensorProto.FLOAT, values).run(*single)[0]
            found[name].append(float(np.abs(got - exact).max() / scale))
    print(f"float32 against float64, {count} random shapes: max |error| / max |output|")
    print("| algorithm | median | largest |\n|---|---|---|")
    for name, values in found.items():
        print(f"| {name} | {np.median(values):.2e} | {max(values):.2e} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shapes", type=int, nargs="+", default=None,
                        help="indices into SHAPES (default all)")
    parser.add_argument("--errors", type=int, default=0, help="measure errors on this many shapes")
    args = parser.parse_args(argv)
    if args.errors:
        errors(args.errors)
        return 0
    shapes = [SHAPES[i] for i in args.shapes] if args.shapes is not None else SHAPES
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds; us per run, "
          f"fastest (median); ratios of the fastest to onnxruntime's")
    names = [*SETTINGS, "ort"]
    print("| C x H x W (3x3, C filters) | threads | " + " | ".join(names) + " | "
          + " | ".join(f"{name} / ort" for name in SETTINGS) + " |")
    print("|---" * (2 + len(names) + len(SETTINGS)) + "|")
    for channels, size in shapes:
        model = conv_model(channels, channels, size, 3, 1, 1)
        feeds = {"x": np.random.default_rng(0).standard_normal((1, channels, size, size)).astype(np.float32)}
        for threads in args.threads:
            runs = {name: RuntimeSession(model, num_threads=threads,
                                         registry=registry_with(setting, threads)).run
                    for name, setting in SETTINGS.items()}
            runs["ort"] = onnxruntime_session(model, threads).run
            loops = {name: repeated(functools.partial(run, None, feeds)) for name, run in runs.items()}
            samples = Rounds(3).run([loop for loop, _ in loops.values()], args.rounds)
            fastest = {name: min(s) / loops[name][1] * 1e6 for name, s in zip(loops, samples, strict=True)}
            median = {name: float(np.median(s)) / loops[name][1] * 1e6
                      for name, s in zip(loops, samples, strict=True)}
            cells = " | ".join(f"{fastest[name]:.0f} ({median[name]:.0f})" for name in names)
            ratios = " | ".join(f"{fastest[name] / fastest['ort']:.2f}" for name in SETTINGS)
            print(f"| {channels} x {size} x {size} | {threads} | {cells} | {ratios} |", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
