"""Waiting for a forked child that reports by its exit status (the pool's fork tests)."""

from __future__ import annotations

import os
import time

import pytest


def assert_child_succeeds(pid: int, seconds: float = 8.0) -> None:
    """Wait for child ``pid`` to exit with status 0; kill it and fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("forked child hung")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
