"""Whole light models under several Conv settings and onnxruntime, side by side, in one run.

A model is one of the light ONNX models (with the benchmark's random weights) or of the model
zoo (``model_zoo.py``'s cached exports, which carry seeded random weights, and its feeds).

Each setting is a set of Conv (float) values published over the portable defaults for this
machine, for example ``im2col.block_bytes=2097152`` or ``algorithm=winograd,parallel.split=blas``
(names from ``python -m onnx_light tune-kernels --show``), and of the session options
``fuse`` and ``branches`` (``branches=off``: no independent branches side by side); an empty
setting is the portable defaults. The sessions run in the interleaved rounds of
``real_models.Rounds`` (each session settled for 0.2 s before its timed run, the order
rotating, disturbed rounds retaken), with the benchmark's random weights, and the table gives
the median and the fastest run of each, and their ratios to onnxruntime's.

Run: ``python benchmarks/conv_settings.py --models vgg19 resnet50 --threads 2
--setting "" --setting im2col.block_bytes=2097152`` (zoo models: ``--models mobilenet_v2``).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import numpy as np
import onnx
from real_models import (
    MODELS,
    Rounds,
    model_input,
    model_path,
    onnxruntime_session,
    portable_registry,
    with_random_weights,
)

from onnx_light.kernels import conv
from onnx_light.runtime.session import RuntimeSession
from onnx_light.tuning.processor import execution_descriptor
from onnx_light.tuning.registry import KernelTuningRegistry, PublishedProfile

MAX_RETAKES = 3  # rounds retaken per model when other processes disturbed them
SESSION_OPTIONS = ("fuse", "branches")  # RuntimeSession flags a setting may name
SWITCHES = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}


def parse_setting(text: str) -> tuple[dict[str, int | str], dict[str, bool]]:
    """``name=value,name=value`` -> ({Conv name: int or str} (validated later by the Conv
    schema), {session option: bool})."""
    setting: dict[str, int | str] = {}
    options: dict[str, bool] = {}
    for item in filter(None, text.split(",")):
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep:
            raise SystemExit(f"setting {text!r}: {item!r} is not name=value")
        if name in SESSION_OPTIONS:
            if value.lower() not in SWITCHES:
                raise SystemExit(f"setting {text!r}: {name} takes on or off, got {value!r}")
            options[name] = SWITCHES[value.lower()]
        else:
            setting[name] = int(value) if value.lstrip("-").isdigit() else value
    return setting, options


def registry_with(setting: dict[str, int | str], threads: int) -> KernelTuningRegistry:
    """A portable registry with ``setting`` published for Conv float on this machine."""
    registry = portable_registry()
    if setting:
        snapshot = registry.snapshot()
        key = conv.conv_schema(onnx.TensorProto.FLOAT).key
        local = execution_descriptor(threads)
        values = snapshot.schema(key).update(snapshot.resolve(key, local).values, setting)
        registry.publish([PublishedProfile(key, local, values, {"origin": "benchmark"})])
    return registry


def load_model(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A light model with random weights and its input, or a zoo model and its feeds."""
    if name in MODELS:
        model = with_random_weights(onnx.load(model_path(name)))
        input_name, x = model_input(model)
        return model, {input_name: x}
    import model_zoo  # the zoo's exports (torch only to export one not cached yet)

    spec = model_zoo.MODELS[name]
    feeds = model_zoo.model_feeds(spec)
    path, _ = model_zoo.model_file(spec, feeds, model_zoo.default_cache_dir(),
                                   model_zoo.package_versions(), model_zoo.torch_export)
    return onnx.load(str(path)), feeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "vgg19"],
                        help=f"light models ({', '.join(MODELS)}) or model_zoo.py's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="'thread': the calling thread's CPU time (one thread only: what the "
                             "load of a shared machine disturbs least)")
    parser.add_argument("--setting", action="append", default=None,
                        help="name=value[,name=value]; repeat for each setting ('' = portable)")
    args = parser.parse_args(argv)
    if args.clock == "thread" and args.threads != 1:
        parser.error("--clock thread measures one thread")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    settings = args.setting if args.setting is not None else [""]
    print(f"threads {args.threads}, {args.rounds} interleaved rounds, {args.clock} clock, median / "
          f"fastest in ms (ratio to onnxruntime's median / fastest)")
    print(f"{'model':<14} {'setting':<44} {'median':>16} {'fastest':>16}")
    for name in args.models:
        model, feeds = load_model(name)
        runs = {}
        for text in settings:
            setting, options = parse_setting(text)
            session = RuntimeSession(model, num_threads=args.threads,
                                     registry=registry_with(setting, args.threads), **options)
            runs[text or "(portable)"] = functools.partial(session.run, None)
        runs["onnxruntime"] = functools.partial(onnxruntime_session(model, args.threads).run, None)
        samples = Rounds(MAX_RETAKES, clock=clock).run(
            [functools.partial(run, feeds) for run in runs.values()], args.rounds)
        times = dict(zip(runs, samples, strict=True))
        median_peer, fastest_peer = np.median(times["onnxruntime"]), min(times["onnxruntime"])
        for label, samples in times.items():
            median, fastest = np.median(samples), min(samples)
            print(f"{name:<14} {label:<44} {median * 1e3:8.1f} ({median / median_peer:4.2f}) "
                  f"{fastest * 1e3:8.1f} ({fastest / fastest_peer:4.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
