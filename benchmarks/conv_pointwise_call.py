"""The time around a small 1x1 convolution's product: MobileNetV3-small's 1x1 convolutions
(224x224) as one-node sessions whose Conv calls its compiled product directly (``direct``:
:func:`onnx_light.kernels.conv.pointwise.pointwise_call`) or through the algorithm's blocks
(``blocks``: the direct call turned off), and onnxruntime's, side by side in one process.

Each shape is one Conv node (seeded random constant weights, a bias, a Clip to [0, 6]) in
one-thread sessions; each sample is the thread CPU time of a loop of runs lasting a few
milliseconds, the sessions interleaved, their order alternating
(``conv_pointwise_packed.cpu_samples``); the table gives the median time of one run (each
session's fixed cost per run included: a one-node session's own cost is in every column) and
the saving per node, ``blocks - direct``.

Run: ``python benchmarks/conv_pointwise_call.py [--rounds 15]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

import numpy as np
from conv_mobile import repeated
from conv_pointwise_packed import cpu_samples, pointwise_model
from real_models import onnxruntime_session

from onnx_light.kernels.conv import kernel as conv_kernel
from onnx_light.runtime.session import RuntimeSession

# (channels, filters, size): MobileNetV3-small's 1x1 convolutions, the squeeze-and-excitation
# ones (at 1x1) included.
SHAPES = [
    (16, 72, 56), (72, 24, 28), (24, 96, 28), (96, 40, 14), (40, 240, 14), (240, 40, 14),
    (48, 144, 14), (288, 96, 7), (96, 576, 7), (576, 96, 7), (16, 8, 1), (240, 64, 1),
    (576, 144, 1),
]


def blocks(run: Callable[[], object]) -> None:
    """``run`` with the direct call turned off: every 1x1 Conv goes through its blocks."""
    direct = conv_kernel.pointwise_call
    conv_kernel.pointwise_call = lambda *arguments: None
    try:
        run()
    finally:
        conv_kernel.pointwise_call = direct


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds; thread CPU "
          f"us per run (median); one thread")
    print("| C -> M at size | direct | blocks | onnxruntime | blocks - direct | direct / ort "
          "|\n|---|---|---|---|---|---|")
    for channels, filters, size in SHAPES:
        model = pointwise_model(channels, filters, size, True)
        feeds = {"x": np.random.default_rng(0).standard_normal((1, channels, size, size)).astype(np.float32)}
        run = functools.partial(RuntimeSession(model, num_threads=1).run, None, feeds)
        loops = {"direct": repeated(run), "ort": repeated(functools.partial(
            onnxruntime_session(model, 1).run, None, feeds))}
        loop, count = loops["direct"]
        loops["blocks"] = (functools.partial(blocks, loop), count)
        samples = cpu_samples([loop for loop, _ in loops.values()], args.rounds)
        median = {name: float(np.median(s)) / loops[name][1] * 1e6
                  for name, s in zip(loops, samples, strict=True)}
        print(f"| {channels} -> {filters} at {size}x{size} | {median['direct']:.1f} "
              f"| {median['blocks']:.1f} | {median['ort']:.1f} "
              f"| {median['blocks'] - median['direct']:.1f} "
              f"| {median['direct'] / median['ort']:.2f} |", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
