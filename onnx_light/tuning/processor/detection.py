"""Host detection: gathers the text of ``/proc``, sysfs, ``sysctl`` and archspec.

:func:`detect_cpu` detects once per process and never raises: a failure is logged as a
warning on the ``onnx_light`` logger and the affected fields stay unknown. The text is
turned into a descriptor by the pure functions of :mod:`.parsing`.
"""

from __future__ import annotations

import glob
import logging
import os
import platform
import threading
import warnings

from . import readers
from .descriptors import UNKNOWN, CpuDescriptor, CpuExecutionDescriptor
from .parsing import cpu_from_sources, cpu_from_sysctl, parse_sysctl_output
from .threads import effective_thread_count

__all__ = ["detect_cpu", "execution_descriptor", "reset_detection_cache"]

logger = logging.getLogger("onnx_light")

_SYSFS_CPU = "/sys/devices/system/cpu"
_CACHE_FILES = ("level", "type", "size", "coherency_line_size")
_ARCHITECTURE_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}

_lock = threading.Lock()
_cached: CpuDescriptor | None = None


def _normalise_architecture(machine: str) -> str:
    machine = (machine or "").strip().lower()
    return _ARCHITECTURE_ALIASES.get(machine, machine) or UNKNOWN


def _archspec_host() -> tuple[str, str]:
    """archspec's (target name, vendor) for the host."""
    import archspec.cpu

    target = archspec.cpu.host()
    return str(target.name), str(target.vendor)


def _host_archspec() -> tuple[str, str | None]:
    """(microarchitecture, archspec vendor), logging instead of raising or warning."""
    try:
        # archspec reports some problems with warnings.warn; turn them into log records.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            name, vendor = _archspec_host()
        for item in caught:
            logger.warning("archspec: %s", item.message)
        return name or UNKNOWN, vendor
    except Exception as exc:
        logger.warning("could not detect the microarchitecture with archspec: %s", exc)
        return UNKNOWN, None


def _read_sysfs_caches() -> dict[str, dict[str, str]] | None:
    caches: dict[str, dict[str, str]] = {}
    for directory in sorted(glob.glob(os.path.join(_SYSFS_CPU, "cpu0", "cache", "index*"))):
        files: dict[str, str] = {}
        for name in _CACHE_FILES:
            try:
                files[name] = readers.read_text(os.path.join(directory, name))
            except OSError:
                continue
        caches[os.path.basename(directory)] = files
    if not caches:
        logger.debug("no cache information in %s/cpu0/cache", _SYSFS_CPU)
    return caches or None


def _read_thread_siblings() -> list[str] | None:
    result = []
    for path in glob.glob(os.path.join(_SYSFS_CPU, "cpu[0-9]*", "topology",
                                       "thread_siblings_list")):
        try:
            result.append(readers.read_text(path))
        except OSError:
            continue
    return result or None


def _detect_linux(architecture: str, logical: int | None) -> CpuDescriptor:
    try:
        cpuinfo: str | None = readers.read_text("/proc/cpuinfo")
    except Exception as exc:
        logger.warning("could not read /proc/cpuinfo: %s", exc)
        cpuinfo = None
    try:
        caches = _read_sysfs_caches()
    except Exception as exc:
        logger.warning("could not read cache sizes from sysfs: %s", exc)
        caches = None
    try:
        siblings = _read_thread_siblings()
    except Exception as exc:
        logger.warning("could not read the CPU topology from sysfs: %s", exc)
        siblings = None
    microarchitecture, archspec_vendor = _host_archspec()
    return cpu_from_sources(
        architecture, cpuinfo, caches, microarchitecture, logical,
        thread_siblings=siblings, fallback_vendor=archspec_vendor,
    )


def _run_sysctl(*names: str) -> str:
    import subprocess  # macOS only: not imported on Linux

    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([env.get("PATH", ""), "/usr/sbin", "/sbin"])
    completed = subprocess.run(
        ["sysctl", *names], capture_output=True, text=True, timeout=10, env=env, check=False
    )
    return completed.stdout


def _detect_darwin(architecture: str, logical: int | None) -> CpuDescriptor:
    values: dict[str, str] = {}
    for tree in ("hw", "machdep.cpu"):
        try:
            values.update(parse_sysctl_output(_run_sysctl(tree)))
        except Exception as exc:
            logger.warning("could not run sysctl %s: %s", tree, exc)
    if not values:
        logger.warning("sysctl returned no processor information")
    if "apple" in values.get("machdep.cpu.brand_string", "").lower():
        architecture = "aarch64"  # also under Rosetta, where platform.machine() says x86_64
    microarchitecture, _ = _host_archspec()
    return cpu_from_sysctl(architecture, values, microarchitecture, logical)


def _detect_other(architecture: str, logical: int | None) -> CpuDescriptor:
    microarchitecture, archspec_vendor = _host_archspec()
    return cpu_from_sources(
        architecture, None, None, microarchitecture, logical, fallback_vendor=archspec_vendor
    )


def _detect() -> CpuDescriptor:
    try:
        architecture = _normalise_architecture(platform.machine())
    except Exception as exc:
        logger.warning("could not determine the machine architecture: %s", exc)
        architecture = UNKNOWN
    logical = os.cpu_count()
    system = platform.system()
    try:
        if system == "Linux":
            return _detect_linux(architecture, logical)
        if system == "Darwin":
            return _detect_darwin(architecture, logical)
        return _detect_other(architecture, logical)
    except Exception as exc:  # last line of defence: never raise
        logger.warning("processor detection failed: %s", exc)
        return CpuDescriptor(
            architecture=architecture, vendor=UNKNOWN, family=None, model=None, stepping=None,
            microarchitecture=UNKNOWN, features=frozenset(), cache_line=None, l1d=None, l2=None,
            l3=None, physical_cores=None, logical_cores=logical,
        )


def detect_cpu() -> CpuDescriptor:
    """The host's :class:`CpuDescriptor`, detected once per process (thread-safe).

    Never raises: a failure is logged as a warning on the ``onnx_light`` logger and the
    affected fields stay unknown. Linux reads ``/proc/cpuinfo``, sysfs and archspec; macOS
    ``sysctl`` and archspec; other systems only ``platform.machine()`` and archspec.
    """
    global _cached
    with _lock:
        if _cached is None:
            _cached = _detect()
        return _cached


def reset_detection_cache() -> None:
    """Forget the detected processor so that the next :func:`detect_cpu` detects again."""
    global _cached
    with _lock:
        _cached = None



def execution_descriptor(num_threads: int | None = None) -> CpuExecutionDescriptor:
    """``CpuExecutionDescriptor(detect_cpu(), effective_thread_count(num_threads))``."""
    return CpuExecutionDescriptor(detect_cpu(), effective_thread_count(num_threads))
