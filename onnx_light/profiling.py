"""Run profiles: one event per node run, written as a Chrome trace, summed per operator type.

A :class:`Profiler` collects complete (``"ph": "X"``) events in the structure of
onnxruntime's profiler output: ``cat`` ("Session" or "Node"), ``pid``, ``tid`` (the native
id of the thread that ran the node), ``dur`` and ``ts`` in microseconds from the start of
profiling, ``ph``, ``name`` (``<node>_kernel_time`` for a node) and ``args`` (``op_name`` and
``provider`` for a node). The file is a JSON array, which Perfetto and chrome://tracing
open. Used by ``onnx_light.InferenceSession`` (``SessionOptions.enable_profiling``) and by
``python -m onnx_light run --profile``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["PROVIDER", "Profiler", "profile_file_name"]

PROVIDER = "CPUExecutionProvider"


def profile_file_name(prefix: str, started_ns: int) -> str:
    """``<prefix>_<date>_<time>_<milliseconds>.json`` (local time), as onnxruntime names its
    profiles."""
    seconds, rest = divmod(started_ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(seconds))
    return f"{prefix}_{stamp}_{rest // 1_000_000:03d}.json"


class Profiler:
    """Collects the events of one session; safe to use from several threads at once."""

    def __init__(self) -> None:
        self.start_time_ns = time.time_ns()  # wall clock, for the file name and callers
        self._origin = time.perf_counter_ns()
        self._pid = os.getpid()
        self._events: list[dict[str, Any]] = []  # list.append is atomic

    def _event(self, category: str, name: str, started_ns: int, ended_ns: int, args: dict[str, Any]) -> None:
        self._events.append(
            {
                "cat": category,
                "pid": self._pid,
                "tid": threading.get_native_id(),
                "dur": (ended_ns - started_ns) // 1000,
                "ts": (started_ns - self._origin) // 1000,
                "ph": "X",
                "name": name,
                "args": args,
            }
        )

    def session_event(self, name: str, started_ns: int, ended_ns: int | None = None) -> None:
        """A session-level event (``model_loading_uri``, ``session_initialization``,
        ``model_run``) between two ``time.perf_counter_ns()`` readings (the end: now)."""
        ended_ns = time.perf_counter_ns() if ended_ns is None else ended_ns
        self._event("Session", name, started_ns, ended_ns, {})

    def node_hook(self, name: str, op_type: str) -> Callable[[], None]:
        """A ``RuntimeSession.run`` node hook: times the node on the thread that runs it."""
        started = time.perf_counter_ns()

        def done() -> None:
            self._event(
                "Node",
                f"{name}_kernel_time",
                started,
                time.perf_counter_ns(),
                {"op_name": op_type, "provider": PROVIDER},
            )

        return done

    @property
    def events(self) -> list[dict[str, Any]]:
        """A copy of the events so far, in the order they ended."""
        return list(self._events)

    def write(self, path: str) -> str:
        """Write the events as a JSON array to ``path`` and return it."""
        try:
            with open(path, "w", encoding="utf-8") as file:
                json.dump(self.events, file, indent=0)
        except OSError as exc:
            raise OSError(f"profile not written to {path!r}: {exc.strerror or exc}") from None
        return path

    def operator_summary(self) -> list[dict[str, Any]]:
        """Per operator type, largest first: total and mean microseconds, calls, and the share
        of the summed ``model_run`` time (shares may add up past 1 where branches of the graph
        ran side by side or where a control-flow node's time holds its bodies' nodes, which
        are listed too, as onnxruntime lists them, and stay below it by the time spent
        between nodes)."""
        run_time = sum(e["dur"] for e in self._events if e["cat"] == "Session" and e["name"] == "model_run")
        totals: dict[str, list[int]] = {}
        for event in self._events:
            if event["cat"] == "Node":
                entry = totals.setdefault(event["args"]["op_name"], [0, 0])
                entry[0] += event["dur"]
                entry[1] += 1
        rows = [
            {
                "op_type": op,
                "total_us": total,
                "calls": calls,
                "mean_us": total / calls,
                "share": total / run_time if run_time else 0.0,
            }
            for op, (total, calls) in totals.items()
        ]
        return sorted(rows, key=lambda row: (-row["total_us"], row["op_type"]))
