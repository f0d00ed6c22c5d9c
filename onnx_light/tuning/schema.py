"""Typed tuning values and :class:`KernelTuningSchema`.

A schema lists every named value of one exact key with its type, portable
default and rules. Validation is strict: a bool is never an int, floats are
finite, ints fit int64, and errors name the key, the parameter and the rule.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import numpy as np

from .keys import KernelTuningKey

__all__ = [
    "VALUE_TYPES",
    "KernelTuningSchema",
    "Parameter",
    "TuningValidationError",
    "Value",
    "check_parameter_name",
]

Value = int | float | bool | str
ValueType = Literal["int", "float", "bool", "str"]
VALUE_TYPES: frozenset[str] = frozenset({"int", "float", "bool", "str"})
_INT64 = (-(2**63), 2**63 - 1)
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class TuningValidationError(ValueError):
    """A value or a set of values breaks a schema rule.

    Carries ``key`` and ``parameter`` (None for rules across parameters).
    """

    def __init__(self, message: str, *, key: KernelTuningKey | None = None,
                 parameter: str | None = None) -> None:
        prefix = f"{key}: " if key is not None else ""
        if parameter is not None:
            prefix += f"parameter {parameter!r}: "
        super().__init__(prefix + message)
        self.key = key
        self.parameter = parameter


class TuningTypeError(TuningValidationError, TypeError):
    """A value has the wrong type (also a ``TypeError``)."""


class UnknownParameterError(TuningValidationError, KeyError):
    """A name is not a parameter of the schema (also a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


def check_parameter_name(name: object) -> str:
    """Return ``name`` if it is a dotted identifier such as ``parallel.minimum_elements``."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"parameter name must be a dotted identifier like 'parallel.minimum_elements', "
            f"got {name!r}"
        )
    return name


def coerce_value(value_type: str, value: object) -> Value:
    """Return ``value`` as a plain Python value of ``value_type`` or raise ``TypeError``."""
    if value_type == "bool":
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
    elif value_type == "int":
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            number = int(value)
            if not _INT64[0] <= number <= _INT64[1]:
                raise ValueError(f"{number} does not fit in int64")
            return number
    elif value_type == "float":
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)
        ):
            try:
                number = float(value)
            except OverflowError:  # an int beyond the float range
                raise ValueError("int too large to be a finite float") from None
            if not math.isfinite(number):
                raise ValueError(f"{value!r} is not finite")
            return number
    elif value_type == "str":
        if isinstance(value, str):
            return str(value)  # a plain str, also for numpy.str_
    else:
        raise ValueError(f"unknown value type {value_type!r}; valid: {sorted(VALUE_TYPES)}")
    raise TypeError(f"expected {value_type}, got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class Parameter:
    """One named, typed tuning value with its portable default and rules."""

    name: str
    type: ValueType
    default: Value
    description: str = ""
    minimum: int | float | None = None
    maximum: int | float | None = None
    choices: tuple[Value, ...] | None = None

    def __post_init__(self) -> None:
        check_parameter_name(self.name)
        if self.type not in VALUE_TYPES:
            raise ValueError(
                f"parameter {self.name!r}: type must be one of {sorted(VALUE_TYPES)}, "
                f"got {self.type!r}"
            )
        if self.choices is not None:
            choices = tuple(coerce_value(self.type, c) for c in self.choices)
            if not choices:
                raise ValueError(f"parameter {self.name!r}: choices must not be empty")
            object.__setattr__(self, "choices", choices)
        for bound in ("minimum", "maximum"):
            if getattr(self, bound) is not None:
                if self.type not in ("int", "float"):
                    raise ValueError(f"parameter {self.name!r}: {bound} needs an int or float type")
                object.__setattr__(self, bound, coerce_value(self.type, getattr(self, bound)))
        object.__setattr__(self, "default", self.check(self.default))

    def check(self, value: object, key: KernelTuningKey | None = None) -> Value:
        """Return ``value`` normalised, or raise naming the parameter and the rule."""
        try:
            value = coerce_value(self.type, value)
        except TypeError as exc:
            raise TuningTypeError(str(exc), key=key, parameter=self.name) from None
        except ValueError as exc:
            raise TuningValidationError(str(exc), key=key, parameter=self.name) from None
        if self.minimum is not None and value < self.minimum:
            raise TuningValidationError(
                f"{value!r} is below the minimum {self.minimum!r}", key=key, parameter=self.name
            )
        if self.maximum is not None and value > self.maximum:
            raise TuningValidationError(
                f"{value!r} is above the maximum {self.maximum!r}", key=key, parameter=self.name
            )
        if self.choices is not None and value not in self.choices:
            raise TuningValidationError(
                f"{value!r} is not one of {list(self.choices)!r}", key=key, parameter=self.name
            )
        return value

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description."""
        record: dict[str, Any] = {"type": self.type, "default": self.default,
                                  "description": self.description}
        if self.minimum is not None:
            record["minimum"] = self.minimum
        if self.maximum is not None:
            record["maximum"] = self.maximum
        if self.choices is not None:
            record["choices"] = list(self.choices)
        return record


Validator = Callable[[Mapping[str, Value]], None]


@dataclass(frozen=True)
class KernelTuningSchema:
    """The complete set of tuning values of one exact key.

    ``validator`` checks rules across parameters; it receives the complete,
    individually valid values and raises ``ValueError`` to reject them. ``revision`` is the
    kernel's revision: its author bumps it when the implementation's speed changes while its
    parameters keep their meaning, so that values measured before are reported stale
    (:mod:`onnx_light.tuning.identity`); a change of meaning bumps the key's tuning ABI.
    """

    key: KernelTuningKey
    parameters: tuple[Parameter, ...]
    validator: Validator | None = field(default=None, compare=False)
    revision: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.key, KernelTuningKey):
            raise TypeError(f"schema key must be a KernelTuningKey, got {type(self.key).__name__}")
        if isinstance(self.revision, bool) or not isinstance(self.revision, int) or self.revision < 1:
            raise ValueError(f"{self.key}: revision must be an int >= 1, got {self.revision!r}")
        parameters = tuple(self.parameters)
        if not parameters:
            raise ValueError(f"{self.key}: a schema needs at least one parameter")
        names = [p.name for p in parameters]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"{self.key}: duplicate parameter names {duplicates}")
        object.__setattr__(self, "parameters", parameters)
        self.validate(self.defaults)

    @property
    def names(self) -> tuple[str, ...]:
        """Parameter names in declaration order."""
        return tuple(p.name for p in self.parameters)

    @property
    def defaults(self) -> Mapping[str, Value]:
        """The portable defaults, read-only."""
        return MappingProxyType({p.name: p.default for p in self.parameters})

    def parameter(self, name: str) -> Parameter:
        """The parameter called ``name``; ``KeyError`` listing the valid names otherwise."""
        for p in self.parameters:
            if p.name == name:
                return p
        raise UnknownParameterError(
            f"unknown parameter {name!r}; valid: {list(self.names)}", key=self.key
        )

    def validate(self, values: Mapping[str, object]) -> dict[str, Value]:
        """Check a complete set: no missing or unknown name, types, bounds, then the validator."""
        if not isinstance(values, Mapping):
            raise TuningTypeError(f"values must be a mapping, got {type(values).__name__}",
                                  key=self.key)
        unknown = sorted(set(values) - set(self.names), key=str)
        if unknown:
            raise UnknownParameterError(
                f"unknown parameter(s) {unknown}; valid: {list(self.names)}", key=self.key
            )
        missing = [n for n in self.names if n not in values]
        if missing:
            raise TuningValidationError(f"missing parameter(s) {missing}", key=self.key)
        checked = {p.name: p.check(values[p.name], self.key) for p in self.parameters}
        if self.validator is not None:
            try:
                self.validator(MappingProxyType(checked))
            except (ValueError, TypeError) as exc:
                raise TuningValidationError(f"kernel rule broken: {exc}", key=self.key) from None
        return checked

    def update(self, base: Mapping[str, object], changes: Mapping[str, object]) -> dict[str, Value]:
        """Apply a partial update to a complete set and validate the result."""
        if not isinstance(changes, Mapping):
            raise TuningTypeError(f"values must be a mapping, got {type(changes).__name__}",
                                  key=self.key)
        for name in changes:
            self.parameter(name)
        return self.validate({**base, **changes})

    def describe(self) -> dict[str, dict[str, Any]]:
        """Name -> type, default, bounds and description, JSON-serialisable."""
        return {p.name: p.to_dict() for p in self.parameters}


def schemas_by_key(schemas: Iterable[KernelTuningSchema]) -> dict[KernelTuningKey, KernelTuningSchema]:
    """Index schemas by key, rejecting duplicates within the batch."""
    indexed: dict[KernelTuningKey, KernelTuningSchema] = {}
    for schema in schemas:
        if not isinstance(schema, KernelTuningSchema):
            raise TypeError(f"expected a KernelTuningSchema, got {type(schema).__name__}")
        if schema.key in indexed:
            raise ValueError(f"schema for {schema.key} given twice")
        indexed[schema.key] = schema
    return indexed
