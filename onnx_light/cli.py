"""Command line: ``python -m onnx_light {tune-kernels,run,cpu,bench}``.

``main(argv)`` returns the exit status, so tests call it directly. The ``tune-kernels``
subcommand lives in :mod:`onnx_light.cli_tune`, what the subcommands share in
:mod:`onnx_light.cli_common`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from . import __version__, tuning
from .cli_common import _print_json, _warn_about_threads
from .cli_tune import _cmd_tune_kernels
from .kernels.base import numpy_dtype
from .profiling import Profiler, profile_file_name
from .runtime import RuntimeSession
from .runtime.memory import hold_freed_memory
from .terminal import fit_table, terminal_width

__all__ = ["main"]


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


def _random_input(arg: Any, rng: np.random.Generator) -> np.ndarray:
    """Random data of an input's declared type, symbolic dimensions taken as 1."""
    if not arg.type.startswith("tensor("):
        raise ValueError(f"input {arg.name!r} has type {arg.type}: random inputs are made for "
                         "tensors only")
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


def _described(value: Any) -> str:
    """An output as ``run`` prints it: a tensor's shape, type and summary; a sequence's
    length and its tensors' shapes; an empty optional."""
    if value is None:
        return "empty optional"
    if isinstance(value, list):
        return f"sequence of {len(value)} tensor(s), shapes {[list(v.shape) for v in value]}"
    return f"shape {list(value.shape)} dtype {value.dtype} {_summary(value)}".rstrip()


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
    for name, value in zip(names, outputs, strict=True):
        print(f"{name}: {_described(value)}")
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
    tune.add_argument("--export-profile", metavar="FILE.json",
                      help="with --apply: also write this machine's values of the selected "
                           "kernels as a shippable processor profile file (docs/kernel-tuning.md)")
    tune.add_argument("--selector", choices=("exact", "microarchitecture", "isa"),
                      help="with --export-profile: the processors the profile covers: this "
                           "vendor/family/model, this microarchitecture and its descendants "
                           "(default), or this instruction set")
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
