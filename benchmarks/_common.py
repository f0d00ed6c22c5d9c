"""What the sections of the benchmark suite (``benchmarks/run.py``) share.

* :class:`Config`: sizes, rounds and budgets of a full, ``--quick`` or test-sized run.
* :class:`Context`: the one pool, a scratch folder for cache files, and the calibrations that
  several sections use (made once, lazily, with ``onnx_light.calibrate_kernel_tuning``).
* :func:`interleaved`: every figure is a median of repeated samples, and the functions that are
  compared are sampled in turn, round after round (the order rotating each round), so that
  noise from other processes hits them alike.
* :class:`Table` and :class:`SectionResult`: raw values plus their markdown; ``ratios`` names
  the columns that hold ratios (the smoke test checks they are positive finite numbers).
* :func:`section`: wall time, 1-minute load average at the start and end, and the cores other
  processes used meanwhile (``gemm_sweep.LoadMonitor``), printed with every section.

The measurement helpers of the older scripts are imported, not copied: ``elementwise_crossover``
(cases, inputs, kernels), ``gemm_sweep`` (shapes, inputs, sampling inside ``BLAS.scope(1)``,
the load monitor), ``parallel_overhead`` (an empty pool region) and ``real_models`` (the light
models, onnxruntime sessions).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (str(ROOT), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import elementwise_crossover  # noqa: E402
import gemm_sweep  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import parallel_overhead  # noqa: E402

import onnx_light  # noqa: E402
from onnx_light.parallel import ThreadPool, get_pool  # noqa: E402
from onnx_light.tuning import cache as cache_file  # noqa: E402
from onnx_light.tuning import execution_descriptor  # noqa: E402
from onnx_light.tuning.registry import default_registry  # noqa: E402

CACHE_ENV = cache_file.CACHE_ENV


def _import_keeping_cache_env(name: str) -> Any:
    """Import a benchmark script that points the default cache elsewhere on import
    (``real_models`` does, for its own runs) without letting that leak into this process."""
    saved = os.environ.get(CACHE_ENV)
    try:
        return importlib.import_module(name)
    finally:
        if saved is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = saved


real_models = _import_keeping_cache_env("real_models")

__all__ = [
    "Config",
    "Context",
    "SectionResult",
    "Table",
    "elementwise_crossover",
    "gemm_sweep",
    "geomean",
    "interleaved",
    "load_average",
    "onnxruntime_session",
    "parallel_overhead",
    "real_models",
    "section",
]


# ---------------------------------------------------------------------------- configuration

@dataclass(frozen=True)
class Config:
    """Sizes, repetitions and budgets of one run."""

    threads: int = 2
    quick: bool = False
    rounds: int = 9  # interleaved rounds: every figure is the median of this many samples
    elementwise_rounds: int = 15  # section 1, whose goal compares kernels running the same code
    sample_s: float = 1e-3  # a sample repeats a call until it lasts about this long
    elementwise_exponents: tuple[int, ...] = tuple(range(10, 25))
    calibration_ms_per_key: float | None = None  # None: the API's default (3 s per key)
    large_exponent: int = 24  # section 2: the "large" elementwise size
    copy_bytes: int = 256 << 20  # section 2: the copy that measures the memory bandwidth
    gemm_cases: tuple[str, ...] | None = None  # corpus names to keep (None: all)
    gemm_squares: tuple[int, ...] = (1024, 2048)
    chain_length: int = 100
    chain_elements: int = 16
    apply_kernels: tuple[str, ...] | None = None  # None: every registered kernel
    apply_element_types: tuple[str, ...] | None = None
    apply_budget_ms: float | None = 300_000.0  # None: the API's default (3 s per key)
    stability_repeats: int = 5
    stability_keys: tuple[tuple[str, str], ...] = (("Add", "float"), ("Exp", "float"),
                                                   ("Gemm", "float"))
    stability_ms_per_key: float | None = None
    import_repeats: int = 7
    cache_sizes: tuple[int, ...] = (10, 1_000, 10_000)
    models: tuple[str, ...] | None = None  # None: the nine light models
    construction_repeats: int = 3

    @classmethod
    def full(cls, threads: int = 2) -> Config:
        return cls(threads=threads)

    @classmethod
    def quick_run(cls, threads: int = 2) -> Config:
        """``--quick``: sizes up to 2^20, no 1024/2048 squares, a calibration of 4 kernels only."""
        return cls(threads=threads, quick=True, rounds=5, elementwise_rounds=7,
                   elementwise_exponents=tuple(range(10, 21)),
                   large_exponent=22, gemm_squares=(), apply_kernels=("Add", "Relu", "Exp", "Gemm"),
                   apply_element_types=("float",), apply_budget_ms=None, import_repeats=5,
                   construction_repeats=3)

    @classmethod
    def tiny(cls, threads: int = 2) -> Config:
        """For the smoke test: every section runs, in seconds, at sizes too small to mean anything."""
        return cls(threads=threads, quick=True, rounds=2, elementwise_rounds=2, sample_s=1e-4,
                   elementwise_exponents=(10, 12),
                   calibration_ms_per_key=20.0, large_exponent=12, copy_bytes=1 << 20,
                   gemm_cases=("small 16x16x16", "square 128"), gemm_squares=(),
                   chain_length=10, apply_kernels=("Add",), apply_element_types=("float",),
                   apply_budget_ms=100.0, stability_repeats=2, stability_ms_per_key=20.0,
                   import_repeats=1, cache_sizes=(10, 100), models=("squeezenet",),
                   construction_repeats=1)

    def with_threads(self, threads: int) -> Config:
        return replace(self, threads=threads)


# ---------------------------------------------------------------------------- peers

def onnxruntime_session(model: onnx.ModelProto, threads: int, profile_prefix: str | None = None) -> Any:
    """An onnxruntime session set up as ``real_models.onnxruntime_session`` does (``threads``
    intra-op threads, one inter-op thread, sequential execution, CPU provider), with the
    intra-op pool's spinning turned off. With its default spinning, onnxruntime's worker keeps
    a core busy for about 50 ms after every ``run`` (measured here), which would slow down
    whatever is sampled next in an interleaved round; onnx_light's pool does not spin either.
    With ``profile_prefix``, its profiler writes there (``end_profiling`` gives the file)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------------------- statistics

def geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def looped(run: Callable[[], object], seconds: float) -> tuple[Callable[[], object], int]:
    """``run`` looped for about ``seconds`` (timed after two warm-up calls), and the loop's count:
    one sample of a call too short to time alone."""
    run()
    start = time.perf_counter()
    run()
    count = max(1, int(seconds / max(time.perf_counter() - start, 1e-6)))

    def loop() -> None:
        for _ in range(count):
            run()

    return loop, count


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _sample(fn: Callable[[], object], inner: int, scoped: bool) -> float:
    """Seconds per call over ``inner`` calls (``gemm_sweep._sample``: inside ``BLAS.scope(1)``
    when ``scoped``, as a session holds it around a run)."""
    return gemm_sweep._sample(fn, inner, scoped)


Timed = Callable[[], object] | tuple[Callable[[], object], bool]

# A group's samples in one round are taken again (once) when other processes used more than
# BUSY_CORES cores meanwhile; /proc/stat counts in 10 ms ticks, so only rounds of a group that
# last at least CHECK_S are judged.
BUSY_CORES = 0.3
CHECK_S = 0.1
_retaken = [0]


def retaken() -> int:
    """How many group samples :func:`interleaved` has taken again since the process started."""
    return _retaken[0]


def _unpack(timed: Timed) -> tuple[Callable[[], object], bool]:
    return timed if isinstance(timed, tuple) else (timed, False)


def interleaved(groups: Mapping[Any, Mapping[str, Timed]], rounds: int, sample_s: float,
                progress: Callable[[str], None] | None = None, warm: bool = True,
                settle: Mapping[str, float] | None = None) -> dict[Any, dict[str, float]]:
    """Median seconds per call of every function of every group.

    A group holds the functions compared with each other (``name -> fn`` or ``(fn, scoped)``,
    see :func:`_sample`). Each round visits every group and samples its functions back to
    back, in an order that rotates every round; before each sample one untimed call absorbs
    what the previous function left behind (a sleeping pool worker, spinning threads). After a
    function named in ``settle`` the loop sleeps that long (OpenBLAS's threads spin for about
    0.1 s after a multi-threaded call and would take a core from the next function). A sample
    repeats the call until it lasts about ``sample_s``. A group's round during which other
    processes used more than ``BUSY_CORES`` cores is taken again, once.
    """
    settle = settle or {}
    monitor = gemm_sweep.LoadMonitor()
    inner: dict[tuple[Any, str], int] = {}
    for key, functions in groups.items():
        for name, timed in functions.items():
            fn, scoped = _unpack(timed)
            fn()
            once = min(_sample(fn, 1, scoped) for _ in range(2))
            inner[key, name] = max(1, min(20_000, int(sample_s / max(once, 1e-8))))
            if name in settle:
                time.sleep(settle[name])
    samples: dict[Any, dict[str, list[float]]] = {key: {name: [] for name in fns}
                                                  for key, fns in groups.items()}
    started = time.perf_counter()
    for index in range(rounds):
        for key, functions in groups.items():
            names = list(functions)
            shift = index % len(names)
            for attempt in range(2):
                mark, began = monitor.start(), time.perf_counter()
                taken = {}
                for name in names[shift:] + names[:shift]:
                    fn, scoped = _unpack(functions[name])
                    if warm:
                        fn()
                    taken[name] = _sample(fn, inner[key, name], scoped)
                    if name in settle:
                        time.sleep(settle[name])
                busy = monitor.foreign(mark)
                if (attempt == 0 and busy is not None and busy > BUSY_CORES
                        and time.perf_counter() - began >= CHECK_S):
                    _retaken[0] += 1
                    continue
                break
            for name, value in taken.items():
                samples[key][name].append(value)
        if progress is not None:
            progress(f"round {index + 1}/{rounds} ({time.perf_counter() - started:.0f} s)")
    return {key: {name: statistics.median(values) for name, values in by_name.items()}
            for key, by_name in samples.items()}


# ---------------------------------------------------------------------------- tables

def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        magnitude = abs(value)
        if magnitude >= 100:
            return f"{value:.0f}"
        if magnitude >= 10:
            return f"{value:.1f}"
        if magnitude >= 0.01 or magnitude == 0:
            return f"{value:.2f}"
        return f"{value:.2g}"
    return str(value)


@dataclass
class Table:
    """A markdown table kept as raw values; ``ratios`` lists the columns holding ratios."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    ratios: tuple[str, ...] = ()
    formats: dict[str, Callable[[Any], str]] = field(default_factory=dict)

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def column(self, name: str) -> list[Any]:
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def markdown(self) -> str:
        formats = [self.formats.get(name, _cell) for name in self.columns]
        lines = [f"{self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.columns))) + "|"]
        for row in self.rows:
            lines.append("| " + " | ".join(fmt(v) if v is not None else "n/a"
                                           for fmt, v in zip(formats, row, strict=True)) + " |")
        return "\n".join(lines)


@dataclass
class SectionResult:
    """One section's tables and notes, with the load it ran under."""

    number: int
    title: str
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    load_start: float | None = None
    load_end: float | None = None
    other_cores: float | None = None
    retaken: int = 0

    def markdown(self) -> str:
        def fmt(load: float | None) -> str:
            return "?" if load is None else f"{load:.2f}"

        other = "?" if self.other_cores is None else f"{self.other_cores:.2f}"
        parts = [f"## {self.number}. {self.title}", "",
                 f"load average (1 min) at start {fmt(self.load_start)}, at end {fmt(self.load_end)}; "
                 f"other processes used {other} cores on average meanwhile; {self.seconds:.0f} s; "
                 f"{self.retaken} round(s) of a group taken again because other processes used more "
                 f"than {BUSY_CORES} cores"]
        for table in self.tables:
            parts += ["", table.markdown()]
        for note in self.notes:
            parts += ["", note]
        return "\n".join(parts) + "\n"


@contextlib.contextmanager
def section(number: int, title: str) -> Iterator[SectionResult]:
    """Time a section and record the load around it."""
    result = SectionResult(number, title, load_start=load_average())
    monitor = gemm_sweep.LoadMonitor()
    mark = monitor.start()
    started = time.perf_counter()
    before = retaken()
    log(f"section {number}: {title}")
    yield result
    result.retaken = retaken() - before
    result.seconds = time.perf_counter() - started
    result.other_cores = monitor.foreign(mark)
    result.load_end = load_average()
    log(f"section {number} done in {result.seconds:.0f} s")


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- context

class Context:
    """What the sections share within one run: config, pool, scratch folder, calibrations."""

    def __init__(self, config: Config, scratch: str | os.PathLike[str] | None = None) -> None:
        self.config = config
        self.pool: ThreadPool = get_pool(config.threads)
        self._own_scratch = scratch is None
        self.scratch = Path(scratch or tempfile.mkdtemp(prefix="onnx_light-bench-"))
        self.cache_path = self.scratch / "calibrated-cache.txt"
        self.descriptor = execution_descriptor(config.threads)
        self._calibrations: dict[tuple[tuple[str, ...], tuple[str, ...]], dict[str, Any]] = {}

    def close(self) -> None:
        if self._own_scratch:
            import shutil

            shutil.rmtree(self.scratch, ignore_errors=True)

    def calibrate(self, kernels: Sequence[str], element_types: Sequence[str]) -> dict[str, Any]:
        """``onnx_light.calibrate_kernel_tuning`` of the selected keys into the scratch cache,
        once per selection; the report, with ``seconds`` (wall time)."""
        selection = (tuple(kernels), tuple(element_types))
        if selection not in self._calibrations:
            budget = self.config.calibration_ms_per_key
            count = len(onnx_light.tuning.api.select_keys(default_registry().snapshot(), list(kernels),
                                                          list(element_types)))
            started = time.perf_counter()
            report = onnx_light.calibrate_kernel_tuning(
                list(kernels), list(element_types), num_threads=self.config.threads,
                max_duration_ms=None if budget is None else budget * count, path=self.cache_path)
            report["seconds"] = time.perf_counter() - started
            self._calibrations[selection] = report
        return self._calibrations[selection]

    def resolved(self, key: onnx_light.KernelTuningKey) -> tuple[dict[str, Any], str]:
        """The values a session built now would get for ``key`` on this machine, and their source."""
        resolution = default_registry().snapshot().resolve(key, self.descriptor)
        return dict(resolution.values), resolution.source


# ---------------------------------------------------------------------------- the header

def header(config: Config, started: float | None = None) -> str:
    """Date, execution descriptor (short and JSON), versions and BLAS."""
    import onnxruntime

    descriptor = execution_descriptor(config.threads)
    lines = [f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}  ",
             f"execution descriptor: `{descriptor.short()}`  ",
             f"python {platform.python_version()}, numpy {np.__version__}, onnx {onnx.__version__}, "
             f"onnxruntime {onnxruntime.__version__}, onnx_light "
             f"{cache_file.onnx_light_version()}; os.cpu_count() {os.cpu_count()}; "
             f"{'--quick' if config.quick else 'full run'}, {config.threads} threads, "
             f"{config.rounds} interleaved rounds per figure ({config.elementwise_rounds} in section 1)  "]
    lines += gemm_sweep.blas_lines()
    lines += ["", "```json", json.dumps(descriptor.to_dict(), indent=1), "```"]
    return "\n".join(lines)
