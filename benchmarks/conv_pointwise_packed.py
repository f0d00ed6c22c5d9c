"""The 1x1 convolutions of MobileNetV2 and EfficientNet-B0: ``direct_1x1`` with
``pointwise.product`` = ``blas`` (numpy's BLAS per tile of positions) and ``packed`` (the
packed micro-kernel of ``kernels/packed_gemm.py`` reading the input's rows as its panels),
``transposed`` (``pointwise.transposed_positions`` = ``--positions``, 49 unless given: the
micro-kernel transposed on planes up to 7x7, the weights packed once as its panels), ``rows``
(``pointwise.rows_positions`` = ``--rows``, 2 unless given: the weights packed once as the
micro-kernel's rows, ``conv/pointwise_rows.py``; with ``transposed``'s value below it), and
onnxruntime's Conv, side by side in one process.

Each shape is one Conv node (seeded random constant weights, a bias, and optionally a fused
Relu6 as a Clip) in three one-thread sessions (onnxruntime's with one intra-op thread), which
all run on the calling thread: each sample is the thread CPU time of a loop of runs lasting a
few milliseconds (which other programs on a shared machine disturb far less than wall time),
the sessions interleaved, their order alternating; the table gives the median sample (time of
one run, each session's fixed cost per run included) and the ratios of the medians.

``--zoo mobilenet_v2 ...`` times whole models of ``model_zoo.py`` instead (their cached
exports), one-thread sessions of each configuration, in the same way (each sample three
runs). ``--planes mobilenet_v2 ...`` times each model's 1x1 convolutions in two one-thread
sessions (``blas`` and ``transposed``), runs interleaved: the thread CPU time of each
compiled call (``PointwiseCall``) inside the runs, medians per shape summed by plane size,
and the whole runs.

Run: ``python benchmarks/conv_pointwise_packed.py [--rounds 15] [--relu6] [--zoo MODEL ...]
[--planes MODEL ...] [--positions 49] [--rows 2]``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import time
from collections.abc import Callable

import numpy as np
import onnx
from conv_mobile import repeated
from conv_settings import load_model, registry_with
from onnx import TensorProto, helper
from real_models import onnxruntime_session

from onnx_light.kernels import conv, packed_gemm
from onnx_light.kernels.conv import pointwise
from onnx_light.runtime.session import RuntimeSession

# (channels, filters, size): MobileNetV2's and EfficientNet-B0's 1x1 convolutions (224x224).
SHAPES = [
    (32, 16, 112), (16, 96, 112), (96, 24, 56), (24, 144, 56), (144, 24, 56), (144, 32, 28),
    (192, 32, 28), (240, 40, 28), (384, 64, 14), (576, 96, 14), (480, 112, 14), (672, 192, 7),
    (960, 160, 7), (320, 1280, 7), (160, 960, 7), (96, 576, 14), (2048, 512, 7), (512, 2048, 7),
]
# The configurations compared: pointwise.product's values, and the transposed product (over
# this machine's values: its processor profile may set pointwise.transposed_positions).
CONFIGS = {"blas": {conv.POINTWISE_PRODUCT: "blas", conv.POINTWISE_TRANSPOSED: 0, conv.POINTWISE_ROWS: 0},
           "packed": {conv.POINTWISE_PRODUCT: "packed", conv.POINTWISE_TRANSPOSED: 0, conv.POINTWISE_ROWS: 0},
           "transposed": {conv.POINTWISE_PRODUCT: "blas", conv.POINTWISE_TRANSPOSED: 49,
                          conv.POINTWISE_ROWS: 0},
           "rows": {conv.POINTWISE_PRODUCT: "blas", conv.POINTWISE_TRANSPOSED: 0, conv.POINTWISE_ROWS: 2}}


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


def cpu_samples(loops: list[Callable[[], object]], rounds: int) -> list[list[float]]:
    """Thread CPU seconds of each loop, ``rounds`` times, interleaved, the order alternating."""
    samples: list[list[float]] = [[] for _ in loops]
    for round_ in range(rounds):
        order = range(len(loops)) if round_ % 2 == 0 else reversed(range(len(loops)))
        for index in order:
            start = time.thread_time()
            loops[index]()
            samples[index].append(time.thread_time() - start)
    return samples


def _sessions(model: onnx.ModelProto) -> dict[str, Callable[..., object]]:
    """One-thread sessions of ``model`` with each configuration of :data:`CONFIGS`."""
    return {name: RuntimeSession(model, num_threads=1, registry=registry_with(values, 1)).run
            for name, values in CONFIGS.items()}


def whole_models(names: list[str], rounds: int) -> int:
    """The table of whole models, each configuration against blas."""
    print(f"load average {os.getloadavg()[0]:.1f}; {rounds} interleaved rounds; thread CPU ms per "
          f"run (median); one thread")
    print("| model | blas | packed | transposed | rows | packed / blas | transposed / blas | rows / blas |\n"
          "|---|---|---|---|---|---|---|---|")
    for name in names:
        model, feeds = load_model(name)
        runs = _sessions(model)

        def three(run: Callable[..., object], feeds: dict[str, np.ndarray] = feeds) -> None:
            for _ in range(3):
                run(None, feeds)

        loops = [functools.partial(three, run) for run in runs.values()]
        for loop in loops:
            loop()
        blas, packed, transposed, rows = (float(np.median(s)) / 3 * 1e3 for s in cpu_samples(loops, rounds))
        print(f"| {name} | {blas:.2f} | {packed:.2f} | {transposed:.2f} | {rows:.2f} | {packed / blas:.3f} "
              f"| {transposed / blas:.3f} | {rows / blas:.3f} |", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


def plane_classes(names: list[str], runs: int) -> int:
    """The table of each model's 1x1 convolutions by plane size, blas against transposed."""
    timed_call = pointwise.PointwiseCall.__call__
    session_name = ["blas"]
    times: dict[str, dict[tuple[int, int, int], list[int]]] = collections.defaultdict(dict)

    def call(self: pointwise.PointwiseCall, *arguments: object) -> np.ndarray:
        start = time.thread_time_ns()
        out = timed_call(self, *arguments)
        times[session_name[0]].setdefault((self.filters, self.depth, self.plane), []).append(
            time.thread_time_ns() - start)
        return out

    print(f"load average {os.getloadavg()[0]:.1f}; {runs} interleaved runs; thread CPU us per run "
          f"(the medians of each shape's calls, summed); one thread")
    pointwise.PointwiseCall.__call__ = call
    try:
        for name in names:
            model, feeds = load_model(name)
            runs_of = {key: RuntimeSession(model, num_threads=1, registry=registry_with(CONFIGS[key], 1)).run
                       for key in ("blas", "transposed")}
            whole: dict[str, list[int]] = collections.defaultdict(list)
            for round_ in range(runs + 3):
                if round_ == 3:  # the first rounds warm up
                    whole.clear()
                    times.clear()
                for key in (runs_of if round_ % 2 == 0 else list(runs_of)[::-1]):
                    session_name[0] = key
                    start = time.thread_time_ns()
                    runs_of[key](None, feeds)
                    whole[key].append(time.thread_time_ns() - start)
            sums: dict[str, dict[int, float]] = {key: collections.defaultdict(float) for key in runs_of}
            for key in runs_of:
                for shape, values in times[key].items():
                    sums[key][shape[2]] += float(np.median(values)) * len(values) / runs / 1e3
            print(f"\n{name}\n\n| plane | blas | transposed | transposed / blas |\n|---|---|---|---|")
            for plane in sorted(sums["blas"], reverse=True):
                blas, transposed = sums["blas"][plane], sums["transposed"][plane]
                print(f"| {plane} | {blas:.0f} | {transposed:.0f} | {transposed / blas:.3f} |")
            blas, transposed = (float(np.median(whole[key])) / 1e3 for key in runs_of)
            print(f"| whole run | {blas:.0f} | {transposed:.0f} | {transposed / blas:.3f} |", flush=True)
    finally:
        pointwise.PointwiseCall.__call__ = timed_call
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--relu6", action="store_true", help="a Clip(0, 6) after each Conv")
    parser.add_argument("--zoo", nargs="+", default=[], help="whole models of model_zoo.py instead")
    parser.add_argument("--positions", type=int, default=49,
                        help="pointwise.transposed_positions of the transposed configuration")
    parser.add_argument("--rows", type=int, default=2,
                        help="pointwise.rows_positions of the rows configuration")
    parser.add_argument("--planes", nargs="+", default=[],
                        help="models whose 1x1 convolutions to time by plane size instead")
    args = parser.parse_args(argv)
    CONFIGS["transposed"][conv.POINTWISE_TRANSPOSED] = args.positions
    CONFIGS["rows"].update({conv.POINTWISE_ROWS: args.rows, conv.POINTWISE_TRANSPOSED: args.positions})
    if args.planes:
        return plane_classes(args.planes, args.rounds)
    if not packed_gemm.available():
        print("neither AVX2 and FMA nor AVX-512F: packed runs the BLAS tiles")
    if args.zoo:
        return whole_models(args.zoo, args.rounds)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds; thread CPU "
          f"us per run (median); one thread; relu6 {args.relu6}")
    print("| C -> M at size | blas | packed | transposed | rows | onnxruntime | packed / blas "
          "| transposed / blas | rows / blas | blas / ort | transposed / ort | rows / ort |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios, transposed, rows = [], [], []
    for channels, filters, size in SHAPES:
        model = pointwise_model(channels, filters, size, args.relu6)
        feeds = {"x": np.random.default_rng(0).standard_normal((1, channels, size, size)).astype(np.float32)}
        runs = _sessions(model)
        runs["ort"] = onnxruntime_session(model, 1).run
        loops = {name: repeated(functools.partial(run, None, feeds)) for name, run in runs.items()}
        samples = cpu_samples([loop for loop, _ in loops.values()], args.rounds)
        median = {name: float(np.median(s)) / loops[name][1] * 1e6
                  for name, s in zip(loops, samples, strict=True)}
        ratios.append(median["packed"] / median["blas"])
        transposed.append(median["transposed"] / median["blas"])
        rows.append(median["rows"] / median["blas"])
        print(f"| {channels} -> {filters} at {size}x{size} | {median['blas']:.0f} "
              f"| {median['packed']:.0f} | {median['transposed']:.0f} | {median['rows']:.0f} "
              f"| {median['ort']:.0f} | {ratios[-1]:.2f} | {transposed[-1]:.2f} | {rows[-1]:.2f} "
              f"| {median['blas'] / median['ort']:.2f} | {median['transposed'] / median['ort']:.2f} "
              f"| {median['rows'] / median['ort']:.2f} |", flush=True)
    for name, values in (("packed", ratios), ("transposed", transposed), ("rows", rows)):
        geomean = float(np.exp(np.mean(np.log(values))))
        print(f"\ngeometric mean {name} / blas {geomean:.2f}, range {min(values):.2f}-{max(values):.2f}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
