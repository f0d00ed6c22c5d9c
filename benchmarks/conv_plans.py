"""The per-run cost of small QLinearConv nodes (what their per-shape plans save): one node in a
one-thread session, and the specialized kernel alone, on MobileNetV2-int8's shapes and on a
node of 8 channels at 2x2 whose arithmetic is negligible.

Each node has uint8 input, int8 constant weights (per-channel scales), a bias and uint8
output. The session's figure is the best thread CPU time (``time.thread_time``) of a run,
the kernel's the best ``time.perf_counter`` of ``kernel.run`` on read-only inputs (what each
node of a model pays besides its step's call). Compare two trees by running this script from
each, alternately (``PYTHONPATH=tree``).

``--zoo mobilenet_v2_int8 ...`` times whole models of ``model_zoo.py`` instead (their cached
exports): one-thread sessions of onnx_light and onnxruntime, their runs interleaved, the
best and median thread CPU time of each.

Run: ``python benchmarks/conv_plans.py [--runs 2000] [--zoo MODEL ...]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import model_zoo
import numpy as np
import onnx
from _common import Table, load_average, onnxruntime_session
from onnx import TensorProto, helper, numpy_helper

from onnx_light import RuntimeSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kernel_cases import build

NAMES = ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero", "bias"]
# name: (channels in, channels out, plane, kernel, group, stride)
NODES = {
    "pointwise 8 -> 8 at 2x2": (8, 8, 2, 1, 1, 1),
    "depthwise 8 at 2x2": (8, 8, 2, 3, 8, 1),
    "pointwise 96 -> 24 at 56x56": (96, 24, 56, 1, 1, 1),
    "pointwise 320 -> 1280 at 7x7": (320, 1280, 7, 1, 1, 1),
    "depthwise 144 at 56x56": (144, 144, 56, 3, 144, 1),
    "depthwise 144 at 56x56, /2": (144, 144, 56, 3, 144, 2),
    "depthwise 960 at 7x7": (960, 960, 7, 3, 960, 1),
}


def _inputs(c: int, m: int, plane: int, k: int, group: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, 256, (1, c, plane, plane)).astype(np.uint8), np.array(0.02, np.float32),
              np.array(3, np.uint8), rng.integers(-128, 128, (m, c // group, k, k)).astype(np.int8),
              np.full(m, 0.01, np.float32), np.zeros(m, np.int8), np.array(0.05, np.float32),
              np.array(5, np.uint8), rng.integers(-100, 100, m).astype(np.int32)]
    for value in inputs:
        value.flags.writeable = False
    return inputs


def qlinear_conv_model(inputs: list[np.ndarray], attributes: dict[str, object]) -> onnx.ModelProto:
    """A one-node QLinearConv model of ``inputs`` (X fed, the rest constants) and ``attributes``."""
    node = helper.make_node("QLinearConv", NAMES, ["y"], **attributes)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", TensorProto.UINT8, inputs[0].shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [numpy_helper.from_array(value, name) for name, value in zip(NAMES[1:], inputs[1:], strict=True)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    model.ir_version = 8
    return model


def _session(inputs: list[np.ndarray], attributes: dict[str, object]) -> RuntimeSession:
    return RuntimeSession(qlinear_conv_model(inputs, attributes), num_threads=1)


def _best(call: Callable[[], object], runs: int, clock: Callable[[], float]) -> float:
    for _ in range(10):
        call()
    best = float("inf")
    for _ in range(runs):
        start = clock()
        call()
        best = min(best, clock() - start)
    return best * 1e6


def zoo(names: list[str], rounds: int) -> Table:
    """Whole models' best and median thread CPU time per run, onnxruntime's interleaved."""
    table = Table(f"Whole models, one thread, {rounds} interleaved rounds (load average {load_average()})",
                  ["model", "onnx_light best ms", "onnxruntime best ms", "ratio", "onnx_light median ms",
                   "onnxruntime median ms"])
    for name in names:
        spec = model_zoo.MODELS[name]
        feeds = model_zoo.model_feeds(spec)
        path, _ = model_zoo.model_file(spec, feeds, model_zoo.default_cache_dir(),
                                       model_zoo.package_versions(), model_zoo.torch_export)
        model = onnx.load(path)
        sessions = (RuntimeSession(model.SerializeToString(), num_threads=1), onnxruntime_session(model, 1))
        times: tuple[list[float], list[float]] = ([], [])
        for round_ in range(rounds + 3):
            for session, samples in zip(sessions, times, strict=True):
                start = time.thread_time()
                session.run(None, feeds)
                if round_ >= 3:
                    samples.append((time.thread_time() - start) * 1e3)
        table.add(name, min(times[0]), min(times[1]), min(times[0]) / min(times[1]),
                  statistics.median(times[0]), statistics.median(times[1]))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000,
                        help="runs of the small nodes (a tenth for the others)")
    parser.add_argument("--zoo", nargs="+", metavar="MODEL", help="whole models of model_zoo.py instead")
    parser.add_argument("--rounds", type=int, default=40, help="rounds of the whole models")
    args = parser.parse_args()
    if args.zoo:
        print(zoo(args.zoo, args.rounds).markdown())
        print(f"\nload average at end {load_average()}")
        return
    table = Table(f"QLinearConv per run, one thread, best of runs (load average {load_average()})",
                  ["node", "session us", "kernel us"])
    for name, (c, m, plane, k, group, stride) in NODES.items():
        inputs = _inputs(c, m, plane, k, group)
        attributes = {"group": group, "strides": [stride, stride], "pads": [k // 2] * 4}
        session = _session(inputs, attributes)
        kernel = build("QLinearConv", inputs, 10, **attributes)[1]
        kernel = kernel.specialize([None, *inputs[1:]]) or kernel
        runs = args.runs if plane <= 2 else max(1, args.runs // 10)
        feeds = {"x": inputs[0]}
        table.add(name, _best(lambda session=session, feeds=feeds: session.run(None, feeds), runs,
                              time.thread_time),
                  _best(lambda kernel=kernel, inputs=inputs: kernel.run(*inputs), runs, time.perf_counter))
    print(table.markdown())
    print(f"\nload average at end {load_average()}")


if __name__ == "__main__":
    main()
