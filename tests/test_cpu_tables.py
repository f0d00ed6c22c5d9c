"""The processor facts kept as data (onnx_light/tuning/processor/cpu_tables.json).

The shipped file must match its schema (checked with jsonschema, naming what is wrong), the
tables are read only when needed, and the one vendor table serves detection and profile
selectors alike (so that the two cannot drift apart again).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import archspec.cpu
import jsonschema
import pytest

from onnx_light.tuning.processor import KERNEL_FEATURES, parse_proc_cpuinfo, tables
from onnx_light.tuning.processor.parsing import cpu_from_sources
from onnx_light.tuning.processor.vendors import arm_implementer, vendor_name
from onnx_light.tuning.profiles import Microarchitecture

ROOT = Path(__file__).resolve().parents[1]


def shipped(name: str):
    package = resources.files("onnx_light.tuning.processor")
    return json.loads(package.joinpath(name).read_text(encoding="utf-8"))


def schema_errors(data) -> list[str]:
    """Each place where ``data`` breaks the shipped schema, as ``path: message``."""
    validator = jsonschema.Draft202012Validator(shipped(tables.SCHEMA_FILE))
    return sorted(f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
                  for error in validator.iter_errors(data))


def test_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(shipped(tables.SCHEMA_FILE))


def test_shipped_tables_match_their_schema():
    assert schema_errors(shipped(tables.DATA_FILE)) == []
    loaded = tables.load_tables()
    assert set(loaded) == {"features", "vendors"}
    assert loaded["features"]["x86"]["pni"] == "sse3"


@pytest.mark.parametrize(("change", "message"), [
    (lambda data: data.pop("vendors"), r"^: 'vendors' is a required property"),
    (lambda data: data["features"].update(sse9={}), r"^features: .*'sse9' was unexpected"),
    (lambda data: data["features"]["x86"].update(pni=3), r"^features\.x86\.pni: 3 is not of type"),
    (lambda data: data["features"]["x86"].update(pni="SSE3"), r"^features\.x86\.pni: 'SSE3' does not"),
    (lambda data: data["features"]["darwin_arm"].update({"hw.optional.neon": []}),
     r"^features\.darwin_arm\.hw\.optional\.neon: \[\] should be non-empty"),
    (lambda data: data["vendors"]["arm_implementers"].update({"65": "arm"}),
     r"^vendors\.arm_implementers: '65' does not match"),
])
def test_schema_names_the_broken_key(change, message):
    data = copy.deepcopy(shipped(tables.DATA_FILE))
    change(data)
    errors = schema_errors(data)
    assert len(errors) == 1 and re.search(message, errors[0]), errors


def test_tables_are_read_only_when_needed():
    # Importing the onnx_light package detects the processor (its cache loads at import),
    # so the tuning core is imported here under an empty onnx_light package.
    code = (
        "import sys, types; package = types.ModuleType('onnx_light'); "
        f"package.__path__ = [{str(ROOT / 'onnx_light')!r}]; sys.modules['onnx_light'] = package; "
        "from onnx_light.tuning.processor import tables; "
        "print(tables.load_tables.cache_info().currsize); "
        "from onnx_light.tuning.processor import KERNEL_FEATURES; "
        "print(tables.load_tables.cache_info().currsize)"
    )
    output = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, check=True, timeout=120).stdout
    assert output.split() == ["0", "1"]


def test_kernel_features_cover_every_table():
    data = tables.load_tables()["features"]
    for family in ("x86", "arm", "power", "riscv"):
        assert set(data[family].values()) <= KERNEL_FEATURES
    implied = {name for names in data["darwin_arm"].values() for name in names}
    assert implied <= KERNEL_FEATURES


def test_every_archspec_vendor_has_a_canonical_name():
    # A vendor archspec adds later must be added to the one table, or profiles would treat
    # its targets as generic while detection lower-cases its name: the drift this prevents.
    vendors = {target.vendor for target in archspec.cpu.TARGETS.values()} - {"generic"}
    assert vendors, "archspec lists no vendors"
    unknown = sorted(vendor for vendor in vendors if vendor_name(vendor) is None)
    assert unknown == []


def test_profiles_and_detection_name_vendors_alike():
    for name, target in archspec.cpu.TARGETS.items():
        detected = cpu_from_sources(target.family.name, None, None, name, 1,
                                    fallback_vendor=target.vendor).vendor
        expected = "unknown" if target.vendor == "generic" else detected
        assert (Microarchitecture(name).vendor or "unknown") == expected, name


def test_arm_implementers_agree_with_archspec_arm_vendors():
    # Detection names an Arm vendor from the implementer code; a microarchitecture
    # profile names it from archspec: both must produce the same word.
    implementers = set(tables.load_tables()["vendors"]["arm_implementers"].values())
    for target in archspec.cpu.TARGETS.values():
        if target.family.name == "aarch64" and target.vendor != "generic":
            assert vendor_name(target.vendor) in implementers, target.name
    assert arm_implementer(0x41) == "arm" and arm_implementer(0xC0) == "ampere"
    cpuinfo = "processor : 0\nCPU implementer : 0xc0\nCPU architecture: 8\nCPU part : 0xac3\n"
    assert parse_proc_cpuinfo(cpuinfo, "aarch64")["vendor"] == vendor_name("Ampere")


def test_hygon_is_known_to_detection_and_profiles():
    cpuinfo = "processor : 0\nvendor_id : HygonGenuine\ncpu family : 24\nmodel : 1\n"
    assert parse_proc_cpuinfo(cpuinfo, "x86_64")["vendor"] == "hygon"
    assert vendor_name("HygonGenuine") == "hygon"
