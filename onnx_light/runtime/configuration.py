"""The tuning step of a session's construction: the spec's steps 2-5, once, for the kernels that run.

It runs after folding and fusion, over the kernels of the plans a run can take (the fused
steps and the unfolded ones), so that every kernel is configured here and nowhere else and
the report describes the kernels that run: each kernel gives its exact key (step 2), one
registry snapshot is taken (step 3) and resolves every key for this processor and thread
count (step 4), and each kernel is bound to the pool and checks and copies its values
(step 5). Runs never read the registry or the cache afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..kernels.base import Kernel
from ..parallel import ThreadPool
from ..tuning.keys import KernelTuningKey
from ..tuning.processor import CpuExecutionDescriptor
from ..tuning.registry import KernelTuningRegistry, Resolution

__all__ = ["Configuration", "configure_kernels"]


@dataclass(frozen=True)
class Configuration:
    """The snapshot's generation and the resolution of every key the kernels gave."""

    generation: int
    resolutions: Mapping[KernelTuningKey, Resolution]

    def report(self, kernels: Iterable[Kernel]) -> list[dict[str, Any]]:
        """Per tunable kernel among ``kernels`` (a plan's, in plan order; a specialized or
        fused copy has its original's key and values): its node's name, key, values, their
        source and the generation, and what the kernel settled from the session's shapes
        (``decisions``, where it settled anything: Conv's algorithm and parallel plan)."""
        report = []
        for kernel in kernels:
            key = kernel.tuning_key()
            if key is None:
                continue
            entry = {"node": kernel.ctx.name, **self.resolutions[key].to_dict()}
            decisions = kernel.decisions()
            if decisions:
                entry["decisions"] = dict(decisions)
            report.append(entry)
        return report


def configure_kernels(kernels: Iterable[Kernel], registry: KernelTuningRegistry,
                      descriptor: CpuExecutionDescriptor, pool: ThreadPool) -> Configuration:
    """Resolve and configure every distinct kernel of ``kernels`` once, from one snapshot, in
    the spec's order: every key, the snapshot, every resolution, every configuration."""
    distinct = list({id(kernel): kernel for kernel in kernels}.values())
    keys = [kernel.tuning_key() for kernel in distinct]
    snapshot = registry.snapshot()
    resolved = {key: snapshot.resolve(key, descriptor) for key in dict.fromkeys(keys) if key is not None}
    for kernel, key in zip(distinct, keys, strict=True):
        kernel.bind(pool).configure(None if key is None else resolved[key].values)
    return Configuration(snapshot.generation, MappingProxyType(resolved))
