"""Tests for onnx_light.tuning.processor (processor detection and execution descriptor)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from onnx_light.tuning.processor import (
    KERNEL_FEATURES,
    CpuDescriptor,
    CpuExecutionDescriptor,
    cgroup_cpu_dirs,
    count_physical_cores,
    cpu_from_sources,
    cpu_from_sysctl,
    detect_cpu,
    detection,
    effective_thread_count,
    execution_descriptor,
    normalise_features,
    parse_cgroup_v1_cpu_quota,
    parse_cgroup_v2_cpu_max,
    parse_proc_cpuinfo,
    parse_sysctl_output,
    parse_sysfs_caches,
    readers,
    reset_detection_cache,
    threads,
)

DATA = Path(__file__).parent / "data" / "cpuinfo"
ROOT = Path(__file__).resolve().parents[1]
NOISE = {"hypervisor", "rdrand", "constant_tsc", "aes", "ht", "pku", "sha_ni", "evtstrm",
         "cpuid", "gfni", "vaes", "paca", "rng"}


@pytest.fixture(autouse=True)
def _fresh_detection():
    reset_detection_cache()
    yield
    reset_detection_cache()


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def sample_cpu(**changes) -> CpuDescriptor:
    fields = dict(
        architecture="x86_64", vendor="amd", family=25, model=1, stepping=1,
        microarchitecture="zen3", features=frozenset({"avx", "avx2", "fma"}), cache_line=64,
        l1d=32768, l2=524288, l3=33554432, physical_cores=8, logical_cores=16,
    )
    fields.update(changes)
    return CpuDescriptor(**fields)


# ------------------------------------------------------------------------------------------
# Parsing of synthetic captures
# ------------------------------------------------------------------------------------------


def test_intel_icelake_server():
    info = parse_proc_cpuinfo(read("intel_icelake_server.txt"), "x86_64")
    assert (info["vendor"], info["family"], info["model"], info["stepping"]) == (
        "intel", 6, 106, 6)
    assert {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni",
            "avx512_ifma", "avx512_vbmi", "avx2", "fma", "f16c", "sse4_2", "sse3"} <= info[
        "features"]
    assert not {"avx512_bf16", "avx512_fp16", "amx_tile", "avx_vnni"} & info["features"]
    assert info["physical_cores"] == 2  # 4 logical CPUs, 2 (physical id, core id) pairs
    assert info["cache_line"] == 64


def test_amd_zen3():
    info = parse_proc_cpuinfo(read("amd_zen3.txt"), "x86_64")
    assert (info["vendor"], info["family"], info["model"], info["stepping"]) == ("amd", 25, 1, 1)
    assert info["features"] == {"sse2", "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2",
                                "fma", "f16c"}
    assert info["physical_cores"] == 1  # two SMT siblings of one core


def test_arm_neoverse_v1_with_sve():
    info = parse_proc_cpuinfo(read("arm_neoverse_v1.txt"), "aarch64")
    assert (info["vendor"], info["family"], info["model"], info["stepping"]) == (
        "arm", 8, 0xD40, 1)
    assert info["features"] == {"neon", "fp16", "asimdhp", "dotprod", "fhm", "sve", "i8mm",
                                "bf16", "sve_i8mm", "sve_bf16"}
    assert "sve2" not in info["features"]
    assert info["physical_cores"] is None  # Arm cpuinfo has no core ids
    assert info["cache_line"] is None


def test_apple_aarch64_without_sve():
    info = parse_proc_cpuinfo(read("apple_m1_linux.txt"), "aarch64")
    assert (info["vendor"], info["family"], info["model"]) == ("apple", 8, 0x022)
    assert {"neon", "dotprod", "fp16", "asimdhp", "fhm"} <= info["features"]
    assert not {"sve", "sve2", "i8mm", "bf16"} & info["features"]


def test_power9():
    info = parse_proc_cpuinfo(read("ibm_power9.txt"), "ppc64le")
    assert (info["vendor"], info["family"], info["model"], info["stepping"]) == (
        "ibm", 9, 0x004E, 0x1202)
    assert info["features"] == {"altivec", "vsx"}
    assert info["physical_cores"] is None


def test_riscv64():
    info = parse_proc_cpuinfo(read("riscv64_rvv.txt"), "riscv64")
    assert info["vendor"] == "sifive"
    assert (info["family"], info["model"], info["stepping"]) == (None, None, None)
    assert info["features"] == {"rvv", "zfh", "zvfh"}
    assert normalise_features("rv64imafdc_zicsr", "riscv64") == frozenset()


@pytest.mark.parametrize("architecture", ["x86_64", "aarch64", "ppc64le", "riscv64"])
@pytest.mark.parametrize("text", ["", "garbage without colons\n\n\n", None])
def test_empty_or_garbage_is_unknown(architecture, text):
    info = parse_proc_cpuinfo(text if text is not None else read("garbled.txt"), architecture)
    assert info["vendor"] == "unknown"
    assert info["features"] == frozenset()
    for key in ("family", "model", "stepping", "physical_cores", "cache_line"):
        assert info[key] is None, key


def test_garbled_capture_cpu_from_sources():
    cpu = cpu_from_sources("x86_64", read("garbled.txt"), None, "unknown", None)
    assert cpu.vendor == "unknown" and cpu.microarchitecture == "unknown"
    assert cpu.features == frozenset()
    for name in ("family", "model", "stepping", "cache_line", "l1d", "l2", "l3",
                 "physical_cores", "logical_cores"):
        assert getattr(cpu, name) is None, name


@pytest.mark.parametrize(("name", "architecture"), [
    ("intel_icelake_server.txt", "x86_64"), ("amd_zen3.txt", "x86_64"),
    ("arm_neoverse_v1.txt", "aarch64"), ("apple_m1_linux.txt", "aarch64"),
    ("ibm_power9.txt", "ppc64le"), ("riscv64_rvv.txt", "riscv64"),
    ("garbled.txt", "x86_64"),
])
def test_noise_flags_are_excluded(name, architecture):
    features = parse_proc_cpuinfo(read(name), architecture)["features"]
    assert features <= KERNEL_FEATURES
    assert not features & NOISE


def test_normalise_features_aliases():
    assert normalise_features("avx512vnni AVX1.0 SSE4.2 pni", "x86_64") == {
        "avx512_vnni", "avx", "sse4_2", "sse3"}
    assert normalise_features(["asimd", "asimddp", "fphp"], "aarch64") == {
        "neon", "dotprod", "fp16"}
    assert normalise_features("neon vfpv4", "armv7l") == {"neon"}


def test_sysfs_caches_and_topology():
    caches = {
        "index0": {"level": "1", "type": "Data", "size": "48K", "coherency_line_size": "64"},
        "index1": {"level": "1", "type": "Instruction", "size": "32K",
                   "coherency_line_size": "64"},
        "index2": {"level": "2", "type": "Unified", "size": "1280K\n"},
        "index3": {"level": "3", "type": "Unified", "size": "55296K"},
        "index4": {"level": "4", "type": "Unified", "size": "1M"},
    }
    assert parse_sysfs_caches(caches) == {
        "l1d": 48 * 1024, "l2": 1280 * 1024, "l3": 55296 * 1024, "cache_line": 64}
    assert parse_sysfs_caches(None) == {"l1d": None, "l2": None, "l3": None, "cache_line": None}
    assert parse_sysfs_caches({"index0": {"level": "x", "size": "?"}})["l1d"] is None
    assert count_physical_cores(["0,2\n", "1,3\n", "0,2\n", "1,3\n"]) == 2
    assert count_physical_cores([]) is None
    assert count_physical_cores(None) is None


def test_cpu_from_sources_neoverse():
    caches = {"index0": {"level": "1", "type": "Data", "size": "64K",
                         "coherency_line_size": "64"},
              "index2": {"level": "2", "type": "Unified", "size": "1024K"},
              "index3": {"level": "3", "type": "Unified", "size": "32768K"}}
    cpu = cpu_from_sources("aarch64", read("arm_neoverse_v1.txt"), caches, "neoverse_v1", 2,
                           thread_siblings=["0", "1"])
    assert cpu.vendor == "arm" and cpu.model == 0xD40 and cpu.microarchitecture == "neoverse_v1"
    assert (cpu.l1d, cpu.l2, cpu.l3, cpu.cache_line) == (65536, 1 << 20, 32 << 20, 64)
    assert (cpu.physical_cores, cpu.logical_cores) == (2, 2)
    assert "armv8 part 0xd40 (neoverse_v1) aarch64" in cpu.short()


def test_cpu_from_sources_vendor_fallback():
    cpu = cpu_from_sources("ppc64le", None, None, "power9le", None, fallback_vendor="IBM")
    assert cpu.vendor == "ibm" and cpu.family is None
    cpu = cpu_from_sources("x86_64", None, None, "x86_64", None, fallback_vendor="generic")
    assert cpu.vendor == "unknown"


def test_darwin_sysctl_apple_silicon():
    values = parse_sysctl_output(read("darwin_arm64_sysctl.txt"))
    assert values["machdep.cpu.brand_string"] == "Apple M1"
    cpu = cpu_from_sysctl("aarch64", values, "m1", 8)
    assert cpu.vendor == "apple"
    assert (cpu.family, cpu.model, cpu.stepping) == (None, None, None)
    assert cpu.features == {"neon", "asimdhp", "fp16", "dotprod", "fhm"}
    assert (cpu.l1d, cpu.l2, cpu.l3, cpu.cache_line) == (65536, 4 << 20, None, 128)
    assert cpu.physical_cores == 8


def test_darwin_sysctl_intel():
    cpu = cpu_from_sysctl("x86_64", parse_sysctl_output(read("darwin_x86_64_sysctl.txt")),
                          "skylake", 8)
    assert (cpu.vendor, cpu.family, cpu.model, cpu.stepping) == ("intel", 6, 158, 10)
    assert cpu.features == {"sse2", "sse3", "ssse3", "sse4_1", "sse4_2", "avx", "avx2",
                            "fma", "f16c"}
    assert (cpu.l1d, cpu.l2, cpu.l3, cpu.physical_cores) == (32768, 262144, 8 << 20, 4)


# ------------------------------------------------------------------------------------------
# Descriptors
# ------------------------------------------------------------------------------------------


def test_cpu_round_trip_is_exact():
    cpu = sample_cpu()
    data = cpu.to_dict()
    assert data["features"] == ["avx", "avx2", "fma"]
    assert CpuDescriptor.from_dict(json.loads(json.dumps(data))) == cpu
    unknown = sample_cpu(vendor="unknown", family=None, model=None, stepping=None,
                         microarchitecture="unknown", features=frozenset(), cache_line=None,
                         l1d=None, l2=None, l3=None, physical_cores=None, logical_cores=None)
    assert CpuDescriptor.from_dict(json.loads(json.dumps(unknown.to_dict()))) == unknown


def test_execution_round_trip_is_exact():
    descriptor = CpuExecutionDescriptor(sample_cpu(), 4)
    data = descriptor.to_dict()
    assert set(data) == {"cpu", "num_threads"} and data["num_threads"] == 4
    assert CpuExecutionDescriptor.from_dict(json.loads(json.dumps(data))) == descriptor


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.pop("model"), "model"),
    (lambda d: d.update(colour="red"), "colour"),
    (lambda d: d.update(family="25"), "family"),
    (lambda d: d.update(family=True), "family"),
    (lambda d: d.update(l2=-1), "l2"),
    (lambda d: d.update(l1d=1.5), "l1d"),
    (lambda d: d.update(vendor=None), "vendor"),
    (lambda d: d.update(features="avx"), "features"),
    (lambda d: d.update(features=["avx", 3]), "features"),
    (lambda d: d.update(physical_cores=0), "physical_cores"),
])
def test_cpu_from_dict_is_strict(change, field):
    data = sample_cpu().to_dict()
    change(data)
    with pytest.raises(ValueError, match=field):
        CpuDescriptor.from_dict(data)


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.pop("num_threads"), "num_threads"),
    (lambda d: d.update(num_threads=0), "num_threads"),
    (lambda d: d.update(num_threads=2.0), "num_threads"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: d.pop("cpu"), "cpu"),
    (lambda d: d.update(cpu=[]), "cpu"),
    (lambda d: d["cpu"].pop("l3"), r"cpu\.l3"),
    (lambda d: d["cpu"].update(model="x"), r"cpu\.model"),
    (lambda d: d["cpu"].update(bogus=1), r"cpu\.bogus"),
])
def test_execution_from_dict_is_strict(change, field):
    data = CpuExecutionDescriptor(sample_cpu(), 2).to_dict()
    change(data)
    with pytest.raises(ValueError, match=field):
        CpuExecutionDescriptor.from_dict(data)


def test_differences():
    base = CpuExecutionDescriptor(sample_cpu(), 4)
    assert base.differences(CpuExecutionDescriptor(sample_cpu(), 4)) == []
    other = CpuExecutionDescriptor(
        sample_cpu(model=17, features=frozenset({"avx", "avx2", "fma", "avx512f"})), 2)
    assert base.differences(other) == ["num_threads", "cpu.model", "cpu.features"]
    assert sample_cpu().differences(sample_cpu(l3=None)) == ["l3"]
    with pytest.raises(TypeError):
        base.differences(sample_cpu())


def test_short():
    line = CpuExecutionDescriptor(sample_cpu(), 4).short()
    assert line == ("amd family 25 model 1 (zen3) x86_64 avx,avx2,fma 8 cores/16 logical, "
                    "4 threads")
    assert "\n" not in sample_cpu(family=None, physical_cores=None).short()


def test_descriptors_are_frozen_and_hashable():
    cpu = sample_cpu(features=["fma", "avx"])  # any collection is normalised to a frozenset
    assert cpu.features == frozenset({"fma", "avx"})
    with pytest.raises(AttributeError):
        cpu.vendor = "intel"  # type: ignore[misc]
    assert len({cpu, sample_cpu(features={"avx", "fma"})}) == 1


# ------------------------------------------------------------------------------------------
# Thread count and cgroup quotas
# ------------------------------------------------------------------------------------------


def test_effective_thread_count_explicit():
    assert effective_thread_count(1) == 1
    assert effective_thread_count(64) == 64  # explicit values are not capped


@pytest.mark.parametrize(("value", "error"), [
    (0, ValueError), (-2, ValueError), (True, TypeError), (2.0, TypeError), ("2", TypeError),
])
def test_effective_thread_count_rejects_bad_values(value, error):
    with pytest.raises(error, match="num_threads"):
        effective_thread_count(value)


def test_effective_thread_count_default(monkeypatch):
    count = effective_thread_count()
    assert 1 <= count <= (os.cpu_count() or 1)
    monkeypatch.setattr(threads, "_available_cpus", lambda: 8)
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: 3)
    assert effective_thread_count() == 3
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda: None)
    assert effective_thread_count() == 8
    assert effective_thread_count(16) == 16


@pytest.mark.parametrize(("text", "expected"), [
    ("max 100000", None), ("max 100000\n", None), ("150000 100000", 2), ("50000 100000", 1),
    ("200000 100000\n", 2), ("1000 100000", 1), ("garbage", None), ("", None), (None, None),
    ("0 100000", None), ("100000 0", None), ("a b", None), ("1 2 3", None),
])
def test_cgroup_v2_cpu_max(text, expected):
    assert parse_cgroup_v2_cpu_max(text) == expected


@pytest.mark.parametrize(("quota", "period", "expected"), [
    ("-1\n", "100000\n", None), ("150000", "100000", 2), ("50000", "100000", 1),
    ("400000", "100000", 4), ("x", "100000", None), (None, None, None), ("100000", "0", None),
])
def test_cgroup_v1_cpu_quota(quota, period, expected):
    assert parse_cgroup_v1_cpu_quota(quota, period) == expected


def test_cgroup_cpu_dirs():
    cgroup = "0::/user.slice/job-1\n"
    mountinfo = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    assert cgroup_cpu_dirs(cgroup, mountinfo) == [
        (2, "/sys/fs/cgroup/user.slice/job-1"), (2, "/sys/fs/cgroup/user.slice"),
        (2, "/sys/fs/cgroup")]
    hybrid_cgroup = "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n0::/\n"
    hybrid_mounts = (
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    assert cgroup_cpu_dirs(hybrid_cgroup, hybrid_mounts) == [
        (1, "/sys/fs/cgroup/cpu,cpuacct/docker/abc"), (1, "/sys/fs/cgroup/cpu,cpuacct/docker"),
        (1, "/sys/fs/cgroup/cpu,cpuacct"), (2, "/sys/fs/cgroup/unified")]
    # Container view: the mount root is the container's own cgroup.
    container = "1 0 0:40 /docker/abc /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu\n"
    assert cgroup_cpu_dirs("3:cpu:/docker/abc\n", container) == [(1, "/sys/fs/cgroup/cpu")]
    assert cgroup_cpu_dirs("", "") == []
    assert cgroup_cpu_dirs("nonsense", "also nonsense - x") == []


def test_cgroup_cpu_limit_reads_files(monkeypatch, tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    files = {
        "/proc/self/cgroup": "0::/job\n",
        "/proc/self/mountinfo": f"29 23 0:26 / {tmp_path} rw - cgroup2 cgroup2 rw\n",
    }
    real_read = readers.read_text

    def fake_read(path):
        if path in files:
            return files[path]
        return real_read(path)

    monkeypatch.setattr(readers, "read_text", fake_read)
    assert threads.cgroup_cpu_limit() == 3  # the parent's quota limits the job
    monkeypatch.setattr(threads, "_available_cpus", lambda: 2)
    assert effective_thread_count() == 2


# ------------------------------------------------------------------------------------------
# Host detection
# ------------------------------------------------------------------------------------------


def test_detect_cpu_is_cached_and_thread_safe(monkeypatch):
    calls = []
    real_detect = detection._detect

    def counting_detect():
        calls.append(1)
        return real_detect()

    monkeypatch.setattr(detection, "_detect", counting_detect)
    results = []
    workers = [threading.Thread(target=lambda: results.append(detect_cpu())) for _ in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(calls) == 1
    assert all(result is results[0] for result in results)
    reset_detection_cache()
    detect_cpu()
    assert len(calls) == 2


def test_host_descriptor_is_sane():
    cpu = detect_cpu()
    assert isinstance(cpu, CpuDescriptor)
    assert cpu.features <= KERNEL_FEATURES
    assert CpuDescriptor.from_dict(json.loads(json.dumps(cpu.to_dict()))) == cpu
    assert cpu.logical_cores == os.cpu_count()
    descriptor = execution_descriptor(3)
    assert descriptor.cpu is cpu and descriptor.num_threads == 3
    assert execution_descriptor().num_threads == effective_thread_count()


def test_host_descriptor_equal_across_processes():
    code = ("import json; from onnx_light.tuning.processor import execution_descriptor; "
            "print(json.dumps(execution_descriptor().to_dict(), sort_keys=True))")
    outputs = [
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True, timeout=120).stdout
        for _ in range(2)
    ]
    assert outputs[0] == outputs[1]
    here = json.loads(outputs[0])
    assert CpuExecutionDescriptor.from_dict(here) == execution_descriptor()


def test_detect_cpu_never_raises(monkeypatch, caplog):
    def broken_read(path):
        raise OSError(f"cannot read {path}")

    def broken_archspec():
        raise RuntimeError("archspec exploded")

    monkeypatch.setattr(readers, "read_text", broken_read)
    monkeypatch.setattr(detection, "_archspec_host", broken_archspec)
    monkeypatch.setattr(detection, "_run_sysctl", lambda *names: broken_read("sysctl"))
    with caplog.at_level(logging.WARNING, logger="onnx_light"):
        cpu = detect_cpu()
    assert cpu.vendor == "unknown" and cpu.microarchitecture == "unknown"
    assert cpu.features == frozenset()
    for name in ("family", "model", "stepping", "cache_line", "l1d", "l2", "l3",
                 "physical_cores"):
        assert getattr(cpu, name) is None, name
    assert any(record.levelno == logging.WARNING and record.name == "onnx_light"
               for record in caplog.records)
    assert effective_thread_count() >= 1  # cgroup files unreadable: affinity alone


def test_detect_cpu_survives_unexpected_errors(monkeypatch, caplog):
    def explode(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(detection, "cpu_from_sources", explode)
    monkeypatch.setattr(detection, "cpu_from_sysctl", explode)
    with caplog.at_level(logging.WARNING, logger="onnx_light"):
        cpu = detect_cpu()
    assert cpu.vendor == "unknown" and cpu.features == frozenset()
    assert "boom" in caplog.text


def test_archspec_warnings_become_log_records(monkeypatch, caplog):
    def warning_archspec():
        import warnings

        warnings.warn("could not read something", stacklevel=1)
        return "x86_64", "generic"

    monkeypatch.setattr(detection, "_archspec_host", warning_archspec)
    with caplog.at_level(logging.WARNING, logger="onnx_light"):
        assert detection._host_archspec() == ("x86_64", "generic")
    assert "could not read something" in caplog.text
