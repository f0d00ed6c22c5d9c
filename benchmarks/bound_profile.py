"""Where a model's time goes in the run a caller makes: each step of onnx_light's bound plan
(prepared steps writing into the memory plan's buffers) timed around its call, beside
onnxruntime's own per-node profile, per operator class and per node name.

``zoo_profile.py`` times the steps through the session's node hook, which runs the plan
without its prepared steps (every step through ``Kernel.run``): right for the kernels, not
for what the bound plan's prepared steps cost. This script replaces the session's
``run_bound`` by one that times each call (a ``time.perf_counter`` pair per step, about a
microsecond on 90 steps), so the "run" row is the bound plan's own. Steps carry their first
node's name; nodes of the repeated layers of a transformer are summed over the layers
(``layers.N`` -> ``layers.L``) with ``--by-node``.

Run: ``python benchmarks/bound_profile.py --model llama [--threads 1] [--runs 40] [--by-node]``
(a model of ``model_zoo.py``, its cached export).
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import _common
import model_zoo
import onnx
import zoo_profile

from onnx_light.runtime import session as session_module

LAYER = re.compile(r"layers[.]\d+")


class BoundTimes:
    """A ``run_bound`` that times each call of the bound plan by the name of its step."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = collections.defaultdict(list)
        self.types: dict[str, str] = {}

    def __call__(self, bound: Any, values: list[Any]) -> None:
        plan, calls = bound
        clock = time.perf_counter
        for item, call in zip(plan, calls, strict=True):
            started = clock()
            call(values)
            name = getattr(item, "node", type(item).__name__)
            self.times[name].append(clock() - started)
            self.types[name] = getattr(item, "op_type", type(item).__name__)


def profile(name: str, threads: int, runs: int, by_node: bool) -> _common.Table:
    spec = model_zoo.MODELS[name]
    feeds = model_zoo.model_feeds(spec)
    path, _ = model_zoo.model_file(spec, feeds, model_zoo.default_cache_dir(), model_zoo.package_versions(),
                                   model_zoo.torch_export)
    model = onnx.load(str(path))
    ours = BoundTimes()
    session = session_module.RuntimeSession(model.SerializeToString(), num_threads=threads)
    with tempfile.TemporaryDirectory() as folder:
        theirs = zoo_profile.TheirProfile(model, feeds, threads, folder)
        warm, mine = 3, []
        original = session_module.run_bound
        session_module.run_bound = ours
        try:
            for index in range(warm + runs):
                if index == warm:
                    ours.times.clear()
                    theirs.runs.clear()
                    mine.clear()
                started = time.perf_counter()
                session.run(None, feeds)
                mine.append(time.perf_counter() - started)
                theirs.run()
        finally:
            session_module.run_bound = original
        their_times, their_types = theirs.node_times(warm)
    if by_node:
        def key(node: str, op_type: str) -> str:
            return LAYER.sub("layers.L", node) + f" ({op_type})"
    else:
        classes = zoo_profile.conv_classes(model)

        def key(node: str, op_type: str) -> str:
            return zoo_profile.node_class(node, op_type, classes)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0.0, 0])
    for times, types, column in ((ours.times, ours.types, 0), (their_times, their_types, 2)):
        for node, values in times.items():
            entry = totals[key(node, types[node])]
            entry[column] += statistics.median(values)
            entry[column + 1] += 1
    rows = []
    for label, (a, count_a, b, count_b) in sorted(totals.items(), key=lambda item: -max(item[1][::2])):
        ratio = f"{a / b:.2f}" if b else "-"
        rows.append([label, count_a, f"{a * 1e3:.3f}", count_b, f"{b * 1e3:.3f}", ratio])
    sum_a = sum(v[0] for v in totals.values())
    sum_b = sum(v[2] for v in totals.values())
    rows.append(["steps' sum", sum(v[1] for v in totals.values()), f"{sum_a * 1e3:.3f}",
                 sum(v[3] for v in totals.values()), f"{sum_b * 1e3:.3f}", f"{sum_a / sum_b:.2f}"])
    run_a, run_b = statistics.median(mine), statistics.median(theirs.runs)
    rows.append(["run", "", f"{run_a * 1e3:.3f}", "", f"{run_b * 1e3:.3f}", f"{run_a / run_b:.2f}"])
    return _common.Table(f"## {name}, {threads} thread(s), bound plan, medians of {runs} runs",
                         ["class" if not by_node else "node", "steps", "onnx_light ms", "ort nodes",
                          "onnxruntime ms", "ratio"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama", choices=sorted(model_zoo.MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--by-node", action="store_true", help="one row per node name (layers summed)")
    args = parser.parse_args(argv)
    print(f"load average (1 min) at start {_common.load_average():.2f}  ")
    print("\n" + profile(args.model, args.threads, args.runs, args.by_node).markdown())
    print(f"\nload average (1 min) at end {_common.load_average():.2f}  ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
