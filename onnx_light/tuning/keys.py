"""Exact tuning identity: :class:`KernelTuningKey` and ONNX element types.

A key names one kernel implementation for one element type on one device at one
tuning ABI revision. Everything the tuning core stores (schemas, profiles, cache
entries) hangs off an exact key; there is no fuzzy matching between keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DEVICES",
    "ELEMENT_TYPE_CODES",
    "ElementType",
    "KernelTuningKey",
    "element_type_code",
    "element_type_name",
]

DEVICES = frozenset({"cpu"})


class ElementType:
    """ONNX's element type codes (``TensorProto.DataType``), fixed by the ONNX spec.

    Kept here so that the tuning core and the kernel library name element types
    without importing onnx, whose import (with ml_dtypes) would dominate
    ``import onnx_light``; a test checks them against the installed onnx.
    """

    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26
    FLOAT6E2M3 = 27
    FLOAT6E3M2 = 28


#: Upper-case ONNX name -> code, UNDEFINED included (as ``TensorProto.DataType.items()``).
ELEMENT_TYPE_CODES: dict[str, int] = {
    name: code for name, code in vars(ElementType).items() if name.isupper()
}
_CODE_BY_NAME: dict[str, int] = {
    name.lower(): code for name, code in ELEMENT_TYPE_CODES.items() if code != 0
}
_NAME_BY_CODE: dict[int, str] = {code: name for name, code in _CODE_BY_NAME.items()}
# numpy spellings users reach for; ONNX's own names win where they overlap.
_ALIASES = {
    "float32": "float",
    "float64": "double",
    "half": "float16",
    "str": "string",
    "bool_": "bool",
    "complex64": "complex64",
    "complex128": "complex128",
}


def element_type_code(value: int | str | np.dtype | type) -> int:
    """Return the ONNX ``TensorProto`` enum for an element type.

    Accepts the enum integer, an ONNX or numpy name in any case (``"float"``,
    ``"FLOAT"``, ``"float32"``, ``"bfloat16"``) or a numpy dtype.
    """
    if value is None or isinstance(value, bool):  # np.dtype(None) would be float64
        raise TypeError(f"element type must be an int, a name or a numpy dtype, got {value!r}")
    if isinstance(value, (int, np.integer)):
        code = int(value)
        if code not in _NAME_BY_CODE:
            raise ValueError(f"unknown ONNX element type {code}; valid: {_valid_list()}")
        return code
    if isinstance(value, str):
        name = value.strip().lower()
        if name.startswith("tensor(") and name.endswith(")"):
            name = name[len("tensor(") : -1]
        name = _ALIASES.get(name, name)
        if name in _CODE_BY_NAME:
            return _CODE_BY_NAME[name]
        raise ValueError(f"unknown ONNX element type {value!r}; valid: {_valid_list()}")
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise TypeError(
            f"element type must be an int, a name or a numpy dtype, got {type(value).__name__}"
        ) from None
    from onnx import helper  # imported here: a dtype lookup is rare, onnx's import is not cheap

    try:
        return int(helper.np_dtype_to_tensor_dtype(dtype))
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"numpy dtype {dtype} has no ONNX element type") from None


def element_type_name(code: int | str | np.dtype | type) -> str:
    """Return the lower-case ONNX name of an element type, e.g. ``"float"``."""
    return _NAME_BY_CODE[element_type_code(code)]


def _valid_list() -> str:
    return ", ".join(_NAME_BY_CODE[c] for c in sorted(_NAME_BY_CODE))


_TEXT_RE = re.compile(
    r"^(?P<library>[^/\s]+)/(?P<kernel>[^/\s]+)/(?P<implementation>[^/\[\s]+)"
    r"\[(?P<element_type>[a-z0-9_]+)\]@(?P<device>[a-z0-9_]+)#(?P<abi>\d+)$"
)
_PART_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True, order=True)
class KernelTuningKey:
    """Exact identity of one tunable kernel implementation.

    ``element_type`` is stored as the ONNX enum integer but accepted as an int,
    a name or a numpy dtype. Keys are frozen, hashable and ordered.
    """

    library: str
    kernel: str
    implementation: str
    element_type: int
    device: str = "cpu"
    tuning_abi: int = 1

    def __post_init__(self) -> None:
        for field in ("library", "kernel", "implementation"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise ValueError(f"KernelTuningKey.{field} must be a non-empty string, got {value!r}")
            if not _PART_RE.fullmatch(value):  # match() would accept a trailing newline
                raise ValueError(
                    f"KernelTuningKey.{field} {value!r} may only contain letters, digits, '_', '.', '-'"
                )
        object.__setattr__(self, "element_type", element_type_code(self.element_type))
        if not isinstance(self.device, str) or self.device not in DEVICES:
            raise ValueError(
                f"KernelTuningKey.device must be one of {sorted(DEVICES)}, got {self.device!r}"
            )
        abi = self.tuning_abi
        if isinstance(abi, bool) or not isinstance(abi, (int, np.integer)) or abi < 1:
            raise ValueError(f"KernelTuningKey.tuning_abi must be an int >= 1, got {abi!r}")
        object.__setattr__(self, "tuning_abi", int(abi))
        object.__setattr__(self, "_hash", hash((self.library, self.kernel, self.implementation,
                                                self.element_type, self.device, self.tuning_abi)))

    def __hash__(self) -> int:
        # Computed once: registration and resolution look keys up thousands of times.
        return self._hash

    def __reduce__(self) -> tuple[type[KernelTuningKey], tuple[Any, ...]]:
        # Rebuilt from its fields: a string's hash differs between processes (Ray's workers).
        return (type(self), (self.library, self.kernel, self.implementation, self.element_type,
                             self.device, self.tuning_abi))

    @property
    def element_type_name(self) -> str:
        """Lower-case ONNX name of the element type."""
        return _NAME_BY_CODE[self.element_type]

    def __str__(self) -> str:
        return (
            f"{self.library}/{self.kernel}/{self.implementation}"
            f"[{self.element_type_name}]@{self.device}#{self.tuning_abi}"
        )

    @classmethod
    def parse(cls, text: str) -> KernelTuningKey:
        """Parse the readable form produced by ``str(key)``."""
        match = _TEXT_RE.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ValueError(
                f"not a kernel tuning key: {text!r} "
                "(expected library/kernel/implementation[element_type]@device#abi)"
            )
        return cls(
            match["library"],
            match["kernel"],
            match["implementation"],
            match["element_type"],
            match["device"],
            int(match["abi"]),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, element type by name."""
        return {
            "library": self.library,
            "kernel": self.kernel,
            "implementation": self.implementation,
            "element_type": self.element_type_name,
            "device": self.device,
            "tuning_abi": self.tuning_abi,
        }
