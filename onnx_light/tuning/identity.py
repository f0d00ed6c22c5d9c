"""What a measured tuning result depends on besides its key and processor: the versions it
was measured under.

A calibrated value is the fastest configuration for one build of the software: the kernel
library's version, the kernel's revision (which its author bumps when the implementation
changes speed without changing what its parameters mean; a change of meaning bumps the key's
tuning ABI instead), numpy, the BLAS numpy was built with, and numba. A cache entry records
them (``measured_under``); an entry whose record differs from this process's is *stale*: it
is reported and not applied, which costs performance only.

Looking the versions up costs no import: numpy's BLAS comes from its build configuration,
and a distribution's version from an imported module's ``__version__`` or else the name of its
``.dist-info`` folder (``importlib.metadata`` costs 25-60 ms to import).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from .keys import KernelTuningKey

__all__ = ["ENVIRONMENT_FIELDS", "distribution_version", "environment", "identity", "stale_fields"]

#: The fields of an identity other than the key's library version and the kernel's revision.
ENVIRONMENT_FIELDS = ("numpy", "blas", "numba")
UNKNOWN = "unknown"


@functools.cache
def distribution_version(name: str) -> str:
    """The installed version of distribution ``name`` (``onnx_light``, ``numba``), or
    ``"unknown"``: the imported module's ``__version__``, else the ``.dist-info`` (or
    ``.egg-info``) folder name on ``sys.path``."""
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None)
    if isinstance(version, str) and version:
        return version
    pattern = re.compile(rf"^{re.escape(name.replace('-', '_'))}-([^-]+?)\.(dist|egg)-info$",
                         re.IGNORECASE)
    for folder in sys.path:
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        for entry in names:
            found = pattern.match(entry)
            if found:
                return found.group(1)
    return UNKNOWN


@functools.cache
def _blas() -> str:
    """The BLAS numpy was built with, as ``name version`` (from numpy's build record)."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', UNKNOWN)} {blas.get('version', UNKNOWN)}"
    except Exception:  # numpy < 1.26, or a build without the record: say so, never fail
        return UNKNOWN


def environment() -> dict[str, str]:
    """numpy's, its BLAS's and numba's versions in this process."""
    return {"numpy": np.__version__, "blas": _blas(), "numba": distribution_version("numba")}


def identity(key: KernelTuningKey, revision: int) -> dict[str, Any]:
    """What a result for ``key`` measured now depends on: the key's library version
    (``{"onnx_light": "0.1.0"}``), the kernel's ``revision`` and :func:`environment`."""
    return {key.library: distribution_version(key.library), "revision": revision, **environment()}


def stale_fields(recorded: Mapping[str, Any] | None, current: Mapping[str, Any]) -> list[str]:
    """``"field recorded (now current)"`` for each field of ``current`` that ``recorded``
    differs in; a missing record is stale in every field."""
    if recorded is None:
        return [f"{name} not recorded (now {value})" for name, value in current.items()]
    return [f"{name} {recorded.get(name, 'not recorded')} (now {value})"
            for name, value in current.items() if recorded.get(name) != value]
