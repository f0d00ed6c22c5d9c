"""The host's small text files, read in one place (tests replace :func:`read_text`)."""

from __future__ import annotations

__all__ = ["read_optional", "read_text"]


def read_text(path: str) -> str:
    """Read a small text file; OSError when it cannot be read."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def read_optional(path: str) -> str | None:
    """The text of ``path``, or None when it cannot be read (a missing cgroup file)."""
    try:
        return read_text(path)
    except OSError:
        return None
