"""A session's first run compiles nothing and loads no compiled code: construction does it,
for the argument types the runs pass (tests/first_run_models.py's patterns, at 1 and 2
threads, in a fresh process so that no dispatcher this process compiled can hide it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def test_a_first_run_neither_compiles_nor_loads_compiled_code() -> None:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TESTS.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, str(TESTS / "first_run_models.py")], capture_output=True,
                          text=True, timeout=900, env=environment, cwd=TESTS.parent)
    assert done.returncode == 0, done.stderr[-4000:]
    moved = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(moved) == 14
    assert {name: seconds for name, seconds in moved.items() if seconds} == {}
