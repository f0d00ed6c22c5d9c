"""The compiled-kernel layer: numba on first use, nogil, a disk cache in its own folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from onnx_light.kernels import compiled as compiled_module
from onnx_light.kernels.compiled import CompiledFunction, compiled, kernel_sources_digest, numba_cache_dir


@compiled
def _add_one(x):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = x[i] + 1.0
    return out


@compiled(fastmath=True)
def _add_two(x):
    return _add_one(_add_one(x))


def test_a_marked_function_compiles_on_first_call_and_matches_python() -> None:
    assert isinstance(_add_one, CompiledFunction)
    x = np.arange(5, dtype=np.float64)
    np.testing.assert_array_equal(_add_one(x), x + 1)
    assert _add_one.dispatcher.signatures, "numba compiled no signature"
    assert _add_one.options["nogil"] and _add_one.options["cache"]


def test_a_compiled_kernel_calls_another_compiled_kernel() -> None:
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(_add_two(x), x + 2)
    assert _add_two.options["fastmath"] is True


def test_the_cache_folder_is_named_after_the_numba_version_and_the_sources(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled_module.CACHE_ENV, raising=False)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    sources = f"sources-{kernel_sources_digest()}"
    assert numba_cache_dir("0.99.0").parent.name == "numba-0.99.0"
    assert numba_cache_dir("0.99.0").name == sources
    monkeypatch.setenv(compiled_module.CACHE_ENV, "/some/where")
    assert numba_cache_dir("0.99.0") == Path("/some/where") / sources


def test_a_change_to_any_kernel_source_changes_the_cache_folder(tmp_path: Path) -> None:
    """numba checks only the compiled function's own file; an intrinsic inlined from another
    module must still move the cache."""
    (tmp_path / "kernel.py").write_text("def f(): pass\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "intrinsic.py").write_text("LANES = 8\n")
    first = kernel_sources_digest(tmp_path)
    assert kernel_sources_digest(tmp_path) == first
    (tmp_path / "sub" / "intrinsic.py").write_text("LANES = 16\n")
    changed = kernel_sources_digest(tmp_path)
    assert changed != first
    (tmp_path / "sub" / "intrinsic.py").rename(tmp_path / "sub" / "other.py")
    assert kernel_sources_digest(tmp_path) not in (first, changed)


@compiled
def _busy(n):
    total = 0.0
    for i in range(n):
        total += np.sqrt(i + total * 1e-12)
    return total


def test_kernels_run_without_the_gil() -> None:
    """A Python thread keeps its pace while a compiled kernel runs on another thread.

    Holding the GIL would let the counting thread run only between switch intervals: a few
    percent of the pace it keeps while the main thread sleeps.
    """
    _busy(10)  # compile first
    stop = threading.Event()
    counter = [0]

    def count() -> None:
        while not stop.is_set():
            counter[0] += 1

    def pace(work: Callable[[], object]) -> float:
        before, start = counter[0], time.perf_counter()
        work()
        return (counter[0] - before) / (time.perf_counter() - start)

    ticker = threading.Thread(target=count)
    ticker.start()
    try:
        asleep = max(pace(lambda: time.sleep(0.1)) for _ in range(3))
        computing = max(pace(lambda: _busy(30_000_000)) for _ in range(3))
    finally:
        stop.set()
        ticker.join()
    assert computing > 0.25 * asleep, (computing, asleep)


def test_a_second_process_loads_the_compiled_code_from_the_disk_cache(tmp_path: Path) -> None:
    module = tmp_path / "cached_kernel.py"
    module.write_text(textwrap.dedent("""
        from onnx_light.kernels.compiled import compiled

        @compiled
        def triple(x):
            return 3 * x
    """))
    probe = textwrap.dedent("""
        import cached_kernel
        print(cached_kernel.triple(2.5))
        print(len(cached_kernel.triple.dispatcher.stats.cache_hits))
    """)
    env = {**os.environ, compiled_module.CACHE_ENV: str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    runs = [subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                           check=True, timeout=300).stdout.split() for _ in range(2)]
    assert runs[0][0] == runs[1][0] == "7.5"
    assert runs[0][1] == "0" and runs[1][1] == "1", runs
    assert any((tmp_path / "cache").rglob("*.nbi")), "no numba index in the cache folder"


def test_the_calibration_clock_stands_still_while_another_thread_compiles():
    """A parallel calibration candidate compiles on the pool's threads: that time is setup, not
    measurement (a cold-cache CI run once charged 1.4 s of it to a 0.5 s Gemm budget)."""
    compiled_module.load_numba()

    @compiled(cache=False)
    def fresh(x):
        return x * 2.0 + 1.0

    wall, clock = time.perf_counter(), compiled_module.clock_without_compilation()
    compiling = compiled_module.process_compile_seconds()
    here = compiled_module.compile_totals()
    worker = threading.Thread(target=fresh, args=(np.ones(3),))
    worker.start()
    worker.join()
    wall = time.perf_counter() - wall
    clock = compiled_module.clock_without_compilation() - clock
    compiling = compiled_module.process_compile_seconds() - compiling
    assert compiling > 0.5 * wall
    assert clock < 0.5 * wall
    assert compiled_module.compile_totals() == here  # the per-thread report counts this thread only


def test_use_threads_sets_the_calling_threads_numba_count_only() -> None:
    """numba's count is per thread: use_threads changes the caller's, not another thread's."""
    numba = compiled_module.load_numba()
    most = compiled_module.max_threads()
    assert most == numba.config.NUMBA_NUM_THREADS
    compiled_module.use_threads(1)
    assert numba.get_num_threads() == 1
    seen: list[int] = []

    def other() -> None:
        compiled_module.use_threads(most)
        seen.append(numba.get_num_threads())

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [most]
    assert numba.get_num_threads() == 1
    compiled_module.use_threads(most)
    assert numba.get_num_threads() == most
