"""Calibrate every node of a Ray cluster and merge the results into one cache file.

One Ray task per node with CPUs, pinned to that node (hard node affinity) and holding all
of its CPUs, calibrates at a thread count equal to the node's CPU count into a scratch
cache on the worker and returns that cache's new entries. The driver merges them into
``output``: one entry per (key, execution descriptor), so a machine loading the merged
file picks the entries of its own processor and thread count. A node that fails or times
out is reported; the other nodes' entries are kept.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..tuning import api
from ..tuning import cache as cache_file
from ..tuning.calibration import DEFAULT_KEY_DURATION_S
from ..tuning.processor import CpuExecutionDescriptor
from ..tuning.registry import default_registry

__all__ = ["calibrate_cluster"]

STARTUP_ALLOWANCE_S = 120.0  # a worker's start and onnx_light's import, on a busy node


def _cached_entries(path: Path) -> list[cache_file.CacheEntry]:
    """The entries of ``path`` that parse (the others are kept verbatim by the merge)."""
    entries = []
    for line in cache_file.read_cache(path).lines:
        try:
            entries.append(line.entry())
        except (ValueError, TypeError, KeyError):
            continue
    return entries


def _calibrate_on_node(kernels: list[str] | None, element_types: list[int] | None,
                       max_duration_ms: float | None, num_threads: int,
                       known: list[cache_file.CacheEntry]) -> dict[str, Any]:
    """The task: calibrate the keys ``known`` lacks for this node at ``num_threads`` threads.

    Works in a scratch cache seeded with ``known`` so that keys already calibrated for this
    descriptor are not measured again; returns the new entries as cache lines.
    """
    with tempfile.TemporaryDirectory(prefix="onnx_light-fleet-") as folder:
        scratch = Path(folder) / "kernel-tuning-cache.txt"
        if known:
            cache_file.update_cache(scratch, known)
        proposal = api.propose_kernel_tuning_updates(kernels, element_types, path=scratch,
                                                     num_threads=num_threads)
        outcome = api.apply_kernel_tuning_updates(proposal, path=scratch,
                                                  max_duration_ms=max_duration_ms)
        local = CpuExecutionDescriptor.from_dict(outcome["descriptor"])
        applied = {record["key"] for record in outcome["applied"]}
        lines = [entry.to_line() for entry in _cached_entries(scratch)
                 if str(entry.key) in applied and entry.descriptor == local]
    return {"host": socket.gethostname(), "descriptor": outcome["descriptor"], "lines": lines,
            "covered": proposal["covered"], "failed": outcome["failed"],
            "skipped": outcome["skipped"], "duration_s": outcome["duration_s"]}


def _nodes() -> list[dict[str, Any]]:
    """The cluster's alive nodes: id, address and whole CPU count."""
    return [{"node_id": node["NodeID"], "address": node.get("NodeManagerAddress"),
             "cpus": int(node.get("Resources", {}).get("CPU", 0))}
            for node in ray.nodes() if node.get("Alive")]


def _selection(kernels: str | Iterable[str] | None,
               element_types: api.ElementTypes | None) -> tuple[list[str] | None, list[int] | None, int]:
    """Validate the filters here, before any task starts; returns them as plain lists."""
    keys = api.select_keys(default_registry().snapshot(), kernels, element_types)
    names = None if kernels is None else sorted({k.kernel for k in keys})
    types = None if element_types is None else sorted({k.element_type for k in keys})
    return names, types, len(keys)


def _timeout(timeout_s: float | None, max_duration_ms: float | None, keys: int) -> float:
    if timeout_s is not None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s must be a number > 0, got {timeout_s!r}")
        return float(timeout_s)
    budget = DEFAULT_KEY_DURATION_S * max(keys, 1) if max_duration_ms is None \
        else max_duration_ms / 1000.0
    return 2 * budget + STARTUP_ALLOWANCE_S


def _failure(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def calibrate_cluster(
    address: str | None = None,
    *,
    kernels: str | Iterable[str] | None = None,
    element_types: api.ElementTypes | None = None,
    output: str | os.PathLike[str] | None = None,
    max_duration_ms: float | None = None,
    timeout_s: float | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Calibrate the selected keys on every node of a Ray cluster; merge into ``output``.

    A process connected to Ray already uses that connection. Otherwise this connects to
    ``address`` (as ``ray.init(address)`` does: None finds or starts a local Ray) and
    disconnects at the end. ``output`` is the cache file to merge
    into (default: this machine's cache); keys it already holds for a node's descriptor are
    not calibrated again. ``max_duration_ms`` is each node's calibration budget;
    ``timeout_s`` how long to wait for the nodes (default: twice the budget plus two minutes).
    ``progress(report)`` is called with each node's report as it arrives.

    Returns ``{"output", "nodes", "written", "cache_update", "duration_s"}``; each node's
    report has ``status`` ``ok``, ``failed``, ``timed out``, ``duplicate`` (same descriptor
    as an earlier node: its entries are not merged) or ``no CPUs``.
    """
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable(report), got {type(progress).__name__}")
    names, types, key_count = _selection(kernels, element_types)
    api._budget_seconds(max_duration_ms, key_count)  # validated as for a local calibration
    wait_s = _timeout(timeout_s, max_duration_ms, key_count)
    path = cache_file.resolve_path(output)
    known = _cached_entries(path)
    started = time.perf_counter()
    connected_here = not ray.is_initialized()
    if connected_here:
        ray.init(address=address, log_to_driver=False)
    try:
        return _run(names, types, max_duration_ms, known, path, wait_s, progress, started)
    finally:
        if connected_here:
            ray.shutdown()


def _run(names: list[str] | None, types: list[int] | None, max_duration_ms: float | None,
         known: list[cache_file.CacheEntry], path: Path, wait_s: float,
         progress: Callable[[dict[str, Any]], None] | None, started: float) -> dict[str, Any]:
    task = ray.remote(_calibrate_on_node)
    reports, pending = [], {}
    for node in _nodes():
        report = {**node, "status": "no CPUs", "descriptor": None, "calibrated": [], "covered": [],
                  "failed": [], "skipped": [], "error": None, "duration_s": 0.0}
        reports.append(report)
        if node["cpus"] < 1:
            continue
        strategy = NodeAffinitySchedulingStrategy(node["node_id"], soft=False)
        ref = task.options(num_cpus=node["cpus"], scheduling_strategy=strategy, max_retries=0) \
            .remote(names, types, max_duration_ms, node["cpus"], known)
        pending[ref] = report
    deadline = time.monotonic() + wait_s
    lines_by_node: dict[str, list[str]] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        report = pending.pop(ready[0])
        try:
            result = ray.get(ready[0])
        except Exception as exc:  # a node that dies or a task that fails: reported, others count
            report.update(status="failed", error=_failure(exc))
        else:
            lines_by_node[report["node_id"]] = result.pop("lines")
            report.update(status="ok", **result,
                          calibrated=[cache_file.CacheLine.parse(0, t).identity[0]
                                      for t in lines_by_node[report["node_id"]]])
        if progress is not None:
            progress(report)
    for ref, report in pending.items():
        ray.cancel(ref, force=True)
        report.update(status="timed out", error=f"no result within {wait_s:.3g} s")
        if progress is not None:
            progress(report)
    return _merge(reports, lines_by_node, path, started)


def _merge(reports: list[dict[str, Any]], lines_by_node: dict[str, list[str]], path: Path,
           started: float) -> dict[str, Any]:
    """Merge the nodes' entries into ``path``: one per (key, descriptor), the first node's."""
    entries: dict[tuple[str, str], cache_file.CacheEntry] = {}
    owners: dict[str, str] = {}
    for report in reports:
        if report["status"] != "ok":
            continue
        descriptor = CpuExecutionDescriptor.from_dict(report["descriptor"])
        owner = owners.setdefault(repr(descriptor), report["node_id"])
        if owner != report["node_id"]:
            report.update(status="duplicate", error=f"same descriptor as node {owner}")
            continue
        for text in lines_by_node[report["node_id"]]:
            entry = cache_file.CacheLine.parse(0, text).entry()
            entries[entry.identity()] = entry
    update = cache_file.update_cache(path, entries.values()) if entries else None
    return {"output": str(path), "nodes": reports, "written": len(entries), "cache_update": update,
            "duration_s": time.perf_counter() - started}
