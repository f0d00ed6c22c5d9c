"""The kernel tuning cache's inter-process lock: a blocking ``flock`` on ``<cache>.lock``.

Waiters block in the kernel instead of polling, so a writer that releases the lock and
asks for it again at once does not starve the others (with filelock's 50 ms polling one
writer re-acquired it for about 100 updates in a row). The holder writes its process id
into the lock file, so that a writer that times out can say who holds the lock. The
kernel releases an ``flock`` when its holder dies: a killed writer leaves no stale lock.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CacheLockTimeout", "cache_lock", "lock_path"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class CacheLockTimeout(TimeoutError):
    """Another process held the cache's lock for longer than the timeout."""


def lock_path(cache: Path) -> Path:
    """The lock file of ``cache``."""
    return Path(str(cache) + ".lock")


@contextlib.contextmanager
def cache_lock(cache: Path, timeout: float) -> Iterator[None]:
    """Hold the lock of ``cache`` for the block; :class:`CacheLockTimeout` after ``timeout``
    seconds, naming the cache, the holder's process and what to do.

    Creates the cache's folder and lock file (never through a symbolic link); a location
    that cannot hold them raises ``OSError`` naming the cache at once.
    """
    if os.name != "posix":  # no flock: filelock's portable lock, without the holder's name
        import filelock  # imported when needed: it pulls in asyncio

        _open_lock_file(cache)
        with filelock.FileLock(str(lock_path(cache)), timeout=timeout):
            yield
        return
    fd = _open_lock_file(cache)
    try:
        if not _acquire(fd, timeout):
            raise CacheLockTimeout(_timeout_message(cache, fd, timeout))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock


def _open_lock_file(cache: Path) -> int:
    lock = lock_path(cache)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        return os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o644)
    except OSError as exc:
        raise OSError(exc.errno, f"kernel tuning cache {cache} cannot be written "
                                 f"({exc.strerror}: {exc.filename})") from None


def _acquire(fd: int, timeout: float) -> bool:
    """Take the flock of ``fd`` within ``timeout`` seconds, waiting in the kernel.

    ``flock`` has no timeout, so a helper thread blocks on a duplicate of ``fd`` (the same
    open file description, hence the same lock). If the caller gives up first, the thread
    releases the lock as soon as it gets it, by closing the last descriptor.
    """
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    waiter = os.dup(fd)
    finished = threading.Event()
    guard = threading.Lock()
    state = {"abandoned": False, "locked": False}

    def wait() -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(waiter, fcntl.LOCK_EX)
            state["locked"] = True
        with guard:
            if state["abandoned"] or not state["locked"]:
                os.close(waiter)
            finished.set()

    threading.Thread(target=wait, name="kernel-tuning-cache-lock", daemon=True).start()
    finished.wait(timeout)
    with guard:
        if not finished.is_set():
            state["abandoned"] = True
            return False
    if state["locked"]:
        os.close(waiter)
    return state["locked"]


def _timeout_message(cache: Path, fd: int, timeout: float) -> str:
    holder = _holder(fd)
    who = f"process {holder[0]} ({holder[1]})" if holder else "another process"
    advice = (f"resume it (kill -CONT {holder[0]}) or end it" if holder and holder[1] == "stopped"
              else "wait for it to finish or end it")
    return (f"kernel tuning cache {cache} is locked by {who}: waited {timeout:g} s for "
            f"{lock_path(cache)}; {advice}, or pass another cache path")


def _holder(fd: int) -> tuple[int, str] | None:
    """The process id written by the lock's holder and its state, if it can be read."""
    try:
        pid = int(os.pread(fd, 32, 0).decode("ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return pid, "running"
    return pid, {b"T": "stopped", b"t": "stopped by a debugger", b"Z": "exiting"}.get(
        state, "running")
