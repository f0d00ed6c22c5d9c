"""Instruction-set features: raw flags to the canonical names a descriptor records.

The tables are data (``cpu_tables.json``, see :mod:`.tables`); this module applies them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping

from .tables import load_tables

__all__ = [
    "ARM_ARCHITECTURES",
    "POWER_ARCHITECTURES",
    "darwin_arm_keys",
    "is_arm",
    "kernel_features",
    "normalise_features",
]

ARM_ARCHITECTURES = ("aarch64", "arm")
POWER_ARCHITECTURES = ("ppc64le", "ppc64")


def is_arm(architecture: str) -> bool:
    """True for the AArch64 and 32-bit Arm architecture names."""
    return architecture.startswith(ARM_ARCHITECTURES)


def _table(family: str) -> Mapping[str, str]:
    return load_tables()["features"][family]


@functools.cache
def kernel_features() -> frozenset[str]:
    """Every canonical feature name a descriptor may contain (the documented whitelist).

    * x86: sse2 sse3 ssse3 sse4_1 sse4_2 avx avx2 fma f16c avx512f avx512cd avx512bw
      avx512dq avx512vl avx512_ifma avx512_vbmi avx512_vnni avx512_bf16 avx512_fp16
      avx_vnni amx_tile amx_bf16 amx_int8
    * Arm: neon (Linux ``asimd``/``neon``), fp16 (``fphp``), asimdhp, dotprod (``asimddp``),
      fhm (``asimdfhm``), i8mm, bf16, sve, sve2, sve_i8mm (``svei8mm``), sve_bf16
      (``svebf16``), sme, sme2
    * POWER: altivec, vsx, mma
    * RISC-V: rvv (the ``v`` extension), zfh, zvfh
    """
    names: set[str] = set()
    for family in ("x86", "arm", "power", "riscv"):
        names.update(_table(family).values())
    return frozenset(names)


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
    table = _table("riscv")
    result = {table[letter] for letter in single_letters if letter in table}
    result.update(table[ext] for ext in multi if len(ext) > 1 and ext in table)
    return result


def normalise_features(raw: Iterable[str] | str, architecture: str) -> frozenset[str]:
    """Map raw CPU flags to the canonical names of :func:`kernel_features`.

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
    if is_arm(architecture):
        table = _table("arm")
    elif architecture.startswith(POWER_ARCHITECTURES):
        table = _table("power")
    else:
        table = _table("x86")
    return frozenset(table[flag] for flag in flags if flag in table)


def darwin_arm_keys() -> Mapping[str, tuple[str, ...]]:
    """macOS ``hw.optional.*`` sysctl keys (Apple silicon) -> the features a non-zero value
    implies."""
    return load_tables()["features"]["darwin_arm"]
