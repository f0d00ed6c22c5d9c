"""calibrate / propose / apply and ``tune-kernels --apply`` with test-only callbacks.

The keys live in the library ``caltest`` of the process-wide registry; their callbacks run the
core's crossover search over simulated problems, so no hardware timing is asserted.
"""

from __future__ import annotations

import json
import os
import re

import pytest

import onnx_light
from onnx_light.cli import main
from onnx_light.tuning import calibration, default_registry
from onnx_light.tuning.calibration import crossover_search
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.schema import KernelTuningSchema, Parameter

LIB = "caltest"
MIN = "parallel.minimum_elements"
PORTABLE = 1 << 16


class SimulatedProblem:
    """The candidate has 50 us of overhead and twice the speed; outputs optionally wrong."""

    cases = ("equal",)

    def __init__(self, clock, wrong=False):
        self.clock, self.wrong = clock, wrong

    def input_bytes(self, size, case):
        return 12 * size

    def make_inputs(self, size, case):
        return size

    def serial(self, size):
        self.clock[0] += size * 1e-9
        return size

    def candidate(self, size):
        self.clock[0] += (50_000 + size / 2) * 1e-9
        return -size if self.wrong else size

    def same_output(self, a, b):
        return a == b


def _callback(wrong=False):
    def calibrate(key, descriptor, budget):
        clock = [0.0]
        return crossover_search(key, SimulatedProblem(clock, wrong), MIN, {MIN: PORTABLE}, budget,
                                timer=lambda: clock[0])
    return calibrate


def _raising(key, descriptor, budget):
    raise RuntimeError("callback exploded")


KERNELS = {"Good": _callback(), "Other": _callback(), "Wrong": _callback(wrong=True),
           "Raises": _raising, "Manual": None}


def key(kernel, element_type="float"):
    return KernelTuningKey(LIB, kernel, "portable", element_type)


@pytest.fixture(scope="module", autouse=True)
def _registered():
    registry = default_registry()
    if key("Good") not in registry.snapshot().schemas:
        schemas = [KernelTuningSchema(key(k, t), (Parameter(MIN, "int", PORTABLE, minimum=1),))
                   for k in KERNELS for t in ("float", "double")]
        registry.register(schemas=schemas, callbacks={
            key(k, t): cb for k, cb in KERNELS.items() if cb is not None for t in ("float", "double")})


pytestmark = pytest.mark.usefixtures("isolated_tuning")


def test_calibrate_publishes_and_saves(tmp_path):
    path = tmp_path / "cache.txt"
    before = default_registry().generation
    report = onnx_light.calibrate_kernel_tuning("Good", "float", library=LIB, num_threads=2,
                                                path=path)
    json.dumps(report)
    assert report["failed"] == [] and report["unsupported"] == []
    (result,) = report["calibrated"]
    assert result["values"] == {MIN: 1 << 17} and result["crossover"] == 1 << 17
    assert result["measurements"] and all("serial_median_s" in m for m in result["measurements"])
    assert report["generation"] == before + 1
    assert path.exists() and "caltest/Good/portable[float]" in path.read_text()
    (record,) = onnx_light.kernel_tuning_parameters("Good", "float", library=LIB, num_threads=2,
                                                    path=path)
    assert record["active_source"] == "published_profile"
    assert record["active_values"] == record["cached_values"] == {MIN: 1 << 17}


@pytest.mark.parametrize("bad", ["Wrong", "Raises"])
def test_a_failing_callback_publishes_and_writes_nothing(tmp_path, bad):
    path = tmp_path / "cache.txt"
    generation = default_registry().generation
    report = onnx_light.calibrate_kernel_tuning(["Good", bad], "float", library=LIB, num_threads=2,
                                                path=path)
    assert [f["key"] for f in report["failed"]] == [str(key(bad))]
    assert report["calibrated"] == [] and report["cache_update"] is None
    assert default_registry().generation == generation
    assert not path.exists()
    assert any("nothing was published" in d for d in report["diagnostics"])
    if bad == "Wrong":
        assert "differs from the serial reference" in report["failed"][0]["error"]


def test_memory_budget_smaller_than_smallest_case_keeps_portable(tmp_path):
    report = onnx_light.calibrate_kernel_tuning("Good", "float", library=LIB, num_threads=2,
                                                path=tmp_path / "c.txt", max_memory_bytes=100)
    (result,) = report["calibrated"]
    assert result["portable_kept"] and result["values"] == {MIN: PORTABLE}
    assert result["measurements"] == []
    assert any("memory budget" in d for d in result["diagnostics"])


def test_one_thread_keeps_portable(tmp_path):
    report = onnx_light.calibrate_kernel_tuning("Good", "float", library=LIB, num_threads=1,
                                                path=tmp_path / "c.txt")
    (result,) = report["calibrated"]
    assert result["portable_kept"] and result["values"] == {MIN: PORTABLE}
    assert any("only 1 thread" in d for d in result["diagnostics"])


def test_schema_only_keys_are_unsupported(tmp_path):
    report = onnx_light.calibrate_kernel_tuning("Manual", library=LIB, num_threads=2,
                                                path=tmp_path / "c.txt")
    assert report["calibrated"] == []
    assert sorted(report["unsupported"]) == sorted([str(key("Manual")), str(key("Manual", "double"))])


def test_propose_then_apply_covers_everything_calibratable(tmp_path):
    path = tmp_path / "cache.txt"
    kernels = ["Good", "Other", "Manual"]
    proposal = onnx_light.propose_kernel_tuning_updates(kernels, library=LIB, path=path,
                                                        num_threads=2)
    assert proposal["covered"] == []
    assert len(proposal["missing_calibratable"]) == 4
    assert [m["key"] for m in proposal["missing_schema_only"]] == [  # sorted by key
        str(key("Manual")), str(key("Manual", "double"))]
    assert not path.exists()  # proposing is read-only
    steps = []
    outcome = onnx_light.apply_kernel_tuning_updates(
        proposal, path=path, progress=lambda done, total, k: steps.append((done, total)))
    assert steps == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    assert len(outcome["applied"]) == 4 and outcome["failed"] == []
    assert outcome["remaining"]["missing_calibratable"] == []
    assert len(outcome["remaining"]["missing_schema_only"]) == 2
    again = onnx_light.propose_kernel_tuning_updates(kernels, library=LIB, path=path, num_threads=2)
    assert len(again["covered"]) == 4 and again["missing_calibratable"] == []
    assert len(again["missing_schema_only"]) == 2


def test_apply_rejects_a_proposal_for_another_machine(tmp_path):
    proposal = onnx_light.propose_kernel_tuning_updates("Good", library=LIB, path=tmp_path / "c",
                                                        num_threads=2)
    proposal["descriptor"]["cpu"]["model"] += 1
    with pytest.raises(ValueError, match="another processor"):
        onnx_light.apply_kernel_tuning_updates(proposal)
    with pytest.raises(TypeError):
        onnx_light.apply_kernel_tuning_updates({"nothing": 1})


def test_duration_budget_shared_between_keys(tmp_path):
    report = onnx_light.calibrate_kernel_tuning(["Good", "Other"], library=LIB, num_threads=2,
                                                path=tmp_path / "c.txt", max_duration_ms=1e-6)
    assert report["failed"] == []
    assert len(report["calibrated"]) + len(report["skipped"]) == 4


def test_cli_read_only_then_apply(tmp_path, capsys):
    path = tmp_path / "cache.txt"
    common = ["tune-kernels", "--kernel", "Good", "--kernel", "Manual", "--cache", str(path),
              "--threads", "2"]
    # without --apply nothing is created
    assert main(common) == 0
    assert not path.exists() and not (tmp_path / "cache.txt.lock").exists()
    assert "missing 4 (2 calibratable, 2 schema-only)" in capsys.readouterr().out
    # --apply calibrates and creates the cache; the table shows old and new values
    assert main([*common, "--apply", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert path.exists()
    assert f"{MIN}={PORTABLE}" in out and f"{MIN}={1 << 17}" in out
    snapshot = path.read_bytes()
    # the report now shows them covered, and leaves the file byte-identical
    assert main(common) == 0
    assert "covered 2" in capsys.readouterr().out
    assert path.read_bytes() == snapshot


def test_cli_apply_failure_exit_status(tmp_path, capsys):
    status = main(["tune-kernels", "--kernel", "Wrong", "--element-type", "float",
                   "--cache", str(tmp_path / "c.txt"), "--threads", "2", "--apply", "--quiet"])
    assert status == 1
    assert "FAILED caltest/Wrong/portable[float]" in capsys.readouterr().err


def test_cli_nothing_matches(capsys):
    assert main(["tune-kernels", "--kernel", "NoSuchKernel"]) == 2
    assert "unknown kernel NoSuchKernel" in capsys.readouterr().err


def test_cli_apply_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    figure = tmp_path / "calibration.png"
    status = main(["tune-kernels", "--kernel", "Good", "--cache", str(tmp_path / "c.txt"),
                   "--threads", "2", "--apply", "--quiet", "--plot", str(figure)])
    assert status == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"figure written: {figure}" in capsys.readouterr().out
    assert main(["tune-kernels", "--plot", str(tmp_path / "x.png")]) == 2
    assert "needs --apply" in capsys.readouterr().err


def _change_rows(out):
    """The --apply change table's rows by key (COLUMNS is wide: one line each)."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("key "))
    assert re.split(r"\s{2,}", lines[header]) == ["key", "old", "new", "speedup", "reason"]
    return {line.split()[0]: re.split(r"\s{2,}", line) for line in lines[header + 1:]
            if line.startswith(f"{LIB}/")}


@pytest.fixture
def wide(monkeypatch):
    """Table rows on one line each, and an idle machine (no load average in the reasons)."""
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(calibration, "load_average", lambda: (0.0, 0.0, 0.0))


def test_cli_apply_rows_give_the_reason_and_a_speedup_only_for_a_change(tmp_path, capsys, wide):
    path = tmp_path / "cache.txt"
    common = ["tune-kernels", "--kernel", "Good", "--element-type", "float", "--cache", str(path),
              "--apply", "--quiet"]
    assert main([*common, "--threads", "1"]) == 0
    row = _change_rows(capsys.readouterr().out)[str(key("Good"))]
    assert row[1:4] == [f"{MIN}={PORTABLE}", "unchanged", "-"]
    assert row[4] == "only 1 thread available; portable value kept"
    assert main([*common, "--threads", "2"]) == 0
    row = _change_rows(capsys.readouterr().out)[str(key("Good"))]
    assert row[1:3] == [f"{MIN}={PORTABLE}", f"{MIN}={1 << 17}"]
    assert re.fullmatch(r"\d+\.\d\dx", row[3])
    assert row[4].startswith(f"candidate wins by >= 5% from {1 << 17} elements")
    # a value equal to the old one is no change, whatever was measured at the crossover
    assert main([*common, "--threads", "2", "--force"]) == 0
    out = capsys.readouterr().out
    assert "calibrated now: 1 (1 again)" in out
    row = _change_rows(out)[str(key("Good"))]
    assert row[1:4] == [f"{MIN}={1 << 17}", "unchanged", "-"]
    assert row[4].startswith("candidate wins by >= 5%")


def test_cli_apply_without_force_calibrates_nothing_covered(tmp_path, capsys):
    common = ["tune-kernels", "--kernel", "Good", "--element-type", "float", "--cache",
              str(tmp_path / "cache.txt"), "--threads", "2", "--quiet"]
    assert main([*common, "--apply"]) == 0
    capsys.readouterr()
    assert main([*common, "--apply"]) == 0
    out = capsys.readouterr().out
    assert "calibrated now: 0" in out and "--apply --force" in out
    assert main([*common, "--force"]) == 2
    assert "--force acts on a calibration: it needs --apply" in capsys.readouterr().err


def test_cli_apply_warns_before_calibrating_on_a_busy_machine(tmp_path, capsys, monkeypatch, wide):
    busy = 10.0 * (os.cpu_count() or 1)
    monkeypatch.setattr(calibration, "load_average", lambda: (busy, busy, busy))
    assert main(["tune-kernels", "--kernel", "Good", "--element-type", "float", "--cache",
                 str(tmp_path / "cache.txt"), "--threads", "2", "--apply", "--quiet"]) == 0
    out, err = capsys.readouterr()
    cpus = os.cpu_count() or 1
    assert err.startswith(f"warning: load average {busy:.2f} on {cpus} CPUs: other programs")
    assert f"load average {busy:.2f} on {cpus} CPUs when measured" in _change_rows(out)[
        str(key("Good"))][4]
    monkeypatch.setattr(calibration, "load_average", lambda: (0.0, 0.0, 0.0))
    assert main(["tune-kernels", "--kernel", "Good", "--element-type", "double", "--cache",
                 str(tmp_path / "cache.txt"), "--threads", "2", "--apply", "--quiet"]) == 0
    assert "load average" not in "".join(capsys.readouterr())


def test_cli_reset_forgets_this_machine_in_the_file(tmp_path, capsys):
    path = tmp_path / "cache.txt"
    common = ["tune-kernels", "--kernel", "Good", "--cache", str(path), "--threads", "2"]
    assert main([*common, "--apply", "--quiet"]) == 0
    assert main(["tune-kernels", "--kernel", "Other", "--cache", str(path), "--threads", "2",
                 "--apply", "--quiet"]) == 0
    capsys.readouterr()
    assert main([*common, "--reset"]) == 0
    assert capsys.readouterr().out == (f"forgot the values of 2 key(s) for this processor at 2 "
                                       f"threads: 2 entry(ies) removed from {path}\n")
    text = path.read_text()
    assert "caltest/Good/" not in text and "caltest/Other/portable[float]" in text
    assert main([*common]) == 0
    assert "covered 0, missing 2" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:  # one or the other
        main([*common, "--reset", "--apply"])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    absent = tmp_path / "absent.txt"
    assert main(["tune-kernels", "--reset", "--cache", str(absent)]) == 0
    assert f"no cache file at {absent}" in capsys.readouterr().out
    assert not absent.exists()


def test_cli_reports_a_damaged_cache_and_its_backup(tmp_path, capsys):
    path = tmp_path / "cache.txt"
    common = ["tune-kernels", "--kernel", "Good", "--cache", str(path), "--threads", "2"]
    assert main([*common, "--apply", "--quiet", "--element-type", "float"]) == 0
    with path.open("a", encoding="utf-8") as handle:
        handle.write("{broken\n")
    capsys.readouterr()
    assert main(common) == 0
    out, err = capsys.readouterr()
    assert err.startswith(f"warning: kernel tuning cache {path} is damaged: {path}:3: not a JSON")
    assert "covered 1, missing 1" in out  # the good entry still counts
    assert main([*common, "--apply", "--quiet"]) == 0
    err = capsys.readouterr().err
    (backup,) = tmp_path.glob("cache.txt.bad-*")
    assert f"was copied to {backup} and rewritten without it" in err
    assert backup.read_text().endswith("{broken\n") and "{broken" not in path.read_text()


def test_cli_says_an_entry_is_stale_and_apply_recalibrates_it(tmp_path, capsys, monkeypatch):
    path = tmp_path / "cache.txt"
    common = ["tune-kernels", "--kernel", "Good", "--element-type", "float", "--cache", str(path),
              "--threads", "2"]
    assert main([*common, "--apply", "--quiet"]) == 0
    # The same entry, as if measured under another numpy (an upgrade since).
    text = path.read_text(encoding="utf-8")
    numpy_version = json.loads(text.splitlines()[1])["measured_under"]["numpy"]
    path.write_text(text.replace(f'"numpy":"{numpy_version}"', '"numpy":"1.0.0"'), encoding="utf-8")
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    assert main(common) == 0
    out = capsys.readouterr().out
    assert re.search(rf"{re.escape(str(key('Good')))}\s+stale\s+portable default", out), out
    assert (f"1 cache entry(ies) of this machine are stale and not applied (line 2, "
            f"{key('Good')}: measured under other versions: numpy 1.0.0 (now {numpy_version}))") in out
    assert "recalibrates them" in out
    assert main([*common, "--apply", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "are stale and not applied" in err and "calibrated now: 1" in out
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["measured_under"]["numpy"] == numpy_version
    assert main(common) == 0 and "stale" not in capsys.readouterr().out
