"""The int8 models of the zoo at one and two threads, onnx_light against onnxruntime, timed at
quiet instants; with ``--minimum-macs`` also two-thread onnx_light sessions whose integer
products split across the pool from other sizes (``parallel.minimum_macs``, 2**25 by default).

A timed run counts only if no other task was runnable just before and just after it
(``session_threads.measure``: the running count of ``/proc/loadavg``), so the figures are the
quiet moments' of a shared machine; the sessions take turns, each timed run after 20 ms of
untimed runs of the same session. Wall time (``time.perf_counter``), medians and bests.

Run: ``python benchmarks/quantized_threads.py [--models mobilenet_v2_int8 resnet50_int8]
[--minimum-macs 21 23] [--samples 15] [--max-seconds 150]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import model_zoo
import onnx
from _common import Table, load_average, onnxruntime_session
from session_threads import measure

from onnx_light import RuntimeSession
from onnx_light.kernels.integer_gemm import IntegerProductKernel


def _ours(model: onnx.ModelProto, threads: int, minimum_macs: int | None) -> RuntimeSession:
    """An onnx_light session; with ``minimum_macs`` every integer product splits from there."""
    session = RuntimeSession(model.SerializeToString(), num_threads=threads)
    if minimum_macs is not None:
        for kernel, _, _ in session._steps:
            if isinstance(kernel, IntegerProductKernel):
                kernel.minimum_macs = minimum_macs
    return session


def measure_model(name: str, exponents: list[int], samples: int, seconds: float) -> Table:
    spec = model_zoo.MODELS[name]
    feeds = model_zoo.model_feeds(spec)
    path, _ = model_zoo.model_file(spec, feeds, model_zoo.default_cache_dir(),
                                   model_zoo.package_versions(), model_zoo.torch_export)
    model = onnx.load(str(path))
    sessions: dict[str, Any] = {"onnx_light 1t": _ours(model, 1, None),
                                "onnx_light 2t": _ours(model, 2, None)}
    for exponent in exponents:
        sessions[f"onnx_light 2t, 2**{exponent}"] = _ours(model, 2, 1 << exponent)
    sessions["onnxruntime 1t"] = onnxruntime_session(model, 1)
    sessions["onnxruntime 2t"] = onnxruntime_session(model, 2)
    for session in sessions.values():
        session.run(None, feeds)
    before = load_average()
    times, retakes = measure(sessions, feeds, samples, time.monotonic() + seconds)
    table = Table(f"{name}: wall ms at quiet instants ({retakes} runs taken again, load average "
                  f"{before} before, {load_average()} after)",
                  ["session", "runs", "median ms", "best ms", "median / onnxruntime's at as many threads"])
    for key, values in times.items():
        if not values:
            table.add(key, 0, "-", "-", "-")
            continue
        theirs = times["onnxruntime " + key.split()[1].rstrip(",")]
        ratio = statistics.median(values) / statistics.median(theirs) if theirs else "-"
        table.add(key, len(values), statistics.median(values) * 1e3, min(values) * 1e3, ratio)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v2_int8", "resnet50_int8"])
    parser.add_argument("--minimum-macs", nargs="*", type=int, default=[], metavar="EXPONENT",
                        help="two-thread variants whose integer products split from 2**EXPONENT")
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--max-seconds", type=float, default=150, help="per model")
    args = parser.parse_args()
    for name in args.models:
        print(measure_model(name, args.minimum_macs, args.samples, args.max_seconds).markdown())
        print()


if __name__ == "__main__":
    main()
