"""Processor profiles as data: the shipped files against their JSON Schema, the loader's own
checks (naming the file and the field), inheritance through archspec's ancestry, an
organisation's folder, staleness of profiles, and ``tune-kernels --export-profile``.

The suite runs without the shipped profiles (tests/conftest.py); the tests here load them
into registries of their own, or in a child process without that setting.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from tuning_helpers import cpu, descriptor

import onnx_light
from onnx_light import kernels
from onnx_light.cli import main
from onnx_light.kernels import profiles as shipped
from onnx_light.tuning import KernelTuningKey, KernelTuningRegistry, execution_descriptor
from onnx_light.tuning.processor import CpuExecutionDescriptor
from onnx_light.tuning.profile_files import (
    ORGANISATION_PRIORITY,
    PROFILES_ENV,
    ProfileFileError,
    parse_profile_file,
    register_profile_files,
)

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "onnx_light" / "tuning" / "profile-file.schema.json").read_text())
SHIPPED_FOLDER = ROOT / "onnx_light" / "kernels" / "profiles"
ADD = KernelTuningKey.parse("onnx_light/Add/portable[float]@cpu#1")
MIN = "parallel.minimum_elements"


def shipped_files() -> list[Path]:
    return sorted(SHIPPED_FOLDER.glob("*.json"))


def library_registry() -> KernelTuningRegistry:
    """A registry with the library's schemas and callbacks and no processor profile."""
    registry = KernelTuningRegistry()
    registry.register(schemas=kernels.tuning_schemas(), callbacks=kernels.calibration_callbacks())
    return registry


def schema_errors(data) -> list[str]:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in validator.iter_errors(data))


def a_file(*profiles: dict, machine=None) -> dict:
    """A profile file measured on an icelake machine (or ``machine``)."""
    return {"format": "onnx_light-processor-profiles", "version": 1,
            "provenance": {"machine": (machine or cpu("icelake")).to_dict(), "notes": "test"},
            "profiles": list(profiles)}


def a_profile(value: int = 5000, selector=None, threads=(2, 2), revision: int = 1, key=ADD) -> dict:
    return {"key": str(key),
            "selector": selector or {"microarchitecture": {"name": "icelake",
                                                           "include_descendants": True}},
            "threads": list(threads) if threads else None, "revision": revision,
            "values": {MIN: value}, "provenance": {"origin": "calibrated"}}


def register(registry, data: dict, name: str = "test.json", **kwargs) -> dict:
    (report,) = register_profile_files(registry, [(name, json.dumps(data))], **kwargs)
    return report


# --------------------------------------------------------------------------------------------
# The shipped files


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_profiles_are_shipped():
    assert shipped_files(), "no processor profile file in onnx_light/kernels/profiles/"


@pytest.mark.parametrize("path", shipped_files(), ids=lambda p: p.name)
def test_each_shipped_file_matches_the_schema_and_registers_entirely(path: Path):
    data = json.loads(path.read_text(encoding="utf-8"))
    assert schema_errors(data) == []
    registry = library_registry()
    report = register(registry, data, name=path.name)
    assert report["error"] is None and report["skipped"] == [], report
    assert report["registered"] == len(data["profiles"]) > 0


@pytest.mark.parametrize("path", shipped_files(), ids=lambda p: p.name)
def test_each_shipped_profile_has_its_provenance(path: Path):
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["provenance"]["command"].startswith("python -m onnx_light tune-kernels --apply")
    assert "noisy" in data["provenance"]["notes"] or "idle" in data["provenance"]["notes"]
    for profile in data["profiles"]:
        provenance = profile["provenance"]
        assert set(provenance["measured_under"]) == {"onnx_light", "revision", "numpy", "blas",
                                                     "numba"}
        assert provenance["measured"] and provenance["measurements"]["count"] >= 0
        assert {"median_spread", "max_spread", "load_average"} <= set(provenance["measurements"])


def test_the_shipped_microarchitecture_profile_is_inherited_by_descendants_only():
    registry = library_registry()
    for path in shipped_files():
        register(registry, json.loads(path.read_text(encoding="utf-8")), name=path.name)
    snapshot = registry.snapshot()
    names = {next(iter(p.profile.selector.to_dict().values())).get("name")
             for p in snapshot.profiles[ADD]}
    assert "icelake" in names  # the microarchitecture of the machine that measured them
    assert snapshot.resolve(ADD, descriptor("icelake", 2)).source == "microarchitecture_profile"
    descendant = snapshot.resolve(ADD, descriptor("sapphirerapids", 2))  # descends from icelake
    assert descendant.source == "microarchitecture_profile"
    for other in ("cascadelake", "skylake_avx512", "haswell", "zen4", "neoverse_v1"):
        # ancestors of icelake, and other vendors, are not covered
        assert snapshot.resolve(ADD, descriptor(other, 2)).source == "portable_default", other


def child(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("ONNX_LIGHT_SHIPPED_PROFILES", PROFILES_ENV)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**environment, **env}, timeout=120, check=False)


def test_with_an_empty_cache_a_shipped_profile_resolves_here_and_tune_kernels_names_it(tmp_path):
    registry = library_registry()
    for path in shipped_files():
        register(registry, json.loads(path.read_text(encoding="utf-8")), name=path.name)
    threads = execution_descriptor().num_threads
    if registry.snapshot().resolve(ADD, execution_descriptor()).source == "portable_default":
        pytest.skip(f"no shipped profile covers this processor at {threads} threads")
    run = child("from onnx_light.cli import main; "
                "raise SystemExit(main(['tune-kernels', '--kernel', 'Add', '--element-type', "
                "'float']))", {"ONNX_LIGHT_KERNEL_TUNING_CACHE": str(tmp_path / "none.txt"),
                               "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr
    found = re.search(r"Add/portable\[float\]@cpu#1\s+missing\s+shipped: (?:exact processor|"
                      r"processor list|microarchitecture|instruction set) \(([\w.-]+\.json)\)", run.stdout)
    assert found and found.group(1) in {path.name for path in shipped_files()}, run.stdout


# --------------------------------------------------------------------------------------------
# The loader's checks: the file and the field, as the schema would say


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("profiles"), r"test\.json: profiles: missing"),
    (lambda d: d.update(format="other"), r"test\.json: format: must be"),
    (lambda d: d.update(version=2), r"test\.json: version: this onnx_light reads version 1"),
    (lambda d: d["provenance"].pop("machine"), r"test\.json: provenance\.machine: missing"),
    (lambda d: d["provenance"]["machine"].pop("vendor"), r"provenance\.machine: missing field vendor"),
    (lambda d: d["profiles"][0].pop("revision"), r"test\.json: profiles\[0\]\.revision: missing"),
    (lambda d: d["profiles"][0].update(revision=0), r"profiles\[0\]\.revision: must be an int >= 1"),
    (lambda d: d["profiles"][0].update(threads=[2]), r"profiles\[0\]\.threads: must be \[min, max\]"),
    (lambda d: d["profiles"][0].update(colour="red"), r"profiles\[0\]\.colour: unknown field"),
    (lambda d: d["profiles"][0]["values"].update({MIN: [1]}),
     r"profiles\[0\]\.values\.parallel\.minimum_elements: must be a JSON scalar"),
    (lambda d: d["profiles"][0].update(key="Add"), r"profiles\[0\]\.key: "),
    (lambda d: d["profiles"][0]["selector"]["microarchitecture"].update(name="nope"),
     r"profiles\[0\]\.selector: unknown microarchitecture 'nope'"),
    (lambda d: d["profiles"][0].update(selector={"exact_processor": {"vendor": "intel"}}),
     r"profiles\[0\]\.selector: "),
])
def test_a_broken_file_is_named_with_its_field_by_the_loader_and_the_schema(change, message):
    data = a_file(a_profile())
    assert schema_errors(data) == []
    change(data)
    with pytest.raises(ProfileFileError, match=message):
        parse_profile_file("test.json", json.dumps(data))
    if "unknown microarchitecture" not in message and "missing field vendor" not in message:
        assert schema_errors(data), "the schema accepts what the loader rejects"


def test_not_json_and_nan_are_rejected():
    with pytest.raises(ProfileFileError, match=r"x\.json: not JSON"):
        parse_profile_file("x.json", "{")
    text = json.dumps(a_file(a_profile())).replace("5000", "NaN")
    with pytest.raises(ProfileFileError, match="NaN is not allowed"):
        parse_profile_file("x.json", text)


def test_profiles_of_another_abi_or_kernel_revision_are_stale_and_the_rest_register():
    registry = library_registry()
    old_abi = KernelTuningKey.parse("onnx_light/Add/portable[float]@cpu#7")
    other_library = KernelTuningKey.parse("elsewhere/Add/portable[float]@cpu#1")
    report = register(registry, a_file(a_profile(key=old_abi), a_profile(revision=2),
                                       a_profile(key=other_library), a_profile(threads=(1, 1))))
    assert report["registered"] == 1 and report["error"] is None
    outcomes = {(s["key"], s["outcome"]) for s in report["skipped"]}
    assert outcomes == {(str(old_abi), "stale"), (str(ADD), "stale"), (str(other_library), "unknown_key")}
    assert any("kernel revision 2" in s["reason"] and "revision 1" in s["reason"]
               for s in report["skipped"])
    resolution = registry.snapshot().resolve(ADD, descriptor("icelake", 1))
    assert resolution.source == "microarchitecture_profile" and resolution.values[MIN] == 5000


def test_a_file_the_registry_rejects_is_skipped_whole_and_others_still_load():
    registry = library_registry()
    bad = a_file(a_profile(value=0))  # below the parameter's minimum
    reports = register_profile_files(registry, [("bad.json", json.dumps(bad)),
                                                ("good.json", json.dumps(a_file(a_profile())))])
    assert "bad.json: not registered" in reports[0]["error"] and reports[0]["registered"] == 0
    assert reports[1]["registered"] == 1
    assert registry.snapshot().resolve(ADD, descriptor("icelake", 2)).values[MIN] == 5000


# --------------------------------------------------------------------------------------------
# An organisation's folder


def test_an_organisation_profile_outranks_a_shipped_one_of_equal_specificity():
    registry = library_registry()
    register(registry, a_file(a_profile(value=1111)), name="shipped.json")
    register(registry, a_file(a_profile(value=2222)), name="org.json",
             priority=ORGANISATION_PRIORITY, source="organisation")
    resolution = registry.snapshot().resolve(ADD, descriptor("icelake", 2))
    assert resolution.values[MIN] == 2222
    assert resolution.profile.provenance["source"] == "organisation"
    # A more specific shipped profile still wins over a less specific organisation one.
    exact = {"exact_processor": {"vendor": "intel", "family": 6, "model": 106}}
    register(registry, a_file(a_profile(value=3333, selector=exact)), name="exact.json")
    assert registry.snapshot().resolve(ADD, descriptor("icelake", 2)).values[MIN] == 3333


def test_the_organisation_folder_loads_at_import_below_the_user_cache(tmp_path: Path):
    here = execution_descriptor()
    folder = tmp_path / "org"
    folder.mkdir()
    local = {"exact_processor": {"vendor": here.cpu.vendor, "family": here.cpu.family,
                                 "model": here.cpu.model}}
    (folder / "a.json").write_text(json.dumps(a_file(
        a_profile(value=4242, selector=local, threads=None), machine=here.cpu)))
    (folder / "b.json").write_text("{ not json")
    cache = tmp_path / "cache.txt"
    code = ("import logging, onnx_light; "
            "r = onnx_light.kernel_tuning_parameters('Add', 'float')[0]; "
            "print(r['active_source'], r['active_values']['parallel.minimum_elements'], "
            "r['active_provenance']['source'])")
    env = {PROFILES_ENV: str(folder), "ONNX_LIGHT_KERNEL_TUNING_CACHE": str(cache),
           "ONNX_LIGHT_SHIPPED_PROFILES": "0"}
    run = child(code, env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["exact_processor_profile", "4242", "organisation"]
    assert "b.json: not JSON" in run.stderr  # logged; the import went on
    onnx_light.set_kernel_tuning_parameters("Add", "float", {MIN: 77}, path=cache,
                                            persist=True, registry=library_registry())
    run = child(code.replace("r['active_provenance']['source']", "r['active_provenance']['origin']"),
                env)
    assert run.stdout.split() == ["published_profile", "77", "manual"], run.stderr


# --------------------------------------------------------------------------------------------
# tune-kernels --apply --export-profile


@pytest.mark.usefixtures("isolated_tuning")
@pytest.mark.parametrize(("selector", "source"), [
    ("exact", "exact_processor_profile"), ("microarchitecture", "microarchitecture_profile"),
    ("isa", "instruction_set_profile"), (None, "microarchitecture_profile")])
def test_export_writes_a_file_that_resolves_here(tmp_path: Path, capsys, selector, source):
    output = tmp_path / "mine.json"
    argv = ["tune-kernels", "--apply", "--quiet", "--kernel", "Abs", "--element-type", "float",
            "--threads", "1", "--cache", str(tmp_path / "c.txt"), "--export-profile", str(output)]
    assert main(argv + (["--selector", selector] if selector else [])) == 0
    assert f"profile written: {output} (1 profile(s)" in capsys.readouterr().out
    data = json.loads(output.read_text(encoding="utf-8"))
    assert schema_errors(data) == []
    (profile,) = data["profiles"]
    assert profile["threads"] == [1, 1] and profile["provenance"]["origin"] == "calibrated"
    assert "--export-profile" in data["provenance"]["command"]
    registry = library_registry()
    assert register(registry, data)["registered"] == 1
    here = CpuExecutionDescriptor(execution_descriptor().cpu, 1)
    assert registry.snapshot().resolve(KernelTuningKey.parse(profile["key"]), here).source == source


@pytest.mark.usefixtures("isolated_tuning")
def test_export_keeps_other_thread_counts_and_refuses_another_machines_file(tmp_path: Path, capsys):
    output = tmp_path / "mine.json"
    for threads in ("1", "2"):
        assert main(["tune-kernels", "--apply", "--quiet", "--kernel", "Abs", "--element-type",
                     "float", "--threads", threads, "--max-duration-ms", "300",
                     "--cache", str(tmp_path / "c.txt"), "--export-profile", str(output)]) == 0
    assert [p["threads"] for p in json.loads(output.read_text())["profiles"]] == [[1, 1], [2, 2]]
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps(a_file(a_profile(), machine=cpu("zen4"))))
    with pytest.raises(ProfileFileError, match="measured on another processor"):
        onnx_light.tuning.export_kernel_tuning_profile(foreign, "exact", "Abs", "float",
                                                        path=tmp_path / "c.txt", num_threads=1)
    assert json.loads(foreign.read_text())["provenance"]["machine"]["vendor"] == "amd"


@pytest.mark.parametrize("argv", [["--export-profile", "x.json"], ["--apply", "--selector", "isa"],
                                  ["--apply", "--ray", "auto", "--export-profile", "x.json"]])
def test_export_options_are_checked(argv, capsys):
    assert main(["tune-kernels", *argv]) != 0
    assert "--export-profile" in capsys.readouterr().err


def test_import_logs_an_unreadable_organisation_file_and_keeps_going(tmp_path, caplog):
    folder = tmp_path / "org"
    folder.mkdir()
    (folder / "broken.json").write_text(json.dumps(copy.deepcopy(a_file(a_profile(revision=0)))))
    os.environ[PROFILES_ENV] = str(folder)
    try:
        with caplog.at_level(logging.WARNING, logger="onnx_light"):
            reports = shipped.register_profiles(library_registry())
    finally:
        del os.environ[PROFILES_ENV]
    assert [r["source"] for r in reports] == ["organisation"]
    assert "profiles[0].revision: must be an int >= 1" in caplog.text
