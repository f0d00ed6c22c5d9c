"""The convolutions of MobileNetV2 (torchvision, 224x224), one Conv node each, in onnx_light
and onnxruntime at 1 and 2 threads, side by side, in one process: its depthwise ones (and
5x5 / 7x7 ones, EfficientNet and ConvNeXt style), its pointwise (1x1) ones, then
MobileNetV3-small's and ShuffleNetV2's depthwise ones and the stems (3x3 stride 2, 3 input
channels) of the three.

Each model is one Conv with seeded random constant weights and a bias. onnx_light runs it
with the portable configuration (a compiled depthwise kernel, per ``depthwise.blocked_outputs``;
``direct_1x1``, one BLAS product, for 1x1) and, for depthwise ones, also with each compiled
kernel everywhere (``depthwise.blocked_outputs`` 0: the per-channel ``depthwise``; out of reach:
the channel-blocked ``depthwise_blocked``, where it applies) and with
``auto.depthwise=im2col_wide`` (the batched BLAS product, the default before the compiled
kernels); the sessions of a thread
count run in the interleaved rounds of ``real_models.Rounds``, each sample a loop of runs
lasting a few milliseconds, and the table gives the fastest and the median sample (time of
one run) and the ratios to onnxruntime's (fastest, which the load of a shared machine
disturbs least). Session times include each runtime's fixed cost per run (about 60 us for
onnx_light, 15 us for onnxruntime: docs/conv.md).

At more than one thread, ``one thread`` is the same session with the compiled kernels' region
off (``parallel.region_flops`` never reached): what the second thread gains inside them.

Run: ``python benchmarks/conv_mobile.py [--threads 1 2] [--rounds 7] [--shapes 0 3 | --model
efficientnet_b0] [--activation silu] [--without-wide] [--only-portable]``
(``--without-wide``: no ``im2col_wide`` sessions, the slowest).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

import numpy as np
import onnx
from _common import looped
from conv_settings import registry_with
from onnx import TensorProto, helper
from real_models import Rounds, onnxruntime_session

from onnx_light.kernels import conv
from onnx_light.runtime.session import RuntimeSession

# (channels, filters, size, kernel, stride, group): MobileNetV2's depthwise convolutions, each
# shape once, 5x5 (EfficientNet-B0) and 7x7 (ConvNeXt-style) ones, more of EfficientNet-B0's
# 5x5 ones (0-16), MobileNetV2's 1x1 ones (17-35), then the other models' depthwise ones and
# the stems (36-53).
SHAPES = [
    (32, 32, 112, 3, 1, 32), (96, 96, 112, 3, 2, 96), (144, 144, 56, 3, 1, 144),
    (144, 144, 56, 3, 2, 144), (192, 192, 28, 3, 1, 192), (192, 192, 28, 3, 2, 192),
    (384, 384, 14, 3, 1, 384), (576, 576, 14, 3, 1, 576), (576, 576, 14, 3, 2, 576),
    (960, 960, 7, 3, 1, 960), (240, 240, 28, 5, 1, 240), (672, 672, 14, 5, 2, 672),
    (384, 384, 14, 7, 1, 384), (768, 768, 7, 7, 1, 768),
    (144, 144, 56, 5, 2, 144), (480, 480, 14, 5, 1, 480), (1152, 1152, 7, 5, 1, 1152),
    (32, 16, 112, 1, 1, 1), (16, 96, 112, 1, 1, 1), (96, 24, 56, 1, 1, 1), (24, 144, 56, 1, 1, 1),
    (144, 24, 56, 1, 1, 1), (144, 32, 28, 1, 1, 1), (32, 192, 28, 1, 1, 1), (192, 32, 28, 1, 1, 1),
    (192, 64, 14, 1, 1, 1), (64, 384, 14, 1, 1, 1), (384, 64, 14, 1, 1, 1), (384, 96, 14, 1, 1, 1),
    (96, 576, 14, 1, 1, 1), (576, 96, 14, 1, 1, 1), (576, 160, 7, 1, 1, 1), (160, 960, 7, 1, 1, 1),
    (960, 160, 7, 1, 1, 1), (960, 320, 7, 1, 1, 1), (320, 1280, 7, 1, 1, 1),
    # 36-43: MobileNetV3-small's depthwise convolutions
    (16, 16, 112, 3, 2, 16), (72, 72, 56, 3, 2, 72), (88, 88, 28, 3, 1, 88), (96, 96, 28, 5, 2, 96),
    (240, 240, 14, 5, 1, 240), (120, 120, 14, 5, 1, 120), (288, 288, 14, 5, 2, 288),
    (576, 576, 7, 5, 1, 576),
    # 44-50: ShuffleNetV2's
    (24, 24, 56, 3, 2, 24), (58, 58, 56, 3, 2, 58), (58, 58, 28, 3, 1, 58), (116, 116, 28, 3, 2, 116),
    (116, 116, 14, 3, 1, 116), (232, 232, 14, 3, 2, 232), (232, 232, 7, 3, 1, 232),
    # 51-53: the stems of MobileNetV3-small, MobileNetV2 and ShuffleNetV2
    (3, 16, 224, 3, 2, 1), (3, 32, 224, 3, 2, 1), (3, 24, 224, 3, 2, 1),
    # 54-57: EfficientNet-B0's depthwise convolutions not above (0-2, 10, 11, 14-16 are its too)
    (240, 240, 28, 3, 2, 240), (480, 480, 14, 3, 1, 480), (672, 672, 14, 5, 1, 672),
    (1152, 1152, 7, 3, 1, 1152),
]
#: MobileNetV2's depthwise shapes (with its stem), EfficientNet-B0's (with its stem)
MOBILENET_V2 = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 52]
EFFICIENTNET_B0 = [0, 1, 2, 14, 10, 54, 55, 15, 56, 11, 16, 57, 52]
SAMPLE_S = 0.004  # each sample: runs for about this long


def repeated(run: Callable[[], object]) -> tuple[Callable[[], object], int]:
    """``run`` looped for about SAMPLE_S, and the loop's count (:func:`_common.looped`)."""
    return looped(run, SAMPLE_S)


def conv_model(channels: int, filters: int, size: int, kernel: int, stride: int,
               group: int, activation: str = "none") -> onnx.ModelProto:
    """One Conv, followed by ``activation``: ``none``, ``relu6`` (Clip 0..6: MobileNetV2's)
    or ``silu`` (Sigmoid and Mul: EfficientNet-B0's), which the runtime fuses."""
    rng = np.random.default_rng(channels * 1000 + size * 10 + kernel + stride)
    w = rng.standard_normal((filters, channels // group, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(filters).astype(np.float32)
    conv_out = "y" if activation == "none" else "c"
    nodes = [helper.make_node("Conv", ["x", "w", "b"], [conv_out], group=group,
                              strides=[stride] * 2, pads=[kernel // 2] * 4)]
    constants = []
    if activation == "relu6":
        nodes.append(helper.make_node("Clip", ["c", "low", "high"], ["y"]))
        constants = [helper.make_tensor("low", TensorProto.FLOAT, [], [0.0]),
                     helper.make_tensor("high", TensorProto.FLOAT, [], [6.0])]
    elif activation == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])
    graph = helper.make_graph(
        nodes, "conv", [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
         helper.make_tensor("b", TensorProto.FLOAT, b.shape, b), *constants])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shapes", type=int, nargs="+", default=None,
                        help="indices into SHAPES (default all)")
    parser.add_argument("--model", choices=("mobilenet_v2", "efficientnet_b0"), default=None,
                        help="that model's depthwise shapes and stem (instead of --shapes)")
    parser.add_argument("--activation", choices=("none", "relu6", "silu"), default="none",
                        help="an activation after each Conv (fused by the runtime)")
    parser.add_argument("--without-wide", action="store_true",
                        help="no im2col_wide sessions (the slowest: a shorter run)")
    parser.add_argument("--only-portable", action="store_true",
                        help="no per-channel, channel-blocked or im2col_wide sessions")
    args = parser.parse_args(argv)
    indices = ({"mobilenet_v2": MOBILENET_V2, "efficientnet_b0": EFFICIENTNET_B0}[args.model]
               if args.model else args.shapes)
    shapes = [SHAPES[i] for i in indices] if indices is not None else SHAPES
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds (a round "
          f"other processes disturbed retaken); activation {args.activation}; us per run, "
          f"fastest (median); ratios of the fastest to onnxruntime's; 'one thread': the session's "
          f"threads, the compiled kernels' region off (parallel.region_flops never reached)")
    print("| C -> M x H x W, k, s, group | threads | onnx_light | one thread | per channel "
          "| channel-blocked | im2col_wide | onnxruntime | ours / ort | one thread / ort "
          "| per channel / ort | blocked / ort | im2col_wide / ort |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios: dict[tuple[str, int], list[float]] = {}
    for channels, filters, size, kernel, stride, group in shapes:
        model = conv_model(channels, filters, size, kernel, stride, group, args.activation)
        feeds = {"x": np.random.default_rng(0).standard_normal((1, channels, size, size)).astype(np.float32)}
        kind = "depthwise" if group > 1 else "pointwise" if kernel == 1 else "full"
        for threads in args.threads:
            runs = {"ours": RuntimeSession(model, num_threads=threads).run}
            if threads > 1 and kind != "pointwise":
                runs["serial"] = RuntimeSession(model, num_threads=threads, registry=registry_with(
                    {conv.REGION_FLOPS: conv.NEVER}, threads)).run
            if kind == "depthwise" and not args.only_portable:
                settings = [("rows", {conv.BLOCKED_OUTPUTS: 0}),
                            ("blocked", {conv.BLOCKED_OUTPUTS: conv.NEVER})]
                if not args.without_wide:
                    settings.append(("wide", {conv.AUTO_DEPTHWISE: "im2col_wide"}))
                for name, setting in settings:
                    runs[name] = RuntimeSession(model, num_threads=threads,
                                                registry=registry_with(setting, threads)).run
            runs["ort"] = onnxruntime_session(model, threads).run
            loops = {name: repeated(functools.partial(run, None, feeds))
                     for name, run in runs.items()}
            samples = Rounds(3).run([loop for loop, _ in loops.values()], args.rounds)
            fastest = {name: min(s) / loops[name][1] * 1e6 for name, s in zip(loops, samples, strict=True)}
            median = {name: float(np.median(s)) / loops[name][1] * 1e6
                      for name, s in zip(loops, samples, strict=True)}
            ratios.setdefault((kind, threads), []).append(fastest["ours"] / fastest["ort"])
            cells = {name: f"{fastest[name]:.0f} ({median[name]:.0f})" for name in fastest}
            for name in ("serial", "rows", "blocked"):
                if name in fastest:
                    ratios.setdefault((f"{kind} ({name})", threads), []).append(
                        fastest[name] / fastest["ort"])
            versus = {name: f"{fastest[name] / fastest['ort']:.2f}" if name in fastest else "-"
                      for name in ("serial", "rows", "blocked", "wide")}
            print(f"| {channels} -> {filters} x {size} x {size}, {kernel}, {stride}, {group} | {threads} "
                  f"| {cells['ours']} | {cells.get('serial', '-')} | {cells.get('rows', '-')} "
                  f"| {cells.get('blocked', '-')} | {cells.get('wide', '-')} | {cells['ort']} "
                  f"| {fastest['ours'] / fastest['ort']:.2f} | {versus['serial']} | {versus['rows']} "
                  f"| {versus['blocked']} | {versus['wide']} |", flush=True)
    for (kind, threads), values in ratios.items():
        geomean = float(np.exp(np.mean(np.log(values))))
        print(f"\n{kind}, {threads} thread(s): geometric mean ours / ort {geomean:.2f}, "
              f"range {min(values):.2f}-{max(values):.2f}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
