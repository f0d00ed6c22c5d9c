"""Section 6 of the suite: start-up costs.

* ``import onnx_light`` in fresh subprocesses (the time of the import statement itself, and the
  process's whole wall time), with no cache file and with caches of each size, next to
  ``import onnxruntime``, ``import onnx``, ``import ml_dtypes`` and ``import numpy``; interleaved,
  medians, with bytecode caches as after a normal install (``PYTHONDONTWRITEBYTECODE`` is removed
  from the subprocesses' environment and one untimed import of each writes the caches). The
  aim is ``import onnx_light`` at or under 200 ms without a cache file.
* Loading caches of 10, 1,000 and 10,000 entries (written with ``update_cache``): entries of this
  processor for several thread counts and of synthetic other processors, timed as
  ``cache.load_into`` into a fresh registry (what ``load_kernel_tuning_cache`` does).
* Session construction of ONNX's nine light real models in onnx_light and onnxruntime.
"""

from __future__ import annotations

import cProfile
import dataclasses
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

import onnx
from _common import CACHE_ENV, Context, SectionResult, Table, log, real_models, section

from onnx_light import kernels
from onnx_light.runtime import RuntimeSession, UnsupportedOperatorError
from onnx_light.tuning import cache as cache_file
from onnx_light.tuning.processor import CpuExecutionDescriptor
from onnx_light.tuning.registry import KernelTuningRegistry, default_registry

PROFILED_PACKAGES = ("numpy", "onnx", "onnx_light", "google", "archspec", "filelock", "platformdirs",
                     "threadpoolctl", "ml_dtypes")
IMPORT_CODE = "import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
IMPORT_AIM_S = 0.200


def _import_env(cache: Path) -> dict[str, str]:
    """The environment of an import subprocess: ``cache`` as the default cache, bytecode caches on."""
    env = {**os.environ, CACHE_ENV: str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def synthetic_entries(count: int, local: CpuExecutionDescriptor) -> list[cache_file.CacheEntry]:
    """``count`` distinct valid entries: the registered keys with their defaults, for this processor
    (at this machine's thread count, then others) and for synthetic other processors."""
    snapshot = default_registry().snapshot()
    keys = sorted(snapshot.keys(), key=str)
    origin = cache_file.provenance("benchmark")
    entries = []
    for index in range(count):
        key = keys[index % len(keys)]
        block = index // len(keys)
        if block % 4 == 0:  # this processor, thread counts threads, threads + 1, ...
            descriptor = CpuExecutionDescriptor(local.cpu, local.num_threads + block // 4)
        else:  # another model of the same family: never loaded here
            cpu = dataclasses.replace(local.cpu, model=(local.cpu.model or 0) + 1000 + block)
            descriptor = CpuExecutionDescriptor(cpu, local.num_threads)
        entries.append(cache_file.CacheEntry(key, descriptor, dict(snapshot.schema(key).defaults), origin))
    return entries


def _import_time(module: str, cache: Path) -> tuple[float, float]:
    """(seconds of the import statement, seconds of the whole process) in a fresh interpreter."""
    env = _import_env(cache)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", IMPORT_CODE.format(module=module)], env=env,
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    return float(done.stdout.strip().splitlines()[-1]), wall


def import_profile(cache: Path, repeats: int) -> Table:
    """``python -X importtime -c "import onnx_light"``: self time by package (median over
    ``repeats`` fresh interpreters), and onnx_light's slowest modules."""
    env = _import_env(cache)
    per_module: dict[str, list[float]] = {}
    totals: list[float] = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import onnx_light"], env=env,
                              capture_output=True, text=True, check=True)
        total = 0.0
        for line in done.stderr.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            self_us, _, name = line[len("import time:"):].split("|")
            per_module.setdefault(name.strip(), []).append(float(self_us))
            total += float(self_us)
        totals.append(total)
    medians = {name: statistics.median(values) for name, values in per_module.items()}
    total = statistics.median(totals)
    packages: dict[str, float] = {}
    for name, us in medians.items():
        top = name.split(".")[0]
        packages[top if top in PROFILED_PACKAGES else "(standard library and others)"] = \
            packages.get(top if top in PROFILED_PACKAGES else "(standard library and others)", 0.0) + us
    table = Table(f"Where `import onnx_light` goes (`python -X importtime`, self time, median of {repeats}; "
                  "the profiler's own cost inflates it):",
                  ["package or module", "self time (ms)", "share of the import"],
                  ratios=("share of the import",))
    for name, us in sorted(packages.items(), key=lambda item: -item[1]):
        if us > 0:
            table.add(name, us / 1e3, us / total)
    mine = sorted(((us, name) for name, us in medians.items() if name.startswith("onnx_light")), reverse=True)
    for us, name in mine[:6]:
        table.add(f"  {name}", us / 1e3, us / total)
    return table


def load_profile(registry_path: Path, local: CpuExecutionDescriptor) -> Table:
    """cProfile of one ``cache.load_into`` of a cache file: the functions with the most own time."""
    registry = KernelTuningRegistry()
    kernels.register(registry)
    profiler = cProfile.Profile()
    profiler.enable()
    cache_file.load_into(registry, registry_path, local)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    total = sum(entry[2] for entry in stats.values())
    table = Table("Where a load of the largest cache goes (cProfile, own time):",
                  ["function", "calls", "own time (ms)", "share"], ratios=("share",))
    for own, calls, (filename, line, name) in sorted(((e[2], e[1], f) for f, e in stats.items()),
                                                      reverse=True)[:10]:
        where = f"{name} ({filename.rsplit('/', 1)[-1]}:{line})" if line else name
        table.add(where, calls, own * 1e3, own / total)
    return table


def startup(ctx: Context) -> SectionResult:
    """Section 6."""
    config = ctx.config
    with section(6, "Start-up: import, cache load, session construction") as result:
        local = ctx.descriptor
        caches: dict[int, Path] = {}
        written = Table("Cache files written with `update_cache` (one call each):",
                        ["entries", "of this processor", "file size (KiB)", "write time (ms)"])
        for count in config.cache_sizes:
            path = ctx.scratch / f"cache-{count}.txt"
            path.unlink(missing_ok=True)
            entries = synthetic_entries(count, local)
            started = time.perf_counter()
            cache_file.update_cache(path, entries)
            seconds = time.perf_counter() - started
            caches[count] = path
            mine = sum(e.descriptor.cpu == local.cpu for e in entries)
            written.add(count, mine, path.stat().st_size / 1024, seconds * 1e3)

        # Cache load: into a fresh registry each time, sizes interleaved.
        loads: dict[int, list[float]] = {count: [] for count in caches}
        loaded: dict[int, int] = {}
        for repeat in range(max(3, config.import_repeats)):
            order = list(caches)[repeat % len(caches):] + list(caches)[:repeat % len(caches)]
            for count in order:
                registry = KernelTuningRegistry()
                kernels.register(registry)
                started = time.perf_counter()
                report = cache_file.load_into(registry, caches[count], local)
                loads[count].append(time.perf_counter() - started)
                loaded[count] = report["loaded"]
        load_table = Table("Cache load (`cache.load_into` a fresh registry: read, parse, classify, publish; "
                           "median):", ["entries", "published for this descriptor", "load (ms)",
                                        "per entry (us)"])
        for count, seconds in loads.items():
            median = statistics.median(seconds)
            load_table.add(count, loaded[count], median * 1e3, median / count * 1e6)

        # Imports in fresh processes, interleaved.
        missing = ctx.scratch / "no-cache-here.txt"
        variants: dict[str, tuple[str, Path]] = {"onnx_light, no cache file": ("onnx_light", missing)}
        for count, path in caches.items():
            variants[f"onnx_light, {count}-entry cache"] = ("onnx_light", path)
        variants.update({"onnxruntime": ("onnxruntime", missing), "onnx": ("onnx", missing),
                         "ml_dtypes": ("ml_dtypes", missing), "numpy": ("numpy", missing)})
        imports: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        names = list(variants)
        for module, cache in {module: cache for module, cache in variants.values()}.items():
            _import_time(module, cache)  # untimed: writes the bytecode caches
        for repeat in range(config.import_repeats):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                imports[name].append(_import_time(*variants[name]))
            log(f"imports {repeat + 1}/{config.import_repeats}")
        base = statistics.median(t for t, _ in imports["onnx_light, no cache file"])
        import_table = Table(f"Import in a fresh interpreter (median of {config.import_repeats}, bytecode "
                             f"caches written; aim: onnx_light without cache <= "
                             f"{IMPORT_AIM_S * 1e3:.0f} ms):",
                             ["import", "import statement (ms)", "whole process (ms)",
                              "/ onnx_light without cache"], ratios=("/ onnx_light without cache",))
        for name, samples in imports.items():
            statement = statistics.median(t for t, _ in samples)
            import_table.add(name, statement * 1e3, statistics.median(w for _, w in samples) * 1e3,
                             statement / base)

        versions = subprocess.run(
            [sys.executable, "-c", "import numpy, onnx, ml_dtypes; "
             "print(numpy.__version__, onnx.__version__, ml_dtypes.__version__)"],
            capture_output=True, text=True, check=True).stdout.split()
        result.notes.append(f"import: onnx_light without cache {base * 1e3:.0f} ms against the aim of "
                            f"{IMPORT_AIM_S * 1e3:.0f} ms ({'met' if base <= IMPORT_AIM_S else 'missed'}); "
                            "numpy {}, onnx {}, ml_dtypes {}".format(*versions))

        # Session construction of the light models.
        models = config.models or real_models.MODELS
        construction: dict[str, dict[str, list[float]]] = {m: {"onnx_light": [], "onnxruntime": []}
                                                           for m in models}
        resolution: dict[str, list[float]] = {m: [] for m in models}
        unsupported: dict[str, str] = {}
        for repeat in range(config.construction_repeats):
            for model in models:
                path = real_models.model_path(model)
                if model not in unsupported:
                    started = time.perf_counter()
                    try:
                        session = RuntimeSession(path, num_threads=config.threads)
                    except UnsupportedOperatorError as exc:
                        unsupported[model] = str(exc).splitlines()[0]
                    else:
                        construction[model]["onnx_light"].append(time.perf_counter() - started)
                        resolution[model].append(session.tuning_resolution_seconds)
                        del session
                started = time.perf_counter()
                ort = real_models.onnxruntime_session(path, config.threads)
                construction[model]["onnxruntime"].append(time.perf_counter() - started)
                del ort
            log(f"constructions {repeat + 1}/{config.construction_repeats}")
        sessions = Table(f"Session construction of ONNX's light models (median of "
                         f"{config.construction_repeats}; a path given, so loading the file is included):",
                         ["model", "nodes", "file (KiB)", "onnx_light (ms)",
                          "of which tuning resolution (ms)", "onnxruntime (ms)", "onnx_light / onnxruntime"],
                         ratios=("onnx_light / onnxruntime",))
        for model in models:
            path = real_models.model_path(model)
            nodes = len(onnx.load(path, load_external_data=False).graph.node)
            ort_ms = statistics.median(construction[model]["onnxruntime"]) * 1e3
            if model in unsupported:
                sessions.add(model, nodes, os.path.getsize(path) / 1024, "unsupported", None, ort_ms, None)
                continue
            light_ms = statistics.median(construction[model]["onnx_light"]) * 1e3
            sessions.add(model, nodes, os.path.getsize(path) / 1024, light_ms,
                         statistics.median(resolution[model]) * 1e3, ort_ms, light_ms / ort_ms)
        result.tables = [import_table, import_profile(missing, max(3, config.import_repeats)), written,
                         load_table, load_profile(caches[max(caches)], local), sessions]
        for model, reason in unsupported.items():
            result.notes.append(f"{model}: unsupported in this tree ({reason})")
        result.data = {"imports": imports, "loads": loads, "construction": construction}
    return result
