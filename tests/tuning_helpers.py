"""Shared helpers for the tuning-core tests: synthetic processors, test schemas, and the
functions run in spawned processes (they must live in an importable module).

Nothing here reads the host's processor.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from onnx_light.tuning.cache import CacheEntry, parse_cache_bytes, update_cache
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.processor import CpuDescriptor, CpuExecutionDescriptor
from onnx_light.tuning.registry import KernelTuningRegistry
from onnx_light.tuning.schema import KernelTuningSchema, Parameter

LIBRARY = "testlib"
MIN_ELEMENTS = "parallel.minimum_elements"

_X86_AVX2 = frozenset({"sse2", "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c"})
_X86_AVX512 = _X86_AVX2 | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}

#: Synthetic processors by archspec target name: (architecture, vendor, family, model,
#: features). Family/model values are those Linux reports for these parts.
_CPUS: dict[str, tuple[str, str, int | None, int | None, frozenset[str]]] = {
    "haswell": ("x86_64", "intel", 6, 63, _X86_AVX2),
    "broadwell": ("x86_64", "intel", 6, 79, _X86_AVX2),
    "skylake": ("x86_64", "intel", 6, 94, _X86_AVX2),
    "skylake_avx512": ("x86_64", "intel", 6, 85, _X86_AVX512),
    "cascadelake": ("x86_64", "intel", 6, 85, _X86_AVX512 | {"avx512_vnni"}),
    "icelake": ("x86_64", "intel", 6, 106,
                _X86_AVX512 | {"avx512_vnni", "avx512_ifma", "avx512_vbmi"}),
    "sapphirerapids": ("x86_64", "intel", 6, 143,
                       _X86_AVX512 | {"avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                                      "amx_bf16", "amx_int8"}),
    "zen2": ("x86_64", "amd", 23, 49, _X86_AVX2),
    "zen3": ("x86_64", "amd", 25, 1, _X86_AVX2),
    "zen4": ("x86_64", "amd", 25, 17, _X86_AVX512 | {"avx512_vnni", "avx512_bf16"}),
    "neoverse_v1": ("aarch64", "arm", 8, 0xD40,
                    frozenset({"neon", "fp16", "asimdhp", "dotprod", "fhm", "i8mm", "bf16",
                               "sve"})),
    "m1": ("aarch64", "apple", None, None,
           frozenset({"neon", "fp16", "asimdhp", "dotprod", "fhm"})),
}

CPU_NAMES = tuple(sorted(_CPUS))


def cpu(name: str, **changes: Any) -> CpuDescriptor:
    """A synthetic :class:`CpuDescriptor` for the archspec target ``name``."""
    architecture, vendor, family, model, features = _CPUS[name]
    fields: dict[str, Any] = dict(
        architecture=architecture, vendor=vendor, family=family, model=model, stepping=1,
        microarchitecture=name, features=features, cache_line=64, l1d=32768, l2=1 << 20,
        l3=32 << 20, physical_cores=16, logical_cores=32,
    )
    fields.update(changes)
    return CpuDescriptor(**fields)


def descriptor(name: str, threads: int = 8, **changes: Any) -> CpuExecutionDescriptor:
    """A synthetic execution descriptor: processor ``name`` running ``threads`` threads."""
    return CpuExecutionDescriptor(cpu(name, **changes), threads)


def key(kernel: str = "Add", element_type: Any = "float", implementation: str = "portable",
        tuning_abi: int = 1, library: str = LIBRARY) -> KernelTuningKey:
    """A test key (library ``testlib`` unless told)."""
    return KernelTuningKey(library, kernel, implementation, element_type, "cpu", tuning_abi)


def simple_schema(k: KernelTuningKey, default: int = 1000) -> KernelTuningSchema:
    """One int parameter ``parallel.minimum_elements`` >= 1."""
    return KernelTuningSchema(k, (Parameter(MIN_ELEMENTS, "int", default, minimum=1),))


def four_type_schema(k: KernelTuningKey) -> KernelTuningSchema:
    """One parameter of each value type, without bounds (for round trips)."""
    return KernelTuningSchema(k, (
        Parameter("p.int", "int", 1),
        Parameter("p.float", "float", 0.5),
        Parameter("p.bool", "bool", False),
        Parameter("p.str", "str", "x"),
    ))


def fresh_registry(schemas: Iterable[KernelTuningSchema] = (), **kwargs: Any) -> KernelTuningRegistry:
    """A new registry holding ``schemas`` (and any profiles/callbacks in ``kwargs``)."""
    registry = KernelTuningRegistry()
    registry.register(schemas=list(schemas), **kwargs)
    return registry


# --------------------------------------------------------------------------------------------
# Functions run in spawned processes
# --------------------------------------------------------------------------------------------


def writer_key(worker: int, index: int) -> KernelTuningKey:
    """The distinct key that ``cache_writer`` number ``worker`` writes at step ``index``."""
    return key(kernel=f"K{worker}x{index}")


def cache_writer(path: str, worker: int, count: int) -> None:
    """Write ``count`` entries with distinct keys, one ``update_cache`` call each."""
    local = descriptor("zen3")
    for index in range(count):
        entry = CacheEntry(writer_key(worker, index), local, {MIN_ELEMENTS: worker * 100 + index})
        update_cache(Path(path), [entry])


def cache_reader(path: str, stop: Any, results: Any) -> None:
    """Read ``path`` in a loop until ``stop`` is set; report (reads, problems, counts)."""
    problems: list[str] = []
    counts: list[int] = []
    reads = 0
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        finished = stop.is_set()
        data = Path(path).read_bytes()
        parsed = parse_cache_bytes(Path(path), data)
        reads += 1
        if parsed.status != "ok" or any(line.error for line in parsed.lines):
            problems.append(f"{parsed.status}: {parsed.diagnostics[:3]} ({len(data)} bytes)")
        counts.append(len(parsed.lines))
        if finished:
            break
    results.put((reads, problems, counts))
