"""The processor facts kept as data: ``cpu_tables.json``, with its JSON Schema beside it.

The flag and vendor tables are facts about processors, not logic, so they live in
``cpu_tables.json``; its format is ``cpu_tables.schema.json`` (a JSON Schema), against which
the test suite checks the shipped file (archspec's habit: the data is ours, so the check
belongs to the tests, not to every import). The file is read the first time a table is needed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = ["DATA_FILE", "SCHEMA_FILE", "load_tables"]

DATA_FILE = "cpu_tables.json"
SCHEMA_FILE = "cpu_tables.schema.json"


def _read_json(name: str) -> Any:
    # beside this module: importlib.resources would import zipfile for a plain folder
    text = (Path(__file__).parent / name).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not valid JSON: {exc}") from None


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({key: _frozen(item) for key, item in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(item) for item in value)
    return value


@functools.cache
def load_tables() -> Mapping[str, Any]:
    """The read-only content of ``cpu_tables.json`` (read once per process)."""
    return _frozen(_read_json(DATA_FILE))
