"""The processor facts kept as data: ``cpu_tables.json``, checked against its schema.

The flag and vendor tables are facts about processors, not logic, so they live in
``cpu_tables.json`` (the format is described by ``cpu_tables.schema.json``, a JSON Schema).
Both files are read the first time a table is needed, and the data is validated against the
schema then: a hand edit that breaks the format fails with the file and the key named,
not later with a ``KeyError``. The validator knows the few JSON Schema keywords the schema
uses and refuses any other, so the schema cannot silently ask for a check nobody makes.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import Any

__all__ = ["DATA_FILE", "SCHEMA_FILE", "load_tables", "validate"]

DATA_FILE = "cpu_tables.json"
SCHEMA_FILE = "cpu_tables.schema.json"

_TYPES: dict[str, type] = {
    "object": dict, "array": list, "string": str,
}
_ANNOTATIONS = frozenset({"title", "description"})
_KEYWORDS = _ANNOTATIONS | {"type", "required", "properties", "additionalProperties",
                            "propertyNames", "pattern", "items", "minItems"}


def validate(value: Any, schema: Mapping[str, Any], where: str = "") -> None:
    """Raise ValueError naming the JSON path (``features.x86.pni``) where ``value`` breaks
    ``schema``; a schema keyword this validator does not implement is an error too."""
    unknown = sorted(set(schema) - _KEYWORDS)
    if unknown:
        raise ValueError(f"schema at {where or 'the top'} uses unsupported keyword(s) {unknown}")
    label = where or "the top level"
    if "type" in schema and not isinstance(value, _TYPES[schema["type"]]):
        raise ValueError(f"{label} must be a JSON {schema['type']}, got {value!r}")
    if "pattern" in schema and re.search(schema["pattern"], value) is None:
        raise ValueError(f"{label}: {value!r} does not match {schema['pattern']}")
    if "minItems" in schema and len(value) < schema["minItems"]:
        raise ValueError(f"{label} needs at least {schema['minItems']} item(s)")
    for index, item in enumerate(value if "items" in schema else ()):
        validate(item, schema["items"], f"{where}[{index}]")
    if not isinstance(value, dict):
        return
    missing = [name for name in schema.get("required", ()) if name not in value]
    if missing:
        raise ValueError(f"{label} lacks the key(s) {missing}")
    properties = schema.get("properties", {})
    for key, item in value.items():
        path = f"{where}.{key}" if where else key
        if "propertyNames" in schema:
            validate(key, schema["propertyNames"], f"key {path!r}")
        if key in properties:
            validate(item, properties[key], path)
        elif schema.get("additionalProperties", True) is False:
            raise ValueError(f"{label} has the unknown key {key!r}; valid: {sorted(properties)}")
        elif isinstance(schema.get("additionalProperties"), Mapping):
            validate(item, schema["additionalProperties"], path)


def _read_json(name: str) -> Any:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
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
    """The validated, read-only content of ``cpu_tables.json`` (read once per process)."""
    data = _read_json(DATA_FILE)
    try:
        validate(data, _read_json(SCHEMA_FILE))
    except ValueError as exc:
        raise ValueError(f"{DATA_FILE}: {exc}") from None
    return _frozen(data)
