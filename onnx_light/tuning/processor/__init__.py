"""Processor detection and the execution descriptor.

A :class:`CpuDescriptor` says which processor the kernels run on: vendor,
family/model/stepping, archspec microarchitecture, a *normalised* set of
instruction-set features, cache sizes and core counts. A
:class:`CpuExecutionDescriptor` adds the effective thread count; together they
decide whether tuned kernel parameters (or a cached profile) apply.

One job per module, so that detection can be tested on processors we do not have:

* :mod:`.tables`: the facts as data (``cpu_tables.json``, its schema, the lazy loader);
* :mod:`.features` and :mod:`.vendors`: raw flags and vendor identifiers to canonical names;
* :mod:`.descriptors`: the two descriptors, their validation and dict forms;
* :mod:`.parsing`: pure functions over text (``/proc/cpuinfo``, sysfs, ``sysctl``);
* :mod:`.detection`: the thin host readers that gather that text, :func:`detect_cpu`;
* :mod:`.threads`: the effective thread count (affinity, cgroup quotas);
* :mod:`.readers`: the small text files of the host, read in one place.

Only facts read from the system are recorded: a value that cannot be read stays
``None`` (or ``"unknown"`` for strings), it is never guessed.

This package is part of the tuning core: it imports nothing else from
``onnx_light`` (stdlib and archspec only).
"""

from __future__ import annotations

from typing import Any

from .descriptors import CpuDescriptor, CpuExecutionDescriptor
from .detection import detect_cpu, execution_descriptor, reset_detection_cache
from .features import kernel_features, normalise_features
from .parsing import (
    count_physical_cores,
    cpu_from_sources,
    cpu_from_sysctl,
    parse_proc_cpuinfo,
    parse_sysctl_output,
    parse_sysfs_caches,
)
from .threads import (
    cgroup_cpu_dirs,
    cgroup_cpu_limit,
    effective_thread_count,
    parse_cgroup_v1_cpu_quota,
    parse_cgroup_v2_cpu_max,
)

__all__ = [
    "KERNEL_FEATURES",
    "CpuDescriptor",
    "CpuExecutionDescriptor",
    "cgroup_cpu_dirs",
    "cgroup_cpu_limit",
    "count_physical_cores",
    "cpu_from_sources",
    "cpu_from_sysctl",
    "detect_cpu",
    "effective_thread_count",
    "execution_descriptor",
    "normalise_features",
    "parse_cgroup_v1_cpu_quota",
    "parse_cgroup_v2_cpu_max",
    "parse_proc_cpuinfo",
    "parse_sysctl_output",
    "parse_sysfs_caches",
    "reset_detection_cache",
]


def __getattr__(name: str) -> Any:
    # KERNEL_FEATURES (every canonical feature name, see features.kernel_features) comes
    # from cpu_tables.json, read only when first asked for.
    if name == "KERNEL_FEATURES":
        return kernel_features()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
