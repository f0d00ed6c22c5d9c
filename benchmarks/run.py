"""The benchmark suite: every measurement of onnx_light against its peers and the machine, in one run.

Usage::

    python benchmarks/run.py [--quick] [--threads N] [--output FILE.md] [--sections 1,3]
                             [--max-load 0.7] [--max-wait-minutes 20]

(also ``python -m onnx_light bench ...`` from a source checkout). In one process it runs:

1. the elementwise sweep (forced serial, forced parallel, portable, calibrated, onnxruntime,
   numpy) with each strategy's regret against the faster of serial and parallel;
2. the machine's memory bandwidth and the fraction of it large elementwise ops reach;
3. Gemm and MatMul on the calibration corpus and large squares, in GFLOP/s;
4. session overhead on a chain of 100 small nodes (onnx_light, onnxruntime, ReferenceEvaluator);
5. the wall time of a full calibration on an empty cache, and the stability of its choices;
6. start-up: import time, cache load time, session construction of the light real models.

It prints markdown (stdout; progress goes to stderr) headed by the date and the execution
descriptor. Every figure is a median of repeated samples; every comparison is a ratio of
functions sampled in turn in the same rounds. Before measuring, it waits (up to
``--max-wait-minutes``) for the 1-minute load average to fall below ``--max-load``, and every
section reports the load at its start and end and the cores other processes used meanwhile.

The default kernel tuning cache is pointed at a scratch file before onnx_light is imported, so
the user's cache neither changes the results nor is written; calibrations go to scratch files.
``--quick`` (sizes up to 2^20, no 1024/2048 squares, a calibration of four kernels) takes a few
minutes; the full run about a quarter of an hour on a 2-core machine.
"""

from __future__ import annotations

import os
import sys
import tempfile


def _isolate_default_cache() -> str:
    """Point the default cache at a scratch folder; must run before onnx_light is imported."""
    scratch = tempfile.mkdtemp(prefix="onnx_light-bench-")
    os.environ["ONNX_LIGHT_KERNEL_TUNING_CACHE"] = os.path.join(scratch, "default-cache.txt")
    return scratch


if __name__ == "__main__":
    _SCRATCH: str | None = _isolate_default_cache()
else:
    _SCRATCH = None

import argparse  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

from _common import Config, Context, SectionResult, header, load_average, log  # noqa: E402
from suite_calibration import calibration_section  # noqa: E402
from suite_elementwise import elementwise_sweep, memory_bound  # noqa: E402
from suite_gemm import gemm_sweep_section  # noqa: E402
from suite_session import session_overhead  # noqa: E402
from suite_startup import startup  # noqa: E402

SECTIONS: dict[int, Callable[[Context], SectionResult]] = {
    1: elementwise_sweep,
    2: memory_bound,
    3: gemm_sweep_section,
    4: session_overhead,
    5: calibration_section,
    6: startup,
}


def wait_for_quiet(max_load: float, max_wait_s: float, poll_s: float = 10.0) -> str:
    """Poll the 1-minute load average until it is below ``max_load``; a sentence saying how it went."""
    first = load_average()
    if first is None:
        return "load average not available on this system; measured without waiting"
    started = time.perf_counter()
    load = first
    while load >= max_load and time.perf_counter() - started < max_wait_s:
        log(f"waiting for the 1-minute load average ({load:.2f}) to fall below {max_load}")
        time.sleep(poll_s)
        load = load_average() or 0.0
    waited = time.perf_counter() - started
    if load >= max_load:
        return (f"the 1-minute load average was {first:.2f}; after waiting {waited / 60:.0f} min it was "
                f"still {load:.2f} (>= {max_load}): measured anyway, read the figures as noisy")
    return (f"the 1-minute load average was {first:.2f}; waited {waited:.0f} s for it to fall below "
            f"{max_load} ({load:.2f} when measuring started)")


def _sections(text: str) -> list[int]:
    try:
        numbers = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,3,5, got {text!r}") from None
    unknown = [n for n in numbers if n not in SECTIONS]
    if unknown or not numbers:
        raise argparse.ArgumentTypeError(f"sections are 1 to {len(SECTIONS)}, got {text!r}")
    return numbers


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="sizes up to 2^20, no 1024/2048 squares, calibrate 4 kernels (a few minutes)")
    parser.add_argument("--threads", type=_positive, default=None,
                        help="threads of onnx_light and onnxruntime (default: the CPUs this process may use)")
    parser.add_argument("--output", metavar="FILE.md", help="also write the markdown to this file")
    parser.add_argument("--sections", type=_sections, default=list(SECTIONS),
                        help="comma-separated section numbers (default: all)")
    parser.add_argument("--max-load", type=float, default=0.7,
                        help="wait until the 1-minute load average is below this (default 0.7)")
    parser.add_argument("--max-wait-minutes", type=float, default=20.0,
                        help="give up waiting after this long and measure anyway (default 20; 0: no wait)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from onnx_light.tuning import effective_thread_count

    threads = effective_thread_count(args.threads)
    config = Config.quick_run(threads) if args.quick else Config.full(threads)
    waited = wait_for_quiet(args.max_load, args.max_wait_minutes * 60)
    started = time.perf_counter()
    ctx = Context(config)
    parts = ["# onnx_light benchmark suite", "",
             f"command: `python benchmarks/run.py {' '.join(argv if argv is not None else sys.argv[1:])}`  ",
             header(config), "", f"Before measuring: {waited}.", ""]
    print("\n".join(parts), flush=True)
    try:
        for number in args.sections:
            text = SECTIONS[number](ctx).markdown()
            parts.append(text)
            print(text, flush=True)
    finally:
        ctx.close()
    end = load_average()
    footer = (f"Total {time.perf_counter() - started:.0f} s; 1-minute load average at the end "
              f"{'?' if end is None else f'{end:.2f}'}.")
    parts.append(footer)
    print(footer, flush=True)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            file.write("\n".join(parts) + "\n")
        log(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        if _SCRATCH is not None:
            shutil.rmtree(_SCRATCH, ignore_errors=True)
