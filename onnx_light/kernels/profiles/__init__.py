"""The library's shipped processor profiles, kept as data, and an organisation's.

Each ``*.json`` file of this folder holds the profiles measured on one machine
(:mod:`onnx_light.tuning.profile_files` has the format; ``docs/kernel-tuning.md`` says which
processors are covered and how to add one). :func:`register_profiles` registers them, then
the files of the folders ``$ONNX_LIGHT_KERNEL_PROFILES`` names (an organisation's, like
FFTW's system wisdom), whose profiles outrank shipped ones of equal specificity. The user's
cache is published on top of both. ``ONNX_LIGHT_SHIPPED_PROFILES=0`` leaves the shipped ones
out (the portable defaults then apply wherever nothing else does: the test suite runs so, its
results the same on every processor). A problem with a file is logged and skips what it
concerns; it never stops the import.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ...tuning.profile_files import (
    ORGANISATION_PRIORITY,
    ProfileFileError,
    organisation_profile_paths,
    read_profile_text,
    register_profile_files,
)
from ...tuning.registry import KernelTuningRegistry

__all__ = ["SHIPPED_ENV", "last_reports", "register_profiles", "shipped_profile_paths"]

SHIPPED_ENV = "ONNX_LIGHT_SHIPPED_PROFILES"

logger = logging.getLogger("onnx_light")
_LAST: list[dict[str, Any]] = []


def shipped_profile_paths() -> list[Path]:
    """The profile files shipped with the library, in name order (none when
    ``$ONNX_LIGHT_SHIPPED_PROFILES`` is ``0``)."""
    if os.environ.get(SHIPPED_ENV, "").strip() == "0":
        return []
    return sorted(Path(__file__).parent.glob("*.json"))


def register_profiles(registry: KernelTuningRegistry) -> list[dict[str, Any]]:
    """Register the shipped profiles, then the organisation's; returns one report per file
    (:func:`~onnx_light.tuning.profile_files.register_profile_files`) with its ``source``
    (``shipped`` or ``organisation``), and logs each problem."""
    reports = []
    for source, paths, priority in (("shipped", shipped_profile_paths(), 0),
                                    ("organisation", organisation_profile_paths(),
                                     ORGANISATION_PRIORITY)):
        for path in paths:
            try:
                files = [(str(path), read_profile_text(path))]
            except ProfileFileError as exc:
                reports.append({"file": str(path), "registered": 0, "skipped": [],
                                "error": str(exc), "source": source})
                continue
            reports += [{**report, "source": source}
                        for report in register_profile_files(registry, files, priority=priority,
                                                               source=source)]
    for report in reports:
        if report["error"]:
            logger.warning("processor profiles not loaded: %s", report["error"])
        for skipped in report["skipped"]:  # another library's keys are expected in a shared folder
            logger.log(logging.WARNING if skipped["outcome"] == "stale" else logging.INFO,
                       "processor profile %s (%s) not loaded: %s: %s", skipped["profile"],
                       skipped["key"], skipped["outcome"], skipped["reason"])
    _LAST[:] = reports
    return reports


def last_reports() -> list[dict[str, Any]]:
    """The reports of the last :func:`register_profiles` (at import: the default registry's)."""
    return list(_LAST)
