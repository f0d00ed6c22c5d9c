"""Processor detection and the execution descriptor.

A :class:`CpuDescriptor` says which processor the kernels run on: vendor,
family/model/stepping, archspec microarchitecture, a *normalised* set of
instruction-set features, cache sizes and core counts. A
:class:`CpuExecutionDescriptor` adds the effective thread count; together they
decide whether tuned kernel parameters (or a cached profile) apply.

Detection is split in two layers so that it can be tested on processors we do
not have:

* pure functions over text (:func:`parse_proc_cpuinfo`, :func:`parse_sysfs_caches`,
  :func:`parse_sysctl_output`, :func:`cpu_from_sources`, :func:`cpu_from_sysctl`,
  :func:`parse_cgroup_v2_cpu_max`, ...), and
* thin host readers (:func:`detect_cpu`, :func:`effective_thread_count`) that
  gather that text from ``/proc``, ``/sys``, ``sysctl`` and archspec.

Only facts read from the system are recorded: a value that cannot be read stays
``None`` (or ``"unknown"`` for strings), it is never guessed.

This module is part of the tuning core: it imports nothing else from
``onnx_light`` (stdlib and archspec only).
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import math
import operator
import os
import platform
import re
import subprocess
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KERNEL_FEATURES",
    "CpuDescriptor",
    "CpuExecutionDescriptor",
    "cgroup_cpu_dirs",
    "cgroup_cpu_limit",
    "count_physical_cores",
    "cpu_from_sources",
    "cpu_from_sysctl",
    "detect_cpu",
    "effective_thread_count",
    "execution_descriptor",
    "normalise_features",
    "parse_cgroup_v1_cpu_quota",
    "parse_cgroup_v2_cpu_max",
    "parse_proc_cpuinfo",
    "parse_sysctl_output",
    "parse_sysfs_caches",
    "reset_detection_cache",
]

logger = logging.getLogger("onnx_light")

UNKNOWN = "unknown"

# --------------------------------------------------------------------------------------------
# Feature normalisation
# --------------------------------------------------------------------------------------------

#: Raw flag (lower case, as printed by Linux /proc/cpuinfo or macOS sysctl) -> canonical name.
#: Only instruction sets that matter to kernel performance are listed; every other flag
#: (hypervisor, rdrand, constant_tsc, aes, ...) is dropped so that it cannot make two
#: descriptors of equally capable processors differ.
_X86_FEATURES: dict[str, str] = {
    "sse2": "sse2",
    "pni": "sse3",  # Linux name of SSE3
    "sse3": "sse3",  # macOS name
    "ssse3": "ssse3",
    "sse4_1": "sse4_1",
    "sse4.1": "sse4_1",  # macOS
    "sse4_2": "sse4_2",
    "sse4.2": "sse4_2",  # macOS
    "avx": "avx",
    "avx1.0": "avx",  # macOS
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512cd": "avx512cd",
    "avx512bw": "avx512bw",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512_ifma",
    "avx512vbmi": "avx512_vbmi",
    "avx512_vnni": "avx512_vnni",
    "avx512vnni": "avx512_vnni",  # older kernels, macOS
    "avx512_bf16": "avx512_bf16",
    "avx512_fp16": "avx512_fp16",
    "avx_vnni": "avx_vnni",
    "amx_tile": "amx_tile",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
}

_ARM_FEATURES: dict[str, str] = {
    "asimd": "neon",  # AArch64 Linux name of Advanced SIMD
    "neon": "neon",  # 32-bit Arm Linux name
    "fphp": "fp16",  # scalar half precision
    "asimdhp": "asimdhp",  # SIMD half precision
    "asimddp": "dotprod",
    "asimdfhm": "fhm",
    "i8mm": "i8mm",
    "bf16": "bf16",
    "sve": "sve",
    "sve2": "sve2",
    "svei8mm": "sve_i8mm",
    "svebf16": "sve_bf16",
    "sme": "sme",
    "sme2": "sme2",
}

_POWER_FEATURES = frozenset({"altivec", "vsx", "mma"})
_RISCV_FEATURES = frozenset({"rvv", "zfh", "zvfh"})

#: Every canonical feature name a descriptor may contain (the documented whitelist):
#:
#: * x86: sse2 sse3 ssse3 sse4_1 sse4_2 avx avx2 fma f16c avx512f avx512cd avx512bw
#:   avx512dq avx512vl avx512_ifma avx512_vbmi avx512_vnni avx512_bf16 avx512_fp16
#:   avx_vnni amx_tile amx_bf16 amx_int8
#: * Arm: neon (Linux ``asimd``/``neon``), fp16 (``fphp``), asimdhp, dotprod (``asimddp``),
#:   fhm (``asimdfhm``), i8mm, bf16, sve, sve2, sve_i8mm (``svei8mm``), sve_bf16
#:   (``svebf16``), sme, sme2
#: * POWER: altivec, vsx, mma
#: * RISC-V: rvv (the ``v`` extension), zfh, zvfh
KERNEL_FEATURES: frozenset[str] = frozenset(
    set(_X86_FEATURES.values()) | set(_ARM_FEATURES.values()) | _POWER_FEATURES | _RISCV_FEATURES
)

_ARM_ARCHITECTURES = ("aarch64", "arm")
_POWER_ARCHITECTURES = ("ppc64le", "ppc64")


def _is_arm(architecture: str) -> bool:
    return architecture.startswith(_ARM_ARCHITECTURES)


def _riscv_features(isa: str) -> set[str]:
    """Canonical features of a RISC-V ISA string such as ``rv64imafdcv_zicsr_zfh``."""
    isa = isa.strip().lower()
    match = re.match(r"rv(?:32|64|128)([a-z]*)(.*)", isa)
    if match is None:
        return set()
    single_letters, rest = match.group(1), match.group(2)
    # Multi-letter extensions start with z, s or x and are separated by underscores; the
    # single-letter block ends where the first of them starts.
    multi = [ext for ext in rest.split("_") if ext]
    cut = re.search(r"[zsx]", single_letters)
    if cut is not None:
        multi.insert(0, single_letters[cut.start():])
        single_letters = single_letters[: cut.start()]
    result = set()
    if "v" in single_letters:
        result.add("rvv")
    result.update(ext for ext in multi if ext in _RISCV_FEATURES)
    return result


def normalise_features(raw: Iterable[str] | str, architecture: str) -> frozenset[str]:
    """Map raw CPU flags to the canonical names of :data:`KERNEL_FEATURES`.

    ``raw`` is a whitespace-separated string or an iterable of flags as printed by Linux
    ``/proc/cpuinfo`` (``flags``/``Features``) or macOS ``sysctl machdep.cpu.*features``.
    For RISC-V pass the ``isa`` string. Flags outside the whitelist are dropped.
    """
    flags = raw.split() if isinstance(raw, str) else list(raw)
    flags = [flag.strip().lower() for flag in flags if isinstance(flag, str)]
    if architecture.startswith("riscv"):
        result: set[str] = set()
        for flag in flags:
            result |= _riscv_features(flag)
        return frozenset(result)
    if _is_arm(architecture):
        table: Mapping[str, str] = _ARM_FEATURES
    elif architecture.startswith(_POWER_ARCHITECTURES):
        table = {name: name for name in _POWER_FEATURES}
    else:
        table = _X86_FEATURES
    return frozenset(table[flag] for flag in flags if flag in table)


# --------------------------------------------------------------------------------------------
# Vendors
# --------------------------------------------------------------------------------------------

_X86_VENDORS = {
    "GenuineIntel": "intel",
    "AuthenticAMD": "amd",
    "HygonGenuine": "hygon",
    "CentaurHauls": "centaur",
}

#: Arm "CPU implementer" codes (MIDR_EL1 bits 31:24).
_ARM_IMPLEMENTERS = {
    0x41: "arm",
    0x42: "broadcom",
    0x43: "cavium",
    0x46: "fujitsu",
    0x48: "hisilicon",
    0x4E: "nvidia",
    0x50: "apm",
    0x51: "qualcomm",
    0x53: "samsung",
    0x56: "marvell",
    0x61: "apple",
    0x6D: "microsoft",
    0xC0: "ampere",
}

#: RISC-V JEDEC ``mvendorid`` values.
_RISCV_VENDORS = {0x489: "sifive", 0x5B7: "thead"}


def _vendor_from_archspec(vendor: str | None) -> str:
    """Canonical vendor from an archspec vendor string ("GenuineIntel", "ARM", "generic")."""
    if not vendor or vendor == "generic":
        return UNKNOWN
    return _X86_VENDORS.get(vendor, vendor.strip().lower())


# --------------------------------------------------------------------------------------------
# Small parsing helpers
# --------------------------------------------------------------------------------------------


def _parse_int(text: str | None, base: int = 10) -> int | None:
    """A non-negative int from text, or None. ``base=0`` also accepts ``0x`` prefixes."""
    if not isinstance(text, str):
        return None
    for attempt in (base, 10):
        try:
            value = int(text.strip(), attempt)
        except ValueError:
            continue
        return value if value >= 0 else None
    return None


def _parse_size(text: str | None) -> int | None:
    """Bytes from a sysfs/sysctl size such as ``32K``, ``1024K``, ``2M`` or ``65536``."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, flags=re.IGNORECASE)
    if match is None:
        return None
    value = int(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[
        match.group(2).upper()
    ]
    return value if value > 0 else None


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    """``/proc/cpuinfo`` as one ``{key: value}`` dict per blank-line separated block."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if not sep:
            continue  # garbage line
        current.setdefault(key.strip(), value.strip())
    if current:
        blocks.append(current)
    return blocks


def _first(blocks: Sequence[Mapping[str, str]], key: str) -> str | None:
    """The first value of ``key`` over the blocks (``None`` when no block has it)."""
    for block in blocks:
        value = block.get(key)
        if value is not None:
            return value
    return None


# --------------------------------------------------------------------------------------------
# Pure parsers
# --------------------------------------------------------------------------------------------


def parse_proc_cpuinfo(text: str, architecture: str) -> dict[str, Any]:
    """Parse the text of Linux ``/proc/cpuinfo`` for ``architecture``.

    Returns a dict with the keys ``vendor`` (canonical, ``"unknown"`` if not found),
    ``family``, ``model``, ``stepping`` (int or None), ``features`` (normalised frozenset),
    ``physical_cores`` (distinct ``physical id``/``core id`` pairs, None when the file does
    not list them) and ``cache_line`` (x86 ``clflush size``, or None).

    Meaning of family/model/stepping per architecture:

    * x86: ``cpu family``, ``model``, ``stepping``.
    * Arm: family = ``CPU architecture`` (e.g. 8), model = ``CPU part`` (e.g. 0xd40),
      stepping = ``CPU revision``; ``CPU variant`` is not recorded.
    * POWER: family = the POWER generation (9 for "POWER9"), model and stepping = the
      version and revision halves of the PVR (``revision : 2.2 (pvr 004e 1202)``).
    * RISC-V: not defined, all None.

    Values come from the first processor block that has them (on big.LITTLE Arm systems
    that is the first CPU's cluster).
    """
    blocks = _cpuinfo_blocks(text or "")
    result: dict[str, Any] = {
        "vendor": UNKNOWN,
        "family": None,
        "model": None,
        "stepping": None,
        "features": frozenset(),
        "physical_cores": None,
        "cache_line": None,
    }
    if not blocks:
        return result

    if _is_arm(architecture):
        implementer = _parse_int(_first(blocks, "CPU implementer"), 0)
        if implementer is not None:
            result["vendor"] = _ARM_IMPLEMENTERS.get(implementer, UNKNOWN)
        result["family"] = _parse_int(_first(blocks, "CPU architecture"), 0)
        result["model"] = _parse_int(_first(blocks, "CPU part"), 0)
        result["stepping"] = _parse_int(_first(blocks, "CPU revision"), 0)
        result["features"] = normalise_features(_first(blocks, "Features") or "", architecture)
    elif architecture.startswith(_POWER_ARCHITECTURES):
        cpu = _first(blocks, "cpu") or ""
        features = set()
        generation_match = re.search(r"POWER(\d+)", cpu, flags=re.IGNORECASE)
        if generation_match is not None:
            generation = int(generation_match.group(1))
            result["vendor"] = "ibm"
            result["family"] = generation
            # VSX is part of Power ISA 2.06 (POWER7 and later); MMA of ISA 3.1 (POWER10).
            if generation >= 7:
                features.add("vsx")
            if generation >= 10:
                features.add("mma")
        if "altivec" in cpu.lower():
            features.add("altivec")
        result["features"] = frozenset(features)
        revision = _first(blocks, "revision") or ""
        pvr = re.search(r"pvr\s+([0-9a-fA-F]{1,4})\s+([0-9a-fA-F]{1,4})", revision)
        if pvr is not None:
            result["model"] = int(pvr.group(1), 16)
            result["stepping"] = int(pvr.group(2), 16)
    elif architecture.startswith("riscv"):
        mvendorid = _parse_int(_first(blocks, "mvendorid"), 0)
        if mvendorid is not None:
            result["vendor"] = _RISCV_VENDORS.get(mvendorid, UNKNOWN)
        result["features"] = normalise_features(_first(blocks, "isa") or "", architecture)
    else:  # x86 and anything printing x86-style keys
        vendor_id = _first(blocks, "vendor_id")
        if vendor_id:
            result["vendor"] = _X86_VENDORS.get(vendor_id, UNKNOWN)
        result["family"] = _parse_int(_first(blocks, "cpu family"))
        result["model"] = _parse_int(_first(blocks, "model"))
        result["stepping"] = _parse_int(_first(blocks, "stepping"))
        result["features"] = normalise_features(_first(blocks, "flags") or "", architecture)
        result["cache_line"] = _parse_int(_first(blocks, "clflush size")) or None

    cores = set()
    for block in blocks:
        if "processor" not in block:
            continue
        package = _parse_int(block.get("physical id"))
        core = _parse_int(block.get("core id"))
        if package is None or core is None:
            cores = set()
            break  # incomplete topology: report nothing rather than a wrong count
        cores.add((package, core))
    result["physical_cores"] = len(cores) or None
    return result


def parse_sysfs_caches(caches: Mapping[str, Mapping[str, str]] | None) -> dict[str, int | None]:
    """Cache sizes from the files of ``/sys/devices/system/cpu/cpu0/cache/index*/``.

    ``caches`` maps an index directory name to the text of its ``level``, ``type``, ``size``
    and ``coherency_line_size`` files, e.g.
    ``{"index0": {"level": "1", "type": "Data", "size": "32K", "coherency_line_size": "64"}}``.
    Returns ``{"l1d", "l2", "l3", "cache_line"}`` in bytes (None when absent). Sizes are per
    cache instance, as the kernel reports them (a shared L3 is the size of one L3, not the
    sum over the machine). Instruction caches and levels above 3 are ignored.
    """
    result: dict[str, int | None] = {"l1d": None, "l2": None, "l3": None, "cache_line": None}
    line_by_level: dict[int, int] = {}
    for _, files in sorted((caches or {}).items()):
        level = _parse_int(files.get("level"))
        kind = (files.get("type") or "").strip().lower()
        if level is None or kind not in ("data", "unified"):
            continue
        key = {1: "l1d", 2: "l2", 3: "l3"}.get(level)
        size = _parse_size(files.get("size"))
        if key is not None and size is not None:
            current = result[key]
            result[key] = size if current is None else max(current, size)
        line = _parse_int(files.get("coherency_line_size"))
        if line:
            line_by_level.setdefault(level, line)
    if line_by_level:
        result["cache_line"] = line_by_level[min(line_by_level)]
    return result


def count_physical_cores(thread_siblings: Iterable[str] | None) -> int | None:
    """Physical cores from the per-CPU sysfs ``topology/thread_siblings_list`` texts.

    CPUs that are SMT siblings share one list (``"0,4"`` or ``"0-1"``), so the number of
    distinct lists is the number of cores. Returns None for no (usable) input.
    """
    distinct = {text.strip() for text in thread_siblings or () if text and text.strip()}
    return len(distinct) or None


def parse_sysctl_output(text: str) -> dict[str, str]:
    """``{key: value}`` from ``sysctl`` output lines (``key: value`` or ``key = value``)."""
    result: dict[str, str] = {}
    for line in (text or "").splitlines():
        match = re.match(r"\s*([\w.]+)\s*(?::|=)\s?(.*)$", line)
        if match is not None:
            result.setdefault(match.group(1), match.group(2).strip())
    return result


#: macOS ``hw.optional.*`` keys (arm64) -> canonical features.
_DARWIN_ARM_KEYS: dict[str, tuple[str, ...]] = {
    "hw.optional.neon": ("neon",),
    "hw.optional.AdvSIMD": ("neon",),
    "hw.optional.neon_hpfp": ("asimdhp",),
    "hw.optional.neon_fp16": ("asimdhp",),
    "hw.optional.arm.FEAT_FP16": ("fp16", "asimdhp"),
    "hw.optional.arm.FEAT_DotProd": ("dotprod",),
    "hw.optional.armv8_2_fhm": ("fhm",),
    "hw.optional.arm.FEAT_FHM": ("fhm",),
    "hw.optional.arm.FEAT_I8MM": ("i8mm",),
    "hw.optional.arm.FEAT_BF16": ("bf16",),
    "hw.optional.arm.FEAT_SME": ("sme",),
    "hw.optional.arm.FEAT_SME2": ("sme2",),
}


def cpu_from_sysctl(
    architecture: str,
    values: Mapping[str, str],
    microarchitecture: str,
    logical_cores: int | None,
) -> CpuDescriptor:
    """Build a descriptor from macOS ``sysctl`` values (see :func:`parse_sysctl_output`).

    Intel Macs: vendor from ``machdep.cpu.vendor``, family/model/stepping from
    ``machdep.cpu.*``, features from ``machdep.cpu.features``/``leaf7_features``/
    ``extfeatures``. Apple silicon: vendor "apple", family/model/stepping None (macOS only
    exposes an opaque ``hw.cpufamily``), features from ``hw.optional.*``. Caches from
    ``hw.l1dcachesize``, ``hw.l2cachesize``, ``hw.l3cachesize``, ``hw.cachelinesize``.
    """
    brand = values.get("machdep.cpu.brand_string", "")
    family = model = stepping = None
    if _is_arm(architecture):
        vendor = "apple" if "apple" in brand.lower() else UNKNOWN
        features: set[str] = set()
        for key, names in _DARWIN_ARM_KEYS.items():
            if _parse_int(values.get(key)):
                features.update(names)
        feature_set = frozenset(features)
    else:
        vendor = _X86_VENDORS.get(values.get("machdep.cpu.vendor", ""), UNKNOWN)
        family = _parse_int(values.get("machdep.cpu.family"))
        model = _parse_int(values.get("machdep.cpu.model"))
        stepping = _parse_int(values.get("machdep.cpu.stepping"))
        raw = " ".join(
            values.get(key, "")
            for key in ("machdep.cpu.features", "machdep.cpu.leaf7_features",
                        "machdep.cpu.extfeatures")
        )
        feature_set = normalise_features(raw, architecture)
    return CpuDescriptor(
        architecture=architecture,
        vendor=vendor,
        family=family,
        model=model,
        stepping=stepping,
        microarchitecture=microarchitecture or UNKNOWN,
        features=feature_set,
        cache_line=_parse_size(values.get("hw.cachelinesize")),
        l1d=_parse_size(values.get("hw.l1dcachesize")),
        l2=_parse_size(values.get("hw.l2cachesize")),
        l3=_parse_size(values.get("hw.l3cachesize")),
        physical_cores=_parse_int(values.get("hw.physicalcpu")) or None,
        logical_cores=logical_cores,
    )


def cpu_from_sources(
    architecture: str,
    cpuinfo_text: str | None,
    sysfs_caches: Mapping[str, Mapping[str, str]] | None,
    microarchitecture: str,
    logical_cores: int | None,
    *,
    thread_siblings: Iterable[str] | None = None,
    fallback_vendor: str | None = None,
) -> CpuDescriptor:
    """Build a descriptor from Linux sources (pure: no file is read here).

    ``cpuinfo_text`` is the text of ``/proc/cpuinfo`` (None if unreadable), ``sysfs_caches``
    the cache files as described in :func:`parse_sysfs_caches`, ``microarchitecture`` the
    archspec target name (computed for the host only, "unknown" if not known),
    ``thread_siblings`` the sysfs ``thread_siblings_list`` texts (used for the physical core
    count when ``/proc/cpuinfo`` has no ``core id``) and ``fallback_vendor`` an archspec
    vendor string used only when ``/proc/cpuinfo`` does not name the vendor.
    """
    info = parse_proc_cpuinfo(cpuinfo_text or "", architecture)
    caches = parse_sysfs_caches(sysfs_caches)
    vendor = info["vendor"]
    if vendor == UNKNOWN:
        vendor = _vendor_from_archspec(fallback_vendor)
    physical = info["physical_cores"] or count_physical_cores(thread_siblings)
    return CpuDescriptor(
        architecture=architecture,
        vendor=vendor,
        family=info["family"],
        model=info["model"],
        stepping=info["stepping"],
        microarchitecture=microarchitecture or UNKNOWN,
        features=info["features"],
        cache_line=caches["cache_line"] or info["cache_line"],
        l1d=caches["l1d"],
        l2=caches["l2"],
        l3=caches["l3"],
        physical_cores=physical,
        logical_cores=logical_cores,
    )


# --------------------------------------------------------------------------------------------
# Descriptors
# --------------------------------------------------------------------------------------------

_STR_FIELDS = ("architecture", "vendor", "microarchitecture")
_OPTIONAL_NON_NEGATIVE = ("family", "model", "stepping")
_OPTIONAL_POSITIVE = ("cache_line", "l1d", "l2", "l3", "physical_cores", "logical_cores")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_cpu_field(name: str, value: Any, prefix: str = "") -> Any:
    """Validate one CpuDescriptor field; ValueError names it as ``prefix + name``."""
    label = prefix + name
    if name in _STR_FIELDS:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{label} must be a non-empty str, got {value!r}")
    elif name in _OPTIONAL_NON_NEGATIVE:
        if value is not None and (not _is_int(value) or value < 0):
            raise ValueError(f"{label} must be None or an int >= 0, got {value!r}")
    elif name in _OPTIONAL_POSITIVE:
        if value is not None and (not _is_int(value) or value < 1):
            raise ValueError(f"{label} must be None or an int >= 1, got {value!r}")
    elif name == "features":
        if isinstance(value, str) or not isinstance(value, (set, frozenset, list, tuple)):
            raise ValueError(f"{label} must be a collection of str, got {value!r}")
        if not all(isinstance(item, str) and item for item in value):
            raise ValueError(f"{label} must contain only non-empty str, got {value!r}")
        return frozenset(value)
    return value


@dataclass(frozen=True)
class CpuDescriptor:
    """What the kernels know about the processor they run on.

    Integer fields are None when unknown; ``vendor`` and ``microarchitecture`` are
    ``"unknown"`` when unknown. ``features`` holds only names from :data:`KERNEL_FEATURES`
    when detected (``from_dict`` accepts any string so newer descriptors still load).
    For Arm, ``family`` is the "CPU architecture" (8), ``model`` the "CPU part" (0xd40) and
    ``stepping`` the "CPU revision"; see :func:`parse_proc_cpuinfo` for the other ISAs.
    Cache sizes are in bytes, per cache instance; core counts cover the whole machine.
    Invalid field values raise ValueError naming the field.
    """

    architecture: str
    vendor: str
    family: int | None
    model: int | None
    stepping: int | None
    microarchitecture: str
    features: frozenset[str]
    cache_line: int | None
    l1d: int | None
    l2: int | None
    l3: int | None
    physical_cores: int | None
    logical_cores: int | None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = _check_cpu_field(field.name, getattr(self, field.name))
            object.__setattr__(self, field.name, value)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict of every field (``features`` as a sorted list)."""
        result = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        result["features"] = sorted(self.features)
        return result

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CpuDescriptor:
        """Inverse of :meth:`to_dict`; strict: a missing, unknown or ill-typed field raises
        ValueError naming it."""
        return cls._from_dict(data, "")

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any], prefix: str) -> CpuDescriptor:
        if not isinstance(data, Mapping):
            raise ValueError(f"{prefix.rstrip('.') or 'cpu descriptor'} must be a dict, "
                             f"got {type(data).__name__}")
        names = [field.name for field in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise ValueError(f"unknown field {prefix}{key}")
        values = {}
        for name in names:
            if name not in data:
                raise ValueError(f"missing field {prefix}{name}")
            value = data[name]
            if name == "features" and not isinstance(value, (list, tuple)):
                raise ValueError(f"{prefix}features must be a list of str, got {value!r}")
            values[name] = _check_cpu_field(name, value, prefix)
        return cls(**values)

    def differences(self, other: CpuDescriptor) -> list[str]:
        """Names of the fields whose values differ from ``other`` (declaration order)."""
        if not isinstance(other, CpuDescriptor):
            raise TypeError(f"expected a CpuDescriptor, got {type(other).__name__}")
        return [
            field.name
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != getattr(other, field.name)
        ]

    def short(self) -> str:
        """One readable line, e.g.
        ``amd family 25 model 1 (zen3) x86_64 avx,avx2,fma,... 8 cores/16 logical``."""
        parts = [self.vendor]
        if _is_arm(self.architecture):
            if self.family is not None:
                parts.append(f"armv{self.family}")
            if self.model is not None:
                parts.append(f"part {self.model:#05x}")
        else:
            if self.family is not None:
                parts.append(f"family {self.family}")
            if self.model is not None:
                parts.append(f"model {self.model}")
        parts.append(f"({self.microarchitecture})")
        parts.append(self.architecture)
        parts.append(",".join(sorted(self.features)) or "no-simd-features")
        physical = "?" if self.physical_cores is None else str(self.physical_cores)
        logical = "?" if self.logical_cores is None else str(self.logical_cores)
        parts.append(f"{physical} cores/{logical} logical")
        return " ".join(parts)


@dataclass(frozen=True)
class CpuExecutionDescriptor:
    """A processor plus the effective number of threads kernels run with."""

    cpu: CpuDescriptor
    num_threads: int

    def __post_init__(self) -> None:
        if not isinstance(self.cpu, CpuDescriptor):
            raise ValueError(f"cpu must be a CpuDescriptor, got {type(self.cpu).__name__}")
        if not _is_int(self.num_threads) or self.num_threads < 1:
            raise ValueError(f"num_threads must be an int >= 1, got {self.num_threads!r}")

    def to_dict(self) -> dict[str, Any]:
        """``{"cpu": CpuDescriptor.to_dict(), "num_threads": n}``."""
        return {"cpu": self.cpu.to_dict(), "num_threads": self.num_threads}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CpuExecutionDescriptor:
        """Inverse of :meth:`to_dict`; strict, errors name the field (``cpu.model``)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"execution descriptor must be a dict, got {type(data).__name__}")
        for key in data:
            if key not in ("cpu", "num_threads"):
                raise ValueError(f"unknown field {key}")
        for name in ("cpu", "num_threads"):
            if name not in data:
                raise ValueError(f"missing field {name}")
        cpu = CpuDescriptor._from_dict(data["cpu"], "cpu.")
        return cls(cpu=cpu, num_threads=data["num_threads"])

    def differences(self, other: CpuExecutionDescriptor) -> list[str]:
        """Names of the differing fields, e.g. ``["num_threads", "cpu.model", "cpu.features"]``.

        Used to explain why a cached profile does not apply; empty when equal.
        """
        if not isinstance(other, CpuExecutionDescriptor):
            raise TypeError(f"expected a CpuExecutionDescriptor, got {type(other).__name__}")
        result = ["num_threads"] if self.num_threads != other.num_threads else []
        return result + [f"cpu.{name}" for name in self.cpu.differences(other.cpu)]

    def short(self) -> str:
        """The processor's short line followed by the thread count."""
        return f"{self.cpu.short()}, {self.num_threads} threads"


# --------------------------------------------------------------------------------------------
# Host detection
# --------------------------------------------------------------------------------------------

_SYSFS_CPU = "/sys/devices/system/cpu"
_CACHE_FILES = ("level", "type", "size", "coherency_line_size")
_ARCHITECTURE_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}

_lock = threading.Lock()
_cached: CpuDescriptor | None = None


def _read_text(path: str) -> str:
    """Read a small text file (separate so tests can make it fail)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def _normalise_architecture(machine: str) -> str:
    machine = (machine or "").strip().lower()
    return _ARCHITECTURE_ALIASES.get(machine, machine) or UNKNOWN


def _archspec_host() -> tuple[str, str]:
    """archspec's (target name, vendor) for the host."""
    import archspec.cpu

    target = archspec.cpu.host()
    return str(target.name), str(target.vendor)


def _host_archspec() -> tuple[str, str | None]:
    """(microarchitecture, archspec vendor), logging instead of raising or warning."""
    try:
        # archspec reports some problems with warnings.warn; turn them into log records.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            name, vendor = _archspec_host()
        for item in caught:
            logger.warning("archspec: %s", item.message)
        return name or UNKNOWN, vendor
    except Exception as exc:
        logger.warning("could not detect the microarchitecture with archspec: %s", exc)
        return UNKNOWN, None


def _read_sysfs_caches() -> dict[str, dict[str, str]] | None:
    caches: dict[str, dict[str, str]] = {}
    for directory in sorted(glob.glob(os.path.join(_SYSFS_CPU, "cpu0", "cache", "index*"))):
        files: dict[str, str] = {}
        for name in _CACHE_FILES:
            try:
                files[name] = _read_text(os.path.join(directory, name))
            except OSError:
                continue
        caches[os.path.basename(directory)] = files
    if not caches:
        logger.debug("no cache information in %s/cpu0/cache", _SYSFS_CPU)
    return caches or None


def _read_thread_siblings() -> list[str] | None:
    result = []
    for path in glob.glob(os.path.join(_SYSFS_CPU, "cpu[0-9]*", "topology",
                                       "thread_siblings_list")):
        try:
            result.append(_read_text(path))
        except OSError:
            continue
    return result or None


def _detect_linux(architecture: str, logical: int | None) -> CpuDescriptor:
    try:
        cpuinfo: str | None = _read_text("/proc/cpuinfo")
    except Exception as exc:
        logger.warning("could not read /proc/cpuinfo: %s", exc)
        cpuinfo = None
    try:
        caches = _read_sysfs_caches()
    except Exception as exc:
        logger.warning("could not read cache sizes from sysfs: %s", exc)
        caches = None
    try:
        siblings = _read_thread_siblings()
    except Exception as exc:
        logger.warning("could not read the CPU topology from sysfs: %s", exc)
        siblings = None
    microarchitecture, archspec_vendor = _host_archspec()
    return cpu_from_sources(
        architecture, cpuinfo, caches, microarchitecture, logical,
        thread_siblings=siblings, fallback_vendor=archspec_vendor,
    )


def _run_sysctl(*names: str) -> str:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([env.get("PATH", ""), "/usr/sbin", "/sbin"])
    completed = subprocess.run(
        ["sysctl", *names], capture_output=True, text=True, timeout=10, env=env, check=False
    )
    return completed.stdout


def _detect_darwin(architecture: str, logical: int | None) -> CpuDescriptor:
    values: dict[str, str] = {}
    for tree in ("hw", "machdep.cpu"):
        try:
            values.update(parse_sysctl_output(_run_sysctl(tree)))
        except Exception as exc:
            logger.warning("could not run sysctl %s: %s", tree, exc)
    if not values:
        logger.warning("sysctl returned no processor information")
    if "apple" in values.get("machdep.cpu.brand_string", "").lower():
        architecture = "aarch64"  # also under Rosetta, where platform.machine() says x86_64
    microarchitecture, _ = _host_archspec()
    return cpu_from_sysctl(architecture, values, microarchitecture, logical)


def _detect_other(architecture: str, logical: int | None) -> CpuDescriptor:
    microarchitecture, archspec_vendor = _host_archspec()
    return cpu_from_sources(
        architecture, None, None, microarchitecture, logical, fallback_vendor=archspec_vendor
    )


def _detect() -> CpuDescriptor:
    try:
        architecture = _normalise_architecture(platform.machine())
    except Exception as exc:
        logger.warning("could not determine the machine architecture: %s", exc)
        architecture = UNKNOWN
    logical = os.cpu_count()
    system = platform.system()
    try:
        if system == "Linux":
            return _detect_linux(architecture, logical)
        if system == "Darwin":
            return _detect_darwin(architecture, logical)
        return _detect_other(architecture, logical)
    except Exception as exc:  # last line of defence: never raise
        logger.warning("processor detection failed: %s", exc)
        return CpuDescriptor(
            architecture=architecture, vendor=UNKNOWN, family=None, model=None, stepping=None,
            microarchitecture=UNKNOWN, features=frozenset(), cache_line=None, l1d=None, l2=None,
            l3=None, physical_cores=None, logical_cores=logical,
        )


def detect_cpu() -> CpuDescriptor:
    """The host's :class:`CpuDescriptor`, detected once per process (thread-safe).

    Never raises: a failure is logged as a warning on the ``onnx_light`` logger and the
    affected fields stay unknown. Linux reads ``/proc/cpuinfo``, sysfs and archspec; macOS
    ``sysctl`` and archspec; other systems only ``platform.machine()`` and archspec.
    """
    global _cached
    with _lock:
        if _cached is None:
            _cached = _detect()
        return _cached


def reset_detection_cache() -> None:
    """Forget the detected processor so that the next :func:`detect_cpu` detects again."""
    global _cached
    with _lock:
        _cached = None


# --------------------------------------------------------------------------------------------
# Effective thread count
# --------------------------------------------------------------------------------------------


def parse_cgroup_v2_cpu_max(text: str | None) -> int | None:
    """CPU limit from a cgroup v2 ``cpu.max`` text (``"quota period"`` or ``"max period"``).

    Returns ``ceil(quota / period)`` (at least 1), or None when unlimited or unparsable.
    """
    fields = (text or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    quota, period = _parse_int(fields[0]), _parse_int(fields[1])
    if not quota or not period:
        return None
    return max(1, math.ceil(quota / period))


def parse_cgroup_v1_cpu_quota(quota_text: str | None, period_text: str | None) -> int | None:
    """CPU limit from cgroup v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` texts.

    A quota of -1 means unlimited (None); otherwise ``ceil(quota / period)``, at least 1.
    """
    try:
        quota = int((quota_text or "").strip())
        period = int((period_text or "").strip())
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def _unescape_mount(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def cgroup_cpu_dirs(proc_self_cgroup: str, mountinfo: str) -> list[tuple[int, str]]:
    """Directories that may hold this process's CPU quota, as ``(cgroup version, dir)``.

    ``proc_self_cgroup`` is the text of ``/proc/self/cgroup`` and ``mountinfo`` the text of
    ``/proc/self/mountinfo``. The process's own cgroup comes first, then its ancestors up to
    the mount point (a quota on any of them limits the process).
    """
    v2_path: str | None = None
    v1_path: str | None = None
    for line in (proc_self_cgroup or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path

    result: list[tuple[int, str]] = []
    for line in (mountinfo or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, mount_point = _unescape_mount(fields[3]), _unescape_mount(fields[4])
        fstype, super_options = tail[0], tail[2].split(",")
        if fstype == "cgroup2" and v2_path is not None:
            version, path = 2, v2_path
        elif fstype == "cgroup" and "cpu" in super_options and v1_path is not None:
            version, path = 1, v1_path
        else:
            continue
        # The cgroup path is relative to the hierarchy root; the mount shows ``root`` of it.
        if path == root or path.startswith(root.rstrip("/") + "/"):
            relative = path[len(root.rstrip("/")):].strip("/")
        else:
            relative = ""  # e.g. a cgroup namespace: the mount point is our own cgroup
        directory = os.path.join(mount_point, relative) if relative else mount_point
        while True:
            result.append((version, directory))
            if directory.rstrip("/") == mount_point.rstrip("/"):
                break
            directory = os.path.dirname(directory.rstrip("/"))
            if not directory.startswith(mount_point.rstrip("/")):
                break
    return result


def _read_optional(path: str) -> str | None:
    try:
        return _read_text(path)
    except OSError:
        return None


def cgroup_cpu_limit() -> int | None:
    """The CPU limit set by cgroup quotas on this process (the smallest one), or None."""
    try:
        directories = cgroup_cpu_dirs(
            _read_optional("/proc/self/cgroup") or "", _read_optional("/proc/self/mountinfo") or ""
        )
    except Exception as exc:
        logger.warning("could not locate the cgroup of this process: %s", exc)
        return None
    if not directories:
        directories = [(2, "/sys/fs/cgroup"), (1, "/sys/fs/cgroup/cpu,cpuacct"),
                       (1, "/sys/fs/cgroup/cpu")]
    limits = []
    for version, directory in directories:
        if version == 2:
            limit = parse_cgroup_v2_cpu_max(_read_optional(os.path.join(directory, "cpu.max")))
        else:
            limit = parse_cgroup_v1_cpu_quota(
                _read_optional(os.path.join(directory, "cpu.cfs_quota_us")),
                _read_optional(os.path.join(directory, "cpu.cfs_period_us")),
            )
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def effective_thread_count(num_threads: int | None = None) -> int:
    """The number of threads kernels run with: the ONE definition used everywhere.

    With ``num_threads`` given, it is validated (an int, not a bool, >= 1; TypeError or
    ValueError naming ``num_threads`` otherwise) and returned. Without it, the number of
    CPUs this process may use: its scheduler affinity (``os.sched_getaffinity``, else
    ``os.cpu_count()``), further limited by a cgroup CPU quota (v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us``/``cpu.cfs_period_us``; ``ceil(quota/period)``), and at least 1.

    These are LOGICAL CPUs: it is what the OS scheduler lets the process run on, affinity
    masks and quotas are expressed in logical CPUs, and SMT siblings do give numpy kernels
    some throughput. On SMT machines users who prefer one thread per core may pass
    ``num_threads=detect_cpu().physical_cores`` explicitly.
    """
    if num_threads is not None:
        if isinstance(num_threads, bool):
            raise TypeError("num_threads must be an int, not a bool")
        try:
            value = operator.index(num_threads)
        except TypeError:
            raise TypeError(
                f"num_threads must be an int, got {type(num_threads).__name__}"
            ) from None
        if value < 1:
            raise ValueError(f"num_threads must be >= 1, got {value}")
        return value
    count = _available_cpus()
    try:
        limit = cgroup_cpu_limit()
    except Exception as exc:
        logger.warning("could not read the cgroup CPU quota: %s", exc)
        limit = None
    if limit is not None:
        count = min(count, limit)
    return max(1, count)


def execution_descriptor(num_threads: int | None = None) -> CpuExecutionDescriptor:
    """``CpuExecutionDescriptor(detect_cpu(), effective_thread_count(num_threads))``."""
    return CpuExecutionDescriptor(detect_cpu(), effective_thread_count(num_threads))
