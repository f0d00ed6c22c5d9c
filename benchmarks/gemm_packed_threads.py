"""Packed products at the zoo transformers' shapes, one and two threads, against onnxruntime,
timed as a model runs them and only at quiet instants.

Usage: python benchmarks/gemm_packed_threads.py [--shapes 64x256x256 64x256x1024 ...]
                                                [--samples 40] [--max-seconds 60]

Per shape (M x K x N, a one-node MatMul of constant float32 weights and a fed A, which
onnx_light packs), the sessions compared, each one call at a time in turn:

* ``1t``: onnx_light at one thread;
* ``2t serial``: at two threads with ``parallel.minimum_flops`` out of reach (one thread);
* ``2t split``: at two threads from one multiply-add on (the panels shared out among two
  numba threads, ``packed_gemm.packed_panels_parallel``);
* ``ort 1t`` and ``ort 2t``: onnxruntime (no spinning, ``_common.onnxruntime_session``).

As in a model, each call multiplies other weights than the call before (``ROTATION`` sessions
per variant with their own weights, taken in turn: the weights come from the L3 cache, not
from the L2), and before each timed call three one-thread products of 64x256x256 run, so that
the second thread has been idle as long as between a transformer's products. A call counts
only if no other task was runnable just before and just after it (the running count of
``/proc/loadavg``, ``hot_regions.others_runnable``); ``--every-run`` counts all. Medians in
microseconds; ``2t/1t`` is each runtime's two-thread time over its one-thread time (``2t
split`` for onnx_light), ``ratio 2t`` onnx_light's ``2t split`` over onnxruntime's ``ort 2t``.
Results: docs/gemm.md ("Packed products on two threads").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from _common import load_average, onnxruntime_session
from hot_regions import others_runnable
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels import gemm
from onnx_light.runtime import RuntimeSession

ROTATION = 6
SHAPES = ("64x256x256", "64x256x384", "64x256x688", "64x688x256", "64x256x768", "64x256x1024",
          "64x1024x256", "197x256x768", "197x256x1024")
VARIANTS = ("1t", "2t serial", "2t split", "ort 1t", "ort 2t")


def one_node(k: int, n: int, rng: np.random.Generator) -> bytes:
    """A MatMul of a fed A (m, k) by constant random weights (k, n)."""
    w = rng.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])], "product",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def ours(model: bytes, threads: int, minimum_flops: int | None) -> RuntimeSession:
    """An onnx_light session whose products split from ``minimum_flops`` (None: as tuned)."""
    session = RuntimeSession(model, num_threads=threads)
    if minimum_flops is not None:
        for kernel, _, _ in session._steps:
            if isinstance(kernel, gemm.MatMulKernel):
                kernel.minimum_flops = minimum_flops
    return session


def measure(shape: tuple[int, int, int], samples: int, seconds: float, gate: bool,
            rng: np.random.Generator) -> tuple[dict[str, list[float]], int]:
    """Seconds per counted call of each variant of one shape, and the calls taken again."""
    import onnx

    m, k, n = shape
    models = [one_node(k, n, rng) for _ in range(ROTATION)]
    makers: dict[str, Callable[[bytes], Callable[[dict[str, np.ndarray]], object]]] = {
        "1t": lambda b: ours(b, 1, None).run,
        "2t serial": lambda b: ours(b, 2, 1 << 62).run,
        "2t split": lambda b: ours(b, 2, 1).run,
        "ort 1t": lambda b: onnxruntime_session(onnx.load_from_string(b), 1).run,
        "ort 2t": lambda b: onnxruntime_session(onnx.load_from_string(b), 2).run,
    }
    runs = {name: [make(b) for b in models] for name, make in makers.items()}
    feeds = {"a": rng.standard_normal((m, k)).astype(np.float32)}
    expected = [run(None, feeds)[0] for run in runs["1t"]]
    for name in VARIANTS:
        for run, want in zip(runs[name], expected, strict=True):
            np.testing.assert_allclose(run(None, feeds)[0], want, rtol=1e-4, atol=1e-3)
    gap = ours(one_node(256, 256, rng), 1, None)
    gap_feeds = {"a": rng.standard_normal((64, 256)).astype(np.float32)}
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    retakes, turn = 0, 0
    deadline = time.monotonic() + seconds
    while min(map(len, times.values())) < samples and time.monotonic() < deadline:
        for name in VARIANTS:
            while gate and others_runnable() > 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            for _ in range(3):
                gap.run(None, gap_feeds)
            run = runs[name][turn % ROTATION]
            started = time.perf_counter()
            run(None, feeds)
            elapsed = time.perf_counter() - started
            if gate and others_runnable() > 0:
                retakes += 1
                continue
            times[name].append(elapsed)
        turn += 1
    return times, retakes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--max-seconds", type=float, default=60.0, help="per shape")
    parser.add_argument("--every-run", action="store_true", help="count calls whatever the load")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load average {load_average()}")
    print()
    print("| M x K x N | " + " | ".join(f"{name} (us)" for name in VARIANTS)
          + " | onnx_light 2t/1t | ort 2t/1t | ratio 2t | calls | retakes |")
    print("|---" + "|---:" * (len(VARIANTS) + 5) + "|")
    for text in args.shapes:
        shape = tuple(int(part) for part in text.split("x"))
        times, retakes = measure(shape, args.samples, args.max_seconds,  # type: ignore[arg-type]
                                 not args.every_run, rng)
        if not all(times.values()):
            print(f"| {text} | no quiet call of every variant |")
            continue
        median = {name: statistics.median(values) for name, values in times.items()}
        split, ort = median["2t split"], median["ort 2t"]
        print(f"| {text} | " + " | ".join(f"{median[name] * 1e6:.0f}" for name in VARIANTS)
              + f" | {split / median['1t']:.2f} | {ort / median['ort 1t']:.2f} | {split / ort:.2f}"
              f" | {min(map(len, times.values()))} | {retakes} |")
    print(f"\nload average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
