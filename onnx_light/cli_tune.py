"""``onnx_light tune-kernels``: the tuning report, ``--apply`` (calibrate and save the
missing keys, on this machine or a Ray cluster) and ``--reset``."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import tuning
from .cli_common import _format_values, _print_json, _warn
from .terminal import fit_table, terminal_width, wrap_words
from .tuning import calibration
from .tuning.api import select_keys
from .tuning.cache import REWRITTEN_STATUSES, CacheStatus, LineOutcome

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
    made (calibrated for this processor and thread count, set by hand), a processor profile
    whose file it is (shipped with onnx_light, or the organisation's)."""
    provenance = record.get("active_provenance") or {}
    if record["active_source"] == "published_profile":
        return ORIGIN_LABELS.get(provenance.get("origin"), "published")
    label = SOURCE_LABELS.get(record["active_source"], record["active_source"])
    if "file" in provenance:
        if provenance.get("source") == "organisation":
            label = label.replace("shipped:", "organisation:")
        label += f" ({Path(provenance['file']).name})"
    return label


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
    stale = tuning.propose_kernel_tuning_updates(args.kernel, args.element_type, path=args.cache,
                                                 num_threads=args.threads)["stale"]
    return {
        "descriptor": tuning.execution_descriptor(args.threads).to_dict(),
        "cache": str(args.cache or tuning.default_kernel_tuning_cache_path()),
        "keys": records,
        "stale": stale,
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
    if report["stale"]:
        lines.append(_stale_line(report["stale"]) + " The next step recalibrates them.")
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
    stale = {entry["key"] for entry in report["stale"]}
    for record in report["keys"]:
        state = "covered" if record["cached_values"] is not None else (
            "stale" if record["key"] in stale else
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


def _stale_line(stale: Sequence[dict[str, Any]]) -> str:
    """This machine's stale entries in one sentence, with the first one's reason."""
    first = stale[0]
    return (f"{len(stale)} cache entry(ies) of this machine are stale and not applied (line "
            f"{first['line']}, {first['key']}: {first['reason']}"
            + (f"; and {len(stale) - 1} more" if len(stale) > 1 else "") + ").")


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
    if proposal["stale"] and not args.json:
        print(_stale_line(proposal["stale"]) + " Recalibrating them.", file=sys.stderr)
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
    if args.export_profile:
        _export_profile(args, outcome)
    if args.plot and outcome["applied"]:
        from .plotting import plot_calibration  # matplotlib only when asked for

        plot_calibration(outcome["applied"], args.plot)
        print(f"figure written: {args.plot}", file=sys.stderr if args.json else sys.stdout)
    return 1 if outcome["failed"] or outcome["skipped"] else 0


def _export_profile(args: argparse.Namespace, outcome: dict[str, Any]) -> None:
    """Write this machine's values of the selected keys as a shippable profile file, its
    provenance saying where, how and under which load they were measured."""
    descriptor = tuning.CpuExecutionDescriptor.from_dict(outcome["descriptor"])
    load = calibration.load_average()
    notes = (f"measured on {descriptor.cpu.short()} at {descriptor.num_threads} thread(s)"
             + (f"; {_busy(load)} at export: other programs shared the processor, so the "
                "timings are noisy" if _busy(load) else ""))
    selector = args.selector or "microarchitecture"
    result = tuning.export_kernel_tuning_profile(
        args.export_profile, selector, args.kernel, args.element_type, path=args.cache,
        num_threads=args.threads, notes=notes,
        command=_command(args, "--apply", "--export-profile", args.export_profile,
                         "--selector", selector))
    print(f"profile written: {result['path']} ({result['written']} profile(s) for "
          f"{result['selector']} at {descriptor.num_threads} thread(s), {result['kept']} kept)",
          file=sys.stderr if args.json else sys.stdout)


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
    for option, given in (("--plot", args.plot), ("--force", args.force),
                          ("--export-profile", args.export_profile)):
        if given and not args.apply:
            raise ValueError(f"{option} acts on a calibration: it needs --apply")
    if args.selector and not args.export_profile:
        raise ValueError("--selector chooses the processors of an exported profile: it needs "
                         "--export-profile")
    if args.export_profile and args.ray is not None:
        raise ValueError("--export-profile writes this machine's profile: it does not apply to "
                         "--ray (load the merged cache on each node type and export there)")
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
