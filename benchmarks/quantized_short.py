"""The int8 products' int16-pair sums of 7-bit weights and the fused residual additions, each
on and off, side by side in one process (docs/quantization.md, third pass).

1. The packed product alone (one thread, int32 sums, best of ``--runs``): int8 weights in
   -64..64 against uint8 bytes, on the int16 pairs' layout (``vpmaddwd``) and on bytes summed
   in int16 pairs (``vpmaddubsw``, ``integer_gemm.short_sums``), both checked against numpy's
   int64 sums.
2. The int8 zoo models (their cached exports, ``model_zoo.py`` makes them) in one-thread
   sessions: as built (both on), without the int16-pair sums, without the residual fusion,
   without either; thread CPU time of a run, the variants interleaved, best and median of
   ``--rounds``, and whether every variant's outputs are the first's bit for bit.

Run: ``python benchmarks/quantized_short.py [--runs 15] [--rounds 10] [--models resnet50_int8
mobilenet_v2_int8] [--cache-dir DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from _common import Table, load_average

from onnx_light.kernels import quantized_products
from onnx_light.kernels.integer_gemm import SHORT_WEIGHT, ByteRows, PackedColumns, no_residual
from onnx_light.kernels.integer_loops import packed_sums
from onnx_light.runtime import RuntimeSession

# rows x depth x columns: ResNet-50's 3x3 at 56x56 and 14x14, its 512 -> 2048 at 7x7 and its
# last 3x3 (the swapped product's shape), MobileNetV2's 16 -> 96 and 24 -> 144 expansions
PRODUCTS = ((64, 576, 3136), (256, 2304, 196), (2048, 512, 49), (512, 4608, 49), (96, 16, 12544),
            (144, 24, 3136))
DEFAULT_CACHE = Path.home() / ".cache" / "onnx_light" / "model-zoo"


def _product(rows: int, depth: int, columns: int, layout: str, mode: np.integer,
             rng: np.random.Generator) -> Callable[[], np.ndarray]:
    """A call of ``packed_sums`` on random operands in ``layout`` and ``mode``, checked once."""
    w = rng.integers(-SHORT_WEIGHT, SHORT_WEIGHT + 1, (rows, depth)).astype(np.int8)
    x = rng.integers(0, 256, (depth, columns)).astype(np.uint8)
    left, right = ByteRows(w, 0), PackedColumns.of(x, 3, layout=layout)
    repeated, row_zero, row_sums = left.repeated(right.lanes.dtype, layout)
    zeros, bias = np.zeros(columns, np.int32), np.zeros(rows, np.int32)
    out, one = np.empty((rows, columns), np.int32), np.ones((1, 1), np.float32)
    unused = np.zeros(9, np.float32)

    def call() -> np.ndarray:
        packed_sums(right.lanes, repeated, 0, rows, 0, columns, 64, 768, row_zero, row_sums, right.zero,
                    zeros, depth, bias, zeros, one, 0, 0, 0, False, out, no_residual(out.dtype), unused, mode)
        return out

    if not np.array_equal(call(), w.astype(np.int64) @ (x.astype(np.int64) - 3)):
        raise AssertionError(f"{rows}x{depth}x{columns} on {layout}: not the int64 sums")
    return call


def _best(call: Callable[[], Any], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.thread_time()
        call()
        best = min(best, time.thread_time() - start)
    return best


def products(runs: int) -> Table:
    rng = np.random.default_rng(0)
    table = Table(f"packed product alone, one thread, best of {runs} (load average {load_average()})",
                  ["rows x depth x columns", "int16 pairs ms", "GMAC/s", "bytes in int16 pairs ms", "GMAC/s ",
                   "speed-up"])
    for rows, depth, columns in PRODUCTS:
        pairs = _best(_product(rows, depth, columns, "pairs", np.int32(0), rng), runs)
        short = _best(_product(rows, depth, columns, "packed", np.int16(1), rng), runs)
        macs = rows * depth * columns / 1e9
        table.add(f"{rows} x {depth} x {columns}", pairs * 1e3, macs / pairs, short * 1e3, macs / short,
                  pairs / short)
    return table


@contextlib.contextmanager
def _variant(short: bool, fused: bool) -> Iterator[None]:
    """Session construction with or without the int16-pair sums and the residual fusion."""
    with contextlib.ExitStack() as stack:
        if not short:
            stack.enter_context(mock.patch.object(quantized_products, "short_sums", lambda *_: False))
        if not fused:
            stack.enter_context(mock.patch("onnx_light.runtime.fusion.fuse_qlinear_add",
                                           lambda steps, keep, shapes: list(steps)))
        yield


def models(names: list[str], rounds: int, cache: Path) -> Table:
    variants = {"both": (True, True), "no int16 pairs": (False, True), "no fusion": (True, False),
                "neither": (False, False)}
    table = Table(f"int8 zoo models, one thread, thread CPU time of a run, {rounds} interleaved rounds "
                  f"(load average {load_average()} at the start)",
                  ["model", *(f"{v} best / median ms" for v in variants), "same outputs"])
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    for name in names:
        found = sorted(cache.glob(f"{name}-*.onnx"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise SystemExit(f"no cached export of {name} in {cache}: run benchmarks/model_zoo.py first")
        sessions = {}
        for variant, (short, fused) in variants.items():
            with _variant(short, fused):
                sessions[variant] = RuntimeSession(str(found[-1]), num_threads=1)
        feed = next(iter(sessions["both"]._feed_slots))
        outputs = [s.run(None, {feed: x})[0] for s in sessions.values()]
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(rounds):
            for variant, session in sessions.items():
                start = time.thread_time()
                session.run(None, {feed: x})
                times[variant].append(time.thread_time() - start)
        table.add(name, *(f"{min(t) * 1e3:.1f} / {statistics.median(t) * 1e3:.1f}" for t in times.values()),
                  all(np.array_equal(outputs[0], o) for o in outputs[1:]))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--models", nargs="*", default=["resnet50_int8", "mobilenet_v2_int8"])
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args()
    print(products(args.runs).markdown() + "\n")
    if args.models:
        print(models(args.models, args.rounds, args.cache_dir).markdown())
    print(f"\nload average at the end {load_average()}")


if __name__ == "__main__":
    main()
