"""Section 5 of the suite: what calibration costs and how stable its choices are.

* Wall time of the equivalent of ``python -m onnx_light tune-kernels --apply`` on an empty
  cache: ``propose_kernel_tuning_updates`` then ``apply_kernel_tuning_updates`` on a scratch
  file, with a total duration budget (the CLI's ``--max-duration-ms``), broken down by kind of
  kernel. ``--quick`` restricts it to a few kernels.
* Stability: a handful of keys calibrated several times in a row; the spread of every chosen
  value.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from _common import Context, SectionResult, Table, log, section

import onnx_light
from onnx_light.kernels.elementwise import OPS, cost_class
from onnx_light.tuning.keys import KernelTuningKey

OPS_BY_NAME = {op.op_type: op for op in OPS}


def _kind(key: KernelTuningKey) -> str:
    op = OPS_BY_NAME.get(key.kernel)
    if op is None:
        return key.kernel
    return f"elementwise, {cost_class(op, key.element_type)}"


def _value_text(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return str(value)


def full_apply(ctx: Context) -> tuple[Table, Table, list[str]]:
    """Propose and apply on an empty scratch cache; the summary, the breakdown and notes."""
    config = ctx.config
    path = ctx.scratch / "apply-cache.txt"
    path.unlink(missing_ok=True)
    started = time.perf_counter()
    proposal = onnx_light.propose_kernel_tuning_updates(
        None if config.apply_kernels is None else list(config.apply_kernels),
        None if config.apply_element_types is None else list(config.apply_element_types),
        path=path, num_threads=config.threads)
    outcome = onnx_light.apply_kernel_tuning_updates(
        proposal, path=path, max_duration_ms=config.apply_budget_ms,
        progress=lambda done, total, key: log(f"apply {done}/{total} {key}") if done % 50 == 0 else None)
    wall = time.perf_counter() - started
    applied = outcome["applied"]
    durations = [r["duration_s"] for r in applied]
    budget_stops = sum(any("budget" in d for d in r["diagnostics"]) for r in applied)
    changed = sum(not r["portable_kept"] for r in applied)
    selected = len(proposal["missing_calibratable"]) + len(proposal["missing_schema_only"])
    budget = ("the API default (3 s per key)" if config.apply_budget_ms is None
              else f"{config.apply_budget_ms / 1e3:g} s in all "
                   f"(--max-duration-ms {config.apply_budget_ms:g})")
    summary = Table("propose_kernel_tuning_updates + apply_kernel_tuning_updates on an empty cache:",
                    ["what", "value"])
    summary.add("keys selected", selected)
    summary.add("calibratable keys proposed", len(proposal["missing_calibratable"]))
    summary.add("calibrated (published and saved)", len(applied))
    summary.add("values changed from portable", changed)
    summary.add("stopped by their share of the budget", budget_stops)
    summary.add("failed / skipped", f"{len(outcome['failed'])} / {len(outcome['skipped'])}")
    summary.add("duration budget", budget)
    summary.add("wall time (s)", wall)
    if durations:
        summary.add("per key: median / max (s)",
                    f"{statistics.median(durations):.2f} / {max(durations):.2f}")
    kinds: dict[str, list[dict[str, Any]]] = {}
    for record in applied:
        kinds.setdefault(_kind(KernelTuningKey.parse(record["key"])), []).append(record)
    breakdown = Table("Where the calibration time goes, by kind of kernel:",
                      ["kind", "keys", "total (s)", "median per key (s)", "values changed",
                       "stopped by budget", "share of the time"], ratios=("share of the time",))
    total = sum(durations) or 1.0
    for kind, records in sorted(kinds.items(), key=lambda item: -sum(r["duration_s"] for r in item[1])):
        seconds = [r["duration_s"] for r in records]
        breakdown.add(kind, len(records), sum(seconds), statistics.median(seconds),
                      sum(not r["portable_kept"] for r in records),
                      sum(any("budget" in d for d in r["diagnostics"]) for r in records),
                      sum(seconds) / total)
    notes = []
    if config.apply_kernels is not None:
        notes.append(f"This run calibrated only {', '.join(config.apply_kernels)}"
                     + (f" ({', '.join(config.apply_element_types)})" if config.apply_element_types else "")
                     + " (--quick); the full run calibrates every registered key.")
    for failure in outcome["failed"][:5]:
        notes.append(f"failed: `{failure['key']}`: {failure['error']}")
    return summary, breakdown, notes


def stability(ctx: Context) -> tuple[Table, list[str]]:
    """Calibrate each stability key ``stability_repeats`` times; the spread of each value."""
    config = ctx.config
    path = ctx.scratch / "stability-cache.txt"
    chosen: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, list[float]] = {}
    portable: dict[str, dict[str, Any]] = {}
    failures: dict[str, list[str]] = {}
    for repeat in range(config.stability_repeats):
        for kernel, element_type in config.stability_keys:
            report = onnx_light.calibrate_kernel_tuning(
                kernel, element_type, num_threads=config.threads, save=False, path=path,
                max_duration_ms=config.stability_ms_per_key)
            for record in report["calibrated"]:
                chosen.setdefault(record["key"], []).append(record["values"])
                seconds.setdefault(record["key"], []).append(record["duration_s"])
            for failure in report["failed"]:
                failures.setdefault(failure["key"], []).append(failure["error"])
            for parameters in onnx_light.kernel_tuning_parameters(kernel, element_type, path=path,
                                                                   num_threads=config.threads):
                portable[parameters["key"]] = parameters["defaults"]
        log(f"stability {repeat + 1}/{config.stability_repeats}")
    table = Table(f"Values chosen by {config.stability_repeats} calibrations in a row (interleaved "
                  "by key):", ["key", "parameter", "portable", "chosen, in order", "distinct values",
                               "max / min", "failed runs", "calibration time, median (s)"],
                  ratios=("max / min",))
    for key, runs in chosen.items():
        for parameter in runs[0]:
            values = [run[parameter] for run in runs]
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            spread = max(values) / min(values) if numeric and min(values) > 0 else None
            table.add(f"`{key}`", parameter, _value_text(portable.get(key, {}).get(parameter)),
                      ", ".join(_value_text(v) for v in values), len(set(values)), spread,
                      len(failures.get(key, [])), statistics.median(seconds[key]))
    for key, errors in failures.items():
        if key not in chosen:
            table.add(f"`{key}`", "-", "-", "-", 0, None, len(errors), None)
    return table, [f"`{key}`: a calibration failed, nothing published: {errors[0]}"
                   for key, errors in failures.items()]


def calibration_section(ctx: Context) -> SectionResult:
    """Section 5."""
    with section(5, "Calibration: wall time of a full apply, and stability") as result:
        summary, breakdown, notes = full_apply(ctx)
        spread, failed = stability(ctx)
        result.tables = [summary, breakdown, spread]
        result.notes = notes + failed
    return result
