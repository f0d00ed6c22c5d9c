"""One-node MatMul sessions with constant float32 weights: onnx_light with the weights packed
(``kernels/packed_gemm.py``), onnx_light with packing off (BLAS and the pool's split plans) and
onnxruntime (``_common.onnxruntime_session``: its pool does not spin), at one and two threads,
sampled in interleaved rounds; medians in microseconds. ``--clock thread`` samples the calling
thread's CPU time instead of wall time (one thread only: every session then runs on the
calling thread), which other programs on a shared machine disturb far less.

``--pack-rows`` times :func:`packed_gemm.pack_rows` (A's per-call repacking) beside the former
loop (one store ``MR`` values apart per element) on ``--shapes`` (M x K; N ignored), checking
both give the same bits.

``--zoo bert vit ...`` times whole models of ``model_zoo.py`` (their cached exports) the same
way: one session with the products packed, one with packing off, and onnxruntime's.

    PYTHONPATH=. python benchmarks/packed_products.py [--rounds 7] [--threads 1 2] [--shapes 197x768x768]
        [--clock thread] [--zoo bert gpt2] [--pack-rows]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from unittest import mock

import numpy as np
import onnx
from _common import onnxruntime_session
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels import packed_gemm
from onnx_light.kernels.compiled import compiled
from onnx_light.kernels.packed_gemm import MR
from onnx_light.runtime import RuntimeSession

SHAPES = [(64, 256, 1024), (197, 256, 1024), (197, 1024, 256), (197, 768, 3072), (197, 3072, 768),
          (3136, 256, 256), (4096, 1024, 1024)]


def _model(m: int, k: int, n: int, rng: np.random.Generator) -> bytes:
    w = rng.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def _time(fn: Callable[[], object], clock: Callable[[], float], budget: float = 0.05) -> float:
    calls, start = 0, clock()
    while True:
        fn()
        calls += 1
        elapsed = clock() - start
        if elapsed >= budget:
            return elapsed / calls * 1e6


def _sessions(model: bytes, threads: int) -> tuple[RuntimeSession, RuntimeSession, object]:
    """onnx_light with the constant weights packed, with packing off, and onnxruntime."""
    packed = RuntimeSession(model, num_threads=threads)
    with mock.patch.object(packed_gemm, "available", lambda: False):
        blas = RuntimeSession(model, num_threads=threads)
    return packed, blas, onnxruntime_session(onnx.load_from_string(model), threads)


def _medians(sessions: tuple[RuntimeSession, RuntimeSession, object], feeds: dict[str, np.ndarray],
             rounds: int, clock: Callable[[], float], budget: float) -> dict[str, float]:
    """Median microseconds per run of each session, sampled in interleaved rounds."""
    runs = {name: lambda s=session: s.run(None, feeds)
            for name, session in zip(("packed", "blas", "ort"), sessions, strict=True)}
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for name in runs:
        runs[name]()
    for r in range(rounds):
        names = list(runs)
        for name in names[r % 3:] + names[:r % 3]:
            samples[name].append(_time(runs[name], clock, budget))
    return {name: statistics.median(v) for name, v in samples.items()}


def zoo(names: list[str], threads: list[int], rounds: int, clock: Callable[[], float]) -> None:
    """The table of whole models of ``model_zoo.py``."""
    from conv_settings import load_model

    print(f"load average {os.getloadavg()}")
    print("| model | threads | packed (ms) | BLAS (ms) | onnxruntime (ms) | packed / BLAS | packed / ort "
          "| BLAS / ort |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        model, feeds = load_model(name)
        for count in threads:
            med = _medians(_sessions(model.SerializeToString(), count), feeds, rounds, clock, 0.3)
            print(f"| {name} | {count} | {med['packed'] / 1e3:.2f} | {med['blas'] / 1e3:.2f} | "
                  f"{med['ort'] / 1e3:.2f} | {med['packed'] / med['blas']:.3f} | "
                  f"{med['packed'] / med['ort']:.2f} | {med['blas'] / med['ort']:.2f} |", flush=True)
    print(f"load average {os.getloadavg()}")


@compiled
def _strided_pack_rows(a: np.ndarray, first: int, last: int) -> np.ndarray:
    """The former :func:`packed_gemm.pack_rows`: rows outside the steps, one store ``MR``
    values apart per element (the reference of ``--pack-rows``)."""
    k = a.shape[1]
    blocks = -(-(last - first) // MR)
    packed = np.empty((blocks, k, MR), np.float32)
    flat = packed.reshape(-1)
    for block in range(blocks):
        top = first + block * MR
        for r in range(MR):
            target = np.uintp(block * k * MR + r)
            for p in range(np.uintp(k)):
                flat[target + p * np.uintp(MR)] = a[top + r, p] if top + r < last else 0.0
    return packed


def pack_rows(shapes: list[tuple[int, ...]], rounds: int, clock: Callable[[], float]) -> None:
    """The table of ``--pack-rows``: medians in microseconds, interleaved rounds."""
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()}")
    print("| M x K | former (us) | pack_rows (us) | ratio |")
    print("|---|---:|---:|---:|")
    for m, k, *_ in shapes:
        a = rng.standard_normal((m, k)).astype(np.float32)
        runs = {"former": lambda a=a, m=m: _strided_pack_rows(a, 0, m),
                "new": lambda a=a, m=m: packed_gemm.pack_rows(a, 0, m)}
        assert runs["former"]().tobytes() == runs["new"]().tobytes()
        samples: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(rounds):
            for name in (list(runs) if r % 2 else list(runs)[::-1]):
                samples[name].append(_time(runs[name], clock, 0.05))
        med = {name: statistics.median(v) for name, v in samples.items()}
        print(f"| {m} x {k} | {med['former']:.1f} | {med['new']:.1f} | {med['new'] / med['former']:.2f} |",
              flush=True)
    print(f"load average {os.getloadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shapes", nargs="+", metavar="MxKxN", help="default: SHAPES")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall")
    parser.add_argument("--zoo", nargs="+", default=[], help="whole models of model_zoo.py instead")
    parser.add_argument("--pack-rows", action="store_true", help="time pack_rows alone instead")
    args = parser.parse_args()
    if args.clock == "thread" and args.threads != [1]:
        parser.error("--clock thread needs --threads 1")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    if args.zoo:
        zoo(args.zoo, args.threads, args.rounds, clock)
        return
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes] if args.shapes else SHAPES
    if args.pack_rows:
        pack_rows(shapes, args.rounds, clock)
        return
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()}; clock {args.clock}")
    print("| M x K x N | threads | packed (us) | BLAS (us) | onnxruntime (us) | packed / BLAS | packed / ort "
          "| BLAS / ort |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for m, k, n in shapes:
        model = _model(m, k, n, rng)
        a = rng.standard_normal((m, k)).astype(np.float32)
        for threads in args.threads:
            sessions = _sessions(model, threads)
            assert sessions[0]._steps[0][0]._packed is not None and sessions[1]._steps[0][0]._packed is None
            med = _medians(sessions, {"a": a}, args.rounds, clock, 0.05)
            print(f"| {m} x {k} x {n} | {threads} | {med['packed']:.0f} | {med['blas']:.0f} | "
                  f"{med['ort']:.0f} | {med['packed'] / med['blas']:.2f} | "
                  f"{med['packed'] / med['ort']:.2f} | {med['blas'] / med['ort']:.2f} |", flush=True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
