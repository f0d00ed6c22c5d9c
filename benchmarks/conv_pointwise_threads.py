"""The 1x1 convolutions of MobileNetV2 (bias and Relu6) and EfficientNet-B0 (bias and SiLU on
the expansions, bias alone on the projections) at one and two threads, in onnx_light and
onnxruntime, side by side in one process, timed at quiet instants.

Each shape is one Conv node (seeded random constant weights) and its activation in one-node
sessions: onnx_light at one thread, at two threads with the portable values (``2``: the units
of ``direct_1x1`` shared by a numba region from ``pointwise.minimum_flops``), at two threads
with ``pointwise.minimum_flops`` set to never (``2 serial``: the same units on the calling
thread) and, with ``--threshold``, set to 1 (``2 always``); onnxruntime at one and two intra-op
threads. Each sample is the wall time of a loop of runs lasting about 1 ms; it counts only if
both processors were free just before and just after it (:class:`Probe`: no other task
runnable, and a compiled loop on two numba threads at most ``--probe-ratio`` times as long
as on one; two-thread wall times
mean nothing on a loaded machine), else it is taken again. The variants take turns; the
table gives the median time of one run in microseconds (each session's fixed cost per run
included) and the ratios.

``--cut-cost MODEL ...`` times whole models of ``model_zoo.py`` at one thread instead, with the
large one-tile products cut in two units (the default, :func:`pointwise.product_units`) and
not, in thread CPU time (interleaved, three runs a sample): what the cut costs one thread.

Run: ``python benchmarks/conv_pointwise_threads.py [--samples 9] [--models mobilenet_v2
efficientnet_b0] [--threshold] [--max-seconds 170]`` or ``... --cut-cost mobilenet_v2
efficientnet_b0 [--rounds 11]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import onnx
from _common import looped, onnxruntime_session
from conv_pointwise_packed import cpu_samples
from conv_settings import load_model, registry_with
from hot_regions import others_runnable
from onnx import TensorProto, helper

from onnx_light.kernels import conv
from onnx_light.kernels.compiled import load_numba
from onnx_light.kernels.compiled_elementwise import numba_threads
from onnx_light.kernels.conv import pointwise
from onnx_light.runtime.session import RuntimeSession

# (channels, filters, size, activation) of each model's 1x1 convolutions (224x224), each once.
SHAPES = {
    "mobilenet_v2": [
        (32, 16, 112, "none"), (16, 96, 112, "relu6"), (96, 24, 56, "none"), (24, 144, 56, "relu6"),
        (144, 24, 56, "none"), (144, 32, 28, "none"), (32, 192, 28, "relu6"), (192, 32, 28, "none"),
        (192, 64, 14, "none"), (64, 384, 14, "relu6"), (384, 64, 14, "none"), (384, 96, 14, "none"),
        (96, 576, 14, "relu6"), (576, 96, 14, "none"), (576, 160, 7, "none"), (160, 960, 7, "relu6"),
        (960, 160, 7, "none"), (960, 320, 7, "none"), (320, 1280, 7, "relu6"),
    ],
    "efficientnet_b0": [
        (16, 96, 112, "silu"), (96, 24, 56, "none"), (24, 144, 56, "silu"), (144, 24, 56, "none"),
        (144, 40, 28, "none"), (40, 240, 28, "silu"), (240, 40, 28, "none"), (240, 80, 14, "none"),
        (80, 480, 14, "silu"), (480, 80, 14, "none"), (480, 112, 14, "none"), (112, 672, 14, "silu"),
        (672, 112, 14, "none"), (672, 192, 7, "none"), (192, 1152, 7, "silu"),
        (1152, 192, 7, "none"), (1152, 320, 7, "none"), (320, 1280, 7, "silu"),
    ],
}
SAMPLE_S = 0.001


def pointwise_model(channels: int, filters: int, size: int, activation: str) -> onnx.ModelProto:
    """One 1x1 Conv with a bias, then a Clip to [0, 6] (``relu6``), x * Sigmoid(x) (``silu``)
    or nothing."""
    rng = np.random.default_rng(channels * 1000 + filters * 10 + size)
    w = (rng.standard_normal((filters, channels, 1, 1)) / np.sqrt(channels)).astype(np.float32)
    b = rng.standard_normal(filters).astype(np.float32)
    last = "c" if activation != "none" else "y"
    nodes = [helper.make_node("Conv", ["x", "w", "b"], [last])]
    initializers = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
                    helper.make_tensor("b", TensorProto.FLOAT, b.shape, b)]
    if activation == "relu6":
        nodes.append(helper.make_node("Clip", ["c", "low", "high"], ["y"]))
        initializers += [helper.make_tensor("low", TensorProto.FLOAT, [], [0.0]),
                         helper.make_tensor("high", TensorProto.FLOAT, [], [6.0])]
    elif activation == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])
    graph = helper.make_graph(nodes, "pointwise", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ours(model: onnx.ModelProto, threads: int, minimum: int | None) -> Callable[..., object]:
    """An onnx_light session's run: portable values, ``pointwise.minimum_flops`` set to
    ``minimum`` unless None."""
    setting = {} if minimum is None else {conv.POINTWISE_MINIMUM_FLOPS: minimum}
    return RuntimeSession(model, num_threads=threads, registry=registry_with(setting, threads)).run


class Probe:
    """Whether both processors are free: a compiled loop of about 100 us run on two numba
    threads at once takes about its one-thread time only if neither thread waited for a
    processor (``/proc/loadavg``'s running count, read at an instant, misses a program that
    runs in bursts)."""

    def __init__(self, ratio: float) -> None:
        numba = load_numba()
        self.ratio = ratio

        @numba.njit(nogil=True)
        def spin(values: np.ndarray, n: int) -> float:
            total = 0.0
            for i in range(n):
                total = total * 0.999 + values[i % values.size]
            return total

        @numba.njit(parallel=True, nogil=True)
        def pair(values: np.ndarray, n: int, out: np.ndarray) -> None:
            for t in numba.prange(2):
                out[t] = spin(values, n)

        self.spin, self.pair = spin, pair
        self.values, self.out = np.random.default_rng(0).random(1000), np.zeros(2)
        numba_threads(2)
        self.n = 1000
        self._time(self.spin), self._time(self.pair)  # compiled first
        while self._time(self.spin) < 1e-4:
            self.n *= 2
        self.alone = min(self._time(self.spin) for _ in range(20))

    def _time(self, function: Callable[..., object]) -> float:
        started = time.perf_counter()
        if function is self.pair:
            function(self.values, self.n, self.out)
        else:
            function(self.values, self.n)
        return time.perf_counter() - started

    def quiet(self) -> bool:
        """Both numba threads ran the loop within ``ratio`` times its one-thread time."""
        numba_threads(2)
        return others_runnable() == 0 and self._time(self.pair) < self.ratio * self.alone


def quiet_samples(loops: dict[str, tuple[Callable[[], object], int]], samples: int,
                  deadline: float, probe: Probe) -> tuple[dict[str, list[float]], int]:
    """Seconds per run of each loop, ``samples`` each (fewer at the deadline), counted only
    when the probe finds both processors free just before and just after it; and the samples
    taken again."""
    times: dict[str, list[float]] = {name: [] for name in loops}
    retakes = 0
    names = list(loops)
    turn = 0
    while min(map(len, times.values())) < samples and time.monotonic() < deadline:
        name = names[turn % len(names)]
        loop, count = loops[name]
        while not probe.quiet() and time.monotonic() < deadline:
            time.sleep(0.002)
        started = time.perf_counter()
        loop()
        elapsed = time.perf_counter() - started
        if not probe.quiet():
            retakes += 1
            continue
        times[name].append(elapsed / count)
        turn += 1
    return times, retakes


def cut_cost(names: list[str], rounds: int) -> int:
    """Whole models at one thread, the large one-tile products cut in two (the default) and
    not (``CUT_MULTIPLY_ADDS`` out of reach): thread CPU ms per run, interleaved."""
    print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load average "
          f"{os.getloadavg()[0]:.2f}; {rounds} interleaved rounds, each three runs; thread CPU ms per "
          f"run (median); one thread")
    print("\n| model | cut | not cut | cut / not cut |\n|---|---:|---:|---:|")
    default = pointwise.CUT_MULTIPLY_ADDS
    for name in names:
        model, feeds = load_model(name)
        run = RuntimeSession(model, num_threads=1, registry=registry_with({}, 1)).run

        def three(cut: int, run: Callable[..., object] = run, feeds: dict = feeds) -> None:
            pointwise.CUT_MULTIPLY_ADDS = cut
            pointwise._CALLS.clear()
            for _ in range(3):
                run(None, feeds)

        loops = [functools.partial(three, default), functools.partial(three, 1 << 62)]
        for loop in loops:
            loop()
        cut, whole = (float(np.median(s)) / 3 * 1e3 for s in cpu_samples(loops, rounds))
        print(f"| {name} | {cut:.2f} | {whole:.2f} | {cut / whole:.3f} |", flush=True)
    pointwise.CUT_MULTIPLY_ADDS = default
    pointwise._CALLS.clear()
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=9)
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--threshold", action="store_true",
                        help="also two threads with pointwise.minimum_flops 1 (always shared)")
    parser.add_argument("--max-seconds", type=float, default=170.0)
    parser.add_argument("--probe-ratio", type=float, default=1.5,
                        help="a sample counts when the probe's two threads take at most this "
                             "many times its one-thread time (1: a perfectly free machine)")
    parser.add_argument("--cut-cost", nargs="+", default=[], metavar="MODEL",
                        help="instead: whole zoo models at one thread, cut against not cut")
    parser.add_argument("--rounds", type=int, default=11, help="with --cut-cost")
    args = parser.parse_args(argv)
    if args.cut_cost:
        return cut_cost(args.cut_cost, args.rounds)
    deadline = time.monotonic() + args.max_seconds
    probe = Probe(args.probe_ratio)
    print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load average "
          f"{os.getloadavg()[0]:.2f}; median us per run over {args.samples} quiet samples (probe: "
          f"two threads within {args.probe_ratio} of one thread's {probe.alone * 1e6:.0f} us)")
    variants = {"1": (1, None), "2": (2, None), "2 serial": (2, 1 << 62)}
    if args.threshold:
        variants["2 always"] = (2, 1)
    head = " | ".join(f"{name}" for name in variants)
    print(f"\n| model: C -> M at size, activation | M-adds | {head} | ort 1 | ort 2 | 2 / 1 | 2 / ort 2 "
          f"| 1 / ort 1 |\n|---|---:|{'---:|' * len(variants)}---:|---:|---:|---:|---:|")
    totals: dict[str, float] = {}
    retaken = 0
    for model_name in args.models:
        for channels, filters, size, activation in SHAPES[model_name]:
            model = pointwise_model(channels, filters, size, activation)
            x = np.random.default_rng(0).standard_normal((1, channels, size, size))
            feeds = {"x": x.astype(np.float32)}
            runs = {name: ours(model, threads, minimum) for name, (threads, minimum) in variants.items()}
            runs["ort 1"] = onnxruntime_session(model, 1).run
            runs["ort 2"] = onnxruntime_session(model, 2).run
            expected = runs["ort 1"](None, feeds)[0]
            scale = float(np.abs(expected).max())
            for run in runs.values():
                np.testing.assert_allclose(run(None, feeds)[0], expected, rtol=1e-4, atol=1e-4 * scale)
            loops = {name: looped(functools.partial(run, None, feeds), SAMPLE_S)
                     for name, run in runs.items()}
            times, retakes = quiet_samples(loops, args.samples, deadline, probe)
            retaken += retakes
            if not all(times.values()):
                print(f"| {model_name}: {channels} -> {filters} at {size}x{size}: no quiet sample before "
                      f"the deadline |")
                break
            median = {name: statistics.median(values) * 1e6 for name, values in times.items()}
            for name, value in median.items():
                totals[f"{model_name} {name}"] = totals.get(f"{model_name} {name}", 0.0) + value
            cells = " | ".join(f"{median[name]:.0f}" for name in variants)
            print(f"| {model_name}: {channels} -> {filters} at {size}x{size}, {activation} "
                  f"| {channels * filters * size * size / 1e6:.1f}M | {cells} | {median['ort 1']:.0f} "
                  f"| {median['ort 2']:.0f} | {median['2'] / median['1']:.2f} "
                  f"| {median['2'] / median['ort 2']:.2f} | {median['1'] / median['ort 1']:.2f} |",
                  flush=True)
    for model_name in args.models:
        if f"{model_name} 1" in totals:
            t = {name: totals[f"{model_name} {name}"] for name in [*variants, "ort 1", "ort 2"]}
            cells = " | ".join(f"{t[name]:.0f}" for name in variants)
            print(f"| {model_name}: sum | | {cells} | {t['ort 1']:.0f} | {t['ort 2']:.0f} "
                  f"| {t['2'] / t['1']:.2f} | {t['2'] / t['ort 2']:.2f} | {t['1'] / t['ort 1']:.2f} |")
    print(f"\n{retaken} samples taken again; load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
