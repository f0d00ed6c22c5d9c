"""Test settings: never touch the user's real kernel tuning cache; the one fixture that
isolates a test from the process-wide tuning state."""

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import pytest

# The harnesses the tests share with tools/ (tools/_*.py, tools/cache_contention.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

# scikit-learn (the test extra) brings scipy, whose own OpenBLAS numba loads when it compiles
# a first kernel: loaded here, before any test, every test sees the same BLAS libraries (the
# BLAS thread controller lists them once; threadpoolctl lists them on every call).
with contextlib.suppress(ImportError):
    import scipy.linalg  # noqa: F401

# Set before onnx_light is imported anywhere, so the import-time load reads an empty location.
os.environ["ONNX_LIGHT_KERNEL_TUNING_CACHE"] = os.path.join(
    tempfile.mkdtemp(prefix="onnx_light-tests-"), "kernel-tuning-cache.txt"
)
# Without the shipped processor profiles and an organisation's folder, the portable defaults
# apply on every processor the suite runs on; tests/test_profile_files.py loads them itself.
os.environ["ONNX_LIGHT_SHIPPED_PROFILES"] = "0"
os.environ.pop("ONNX_LIGHT_KERNEL_PROFILES", None)


@pytest.fixture
def isolated_tuning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh default cache path (absent: ``tmp_path/default/kernel-tuning-cache.txt``,
    yielded) and no published profile of the process-wide registry leaking in or out.

    Files whose tests publish or read the default cache use it with
    ``pytestmark = pytest.mark.usefixtures("isolated_tuning")``.
    """
    from onnx_light.tuning.cache import CACHE_ENV
    from onnx_light.tuning.registry import default_registry

    default_cache = tmp_path / "default" / "kernel-tuning-cache.txt"
    monkeypatch.setenv(CACHE_ENV, str(default_cache))
    default_registry().forget()
    yield default_cache
    default_registry().forget()


def pytest_collection_modifyitems(config, items):
    """Keep only the ONNX backend tests that test_backend.py selects (the runner lists all)."""
    kept, dropped = [], []
    for item in items:
        selected = getattr(item.module, "SELECTED_BACKEND_TESTS", None)
        if selected is not None and "OnnxBackend" in item.nodeid and item.name not in selected:
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print how many of ONNX's backend node tests onnx_light passes."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for outcome in counts:
        for report in terminalreporter.stats.get(outcome, []):
            if "OnnxBackend" in report.nodeid and report.when in ("call", "setup"):
                counts[outcome] += 1
    total = sum(counts.values())
    if total:
        terminalreporter.write_line(
            f"ONNX backend node tests: {counts['passed']}/{total} passed "
            f"({counts['failed']} failed, {counts['skipped']} skipped)"
        )
