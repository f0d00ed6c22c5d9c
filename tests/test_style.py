"""The code base stays ruff clean (the linter is part of the test extras)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_clean() -> None:
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "onnx_light", "tests", "benchmarks", "tools", "docs",
         "examples"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
