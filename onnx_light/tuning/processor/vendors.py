"""Vendor names: the one table of canonical vendors, shared by detection and profiles.

Detection reads a vendor as a CPUID string (``GenuineIntel``), an Arm implementer code,
a RISC-V ``mvendorid`` or an archspec vendor name; profile selectors read archspec's.
All of them map through the tables of ``cpu_tables.json`` to one lower-case name
(``intel``, ``arm``, ``hygon``), so a microarchitecture profile's vendor and a detected
descriptor's vendor are comparable.
"""

from __future__ import annotations

from .tables import load_tables

__all__ = ["arm_implementer", "riscv_vendor", "vendor_name"]


def vendor_name(name: str | None) -> str | None:
    """The canonical vendor of a CPUID vendor string or archspec vendor name, else None.

    None for ``"generic"`` (archspec's vendor of targets such as ``x86_64``) and for
    names the table does not know.
    """
    return load_tables()["vendors"]["names"].get(name) if isinstance(name, str) else None


def arm_implementer(code: int) -> str | None:
    """The vendor of an Arm ``CPU implementer`` code (``0x41`` -> ``arm``), else None."""
    return load_tables()["vendors"]["arm_implementers"].get(f"{code:#04x}")


def riscv_vendor(mvendorid: int) -> str | None:
    """The vendor of a RISC-V JEDEC ``mvendorid`` (``0x489`` -> ``sifive``), else None."""
    return load_tables()["vendors"]["riscv_mvendorids"].get(f"{mvendorid:#x}")
