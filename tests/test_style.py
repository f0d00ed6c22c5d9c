"""The code base stays ruff clean (the linter is part of the test extras), and the tools
under ``tools/`` stand on their own: they import nothing from ``tests/``."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_clean() -> None:
    # ruff is a test dependency: run through this interpreter, found whether or not the
    # venv's bin folder is on PATH
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "onnx_light", "tests", "benchmarks", "tools", "docs",
         "examples"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


_TOOL_IMPORTS = """
import json, runpy, sys
tool = sys.argv[1]
sys.path.insert(0, sys.argv[2])  # as running the script does
sys.argv = [tool, "--help"]
try:
    runpy.run_path(tool, run_name="__main__")
except SystemExit as exc:
    status = exc.code
print(json.dumps({"status": status, "files": sorted(
    str(m.__file__) for m in list(sys.modules.values()) if getattr(m, "__file__", None))}))
"""


# The benchmark-only extra's packages: a tool that exports with them needs `.[zoo]`.
ZOO_MODULES = ("torch", "torchvision", "transformers")


@pytest.mark.parametrize("tool", sorted(p.name for p in (ROOT / "tools").glob("[!_]*.py")))
def test_tools_import_nothing_from_tests(tool: str) -> None:
    done = subprocess.run([sys.executable, "-c", _TOOL_IMPORTS, str(ROOT / "tools" / tool),
                           str(ROOT / "tools")], cwd=ROOT / "tools", capture_output=True, text=True,
                          timeout=120, check=False)
    missing = [m for m in ZOO_MODULES if f"No module named '{m}'" in done.stderr]
    if missing and importlib.util.find_spec(missing[0]) is None:
        pytest.skip(f"{tool} needs the zoo extra ({missing[0]} is not installed)")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] in (0, None)
    tests = str(ROOT / "tests")
    assert [f for f in report["files"] if f.startswith(tests)] == []
