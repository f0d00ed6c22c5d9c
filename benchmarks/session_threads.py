"""Where a second thread's time goes in a session: one model, onnx_light sessions that differ in
one threading decision, timed side by side at quiet instants.

Each variant is ``THREADS[,SETTING...]`` with settings

* ``branches=off`` (no branch groups), ``branches=all`` (every balanced group, whatever it
  saves: ``BRANCH_MINIMUM_WORK`` 0, the rule before the minimum existed);
* ``gemm=MODE@EXPONENT``: every Gemm and MatMul step configured with ``parallel.mode`` MODE
  from 2^EXPONENT multiply-adds;
* ``elementwise=serial``: every step tuned by ``parallel.minimum_elements`` alone (the
  elementwise kernels and fused chains) kept serial;
* ``spin=US``: the session's ``spin_us`` (``ThreadPool.hot``: how long the pool's threads spin
  waiting for each other during a run before they sleep; 0: never);
* ``awake=US``: the session's ``awake_us`` (``ThreadPool.hot``: idle-priority threads spinning
  during a run and ``US`` microseconds after it, so that no processor halts; 0: none);
* ``team=US``: the session's ``team_us`` (``ThreadPool.hot``: how long the native team's
  threads spin in compiled code without a region during a run; 0: no team, the packed
  products open numba regions as outside a run);
* ``siblings=off``: sibling products of one input left apart (``runtime/sibling_fusion.py``
  not run: the plan before it);
* ``attention=EXPONENT``: every fused attention step (``FusedAttention``) from 2^EXPONENT
  multiply-adds as compiled tasks (over numba's threads in one region at 2 threads), below
  with BLAS's products (the Softmax key's ``attention.minimum_flops``, set while the session
  is built, so that its prepared steps take it);
* ``gated=off``: LLaMA's gate and up products, SiLU and Mul left as the steps before the
  GatedMatMul fusion (``sibling_fusion._fuse_gated`` not run);
* ``epilogues=off``: the products' GELU and residual LayerNormalization epilogues left as
  the steps before them (``matmul_fusion._fuse_gelu`` and ``_fuse_norms`` not run);
* ``packed=pool``: products of packed weights split as before 2026-12-06 09:30 UTC, A's rows
  in chunks of whole micro-kernel blocks on the pool (``ThreadPool.parallel_chunks``), instead
  of their panels in one numba region (:func:`pool_rows`).

The variant ``1`` (one thread, as tuned) is always measured first and is the reference. A
timed run counts only if no other task was runnable just before and just after it (the running
count of ``/proc/loadavg``, less this process's own thread), so the figures are those of the
moments the machine was quiet; a run that sees another task is taken again (counted in the
header; a variant left without a run by ``--max-seconds`` shows 0 runs). Without
``/proc/loadavg``, or with ``--every-run`` (a machine that is never quiet), every run
counts; ``--clock thread`` (one-thread variants only) counts every run too and times the
calling thread's CPU time, which other programs disturb far less than wall time. Each
timed run follows 20 ms of untimed runs of the same session; the variants take turns.
Outputs are checked against the one-thread session's.

The models are the model zoo's cached exports (``benchmarks/model_zoo.py``, run it first with
the same packages: the cache key holds their versions). Results: docs/parallel.md ("Two
threads in a session").

Run: ``python benchmarks/session_threads.py --model bert --variants 2 2,branches=all
2,elementwise=serial [--samples 25] [--max-seconds 900]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import model_zoo  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from hot_regions import others_runnable, rows_on_pool  # noqa: E402

from onnx_light.kernels import gemm, packed_gemm  # noqa: E402
from onnx_light.kernels.elementwise import MINIMUM_ELEMENTS  # noqa: E402
from onnx_light.kernels.reductions import ATTENTION_MINIMUM_FLOPS, Softmax  # noqa: E402
from onnx_light.runtime import RuntimeSession, branches, fusion, matmul_fusion, sibling_fusion  # noqa: E402

WARM_S = 0.02


def build(model: onnx.ModelProto, variant: str) -> RuntimeSession:
    """The session ``variant`` names (see the module's docstring)."""
    threads, *settings = variant.split(",")
    options = dict(setting.split("=", 1) for setting in settings)
    unknown = set(options) - {"branches", "gemm", "elementwise", "spin", "awake", "siblings", "packed",
                              "attention", "gated", "team",
                              "epilogues"}
    if unknown:
        raise SystemExit(f"variant {variant!r}: unknown setting(s) {sorted(unknown)}")
    saved = branches.BRANCH_MINIMUM_WORK
    if options.get("branches") == "all":
        branches.BRANCH_MINIMUM_WORK = 0
    apart = (mock.patch.object(fusion, "fuse_siblings", lambda steps, *rest: list(steps))
             if options.get("siblings") == "off" else contextlib.nullcontext())
    attention = (mock.patch.object(Softmax, "_configure", attention_from(1 << int(options["attention"])))
                 if "attention" in options else contextlib.nullcontext())
    gated = (mock.patch.object(sibling_fusion, "_fuse_gated", lambda steps, *rest: list(steps))
             if options.get("gated") == "off" else contextlib.nullcontext())
    epilogues = _without_epilogues() if options.get("epilogues") == "off" else contextlib.ExitStack()
    try:
        with apart, attention, gated, epilogues:
            session = RuntimeSession(model, num_threads=int(threads),
                                     branches=options.get("branches", "on") != "off")
    finally:
        branches.BRANCH_MINIMUM_WORK = saved
    if "spin" in options:
        session.spin_us = float(options["spin"])
    if "awake" in options:
        session.awake_us = float(options["awake"])
    if "team" in options:
        session.team_us = float(options["team"])
    products = None
    if "gemm" in options:
        mode, exponent = options["gemm"].split("@")
        products = {gemm.MINIMUM_FLOPS: 1 << int(exponent), gemm.MODE: mode, gemm.MINIMUM_ROWS: 16}
    serial = options.get("elementwise") == "serial"
    for kernel, _, _ in session._steps:
        schema = kernel.tuning_schema()
        names = [] if schema is None else [p.name for p in schema.parameters]
        if products is not None and gemm.MODE in names:
            kernel._configure(products)
        elif serial and names == [MINIMUM_ELEMENTS]:
            kernel._configure({MINIMUM_ELEMENTS: 1 << 62})
        if options.get("packed") == "pool" and getattr(kernel, "_packed", None) is not None:
            kernel._packed_product = functools.partial(pool_rows, kernel)
    return session


def _without_epilogues() -> contextlib.ExitStack:
    """A scope in which the runtime makes no GELU or LayerNormalization product epilogues."""
    stack = contextlib.ExitStack()
    for name in ("_fuse_gelu", "_fuse_norms"):
        stack.enter_context(mock.patch.object(matmul_fusion, name, lambda steps, *rest: list(steps)))
    return stack


def attention_from(minimum_flops: int) -> Any:
    """Softmax's ``_configure`` with ``attention.minimum_flops`` replaced by ``minimum_flops``."""
    original = Softmax._configure

    def configure(self: Softmax, values: Any) -> None:
        original(self, {**values, ATTENTION_MINIMUM_FLOPS: minimum_flops})

    return configure


def pool_rows(kernel: gemm._ProductKernel, packed: packed_gemm.PackedWeights, a: np.ndarray,
              out: np.ndarray | None = None) -> np.ndarray:
    """``a @ W (+ bias)`` of ``kernel``'s packed weights with A's rows split on the kernel's
    pool (``hot_regions.rows_on_pool``) from ``parallel.minimum_flops`` multiply-adds, at
    least ``split.minimum_rows`` rows a chunk: the packed products' two-thread plan before
    the panels went to a numba region (the same values)."""
    count = math.prod(a.shape[:-1])
    rows = np.ascontiguousarray(a).reshape(count, packed.k)
    if out is None:
        out = np.empty((*a.shape[:-1], packed.n), np.float32)
    chunks = 1
    if kernel.num_threads > 1 and count * packed.n * packed.k >= kernel.minimum_flops:
        chunks = min(kernel.num_threads, count // kernel.minimum_rows)
    if chunks < 2:
        return packed.multiply(a, out)
    rows_on_pool(packed, rows, out.reshape(count, packed.n), kernel.pool, chunks)
    return out


def measure(sessions: dict[str, RuntimeSession], feeds: dict[str, np.ndarray], samples: int,
            deadline: float, gate: bool = True, clock: Callable[[], float] = time.perf_counter
            ) -> tuple[dict[str, list[float]], int]:
    """Seconds per counted run of each session, and the runs taken again (``gate``: only runs
    at quiet instants count)."""
    times: dict[str, list[float]] = {key: [] for key in sessions}
    retakes = 0
    turn = 0
    keys = list(sessions)
    while min(map(len, times.values())) < samples and time.monotonic() < deadline:
        key = keys[turn % len(keys)]
        session = sessions[key]
        while gate and others_runnable() > 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        end = time.perf_counter() + WARM_S
        while time.perf_counter() < end:
            session.run(None, feeds)
        if gate and others_runnable() > 0:
            retakes += 1
            continue
        started = clock()
        session.run(None, feeds)
        elapsed = clock() - started
        if gate and others_runnable() > 0:
            retakes += 1
            continue
        times[key].append(elapsed)
        turn += 1
    return times, retakes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert", choices=sorted(model_zoo.MODELS))
    parser.add_argument("--variants", nargs="+", default=["2", "2,branches=all", "2,elementwise=serial"])
    parser.add_argument("--samples", type=int, default=25)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    parser.add_argument("--every-run", action="store_true", help="count runs whatever the load")
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall",
                        help="thread: the calling thread's CPU time, every run counted (1 thread only)")
    parser.add_argument("--cache-dir", type=Path, default=model_zoo.default_cache_dir())
    args = parser.parse_args(argv)
    spec = model_zoo.MODELS[args.model]
    feeds = model_zoo.model_feeds(spec)
    path, _ = model_zoo.model_file(spec, feeds, args.cache_dir, model_zoo.package_versions(),
                                   model_zoo.torch_export)
    model = onnx.load(str(path))
    keys = ["1", *args.variants]
    if args.clock == "thread" and any(key.split(",")[0] != "1" for key in keys):
        parser.error("--clock thread times one-thread variants only")
    sessions = {key: build(model, key) for key in keys}
    reference = sessions["1"].run(None, feeds)
    for session in sessions.values():
        for got, expected in zip(session.run(None, feeds), reference, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * float(np.abs(expected).max()))
    before = os.getloadavg()[0]
    times, retakes = measure(sessions, feeds, args.samples, time.monotonic() + args.max_seconds,
                             gate=not (args.every_run or args.clock == "thread"),
                             clock=time.thread_time if args.clock == "thread" else time.perf_counter)
    if not times["1"]:
        print(f"{args.model}: no quiet run within {args.max_seconds:.0f} s (load average "
              f"{os.getloadavg()[0]:.2f})")
        return 1
    one = statistics.median(times["1"])
    print(f"{args.model}: {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, load average "
          f"{before:.2f} before, {os.getloadavg()[0]:.2f} after, {retakes} retakes")
    print()
    print("| variant | median (ms) | 20th percentile (ms) | t / t(1 thread) | runs |")
    print("|---|---:|---:|---:|---:|")
    for key in keys:
        if not times[key]:
            print(f"| {key} | - | - | - | 0 |")
            continue
        median = statistics.median(times[key])
        p20 = float(np.percentile(times[key], 20))
        print(f"| {key} | {median * 1e3:.2f} | {p20 * 1e3:.2f} | {median / one:.2f} | {len(times[key])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
