"""Per-operator-type time of a model zoo export in onnx_light and onnxruntime, at one thread count.

onnx_light's times come from ``RuntimeSession.run``'s node hook, onnxruntime's from its own
profiler (``SessionOptions.enable_profiling``, default graph optimizations). Each node's time is
its median over ``--runs`` runs after ``--warmup`` untimed ones; the table sums them per
operator type (a fused step counts under its fused type, as each runtime names it). Whole-run
medians of both sessions come from the same process, timed without hooks or profiling.

Run: ``python benchmarks/zoo_profile.py bert [--threads 1] [--runs 30]`` (the model must be in
the zoo's cache: ``python benchmarks/model_zoo.py --export-only --models bert``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import model_zoo  # noqa: E402
import numpy as np  # noqa: E402

from onnx_light.runtime import RuntimeSession  # noqa: E402


def _cached_path(name: str) -> Path:
    spec = model_zoo.MODELS[name]
    path = model_zoo.default_cache_dir() / model_zoo.cache_key(spec, model_zoo.package_versions())
    if not path.exists():
        raise SystemExit(f"{path} is not cached: run model_zoo.py --export-only --models {name}")
    return path


def _median_ms(run, count: int) -> float:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def onnx_light_nodes(serialized: bytes, feeds: dict, threads: int, warmup: int, runs: int):
    session = RuntimeSession(serialized, num_threads=threads)
    for _ in range(warmup):
        session.run(None, feeds)
    samples: dict[tuple[str, str], list[float]] = defaultdict(list)

    def hook(name: str, op_type: str):
        start = time.perf_counter_ns()
        return lambda: samples[name, op_type].append((time.perf_counter_ns() - start) / 1e3)

    for _ in range(runs):
        session.run(None, feeds, node_hook=hook)
    whole = _median_ms(lambda: session.run(None, feeds), runs)
    return {key: statistics.median(v) for key, v in samples.items()}, whole


def onnxruntime_nodes(serialized: bytes, feeds: dict, threads: int, warmup: int, runs: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    plain = ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])
    for _ in range(warmup):
        plain.run(None, feeds)
    whole = _median_ms(lambda: plain.run(None, feeds), runs)
    with tempfile.TemporaryDirectory() as folder:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, "ort")
        session = ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])
        for _ in range(warmup + runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    samples: dict[tuple[str, str], list[float]] = defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            samples[event["name"][: -len("_kernel_time")], event["args"]["op_name"]].append(event["dur"])
    return {key: statistics.median(v[warmup:] or v) for key, v in samples.items()}, whole


def by_type(nodes: dict) -> dict[str, tuple[float, int]]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for (_, op_type), us in nodes.items():
        totals[op_type][0] += us
        totals[op_type][1] += 1
    return {op: (t, n) for op, (t, n) in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", choices=sorted(model_zoo.MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name in args.models:
        spec = model_zoo.MODELS[name]
        serialized = _cached_path(name).read_bytes()
        feeds = spec.feeds(np.random.default_rng(model_zoo.SEED))
        ours, our_whole = onnx_light_nodes(serialized, feeds, args.threads, args.warmup, args.runs)
        theirs, their_whole = onnxruntime_nodes(serialized, feeds, args.threads, args.warmup, args.runs)
        print(f"\n### {name}, {args.threads} thread(s): onnx_light {our_whole:.2f} ms "
              f"(nodes {sum(ours.values()) / 1e3:.2f}), onnxruntime {their_whole:.2f} ms "
              f"(nodes {sum(theirs.values()) / 1e3:.2f})\n")
        print("| runtime | op type | nodes | total (us) |")
        print("|---|---|---:|---:|")
        for runtime, nodes in (("onnx_light", ours), ("onnxruntime", theirs)):
            for op, (total, count) in sorted(by_type(nodes).items(), key=lambda kv: -kv[1][0]):
                print(f"| {runtime} | {op} | {count} | {total:.0f} |")


if __name__ == "__main__":
    main()
