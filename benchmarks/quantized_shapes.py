"""Where a QLinearConv's time goes, per shape: one node of the int8 model zoo's shapes in a
one-thread onnx_light session and in onnxruntime, and the part of onnx_light's run spent in
each compiled loop (the windows' packing, the packed product with its epilogue, the depthwise
loop).

Each node has uint8 input, int8 constant weights (per-channel scales), a bias and uint8 output
(``conv_plans._inputs``); the padding is half the kernel. A row gives the best thread CPU time
(``time.thread_time``) of a run over ``--runs`` runs, the two runtimes interleaved, and the
loops' thread CPU time in onnx_light's best run (the loops are wrapped by timing proxies in
this process only). The outputs differ from onnxruntime's where its AVX2 u8 x s8 products
saturate (full-range weights; docs/quantization.md, Requantization): the last column says by
how many steps.

Run: ``python benchmarks/quantized_shapes.py [--runs 30] [--swapped-depth 1024] [SHAPE ...]``
(``--swapped-depth`` sets ``quantized_products.SWAPPED_DEPTH``, to compare the two product
orientations on 7x7 layers: 0 swaps them all, a large value none).
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import Table, load_average, onnxruntime_session
from conv_plans import _inputs, _session, qlinear_conv_model

from onnx_light.kernels import integer_gemm, integer_loops, quantized_products

# name: (channels in, channels out, plane, kernel, group, stride)
SHAPES = {
    "pointwise 16 -> 96 at 112x112": (16, 96, 112, 1, 1, 1),
    "pointwise 32 -> 16 at 112x112": (32, 16, 112, 1, 1, 1),
    "pointwise 144 -> 24 at 56x56": (144, 24, 56, 1, 1, 1),
    "pointwise 24 -> 144 at 56x56": (24, 144, 56, 1, 1, 1),
    "pointwise 96 -> 576 at 14x14": (96, 576, 14, 1, 1, 1),
    "pointwise 576 -> 160 at 7x7": (576, 160, 7, 1, 1, 1),
    "pointwise 160 -> 960 at 7x7": (160, 960, 7, 1, 1, 1),
    "pointwise 960 -> 160 at 7x7": (960, 160, 7, 1, 1, 1),
    "pointwise 320 -> 1280 at 7x7": (320, 1280, 7, 1, 1, 1),
    "depthwise 960 at 7x7": (960, 960, 7, 3, 960, 1),
    "depthwise 384 at 14x14": (384, 384, 14, 3, 384, 1),
    "depthwise 96 at 112x112, /2": (96, 96, 112, 3, 96, 2),
    "depthwise 32 at 112x112": (32, 32, 112, 3, 32, 1),
    "depthwise 144 at 56x56": (144, 144, 56, 3, 144, 1),
    "depthwise 144 at 56x56, /2": (144, 144, 56, 3, 144, 2),
    "depthwise 192 at 28x28": (192, 192, 28, 3, 192, 1),
    "depthwise 576 at 14x14": (576, 576, 14, 3, 576, 1),
    "depthwise 192 at 28x28, /2": (192, 192, 28, 3, 192, 2),
    "depthwise 576 at 14x14, /2": (576, 576, 14, 3, 576, 2),
    "classifier 1280 -> 1000 at 1x1": (1280, 1000, 1, 1, 1, 1),
    "classifier 2048 -> 1000 at 1x1": (2048, 1000, 1, 1, 1, 1),
    "pointwise 256 -> 64 at 56x56": (256, 64, 56, 1, 1, 1),
    "pointwise 64 -> 256 at 56x56": (64, 256, 56, 1, 1, 1),
    "pointwise 1024 -> 256 at 14x14": (1024, 256, 14, 1, 1, 1),
    "pointwise 512 -> 2048 at 7x7": (512, 2048, 7, 1, 1, 1),
    "pointwise 2048 -> 512 at 7x7": (2048, 512, 7, 1, 1, 1),
    "3x3 64 at 56x56": (64, 64, 56, 3, 1, 1),
    "3x3 256 at 14x14": (256, 256, 14, 3, 1, 1),
    "3x3 512 at 7x7": (512, 512, 7, 3, 1, 1),
}
#: The compiled loops timed, by the module that calls them and the name it calls them by.
LOOPS = ((quantized_products, "pack_windows", "pack"), (integer_gemm, "packed_sums", "product"),
         (quantized_products, "depthwise_sums", "depthwise"))


class _Timed:
    """A compiled loop whose ``dispatcher`` adds its thread CPU time to ``spent[name]``."""

    def __init__(self, loop: Any, name: str, spent: collections.Counter[str]) -> None:
        self.loop = loop
        dispatcher = loop.dispatcher

        def timed(*args: Any) -> Any:
            start = time.thread_time()
            try:
                return dispatcher(*args)
            finally:
                spent[name] += time.thread_time() - start

        self.dispatcher = timed

    def __call__(self, *args: Any) -> Any:
        return self.loop(*args)


def _theirs(inputs: list[np.ndarray], attributes: dict[str, Any]) -> Any:
    return onnxruntime_session(qlinear_conv_model(inputs, attributes), 1)


def measure(names: list[str], runs: int) -> Table:
    """One row per shape: both runtimes' best run and onnx_light's loops in its best run."""
    spent: collections.Counter[str] = collections.Counter()
    for module, attribute, name in LOOPS:
        setattr(module, attribute, _Timed(getattr(integer_loops, attribute), name, spent))
    table = Table(f"QLinearConv per shape, one thread, best of {runs} interleaved runs "
                  f"(load average {load_average()})",
                  ["shape", "onnx_light ms", "onnxruntime ms", "ratio", "pack ms", "product ms",
                   "depthwise ms", "steps apart"])
    for name in names:
        c, m, plane, k, group, stride = SHAPES[name]
        inputs = _inputs(c, m, plane, k, group)
        attributes = {"group": group, "strides": [stride, stride], "pads": [k // 2] * 4}
        ours, theirs = _session(inputs, attributes), _theirs(inputs, attributes)
        feeds = {"x": inputs[0]}
        apart = int(np.abs(ours.run(None, feeds)[0].astype(np.int32)
                           - theirs.run(None, feeds)[0].astype(np.int32)).max())
        best: dict[str, float] = {}
        runners: tuple[tuple[str, Callable[[], Any]], ...] = (
            ("ours", lambda ours=ours, feeds=feeds: ours.run(None, feeds)),
            ("theirs", lambda theirs=theirs, feeds=feeds: theirs.run(None, feeds)))
        for round_ in range(runs + 5):
            for key, run in runners:
                spent.clear()
                start = time.thread_time()
                run()
                took = time.thread_time() - start
                if round_ >= 5 and took < best.get(key, float("inf")):
                    best[key] = took
                    if key == "ours":
                        best.update({f"loop {k}": v for k, v in spent.items()})
        table.add(name, best["ours"] * 1e3, best["theirs"] * 1e3, best["ours"] / best["theirs"],
                  *(best.get(f"loop {loop}", 0.0) * 1e3 for *_, loop in LOOPS), apart)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", metavar="SHAPE",
                        help=f"shapes to time (default all): {', '.join(SHAPES)}")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--swapped-depth", type=int, help="quantized_products.SWAPPED_DEPTH for this run")
    args = parser.parse_args()
    unknown = [name for name in args.shapes if name not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}: expected some of {list(SHAPES)}")
    if args.swapped_depth is not None:
        quantized_products.SWAPPED_DEPTH = args.swapped_depth
    print(measure(args.shapes or list(SHAPES), args.runs).markdown())
    print(f"\nload average at end {load_average()}")


if __name__ == "__main__":
    main()
