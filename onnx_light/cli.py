"""Command line: ``python -m onnx_light {tune-kernels,run,cpu,bench}``.

``main(argv)`` returns the exit status, so tests call it directly.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from . import __version__, tuning
from .kernels.base import numpy_dtype
from .profiling import Profiler, profile_file_name
from .runtime import RuntimeSession
from .runtime.memory import hold_freed_memory
from .terminal import fit_table, terminal_width, wrap_words
from .tuning import calibration
from .tuning.api import select_keys
from .tuning.cache import REWRITTEN_STATUSES, CacheStatus, LineOutcome

__all__ = ["main"]


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def _format_values(values: dict[str, Any] | None) -> str:
    if values is None:
        return "-"
    return " ".join(f"{name}={value}" for name, value in values.items())


def _cmd_cpu(args: argparse.Namespace) -> int:
    descriptor = tuning.execution_descriptor(args.threads)
    if args.json:
        _print_json(descriptor.to_dict())
        return 0
    cpu = descriptor.cpu
    rows = [
        ("architecture", cpu.architecture),
        ("vendor", cpu.vendor),
        ("family / model / stepping", f"{cpu.family} / {cpu.model} / {cpu.stepping}"),
        ("microarchitecture", cpu.microarchitecture),
        ("features", " ".join(sorted(cpu.features)) or "-"),
        ("cache line / L1d / L2 / L3",
         " / ".join(_size(v) for v in (cpu.cache_line, cpu.l1d, cpu.l2, cpu.l3))),
        ("physical / logical cores", f"{cpu.physical_cores} / {cpu.logical_cores}"),
        ("effective threads", str(descriptor.num_threads)),
    ]
    print("\n".join(fit_table(None, rows, terminal_width(), wrap=(1,))))
    return 0


def _size(value: int | None) -> str:
    if value is None:
        return "unknown"
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale} {unit}"
    return f"{value} B"


SOURCE_LABELS = {
    "portable_default": "portable default",
    "exact_processor_profile": "shipped: exact processor",
    "processor_list_profile": "shipped: processor list",
    "microarchitecture_profile": "shipped: microarchitecture",
    "instruction_set_profile": "shipped: instruction set",
}
ORIGIN_LABELS = {"calibrated": "calibrated", "manual": "set by hand"}


def _source_label(record: dict[str, Any]) -> str:
    """Where a key's active values come from, in words: a published profile says how it was
    made (calibrated for this processor and thread count, set by hand)."""
    if record["active_source"] == "published_profile":
        origin = (record.get("active_provenance") or {}).get("origin")
        return ORIGIN_LABELS.get(origin, "published")
    return SOURCE_LABELS.get(record["active_source"], record["active_source"])


def _warn(message: str) -> None:
    print("\n".join(wrap_words(f"warning: {message}", terminal_width(), indent="  ")),
          file=sys.stderr)


def _warn_about_cache(args: argparse.Namespace) -> None:
    """Say when the ``--cache`` file is damaged, foreign or unsafe, as the import does for
    the default cache (which it has warned about already)."""
    if args.cache is None or Path(args.cache).expanduser() == Path(
            tuning.default_kernel_tuning_cache_path()):
        return
    info = tuning.inspect_kernel_tuning_cache(args.cache, num_threads=args.threads)
    invalid = [p for p in info["profiles"] if p["outcome"] == LineOutcome.INVALID]
    clean = info["status"] in (CacheStatus.OK, CacheStatus.MISSING)
    if clean and not invalid and not info.get("ownership"):
        return
    details = "; ".join(info["diagnostics"][:3])
    more = len(info["diagnostics"]) - 3
    rewrite = (" --apply and --reset copy the file to <cache>.bad-<time> before rewriting it "
               "without them." if info["status"] in REWRITTEN_STATUSES else "")
    _warn(f"kernel tuning cache {info['path']} is {info['status']}: {details}"
          + (f"; and {more} more" if more > 0 else "")
          + f". Its unusable entries are ignored (their keys show as missing).{rewrite}")


def _warn_about_load() -> None:
    """Warn before measuring on a machine that other programs keep busy."""
    busy = _busy(calibration.load_average())
    if busy:
        _warn(f"{busy}: other programs compete for the processor, so the timings are noisy "
              f"and calibration may keep the portable values or choose poor ones; calibrate "
              f"on an idle machine for values to keep")


def _busy(load: Sequence[float] | None) -> str:
    """``load average X on N CPUs`` when the 1-minute load average is at least a quarter of
    the CPUs (and at least 1), else ''."""
    cpus = os.cpu_count() or 1
    if load is None or load[0] < max(1.0, cpus / 4):
        return ""
    return f"load average {load[0]:.2f} on {cpus} CPUs"


def _warn_about_threads(args: argparse.Namespace) -> None:
    threads = getattr(args, "threads", None)
    available = tuning.effective_thread_count()
    if threads is not None and threads > available:
        _warn(f"--threads {threads} is more than the {available} CPU(s) this process may use "
              f"(its effective thread count, see '{args.prog} cpu'): the extra threads share "
              f"CPUs, so runs are slower and calibrations describe a machine this is not")


def _use_cache(args: argparse.Namespace) -> None:
    """With ``--cache``, this process's active values are that file's (published here only)."""
    if args.cache is not None:
        tuning.default_registry().forget()
        tuning.load_kernel_tuning_cache(args.cache, num_threads=args.threads)


def _tuning_report(args: argparse.Namespace) -> dict[str, Any]:
    """The read-only report: active values per key and the cache's coverage.

    With ``--cache``, the values are that file's, loaded into a copy of the registry: the
    report leaves this process's registry as it was.
    """
    registry = tuning.default_registry()
    if args.cache is not None:
        registry = registry.copy(published=False)
        tuning.load_kernel_tuning_cache(args.cache, num_threads=args.threads, registry=registry)
    records = tuning.kernel_tuning_parameters(
        args.kernel, args.element_type, path=args.cache, num_threads=args.threads,
        registry=registry)
    covered = [r for r in records if r["cached_values"] is not None]
    missing = [r for r in records if r["cached_values"] is None]
    return {
        "descriptor": tuning.execution_descriptor(args.threads).to_dict(),
        "cache": str(args.cache or tuning.default_kernel_tuning_cache_path()),
        "keys": records,
        "summary": {
            "selected": len(records),
            "covered": len(covered),
            "missing": len(missing),
            "missing_calibratable": sum(r["calibratable"] for r in missing),
            "missing_schema_only": sum(not r["calibratable"] for r in missing),
        },
    }


class _ProgressBar:
    """One step per key on stderr; silent unless stderr is a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, done: int, total: int, key: str) -> None:
        if not self.enabled or total == 0:
            return
        width = min(terminal_width() or 120, 120) - 1
        filled = 30 * done // total
        line = f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} {key}"
        sys.stderr.write(line[:width].ljust(width))
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _duration_budget_s(args: argparse.Namespace, keys: int) -> float:
    """The calibration's duration budget, as ``apply_kernel_tuning_updates`` shares it."""
    if args.max_duration_ms is not None:
        return args.max_duration_ms / 1000
    return calibration.DEFAULT_KEY_DURATION_S * keys


def _command(args: argparse.Namespace, *options: str) -> str:
    """This invocation's selection as a command line, with ``options`` added."""
    words = ["", "tune-kernels", *options]
    for flag, values in (("--kernel", args.kernel), ("--element-type", args.element_type)):
        for value in values or []:
            words += [flag, str(value)]
    for flag, value in (("--cache", args.cache), ("--threads", args.threads)):
        if value is not None:
            words += [flag, str(value)]
    return " ".join([args.prog, *map(shlex.quote, words[1:])])


def _selection(keys: Sequence[str]) -> str:
    """Which keys, briefly: each kernel with its element types when there are few kernels."""
    types: dict[str, list[str]] = {}
    for text in keys:
        key = tuning.KernelTuningKey.parse(text)
        types.setdefault(key.kernel, []).append(key.element_type_name)
    if len(types) > 8:
        return f"{len(types)} kernels"
    return ", ".join(f"{kernel} [{', '.join(names)}]" for kernel, names in types.items())


def _next_step(args: argparse.Namespace, report: dict[str, Any]) -> list[str]:
    """What ``--apply`` would do with this selection, and about how long it would take."""
    records = report["keys"]
    todo = [r["key"] for r in records if r["cached_values"] is None and r["calibratable"]]
    manual = [r["key"] for r in records if r["cached_values"] is None and not r["calibratable"]]
    lines = []
    if todo:
        budget = _duration_budget_s(args, len(todo))
        per_key = " (--max-duration-ms)" if args.max_duration_ms is not None else (
            f" ({calibration.DEFAULT_KEY_DURATION_S:g} s per key; --max-duration-ms sets the "
            f"budget)")
        narrow = "" if args.kernel else " (--kernel and --element-type select fewer)"
        budget_option = () if args.max_duration_ms is None else (
            "--max-duration-ms", f"{args.max_duration_ms:g}")
        lines.append(
            f"next: '{_command(args, '--apply', *budget_option)}' calibrates the {len(todo)} "
            f"missing key(s) of {_selection(todo)}{narrow} and saves them, in at most {_duration(budget)}"
            f"{per_key}; calibrate on an otherwise idle machine.")
    elif records and not manual:
        lines.append(f"next: every selected key is covered. '{_command(args, '--apply', '--force')}' "
                     f"calibrates them again; '{_command(args, '--reset')}' forgets them.")
    if manual:
        lines.append(f"{len(manual)} schema-only key(s) of {_selection(manual)} have no "
                     f"calibration: set their values with onnx_light.set_kernel_tuning_parameters.")
    return lines


def _print_report(args: argparse.Namespace, report: dict[str, Any]) -> None:
    width = terminal_width()
    descriptor = tuning.CpuExecutionDescriptor.from_dict(report["descriptor"])
    _print_paragraph(f"processor: {descriptor.short()}", width)
    print(f"cache: {report['cache']}")  # a path is never cut, so that it can be copied
    rows = []
    for record in report["keys"]:
        state = "covered" if record["cached_values"] is not None else (
            "missing" if record["calibratable"] else "schema-only")
        rows.append((record["key"], state, _source_label(record),
                     _format_values(record["active_values"])))
    if rows:
        print("\n".join(fit_table(("key", "cache", "values from", "values"), rows, width, wrap=(3,))))
    summary = report["summary"]
    print(f"selected {summary['selected']}, covered {summary['covered']}, "
          f"missing {summary['missing']} ({summary['missing_calibratable']} calibratable, "
          f"{summary['missing_schema_only']} schema-only)")
    for line in _next_step(args, report):
        _print_paragraph(line, width)


def _print_paragraph(text: str, width: int | None) -> None:
    """``text`` fitted to ``width``, its later lines indented."""
    print("\n".join(wrap_words(text, width, indent="  ")))


def _reason(result: dict[str, Any]) -> str:
    """Why calibration chose what it chose: its diagnostics without the key, and the load."""
    prefix = f"{result['key']}: "
    parts = [d[len(prefix):] if d.startswith(prefix) else d for d in result["diagnostics"]]
    busy = _busy(result.get("load_average"))
    if busy:
        parts.append(f"{busy} when measured")
    return "; ".join(parts) or "-"


def _change_row(result: dict[str, Any], before: dict[str, Any] | None) -> tuple[str, ...]:
    unchanged = before is not None and dict(before) == dict(result["values"])
    speedup = "-" if unchanged or result["portable_kept"] else _speedup_at_crossover(result)
    return (result["key"], _format_values(before), "unchanged" if unchanged else
            _format_values(result["values"]), speedup, _reason(result))


def _speedup_at_crossover(result: dict[str, Any]) -> str:
    at = [m["speedup"] for m in result["measurements"] if "size" in m and m["size"] == result["crossover"]]
    return f"{min(at):.2f}x" if at else "-"


def _apply(args: argparse.Namespace) -> int:
    _use_cache(args)
    records = tuning.kernel_tuning_parameters(
        args.kernel, args.element_type, path=args.cache, num_threads=args.threads)
    proposal = tuning.propose_kernel_tuning_updates(
        args.kernel, args.element_type, path=args.cache, num_threads=args.threads)
    if args.force:  # the covered calibratable keys too, in key order
        calibratable = {r["key"] for r in records if r["calibratable"]}
        wanted = set(proposal["missing_calibratable"]) | (set(proposal["covered"]) & calibratable)
        proposal["missing_calibratable"] = [r["key"] for r in records if r["key"] in wanted]
    before = {r["key"]: r["active_values"] for r in records}
    todo = proposal["missing_calibratable"]
    if todo:
        _warn_about_load()
        if not args.quiet and not args.json:
            print(f"calibrating {len(todo)} key(s), at most "
                  f"{_duration(_duration_budget_s(args, len(todo)))}", file=sys.stderr)
    progress = _ProgressBar(sys.stderr.isatty() and not args.quiet)
    max_memory = None if args.max_memory_mb is None else args.max_memory_mb * (1 << 20)
    outcome = tuning.apply_kernel_tuning_updates(
        proposal, path=args.cache, max_duration_ms=args.max_duration_ms,
        max_memory_bytes=max_memory, progress=progress)
    if args.json:
        _print_json({"proposal": proposal, "outcome": outcome})
    else:
        recalibrated = len(set(todo) & set(proposal["covered"]))
        print(f"covered before: {len(proposal['covered'])}, calibrated now: "
              f"{len(outcome['applied'])}" + (f" ({recalibrated} again)" if recalibrated else "")
              + f", failed: {len(outcome['failed'])}, skipped: {len(outcome['skipped'])}, "
              f"schema-only (manual): {len(proposal['missing_schema_only'])}")
        rows = [_change_row(r, before.get(r["key"])) for r in outcome["applied"]]
        if rows:
            print("\n".join(fit_table(("key", "old", "new", "speedup", "reason"), rows,
                                      terminal_width(), wrap=(1, 2, 4))))
        if not todo and not args.force and proposal["covered"]:
            print(f"nothing to calibrate: the selected keys are covered; "
                  f"'{_command(args, '--apply', '--force')}' calibrates them again")
        for failure in outcome["failed"]:
            print(f"FAILED {failure['key']}: {failure['error']}", file=sys.stderr)
        for skipped in outcome["skipped"]:
            print(f"skipped {skipped['key']}: {skipped['reason']}", file=sys.stderr)
        if outcome["cache_update"]:
            print(f"cache written: {outcome['cache_update']['path']}")
    _report_backup(outcome["cache_update"])
    if args.plot and outcome["applied"]:
        from .plotting import plot_calibration  # matplotlib only when asked for

        plot_calibration(outcome["applied"], args.plot)
        print(f"figure written: {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 1 if outcome["failed"] or outcome["skipped"] else 0


def _report_backup(update: dict[str, Any] | None) -> None:
    if update and update.get("backup"):
        _warn(f"the kernel tuning cache {update['path']} had unusable content: it was copied to "
              f"{update['backup']} and rewritten without it")


def _reset(args: argparse.Namespace) -> int:
    result = tuning.reset_kernel_tuning_parameters(
        args.kernel, args.element_type, path=args.cache, num_threads=args.threads)
    if args.json:
        _print_json(result)
    else:
        descriptor = tuning.CpuExecutionDescriptor.from_dict(result["descriptor"])
        update = result["cache_update"]
        where = (f"{update['removed']} entry(ies) removed from {update['path']}"
                 if Path(update["path"]).exists() else f"no cache file at {update['path']}")
        print(f"forgot the values of {len(result['keys'])} key(s) for this processor at "
              f"{descriptor.num_threads} threads: {where}")
    _report_backup(result["cache_update"])
    return 0


def _check_cluster_options(args: argparse.Namespace) -> None:
    """``--ray`` needs ``--apply`` and excludes what a cluster calibration does not take."""
    if args.ray is None:
        if args.output is not None:
            raise ValueError("--output names the merged cache of a cluster calibration: it needs --ray")
        return
    if not args.apply:
        raise ValueError("--ray calibrates the nodes of a cluster: it needs --apply")
    for option, given in (("--threads", args.threads is not None), ("--force", args.force),
                          ("--plot", args.plot), ("--max-memory-mb", args.max_memory_mb is not None)):
        if given:
            raise ValueError(f"{option} does not apply to --ray (each node calibrates the keys "
                             "the output lacks, at its own CPU count)")


def _node_line(node: dict[str, Any]) -> str:
    """One node's outcome in a cluster calibration, for the progress lines."""
    where = f"node {node['node_id'][:12]} ({node['address']}, {node['cpus']} CPUs)"
    if node["status"] != "ok":
        return f"{where}: {node['status']}" + (f": {node['error']}" if node["error"] else "")
    return (f"{where}: {len(node['calibrated'])} key(s) calibrated, {len(node['covered'])} covered "
            f"already, {len(node['failed']) + len(node['skipped'])} failed or skipped, in "
            f"{node['duration_s']:.3g} s")


def _apply_on_cluster(args: argparse.Namespace) -> int:
    try:
        from .fleet import calibrate_cluster  # Ray only when asked for
    except ImportError as exc:
        raise RuntimeError(f"--ray needs Ray: pip install 'onnx_light[ray]' ({exc})") from None

    def progress(node: dict[str, Any]) -> None:
        if not args.quiet and not args.json:
            print(_node_line(node), file=sys.stderr)

    result = calibrate_cluster(args.ray, kernels=args.kernel, element_types=args.element_type,
                               output=args.output or args.cache,
                               max_duration_ms=args.max_duration_ms, progress=progress)
    lost = [n for n in result["nodes"] if n["status"] in ("failed", "timed out")]
    if args.json:
        _print_json(result)
    else:
        print(f"{len(result['nodes'])} node(s), {len(lost)} failed or timed out: "
              f"{result['written']} entry(ies) merged into {result['output']} in "
              f"{result['duration_s']:.3g} s")
    _report_backup(result["cache_update"])
    return 1 if lost or any(n["failed"] or n["skipped"] for n in result["nodes"]) else 0


def _cmd_tune_kernels(args: argparse.Namespace) -> int:
    for option, given in (("--plot", args.plot), ("--force", args.force)):
        if given and not args.apply:
            raise ValueError(f"{option} acts on a calibration: it needs --apply")
    _check_cluster_options(args)
    select_keys(tuning.default_registry().snapshot(), args.kernel, args.element_type)  # or raise
    _warn_about_cache(args)
    if args.ray is not None:
        return _apply_on_cluster(args)
    if args.reset:
        return _reset(args)
    if args.apply:
        return _apply(args)
    report = _tuning_report(args)
    if args.json:
        _print_json(report)
        return 0
    _print_report(args, report)
    return 0


def _random_input(arg: Any, rng: np.random.Generator) -> np.ndarray:
    """Random data of an input's declared type, symbolic dimensions taken as 1."""
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in (arg.shape or [])]
    dtype = numpy_dtype(tuning.element_type_code(arg.type))
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)
    if dtype.kind == "O":
        return np.array(rng.integers(0, 10, size=shape).astype(str), dtype=object)
    return rng.standard_normal(shape).astype(dtype)


def _parse_inputs(specs: list[str] | None) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in specs or []:
        name, sep, filename = spec.partition("=")
        if not sep or not name or not filename:
            raise ValueError(f"--input expects NAME=FILE.npy, got {spec!r}")
        feeds[name] = np.load(filename, allow_pickle=False)
    return feeds


def _summary(array: np.ndarray) -> str:
    if array.size == 0 or (array.dtype.kind not in "biuf" and array.dtype.name != "bfloat16"):
        return ""
    values = array.astype(np.float64)
    return f"min {values.min():.6g} max {values.max():.6g} mean {values.mean():.6g}"


def _cmd_run(args: argparse.Namespace) -> int:
    if args.hold_memory and not hold_freed_memory():
        print("--hold-memory: not available here (the C library is not glibc)", file=sys.stderr)
    started = time.perf_counter()
    session = RuntimeSession(args.model, num_threads=args.threads)
    construction = time.perf_counter() - started
    feeds = _parse_inputs(args.input)
    rng = np.random.default_rng(0)
    for arg in session.get_inputs():
        if arg.name not in feeds:
            feeds[arg.name] = _random_input(arg, rng)
    profiler = Profiler() if args.profile else None
    times = []
    for _ in range(args.repeat):
        started = time.perf_counter_ns()
        outputs = session.run(None, feeds, node_hook=profiler and profiler.node_hook)
        times.append((time.perf_counter_ns() - started) / 1e9)
        if profiler is not None:
            profiler.session_event("model_run", started)
    names = [arg.name for arg in session.get_outputs()]
    for name, array in zip(names, outputs, strict=True):
        print(f"{name}: shape {list(array.shape)} dtype {array.dtype} {_summary(array)}".rstrip())
    print(f"session construction {construction * 1e3:.2f} ms "
          f"(tuning resolution {session.tuning_resolution_seconds * 1e3:.2f} ms), "
          f"{session.num_threads} threads")
    print(f"plan: {session.folded_nodes} node(s) folded into constants, {session.fused_nodes} "
          f"fused into others, {session.branch_groups} group(s) of branches run side by side")
    later = times[1:] or times
    print(f"first run {times[0] * 1e3:.3f} ms, median of {len(later)} later run(s) "
          f"{statistics.median(later) * 1e3:.3f} ms")
    if args.output:
        np.savez(args.output, **dict(zip(names, outputs, strict=True)))
        print(f"outputs written to {args.output}")
    if profiler is not None:
        _report_profile(profiler)
    return 0


def _report_profile(profiler: Profiler) -> None:
    """Time per operator type over every run, the trace file, and a plot with matplotlib."""
    rows = profiler.operator_summary()
    table = [("operator", "time ms", "share", "calls", "mean ms")] + [
        (row["op_type"], f"{row['total_us'] / 1e3:.3f}", f"{100 * row['share']:.1f}%",
         str(row["calls"]), f"{row['mean_us'] / 1e3:.4f}") for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(5)]
    print("time per operator type (every run; shares of the summed run time, profiling included):")
    for line in table:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(line, widths, strict=True))))
    trace = profiler.write(profile_file_name("onnx_light_profile", profiler.start_time_ns))
    print(f"trace written: {trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    try:
        from .plotting import plot_operator_times  # matplotlib only when asked for

        figure = str(Path(trace).with_suffix(".png"))
        plot_operator_times(rows, figure)
    except ImportError as exc:
        print(f"no plot: {exc}")
    else:
        print(f"plot written: {figure}")


# The suite lives in the source tree, not in the installed package: ``bench`` finds it beside
# the package folder (an editable install or a checkout) and runs it in a fresh interpreter, so
# that the suite can point the default cache at a scratch file before onnx_light is imported.
BENCHMARK_SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"


def _cmd_bench(args: argparse.Namespace) -> int:
    if not BENCHMARK_SCRIPT.is_file():
        raise FileNotFoundError("the benchmark suite is not part of the installed package; from "
                                "a source checkout of onnx_light run: python benchmarks/run.py "
                                "[--quick]")
    argv = [sys.executable, str(BENCHMARK_SCRIPT)]
    if args.quick:
        argv.append("--quick")
    for option, value in (("--threads", args.threads), ("--output", args.output),
                          ("--sections", args.sections), ("--max-load", args.max_load),
                          ("--max-wait-minutes", args.max_wait_minutes)):
        if value is not None:
            argv += [option, str(value)]
    return subprocess.call(argv)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr (exit status 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def program_name(argv0: str | None = None) -> str:
    """The name the user invoked: the console script's (``onnx-light``), else
    ``python -m onnx_light`` (also when called from another program, such as a test)."""
    argv0 = (sys.argv[0] if sys.argv else "") if argv0 is None else argv0
    name = Path(argv0).name
    stem = name[: -len(".exe")] if name.lower().endswith(".exe") else name
    if stem.startswith(("onnx-light", "onnx_light")) and not name.endswith(".py"):
        return stem
    return "python -m onnx_light"


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every subcommand; ``prog`` defaults to :func:`program_name`."""
    parser = _Parser(
        prog=program_name() if prog is None else prog,
        description="A lightweight ONNX runtime for CPUs with processor-aware kernel tuning.")
    parser.add_argument("--version", action="version", version=f"onnx_light {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    tune = commands.add_parser(
        "tune-kernels", help="report kernel tuning coverage; --apply calibrates and saves",
        description="Report, for this processor and thread count, each tunable kernel's active "
                    "values, where they come from and whether the cache covers them, then what "
                    "--apply would calibrate. Writes nothing unless --apply (calibrate the "
                    "missing calibratable kernels and save the results) or --reset (forget this "
                    "machine's values) is given.")
    tune.add_argument("--kernel", action="append", metavar="NAME",
                      help="select a kernel (repeatable), e.g. Add")
    tune.add_argument("--element-type", action="append", metavar="TYPE",
                      help="select an element type (repeatable): float, FLOAT, float32 or 1")
    tune.add_argument("--cache", metavar="PATH", help="cache file (default: the user cache)")
    tune.add_argument("--threads", type=_positive_int, metavar="N",
                      help="thread count (default: the CPUs this process may use)")
    tune.add_argument("--json", action="store_true", help="print JSON")
    action = tune.add_mutually_exclusive_group()
    action.add_argument("--apply", action="store_true",
                        help="calibrate the missing calibratable kernels and save the results")
    action.add_argument("--reset", action="store_true",
                        help="forget this processor's values at this thread count for the "
                             "selected kernels (all without --kernel), in the cache file too")
    tune.add_argument("--force", action="store_true",
                      help="with --apply: calibrate the covered kernels again too")
    tune.add_argument("--max-duration-ms", type=_positive_float, metavar="MS",
                      help="total calibration time budget (default: 3 s per key, i.e. per kernel and "
                           "element type)")
    tune.add_argument("--max-memory-mb", type=_positive_int, metavar="MB",
                      help="memory budget for calibration inputs (default 1024)")
    tune.add_argument("--quiet", action="store_true", help="no progress bar")
    tune.add_argument("--plot", metavar="FILE.png",
                      help="with --apply: draw serial and parallel times per size with the "
                           "chosen crossover (needs matplotlib)")
    tune.add_argument("--ray", metavar="ADDRESS",
                      help="with --apply: calibrate every node of this Ray cluster ('auto', "
                           "host:port or ray://...) at its CPU count, --max-duration-ms per node; "
                           "needs onnx_light[ray] (docs/fleet.md)")
    tune.add_argument("--output", metavar="PATH",
                      help="with --ray: the cache file the nodes' entries are merged into "
                           "(default: --cache, else the user cache)")
    tune.set_defaults(handler=_cmd_tune_kernels)

    run = commands.add_parser("run", help="run a model and time it",
                              description="Run an ONNX model (random inputs of the declared shapes "
                                          "unless given) and print its outputs and timings.")
    run.add_argument("model", help="path of the .onnx file")
    run.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                     help="an input from a .npy file (repeatable)")
    run.add_argument("--threads", type=_positive_int, metavar="N",
                     help="thread count (default: the CPUs this process may use)")
    run.add_argument("--repeat", type=_positive_int, default=10, metavar="N",
                     help="number of runs to time (default 10)")
    run.add_argument("--output", metavar="FILE.npz", help="save the outputs")
    run.add_argument("--hold-memory", action="store_true",
                     help="keep the memory a run frees for the next run (glibc, process-wide: "
                          "onnx_light.hold_freed_memory)")
    run.add_argument("--profile", action="store_true",
                     help="time every node: a table per operator type, a Chrome-trace JSON "
                          "file (onnxruntime's format) and, with matplotlib, a PNG plot")
    run.set_defaults(handler=_cmd_run)

    cpu = commands.add_parser("cpu", help="print this machine's execution descriptor")
    cpu.add_argument("--threads", type=_positive_int, metavar="N",
                     help="thread count (default: the CPUs this process may use)")
    cpu.add_argument("--json", action="store_true", help="print JSON")
    cpu.set_defaults(handler=_cmd_cpu)

    bench = commands.add_parser(
        "bench", help="run the benchmark suite (a source checkout's benchmarks/run.py)",
        description="Run the benchmark suite of a source checkout (benchmarks/run.py) in a fresh "
                    "interpreter: elementwise, memory bandwidth, Gemm/MatMul, session overhead, "
                    "calibration and start-up, side by side with onnxruntime and numpy; prints "
                    "markdown tables.")
    bench.add_argument("--quick", action="store_true",
                       help="smaller sizes and a calibration of a few kernels (a few minutes)")
    bench.add_argument("--threads", type=_positive_int, metavar="N",
                       help="thread count (default: the CPUs this process may use)")
    bench.add_argument("--output", metavar="FILE.md", help="also write the markdown to this file")
    bench.add_argument("--sections", metavar="LIST", help="comma-separated section numbers, e.g. 1,3")
    bench.add_argument("--max-load", type=float, metavar="LOAD",
                       help="wait until the 1-minute load average is below this (default 0.7)")
    bench.add_argument("--max-wait-minutes", type=float, metavar="MIN",
                       help="give up waiting after this long and measure anyway (default 20; 0: no wait)")
    bench.set_defaults(handler=_cmd_bench)
    return parser


def _element_types(values: list[str] | None) -> list[int | str] | None:
    if values is None:
        return None
    return [int(v) if v.isdigit() else v for v in values]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.prog = parser.prog
    if getattr(args, "element_type", None) is not None:
        args.element_type = _element_types(args.element_type)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        _warn_about_threads(args)
        return handler(args)
    except BrokenPipeError:  # the reader left (``| head``): stop quietly
        _silence_stdout()
        return 1
    except (KeyError, ValueError, TypeError, OSError, RuntimeError, MemoryError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        one_line = ("; ".join(part.strip() for part in str(message).splitlines() if part.strip())
                    or f"{type(exc).__name__} (no message)")
        print(f"{parser.prog} {args.command}: error: {one_line}", file=sys.stderr)
        return 2


def _silence_stdout() -> None:
    """Point standard output at the null device, so that flushing it at exit does not fail
    on the closed pipe again."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, descriptor)
    os.close(null)
