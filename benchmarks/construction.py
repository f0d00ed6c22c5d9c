"""Session construction, onnx_light against onnxruntime, with a warm compile cache.

Each model is built once untimed in each runtime (numba's compile cache warmed, files in the
page cache), then ``--rounds`` interleaved rounds build an onnx_light ``RuntimeSession`` and
an onnxruntime ``InferenceSession`` (``real_models.onnxruntime_session``) from the model's
path, both at ``--threads``; each figure is a median. Wall time and the process's CPU time
(all threads: both runtimes may use more than one) are given: the wall time means something
only on a quiet machine, the CPU time stands up better under other processes' load. The peak
resident memory of the whole process is printed at the end.

Models: ONNX's light real models by name (``real_models.MODELS``), or the zoo's cached exports
(``model_zoo.py``; ``zoo:NAME`` takes every cached ``NAME-*.onnx``).

Run: ``python benchmarks/construction.py [--rounds 3] [--threads 2] MODEL ...``
(the zoo needs the zoo extra's environment only to export; cached exports load anywhere).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import _common  # noqa: F401  (puts the repository on the path, keeps the tuning cache)
from _common import real_models
from model_zoo import default_cache_dir

from onnx_light.runtime import RuntimeSession


def model_paths(names: Sequence[str]) -> list[Path]:
    """The files of ``names``: light model names, or ``zoo:NAME`` for the zoo's cached exports."""
    paths: list[Path] = []
    for name in names:
        if name.startswith("zoo:"):
            found = sorted(default_cache_dir().glob(f"{name[4:]}-*.onnx"))
            if not found:
                raise SystemExit(f"no cached export of {name[4:]!r} in {default_cache_dir()} "
                                 "(run benchmarks/model_zoo.py first)")
            paths += found
        elif name in real_models.MODELS:
            paths.append(Path(real_models.model_path(name)))
        else:
            raise SystemExit(f"unknown model {name!r}: one of {', '.join(real_models.MODELS)} or zoo:NAME")
    return paths


def timed(build: object) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``build()``, the session dropped and collected after."""
    wall, cpu = time.perf_counter(), time.process_time()
    session = build()  # type: ignore[operator]
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del session
    gc.collect()
    return wall, cpu


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    paths = model_paths(args.models)
    builders = {path: {"onnx_light": lambda p=path: RuntimeSession(str(p), num_threads=args.threads),
                       "onnxruntime": lambda p=path: real_models.onnxruntime_session(str(p), args.threads)}
                for path in paths}
    samples = {path: {name: [] for name in runtimes} for path, runtimes in builders.items()}
    for runtimes in builders.values():
        for build in runtimes.values():
            timed(build)
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for path, runtimes in builders.items():
            for name, build in runtimes.items():
                samples[path][name].append(timed(build))
    load.append(os.getloadavg()[0])
    print(f"Session construction, median of {args.rounds}, {args.threads} threads, "
          f"load {load[0]:.2f}-{load[1]:.2f}:\n")
    print("| model | onnx_light (ms) | onnxruntime (ms) | ratio | onnx_light CPU (ms) "
          "| onnxruntime CPU (ms) | CPU ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path, runtimes in samples.items():
        light, ort = ([statistics.median(s[i] for s in runtimes[name]) for i in (0, 1)]
                      for name in ("onnx_light", "onnxruntime"))
        print(f"| {path.stem.removeprefix('light_')[:26]} | {light[0] * 1e3:.0f} | {ort[0] * 1e3:.0f} "
              f"| {light[0] / ort[0]:.2f} | {light[1] * 1e3:.0f} | {ort[1] * 1e3:.0f} "
              f"| {light[1] / ort[1]:.2f} |")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak resident memory of the process: {peak:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
