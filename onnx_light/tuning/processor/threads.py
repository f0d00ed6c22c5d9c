"""The effective thread count: scheduler affinity limited by cgroup CPU quotas.

The cgroup parsers are pure functions over text; :func:`cgroup_cpu_limit` and
:func:`effective_thread_count` read the host.
"""

from __future__ import annotations

import logging
import math
import operator
import os
import re

from . import readers
from .parsing import parse_int

__all__ = [
    "cgroup_cpu_dirs",
    "cgroup_cpu_limit",
    "effective_thread_count",
    "parse_cgroup_v1_cpu_quota",
    "parse_cgroup_v2_cpu_max",
]

logger = logging.getLogger("onnx_light")


def parse_cgroup_v2_cpu_max(text: str | None) -> int | None:
    """CPU limit from a cgroup v2 ``cpu.max`` text (``"quota period"`` or ``"max period"``).

    Returns ``ceil(quota / period)`` (at least 1), or None when unlimited or unparsable.
    """
    fields = (text or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    quota, period = parse_int(fields[0]), parse_int(fields[1])
    if not quota or not period:
        return None
    return max(1, math.ceil(quota / period))


def parse_cgroup_v1_cpu_quota(quota_text: str | None, period_text: str | None) -> int | None:
    """CPU limit from cgroup v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` texts.

    A quota of -1 means unlimited (None); otherwise ``ceil(quota / period)``, at least 1.
    """
    try:
        quota = int((quota_text or "").strip())
        period = int((period_text or "").strip())
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def _unescape_mount(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def cgroup_cpu_dirs(proc_self_cgroup: str, mountinfo: str) -> list[tuple[int, str]]:
    """Directories that may hold this process's CPU quota, as ``(cgroup version, dir)``.

    ``proc_self_cgroup`` is the text of ``/proc/self/cgroup`` and ``mountinfo`` the text of
    ``/proc/self/mountinfo``. The process's own cgroup comes first, then its ancestors up to
    the mount point (a quota on any of them limits the process).
    """
    v2_path: str | None = None
    v1_path: str | None = None
    for line in (proc_self_cgroup or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path

    result: list[tuple[int, str]] = []
    for line in (mountinfo or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, mount_point = _unescape_mount(fields[3]), _unescape_mount(fields[4])
        fstype, super_options = tail[0], tail[2].split(",")
        if fstype == "cgroup2" and v2_path is not None:
            version, path = 2, v2_path
        elif fstype == "cgroup" and "cpu" in super_options and v1_path is not None:
            version, path = 1, v1_path
        else:
            continue
        # The cgroup path is relative to the hierarchy root; the mount shows ``root`` of it.
        if path == root or path.startswith(root.rstrip("/") + "/"):
            relative = path[len(root.rstrip("/")):].strip("/")
        else:
            relative = ""  # e.g. a cgroup namespace: the mount point is our own cgroup
        directory = os.path.join(mount_point, relative) if relative else mount_point
        while True:
            result.append((version, directory))
            if directory.rstrip("/") == mount_point.rstrip("/"):
                break
            directory = os.path.dirname(directory.rstrip("/"))
            if not directory.startswith(mount_point.rstrip("/")):
                break
    return result


def cgroup_cpu_limit() -> int | None:
    """The CPU limit set by cgroup quotas on this process (the smallest one), or None."""
    try:
        directories = cgroup_cpu_dirs(readers.read_optional("/proc/self/cgroup") or "",
                                      readers.read_optional("/proc/self/mountinfo") or "")
    except Exception as exc:
        logger.warning("could not locate the cgroup of this process: %s", exc)
        return None
    if not directories:
        directories = [(2, "/sys/fs/cgroup"), (1, "/sys/fs/cgroup/cpu,cpuacct"),
                       (1, "/sys/fs/cgroup/cpu")]
    limits = []
    for version, directory in directories:
        if version == 2:
            limit = parse_cgroup_v2_cpu_max(readers.read_optional(os.path.join(directory, "cpu.max")))
        else:
            limit = parse_cgroup_v1_cpu_quota(
                readers.read_optional(os.path.join(directory, "cpu.cfs_quota_us")),
                readers.read_optional(os.path.join(directory, "cpu.cfs_period_us")),
            )
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def effective_thread_count(num_threads: int | None = None) -> int:
    """The number of threads kernels run with: the ONE definition used everywhere.

    With ``num_threads`` given, it is validated (an int, not a bool, >= 1; TypeError or
    ValueError naming ``num_threads`` otherwise) and returned. Without it, the number of
    CPUs this process may use: its scheduler affinity (``os.sched_getaffinity``, else
    ``os.cpu_count()``), further limited by a cgroup CPU quota (v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us``/``cpu.cfs_period_us``; ``ceil(quota/period)``), and at least 1.

    These are LOGICAL CPUs: it is what the OS scheduler lets the process run on, affinity
    masks and quotas are expressed in logical CPUs, and SMT siblings do give numpy kernels
    some throughput. On SMT machines users who prefer one thread per core may pass
    ``num_threads=detect_cpu().physical_cores`` explicitly.
    """
    if num_threads is not None:
        if isinstance(num_threads, bool):
            raise TypeError("num_threads must be an int, not a bool")
        try:
            value = operator.index(num_threads)
        except TypeError:
            raise TypeError(
                f"num_threads must be an int, got {type(num_threads).__name__}"
            ) from None
        if value < 1:
            raise ValueError(f"num_threads must be >= 1, got {value}")
        return value
    count = _available_cpus()
    try:
        limit = cgroup_cpu_limit()
    except Exception as exc:
        logger.warning("could not read the cgroup CPU quota: %s", exc)
        limit = None
    if limit is not None:
        count = min(count, limit)
    return max(1, count)

