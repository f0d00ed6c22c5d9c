"""Depthwise convolutions of MobileNetV2 (torchvision, 224x224) and 5x5 / 7x7 ones, one Conv
node each, in onnx_light and onnxruntime at 1 and 2 threads, side by side, in one process.

Each model is one Conv with seeded random constant weights and a bias. onnx_light runs it
with the portable configuration (the compiled ``depthwise`` algorithm) and with
``auto.depthwise=im2col_wide`` (the batched BLAS product, the default before it); the three
sessions of a thread count run in the interleaved rounds of ``real_models.Rounds``, each
sample a loop of runs lasting a few milliseconds, and the table gives the median time of one
run and the ratios to onnxruntime's.

Run: ``python benchmarks/conv_depthwise.py [--threads 1 2] [--rounds 7] [--shapes 0 3]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable

import numpy as np
import onnx
from conv_settings import registry_with
from onnx import TensorProto, helper
from real_models import Rounds, onnxruntime_session

from onnx_light.kernels import conv
from onnx_light.runtime.session import RuntimeSession

# (channels, size, kernel, stride): MobileNetV2's seventeen depthwise convolutions, each shape
# once, then 5x5 (EfficientNet-B0) and 7x7 (ConvNeXt-style) ones.
SHAPES = [
    (32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 1), (144, 56, 3, 2), (192, 28, 3, 1),
    (192, 28, 3, 2), (384, 14, 3, 1), (576, 14, 3, 1), (576, 14, 3, 2), (960, 7, 3, 1),
    (240, 28, 5, 1), (672, 14, 5, 2), (384, 14, 7, 1), (768, 7, 7, 1),
]
SAMPLE_S = 0.004  # each sample: runs for about this long


def depthwise_model(channels: int, size: int, kernel: int, stride: int) -> onnx.ModelProto:
    rng = np.random.default_rng(channels * 1000 + size * 10 + kernel + stride)
    w = rng.standard_normal((channels, 1, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=channels, strides=[stride] * 2,
                            pads=[kernel // 2] * 4)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])
    graph = helper.make_graph(
        [node], "depthwise", [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
         helper.make_tensor("b", TensorProto.FLOAT, b.shape, b)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def repeated(run: Callable[[], object]) -> tuple[Callable[[], object], int]:
    """``run`` looped for about SAMPLE_S, and the loop's count."""
    run()
    start = time.perf_counter()
    run()
    count = max(1, int(SAMPLE_S / max(time.perf_counter() - start, 1e-6)))

    def loop() -> None:
        for _ in range(count):
            run()

    return loop, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shapes", type=int, nargs="+", default=None,
                        help="indices into SHAPES (default all)")
    args = parser.parse_args(argv)
    shapes = [SHAPES[i] for i in args.shapes] if args.shapes is not None else SHAPES
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds; median us per "
          f"run; ratios to onnxruntime")
    print("| shape (C x H x W, k, s) | threads | onnx_light | im2col_wide | onnxruntime | ours / ort "
          "| im2col_wide / ort |\n|---|---|---|---|---|---|---|")
    ratios: dict[int, list[float]] = {t: [] for t in args.threads}
    for channels, size, kernel, stride in shapes:
        model = depthwise_model(channels, size, kernel, stride)
        feeds = {"x": np.random.default_rng(0).standard_normal((1, channels, size, size)).astype(np.float32)}
        for threads in args.threads:
            runs = {
                "ours": RuntimeSession(model, num_threads=threads).run,
                "wide": RuntimeSession(model, num_threads=threads, registry=registry_with(
                    {conv.AUTO_DEPTHWISE: "im2col_wide"}, threads)).run,
                "ort": onnxruntime_session(model, threads).run,
            }
            loops = {name: repeated(functools.partial(run, None, feeds)) for name, run in runs.items()}
            samples = Rounds(3).run([loop for loop, _ in loops.values()], args.rounds)
            median = {name: float(np.median(s)) / loops[name][1] * 1e6
                      for name, s in zip(loops, samples, strict=True)}
            ratios[threads].append(median["ours"] / median["ort"])
            print(f"| {channels} x {size} x {size}, {kernel}, {stride} | {threads} | {median['ours']:.0f} "
                  f"| {median['wide']:.0f} | {median['ort']:.0f} | {median['ours'] / median['ort']:.2f} "
                  f"| {median['wide'] / median['ort']:.2f} |", flush=True)
    for threads, values in ratios.items():
        geomean = float(np.exp(np.mean(np.log(values))))
        print(f"\n{threads} thread(s): geometric mean ours / ort {geomean:.2f}, "
              f"range {min(values):.2f}-{max(values):.2f}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
