"""The 1x1 convolutions of MobileNetV2 and EfficientNet-B0: ``direct_1x1`` with
``pointwise.product`` = ``blas`` (numpy's BLAS per tile of positions) and ``packed`` (the
AVX-512 micro-kernel reading the input's rows as its panels), and onnxruntime's Conv, side by
side in one process.

Each shape is one Conv node (seeded random constant weights, a bias, and optionally a fused
Relu6 as a Clip) in three sessions run in the interleaved rounds of ``real_models.Rounds``,
each sample a loop of runs lasting a few milliseconds; the table gives the median sample (time
of one run, which includes each session's fixed cost per run) and the ratios of the medians.

Run: ``python benchmarks/conv_pointwise_packed.py [--threads 1 2] [--rounds 7] [--relu6]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import numpy as np
import onnx
from conv_mobile import repeated
from conv_settings import registry_with
from onnx import TensorProto, helper
from real_models import Rounds, onnxruntime_session

from onnx_light.kernels import conv, packed_gemm
from onnx_light.runtime.session import RuntimeSession

# (channels, filters, size): MobileNetV2's and EfficientNet-B0's 1x1 convolutions (224x224).
SHAPES = [
    (32, 16, 112), (16, 96, 112), (96, 24, 56), (24, 144, 56), (144, 24, 56), (144, 32, 28),
    (192, 32, 28), (240, 40, 28), (384, 64, 14), (576, 96, 14), (480, 112, 14), (672, 192, 7),
    (960, 160, 7), (320, 1280, 7),
]


def pointwise_model(channels: int, filters: int, size: int, relu6: bool) -> onnx.ModelProto:
    """One 1x1 Conv with a bias (and a Clip to [0, 6] after it when ``relu6``)."""
    rng = np.random.default_rng(channels * 1000 + filters * 10 + size)
    w = (rng.standard_normal((filters, channels, 1, 1)) / np.sqrt(channels)).astype(np.float32)
    b = rng.standard_normal(filters).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if relu6 else "y"])]
    initializers = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
                    helper.make_tensor("b", TensorProto.FLOAT, b.shape, b)]
    if relu6:
        nodes.append(helper.make_node("Clip", ["c", "low", "high"], ["y"]))
        initializers += [helper.make_tensor("low", TensorProto.FLOAT, [], [0.0]),
                         helper.make_tensor("high", TensorProto.FLOAT, [], [6.0])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])
    graph = helper.make_graph(nodes, "pointwise", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--relu6", action="store_true", help="a Clip(0, 6) after each Conv")
    args = parser.parse_args(argv)
    if not packed_gemm.available():
        print("no AVX-512F: packed runs the BLAS tiles")
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds; us per run "
          f"(median); relu6 {args.relu6}")
    print("| C -> M at size | threads | blas | packed | onnxruntime | packed / blas | blas / ort "
          "| packed / ort |\n|---|---|---|---|---|---|---|---|")
    ratios: dict[int, list[float]] = {}
    for channels, filters, size in SHAPES:
        model = pointwise_model(channels, filters, size, args.relu6)
        feeds = {"x": np.random.default_rng(0).standard_normal((1, channels, size, size)).astype(np.float32)}
        for threads in args.threads:
            runs = {product: RuntimeSession(model, num_threads=threads, registry=registry_with(
                {conv.POINTWISE_PRODUCT: product}, threads)).run for product in ("blas", "packed")}
            runs["ort"] = onnxruntime_session(model, threads).run
            loops = {name: repeated(functools.partial(run, None, feeds)) for name, run in runs.items()}
            samples = Rounds(3).run([loop for loop, _ in loops.values()], args.rounds)
            median = {name: float(np.median(s)) / loops[name][1] * 1e6
                      for name, s in zip(loops, samples, strict=True)}
            ratios.setdefault(threads, []).append(median["packed"] / median["blas"])
            print(f"| {channels} -> {filters} at {size}x{size} | {threads} | {median['blas']:.0f} "
                  f"| {median['packed']:.0f} | {median['ort']:.0f} "
                  f"| {median['packed'] / median['blas']:.2f} | {median['blas'] / median['ort']:.2f} "
                  f"| {median['packed'] / median['ort']:.2f} |", flush=True)
    for threads, values in ratios.items():
        geomean = float(np.exp(np.mean(np.log(values))))
        print(f"\n{threads} thread(s): geometric mean packed / blas {geomean:.2f}, "
              f"range {min(values):.2f}-{max(values):.2f}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
