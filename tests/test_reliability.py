"""Reliability and security of the kernel tuning cache and of model loading (issue 7).

* corruption: mutated cache files never stop an import, a load or a session, and every
  untouched entry still loads (hypothesis over the mutations of tools/_cache_fuzzing.py);
* concurrency: writer and reader processes on one file lose no update and read no partial file;
* crash safety: writers killed with SIGKILL leave the old or the new file and no held lock;
* calibration under faults: a callback that raises, exceeds its memory budget, ignores its
  duration budget or returns something else publishes nothing and leaves the cache as it was;
* security: the cache is data only; temporary, backup and lock files never follow a planted
  symbolic link; files are not writable by other users; a cache others may change is
  reported; model external data cannot escape the model's folder.

The larger runs are ``tools/cache_fuzz.py``, ``tools/cache_stress.py`` and
``tools/model_fuzz.py`` (figures in ``docs/reliability.md``).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import multiprocessing
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cache_contention  # the harnesses of tools/ (on sys.path: conftest.py), shared with the tools
import numpy as np
import onnx
import pytest
from _cache_fuzzing import MUTATIONS, cache_bytes, check_cache_file, corpus_lines, mutate
from _cache_processes import kill_writers, lock_holder, lock_is_free, run_stress
from _small_model import check_small_session, small_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import onnx_light
from onnx_light import RuntimeSession
from onnx_light.cli import main
from onnx_light.tuning import api, cache_format, default_registry
from onnx_light.tuning import cache as cache_module
from onnx_light.tuning.cache import (
    CACHE_ENV,
    HEADER,
    CacheEntry,
    CacheStatus,
    read_cache,
    update_cache,
)
from onnx_light.tuning.calibration import CalibrationResult, crossover_search
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.processor import CpuExecutionDescriptor, execution_descriptor
from onnx_light.tuning.schema import KernelTuningSchema, Parameter

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "tools"
MIN = "parallel.minimum_elements"


pytestmark = pytest.mark.usefixtures("isolated_tuning")


@pytest.fixture(scope="module")
def corpus() -> tuple[bytes, list[str]]:
    lines, good = corpus_lines(execution_descriptor())
    return cache_bytes(lines), good


def snapshot_folder(folder: Path) -> dict[str, bytes | str]:
    """Every entry of a folder: file bytes, or where a symbolic link points."""
    found: dict[str, bytes | str] = {}
    for item in sorted(folder.iterdir()):
        if item.is_symlink():
            found[item.name] = "-> " + os.readlink(item)
        elif item.is_file():
            found[item.name] = item.read_bytes()
        else:
            found[item.name] = "<dir>"
    return found


# --------------------------------------------------------------------------------------------
# Corruption
# --------------------------------------------------------------------------------------------


def test_the_corpus_loads_completely_and_drives_the_session(tmp_path: Path, corpus) -> None:
    """The oracle's premise: unmutated, every good line loads and the session uses them."""
    data, good = corpus
    path = tmp_path / "cache.txt"
    path.write_bytes(data)
    assert check_cache_file(path, good) == []
    report = onnx_light.load_kernel_tuning_cache(path, num_threads=2)
    assert report["loaded"] == len(good) == 12
    assert sorted(e["outcome"] for e in report["entries"]).count("loaded") == 12
    # fuse=False: the report lists the steps that run, and fusion would make Add + Relu one
    # (untunable) ChannelAffine step
    session = RuntimeSession(onnx.load_from_string(_small_model_bytes()), num_threads=2,
                             fuse=False)
    assert {r["node"]: r["source"] for r in session.tuning_report()} == {
        "add": "published_profile", "relu": "published_profile", "matmul": "published_profile"}


def _small_model_bytes() -> bytes:
    return small_model().SerializeToString()


MUTATION_LISTS = st.lists(st.tuples(st.sampled_from(sorted(MUTATIONS)),
                                    st.integers(min_value=0, max_value=2**32 - 1)),
                          min_size=1, max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations=MUTATION_LISTS)
def test_mutated_caches_never_break_load_or_session(corpus, mutations) -> None:
    data, good = corpus
    for kind, seed in mutations:
        data, _ = mutate(data, seed, kinds=[kind])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cache.txt"
        path.write_bytes(data)
        assert check_cache_file(path, good) == [], mutations


def _descriptor_line(good: list[str], text: str) -> str:
    """A good line whose descriptor holds ``text`` as a value (invalid JSON numbers)."""
    return good[0].replace('"num_threads":1', '"num_threads":' + text)


@pytest.mark.parametrize("case", [
    "inf in descriptor", "-inf in descriptor", "NaN in descriptor", "huge int in descriptor",
    "huge key ABI", "pickle line", "every line truncated", "header only", "BOM before header",
    "header of another program", "version 3", "non-UTF-8 header", "duplicate with later invalid",
])
def test_named_corruptions(tmp_path: Path, corpus, case: str) -> None:
    data, good = corpus
    lines = data.split(b"\n")
    if case.endswith("in descriptor"):
        value = {"inf": "1e400", "-inf": "-1e400", "NaN": "NaN", "huge int": "9" * 5000}[
            case.split(" in ")[0]]
        lines.insert(3, _descriptor_line(good, value).encode())
    elif case == "huge key ABI":
        lines.insert(3, good[0].replace("@cpu#1", "@cpu#" + "9" * 5000).encode())
    elif case == "pickle line":
        lines.insert(3, pickle.dumps(json.loads(good[0])).replace(b"\n", b" "))
    elif case == "every line truncated":
        lines = [lines[0]] + [line[: len(line) // 2] for line in lines[1:]]
    elif case == "header only":
        lines = [HEADER.encode()]
    elif case == "BOM before header":
        lines[0] = b"\xef\xbb\xbf" + lines[0]
    elif case == "header of another program":
        lines[0] = b"SQLite format 3\x00"
    elif case == "version 3":
        lines[0] = b"onnx_light-kernel-tuning-cache 3"
    elif case == "non-UTF-8 header":
        lines[0] += b"\xff"
    elif case == "duplicate with later invalid":
        lines.append(good[0].replace(f'"{MIN}":2', f'"{MIN}":0').encode())
    path = tmp_path / "cache.txt"
    path.write_bytes(b"\n".join(lines))
    assert check_cache_file(path, good) == []
    report = onnx_light.load_kernel_tuning_cache(path, num_threads=2)
    if case.endswith("in descriptor") or case in ("huge key ABI", "pickle line"):
        assert report["loaded"] == 12  # one bad line costs that line only
        assert any(":4: " in d for d in report["diagnostics"]), report["diagnostics"]
    if case == "duplicate with later invalid":  # the later line wins, even when it is invalid
        assert [e["outcome"] for e in report["entries"] if e["line"] in (2, len(lines))] == [
            "duplicate", "invalid"]


@pytest.mark.parametrize("kind", ["directory", "dangling symlink", "symlink loop", "fifo",
                                  "socket", "symlink to a valid cache", "symlink to /dev/zero"])
def test_something_else_where_the_file_should_be(tmp_path: Path, corpus, kind: str) -> None:
    data, good = corpus
    path = tmp_path / "cache.txt"
    if kind == "directory":
        path.mkdir()
    elif kind == "dangling symlink":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "symlink loop":
        path.symlink_to(path)
    elif kind == "fifo":
        os.mkfifo(path)  # opening it for reading would block forever
    elif kind == "socket":
        import socket

        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    elif kind == "symlink to a valid cache":
        (tmp_path / "real.txt").write_bytes(data)
        path.symlink_to(tmp_path / "real.txt")
    else:
        path.symlink_to("/dev/zero")
    if kind != "symlink to a valid cache":  # the oracle follows links; the loader does not
        assert check_cache_file(path, good) == []
    report = onnx_light.load_kernel_tuning_cache(path, num_threads=2)
    assert report["status"] == "unreadable"
    assert len(report["diagnostics"]) == 1 and str(path) in report["diagnostics"][0]
    if "symlink" in kind:
        assert "a symbolic link" in report["diagnostics"][0]


_IMPORT_CHECK = """
import json, logging
messages = []

class Collect(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())

logging.getLogger("onnx_light").addHandler(Collect())
import onnx_light
import _small_model
print(json.dumps({"messages": messages, "session": _small_model.check_small_session(2)}))
"""


def _import_with(path: Path) -> dict[str, Any]:
    environment = {**os.environ, CACHE_ENV: str(path), "PYTHONPATH": str(TOOLS)}
    done = subprocess.run([sys.executable, "-c", _IMPORT_CHECK], env=environment, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["inf in a descriptor", "fifo", "truncated and non-UTF-8",
                                  "writable by other users"])
def test_import_succeeds_and_sessions_are_correct(tmp_path: Path, corpus, kind: str) -> None:
    data, good = corpus
    path = tmp_path / "cache.txt"
    if kind == "inf in a descriptor":
        path.write_bytes(data + _descriptor_line(good, "1e400").encode() + b"\n")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "truncated and non-UTF-8":
        path.write_bytes(data[: len(data) // 2] + b"\xff\xfe garbage")
    else:
        path.write_bytes(data)
        path.chmod(0o666)
    seen = _import_with(path)
    assert seen["session"] is None
    warnings = [m for m in seen["messages"] if "kernel tuning cache" in m]
    assert len(warnings) == 1 and str(path) in warnings[0]
    if kind == "writable by other users":
        assert "writable by other users" in warnings[0]


# --------------------------------------------------------------------------------------------
# Concurrency and crashes
# --------------------------------------------------------------------------------------------


def test_concurrent_writers_and_readers_lose_nothing(tmp_path: Path) -> None:
    result = run_stress(tmp_path / "cache.txt", writers=3, updates=8, readers=2, timeout=240)
    assert result["problems"] == []
    assert result["losses"] == 0
    assert result["updates"] == 24 and result["shared_updates"] == 12
    assert result["entries"] == 3 * 4 + 1  # every writer's own identities, plus the shared one
    assert result["keys"] == 4  # Add, Relu, Abs and Sub
    assert result["reads"] >= 2


@contextlib.contextmanager
def child_holding_the_lock(path: Path) -> Iterator[multiprocessing.Process]:
    """A child process that has taken the cache's lock (and holds it until killed); killed
    and joined on leaving."""
    context = multiprocessing.get_context("spawn")
    held = context.Value("b", 0, lock=False)
    holder = context.Process(target=lock_holder, args=(str(path), held))
    holder.start()
    try:
        deadline = time.monotonic() + 60
        while not held.value and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held.value
        yield holder
    finally:
        if holder.is_alive():
            holder.kill()
        holder.join(timeout=30)


def test_the_lock_is_an_flock_the_kernel_releases_when_its_holder_dies(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [])
    lock = Path(str(path) + ".lock")
    with child_holding_the_lock(path) as holder:
        assert not lock_is_free(lock)
        inode = lock.stat().st_ino
        flocks = [line for line in Path("/proc/locks").read_text().splitlines()
                  if "FLOCK" in line and line.split()[5].endswith(f":{inode}")]
        assert len(flocks) == 1 and f" {holder.pid} " in flocks[0], flocks
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(timeout=30)
    assert lock_is_free(lock)  # released by the kernel, at once: no stale lock
    started = time.monotonic()
    update_cache(path, [CacheEntry(KernelTuningKey("reltest", "After", "portable", "float"),
                                   execution_descriptor(1), {"v": 1})])
    assert time.monotonic() - started < 5


def test_writers_killed_at_random_moments_leave_a_complete_file(tmp_path: Path) -> None:
    result = kill_writers(tmp_path / "cache.txt", kills=20, padding=300, window_s=None, seed=7)
    assert result["problems"] == []
    assert result["kills"] == 20
    assert result["old"] + result["new"] == 20
    assert result["lock_held_after_kill"] == 0
    assert result["final_update_seconds"] < 5


def test_temporaries_of_killed_writers_are_removed_by_the_next_update(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    stale = [tmp_path / ".cache.txt.abcd1234.tmp", tmp_path / ".cache.txt.zz_9zz_9.tmp"]
    for file in stale:
        file.write_text("half a cache")
    unrelated = [tmp_path / ".cache.txt.keep.tmp", tmp_path / ".other.txt.abcd1234.tmp",
                 tmp_path / "cache.txt.abcd1234.tmp"]
    for file in unrelated:
        file.write_text("not ours")
    update_cache(path, [CacheEntry(KernelTuningKey("reltest", "T", "portable", "float"),
                                   execution_descriptor(1), {"v": 1})])
    assert not any(file.exists() for file in stale)
    assert all(file.read_text() == "not ours" for file in unrelated)


# --------------------------------------------------------------------------------------------
# Contention, hostile and careless files (issue 14)
# --------------------------------------------------------------------------------------------

GEMM_FLOPS, GEMM_ROWS = "parallel.minimum_flops", "split.minimum_rows"
GEMM = KernelTuningKey("onnx_light", "Gemm", "portable", "float", tuning_abi=2)


def test_concurrent_partial_updates_of_parameters_and_keys_lose_nothing(tmp_path: Path) -> None:
    """Four writers: both parameters of Gemm and of MatMul, each updated by its own process."""
    result = cache_contention.run_partial_updates(tmp_path / "cache.txt", writers=4, updates=12,
                                                  timeout=240)
    assert result["problems"] == []
    assert (result["lost"], result["completed"], result["keys"]) == (0, 48, 2)


def test_a_partial_update_merges_with_the_file_as_it_is_under_the_lock(
        tmp_path: Path, monkeypatch) -> None:
    """Another process updates Gemm's other parameter after this update began: the update,
    merged under the lock, keeps it (it used to start from the values read before)."""
    path = tmp_path / "cache.txt"
    onnx_light.set_kernel_tuning_parameters("Gemm", "float", {GEMM_ROWS: 11}, path=path,
                                            num_threads=2)
    real_update = cache_module.update_cache

    def another_process_first(target, entries, remove=()):
        monkeypatch.setattr(cache_module, "update_cache", real_update)
        local = execution_descriptor(2)
        values = dict(api._cached_profiles(target, default_registry().snapshot(), local)[1][GEMM].values)
        real_update(target, [CacheEntry(GEMM, local, {**values, GEMM_ROWS: 22}, {"origin": "manual"})])
        return real_update(target, entries, remove)

    monkeypatch.setattr(cache_module, "update_cache", another_process_first)
    result = onnx_light.set_kernel_tuning_parameters("Gemm", "float", {GEMM_FLOPS: 3333},
                                                     path=path, num_threads=2)
    cached = onnx_light.kernel_tuning_parameters("Gemm", "float", path=path,
                                                 num_threads=2)[0]["cached_values"]
    assert (cached[GEMM_FLOPS], cached[GEMM_ROWS]) == (3333, 22)
    assert result["values"][GEMM_ROWS] == 22 and result["previous"][GEMM_ROWS] == 22


def test_a_stopped_lock_holder_gives_an_error_naming_the_cache_and_the_process(
        tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "cache.txt"
    with child_holding_the_lock(path) as holder:
        os.kill(holder.pid, signal.SIGSTOP)
        monkeypatch.setattr(cache_module, "LOCK_TIMEOUT_S", 0.5)
        with pytest.raises(TimeoutError) as info:
            onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path,
                                                    num_threads=2)
    message = str(info.value)
    assert f"kernel tuning cache {path} is locked by process {holder.pid} (stopped)" in message
    assert f"kill -CONT {holder.pid}" in message and "0.5 s" in message
    assert not path.exists()
    monkeypatch.undo()
    onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path, num_threads=2)
    assert read_cache(path).status == CacheStatus.OK  # the kernel released the killed holder's lock


@pytest.mark.parametrize("target", ["a private file", "/proc/self/environ", "a valid cache"])
def test_a_symlink_at_the_cache_path_is_never_followed(tmp_path: Path, corpus, target: str) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_bytes(corpus[0] if target == "a valid cache" else b"SECRET\n")
    secret.chmod(0o600)
    path = folder / "cache.txt"
    path.symlink_to("/proc/self/environ" if target == "/proc/self/environ" else secret)
    report = onnx_light.load_kernel_tuning_cache(path, num_threads=2)
    assert report["status"] == "unreadable" and report["loaded"] == 0
    assert report["diagnostics"] == [f"{path}: a symbolic link (to {os.readlink(path)}); the "
                                     "cache must be a regular file: not followed"]
    with pytest.raises(OSError, match="is a symbolic link") as info:
        onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path,
                                                num_threads=2)
    assert info.value.errno == errno.ELOOP and str(path) in str(info.value)
    assert sorted(p.name for p in folder.iterdir()) == ["cache.txt"]  # no backup, no lock
    assert secret.stat().st_mode & 0o777 == 0o600 and path.is_symlink()


def update_under_umask_zero(path: Path) -> dict[str, Any]:
    """One update of ``path`` with the umask cleared, so that only onnx_light limits modes."""
    previous = os.umask(0)
    try:
        return onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path,
                                                       num_threads=2)
    finally:
        os.umask(previous)


@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_a_backup_is_never_more_readable_than_the_damaged_file(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "cache.txt"
    path.write_text(HEADER + "\na damaged line\n")
    path.chmod(mode)
    result = update_under_umask_zero(path)
    backup = Path(result["cache_update"]["backup"])
    assert backup.read_text() == HEADER + "\na damaged line\n"
    assert backup.stat().st_mode & 0o777 == mode
    assert path.stat().st_mode & 0o777 == mode


def test_comment_lines_survive_updates_in_place(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    local = execution_descriptor(2)
    old = CacheEntry(KernelTuningKey("reltest", "Old", "portable", "float"), local, {"v": 1})
    path.write_text("\n".join([HEADER, "# keep me", old.to_line(), "  # and me, indented", ""]))
    onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path, num_threads=2)
    lines = path.read_text().splitlines()
    assert lines[:4] == [HEADER, "# keep me", old.to_line(), "# and me, indented"]
    assert len(lines) == 5 and '"parallel.minimum_elements":5' in lines[4]
    update_cache(path, [], remove=[old.identity()])
    assert path.read_text().splitlines()[:3] == [HEADER, "# keep me", "# and me, indented"]
    assert "backup" not in str(sorted(p.name for p in tmp_path.iterdir()))


@pytest.mark.parametrize("existing", [None, 0o600, 0o640, 0o644])
def test_an_update_keeps_the_mode_and_a_new_file_follows_the_umask(tmp_path: Path,
                                                                  existing: int | None) -> None:
    path = tmp_path / "cache.txt"
    if existing is not None:
        path.write_text(HEADER + "\n")
        path.chmod(existing)
    previous = os.umask(0o077)
    try:
        onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path, num_threads=2)
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == (0o600 if existing is None else existing)


def test_a_read_only_cache_is_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    path.write_text(HEADER + "\n")
    path.chmod(0o444)
    with pytest.raises(PermissionError) as info:
        onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path, num_threads=2)
    assert str(info.value).endswith(
        f"kernel tuning cache {path} is read-only (mode 444), so it is not replaced: make it "
        f"writable (chmod u+w {path}) to update it, or pass another path")
    assert path.read_text() == HEADER + "\n" and path.stat().st_mode & 0o777 == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.txt", "cache.txt.lock"]


@pytest.mark.parametrize("kind", ["another user's file", "a FIFO"])
def test_a_cache_that_is_not_a_regular_file_of_ours_is_not_replaced(tmp_path: Path, monkeypatch,
                                                                   kind: str) -> None:
    path = tmp_path / "cache.txt"
    if kind == "a FIFO":
        os.mkfifo(path)
        expected = (OSError, f"kernel tuning cache {path} exists and is not a regular file")
    else:
        path.write_text(HEADER + "\n")
        owner = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
        expected = (PermissionError, f"kernel tuning cache {path} belongs to another user "
                                     f"(uid {owner}), so it is not replaced: pass a path of your own")
    with pytest.raises(expected[0]) as info:
        onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path, num_threads=2)
    assert str(info.value).endswith(expected[1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.txt"]


def test_a_failed_rename_names_the_cache_not_the_temporary(tmp_path: Path, monkeypatch) -> None:
    """As when the cache or its folder is immutable (chattr +i)."""
    path = tmp_path / "cache.txt"
    path.write_text(HEADER + "\n")

    def immutable(source, destination):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(source), None,
                              str(destination))

    monkeypatch.setattr(os, "replace", immutable)
    with pytest.raises(PermissionError) as info:
        onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path, num_threads=2)
    assert str(info.value) == (f"[Errno 1] kernel tuning cache {path} cannot be written "
                               "(Operation not permitted)")
    assert ".tmp" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.txt", "cache.txt.lock"]


_FILE_SIZE_LIMIT = """
import resource, signal, sys
import onnx_light
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
try:
    onnx_light.set_kernel_tuning_parameters("Add", "float", {"parallel.minimum_elements": 5},
                                            path=sys.argv[1], num_threads=2)
except OSError as exc:
    print(type(exc).__name__, exc.errno, exc)
"""


def test_a_file_too_large_names_the_cache(tmp_path: Path) -> None:
    """A write past ``RLIMIT_FSIZE`` fails with EFBIG, as a full disk fails with ENOSPC."""
    path = tmp_path / "cache.txt"
    done = subprocess.run([sys.executable, "-c", _FILE_SIZE_LIMIT, str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"OSError {errno.EFBIG} [Errno {errno.EFBIG}] kernel tuning "
                                   f"cache {path} cannot be written (File too large)")
    assert not path.exists() and not list(tmp_path.glob(".*.tmp"))


_HUGE_CACHE = """
import json, logging, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
messages = []

class Collect(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())

logging.getLogger("onnx_light").addHandler(Collect())
import onnx_light
report = onnx_light.load_kernel_tuning_cache(num_threads=2)
inspected = onnx_light.inspect_kernel_tuning_cache(num_threads=2)
print(json.dumps({"messages": messages, "loaded": report["loaded"], "counts": report["counts"],
                  "entries": len(report["entries"]), "diagnostics": report["diagnostics"],
                  "profiles": len(inspected["profiles"]), "inspect_counts": inspected["counts"],
                  "inspect_diagnostics": len(inspected["diagnostics"])}))
"""


def test_millions_of_short_damaged_lines_cost_little_and_the_valid_entries_load(
        tmp_path: Path) -> None:
    """2,000,000 lines of ``{}`` (6 MB) between two valid entries, loaded at import in a
    process limited to 1.5 GiB of address space (it used to take 1.5 GB and 30 s)."""
    path = tmp_path / "cache.txt"
    local = execution_descriptor(2)
    first, last = (CacheEntry(KernelTuningKey("onnx_light", "Add", "portable", "float"),
                              execution_descriptor(threads), {MIN: 4096}, {"origin": "manual"})
                   for threads in (1, 2))
    assert local == last.descriptor
    path.write_text(HEADER + "\n" + first.to_line() + "\n" + "{}\n" * 2_000_000
                    + last.to_line() + "\n")
    environment = {**os.environ, CACHE_ENV: str(path)}
    done = subprocess.run([sys.executable, "-c", _HUGE_CACHE], env=environment, cwd=ROOT,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout)
    assert seen["loaded"] == 2
    assert seen["counts"] == seen["inspect_counts"] == {"invalid": 2_000_000, "loaded": 2}
    assert seen["entries"] == seen["profiles"] == 102  # the loaded ones and 100 invalid
    assert len(seen["diagnostics"]) == seen["inspect_diagnostics"] == 101
    assert seen["diagnostics"][0] == f"{path}:3: needs a string 'key' and an object 'descriptor'"
    assert seen["diagnostics"][-1] == f"{path}: 1999900 more damaged lines not listed"
    assert len(seen["messages"]) == 1 and seen["messages"][0].startswith(
        f"kernel tuning cache {path} (damaged): {path}:3: needs a string 'key'")


def test_loading_validates_only_the_entries_of_this_processor(tmp_path: Path, monkeypatch) -> None:
    """3,000 entries of other processors and two of this one: two descriptors validated (it
    used to be one per entry, which made a 41 MB file of 60,000 descriptors take 13 s)."""
    local = execution_descriptor(2)
    key = KernelTuningKey("onnx_light", "Add", "portable", "float")
    lines = []
    for model in range(3000):
        where = json.loads(CacheEntry(key, local, {MIN: 4096}).to_line())
        where["descriptor"]["cpu"]["model"] = 100_000 + model
        lines.append(json.dumps(where))
    lines += [CacheEntry(key, execution_descriptor(t), {MIN: 4096}).to_line() for t in (1, 2)]
    path = tmp_path / "cache.txt"
    path.write_bytes(cache_bytes(lines))
    validated = []
    real = CpuExecutionDescriptor.from_dict.__func__
    monkeypatch.setattr(CpuExecutionDescriptor, "from_dict",
                        classmethod(lambda cls, data: validated.append(1) or real(cls, data)))
    cache_format._descriptor.cache_clear()
    report = onnx_light.load_kernel_tuning_cache(path, num_threads=2)
    assert report["loaded"] == 2 and len(validated) == 2
    assert report["counts"] == {"incompatible": 3000, "loaded": 2}
    assert report["entries"][0]["reason"] == "processor differs in cpu.model"
    assert len(report["entries"]) == 102 and len(report["diagnostics"]) == 101
    assert report["diagnostics"][-1] == f"{path}: 2900 more entries not listed (2900 incompatible)"
    inspected = onnx_light.inspect_kernel_tuning_cache(path, num_threads=2)
    assert len(inspected["profiles"]) == 102 and inspected["counts"] == report["counts"]


# --------------------------------------------------------------------------------------------
# Calibration under faults
# --------------------------------------------------------------------------------------------

LIB = "reltest"
PORTABLE = 1 << 16


class SimulatedCrossover:
    """Fake timings: the candidate has 40 us of overhead and runs at twice the speed."""

    cases = ("only",)

    def __init__(self, clock: list[float], bytes_per_element: int = 12) -> None:
        self.clock, self.bytes_per_element = clock, bytes_per_element

    def input_bytes(self, size: int, case: str) -> int:
        return self.bytes_per_element * size

    def make_inputs(self, size: int, case: str) -> int:
        return size

    def serial(self, size: int) -> int:
        self.clock[0] += size * 1e-9
        return size

    def candidate(self, size: int) -> int:
        self.clock[0] += 4e-5 + size * 5e-10
        return size

    def same_output(self, reference: int, candidate: int) -> bool:
        return reference == candidate


class OverAllocating(SimulatedCrossover):
    """Says its inputs are tiny, then allocates an exbibyte: the allocation fails."""

    def make_inputs(self, size: int, case: str) -> Any:
        return np.empty(1 << 60, dtype=np.uint8)


def _good(key: KernelTuningKey, descriptor: CpuExecutionDescriptor, budget) -> CalibrationResult:
    clock = [0.0]
    return crossover_search(key, SimulatedCrossover(clock), MIN, {MIN: PORTABLE}, budget,
                            timer=lambda: clock[0])


def _raises(key, descriptor, budget):
    raise RuntimeError("the callback blew up")


def _over_memory(key, descriptor, budget):
    clock = [0.0]
    return crossover_search(key, OverAllocating(clock, bytes_per_element=0), MIN, {MIN: PORTABLE},
                            budget, timer=lambda: clock[0])


def _ignores_duration(key, descriptor, budget):
    """Sleeps past the budget and its slack, then returns a valid result."""
    time.sleep(budget.max_duration_s + max(budget.max_duration_s, api.DURATION_SLACK_S) + 0.3)
    return _good(key, descriptor, budget)


def _slightly_late(key, descriptor, budget):
    """Overruns by less than the slack, as a search finishing its last measurement does."""
    time.sleep(budget.max_duration_s + 0.2)
    return _good(key, descriptor, budget)


def _late_for_setup(key, descriptor, budget):
    """Overruns past the slack, all of it one-off setup it reports (a cold compile cache)."""
    setup_s = budget.max_duration_s + max(budget.max_duration_s, api.DURATION_SLACK_S) + 0.3
    time.sleep(setup_s)
    result = _good(key, descriptor, budget)
    result.setup_s = setup_s
    return result


def _wrong_key(key, descriptor, budget):
    return _good(KernelTuningKey(LIB, "RelGood", "portable", key.element_type), descriptor, budget)


def _not_a_result(key, descriptor, budget):
    return {"values": {MIN: 5}}


def _bad_values(key, descriptor, budget):
    result = _good(key, descriptor, budget)
    result.values = {MIN: 0}
    return result


CALLBACKS = {"RelGood": _good, "RelRaises": _raises, "RelOverMemory": _over_memory,
             "RelIgnoresDuration": _ignores_duration, "RelSlightlyLate": _slightly_late,
             "RelLateForSetup": _late_for_setup, "RelWrongKey": _wrong_key,
             "RelNotAResult": _not_a_result, "RelBadValues": _bad_values}


def rkey(kernel: str) -> KernelTuningKey:
    return KernelTuningKey(LIB, kernel, "portable", "float")


@pytest.fixture(scope="module", autouse=True)
def _registered():
    registry = default_registry()
    if rkey("RelGood") not in registry.snapshot().schemas:
        registry.register(
            schemas=[KernelTuningSchema(rkey(k), (Parameter(MIN, "int", PORTABLE, minimum=1),))
                     for k in CALLBACKS],
            callbacks={rkey(k): callback for k, callback in CALLBACKS.items()})


def seeded(path: Path) -> dict[str, bytes | str]:
    """A cache with a Good entry for this machine, another processor's entry and a damaged
    line (so that any write would also leave a backup behind)."""
    local = execution_descriptor(2)
    update_cache(path, [CacheEntry(rkey("RelGood"), local, {MIN: 77}, {"origin": "manual"})])
    with path.open("a") as handle:
        handle.write("a damaged line\n")
    return snapshot_folder(path.parent)


FAULTS = [
    ("RelRaises", "RuntimeError: the callback blew up"),
    ("RelOverMemory", "MemoryError"),
    ("RelIgnoresDuration", "past its duration budget"),
    ("RelWrongKey", "returned a result for reltest/RelGood"),
    ("RelNotAResult", "returned dict, not a CalibrationResult"),
    ("RelBadValues", "below the minimum"),
]


@pytest.mark.parametrize(("kernel", "message"), FAULTS)
def test_a_faulty_callback_publishes_nothing_and_leaves_the_cache(tmp_path: Path, kernel: str,
                                                                  message: str) -> None:
    path = tmp_path / "cache.txt"
    before = seeded(path)
    generation = default_registry().generation
    report = onnx_light.calibrate_kernel_tuning(["RelGood", kernel], "float", library=LIB,
                                                num_threads=2, path=path, max_duration_ms=200)
    assert [f["key"] for f in report["failed"]] == [str(rkey(kernel))]
    assert message in report["failed"][0]["error"]
    assert report["calibrated"] == [] and report["cache_update"] is None
    assert default_registry().generation == generation
    assert snapshot_folder(tmp_path) == before


@pytest.mark.parametrize("kernel", ["RelRaises", "RelOverMemory", "RelWrongKey"])
def test_apply_saves_the_good_keys_only(tmp_path: Path, kernel: str) -> None:
    path = tmp_path / "cache.txt"
    proposal = onnx_light.propose_kernel_tuning_updates(["RelGood", kernel], library=LIB, path=path,
                                                        num_threads=2)
    outcome = onnx_light.apply_kernel_tuning_updates(proposal, path=path)
    assert [r["key"] for r in outcome["applied"]] == [str(rkey("RelGood"))]
    assert [f["key"] for f in outcome["failed"]] == [str(rkey(kernel))]
    assert outcome["remaining"]["missing_calibratable"] == [str(rkey(kernel))]
    keys = [line.record["key"] for line in read_cache(path).lines]
    assert keys == [str(rkey("RelGood"))]
    (record,) = onnx_light.kernel_tuning_parameters(kernel, "float", library=LIB, num_threads=2)
    assert record["active_source"] == "portable_default"


def test_a_callback_overrunning_by_less_than_the_slack_is_accepted(tmp_path: Path) -> None:
    report = onnx_light.calibrate_kernel_tuning("RelSlightlyLate", "float", library=LIB, num_threads=2,
                                                path=tmp_path / "cache.txt", max_duration_ms=100)
    assert report["failed"] == []
    assert [r["key"] for r in report["calibrated"]] == [str(rkey("RelSlightlyLate"))]


def test_one_off_setup_a_callback_reports_is_not_counted_against_its_budget(tmp_path: Path) -> None:
    """The same overrun as RelIgnoresDuration's is accepted when the result says it was setup
    (compiling kernels), which a calibration on a warm cache would not pay."""
    report = onnx_light.calibrate_kernel_tuning("RelLateForSetup", "float", library=LIB, num_threads=2,
                                                path=tmp_path / "cache.txt", max_duration_ms=100)
    assert report["failed"] == []
    assert [r["key"] for r in report["calibrated"]] == [str(rkey("RelLateForSetup"))]


def test_cli_apply_with_a_faulty_callback(tmp_path: Path, capsys) -> None:
    path = tmp_path / "cache.txt"
    before = seeded(path)
    status = main(["tune-kernels", "--kernel", "RelOverMemory", "--element-type", "float", "--cache",
                   str(path), "--threads", "2", "--apply", "--quiet"])
    assert status == 1
    assert "FAILED reltest/RelOverMemory/portable[float]" in capsys.readouterr().err
    assert snapshot_folder(tmp_path) == before


# --------------------------------------------------------------------------------------------
# Security: the cache is data only
# --------------------------------------------------------------------------------------------


class _Payload:
    """Unpickling this creates the marker file: proof that a loader unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_the_cache_is_data_only(tmp_path: Path, corpus) -> None:
    data, good = corpus
    marker = tmp_path / "executed"
    payload = pickle.dumps(_Payload(marker))
    proof = tmp_path / "proof"
    pickle.loads(pickle.dumps(_Payload(proof))).close()  # the payload does work when unpickled
    assert proof.exists()
    code = [f"__import__('pathlib').Path({str(marker)!r}).touch()".encode(),
            f"exec(\"open({str(marker)!r}, 'w')\")".encode(),
            json.dumps({"key": "evil/X/portable[float]@cpu#1", "descriptor": {},
                        "values": {}, "callback": f"open({str(marker)!r}, 'w')"}).encode()]
    path = tmp_path / "cache.txt"
    path.write_bytes(data + payload + b"\n" + b"\n".join(code) + b"\n")
    assert check_cache_file(path, good) == []
    report = onnx_light.load_kernel_tuning_cache(path, num_threads=2)
    extra = [e for e in report["entries"] if e["line"] > len(data.split(b"\n")) - 1]
    assert [e["outcome"] for e in extra] == ["invalid"] * len(extra) and len(extra) >= 3
    onnx_light.inspect_kernel_tuning_cache(path)
    onnx_light.kernel_tuning_parameters("Add", "float", path=path)
    with pytest.raises(KeyError, match="unknown kernel X"):
        onnx_light.calibrate_kernel_tuning("X", library="evil", path=path)
    _import_with(path)
    onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path, num_threads=2)
    assert read_cache(path).status == CacheStatus.OK  # the rewrite carried over entries only
    assert not marker.exists()


def test_the_tuning_core_never_evaluates_or_unpickles() -> None:
    """Static check of the promise: no eval, exec, pickle, marshal, import by name or
    yaml loading anywhere in onnx_light/tuning."""
    forbidden = re.compile(r"(?<![.\w])(eval|exec|compile)\s*\(|\b(__import__|import_module|pickle|"
                           r"marshal|shelve|yaml|dill|literal_eval)\b")
    for source in (ROOT / "onnx_light" / "tuning").glob("*.py"):
        code = "\n".join(line.split("#")[0] for line in source.read_text().splitlines())
        assert not forbidden.search(code), (source.name, forbidden.search(code))


# --------------------------------------------------------------------------------------------
# Security: temporary, backup and lock files
# --------------------------------------------------------------------------------------------


def _plant(folder: Path, outside: Path, names: list[str]) -> None:
    """Symbolic links named like the cache's temporary files, pointing outside: the first at
    an existing file, the others at files that do not exist yet."""
    (outside / "victim.txt").write_text("precious")
    for index, name in enumerate(names):
        target = outside / ("victim.txt" if index == 0 else f"new{index}.txt")
        (folder / f".cache.txt.{name}.tmp").symlink_to(target)


def test_the_temporary_file_is_created_exclusively(tmp_path: Path, monkeypatch) -> None:
    """The names of the temporary file are forced to collide with planted links: the write
    skips them (exclusive creation), never writing through them."""
    folder, outside = tmp_path / "cache", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    planted = ["aaaaaaaa", "bbbbbbbb", "cccccccc"]
    _plant(folder, outside, planted)
    monkeypatch.setattr(cache_module, "_temporary_names", lambda: iter([*planted, "dddddddd"]))
    path = folder / "cache.txt"
    cache_module._atomic_write(path, HEADER + "\n", None)
    assert snapshot_folder(outside) == {"victim.txt": b"precious"}
    assert path.read_text() == HEADER + "\n" and not path.is_symlink()
    assert all((folder / f".cache.txt.{name}.tmp").is_symlink() for name in planted)
    assert not (folder / ".cache.txt.dddddddd.tmp").exists()  # used, then renamed over the cache


def test_an_update_removes_planted_temporaries_without_following_them(tmp_path: Path) -> None:
    folder, outside = tmp_path / "cache", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    _plant(folder, outside, ["aaaaaaaa", "bbbbbbbb"])
    path = folder / "cache.txt"
    onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path, num_threads=2)
    assert snapshot_folder(outside) == {"victim.txt": b"precious"}
    assert sorted(p.name for p in folder.iterdir()) == ["cache.txt", "cache.txt.lock"]
    assert read_cache(path).status == CacheStatus.OK


@pytest.mark.parametrize("target", ["existing file", "absent file"])
def test_a_planted_lock_symlink_is_not_followed(tmp_path: Path, target: str) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    if target == "existing file":
        (outside / "victim.txt").write_text("precious")
    path = folder / "cache.txt"
    update_cache(path, [CacheEntry(KernelTuningKey("reltest", "Old", "portable", "float"),
                                   execution_descriptor(2), {"v": 1})])
    Path(str(path) + ".lock").unlink()
    Path(str(path) + ".lock").symlink_to(outside / "victim.txt")
    before, generation = snapshot_folder(folder), default_registry().generation
    with pytest.raises(OSError) as info:
        onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 5}, path=path, num_threads=2)
    assert info.value.errno == errno.ELOOP
    assert f"kernel tuning cache {path} cannot be written" in str(info.value)
    assert snapshot_folder(folder) == before
    assert snapshot_folder(outside) == ({"victim.txt": b"precious"} if target == "existing file" else {})
    assert default_registry().generation == generation


def test_a_backup_never_follows_a_planted_symlink(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    path = folder / "cache.txt"
    path.write_text(HEADER + "\na damaged line\n")
    fixed = datetime.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=datetime.timezone.utc)

    class FrozenClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return fixed

    monkeypatch.setattr(cache_module.datetime, "datetime", FrozenClock)
    (folder / "cache.txt.bad-20300102T030405678901Z").symlink_to(outside / "stolen.txt")
    before = snapshot_folder(folder)
    with pytest.raises(FileExistsError):
        update_cache(path, [CacheEntry(KernelTuningKey("reltest", "New", "portable", "float"),
                                       execution_descriptor(2), {"v": 1})])
    monkeypatch.undo()
    assert snapshot_folder(outside) == {}
    assert {k: v for k, v in snapshot_folder(folder).items() if not k.endswith(".lock")} == before


def test_written_files_are_never_writable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    path.write_text(HEADER + "\na damaged line\n")
    path.chmod(0o666)
    result = update_under_umask_zero(path)
    backup = Path(result["cache_update"]["backup"])
    for written in (path, backup, Path(str(path) + ".lock")):
        assert written.stat().st_mode & 0o022 == 0, (written.name, oct(written.stat().st_mode))
    assert path.stat().st_mode & 0o777 == 0o644
    assert path.stat().st_uid == os.geteuid()


@pytest.mark.parametrize("change", ["writable by other users", "owned by another user"])
def test_a_cache_others_may_change_is_reported(tmp_path: Path, corpus, change: str) -> None:
    data, _ = corpus
    path = tmp_path / "cache.txt"
    path.write_bytes(data)
    path.chmod(0o644)
    if change == "writable by other users":
        path.chmod(0o646)
    else:
        if os.geteuid() != 0:
            pytest.skip("changing a file's owner needs root")
        os.chown(path, 54321, 54321)
    loaded = onnx_light.load_kernel_tuning_cache(path, num_threads=2)
    inspected = onnx_light.inspect_kernel_tuning_cache(path, num_threads=2)
    for report in (loaded, inspected):
        assert any(change in d and str(path) in d for d in report["diagnostics"]), report["diagnostics"]
    assert loaded["ownership"] and change in loaded["ownership"][0]
    assert loaded["loaded"] == 12  # reported, still plain data


# --------------------------------------------------------------------------------------------
# Security: model external data stays in the model's folder
# --------------------------------------------------------------------------------------------


def _external_model(folder: Path, location: str) -> onnx.ModelProto:
    """z = x + w, with w's four floats in the external file ``location``."""
    w = TensorProto()
    w.name, w.data_type = "w", TensorProto.FLOAT
    w.dims.extend([4])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("x", "z")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["z"])], "g", info[:1], info[1:],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    return model


@pytest.fixture
def model_folder(tmp_path: Path, monkeypatch) -> Path:
    """models/ with inside.bin, next to secret/secret.bin; the working directory is models/
    (a model in memory would otherwise read external data relative to it)."""
    folder, secret = tmp_path / "models", tmp_path / "secret"
    folder.mkdir()
    secret.mkdir()
    (folder / "inside.bin").write_bytes(np.ones(4, np.float32).tobytes())
    (secret / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    (folder / "link.bin").symlink_to(secret / "secret.bin")
    (folder / "linkdir").symlink_to(secret)
    (folder / "sub").mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_external_data_inside_the_folder_loads(model_folder: Path) -> None:
    _external_model(model_folder, "inside.bin")
    (z,) = RuntimeSession(model_folder / "model.onnx").run(None, {"x": np.zeros(4, np.float32)})
    np.testing.assert_array_equal(z, np.ones(4, np.float32))


@pytest.mark.parametrize("location", ["../secret/secret.bin", "sub/../../secret/secret.bin",
                                      "ABSOLUTE", "link.bin", "linkdir/secret.bin", "/proc/self/environ",
                                      "/dev/zero", "", "sub"])
def test_external_data_cannot_escape_the_model_folder(model_folder: Path, location: str) -> None:
    if location == "ABSOLUTE":
        location = str(model_folder.parent / "secret" / "secret.bin")
    model = _external_model(model_folder, location)
    for source in (model_folder / "model.onnx", model, model.SerializeToString()):
        with pytest.raises(ValueError) as info:
            RuntimeSession(source)
        text = str(info.value)
        assert "tensor" in text.lower() or "external" in text.lower(), text
        assert len(text) < 1000


@pytest.mark.parametrize("source", ["proto", "bytes"])
def test_a_model_in_memory_never_reads_external_data(model_folder: Path, source: str) -> None:
    """Without a path there is no model folder: even a harmless location is refused."""
    model = _external_model(model_folder, "inside.bin")
    with pytest.raises(ValueError, match=r"tensor 'w' keeps its data in the external file 'inside\.bin'"):
        RuntimeSession(model if source == "proto" else model.SerializeToString())


def test_external_data_in_an_attribute_is_refused_too(model_folder: Path) -> None:
    tensor = TensorProto()
    tensor.name, tensor.data_type = "c", TensorProto.FLOAT
    tensor.dims.extend([4])
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "linkdir/secret.bin"
    info = helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Constant", [], ["z"], value=tensor)], "g", [], [info])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ValueError, match=r"external file 'linkdir/secret\.bin'"):
        RuntimeSession(model)


def test_check_small_session_is_a_real_oracle() -> None:
    """The session check does catch a wrong result (so a silent miscomputation would fail)."""
    model = small_model()
    model.graph.node[1].op_type = "Abs"  # Relu -> Abs: a different function
    assert "differs from the reference" in (check_small_session(2, model) or "")
    assert check_small_session(2) is None

