"""ONNX's nine light real models in onnx_light and onnxruntime, side by side, in one run.

For each model (``onnx/backend/test/data/light/light_*.onnx``) the script builds three
sessions at the same thread count (default 2):

* onnx_light with the portable defaults (a fresh registry: schemas and shipped profiles only);
* onnx_light after calibration (Conv, Gemm, MatMul and the elementwise kernels the models
  use, with ``onnx_light.calibrate_kernel_tuning(..., path=<temporary file>)``);
* onnxruntime (``intra_op_num_threads`` = threads, sequential, default optimizations).

The shipped models make every weight with a ConstantOfShape node: all weights are 0.02, so
all the filters of a convolution are equal, which no trained network has and which
onnx_light exploits (a convolution with constant, equal filters computes one of them: see
``onnx_light/kernels/conv/kernel.py``). By default (``--weights random``) the script therefore
replaces each such weight with seeded random values (0.02 times uniform in [0.5, 1.5]), as
trained weights would be; ``--weights shipped`` runs the files as they are.

It times the construction and the first run of each onnx_light session, then runs all of
them in interleaved rounds (portable, calibrated, onnxruntime; the next round starts one
later: calibrated, onnxruntime, portable; ...) and
reports medians. In a round each session runs untimed for 0.2 s (once at least), then once
timed: the untimed runs absorb what the previous runtime left behind (onnxruntime's pool
threads spin for about 0.1 s after a run, OpenBLAS's after a BLAS-threaded call). A round
during which other processes used more than 10% of a core is retaken (up to
``--max-retakes`` times; the count is printed): this machine is shared. The table also
gives the largest absolute difference between the outputs of onnx_light (calibrated) and
onnxruntime. ``--profile`` adds, per model, where one run's time goes (cProfile, by kernel
class).

Run: ``python benchmarks/real_models.py [--quick] [--threads 2] [--weights random|shipped]
[--models resnet50 vgg19]``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import inspect
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# The user's cache must not leak into "portable" or "calibrated": point the default cache at a
# temporary file before onnx_light is imported (it loads the default cache on import).
_CACHE_DIR = tempfile.mkdtemp(prefix="onnx_light-real-models-")
os.environ["ONNX_LIGHT_KERNEL_TUNING_CACHE"] = os.path.join(_CACHE_DIR, "kernel-tuning-cache.txt")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

import onnx_light  # noqa: E402
from onnx_light import kernels  # noqa: E402
from onnx_light.runtime import RuntimeSession  # noqa: E402
from onnx_light.tuning.registry import KernelTuningRegistry, default_registry  # noqa: E402

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
          "squeezenet", "vgg19", "zfnet512")
CALIBRATED_KERNELS = ("Conv", "Gemm", "MatMul")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# ---------------------------------------------------------------------------- measurement

def _busy_seconds() -> float | None:
    """CPU seconds all processes spent outside idle/iowait (Linux), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except OSError:
        return None
    return (sum(fields) - fields[3] - fields[4]) / TICK


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system


def wait_until_quiet(max_wait_s: float, threshold: float = 0.10, window_s: float = 2.0) -> float:
    """Sleep until other processes use less than ``threshold`` of a core over ``window_s``
    (at most ``max_wait_s``); returns the time waited."""
    started = time.perf_counter()
    while time.perf_counter() - started < max_wait_s:
        busy, own = _busy_seconds(), _own_seconds()
        if busy is None:
            break
        time.sleep(window_s)
        if (_busy_seconds() - busy) - (_own_seconds() - own) < threshold * window_s:
            break
    return time.perf_counter() - started


SETTLE_S = 0.2  # untimed runs before each timed one: onnxruntime's threads spin about 0.1 s


def settle(function: Callable[[], object], seconds: float = SETTLE_S) -> None:
    """Run ``function`` untimed for at least ``seconds`` (once at least): what the previous
    runtime left running stops meanwhile. After one onnxruntime run, onnx_light's next runs
    of SqueezeNet took 29.8, 27.7, 23.3, 20.4, 19.5 ms, of AlexNet 47.8, 38.9, 30.1, 31.1 ms
    (medians of 9, 2 threads): onnxruntime's pool threads spin for about 0.1 s after a run."""
    started = time.perf_counter()
    function()
    while time.perf_counter() - started < seconds:
        function()


class Rounds:
    """Interleaved rounds, each starting one session later than the one before (so that no
    session always runs right after onnxruntime's spinning threads); a round that other
    processes disturbed is retaken."""

    def __init__(self, max_retakes: int, tolerance: float = 0.10,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.max_retakes = max_retakes
        self.tolerance = tolerance
        self.clock = clock  # what a sample measures: wall time, or the thread's CPU time
        self.retaken = 0

    def run(self, functions: list[Callable[[], object]], rounds: int) -> list[list[float]]:
        samples: list[list[float]] = [[] for _ in functions]
        retakes = 0  # per call: every model gets max_retakes
        done = 0
        while done < rounds:
            busy, own, started = _busy_seconds(), _own_seconds(), time.perf_counter()
            times = [0.0] * len(functions)
            for step in range(len(functions)):
                index = (done + step) % len(functions)
                settle(functions[index])
                start = self.clock()
                functions[index]()
                times[index] = self.clock() - start
            wall = time.perf_counter() - started
            if busy is not None:
                others = (_busy_seconds() - busy) - (_own_seconds() - own)
                # jiffies are 10 ms: allow two of them on top of the tolerance
                if others > self.tolerance * wall + 2.0 / TICK and retakes < self.max_retakes:
                    retakes += 1
                    self.retaken += 1
                    time.sleep(0.5)
                    continue
            for sample, value in zip(samples, times, strict=True):
                sample.append(value)
            done += 1
        return samples


# ---------------------------------------------------------------------------- models

def model_path(name: str) -> str:
    return str(LIGHT / f"light_{name}.onnx")


def model_input(model: onnx.ModelProto) -> tuple[str, np.ndarray]:
    """ONNX's runner input for the light models: ``arange(size).reshape(shape) / size``."""
    initializers = {i.name for i in model.graph.initializer}
    graph_input = next(i for i in model.graph.input if i.name not in initializers)
    shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    size = int(np.prod(shape))
    return graph_input.name, (np.arange(size).reshape(shape) / size).astype(np.float32)


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of the model with each ConstantOfShape of a constant shape (a weight) replaced
    by an initializer of seeded random values: the node's value times uniform [0.5, 1.5]."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    shapes = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    rng = np.random.default_rng(seed)
    nodes = []
    for node in model.graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in shapes:
            nodes.append(node)
            continue
        value = numpy_helper.to_array(node.attribute[0].t).reshape(-1)[0]
        array = (value * rng.uniform(0.5, 1.5, [int(d) for d in shapes[node.input[0]]])).astype(value.dtype)
        model.graph.initializer.append(numpy_helper.from_array(array, node.output[0]))
        # IR version 3 lists every initializer among the graph inputs
        model.graph.input.append(onnx.helper.make_tensor_value_info(
            node.output[0], onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def onnxruntime_session(model: onnx.ModelProto | str, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def portable_registry() -> KernelTuningRegistry:
    registry = KernelTuningRegistry()
    kernels.register(registry)
    return registry


# ---------------------------------------------------------------------------- calibration

def calibrate(names: list[str], threads: int, budget_ms: float, path: str) -> dict:
    """Calibrate Conv, Gemm, MatMul and the tunable kernels the models use, for float."""
    used = set()
    for name in names:
        used |= {node.op_type for node in onnx.load(model_path(name)).graph.node}
    registered = {key.kernel for key in list(default_registry().snapshot().keys())}
    selected = sorted((used | set(CALIBRATED_KERNELS)) & registered)
    return onnx_light.calibrate_kernel_tuning(selected, "float", num_threads=threads,
                                              max_duration_ms=budget_ms, path=path)


# ---------------------------------------------------------------------------- profiling

def _run_functions(op_types: set[str]) -> dict[tuple[str, int], str]:
    """(file, first line) of each kernel class's ``run`` -> the model's ops it implements."""
    found: dict[tuple[str, int], set[str]] = {}
    for versions in kernels.KERNELS.values():
        for cls in set(versions.values()):
            run = inspect.unwrap(cls.run)
            code = getattr(run, "__code__", None)
            if code is not None and cls.op_type in op_types:
                found.setdefault((code.co_filename, code.co_firstlineno), set()).add(cls.op_type)
    return {location: "/".join(sorted(ops)) for location, ops in found.items()}


def profile(session: RuntimeSession, feeds: dict[str, np.ndarray],
            op_types: set[str]) -> list[tuple[str, float, int]]:
    """Cumulative time of each kernel class's run over one session run, largest first (the
    elementwise ops share one ``run``, so they share a line)."""
    profiler = cProfile.Profile()
    profiler.enable()
    started = time.perf_counter()
    session.run(None, feeds)
    total = time.perf_counter() - started
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    runs = _run_functions(op_types)
    rows = []
    for (filename, line, _), (calls, _, _, cumulative, _) in stats.items():
        name = runs.get((filename, line))
        if name is not None:
            rows.append((name, cumulative, calls))
    rows.sort(key=lambda row: -row[1])
    rows.append(("(whole run, with profiling)", total, 1))
    return rows


# ---------------------------------------------------------------------------- the table

def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def descriptor_text(threads: int) -> str:
    """``python -m onnx_light cpu`` for this machine."""
    result = subprocess.run([sys.executable, "-m", "onnx_light", "cpu", "--threads", str(threads)],
                            capture_output=True, text=True, check=False)
    return result.stdout.strip()


@contextlib.contextmanager
def _stage(title: str) -> Iterator[None]:
    started = time.perf_counter()
    print(f"... {title}", file=sys.stderr, flush=True)
    yield
    print(f"    done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds per model")
    parser.add_argument("--quick", action="store_true", help="3 rounds and a short calibration")
    parser.add_argument("--calibration-ms", type=float, default=60_000,
                        help="total calibration budget (default 60 s)")
    parser.add_argument("--max-retakes", type=int, default=20, help="per model")
    parser.add_argument("--max-wait", type=float, default=120.0,
                        help="seconds to wait for a quiet machine before each model (default 120)")
    parser.add_argument("--weights", choices=("random", "shipped"), default="random",
                        help="seeded random weights (default) or the files' own (all 0.02)")
    parser.add_argument("--profile", action="store_true", help="where one run's time goes, per model")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    budget = min(args.calibration_ms, 15_000) if args.quick else args.calibration_ms
    started = time.perf_counter()

    print(f"# onnx_light vs onnxruntime on ONNX's light real models ({args.threads} threads)\n")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}; python {platform.python_version()}, "
          f"numpy {np.__version__}, onnx {onnx.__version__}, "
          f"onnxruntime {__import__('onnxruntime').__version__}\n")
    print("```\n" + descriptor_text(args.threads) + "\n```\n")

    with _stage("calibrating"):
        report = calibrate(args.models, args.threads, budget, os.environ["ONNX_LIGHT_KERNEL_TUNING_CACHE"])
    print(f"calibration ({budget / 1e3:.0f} s budget, {report['duration_s']:.1f} s): "
          f"{len(report['calibrated'])} key(s) calibrated, schema-only (not calibratable): "
          f"{', '.join(k.split('/')[1] for k in report['unsupported']) or '-'}; "
          f"failed: {len(report['failed'])}, skipped: {len(report['skipped'])}\n")
    for result in report["calibrated"]:
        changed = "portable kept" if result["portable_kept"] else ", ".join(
            f"{k}={v}" for k, v in result["values"].items())
        print(f"- `{result['key']}`: {changed}")
    print()

    timing = Rounds(args.max_retakes)
    rows, profiles = [], {}
    waited = 0.0
    portable = portable_registry()
    for name in args.models:
        with _stage(name):
            model = onnx.load(model_path(name))
            if args.weights == "random":
                model = with_random_weights(model)
            serialized = model.SerializeToString()
            input_name, x = model_input(model)
            feeds = {input_name: x}
            sessions: dict[str, object] = {}
            construction, first = {}, {}
            variants = [("portable", lambda m=serialized: RuntimeSession(m, num_threads=args.threads,
                                                                         registry=portable)),
                        ("calibrated", lambda m=serialized: RuntimeSession(m, num_threads=args.threads))]
            for label, build in variants:
                start = time.perf_counter()
                session = build()
                construction[label] = time.perf_counter() - start
                start = time.perf_counter()
                output = session.run(None, feeds)[0]
                first[label] = time.perf_counter() - start
                sessions[label] = (session, output)
            start = time.perf_counter()
            ort_session = onnxruntime_session(model, args.threads)
            construction["onnxruntime"] = time.perf_counter() - start
            start = time.perf_counter()
            ort_output = ort_session.run(None, feeds)[0]
            first["onnxruntime"] = time.perf_counter() - start
            labels = [label for label, _ in variants] + ["onnxruntime"]
            functions = [(lambda s=sessions[label][0], f=feeds: s.run(None, f)) for label, _ in variants]
            functions.append(lambda s=ort_session, f=feeds: s.run(None, f))
            waited += wait_until_quiet(args.max_wait)
            samples = timing.run(functions, rounds)
            medians = dict(zip(labels, (statistics.median(s) for s in samples), strict=True))
            difference = float(np.max(np.abs(sessions["calibrated"][1].astype(np.float64) - ort_output)))
            rows.append((name, construction, first, medians, difference))
            if args.profile:  # cProfile sees the calling thread only: no branches on others
                op_types = {node.op_type for node in model.graph.node}
                plain = RuntimeSession(serialized, num_threads=args.threads, branches=False)
                profiles[name] = profile(plain, feeds, op_types)
            del sessions, ort_session, functions

    header = ["model", "construction (ms)", "first run (ms)", "first / median",
              "portable (ms)", "calibrated (ms)", "onnxruntime (ms)", "portable / ort",
              "calibrated / ort", "max abs diff"]
    print(f"{args.weights} weights; medians of {rounds} interleaved rounds ({timing.retaken} "
          f"round(s) retaken because other processes were busy, {waited:.0f} s spent waiting for a "
          "quiet machine); construction and first run of the calibrated session\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for name, construction, first, medians, difference in rows:
        ort = medians["onnxruntime"]
        cells = [name, _ms(construction["calibrated"]), _ms(first["calibrated"]),
                 f"{first['calibrated'] / medians['calibrated']:.2f}",
                 _ms(medians["portable"]), _ms(medians["calibrated"]), _ms(ort),
                 f"{medians['portable'] / ort:.2f}", f"{medians['calibrated'] / ort:.2f}",
                 f"{difference:.2g}"]
        print("| " + " | ".join(cells) + " |")
    print()
    onnxruntime_construction = ", ".join(f"{name} {_ms(c['onnxruntime'])}" for name, c, *_ in rows)
    print(f"onnxruntime construction (ms): {onnxruntime_construction}\n")
    for name, rows_ in profiles.items():
        print(f"profile of one calibrated run of {name} without branches (cProfile, cumulative "
              "ms per kernel class):\n")
        for label, seconds, calls in rows_[:12]:
            print(f"- {label}: {seconds * 1e3:.1f} ms ({calls} call(s))")
        print()
    print(f"total benchmark time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
