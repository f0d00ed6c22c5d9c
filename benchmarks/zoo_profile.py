"""Where a model's time goes, per operator type and per convolution shape class, in onnx_light
and in onnxruntime (each runtime's own per-node profile), side by side.

Each model of the zoo (``model_zoo.py``'s cached exports, seeded random weights) runs in one
onnx_light session with a node hook (``RuntimeSession.run(node_hook=...)``, the hook of
``SessionOptions.enable_profiling``) and one onnxruntime session with
``SessionOptions.enable_profiling``, in interleaved rounds; each node's time is its median
over the runs. A node's time in onnx_light is a whole step of the plan, a fused chain
included (it carries its first node's name); onnxruntime fuses too (``FusedConv`` with its
activation, the NCHWc convolutions with their reorders). Convolutions are classed by their
weights (through a QDQ model's DequantizeLinear) as
``pointwise`` (1x1), ``depthwise KxK`` (one input channel per group), ``stem``
(at most 4 input channels), ``grouped KxK`` or ``full KxK``; the rest by operator type (ORT's
NCHWc reorders as ``reorder``). The totals are the sums of the node medians, which leave out
each runtime's time between nodes: the ``run`` row is the median of whole runs.

Run: ``python benchmarks/zoo_profile.py [--models mobilenet_v2 bert ...] [--threads 1] [--runs 30]``
(any model of ``model_zoo.py``; a transformer's table is per operator type, having no Conv
but its patch or feature embedding).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import _common
import model_zoo
import numpy as np
import onnx
from onnx import numpy_helper

from onnx_light.runtime.session import RuntimeSession

ACTIVATIONS = {"Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu"}


def conv_classes(model: onnx.ModelProto) -> dict[str, str]:
    """The shape class of each Conv node, by node name and by the names of its output and of
    the outputs of the activations that follow it alone (onnxruntime names a fused node after
    its last output)."""
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            weights[node.output[0]] = tuple(numpy_helper.to_array(node.attribute[0].t).shape)
        elif node.op_type == "DequantizeLinear" and node.input[0] in weights:  # a QDQ model's
            weights[node.output[0]] = weights[node.input[0]]
    consumers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            consumers[name].append(node)
    classes = {}
    for node in model.graph.node:
        if node.op_type != "Conv" or node.input[1] not in weights:
            continue
        shape = weights[node.input[1]]
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        kernel = "x".join(map(str, shape[2:]))
        if all(k == 1 for k in shape[2:]):
            name = "pointwise"
        elif shape[1] == 1 and group > 1:
            name = f"depthwise {kernel}"
        elif shape[1] * group <= 4:
            name = f"stem {kernel}"
        else:
            name = f"{'grouped' if group > 1 else 'full'} {kernel}"
        strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [1])
        name += " /2" if max(strides) > 1 else ""
        classes[node.name] = name
        output = node.output[0]
        while True:
            classes[output] = name
            following = consumers.get(output, [])
            if len(following) != 1 or following[0].op_type not in ACTIVATIONS:
                break
            output = following[0].output[0]
    return classes


def node_class(name: str, op_type: str, classes: dict[str, str]) -> str:
    """The class of a profiled node: its convolution's shape class (onnxruntime's NCHWc
    nodes are named after their output, with a suffix, and its QDQ fusions after their
    Conv, with ``_token_N``) or its operator type."""
    if op_type.startswith("Reorder"):
        return "reorder"
    return classes.get(re.sub(r"(_nchwc|_token_\d+)$", "", name), op_type)


class OurProfile:
    """An onnx_light session whose runs record each step's time."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int) -> None:
        self.session = RuntimeSession(model.SerializeToString(), num_threads=threads)
        self.feeds = feeds
        self.times: dict[str, list[float]] = collections.defaultdict(list)
        self.types: dict[str, str] = {}
        self.runs: list[float] = []

    def hook(self, name: str, op_type: str) -> Callable[[], None]:
        started = time.perf_counter()
        self.types[name] = op_type

        def done() -> None:
            self.times[name].append(time.perf_counter() - started)

        return done

    def run(self) -> None:
        started = time.perf_counter()
        self.session.run(None, self.feeds, node_hook=self.hook)
        self.runs.append(time.perf_counter() - started)


class TheirProfile:
    """An onnxruntime session with its profiler on; the events are read at the end."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int,
                 folder: str) -> None:
        self.session = _common.onnxruntime_session(model, threads, os.path.join(folder, "ort"))
        self.feeds = feeds
        self.runs: list[float] = []

    def run(self) -> None:
        started = time.perf_counter()
        self.session.run(None, self.feeds)
        self.runs.append(time.perf_counter() - started)

    def node_times(self, skip: int) -> tuple[dict[str, list[float]], dict[str, str]]:
        """Each node's times (seconds) after the first ``skip`` runs, and its operator type."""
        events = json.loads(Path(self.session.end_profiling()).read_text())
        times: dict[str, list[float]] = collections.defaultdict(list)
        types: dict[str, str] = {}
        counts: dict[str, int] = collections.Counter()
        for event in events:
            if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
                continue
            name = event["name"][:-len("_kernel_time")]
            counts[name] += 1
            if counts[name] > skip:
                times[name].append(event["dur"] * 1e-6)
                types[name] = event["args"]["op_name"]
        return times, types


def grouped(times: dict[str, list[float]], types: dict[str, str], classes: dict[str, str]
            ) -> dict[str, tuple[float, int]]:
    """Per class: the sum of its nodes' medians (seconds) and the node count."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for name, values in times.items():
        entry = totals[node_class(name, types[name], classes)]
        entry[0] += statistics.median(values)
        entry[1] += 1
    return {k: (v[0], int(v[1])) for k, v in totals.items()}


def profile(name: str, threads: int, runs: int, folder: str) -> _common.Table:
    spec = model_zoo.MODELS[name]
    feeds = model_zoo.model_feeds(spec)
    path, _ = model_zoo.model_file(spec, feeds, model_zoo.default_cache_dir(), model_zoo.package_versions(),
                                   model_zoo.torch_export)
    model = onnx.load(str(path))
    classes = conv_classes(model)
    ours, theirs = OurProfile(model, feeds, threads), TheirProfile(model, feeds, threads, folder)
    warm = 3
    for _ in range(warm):
        ours.run()
        theirs.run()
    ours.times.clear()
    ours.runs.clear()
    theirs.runs.clear()
    for _ in range(runs):
        ours.run()
        theirs.run()
    mine = grouped(ours.times, ours.types, classes)
    their_times, their_types = theirs.node_times(warm)
    other = grouped(their_times, their_types, classes)
    rows = []
    for key in sorted(set(mine) | set(other), key=lambda k: -mine.get(k, (0.0, 0))[0]):
        a, b = mine.get(key, (0.0, 0)), other.get(key, (0.0, 0))
        rows.append([key, a[1], f"{a[0] * 1e3:.2f}", b[1], f"{b[0] * 1e3:.2f}",
                     f"{a[0] / b[0]:.2f}" if b[0] else "-"])
    sum_a, sum_b = sum(v[0] for v in mine.values()), sum(v[0] for v in other.values())
    run_a, run_b = statistics.median(ours.runs), statistics.median(theirs.runs)
    rows.append(["nodes' sum", sum(v[1] for v in mine.values()), f"{sum_a * 1e3:.2f}",
                 sum(v[1] for v in other.values()), f"{sum_b * 1e3:.2f}", f"{sum_a / sum_b:.2f}"])
    rows.append(["run", "", f"{run_a * 1e3:.2f}", "", f"{run_b * 1e3:.2f}", f"{run_a / run_b:.2f}"])
    return _common.Table(f"## {name}, {threads} thread(s), medians of {runs} runs",
                         ["class", "nodes", "onnx_light ms", "ort nodes", "onnxruntime ms", "ratio"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v2", "efficientnet_b0",
                                                        "mobilenet_v3_small", "convnext_tiny"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)
    print(f"load average (1 min) at start {_common.load_average():.2f}  ")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            print("\n" + profile(name, args.threads, args.runs, folder).markdown())
    print(f"\nload average (1 min) at end {_common.load_average():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
