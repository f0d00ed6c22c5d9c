"""Calibration: budgets, interleaved measurement, and the shared crossover search.

A kernel library describes a *crossover problem* (how to make deterministic
inputs of a size and case, the forced-serial path, the candidate parallel
path, and how to compare their outputs). :func:`crossover_search` then:

1. walks a geometric series of sizes, every case of each size;
2. runs the serial reference and the candidate on the same inputs;
3. rejects the candidate, before timing anything, when outputs differ;
4. takes interleaved samples (reference, candidate, reference, ...), keeps
   their medians and spreads, re-measures a size whose spread is too large,
   and accepts a crossover only where the candidate wins by ``margin`` on every
   case of every measured size from there up, at least two adjacent sizes;
5. enforces duration, memory and thread budgets;
6. keeps the portable value, saying why, when no stable crossover appears.

:func:`configuration_search` is the multi-parameter counterpart for kernels such
as Gemm and Conv: a fixed corpus, validation against the portable configuration,
medians, a no-regression rule and a minimum aggregate gain.

Every measurement goes into the report. Timers are injectable so tests can use
fake timings.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .keys import KernelTuningKey
from .schema import Value

__all__ = [
    "Budget",
    "CalibrationFailure",
    "CalibrationResult",
    "ConfigurationMeasurement",
    "ConfigurationProblem",
    "CrossoverProblem",
    "Measurement",
    "configuration_search",
    "crossover_search",
    "measure_interleaved",
    "projected_measurement_s",
    "stable_crossover",
]

DEFAULT_KEY_DURATION_S = 3.0
DEFAULT_MEMORY_BYTES = 1 << 30
DEFAULT_SIZES = tuple(1 << e for e in range(12, 23))
DEFAULT_MARGIN = 0.05  # the candidate must be at least 5% faster
MAX_SPREAD = 0.25  # (p75 - p25) / median above this: measure the size again
MAX_REPEATS = 2
SAMPLE_TARGET_S = 2e-4  # inner repetitions make one sample last at least this long
PACE_MIN_BYTES = 1 << 20  # cases from this size on project the cost of making inputs


class CalibrationFailure(RuntimeError):
    """A calibration that must publish nothing: wrong candidate output, broken callback."""


@dataclass(frozen=True)
class Budget:
    """Limits for one key's calibration: wall time, memory of the inputs, threads."""

    max_duration_s: float = DEFAULT_KEY_DURATION_S
    max_memory_bytes: int = DEFAULT_MEMORY_BYTES
    max_threads: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.max_duration_s, bool) or not self.max_duration_s > 0:
            raise ValueError(f"max_duration_s must be > 0, got {self.max_duration_s!r}")
        if isinstance(self.max_memory_bytes, bool) or not (
            isinstance(self.max_memory_bytes, int) and self.max_memory_bytes > 0
        ):
            raise ValueError(f"max_memory_bytes must be an int > 0, got {self.max_memory_bytes!r}")
        if isinstance(self.max_threads, bool) or not (
            isinstance(self.max_threads, int) and self.max_threads >= 1
        ):
            raise ValueError(f"max_threads must be an int >= 1, got {self.max_threads!r}")


@dataclass(frozen=True)
class Measurement:
    """Serial reference and candidate timings of one size and case (:func:`crossover_search`)."""

    size: int
    case: str
    serial_median_s: float
    serial_spread: float
    candidate_median_s: float
    candidate_spread: float
    samples: int
    repeats: int
    speedup: float
    candidate_wins: bool
    candidate: str = "parallel"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ConfigurationMeasurement:
    """One candidate configuration against the portable one on one corpus case
    (:func:`configuration_search`); ``work`` is the case's size for the report, e.g. its
    multiply-adds, and ``candidate`` names the values that differ from the portable ones."""

    case: str
    work: int
    candidate: str
    portable_median_s: float
    portable_spread: float
    candidate_median_s: float
    candidate_spread: float
    samples: int
    speedup: float
    candidate_wins: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CalibrationResult:
    """What one key's calibration produced: values to publish, and the evidence."""

    key: KernelTuningKey
    values: dict[str, Value]
    portable_kept: bool
    measurements: list[Measurement | ConfigurationMeasurement] = field(default_factory=list)
    diagnostics: list[str] = field(default_factory=list)
    load_average: tuple[float, float, float] | None = None
    duration_s: float = 0.0
    crossover: int | None = None
    #: Seconds of one-off setup inside the callback (compiling its kernels on a cold compile
    #: cache), which the duration budget does not count: a first calibration is not discarded
    #: for what a second one would not pay.
    setup_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": str(self.key),
            "values": dict(self.values),
            "portable_kept": self.portable_kept,
            "crossover": self.crossover,
            "measurements": [m.to_dict() for m in self.measurements],
            "diagnostics": list(self.diagnostics),
            "load_average": None if self.load_average is None else list(self.load_average),
            "duration_s": self.duration_s,
            "setup_s": self.setup_s,
        }


class CrossoverProblem(Protocol):
    """What a kernel library supplies for the shared serial/parallel search."""

    cases: Sequence[str]

    def input_bytes(self, size: int, case: str) -> int:
        """Memory the inputs and output of one case need, checked before allocating."""
        ...

    def make_inputs(self, size: int, case: str) -> Any:
        """Deterministic (seeded) inputs of ``size`` output elements."""
        ...

    def serial(self, inputs: Any) -> Any:
        """The forced-serial reference."""
        ...

    def candidate(self, inputs: Any) -> Any:
        """The parallel candidate."""
        ...

    def same_output(self, reference: Any, candidate: Any) -> bool:
        """Whether the candidate's output is acceptable (bit-exact for elementwise)."""
        ...


def load_average() -> tuple[float, float, float] | None:
    """The system load when a calibration starts, so a noisy result can be recognised."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def _quantiles(samples: list[float]) -> tuple[float, float]:
    import statistics  # on first use: it imports fractions and decimal

    median = statistics.median(samples)
    if len(samples) < 4 or median <= 0:
        return median, 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return median, (q3 - q1) / median


def measure_interleaved(
    functions: Sequence[Callable[[], Any]],
    *,
    samples: int = 9,
    timer: Callable[[], float] = time.perf_counter,
    target_s: float = SAMPLE_TARGET_S,
) -> list[tuple[float, float]]:
    """Median time per call and relative spread of each function, sampled in turn.

    One call of each first estimates the cost; each sample then repeats a
    function enough times to last about ``target_s``; samples alternate between
    the functions so that drift hits them alike.
    """
    estimates = []
    for fn in functions:
        start = timer()
        fn()
        estimates.append(max(timer() - start, 1e-9))
    inner = [max(1, min(1000, math.ceil(target_s / cost))) for cost in estimates]
    times: list[list[float]] = [[] for _ in functions]
    for _ in range(samples):
        for index, fn in enumerate(functions):
            start = timer()
            for _ in range(inner[index]):
                fn()
            times[index].append((timer() - start) / inner[index])
    return [_quantiles(t) for t in times]


def projected_measurement_s(round_s: float, functions: int, samples: int) -> float:
    """What :func:`measure_interleaved` of ``functions`` will take, from ``round_s``, the time
    of one call of each: an estimating call each, then ``samples`` samples of each lasting
    about one call or :data:`SAMPLE_TARGET_S`, whichever is longer.

    The searches check it against the duration left before measuring, so that a budget is
    overrun by at most the validating calls of one case, not by a whole measurement.
    """
    return round_s + samples * (round_s + functions * SAMPLE_TARGET_S)


class InputPace:
    """How long making inputs takes per byte, over the cases made so far of at least
    :data:`PACE_MIN_BYTES` (total time over total bytes: below that size, fixed costs
    dominate, and such cases are cheap anyway): the searches project the next case's cost
    with it before making its inputs."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.bytes = 0

    def observe(self, nbytes: int, seconds: float) -> None:
        """Record that inputs of ``nbytes`` took ``seconds`` to make."""
        if nbytes >= PACE_MIN_BYTES:
            self.seconds += max(seconds, 0.0)
            self.bytes += nbytes

    def projected_s(self, nbytes: int) -> float:
        """The time inputs of ``nbytes`` should take (0 before any case)."""
        return self.seconds * nbytes / self.bytes if self.bytes else 0.0


def _over_budget(what: str, projected_s: float, budget: Budget, elapsed_s: float) -> str:
    left = max(budget.max_duration_s - elapsed_s, 0.0)
    return (f"{what} would take about {projected_s:.3g} s, more than the {left:.3g} s "
            f"left of the duration budget of {budget.max_duration_s:g} s")


def crossover_search(
    key: KernelTuningKey,
    problem: CrossoverProblem,
    parameter: str,
    portable: dict[str, Value],
    budget: Budget,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    margin: float = DEFAULT_MARGIN,
    samples: int = 7,
    timer: Callable[[], float] = time.perf_counter,
) -> CalibrationResult:
    """Find the smallest size from which the candidate wins stably; set ``parameter`` to it.

    Every size is measured (budget permitting) so that a loss above an early
    pair of wins (a cache-size effect) is not missed.

    Raises :class:`CalibrationFailure` when the candidate's output differs from
    the reference (nothing may be published then).
    """
    started = timer()
    result = CalibrationResult(key, dict(portable), portable_kept=True,
                               load_average=load_average())
    if budget.max_threads < 2:
        result.diagnostics.append(
            f"{key}: only {budget.max_threads} thread available; portable value kept")
        return result
    wins: list[tuple[int, bool]] = []
    stop_reason = ""
    pace = InputPace()
    for size in sorted(sizes):
        size_wins, stop_reason = _measure_size(key, problem, size, budget, margin, samples,
                                               timer, started, result, pace)
        if stop_reason:
            break
        wins.append((size, size_wins))
    result.crossover = stable_crossover(wins)
    result.duration_s = timer() - started
    if stop_reason and result.crossover is not None:
        result.diagnostics.append(f"{key}: measurement stopped early: {stop_reason}")
    if result.crossover is not None:
        result.values[parameter] = result.crossover
        result.portable_kept = False
        result.diagnostics.append(
            f"{key}: candidate wins by >= {margin:.0%} from {result.crossover} elements "
            f"on every larger measured size, every case; {parameter} = {result.crossover}")
    else:
        why = stop_reason or "the candidate does not win on the largest two sizes and above"
        result.diagnostics.append(f"{key}: no stable crossover ({why}); portable value kept")
    return result


def stable_crossover(wins: Sequence[tuple[int, bool]]) -> int | None:
    """The smallest size from which the candidate wins at every larger measured size,
    provided that is at least two adjacent sizes; None otherwise."""
    crossover = None
    for size, won in reversed(wins):
        if not won:
            break
        crossover = size
    tail = sum(1 for size, _ in wins if crossover is not None and size >= crossover)
    return crossover if tail >= 2 else None


def _measure_size(key: KernelTuningKey, problem: CrossoverProblem, size: int, budget: Budget,
                  margin: float, samples: int, timer: Callable[[], float], started: float,
                  result: CalibrationResult, pace: InputPace) -> tuple[bool, str]:
    """Measure every case of one size; returns (candidate wins every case, stop reason)."""
    all_win = True
    for case in problem.cases:
        needed = problem.input_bytes(size, case)
        if needed > budget.max_memory_bytes:
            return False, (f"size {size} case {case} needs {needed} bytes, over the memory "
                           f"budget of {budget.max_memory_bytes}")
        if timer() - started > budget.max_duration_s:
            return False, f"duration budget of {budget.max_duration_s:g} s used up at size {size}"
        if timer() - started + pace.projected_s(needed) > budget.max_duration_s:
            return False, _over_budget(f"making the inputs of size {size} case {case}",
                                       pace.projected_s(needed), budget, timer() - started)
        making = timer()
        inputs = problem.make_inputs(size, case)
        pace.observe(needed, timer() - making)
        round_started = timer()
        reference = problem.serial(inputs)
        if not problem.same_output(reference, problem.candidate(inputs)):
            raise CalibrationFailure(
                f"{key}: the parallel candidate's output differs from the serial reference "
                f"at size {size}, case {case!r}; nothing published")
        projected = projected_measurement_s(timer() - round_started, 2, samples)
        repeats = 0
        while repeats <= MAX_REPEATS:
            if timer() - started + projected > budget.max_duration_s:
                if repeats == 0:
                    return False, _over_budget(f"measuring size {size} case {case}", projected, budget,
                                               timer() - started)
                break  # the last measurement stands, still marked noisy
            (s_med, s_spread), (c_med, c_spread) = measure_interleaved(
                [lambda x=inputs: problem.serial(x), lambda x=inputs: problem.candidate(x)],
                samples=samples, timer=timer)
            repeats += 1
            noisy = max(s_spread, c_spread) > MAX_SPREAD
            if not noisy:
                break
        speedup = s_med / c_med if c_med > 0 else math.inf
        wins = speedup >= 1.0 + margin and not noisy
        note = "spread too large after repeats; not trusted" if noisy else ""
        result.measurements.append(Measurement(
            size, case, s_med, s_spread, c_med, c_spread, samples, repeats, speedup, wins,
            note=note))
        all_win = all_win and wins
    return all_win, ""


class ConfigurationProblem(Protocol):
    """What a kernel library supplies for a multi-parameter search (Gemm, Conv)."""

    cases: Sequence[str]

    def work(self, case: str) -> int:
        """The case's work for the report (``ConfigurationMeasurement.work``), e.g. multiply-adds."""
        ...

    def input_bytes(self, case: str) -> int:
        """Memory the case needs, checked before allocating."""
        ...

    def make_inputs(self, case: str) -> Any:
        """Deterministic (seeded) inputs of the case."""
        ...

    def run(self, values: dict[str, Value], inputs: Any) -> Any:
        """The kernel's output with the given configuration."""
        ...

    def same_output(self, reference: Any, candidate: Any) -> bool:
        """Whether a configuration's output is within the kernel's stated tolerance."""
        ...


def _label(values: dict[str, Value], portable: dict[str, Value]) -> str:
    changed = {k: v for k, v in values.items() if portable.get(k) != v}
    return ",".join(f"{k}={v}" for k, v in changed.items()) or "portable"


def configuration_search(
    key: KernelTuningKey,
    problem: ConfigurationProblem,
    portable: dict[str, Value],
    candidates: Sequence[dict[str, Value]],
    budget: Budget,
    *,
    max_regression: float = 0.10,
    min_gain: float = 0.05,
    samples: int = 5,
    timer: Callable[[], float] = time.perf_counter,
) -> CalibrationResult:
    """Pick the configuration with the best geometric-mean speedup over a fixed corpus.

    Every candidate's output is validated against the portable configuration
    on every case before timing (a mismatch raises :class:`CalibrationFailure`).
    A candidate is adopted only when no case is more than ``max_regression``
    slower than the portable configuration and the geometric-mean gain is at
    least ``min_gain``; otherwise the portable values stay. The corpus must be
    covered entirely within the budgets for anything to be adopted.
    """
    started = timer()
    result = CalibrationResult(key, dict(portable), portable_kept=True,
                               load_average=load_average())
    options = [dict(portable), *(dict(c) for c in candidates if dict(c) != dict(portable))]
    labels = [_label(c, portable) for c in options]
    speedups: list[list[float]] = [[] for _ in options]
    stop_reason = ""
    pace = InputPace()
    for case in problem.cases:
        needed = problem.input_bytes(case)
        if needed > budget.max_memory_bytes:
            stop_reason = (f"case {case} needs {needed} bytes, over the memory budget of "
                           f"{budget.max_memory_bytes}")
            break
        if timer() - started > budget.max_duration_s:
            stop_reason = f"duration budget of {budget.max_duration_s:g} s used up before {case}"
            break
        if timer() - started + pace.projected_s(needed) > budget.max_duration_s:
            stop_reason = _over_budget(f"making the inputs of case {case}",
                                       pace.projected_s(needed), budget, timer() - started)
            break
        making = timer()
        inputs = problem.make_inputs(case)
        pace.observe(needed, timer() - making)
        round_started = timer()
        reference = problem.run(options[0], inputs)
        for label, values in zip(labels[1:], options[1:], strict=True):
            if not problem.same_output(reference, problem.run(values, inputs)):
                raise CalibrationFailure(
                    f"{key}: configuration {label} gives a different result on case {case!r}; "
                    "nothing published")
        projected = projected_measurement_s(timer() - round_started, len(options), samples)
        if timer() - started + projected > budget.max_duration_s:
            stop_reason = _over_budget(f"measuring case {case}", projected, budget, timer() - started)
            break
        timings = measure_interleaved(
            [lambda v=values, x=inputs: problem.run(v, x) for values in options],
            samples=samples, timer=timer)
        base_median, base_spread = timings[0]
        for index, (median, spread) in enumerate(timings):
            speedup = base_median / median if median > 0 else math.inf
            speedups[index].append(speedup)
            if index:
                result.measurements.append(ConfigurationMeasurement(
                    case, problem.work(case), labels[index], base_median, base_spread, median,
                    spread, samples, speedup, speedup >= 1.0))
    result.duration_s = timer() - started
    if stop_reason:
        result.diagnostics.append(f"{key}: corpus not covered ({stop_reason}); portable kept")
        return result
    best, best_gain = 0, 1.0
    for index in range(1, len(options)):
        worst = min(speedups[index])
        gain = math.exp(math.fsum(math.log(s) for s in speedups[index]) / len(speedups[index]))
        if worst < 1.0 / (1.0 + max_regression):
            continue
        if gain >= 1.0 + min_gain and gain > best_gain:
            best, best_gain = index, gain
    if best:
        result.values = options[best]
        result.portable_kept = False
        result.diagnostics.append(
            f"{key}: adopted {labels[best]} (geometric-mean speedup {best_gain:.2f}x, "
            f"no case more than {max_regression:.0%} slower)")
    else:
        result.diagnostics.append(
            f"{key}: no configuration gains {min_gain:.0%} without slowing a case by more "
            f"than {max_regression:.0%}; portable kept")
    return result
