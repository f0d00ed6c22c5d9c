"""Pure parsers: the text of ``/proc/cpuinfo``, sysfs and ``sysctl`` to a descriptor.

Nothing here reads a file or runs a command (:mod:`.detection` gathers the text), so every
processor can be tested from a sample of its text. Only facts read from that text are
recorded: a value that cannot be read stays ``None`` (or ``"unknown"`` for strings), it is
never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .descriptors import UNKNOWN, CpuDescriptor
from .features import POWER_ARCHITECTURES, darwin_arm_keys, is_arm, normalise_features
from .vendors import arm_implementer, riscv_vendor, vendor_name

__all__ = [
    "count_physical_cores",
    "cpu_from_sources",
    "cpu_from_sysctl",
    "parse_int",
    "parse_proc_cpuinfo",
    "parse_sysctl_output",
    "parse_sysfs_caches",
]


def _vendor_from_archspec(vendor: str | None) -> str:
    """Canonical vendor from an archspec vendor string ("GenuineIntel", "ARM", "generic")."""
    if not vendor or vendor == "generic":
        return UNKNOWN
    return vendor_name(vendor) or vendor.strip().lower()



def parse_int(text: str | None, base: int = 10) -> int | None:
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

    if is_arm(architecture):
        implementer = parse_int(_first(blocks, "CPU implementer"), 0)
        if implementer is not None:
            result["vendor"] = arm_implementer(implementer) or UNKNOWN
        result["family"] = parse_int(_first(blocks, "CPU architecture"), 0)
        result["model"] = parse_int(_first(blocks, "CPU part"), 0)
        result["stepping"] = parse_int(_first(blocks, "CPU revision"), 0)
        result["features"] = normalise_features(_first(blocks, "Features") or "", architecture)
    elif architecture.startswith(POWER_ARCHITECTURES):
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
        mvendorid = parse_int(_first(blocks, "mvendorid"), 0)
        if mvendorid is not None:
            result["vendor"] = riscv_vendor(mvendorid) or UNKNOWN
        result["features"] = normalise_features(_first(blocks, "isa") or "", architecture)
    else:  # x86 and anything printing x86-style keys
        vendor_id = _first(blocks, "vendor_id")
        if vendor_id:
            result["vendor"] = vendor_name(vendor_id) or UNKNOWN
        result["family"] = parse_int(_first(blocks, "cpu family"))
        result["model"] = parse_int(_first(blocks, "model"))
        result["stepping"] = parse_int(_first(blocks, "stepping"))
        result["features"] = normalise_features(_first(blocks, "flags") or "", architecture)
        result["cache_line"] = parse_int(_first(blocks, "clflush size")) or None

    cores = set()
    for block in blocks:
        if "processor" not in block:
            continue
        package = parse_int(block.get("physical id"))
        core = parse_int(block.get("core id"))
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
        level = parse_int(files.get("level"))
        kind = (files.get("type") or "").strip().lower()
        if level is None or kind not in ("data", "unified"):
            continue
        key = {1: "l1d", 2: "l2", 3: "l3"}.get(level)
        size = _parse_size(files.get("size"))
        if key is not None and size is not None:
            current = result[key]
            result[key] = size if current is None else max(current, size)
        line = parse_int(files.get("coherency_line_size"))
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
    if is_arm(architecture):
        vendor = "apple" if "apple" in brand.lower() else UNKNOWN
        features: set[str] = set()
        for key, names in darwin_arm_keys().items():
            if parse_int(values.get(key)):
                features.update(names)
        feature_set = frozenset(features)
    else:
        vendor = vendor_name(values.get("machdep.cpu.vendor", "")) or UNKNOWN
        family = parse_int(values.get("machdep.cpu.family"))
        model = parse_int(values.get("machdep.cpu.model"))
        stepping = parse_int(values.get("machdep.cpu.stepping"))
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
        physical_cores=parse_int(values.get("hw.physicalcpu")) or None,
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


