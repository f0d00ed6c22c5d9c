"""Tests for the exact tuning identity (keys.py) and typed values and schemas (schema.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from onnx_light.tuning.keys import KernelTuningKey, element_type_code, element_type_name
from onnx_light.tuning.schema import (
    KernelTuningSchema,
    Parameter,
    TuningValidationError,
    check_parameter_name,
    coerce_value,
)

ADD = KernelTuningKey("onnx_light", "Add", "portable", "float")

# --------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------


def test_key_fields_and_readable_form() -> None:
    assert ADD.element_type == TensorProto.FLOAT
    assert type(ADD.element_type) is int
    assert (ADD.device, ADD.tuning_abi) == ("cpu", 1)
    assert str(ADD) == "onnx_light/Add/portable[float]@cpu#1"
    assert ADD.element_type_name == "float"
    assert ADD.to_dict() == {"library": "onnx_light", "kernel": "Add", "implementation": "portable",
                             "element_type": "float", "device": "cpu", "tuning_abi": 1}
    assert KernelTuningKey(**ADD.to_dict()) == ADD


@pytest.mark.parametrize(
    ("spelling", "code"),
    [
        (1, TensorProto.FLOAT),
        (np.int64(1), TensorProto.FLOAT),
        ("float", TensorProto.FLOAT),
        ("FLOAT", TensorProto.FLOAT),
        ("float32", TensorProto.FLOAT),
        (" Float ", TensorProto.FLOAT),
        ("tensor(float)", TensorProto.FLOAT),
        (np.float32, TensorProto.FLOAT),
        (np.dtype("float32"), TensorProto.FLOAT),
        ("bfloat16", TensorProto.BFLOAT16),
        ("BFLOAT16", TensorProto.BFLOAT16),
        (ml_dtypes.bfloat16, TensorProto.BFLOAT16),
        (np.dtype(ml_dtypes.bfloat16), TensorProto.BFLOAT16),
        ("float16", TensorProto.FLOAT16),
        ("half", TensorProto.FLOAT16),
        (np.float16, TensorProto.FLOAT16),
        ("double", TensorProto.DOUBLE),
        ("float64", TensorProto.DOUBLE),
        (np.dtype("float64"), TensorProto.DOUBLE),
        ("int64", TensorProto.INT64),
        (np.int8, TensorProto.INT8),
        ("bool", TensorProto.BOOL),
        (np.bool_, TensorProto.BOOL),
        (TensorProto.UINT16, TensorProto.UINT16),
    ],
)
def test_element_type_spellings_store_the_tensorproto_int(spelling: object, code: int) -> None:
    assert element_type_code(spelling) == code
    key = KernelTuningKey("lib", "Op", "impl", spelling)
    assert key.element_type == code
    assert type(key.element_type) is int
    assert key == KernelTuningKey("lib", "Op", "impl", code)
    assert hash(key) == hash(KernelTuningKey("lib", "Op", "impl", code))


def test_element_type_name() -> None:
    assert element_type_name(1) == "float"
    assert element_type_name(ml_dtypes.bfloat16) == "bfloat16"
    assert element_type_name("FLOAT32") == "float"


@pytest.mark.parametrize("spelling", [0, -1, 999, "floaty", "", "tensor(nope)", np.dtype("M8[s]")])
def test_unknown_element_type_is_a_value_error(spelling: object) -> None:
    with pytest.raises(ValueError, match=r"element type|ONNX"):
        element_type_code(spelling)
    with pytest.raises(ValueError):
        KernelTuningKey("lib", "Op", "impl", spelling)


@pytest.mark.parametrize("spelling", [True, False, 1.5, None, object()])
def test_element_type_of_wrong_kind_is_a_type_error(spelling: object) -> None:
    with pytest.raises(TypeError, match="element type"):
        element_type_code(spelling)
    with pytest.raises(TypeError):
        KernelTuningKey("lib", "Op", "impl", spelling)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("library", ""), ("kernel", ""), ("implementation", ""),
        ("library", "a/b"), ("kernel", "Add[x]"), ("implementation", "port able"),
        ("kernel", "Add@cpu"), ("kernel", "Add#1"), ("library", "lib\n"), ("kernel", "Ädd"),
        ("library", 5), ("kernel", None),
    ],
)
def test_key_rejects_bad_names(field: str, value: object) -> None:
    fields = {"library": "lib", "kernel": "Op", "implementation": "impl", "element_type": 1}
    fields[field] = value
    with pytest.raises(ValueError, match=f"KernelTuningKey.{field}"):
        KernelTuningKey(**fields)


@pytest.mark.parametrize("device", ["gpu", "CPU", "", "cuda", ["cpu"]])
def test_key_device_must_be_cpu(device: object) -> None:
    with pytest.raises(ValueError, match="device"):
        KernelTuningKey("lib", "Op", "impl", 1, device)


@pytest.mark.parametrize("abi", [0, -1, True, False, 1.0, "1", None])
def test_key_tuning_abi_must_be_a_positive_int(abi: object) -> None:
    with pytest.raises(ValueError, match="tuning_abi"):
        KernelTuningKey("lib", "Op", "impl", 1, "cpu", abi)


def test_key_tuning_abi_numpy_int_is_stored_as_int() -> None:
    key = KernelTuningKey("lib", "Op", "impl", 1, "cpu", np.int64(3))
    assert key.tuning_abi == 3
    assert type(key.tuning_abi) is int


def test_key_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ADD.kernel = "Sub"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ADD.element_type = 11  # type: ignore[misc]


def test_key_is_hashable_and_distinguishes_every_field() -> None:
    variants = {
        ADD,
        dataclasses.replace(ADD, library="other"),
        dataclasses.replace(ADD, kernel="Sub"),
        dataclasses.replace(ADD, implementation="blocked"),
        dataclasses.replace(ADD, element_type="double"),
        dataclasses.replace(ADD, tuning_abi=2),
    }
    assert len(variants) == 6
    table = {ADD: "a"}
    assert table[KernelTuningKey("onnx_light", "Add", "portable", np.float32)] == "a"


def test_key_order_follows_fields() -> None:
    a = KernelTuningKey("lib", "Add", "portable", "float")
    b = KernelTuningKey("lib", "Add", "portable", "double")  # 11 > 1
    c = KernelTuningKey("lib", "Add", "portable", "float", tuning_abi=2)
    d = KernelTuningKey("lib", "Sub", "portable", "bool")
    assert sorted([d, c, b, a]) == [a, c, b, d]
    assert a < b < d
    assert not b < a


@pytest.mark.parametrize(
    "text",
    [
        "onnx_light/Add/portable[float]@cpu#1",
        "  onnx_light/Add/portable[float]@cpu#1\n",
    ],
)
def test_parse_readable_form(text: str) -> None:
    assert KernelTuningKey.parse(text) == ADD


def test_parse_other_types_and_abis() -> None:
    key = KernelTuningKey.parse("my-lib.x/Gemm/blocked_v2[bfloat16]@cpu#7")
    assert key == KernelTuningKey("my-lib.x", "Gemm", "blocked_v2", TensorProto.BFLOAT16, "cpu", 7)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "onnx_light/Add/portable[float]@cpu",
        "onnx_light/Add[float]@cpu#1",
        "onnx_light/Add/portable@cpu#1",
        "onnx_light/Add/portable[float]#1",
        "onnx_light/Add/portable[float]@gpu#1",
        "onnx_light/Add/portable[float]@cpu#0",
        "onnx_light/Add/portable[float]@cpu#-1",
        "onnx_light/Add/portable[nope]@cpu#1",
        "onnx_light/Add/portable[FLOAT]@cpu#1",
        "onnx_light//portable[float]@cpu#1",
        "a/b/c/d[float]@cpu#1",
        "onnx_light/Add/portable[float]@cpu#1 extra",
    ],
)
def test_parse_rejects_malformed_text(text: str) -> None:
    with pytest.raises(ValueError, match=r"kernel tuning key|element type|device|tuning_abi"):
        KernelTuningKey.parse(text)


@pytest.mark.parametrize("value", [None, 5, b"onnx_light/Add/portable[float]@cpu#1"])
def test_parse_rejects_non_strings(value: object) -> None:
    with pytest.raises(ValueError, match="not a kernel tuning key"):
        KernelTuningKey.parse(value)  # type: ignore[arg-type]


_NAMES = st.from_regex(r"[A-Za-z0-9_.\-]{1,20}", fullmatch=True)
_CODES = sorted({code for name, code in TensorProto.DataType.items() if code != 0})
KEYS = st.builds(
    KernelTuningKey,
    library=_NAMES, kernel=_NAMES, implementation=_NAMES,
    element_type=st.sampled_from(_CODES),
    device=st.just("cpu"),
    tuning_abi=st.integers(min_value=1, max_value=2**62),
)


@settings(deadline=None)  # no timing assertions on a loaded machine
@given(KEYS)
def test_parse_round_trips_str(key: KernelTuningKey) -> None:
    text = str(key)
    parsed = KernelTuningKey.parse(text)
    assert parsed == key
    assert str(parsed) == text
    assert KernelTuningKey(**key.to_dict()) == key


@settings(deadline=None, max_examples=60)
@given(KEYS, KEYS)
def test_key_order_and_equality_agree_with_field_tuples(a: KernelTuningKey, b: KernelTuningKey) -> None:
    as_tuple = dataclasses.astuple
    assert (a < b) == (as_tuple(a) < as_tuple(b))
    assert (a == b) == (as_tuple(a) == as_tuple(b))
    if a == b:
        assert hash(a) == hash(b)


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value_type", "value", "expected"),
    [
        ("int", 5, 5),
        ("int", -7, -7),
        ("int", np.int32(5), 5),
        ("int", np.uint8(200), 200),
        ("int", 2**63 - 1, 2**63 - 1),
        ("int", -(2**63), -(2**63)),
        ("int", np.int64(2**63 - 1), 2**63 - 1),
        ("float", 2.5, 2.5),
        ("float", 3, 3.0),
        ("float", np.float32(0.5), 0.5),
        ("float", np.int16(3), 3.0),
        ("float", -0.0, 0.0),
        ("float", 1e308, 1e308),
        ("bool", True, True),
        ("bool", False, False),
        ("bool", np.bool_(True), True),
        ("str", "", ""),
        ("str", "split_rows", "split_rows"),
        ("str", np.str_("blas"), "blas"),
    ],
)
def test_coerce_accepts_and_returns_plain_python(value_type: str, value: object, expected: object) -> None:
    result = coerce_value(value_type, value)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("value_type", "value"),
    [
        ("int", True), ("int", False), ("int", np.bool_(True)), ("int", 5.0), ("int", np.float64(5)),
        ("int", "5"), ("int", None), ("int", [1]), ("int", 1 + 0j),
        ("float", True), ("float", np.bool_(False)), ("float", "1.0"), ("float", None),
        ("float", [1.0]), ("float", 1 + 0j),
        ("bool", 1), ("bool", 0), ("bool", "true"), ("bool", None), ("bool", 1.0),
        ("str", 1), ("str", b"x"), ("str", None), ("str", True),
    ],
)
def test_coerce_rejects_wrong_types_with_type_error(value_type: str, value: object) -> None:
    with pytest.raises(TypeError, match=f"expected {value_type}"):
        coerce_value(value_type, value)


@pytest.mark.parametrize(
    ("value_type", "value", "rule"),
    [
        ("int", 2**63, "int64"),
        ("int", -(2**63) - 1, "int64"),
        ("int", np.uint64(2**64 - 1), "int64"),
        ("int", 10**400, "int64"),
        ("float", math.nan, "finite"),
        ("float", math.inf, "finite"),
        ("float", -math.inf, "finite"),
        ("float", np.float64("nan"), "finite"),
        ("float", np.float32("inf"), "finite"),
        ("float", 10**400, "finite"),
    ],
)
def test_coerce_rejects_out_of_range_numbers_with_value_error(value_type: str, value: object,
                                                               rule: str) -> None:
    with pytest.raises(ValueError, match=rule) as info:
        coerce_value(value_type, value)
    assert not isinstance(info.value, TypeError)


def test_coerce_unknown_value_type() -> None:
    with pytest.raises(ValueError, match="unknown value type 'double'"):
        coerce_value("double", 1.0)


@pytest.mark.parametrize("name", ["a", "_x", "parallel.minimum_elements", "a.b.c", "A1.b_2"])
def test_dotted_names_accepted(name: str) -> None:
    assert check_parameter_name(name) == name
    assert Parameter(name, "int", 1).name == name


@pytest.mark.parametrize("name", ["", "a..b", "1a", "a-b", ".a", "a.", "a b", "a.1b", "a/b", "ä",
                                  "a\n", 5, None])
def test_bad_names_rejected(name: object) -> None:
    with pytest.raises(ValueError, match="dotted identifier"):
        check_parameter_name(name)
    with pytest.raises(ValueError, match="dotted identifier"):
        Parameter(name, "int", 1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


def test_parameter_normalises_default_and_bounds() -> None:
    p = Parameter("x", "float", np.int32(2), minimum=1, maximum=np.float32(4.0))
    assert (p.default, p.minimum, p.maximum) == (2.0, 1.0, 4.0)
    assert all(type(v) is float for v in (p.default, p.minimum, p.maximum))


def test_parameter_bounds_and_choices_are_checked() -> None:
    p = Parameter("n", "int", 8, minimum=1, maximum=64)
    assert p.check(1) == 1
    assert p.check(64) == 64
    with pytest.raises(ValueError, match="below the minimum 1"):
        p.check(0)
    with pytest.raises(ValueError, match="above the maximum 64"):
        p.check(65)
    mode = Parameter("mode", "str", "blas", choices=("blas", "split_rows"))
    assert mode.check("split_rows") == "split_rows"
    with pytest.raises(ValueError, match="not one of"):
        mode.check("split_columns")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"type": "double", "default": 1.0}, ValueError, "type must be one of"),
        ({"type": "int", "default": True}, TypeError, "expected int"),
        ({"type": "int", "default": 0, "minimum": 1}, ValueError, "below the minimum"),
        ({"type": "int", "default": 9, "maximum": 8}, ValueError, "above the maximum"),
        ({"type": "str", "default": "a", "minimum": 1}, ValueError, "minimum needs an int or float"),
        ({"type": "bool", "default": True, "maximum": 1}, ValueError, "maximum needs an int or float"),
        ({"type": "int", "default": 1, "minimum": 0.5}, TypeError, "expected int"),
        ({"type": "str", "default": "a", "choices": ()}, ValueError, "choices must not be empty"),
        ({"type": "str", "default": "a", "choices": ("a", 1)}, TypeError, "expected str"),
        ({"type": "str", "default": "c", "choices": ("a", "b")}, ValueError, "not one of"),
        ({"type": "float", "default": math.nan}, ValueError, "finite"),
    ],
)
def test_parameter_definition_errors(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Parameter("p", **kwargs)


def test_parameter_to_dict_is_json() -> None:
    p = Parameter("mode", "str", "blas", "how", choices=("blas", "split_rows"))
    assert json.loads(json.dumps(p.to_dict())) == {
        "type": "str", "default": "blas", "description": "how", "choices": ["blas", "split_rows"]}
    q = Parameter("n", "int", 2, minimum=1, maximum=3)
    assert q.to_dict()["minimum"] == 1
    assert q.to_dict()["maximum"] == 3


# --------------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------------

GEMM = KernelTuningKey("testlib", "Gemm", "portable", "float")


def _no_split_below_blocks(values) -> None:
    if values["mode"] != "blas" and values["block"] > values["threshold"]:
        raise ValueError("block must not exceed threshold when splitting")


def gemm_schema(validator=_no_split_below_blocks) -> KernelTuningSchema:
    return KernelTuningSchema(GEMM, (
        Parameter("threshold", "int", 100, minimum=1),
        Parameter("mode", "str", "blas", choices=("blas", "split")),
        Parameter("block", "int", 1, minimum=1),
        Parameter("ratio", "float", 0.5, minimum=0.0, maximum=1.0),
        Parameter("enabled", "bool", True),
    ), validator)


def full(**changes: object) -> dict[str, object]:
    values = {"threshold": 100, "mode": "blas", "block": 1, "ratio": 0.5, "enabled": True}
    values.update(changes)
    return values


def test_schema_basics() -> None:
    schema = gemm_schema()
    assert schema.names == ("threshold", "mode", "block", "ratio", "enabled")
    assert dict(schema.defaults) == full()
    with pytest.raises(TypeError):
        schema.defaults["threshold"] = 3  # type: ignore[index]
    assert schema.parameter("mode").choices == ("blas", "split")
    json.dumps(schema.describe())
    assert set(schema.describe()) == set(schema.names)


def test_schema_validate_returns_normalised_values() -> None:
    checked = gemm_schema().validate(full(threshold=np.int64(7), ratio=np.float32(0.25),
                                          enabled=np.bool_(False)))
    assert checked == full(threshold=7, ratio=0.25, enabled=False)
    assert [type(v) for v in checked.values()] == [int, str, int, float, bool]


def test_schema_duplicate_parameter_names_rejected() -> None:
    with pytest.raises(ValueError, match=r"duplicate parameter names \['a'\]"):
        KernelTuningSchema(GEMM, (Parameter("a", "int", 1), Parameter("b", "int", 1),
                                  Parameter("a", "float", 1.0)))


def test_schema_needs_parameters_and_a_key() -> None:
    with pytest.raises(ValueError, match="at least one parameter"):
        KernelTuningSchema(GEMM, ())
    with pytest.raises(TypeError, match="KernelTuningKey"):
        KernelTuningSchema("testlib/Gemm/portable[float]@cpu#1", (Parameter("a", "int", 1),))  # type: ignore[arg-type]


def test_schema_defaults_must_pass_the_validator() -> None:
    def never(values) -> None:
        raise ValueError("nothing is allowed")

    with pytest.raises(ValueError, match="nothing is allowed"):
        KernelTuningSchema(GEMM, (Parameter("a", "int", 1),), never)


def test_validate_missing_name_is_a_value_error_naming_key_and_parameter() -> None:
    values = full()
    del values["block"]
    with pytest.raises(TuningValidationError, match="missing") as info:
        gemm_schema().validate(values)
    message = str(info.value)
    assert str(GEMM) in message
    assert "'block'" in message
    assert not isinstance(info.value, (KeyError, TypeError))


def test_validate_unknown_name_is_a_key_error_listing_valid_names() -> None:
    with pytest.raises(KeyError) as info:
        gemm_schema().validate(full(treshold=5))
    message = str(info.value)
    assert message.startswith(str(GEMM))
    assert "unknown parameter" in message
    assert "'treshold'" in message
    assert "'threshold'" in message  # the valid names are listed
    assert info.value.key == GEMM


def test_validate_unknown_name_reported_before_type_errors() -> None:
    with pytest.raises(KeyError):
        gemm_schema().validate(full(block="x", extra=1))


@pytest.mark.parametrize(
    ("changes", "parameter", "rule"),
    [
        ({"threshold": True}, "threshold", "expected int, got bool"),
        ({"threshold": 1.5}, "threshold", "expected int, got float"),
        ({"mode": 1}, "mode", "expected str"),
        ({"ratio": "0.5"}, "ratio", "expected float"),
        ({"enabled": 1}, "enabled", "expected bool, got int"),
    ],
)
def test_validate_wrong_type_is_a_type_error(changes: dict, parameter: str, rule: str) -> None:
    with pytest.raises(TypeError) as info:
        gemm_schema().validate(full(**changes))
    message = str(info.value)
    assert str(GEMM) in message
    assert f"parameter {parameter!r}" in message
    assert rule in message
    assert info.value.parameter == parameter
    assert info.value.key == GEMM


@pytest.mark.parametrize(
    ("changes", "parameter", "rule"),
    [
        ({"threshold": 0}, "threshold", "below the minimum 1"),
        ({"ratio": 1.5}, "ratio", "above the maximum 1.0"),
        ({"ratio": math.inf}, "ratio", "not finite"),
        ({"mode": "split_rows"}, "mode", "not one of"),
        ({"threshold": 2**64}, "threshold", "int64"),
    ],
)
def test_validate_broken_rule_is_a_value_error(changes: dict, parameter: str, rule: str) -> None:
    with pytest.raises(ValueError) as info:
        gemm_schema().validate(full(**changes))
    assert not isinstance(info.value, (TypeError, KeyError))
    message = str(info.value)
    assert str(GEMM) in message
    assert f"parameter {parameter!r}" in message
    assert rule in message


def test_validate_runs_the_kernel_validator_last() -> None:
    calls = []

    def validator(values) -> None:
        calls.append(dict(values))
        _no_split_below_blocks(values)

    schema = gemm_schema(validator)
    calls.clear()
    with pytest.raises(ValueError, match="kernel rule broken: block must not exceed threshold") as info:
        schema.validate(full(mode="split", block=200))
    assert str(GEMM) in str(info.value)
    assert info.value.parameter is None
    assert calls == [full(mode="split", block=200)]
    calls.clear()
    with pytest.raises(ValueError, match="below the minimum"):
        schema.validate(full(block=0))
    assert calls == []  # individually invalid values never reach the validator
    assert schema.validate(full(mode="split", block=50))["block"] == 50


def test_validator_receives_a_read_only_mapping() -> None:
    def mutate(values) -> None:
        values["block"] = 2

    with pytest.raises(ValueError, match="kernel rule broken"):
        KernelTuningSchema(GEMM, (Parameter("block", "int", 1),), mutate)


def test_validate_needs_a_mapping() -> None:
    with pytest.raises(TypeError, match="mapping"):
        gemm_schema().validate([("threshold", 1)])  # type: ignore[arg-type]


def test_update_applies_a_partial_change() -> None:
    schema = gemm_schema()
    base = full(threshold=500)
    assert schema.update(base, {"mode": "split", "block": 4}) == full(threshold=500, mode="split",
                                                                       block=4)
    assert base == full(threshold=500)  # the input is not changed
    with pytest.raises(KeyError, match="unknown parameter 'blok'"):
        schema.update(base, {"blok": 4})
    with pytest.raises(ValueError, match="kernel rule broken"):
        schema.update(base, {"mode": "split", "block": 501})
    with pytest.raises(TypeError, match="mapping"):
        schema.update(base, None)  # type: ignore[arg-type]


def test_parameter_lookup() -> None:
    schema = gemm_schema()
    assert schema.parameter("ratio").type == "float"
    with pytest.raises(KeyError, match=r"unknown parameter 'x'; valid: \['threshold'"):
        schema.parameter("x")


@settings(deadline=None)
@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_every_int64_is_accepted_and_nothing_beyond(number: int) -> None:
    assert coerce_value("int", number) == number
    assert coerce_value("int", np.int64(number)) == number
    beyond = number + 2**64 if number >= 0 else number - 2**64
    with pytest.raises(ValueError, match="int64"):
        coerce_value("int", beyond)


@settings(deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_floats_accepted_exactly_when_finite(number: float) -> None:
    if math.isfinite(number):
        assert coerce_value("float", number) == number
    else:
        with pytest.raises(ValueError, match="finite"):
            coerce_value("float", number)


def test_a_key_survives_pickling_into_another_process_as_a_dictionary_key() -> None:
    """A key's hash is cached; a pickled key must hash as the same key made in the receiving
    process, where strings hash differently (Ray's workers send keys between processes)."""
    key = KernelTuningKey("onnx_light", "Gemm", "portable", "float")
    probe = ("import pickle, sys\nfrom onnx_light.tuning.keys import KernelTuningKey as K\n"
             "key = pickle.loads(sys.stdin.buffer.read())\n"
             "print({K('onnx_light', 'Gemm', 'portable', 'float'): 'found'}.get(key, 'lost'))")
    done = subprocess.run([sys.executable, "-c", probe], input=pickle.dumps(key),
                          capture_output=True, check=True, timeout=120,
                          env={**os.environ, "PYTHONHASHSEED": "123"})
    assert done.stdout.decode().strip() == "found"
