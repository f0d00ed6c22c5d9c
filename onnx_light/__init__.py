"""onnx_light: a lightweight ONNX runtime for CPUs whose kernels tune themselves.

``onnx_light.InferenceSession`` and its options mirror onnxruntime's Python API, so that
``import onnx_light as ort`` switches a script; ``RuntimeSession`` is the native API.
Importing the package registers the built-in kernels' tuning schemas and loads
this machine's profiles from the default cache. A missing or damaged cache only
costs performance: it is reported through ``logging`` and never raises.

The runtime (and with it onnx and ml_dtypes, whose imports cost more than the rest of
the package) is imported on first use of a name that needs it (:class:`RuntimeSession`,
:class:`InferenceSession` and its options, the runtime's exceptions, :func:`hold_freed_memory`),
not at ``import onnx_light`` (docs/benchmarks.md).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from . import kernels
from .kernels.base import KernelError
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
from .tuning.cache import CacheStatus, LineOutcome

if TYPE_CHECKING:
    from .inference_session import (
        ExecutionMode,
        GraphOptimizationLevel,
        InferenceSession,
        ModelMetadata,
        RunOptions,
        RunTerminatedError,
        SessionOptions,
        get_available_providers,
        get_device,
    )
    from .runtime import InvalidInputError, NodeArg, RuntimeSession, UnsupportedOperatorError
    from .runtime.memory import hold_freed_memory

__version__ = "0.1.0"  # the one source of the version: pyproject.toml reads it

__all__ = [
    "ExecutionMode",
    "GraphOptimizationLevel",
    "InferenceSession",
    "InvalidInputError",
    "KernelError",
    "KernelTuningKey",
    "ModelMetadata",
    "NodeArg",
    "RunOptions",
    "RunTerminatedError",
    "RuntimeSession",
    "SessionOptions",
    "UnsupportedOperatorError",
    "apply_kernel_tuning_updates",
    "calibrate_kernel_tuning",
    "default_kernel_tuning_cache_path",
    "get_available_providers",
    "get_device",
    "hold_freed_memory",
    "inspect_kernel_tuning_cache",
    "kernel_tuning_parameters",
    "load_kernel_tuning_cache",
    "propose_kernel_tuning_updates",
    "reset_kernel_tuning_parameters",
    "set_kernel_tuning_parameters",
]

logger = logging.getLogger("onnx_light")

# Public names imported on first use: name -> the module that defines it.
_LAZY = {
    **dict.fromkeys(("InvalidInputError", "NodeArg", "RuntimeSession", "UnsupportedOperatorError"),
                    ".runtime"),
    "hold_freed_memory": ".runtime.memory",
    **dict.fromkeys(("ExecutionMode", "GraphOptimizationLevel", "InferenceSession", "ModelMetadata",
                     "RunOptions", "RunTerminatedError", "SessionOptions", "get_available_providers",
                     "get_device"), ".inference_session"),
}


def __getattr__(name: str) -> Any:
    """Import the runtime's public names on first use (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def _load_default_cache() -> None:
    """Load the default cache; any problem becomes a warning, never an exception."""
    try:
        report = load_kernel_tuning_cache()
    except Exception as exc:  # the promise: a bad cache never stops an import
        logger.warning("kernel tuning cache not loaded: %s: %s", type(exc).__name__, exc)
        return
    invalid = [e for e in report["entries"] if e["outcome"] == LineOutcome.INVALID]
    if report["status"] not in (CacheStatus.OK, CacheStatus.MISSING) or invalid or report["ownership"]:
        # Entries of other processors, ABIs or libraries are expected in a shared file.
        logger.warning("kernel tuning cache %s (%s): %s", report["path"], report["status"],
                       "; ".join(report["diagnostics"][:5]))

kernels.register(default_registry())
_load_default_cache()
