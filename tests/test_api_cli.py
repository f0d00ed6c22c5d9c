"""Tests for the public tuning functions (api.py), the import-time cache load and the
read-only command line (cli.py).

These act on this machine: the functions resolve for the host's execution descriptor, so
the descriptor is taken from ``execution_descriptor`` and never assumed. Cache files live
in ``tmp_path``; the process-wide registry's published profiles are dropped around every
test so nothing leaks between tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import onnx_light
from onnx_light import cli, cli_tune
from onnx_light.tuning import api
from onnx_light.tuning.cache import (
    CACHE_ENV,
    CacheEntry,
    CacheStatus,
    LineOutcome,
    classify,
    read_cache,
    update_cache,
)
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.processor import CpuExecutionDescriptor, execution_descriptor
from onnx_light.tuning.registry import KernelTuningRegistry, default_registry
from onnx_light.tuning.schema import Parameter

ROOT = Path(__file__).resolve().parent.parent
ADD = KernelTuningKey("onnx_light", "Add", "portable", "float")
ABS = KernelTuningKey("onnx_light", "Abs", "portable", "float")
GEMM = KernelTuningKey("onnx_light", "Gemm", "portable", "float", tuning_abi=2)
MIN_ELEMENTS = "parallel.minimum_elements"
RECORD_FIELDS = {"key", "parameters", "defaults", "cached_values", "active_values", "active_source",
                 "calibratable"}


pytestmark = pytest.mark.usefixtures("isolated_tuning")


@pytest.fixture
def local() -> CpuExecutionDescriptor:
    return execution_descriptor()


def foreign(descriptor: CpuExecutionDescriptor) -> CpuExecutionDescriptor:
    """The same thread count on a processor that differs from ``descriptor``'s."""
    cpu = dataclasses.replace(descriptor.cpu, vendor="elsewhere", microarchitecture="not_this_one")
    return CpuExecutionDescriptor(cpu, descriptor.num_threads)


def non_default(parameter: Parameter) -> Any:
    """A valid value of ``parameter`` that differs from its default."""
    if parameter.choices is not None:
        return next(c for c in parameter.choices if c != parameter.default)
    if parameter.type == "bool":
        return not parameter.default
    if parameter.type == "str":
        return parameter.default + "x"
    step = 1 if parameter.type == "int" else 0.5
    if parameter.maximum is None or parameter.default + step <= parameter.maximum:
        return parameter.default + step
    return parameter.default - step


def state(path: Path) -> tuple[bytes, int] | None:
    """The file's bytes and modification time (None when absent)."""
    if not path.exists():
        return None
    return path.read_bytes(), path.stat().st_mtime_ns


def seeded_cache(path: Path, local: CpuExecutionDescriptor) -> dict[str, Any]:
    """A file with an Add entry for this machine, one for another processor, garbage, and an
    unknown library's entry. Returns what was written."""
    ours = CacheEntry(ADD, local, {MIN_ELEMENTS: 4321}, {"origin": "manual"})
    theirs = CacheEntry(ADD, foreign(local), {MIN_ELEMENTS: 7}, {"origin": "manual"})
    update_cache(path, [ours, theirs])
    stranger = json.dumps({"key": "otherlib/Conv/fast[float]@cpu#1",
                           "descriptor": local.to_dict(), "values": {"x": 1}, "provenance": {}})
    with path.open("a", encoding="utf-8") as handle:
        handle.write("definitely not json\n" + stranger + "\n")
    return {"ours": ours, "theirs": theirs}


def active(kernel: str, element_type: str = "float", **kwargs: Any) -> dict[str, Any]:
    (record,) = onnx_light.kernel_tuning_parameters(kernel, element_type, **kwargs)
    return record


# --------------------------------------------------------------------------------------------
# kernel_tuning_parameters
# --------------------------------------------------------------------------------------------


def test_parameters_records_cover_every_key_sorted_and_serialisable(tmp_path: Path, local) -> None:
    records = onnx_light.kernel_tuning_parameters(path=tmp_path / "none.txt")
    snapshot = default_registry().snapshot()
    keys = [KernelTuningKey.parse(r["key"]) for r in records]
    assert keys == sorted(keys) == list(snapshot.keys())
    assert json.loads(json.dumps(records)) == records
    for record, key in zip(records, keys, strict=True):
        assert set(record) >= RECORD_FIELDS
        schema = snapshot.schema(key)
        assert record["defaults"] == dict(schema.defaults)
        assert record["parameters"] == schema.describe()
        assert record["cached_values"] is None
        resolution = snapshot.resolve(key, local)
        assert record["active_values"] == dict(resolution.values)
        assert record["active_source"] == resolution.source
        assert resolution.source != "published_profile"
        assert record["calibratable"] is (snapshot.callbacks.get(key) is not None)
    assert str(ADD) in [r["key"] for r in records]


@pytest.mark.parametrize("element_type", [1, "float", "FLOAT", "float32", np.float32,
                                          np.dtype("float32"), ["float"]])
def test_parameters_element_type_filter(element_type: Any) -> None:
    records = onnx_light.kernel_tuning_parameters("Add", element_type)
    assert [r["key"] for r in records] == [str(ADD)]


def test_parameters_kernel_filters() -> None:
    keys = [r["key"] for r in onnx_light.kernel_tuning_parameters(["Add", "Abs"], "float")]
    assert keys == sorted([str(ADD), str(ABS)], key=KernelTuningKey.parse)
    adds = onnx_light.kernel_tuning_parameters("Add")
    assert len(adds) > 1
    assert {r["kernel"] for r in adds} == {"Add"}
    assert len({r["element_type"] for r in adds}) == len(adds)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"kernel": "Nope"}, KeyError, "unknown kernel Nope; known: "),
        ({"kernel": "Not", "element_type": "float"}, KeyError, "the selected kernels have: bool"),
        ({"kernel": "Add", "library": "otherlib"}, KeyError, "unknown library otherlib"),
        ({"kernel": "Add", "element_type": "quux"}, ValueError, "unknown ONNX element type"),
        ({"kernel": 5}, TypeError, "kernel must be"),
    ],
)
def test_parameters_bad_filters(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error) as info:
        onnx_light.kernel_tuning_parameters(**kwargs)
    assert message in str(info.value)


def test_parameters_show_cached_values_of_this_machine_only(tmp_path: Path, local) -> None:
    path = tmp_path / "cache.txt"
    other_threads = CpuExecutionDescriptor(local.cpu, local.num_threads + 1)
    update_cache(path, [CacheEntry(ADD, foreign(local), {MIN_ELEMENTS: 7}),
                        CacheEntry(ADD, other_threads, {MIN_ELEMENTS: 8})])
    assert active("Add", path=path)["cached_values"] is None
    assert active("Add", path=path, num_threads=local.num_threads + 1)["cached_values"] == {
        MIN_ELEMENTS: 8}
    update_cache(path, [CacheEntry(ADD, local, {MIN_ELEMENTS: 9})])
    record = active("Add", path=path)
    assert record["cached_values"] == {MIN_ELEMENTS: 9}
    assert record["active_source"] != "published_profile"  # reading does not publish


# --------------------------------------------------------------------------------------------
# inspect_kernel_tuning_cache and load_kernel_tuning_cache
# --------------------------------------------------------------------------------------------


def test_inspect_publishes_nothing_and_leaves_the_file_alone(tmp_path: Path, local) -> None:
    path = tmp_path / "cache.txt"
    seeded_cache(path, local)
    before, generation = state(path), default_registry().generation
    listing = sorted(os.listdir(tmp_path))
    report = onnx_light.inspect_kernel_tuning_cache(path)
    assert state(path) == before
    assert sorted(os.listdir(tmp_path)) == listing
    assert default_registry().generation == generation
    assert active("Add")["active_source"] != "published_profile"
    json.dumps(report)
    assert report["path"] == str(path)
    assert report["status"] == "damaged"
    assert report["descriptor"] == local.to_dict()
    outcomes = [(p["line"], p["outcome"], p["matches_this_machine"]) for p in report["profiles"]]
    assert outcomes == [(2, "loaded", True), (3, "incompatible", False), (4, "invalid", False),
                        (5, "unknown_key", False)]
    assert report["profiles"][0]["values"] == {MIN_ELEMENTS: 4321}
    assert "cpu.vendor" in report["profiles"][1]["reason"]
    assert any(d.startswith(f"{path}:4: ") for d in report["diagnostics"])


def test_inspect_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.txt"
    report = onnx_light.inspect_kernel_tuning_cache(path)
    assert (report["status"], report["profiles"], report["diagnostics"]) == ("missing", [], [])
    assert not path.exists()


def test_load_publishes_in_one_generation_and_reports_outcomes(tmp_path: Path, local) -> None:
    path = tmp_path / "cache.txt"
    seeded_cache(path, local)
    other_threads = CpuExecutionDescriptor(local.cpu, local.num_threads + 1)
    update_cache(path, [CacheEntry(ABS, other_threads, {MIN_ELEMENTS: 55})])
    before, generation = state(path), default_registry().generation
    report = onnx_light.load_kernel_tuning_cache(path)
    assert state(path) == before
    assert report["generation"] == default_registry().generation == generation + 1
    assert report["loaded"] == 2
    assert sorted(e["outcome"] for e in report["entries"]) == [
        "incompatible", "loaded", "loaded", "unknown_key"]
    assert report["diagnostics"]
    record = active("Add")
    assert (record["active_source"], record["active_values"]) == ("published_profile",
                                                                  {MIN_ELEMENTS: 4321})
    assert active("Abs")["active_source"] != "published_profile"
    assert active("Abs", num_threads=local.num_threads + 1)["active_values"] == {MIN_ELEMENTS: 55}


@pytest.mark.parametrize("kind", ["missing", "directory", "garbage"])
def test_load_never_raises_for_file_content(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "cache.txt"
    if kind == "directory":
        path.mkdir()
    elif kind == "garbage":
        path.write_bytes(b"\x00\xff garbage\n{}\n")
    generation = default_registry().generation
    report = onnx_light.load_kernel_tuning_cache(path)
    assert report["loaded"] == 0
    assert default_registry().generation == generation
    assert bool(report["diagnostics"]) is (kind != "missing")


def test_load_uses_the_default_path(tmp_path: Path, local) -> None:
    path = Path(onnx_light.default_kernel_tuning_cache_path())
    assert path == tmp_path / "default" / "kernel-tuning-cache.txt"
    update_cache(path, [CacheEntry(ADD, local, {MIN_ELEMENTS: 77})])
    assert onnx_light.load_kernel_tuning_cache()["loaded"] == 1
    assert active("Add")["active_values"] == {MIN_ELEMENTS: 77}


# --------------------------------------------------------------------------------------------
# set_kernel_tuning_parameters and reset_kernel_tuning_parameters
# --------------------------------------------------------------------------------------------


def test_set_starts_from_the_cached_profile_persists_and_publishes(tmp_path: Path, local) -> None:
    path = tmp_path / "cache.txt"
    schema = default_registry().snapshot().schema(GEMM)
    cached = {p.name: non_default(p) for p in schema.parameters}
    assert schema.validate(cached) == cached
    elsewhere = CacheEntry(GEMM, foreign(local), dict(schema.defaults))
    update_cache(path, [CacheEntry(GEMM, local, cached), elsewhere])
    first = schema.parameters[0]
    change = {first.name: non_default(dataclasses.replace(first, default=cached[first.name]))}
    generation = default_registry().generation
    result = onnx_light.set_kernel_tuning_parameters("Gemm", "float", change, path=path)
    expected = {**cached, **change}
    assert result["previous"] == cached
    assert result["values"] == expected
    assert result["key"] == str(GEMM)
    assert result["generation"] == default_registry().generation == generation + 1
    assert result["cache_update"]["replaced"] == 1
    json.dumps(result)
    outcomes, profiles = classify(read_cache(path), default_registry().snapshot(), local)
    assert {(str(p.key), p.descriptor == local): dict(p.values) for p in profiles} == {
        (str(GEMM), True): expected}
    # the other entry is kept
    assert [o.outcome for o in outcomes] == [LineOutcome.INCOMPATIBLE, LineOutcome.LOADED]
    record = active("Gemm", path=path)
    assert record["active_source"] == "published_profile"
    assert record["active_values"] == record["cached_values"] == expected


def test_set_without_cached_profile_starts_from_active_values(tmp_path: Path) -> None:
    path = tmp_path / "new" / "cache.txt"
    defaults = active("Add")["active_values"]
    result = onnx_light.set_kernel_tuning_parameters("Add", np.float32, {MIN_ELEMENTS: 123},
                                                     path=path)
    assert result["previous"] == defaults
    assert result["values"] == {MIN_ELEMENTS: 123}
    assert read_cache(path).status == CacheStatus.OK
    assert active("Add", path=path)["cached_values"] == {MIN_ELEMENTS: 123}
    assert active("Add")["active_source"] == "published_profile"


def test_set_without_persist_publishes_only(tmp_path: Path, local) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [CacheEntry(ADD, local, {MIN_ELEMENTS: 4321})])
    before = state(path)
    result = onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN_ELEMENTS: 99}, path=path,
                                                     persist=False)
    assert result["cache_update"] is None
    assert state(path) == before
    record = active("Add", path=path)
    assert record["active_values"] == {MIN_ELEMENTS: 99}
    assert record["cached_values"] == {MIN_ELEMENTS: 4321}
    absent = tmp_path / "absent.txt"
    onnx_light.set_kernel_tuning_parameters("Abs", "float", {MIN_ELEMENTS: 5}, path=absent,
                                            persist=False)
    assert not absent.exists()
    assert not Path(str(absent) + ".lock").exists()


@pytest.mark.parametrize(
    ("kernel", "element_type", "values", "error", "message"),
    [
        ("Nope", "float", {MIN_ELEMENTS: 10}, KeyError, "unknown kernel Nope"),
        ("Add", "float", {"parallel.minimum": 10}, KeyError, "unknown parameter 'parallel.minimum'"),
        ("Add", "float", {MIN_ELEMENTS: "10"}, TypeError, "expected int, got str"),
        ("Add", "float", {MIN_ELEMENTS: True}, TypeError, "expected int, got bool"),
        ("Add", "float", {MIN_ELEMENTS: 0}, ValueError, "below the minimum 1"),
        ("Add", "float", {MIN_ELEMENTS: 2**64}, ValueError, "int64"),
        ("Add", ["float", "double"], {MIN_ELEMENTS: 10}, ValueError, "ambiguous selection"),
        ("Add", None, {MIN_ELEMENTS: 10}, ValueError, "ambiguous selection"),
        ("Add", "quux", {MIN_ELEMENTS: 10}, ValueError, "unknown ONNX element type"),
        ("Not", "float", {MIN_ELEMENTS: 10}, KeyError, "the selected kernels have: bool"),
        ("Add", "float", [(MIN_ELEMENTS, 10)], TypeError, "mapping"),
        (["Add"], "float", {MIN_ELEMENTS: 10}, TypeError, "kernel must be a string"),
    ],
)
def test_set_rejects_invalid_input_without_any_change(tmp_path: Path, local, kernel, element_type,
                                                      values, error: type, message: str) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [CacheEntry(ADD, local, {MIN_ELEMENTS: 4321})])
    before, generation = state(path), default_registry().generation
    with pytest.raises(error) as info:
        onnx_light.set_kernel_tuning_parameters(kernel, element_type, values, path=path)
    assert message in str(info.value)
    if error is ValueError:
        assert not isinstance(info.value, (TypeError, KeyError))
    assert state(path) == before
    assert default_registry().generation == generation


def test_set_into_a_directory_raises_and_publishes_nothing(tmp_path: Path) -> None:
    generation = default_registry().generation
    with pytest.raises(IsADirectoryError, match="not a regular file"):
        onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN_ELEMENTS: 5}, path=tmp_path)
    assert default_registry().generation == generation


def test_ambiguous_implementations_need_an_implementation(tmp_path: Path, monkeypatch) -> None:
    registry = KernelTuningRegistry()
    onnx_light.kernels.register(registry)
    blocked = KernelTuningKey("onnx_light", "Add", "blocked", "float")
    registry.register([type(registry.snapshot().schema(ADD))(blocked, (
        Parameter(MIN_ELEMENTS, "int", 10, minimum=1),))])
    monkeypatch.setattr(api, "default_registry", lambda: registry)
    generation = registry.generation
    with pytest.raises(ValueError, match="ambiguous selection: onnx_light/Add/blocked"):
        api.set_kernel_tuning_parameters("Add", "float", {MIN_ELEMENTS: 5}, path=tmp_path / "c")
    assert registry.generation == generation
    result = api.set_kernel_tuning_parameters("Add", "float", {MIN_ELEMENTS: 5}, persist=False,
                                              implementation="blocked")
    assert result["key"] == str(blocked)


def test_reset_forgets_this_machine_and_keeps_other_entries(tmp_path: Path, local) -> None:
    path = tmp_path / "cache.txt"
    written = seeded_cache(path, local)
    onnx_light.set_kernel_tuning_parameters("Abs", "float", {MIN_ELEMENTS: 5}, path=path)
    onnx_light.load_kernel_tuning_cache(path)
    assert active("Add")["active_source"] == "published_profile"
    generation = default_registry().generation
    result = onnx_light.reset_kernel_tuning_parameters("Add", "float", path=path)
    assert result["keys"] == [str(ADD)]
    assert result["generation"] == default_registry().generation == generation + 1
    assert result["cache_update"]["removed"] == 1
    assert active("Add", path=path)["active_source"] != "published_profile"
    assert active("Add", path=path)["cached_values"] is None
    assert active("Abs", path=path)["active_values"] == {MIN_ELEMENTS: 5}
    text = path.read_text(encoding="utf-8")
    assert written["theirs"].to_line() in text
    assert "otherlib/Conv/fast" in text
    assert written["ours"].to_line() not in text


def test_reset_without_persist_keeps_the_file(tmp_path: Path, local) -> None:
    path = tmp_path / "cache.txt"
    onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN_ELEMENTS: 5}, path=path)
    before = state(path)
    onnx_light.reset_kernel_tuning_parameters(["Add"], path=path, persist=False)
    assert state(path) == before
    record = active("Add", path=path)
    assert record["active_source"] != "published_profile"
    assert record["cached_values"] == {MIN_ELEMENTS: 5}


def test_num_threads_selects_the_descriptor(tmp_path: Path, local) -> None:
    path = tmp_path / "cache.txt"
    threads = local.num_threads + 3
    result = onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN_ELEMENTS: 31}, path=path,
                                                     num_threads=threads)
    assert result["descriptor"] == {**local.to_dict(), "num_threads": threads}
    assert active("Add", path=path, num_threads=threads)["active_values"] == {MIN_ELEMENTS: 31}
    assert active("Add", path=path, num_threads=threads)["cached_values"] == {MIN_ELEMENTS: 31}
    assert active("Add", path=path)["active_source"] != "published_profile"
    assert active("Add", path=path)["cached_values"] is None
    inspected = onnx_light.inspect_kernel_tuning_cache(path, num_threads=threads)
    assert inspected["descriptor"]["num_threads"] == threads
    assert inspected["profiles"][0]["matches_this_machine"] is True
    assert onnx_light.inspect_kernel_tuning_cache(path)["profiles"][0]["matches_this_machine"] is False
    with pytest.raises(ValueError, match="num_threads"):
        onnx_light.kernel_tuning_parameters("Add", num_threads=0)
    with pytest.raises(TypeError, match="num_threads"):
        onnx_light.kernel_tuning_parameters("Add", num_threads=True)


# --------------------------------------------------------------------------------------------
# import onnx_light with ONNX_LIGHT_KERNEL_TUNING_CACHE
# --------------------------------------------------------------------------------------------

_IMPORT_SCRIPT = textwrap.dedent("""
    import json, logging
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append((record.levelname, record.getMessage()))

    logging.getLogger("onnx_light").addHandler(Collect())
    import onnx_light
    (record,) = onnx_light.kernel_tuning_parameters("Add", "float")
    print(json.dumps({"messages": messages, "source": record["active_source"],
                      "values": record["active_values"]}))
""")


def _import_with_cache(path: Path) -> dict[str, Any]:
    environment = {**os.environ, CACHE_ENV: str(path)}
    done = subprocess.run([sys.executable, "-c", _IMPORT_SCRIPT], env=environment, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["garbage", "directory"])
def test_import_with_an_unusable_cache_warns_and_succeeds(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "cache.txt"
    if kind == "garbage":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00 not a cache at all\n")
    else:
        path.mkdir()
    before = state(path) if kind == "garbage" else None
    seen = _import_with_cache(path)
    assert seen["source"] != "published_profile"
    warnings = [text for level, text in seen["messages"] if level == "WARNING"]
    assert len(warnings) == 1
    assert "kernel tuning cache" in warnings[0]
    assert str(path) in warnings[0]
    if before is not None:
        assert state(path) == before


def test_import_with_a_valid_cache_publishes_its_entries(tmp_path: Path, local) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [CacheEntry(ADD, local, {MIN_ELEMENTS: 2024}, {"origin": "manual"})])
    seen = _import_with_cache(path)
    assert [m for m in seen["messages"] if "kernel tuning cache" in m[1]] == []
    assert seen["source"] == "published_profile"
    assert seen["values"] == {MIN_ELEMENTS: 2024}


def test_import_is_quiet_about_entries_of_other_processors(tmp_path: Path, local) -> None:
    path = tmp_path / "cache.txt"
    other = CpuExecutionDescriptor(dataclasses.replace(local.cpu, model=(local.cpu.model or 0) + 1), 2)
    update_cache(path, [CacheEntry(ADD, other, {MIN_ELEMENTS: 7})])
    seen = _import_with_cache(path)
    assert [m for m in seen["messages"] if m[0] == "WARNING"] == []
    assert seen["source"] != "published_profile"


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_an_error_without_a_message_is_named_by_its_type(capsys, monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(cli_tune, "_tuning_report", fail)
    status, _, err = run_cli(capsys, "tune-kernels")
    assert status == 2
    assert err.strip().endswith("tune-kernels: error: MemoryError (no message)")


def report_rows(out: str) -> dict[str, list[str]]:
    """The report's table rows by key: the cells of one-line rows."""
    return {line.split()[0]: re.split(r"\s{2,}", line) for line in out.splitlines()
            if line.startswith("onnx_light/")}


def test_tune_kernels_text_report(tmp_path: Path, local, capsys) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [CacheEntry(ADD, local, {MIN_ELEMENTS: 4321})])
    status, out, err = run_cli(capsys, "tune-kernels", "--cache", str(path), "--kernel", "Add",
                               "--kernel", "Abs", "--element-type", "float")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"processor: {local.short()}"
    assert lines[1] == f"cache: {path}"
    assert re.split(r"\s{2,}", lines[2]) == ["key", "cache", "values from", "values"]
    rows = report_rows(out)
    assert rows[str(ADD)] == [str(ADD), "covered", "published", f"{MIN_ELEMENTS}=4321"]
    assert rows[str(ABS)][1:3] == ["missing", "portable default"]
    assert "selected 2, covered 1, missing 1 (1 calibratable, 0 schema-only)" in lines


@pytest.mark.parametrize(("origin", "label"), [("calibrated", "calibrated"),
                                               ("manual", "set by hand"), ("copied", "published")])
def test_tune_kernels_labels_published_values_by_their_origin(tmp_path: Path, local, capsys,
                                                              origin: str, label: str) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [CacheEntry(ADD, local, {MIN_ELEMENTS: 4321}, {"origin": origin})])
    out = run_cli(capsys, "tune-kernels", "--cache", str(path), "--kernel", "Add",
                  "--element-type", "float")[1]
    assert report_rows(out)[str(ADD)][2] == label
    (record,) = json.loads(run_cli(capsys, "tune-kernels", "--cache", str(path), "--kernel", "Add",
                                   "--element-type", "float", "--json")[1])["keys"]
    assert record["active_source"] == "published_profile"  # the spec's name stays in the JSON
    assert record["active_provenance"]["origin"] == origin


def test_tune_kernels_next_step_names_the_keys_and_the_budget(tmp_path: Path, capsys) -> None:
    path = tmp_path / "cache.txt"
    selection = ["--kernel", "Add", "--kernel", "Exp", "--element-type", "float", "--cache",
                 str(path)]
    out = run_cli(capsys, "tune-kernels", *selection)[1]
    command = "python -m onnx_light tune-kernels --apply " + " ".join(selection)
    (step,) = [line for line in out.splitlines() if line.startswith("next: ")]
    assert f"'{command}' calibrates the 2 missing key(s) of Add [float], Exp [float]" in step
    assert "in at most 6 s (3 s per key" in step
    out = run_cli(capsys, "tune-kernels", *selection, "--max-duration-ms", "60000")[1]
    assert "tune-kernels --apply --max-duration-ms 60000 --kernel Add" in out
    assert "in at most 60 s (--max-duration-ms)" in out
    default_registry().forget()
    onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN_ELEMENTS: 7}, path=path)
    onnx_light.set_kernel_tuning_parameters("Exp", "float", {MIN_ELEMENTS: 7}, path=path)
    out = run_cli(capsys, "tune-kernels", *selection)[1]
    assert "next: every selected key is covered" in out
    assert "tune-kernels --apply --force --kernel Add" in out
    assert "tune-kernels --reset --kernel Add" in out


@pytest.mark.parametrize("columns", [80, 132])
def test_tune_kernels_report_fits_the_terminal(capsys, monkeypatch, columns: int) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    status, out, _ = run_cli(capsys, "tune-kernels")
    assert status == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines if not line.startswith("cache: ")) <= columns  # a path
    registered = list(map(str, default_registry().snapshot().keys()))
    keys = [line.split()[0] for line in lines if line.split() and line.split()[0] in registered]
    assert keys == registered  # one row each, in order
    text = " ".join(out.split()).replace("= ", "=")  # wrapped cells joined again
    for record in onnx_light.kernel_tuning_parameters():
        values = " ".join(f"{name}={value}" for name, value in record["active_values"].items())
        assert values in text, record["key"]


def test_tune_kernels_report_to_a_pipe_keeps_one_line_per_key(capsys, monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # capsys: standard output is no terminal
    out = run_cli(capsys, "tune-kernels", "--kernel", "Conv")[1]
    rows = report_rows(out)
    assert len(rows) == len(onnx_light.kernel_tuning_parameters("Conv"))
    assert all(row[3].startswith("algorithm=") for row in rows.values())
    assert len(out.splitlines()) == len(rows) + 5  # processor, cache, header, summary, next


def test_tune_kernels_piped_into_head_stops_quietly(tmp_path: Path) -> None:
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache.txt")}
    process = subprocess.Popen([sys.executable, "-m", "onnx_light", "tune-kernels", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert process.stdout.readline().strip() == b"{"
    process.stdout.close()  # as head does after its lines
    assert process.wait(timeout=120) == 1
    assert process.stderr.read() == b""
    process.stderr.close()


def test_tune_kernels_json_report(tmp_path: Path, local, capsys) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [CacheEntry(ADD, local, {MIN_ELEMENTS: 4321})])
    status, out, _ = run_cli(capsys, "tune-kernels", "--cache", str(path), "--json")
    assert status == 0
    report = json.loads(out)
    assert CpuExecutionDescriptor.from_dict(report["descriptor"]) == local
    assert report["cache"] == str(path)
    records = report["keys"]
    assert [r["key"] for r in records] == list(map(str, default_registry().snapshot().keys()))
    covered = [r["key"] for r in records if r["cached_values"] is not None]
    assert covered == [str(ADD)]
    summary = report["summary"]
    assert summary["selected"] == len(records)
    assert summary["covered"] == 1
    assert summary["missing"] == len(records) - 1
    assert summary["missing_calibratable"] + summary["missing_schema_only"] == summary["missing"]
    assert summary["missing_calibratable"] == sum(
        r["calibratable"] for r in records if r["cached_values"] is None)


def test_tune_kernels_cache_report_shows_that_file_only(tmp_path: Path, local, capsys) -> None:
    default = Path(onnx_light.default_kernel_tuning_cache_path())
    update_cache(default, [CacheEntry(ABS, local, {MIN_ELEMENTS: 11})])
    onnx_light.load_kernel_tuning_cache()  # as the import does with the default cache
    other = tmp_path / "other.txt"
    update_cache(other, [CacheEntry(ADD, local, {MIN_ELEMENTS: 22})])
    before = default_registry().snapshot()
    status, out, _ = run_cli(capsys, "tune-kernels", "--cache", str(other), "--kernel", "Abs",
                             "--kernel", "Add", "--element-type", "float", "--json")
    assert status == 0
    active_by_key = {r["key"]: (r["active_source"], r["active_values"]) for r in json.loads(out)["keys"]}
    assert active_by_key[str(ADD)] == ("published_profile", {MIN_ELEMENTS: 22})
    assert active_by_key[str(ABS)][0] != "published_profile"
    assert default_registry().snapshot() is before  # the report left this process's values alone
    assert default_registry().snapshot().resolve(ABS, local).values == {MIN_ELEMENTS: 11}


@pytest.mark.parametrize("spelling", ["float", "FLOAT", "float32", "1"])
def test_tune_kernels_element_type_spellings(capsys, spelling: str) -> None:
    status, out, _ = run_cli(capsys, "tune-kernels", "--kernel", "Add", "--element-type", spelling,
                             "--json")
    assert status == 0
    assert [r["key"] for r in json.loads(out)["keys"]] == [str(ADD)]


def test_tune_kernels_threads(tmp_path: Path, local, capsys) -> None:
    path = tmp_path / "cache.txt"
    threads = local.num_threads + 2
    update_cache(path, [CacheEntry(ADD, CpuExecutionDescriptor(local.cpu, threads),
                                   {MIN_ELEMENTS: 64})])
    arguments = ["tune-kernels", "--cache", str(path), "--kernel", "Add", "--element-type", "float",
                 "--json"]
    report = json.loads(run_cli(capsys, *arguments, "--threads", str(threads))[1])
    assert report["descriptor"]["num_threads"] == threads
    assert report["summary"]["covered"] == 1
    assert report["keys"][0]["active_values"] == {MIN_ELEMENTS: 64}
    report = json.loads(run_cli(capsys, *arguments)[1])
    assert report["descriptor"]["num_threads"] == local.num_threads
    assert report["summary"]["covered"] == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kernel", "Nope"], "unknown kernel Nope"),
        (["--kernel", "Not", "--element-type", "float"], "the selected kernels have: bool"),
        (["--element-type", "quux"], "unknown ONNX element type"),
    ],
)
def test_tune_kernels_bad_selection_exits_2_with_one_line(capsys, argv: list[str],
                                                          message: str) -> None:
    status, out, err = run_cli(capsys, "tune-kernels", *argv)
    assert status == 2
    assert out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("python -m onnx_light tune-kernels: error: ")
    assert message in err


def test_tune_kernels_rejects_bad_thread_counts(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["tune-kernels", "--threads", "0"])
    assert info.value.code == 2
    assert "positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_tune_kernels_is_read_only(tmp_path: Path, local, capsys, extra: list[str]) -> None:
    path = tmp_path / "cache.txt"
    seeded_cache(path, local)
    before = state(path)
    listing = sorted(os.listdir(tmp_path))
    assert run_cli(capsys, "tune-kernels", "--cache", str(path), *extra)[0] == 0
    assert state(path) == before
    assert sorted(os.listdir(tmp_path)) == listing
    absent = tmp_path / "absent" / "cache.txt"
    assert run_cli(capsys, "tune-kernels", "--cache", str(absent), *extra)[0] == 0
    assert not absent.parent.exists()
    default = Path(onnx_light.default_kernel_tuning_cache_path())
    assert run_cli(capsys, "tune-kernels", *extra)[0] == 0
    assert not default.parent.exists()
    assert sorted(os.listdir(tmp_path)) == listing


def test_cpu_text(capsys, local) -> None:
    status, out, _ = run_cli(capsys, "cpu")
    assert status == 0
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert rows["architecture"] == local.cpu.architecture
    assert rows["microarchitecture"] == local.cpu.microarchitecture
    assert rows["features"] == (" ".join(sorted(local.cpu.features)) or "-")
    assert rows["effective threads"] == str(local.num_threads)


@pytest.mark.parametrize("threads", [None, 3])
def test_cpu_json_parses_back(capsys, local, threads: int | None) -> None:
    argv = ["cpu", "--json"] + ([] if threads is None else ["--threads", str(threads)])
    status, out, _ = run_cli(capsys, *argv)
    assert status == 0
    parsed = CpuExecutionDescriptor.from_dict(json.loads(out))
    assert parsed.cpu == local.cpu
    assert parsed.num_threads == (local.num_threads if threads is None else threads)


def test_module_help_lists_the_subcommands() -> None:
    done = subprocess.run([sys.executable, "-m", "onnx_light", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m onnx_light ")
    assert "tune-kernels" in done.stdout
    assert "cpu" in done.stdout.split()


def test_the_console_script_names_itself() -> None:
    script = Path(sys.executable).parent / "onnx-light"
    if not script.exists():
        pytest.skip("the onnx-light console script is not installed beside this interpreter")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: onnx-light ")
    done = subprocess.run([str(script), "run", "absent.onnx"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("onnx-light run: error: no ONNX model file at 'absent.onnx'")


@pytest.mark.parametrize(("argv0", "prog"), [
    ("/venv/bin/onnx-light", "onnx-light"), ("/venv/Scripts/onnx-light.exe", "onnx-light"),
    ("/src/onnx_light/__main__.py", "python -m onnx_light"), ("/venv/bin/pytest", "python -m onnx_light"),
    ("", "python -m onnx_light")])
def test_program_name_is_the_invoked_one(argv0: str, prog: str) -> None:
    assert cli.program_name(argv0) == prog


@pytest.mark.parametrize("argv", [["run", "absent.onnx"], ["tune-kernels", "--threads", "0"]])
def test_usage_and_runtime_errors_share_one_prefix(capsys, monkeypatch, argv: list[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["/venv/bin/onnx-light"])
    try:
        status = cli.main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        status = exit_.code
    assert status == 2
    assert capsys.readouterr().err.startswith(f"onnx-light {argv[0]}: error: ")


@pytest.mark.parametrize("command", [["cpu"], ["tune-kernels", "--kernel", "Add", "--json"]])
def test_threads_above_the_effective_count_warn(capsys, local, command: list[str]) -> None:
    status, _, err = run_cli(capsys, *command, "--threads", str(local.num_threads + 1))
    assert status == 0
    assert err.startswith(f"warning: --threads {local.num_threads + 1} is more than the "
                          f"{local.num_threads} CPU(s) this process may use")
    status, _, err = run_cli(capsys, *command, "--threads", str(local.num_threads))
    assert (status, err) == (0, "")


def test_run_says_what_a_file_that_is_no_model_is(tmp_path: Path, capsys) -> None:
    status, _, err = run_cli(capsys, "run", str(ROOT / "README.md"))
    assert status == 2
    assert f"{str(ROOT / 'README.md')!r} is not an ONNX model: it is a text file (first line " \
           "'# onnx_light')" in err
    np.save(tmp_path / "x.npy", np.zeros(3))
    status, _, err = run_cli(capsys, "run", str(tmp_path / "x.npy"))
    assert status == 2 and "is not an ONNX model: it is a NumPy array (.npy)" in err
    status, _, err = run_cli(capsys, "run", str(tmp_path))
    assert status == 2 and f"no ONNX model file at {str(tmp_path)!r}: it is a folder" in err


def test_run_lists_the_real_inputs_of_a_model_with_initializers_as_inputs(tmp_path: Path,
                                                                         capsys) -> None:
    from onnx import TensorProto, helper, numpy_helper, save

    weights = [numpy_helper.from_array(np.full(4, i, np.float32), f"w{i}") for i in range(5)]
    node = helper.make_node("Sum", ["x", *(w.name for w in weights)], ["y"])
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4])
              for n in ["x", *(w.name for w in weights)]]  # IR 3 style: weights listed as inputs
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], weights)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.ones(4, np.float32))
    status, _, err = run_cli(capsys, "run", str(tmp_path / "m.onnx"), "--input",
                             f"wrong={tmp_path / 'x.npy'}")
    assert status == 2
    assert "unknown input(s) ['wrong']; inputs: ['x'] (5 initializer(s) listed as graph inputs " \
           "may also be fed)" in err


def test_run_prints_sequence_outputs_and_refuses_to_invent_a_sequence_input(tmp_path: Path,
                                                                           capsys) -> None:
    from onnx import TensorProto, helper, save

    sequence, tensor = helper.make_tensor_sequence_value_info, helper.make_tensor_value_info
    split = helper.make_graph(
        [helper.make_node("SplitToSequence", ["x"], ["s"], keepdims=0)], "g",
        [tensor("x", TensorProto.FLOAT, [3, 2])], [sequence("s", TensorProto.FLOAT, None)])
    save(helper.make_model(split, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "out.onnx")
    status, out, _ = run_cli(capsys, "run", str(tmp_path / "out.onnx"), "--repeat", "1")
    assert status == 0 and "s: sequence of 3 tensor(s), shapes [[2], [2], [2]]" in out
    concat = helper.make_graph(
        [helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)], "g",
        [sequence("s", TensorProto.FLOAT, [2])], [tensor("y", TensorProto.FLOAT, None)])
    save(helper.make_model(concat, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "in.onnx")
    status, _, err = run_cli(capsys, "run", str(tmp_path / "in.onnx"))
    assert status == 2 and ("input 's' has type seq(tensor(float)): random inputs are made for "
                            "tensors only") in err
