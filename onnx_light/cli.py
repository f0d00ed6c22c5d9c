"""Command line: ``python -m onnx_light {tune-kernels,cpu}``.

``main(argv)`` returns the exit status, so tests call it directly.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import tuning

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
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def _size(value: int | None) -> str:
    if value is None:
        return "unknown"
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale} {unit}"
    return f"{value} B"


def _tuning_report(args: argparse.Namespace) -> dict[str, Any]:
    """The read-only report: active values per key and the cache's coverage."""
    if args.cache is not None:
        # Report on that file: publish its profiles in this process only.
        tuning.default_registry().forget()
        tuning.load_kernel_tuning_cache(args.cache, num_threads=args.threads)
    records = tuning.kernel_tuning_parameters(
        args.kernel, args.element_type, path=args.cache, num_threads=args.threads)
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


def _cmd_tune_kernels(args: argparse.Namespace) -> int:
    report = _tuning_report(args)
    if args.json:
        _print_json(report)
        return 0
    descriptor = tuning.CpuExecutionDescriptor.from_dict(report["descriptor"])
    print(f"processor: {descriptor.short()}")
    print(f"cache: {report['cache']}")
    width = max((len(r["key"]) for r in report["keys"]), default=0)
    for record in report["keys"]:
        state = "covered" if record["cached_values"] is not None else (
            "missing" if record["calibratable"] else "missing, schema-only")
        print(f"{record['key']:<{width}}  {record['active_source']:<25} "
              f"{_format_values(record['active_values'])}  [{state}]")
    summary = report["summary"]
    print(f"selected {summary['selected']}, covered {summary['covered']}, "
          f"missing {summary['missing']} ({summary['missing_calibratable']} calibratable, "
          f"{summary['missing_schema_only']} schema-only)")
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="python -m onnx_light",
        description="A lightweight ONNX runtime for CPUs with processor-aware kernel tuning.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    tune = commands.add_parser(
        "tune-kernels", help="report kernel tuning coverage for this machine (read-only)",
        description="Report, for this processor and thread count, each tunable kernel's active "
                    "values and whether the cache covers it. Writes nothing.")
    tune.add_argument("--kernel", action="append", metavar="NAME",
                      help="select a kernel (repeatable), e.g. Add")
    tune.add_argument("--element-type", action="append", metavar="TYPE",
                      help="select an element type (repeatable): float, FLOAT, float32 or 1")
    tune.add_argument("--cache", metavar="PATH", help="cache file (default: the user cache)")
    tune.add_argument("--threads", type=_positive_int, metavar="N",
                      help="thread count (default: the CPUs this process may use)")
    tune.add_argument("--json", action="store_true", help="print JSON")
    tune.set_defaults(handler=_cmd_tune_kernels)

    cpu = commands.add_parser("cpu", help="print this machine's execution descriptor")
    cpu.add_argument("--threads", type=_positive_int, metavar="N",
                     help="thread count (default: the CPUs this process may use)")
    cpu.add_argument("--json", action="store_true", help="print JSON")
    cpu.set_defaults(handler=_cmd_cpu)
    return parser


def _element_types(values: list[str] | None) -> list[int | str] | None:
    if values is None:
        return None
    return [int(v) if v.isdigit() else v for v in values]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "element_type", None) is not None:
        args.element_type = _element_types(args.element_type)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (KeyError, ValueError, TypeError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"onnx_light {args.command}: error: {message}", file=sys.stderr)
        return 2
