"""Batch inference on Ray Data: a callable class for ``Dataset.map_batches``."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import ray

__all__ = ["Predictor"]


def _assigned_cpus() -> int | None:
    """The whole CPUs Ray assigned to this worker, or None outside a Ray worker."""
    if not ray.is_initialized():
        return None
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    return max(1, int(cpus)) if cpus else None


class Predictor:
    """Runs an ONNX model on each batch of a Ray Data pipeline.

    ``ds.map_batches(Predictor, fn_constructor_kwargs={"model": path}, num_cpus=4,
    concurrency=2, batch_format="numpy")``: each actor builds one session whose thread count
    is the CPUs Ray gives the actor (``num_cpus``), unless ``num_threads`` says otherwise, so
    that it resolves the tuning entries calibrated for that thread count. ``cache`` is a
    kernel tuning cache file (e.g. one merged by :func:`~onnx_light.fleet.calibrate_cluster`)
    loaded into the actor's process before the session is built; None keeps what the import
    loaded (the node's default cache). A batch is a dict of column names to numpy arrays:
    the model's inputs are fed from the columns of their names, and the result maps each
    output name to its array; the other columns (an id, say) pass through unchanged.
    """

    def __init__(self, model: Any, num_threads: int | None = None,
                 cache: str | os.PathLike[str] | None = None) -> None:
        from ..runtime import RuntimeSession
        from ..tuning import load_kernel_tuning_cache
        from ..tuning.processor import effective_thread_count

        threads = effective_thread_count(num_threads if num_threads is not None
                                         else _assigned_cpus())
        self.cache_report = None if cache is None else load_kernel_tuning_cache(
            cache, num_threads=threads)
        self.session = RuntimeSession(model, num_threads=threads)
        self.num_threads = self.session.num_threads
        self._inputs = {info.name for info in self.session.get_inputs()}
        self._outputs = [info.name for info in self.session.get_outputs()]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs for one batch, by output name, and the batch's other columns."""
        passed = {name: column for name, column in batch.items() if name not in self._inputs}
        clash = sorted(set(passed) & set(self._outputs))
        if clash:
            raise ValueError(f"column(s) {clash} of the batch have the names of model outputs")
        feeds = {name: column for name, column in batch.items() if name in self._inputs}
        results = self.session.run(None, feeds)
        return {**passed, **dict(zip(self._outputs, results, strict=True))}
