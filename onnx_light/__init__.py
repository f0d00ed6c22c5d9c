"""onnx_light: a lightweight ONNX runtime for CPUs whose kernels tune themselves.

Importing the package registers the built-in kernels' tuning schemas and loads
this machine's profiles from the default cache. A missing or damaged cache only
costs performance: it is reported through ``logging`` and never raises.
"""

from __future__ import annotations

import logging

from . import kernels
from .runtime import RuntimeSession
from .runtime.memory import hold_freed_memory
from .tuning import (
    KernelTuningKey,
    apply_kernel_tuning_updates,
    calibrate_kernel_tuning,
    default_kernel_tuning_cache_path,
    default_registry,
    inspect_kernel_tuning_cache,
    kernel_tuning_parameters,
    load_kernel_tuning_cache,
    propose_kernel_tuning_updates,
    reset_kernel_tuning_parameters,
    set_kernel_tuning_parameters,
)

__all__ = [
    "KernelTuningKey",
    "RuntimeSession",
    "apply_kernel_tuning_updates",
    "calibrate_kernel_tuning",
    "default_kernel_tuning_cache_path",
    "hold_freed_memory",
    "inspect_kernel_tuning_cache",
    "kernel_tuning_parameters",
    "load_kernel_tuning_cache",
    "propose_kernel_tuning_updates",
    "reset_kernel_tuning_parameters",
    "set_kernel_tuning_parameters",
]

logger = logging.getLogger("onnx_light")

def _load_default_cache() -> None:
    """Load the default cache; any problem becomes a warning, never an exception."""
    try:
        report = load_kernel_tuning_cache()
    except Exception as exc:  # the promise: a bad cache never stops an import
        logger.warning("kernel tuning cache not loaded: %s: %s", type(exc).__name__, exc)
        return
    invalid = [e for e in report["entries"] if e["outcome"] == "invalid"]
    if report["status"] not in ("ok", "missing") or invalid or report["ownership"]:
        # Entries of other processors, ABIs or libraries are expected in a shared file.
        logger.warning("kernel tuning cache %s (%s): %s", report["path"], report["status"],
                       "; ".join(report["diagnostics"][:5]))

kernels.register(default_registry())
_load_default_cache()
