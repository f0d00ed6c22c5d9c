"""The time around a depthwise convolution's or a stem's compiled kernel: MobileNetV2's
depthwise convolutions (224x224, each shape once, a fused Clip to [0, 6]), EfficientNet-B0's
5x5 ones (a fused SiLU), MobileNetV3-small's and two stems, as one-node sessions whose Conv
takes its call bound at settle (``direct``: ``ConvKernel._settle_direct``, the call object's
``bind``), or with that turned off, the depthwise call object called per run (``run_depthwise``:
:meth:`onnx_light.kernels.conv.kernel.ConvKernel._run_depthwise`), or through the algorithm
object and the plan (``general``: both turned off), and onnxruntime's, side by side in one
process.

Each sample is the thread CPU time of a loop of runs lasting a few milliseconds, the sessions
interleaved, their order alternating (``conv_pointwise_packed.cpu_samples``); the table gives
the algorithm ``auto`` chose, the median time of one run (each session's fixed cost per run
included: it is in every column) and the saving per node, ``general - direct``.

Run: ``python benchmarks/conv_depthwise_call.py [--rounds 15] [--shapes 0 3] [--per-channel]``
(``--per-channel``: ``depthwise.blocked_outputs`` 0, the per-channel ``depthwise`` kernel
everywhere instead of ``auto``'s choice).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

import numpy as np
from conv_mobile import SHAPES, conv_model, repeated
from conv_pointwise_packed import cpu_samples
from conv_settings import registry_with
from real_models import onnxruntime_session

from onnx_light.kernels import conv
from onnx_light.kernels.conv import kernel as conv_kernel
from onnx_light.runtime.session import RuntimeSession

# conv_mobile.SHAPES' indices and the fused activation: MobileNetV2's, EfficientNet-B0's 5x5
# ones, MobileNetV3-small's
CASES = [(i, "relu6") for i in range(10)] + [(i, "silu") for i in (10, 11, 14, 15, 16)] + [
    (i, "relu6") for i in range(36, 44)] + [(51, "none"), (52, "relu6")]  # and two stems


def undirected(session: RuntimeSession, run: Callable[[], object], call_object: bool) -> None:
    """``run`` with the session's Conv kernels' settled direct calls turned off, and the
    depthwise call object too unless ``call_object``: every depthwise Conv then goes through
    ``_run_depthwise`` or the algorithm object."""
    kernels = [step.kernel for step in session._plan if isinstance(step.kernel, conv_kernel.ConvKernel)]
    bound = [kernel._direct for kernel in kernels]
    method = conv_kernel.ConvKernel._run_depthwise
    for kernel in kernels:
        kernel._direct = None
    if not call_object:
        conv_kernel.ConvKernel._run_depthwise = lambda *arguments: None
    try:
        run()
    finally:
        conv_kernel.ConvKernel._run_depthwise = method
        for kernel, direct in zip(kernels, bound, strict=True):
            kernel._direct = direct


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--shapes", type=int, nargs="*", help="conv_mobile.SHAPES' indices")
    parser.add_argument("--per-channel", action="store_true",
                        help="the per-channel kernel everywhere (depthwise.blocked_outputs 0)")
    args = parser.parse_args(argv)
    registry = registry_with({conv.BLOCKED_OUTPUTS: 0} if args.per_channel else {}, 1)
    cases = [c for c in CASES if not args.shapes or c[0] in args.shapes]
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds; thread CPU "
          f"us per run (median); one thread")
    print("| C, size, kernel/stride, activation | algorithm | direct | run_depthwise | general "
          "| onnxruntime | general - direct | direct / ort |\n|---|---|---|---|---|---|---|---|")
    for index, activation in cases:
        channels, filters, size, kernel, stride, group = SHAPES[index]
        model = conv_model(channels, filters, size, kernel, stride, group, activation)
        feeds = {"x": np.random.default_rng(0).standard_normal((1, channels, size, size)).astype(np.float32)}
        session = RuntimeSession(model, num_threads=1, registry=registry)
        run = functools.partial(session.run, None, feeds)
        loops = {"direct": repeated(run), "ort": repeated(functools.partial(
            onnxruntime_session(model, 1).run, None, feeds))}
        loop, count = loops["direct"]
        loops["run_depthwise"] = (functools.partial(undirected, session, loop, True), count)
        loops["general"] = (functools.partial(undirected, session, loop, False), count)
        samples = cpu_samples([loop for loop, _ in loops.values()], args.rounds)
        median = {name: float(np.median(s)) / loops[name][1] * 1e6
                  for name, s in zip(loops, samples, strict=True)}
        algorithm = next((step.kernel.decisions().get("algorithm") for step in session._plan
                          if isinstance(step.kernel, conv_kernel.ConvKernel)), "?")
        print(f"| {channels}, {size}, {kernel}/{stride}, {activation} | {algorithm} "
              f"| {median['direct']:.1f} | {median['run_depthwise']:.1f} | {median['general']:.1f} "
              f"| {median['ort']:.1f} "
              f"| {median['general'] - median['direct']:.1f} "
              f"| {median['direct'] / median['ort']:.2f} |", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
