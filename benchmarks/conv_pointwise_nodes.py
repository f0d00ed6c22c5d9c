"""Each 1x1 convolution of a zoo model against onnxruntime's, per shape: time and GMAC/s.

The model (``model_zoo.py``'s cached export, seeded random weights) runs in an onnx_light
session with a node hook and in an onnxruntime session with its profiler
(``zoo_profile.OurProfile``, ``TheirProfile``), one thread, runs interleaved; each node's time
is its median, averaged over the nodes of one shape (C -> M filters on HW positions; a fused
activation is in both runtimes' node). Per plane size, the sums. ``--positions N`` sets
``pointwise.transposed_positions`` (over the portable values) instead of this machine's
profile.

Run: ``python benchmarks/conv_pointwise_nodes.py [--models mobilenet_v2 ...] [--runs 20]
[--positions 784]``
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import sys
import tempfile
from collections.abc import Sequence

import _common
import model_zoo
import onnx
import zoo_profile
from conv_settings import registry_with
from onnx import shape_inference

from onnx_light.kernels import conv
from onnx_light.runtime.session import RuntimeSession


def pointwise_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, int, int]]:
    """(C, M, HW) of each 1x1 Conv, by node name and by the outputs of its activations (the
    names onnxruntime gives its fused nodes)."""
    inferred = shape_inference.infer_shapes(model)
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*inferred.graph.value_info, *inferred.graph.output]}
    weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
    classes = zoo_profile.conv_classes(model)
    consumers = collections.defaultdict(list)
    for node in model.graph.node:
        for name in node.input:
            consumers[name].append(node)
    shapes = {}
    for node in model.graph.node:
        if node.op_type != "Conv" or classes.get(node.name) != "pointwise":
            continue
        w, out = weights[node.input[1]], dims.get(node.output[0])
        if not out or out[2] * out[3] == 1:
            continue  # a squeeze-and-excitation gate's (fused into its own step here)
        key = (w[1], w[0], out[2] * out[3])
        shapes[node.name] = key
        output = node.output[0]
        while True:
            shapes[output] = key
            following = consumers.get(output, [])
            if len(following) != 1 or following[0].op_type not in zoo_profile.ACTIVATIONS:
                break
            output = following[0].output[0]
    return shapes


def table(name: str, runs: int, positions: int | None, folder: str) -> _common.Table:
    spec = model_zoo.MODELS[name]
    feeds = model_zoo.model_feeds(spec)
    path, _ = model_zoo.model_file(spec, feeds, model_zoo.default_cache_dir(), model_zoo.package_versions(),
                                   model_zoo.torch_export)
    model = onnx.load(str(path))
    shapes = pointwise_shapes(model)
    ours, theirs = zoo_profile.OurProfile(model, feeds, 1), zoo_profile.TheirProfile(model, feeds, 1, folder)
    if positions is not None:
        ours.session = RuntimeSession(model.SerializeToString(), num_threads=1, registry=registry_with(
            {conv.POINTWISE_TRANSPOSED: positions}, 1))
    for _ in range(3):
        ours.run()
        theirs.run()
    ours.times.clear()
    for _ in range(runs):
        ours.run()
        theirs.run()
    their_times, _ = theirs.node_times(3)
    medians: dict[str, dict] = {"ours": collections.defaultdict(list), "ort": collections.defaultdict(list)}
    for side, times in (("ours", ours.times), ("ort", their_times)):
        for node, values in times.items():
            key = shapes.get(re.sub(r"(_nchwc|_token_\d+)$", "", node))
            if key is not None:
                medians[side][key].append(statistics.median(values))
    rows, planes = [], collections.defaultdict(lambda: [0.0, 0.0])
    for key in sorted(medians["ours"], key=lambda k: (-k[2], k)):
        a, b = medians["ours"][key], medians["ort"].get(key, [])
        mine, their = statistics.mean(a), statistics.mean(b) if b else float("nan")
        planes[key[2]][0] += sum(a)
        planes[key[2]][1] += sum(b)
        macs = key[0] * key[1] * key[2]
        rows.append([f"{key[0]} -> {key[1]} x {key[2]}", len(a), f"{mine * 1e6:.1f}", f"{their * 1e6:.1f}",
                     f"{mine / their:.2f}", f"{macs / mine * 1e-9:.1f}", f"{macs / their * 1e-9:.1f}"])
    for plane, (a, b) in sorted(planes.items()):
        rows.append([f"all at {plane}", "", f"{a * 1e6:.0f}", f"{b * 1e6:.0f}", f"{a / b:.2f}", "", ""])
    setting = "this machine's profile" if positions is None else f"transposed_positions {positions}"
    return _common.Table(f"## {name}, one thread, medians of {runs} runs ({setting})",
                         ["C -> M x HW", "nodes", "onnx_light us", "onnxruntime us", "ratio",
                          "onnx_light GMAC/s", "onnxruntime GMAC/s"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v2"])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--positions", type=int, default=None)
    args = parser.parse_args(argv)
    print(f"load average (1 min) at start {_common.load_average():.2f}  ")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            print("\n" + table(name, args.runs, args.positions, folder).markdown())
    print(f"\nload average (1 min) at end {_common.load_average():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
