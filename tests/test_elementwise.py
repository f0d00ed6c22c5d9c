"""Elementwise kernels: every op and element type against onnx's ReferenceEvaluator.

Each case runs the kernel on the forced-serial path and on the forced-parallel path (a
3-thread pool, ``parallel.minimum_elements`` = 1), compares the serial output with the
reference (exact for integers, bool and strings; float tolerances in :data:`TOLERANCES`),
and requires the two paths to be bit-identical. Fast; no timing assertions.
"""

from __future__ import annotations

import itertools
import math
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

from onnx_light.kernels import erf_derivation, math_functions
from onnx_light.kernels.base import KernelError, NodeContext, numpy_dtype, quiet, quiet_already
from onnx_light.kernels.elementwise import (
    CHEAP_MINIMUM_BYTES,
    DEFAULT_MINIMUM_ELEMENTS,
    ELEMENTWISE_TYPES,
    EXPENSIVE_MINIMUM_ELEMENTS,
    KERNELS,
    MINIMUM_ELEMENTS,
    OPS,
    SERIAL_ONLY,
    ElementwiseKernel,
    tuning_schemas,
)
from onnx_light.kernels.elementwise_op import BINARY, TERNARY, UNARY, VARIADIC, ElementwiseOp
from onnx_light.parallel import ThreadPool
from onnx_light.tuning.keys import KernelTuningKey, element_type_code, element_type_name
from onnx_light.tuning.registry import KernelTuningRegistry

SERIAL = {MINIMUM_ELEMENTS: 2**62}
PARALLEL = {MINIMUM_ELEMENTS: 1}
OPSET = max(v for versions in KERNELS.values() for v in versions)
OP = {op.op_type: op for op in OPS}
HALF = (T.FLOAT16, T.BFLOAT16)
INTEGER = (T.INT8, T.INT16, T.INT32, T.INT64, T.UINT8, T.UINT16, T.UINT32, T.UINT64)
UNSIGNED = (T.UINT8, T.UINT16, T.UINT32, T.UINT64)
FLOAT8 = (T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ)

# Float tolerances against the reference, in units of the output type's epsilon (float16
# 2**-10, bfloat16 2**-7, float32 2**-23, float64 2**-52; relative, and absolute below 1), as
# (ulps for float16 and bfloat16, for float32, for float64, reason). Ops not listed must
# match exactly (NaN == NaN): they make the same numpy calls as the reference in the same
# type and order, or are exact anyway.
TOLERANCES: dict[str, tuple[float, float, float, str]] = {
    "LeakyRelu": (1, 0, 0, "halves: float32 with alpha in float32, one rounding; the reference "
                           "rounds alpha and x * alpha to the half type"),
    "Sigmoid": (1, 1, 0, "halves: float32 then one rounding; float: the compiled program, "
                         "float64 then one rounding; the reference rounds every step"),
    "HardSwish": (1, 1, 0, "halves: float32 then one rounding; float: the compiled program, "
                           "float64 then one rounding; the reference rounds every step"),
    "Softsign": (1, 0, 0, "halves: float32 then one rounding; the reference rounds every step"),
    "Selu": (1, 0, 0, "halves: float32 then one rounding; the reference rounds every step"),
    "Sum": (2, 0, 0, "halves: float32 then one rounding; the reference rounds every addition"),
    "Mean": (2, 0, 0, "halves: float32 then one rounding; the reference rounds every step"),
    "Erf": (0, 0, 2**29, "float64: the reference evaluates erf in float32 "
                         "(np.vectorize(otypes='f')), so one float32 epsilon; ours is float64 "
                         "(test_erf_accuracy)"),
    "Gelu": (1, 2, 2**29, "ours runs in float64 and rounds once; the reference's function body "
                          "rounds every step in the input type, with its float32 erf"),
}
EPSILON = {T.FLOAT16: 2.0**-10, T.BFLOAT16: 2.0**-7, T.FLOAT: 2.0**-23, T.DOUBLE: 2.0**-52}


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPool]:
    with ThreadPool(3) as p:
        yield p


# --------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class Domain:
    """Where an input's values come from: a float range and an integer range."""

    floats: tuple[float, float] = (-5.0, 5.0)
    ints: tuple[int, int] = (-50, 50)
    nonzero: bool = False  # draw the magnitude from the range, then a random sign
    halves: bool = False  # floats on a grid of 0.5, so that comparisons see equal values


WIDE = Domain()
POSITIVE = Domain((0.1, 10.0), (1, 50))
DIVISOR = Domain((0.5, 4.0), (1, 9), nonzero=True)
GRID = Domain(halves=True, ints=(-3, 3))

# Per op, the domain of each input (the last one repeats for variadic ops).
DOMAINS: dict[str, tuple[Domain, ...]] = {
    "Log": (POSITIVE,),
    "Sqrt": (POSITIVE,),
    "Reciprocal": (DIVISOR,),
    "Exp": (Domain((-10.0, 10.0)),),
    "Sinh": (Domain((-5.0, 5.0)),),
    "Cosh": (Domain((-5.0, 5.0)),),
    "Tan": (Domain((-1.5, 1.5)),),
    "Asin": (Domain((-0.99, 0.99)),),
    "Acos": (Domain((-0.99, 0.99)),),
    "Atanh": (Domain((-0.99, 0.99)),),
    "Acosh": (Domain((1.01, 10.0)),),
    "Round": (Domain(halves=True),),
    "Neg": (Domain(ints=(-100, 100)),),
    "Add": (Domain(ints=(-60, 60)),),
    "Sub": (Domain(ints=(50, 60)), Domain(ints=(0, 50))),
    "Mul": (Domain(ints=(-11, 11)),),
    "Div": (Domain(ints=(-100, 100)), DIVISOR),
    "Mod": (Domain(ints=(-100, 100)), DIVISOR),
    "Pow": (Domain((0.1, 3.0), (-4, 4)), Domain((-2.0, 3.0), (0, 5))),
    "PRelu": (Domain(ints=(-50, 50)), Domain((-1.0, 1.0), (0, 3))),
    "Sum": (Domain(ints=(-20, 20)),),
    "Mean": (Domain(ints=(-20, 20)),),
    "Equal": (GRID,),
    "Less": (GRID,),
    "LessOrEqual": (GRID,),
    "Greater": (GRID,),
    "GreaterOrEqual": (GRID,),
    "Clip": (Domain((-10.0, 10.0), (-10, 10)),),
}
STRINGS = np.array(["", "a", "bb", "c", "a b"], dtype=object)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 65504.0, -1e30], dtype=np.float64)


def with_special_values(x: np.ndarray) -> np.ndarray:
    """``x`` with its first elements replaced by NaN, infinities, signed zeros and extremes."""
    flat = x.copy().reshape(-1)
    count = min(flat.size, len(SPECIAL))
    with np.errstate(over="ignore"):  # 1e30 overflows float16: inf
        flat[:count] = SPECIAL[:count].astype(np.float32).astype(x.dtype)
    return flat.reshape(x.shape)


def domain(op: str, index: int) -> Domain:
    domains = DOMAINS.get(op, (WIDE,))
    return domains[min(index, len(domains) - 1)]


def sample(rng: np.random.Generator, element_type: int, shape: tuple[int, ...],
           dom: Domain = WIDE) -> np.ndarray:
    """Random values of an element type, within ``dom``; no overflow of integer types."""
    dtype = numpy_dtype(element_type)
    if element_type == T.BOOL:
        return rng.random(shape) < 0.5
    if element_type == T.STRING:
        return rng.choice(STRINGS, size=shape)
    if element_type in (T.COMPLEX64, T.COMPLEX128):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if element_type in INTEGER:
        info = np.iinfo(dtype)
        low, high = max(dom.ints[0], int(info.min)), min(dom.ints[1], int(info.max))
        values = rng.integers(low, high + 1, size=shape)
        if dom.nonzero:
            values = values * rng.choice([-1, 1] if info.min < 0 else [1], size=shape)
        return values.astype(dtype)
    low, high = dom.floats
    values = rng.uniform(low, high, size=shape)
    if dom.nonzero:
        values = values * rng.choice([-1.0, 1.0], size=shape)
    if dom.halves:
        values = np.round(values * 2) / 2
    return values.astype(np.float32 if element_type != T.DOUBLE else np.float64).astype(dtype)


def noncontiguous(array: np.ndarray) -> np.ndarray:
    """The same values through a transposed (non C-contiguous) view, for 2-D arrays."""
    if array.ndim != 2:
        return array
    return np.ascontiguousarray(array.T).T


# Shape cases per arity: each a tuple of input shapes. "T" marks a transposed 2-D view.
UNARY_CASES = [((1,),), ((7,),), ((1001,),), ((),), ((3, 5, 7),), (("T", 13, 11),)]
BINARY_CASES = [
    ((1,), (1,)), ((7,), (7,)), ((1001,), (1001,)),  # equal shapes
    ((1001,), ()), ((), (7,)), ((1,), (1001,)), ((3, 4), (1, 1)),  # scalar broadcast
    ((3, 1, 5), (4, 1)), ((2, 3, 1), (1, 3, 7)), ((1, 5, 1), (7, 1, 3)),  # multidirectional
    (("T", 13, 11), (13, 11)), (("T", 9, 7), (7,)),  # non-contiguous
]
VARIADIC_CASES = [((7,),), ((1001,), (1001,), (1001,)), ((3, 1, 5), (4, 1), ()),
                  ((2, 1), (1, 3), (2, 3), (1,))]
TERNARY_CASES = [((7,), (7,), (7,)), ((1001,), (1001,), ()), ((7, 1), (1, 5), ()),
                 ((), (3, 4), (3, 1)), ((2, 1, 3), ("T", 4, 3), (1, 1))]
CASES_BY_ARITY = {UNARY: UNARY_CASES, BINARY: BINARY_CASES, VARIADIC: VARIADIC_CASES,
                  TERNARY: TERNARY_CASES}


def make_input(rng: np.random.Generator, element_type: int, spec: tuple[Any, ...],
               dom: Domain) -> np.ndarray:
    if spec and spec[0] == "T":
        return noncontiguous(sample(rng, element_type, tuple(spec[1:]), dom))
    return sample(rng, element_type, tuple(spec), dom)


# Attribute sets tested per op (the first is ONNX's defaults).
ATTRIBUTES: dict[str, list[dict[str, Any]]] = {
    "IsInf": [{}, {"detect_negative": 0}, {"detect_positive": 0},
              {"detect_negative": 0, "detect_positive": 0}],
    "LeakyRelu": [{}, {"alpha": 0.3}],
    "HardSigmoid": [{}, {"alpha": 0.4, "beta": 0.25}],
    "Elu": [{}, {"alpha": 0.5}],
    "Selu": [{}, {"alpha": 1.5, "gamma": 2.0}],
    "Celu": [{}, {"alpha": 2.0}],
    "Gelu": [{}, {"approximate": "tanh"}],
    "Mod": [{"fmod": 0}, {"fmod": 1}],
}


# --------------------------------------------------------------------------------------------
# Running kernels and the reference


def build(op: str, input_types: Sequence[int | None], opset: int = OPSET,
          **attributes: Any) -> ElementwiseKernel:
    versions = KERNELS[op]
    cls = versions[max(v for v in versions if v <= opset)]
    ctx = NodeContext(name=f"{op}_node", op_type=op, domain="", opset=opset,
                      attributes=attributes, input_types=tuple(input_types),
                      num_inputs=len(input_types))
    return cls(ctx)


def run_both(op: str, input_types: Sequence[int | None], inputs: Sequence[np.ndarray | None],
             pool: ThreadPool, opset: int = OPSET,
             **attributes: Any) -> tuple[np.ndarray, np.ndarray]:
    """(serial output, parallel output); checks which path each took."""
    serial = build(op, input_types, opset, **attributes)
    serial.bind(pool).configure(SERIAL)
    parallel = build(op, input_types, opset, **attributes)
    parallel.bind(pool).configure(PARALLEL)
    (a,) = serial.run(*inputs)
    (b,) = parallel.run(*inputs)
    assert not serial.uses_parallel(a.size)
    assert parallel.uses_parallel(b.size)
    return a, b


# Shortcomings of the reference implementation worked around in the oracle (not in the kernels):
# its Softsign fails on 0-d inputs (in-place ops on a numpy scalar), its Mean does not
# broadcast (``res += m``).
REFERENCE_FAILS_ON_0D = {"Softsign"}
REFERENCE_DOES_NOT_BROADCAST = {"Mean"}


def reference(op: str, input_types: Sequence[int], inputs: Sequence[np.ndarray | None],
              opset: int = OPSET, **attributes: Any) -> np.ndarray:
    """The output of onnx's ReferenceEvaluator on a one-node model."""
    if op in REFERENCE_FAILS_ON_0D and all(x is None or x.ndim == 0 for x in inputs):
        inputs = [None if x is None else x.reshape(1) for x in inputs]
        return _reference(op, input_types, inputs, opset, **attributes).reshape(())
    if op in REFERENCE_DOES_NOT_BROADCAST:
        inputs = [np.ascontiguousarray(x) for x in np.broadcast_arrays(*inputs)]
    return _reference(op, input_types, inputs, opset, **attributes)


def _reference(op: str, input_types: Sequence[int], inputs: Sequence[np.ndarray | None],
               opset: int, **attributes: Any) -> np.ndarray:
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    graph_inputs = [helper.make_tensor_value_info(name, t, None)
                    for name, t in zip(names, input_types, strict=True) if name]
    node = helper.make_node(op, names, ["y"], **attributes)
    output = helper.make_tensor_value_info("y", T.UNDEFINED, None)
    graph = helper.make_graph([node], "g", graph_inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {name: x for name, x in zip(names, inputs, strict=True) if name}
    return ReferenceEvaluator(model).run(None, feeds)[0]


def assert_bit_identical(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == object:
        assert a.tolist() == b.tolist()
    else:
        assert np.array_equal(np.ascontiguousarray(a).view(np.uint8),
                              np.ascontiguousarray(b).view(np.uint8))


def assert_matches(op: str, element_type: int, actual: np.ndarray, expected: np.ndarray) -> None:
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype == object or expected.dtype == object or actual.dtype.kind in "biuc":
        assert actual.tolist() == expected.tolist()
        return
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    half, single, double, _ = TOLERANCES.get(op, (0, 0, 0, ""))
    ulps = {T.FLOAT: single, T.DOUBLE: double}.get(element_type, half)
    if ulps == 0:
        assert np.array_equal(a, e, equal_nan=True), (op, element_type_name(element_type),
                                                      a[a != e], e[a != e])
    else:
        tol = ulps * EPSILON[element_type]
        np.testing.assert_allclose(a, e, rtol=tol, atol=tol, equal_nan=True,
                                   err_msg=f"{op} {element_type_name(element_type)}")


def input_types_for(op: ElementwiseOp, element_type: int, count: int) -> list[int]:
    if op.op_type == "Where":
        return [T.BOOL, element_type, element_type]
    return [element_type] * count


def op_cases() -> list[tuple[str, int]]:
    return [(op.op_type, t) for op in OPS for t in op.types if op.op_type != "Clip"]


def case_id(case: tuple[str, int]) -> str:
    return f"{case[0]}-{element_type_name(case[1])}"


# --------------------------------------------------------------------------------------------
# Every op, every element type, serial and parallel, against the reference


@pytest.mark.parametrize("case", op_cases(), ids=case_id)
def test_matches_reference_serial_and_parallel(case: tuple[str, int], pool: ThreadPool) -> None:
    op_type, element_type = case
    op = OP[op_type]
    rng = np.random.default_rng(zlib.crc32(case_id(case).encode()))
    for attributes in ATTRIBUTES.get(op_type, [{}]):
        for shapes in CASES_BY_ARITY[op.arity]:
            types = input_types_for(op, element_type, len(shapes))
            inputs = [make_input(rng, t, spec, domain(op_type, i))
                      for i, (t, spec) in enumerate(zip(types, shapes, strict=True))]
            if op_type in ("IsNaN", "IsInf"):
                inputs[0] = with_special_values(inputs[0])
            serial, parallel = run_both(op_type, types, inputs, pool, **attributes)
            expected = reference(op_type, types, inputs, **attributes)
            expected_dtype = np.dtype(bool) if op.output == "bool" else numpy_dtype(element_type)
            assert serial.dtype == expected_dtype
            assert_matches(op_type, element_type, serial, expected)
            assert_bit_identical(serial, parallel)


@pytest.mark.parametrize("element_type", OP["Clip"].types, ids=element_type_name)
def test_clip(element_type: int, pool: ThreadPool) -> None:
    rng = np.random.default_rng(element_type)
    dtype = numpy_dtype(element_type)
    low = 2 if element_type in UNSIGNED else -2
    bounds = [(low, 7), (None, 7), (low, None), (None, None), (4, 1)]  # min > max gives max
    for shapes in UNARY_CASES:
        x = make_input(rng, element_type, shapes[0], domain("Clip", 0))
        for low, high in bounds:
            inputs = [x, None if low is None else np.array(low, dtype),
                      None if high is None else np.array(high, dtype)]
            while inputs[-1] is None:
                inputs.pop()
            types = [element_type] * len(inputs)
            serial, parallel = run_both("Clip", types, inputs, pool)
            assert_matches("Clip", element_type, serial, reference("Clip", types, inputs))
            assert_bit_identical(serial, parallel)


@pytest.mark.parametrize("element_type", [T.FLOAT16, T.FLOAT, T.DOUBLE], ids=element_type_name)
def test_clip_before_opset_11_reads_attributes(element_type: int, pool: ThreadPool) -> None:
    x = sample(np.random.default_rng(0), element_type, (1001,), Domain((-10.0, 10.0)))
    for attributes in ({"min": -2.0, "max": 3.5}, {"min": -1.0}, {}):
        serial, parallel = run_both("Clip", [element_type], [x], pool, opset=10, **attributes)
        assert_matches("Clip", element_type, serial,
                       reference("Clip", [element_type], [x], opset=10, **attributes))
        assert_bit_identical(serial, parallel)


POW_EXPONENT_TYPES = (*INTEGER, T.FLOAT16, T.BFLOAT16, T.FLOAT, T.DOUBLE)


@pytest.mark.parametrize("base_type", OP["Pow"].types, ids=element_type_name)
def test_pow_exponent_types(base_type: int, pool: ThreadPool) -> None:
    """ONNX lets the exponent have any numeric type; the output has the base's type."""
    rng = np.random.default_rng(base_type)
    base_domain = Domain((0.5, 3.0), (1, 5))
    for exponent_type in POW_EXPONENT_TYPES:
        exponent_domain = Domain((-2.0, 3.0), (0, 5))
        for shapes in (((1001,), (1001,)), ((1001,), ()), ((3, 1), (1, 4))):
            x = sample(rng, base_type, shapes[0], base_domain)
            y = sample(rng, exponent_type, shapes[1], exponent_domain)
            types = [base_type, exponent_type]
            serial, parallel = run_both("Pow", types, [x, y], pool)
            assert serial.dtype == x.dtype
            try:
                expected = reference("Pow", types, [x, y])
            except (TypeError, ValueError):  # numpy cannot promote the pair: float64 instead
                expected = np.power(x.astype(np.float64), y.astype(np.float64)).astype(x.dtype)
            assert_matches("Pow", base_type, serial, expected)
            assert_bit_identical(serial, parallel)


@pytest.mark.parametrize("case", [(op.op_type, t) for op in OPS for t in op.types
                                  if op.arity is UNARY and t in (T.FLOAT16, T.BFLOAT16, T.FLOAT,
                                                                 T.DOUBLE, *FLOAT8)],
                         ids=case_id)
def test_special_values_serial_equals_parallel(case: tuple[str, int], pool: ThreadPool) -> None:
    """NaN, infinities, signed zeros, subnormals and huge values: both paths bit-identical."""
    op_type, element_type = case
    rng = np.random.default_rng(7)
    values = np.concatenate([np.tile(SPECIAL, 40), rng.standard_normal(4099) * 30,
                             np.full(17, 5e-324)])
    rng.shuffle(values)
    with np.errstate(over="ignore"):
        x = values.astype(np.float32 if element_type != T.DOUBLE else np.float64)
        x = x.astype(numpy_dtype(element_type))
    for attributes in ATTRIBUTES.get(op_type, [{}]):
        serial, parallel = run_both(op_type, [element_type], [x], pool, **attributes)
        assert_bit_identical(serial, parallel)


# --------------------------------------------------------------------------------------------
# The table against ONNX's own operator schemas


def onnx_types(type_strings: Sequence[str]) -> set[int]:
    return {element_type_code(s) for s in type_strings}


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.op_type)
def test_types_and_versions_match_onnx(op: ElementwiseOp) -> None:
    latest = onnx.defs.get_schema(op.op_type)
    parameter = latest.inputs[min(op.key_input, len(latest.inputs) - 1)].type_str
    allowed = next(c.allowed_type_strs for c in latest.type_constraints
                   if c.type_param_str == parameter)
    assert set(op.types) == onnx_types(allowed)
    assert len(set(op.types)) == len(op.types)
    for version in op.versions:
        assert onnx.defs.get_schema(op.op_type, version).since_version == version
    assert max(op.versions) == latest.since_version
    assert list(op.versions) == sorted(op.versions)
    assert set(KERNELS[op.op_type]) == set(op.versions)
    output_types = next(c.allowed_type_strs for c in latest.type_constraints
                        if c.type_param_str == latest.outputs[0].type_str)
    if op.output == "bool":
        assert onnx_types(output_types) == {T.BOOL}


def test_kernels_table_shape() -> None:
    assert set(KERNELS) == set(ELEMENTWISE_TYPES) == {op.op_type for op in OPS}
    for op_type, versions in KERNELS.items():
        classes = set(versions.values())
        assert len(classes) == 1
        cls = classes.pop()
        assert issubclass(cls, ElementwiseKernel)
        assert cls.op_type == op_type and cls.declaration.tunable


# --------------------------------------------------------------------------------------------
# Tuning schemas and the parallel decision


def test_every_schema_validates_its_default_and_registers() -> None:
    schemas = tuning_schemas()
    assert len(schemas) == sum(len(op.types) for op in OPS)
    for schema in schemas:
        assert schema.key == KernelTuningKey("onnx_light", schema.key.kernel, "portable",
                                             schema.key.element_type)
        assert schema.names == (MINIMUM_ELEMENTS,)
        assert schema.validate(schema.defaults) == dict(schema.defaults)
        assert schema.defaults[MINIMUM_ELEMENTS] >= 1
    KernelTuningRegistry().register(schemas=schemas)


def test_portable_defaults_follow_the_measured_classes() -> None:
    defaults = {(s.key.kernel, s.key.element_type): s.defaults[MINIMUM_ELEMENTS]
                for s in tuning_schemas()}
    assert defaults["Abs", T.FLOAT] == defaults["Add", T.INT32] == DEFAULT_MINIMUM_ELEMENTS
    assert defaults["Not", T.BOOL] == defaults["Abs", T.INT8] == CHEAP_MINIMUM_BYTES
    assert defaults["Add", T.DOUBLE] == CHEAP_MINIMUM_BYTES // 8
    for op_type, element_type in [("Exp", T.FLOAT), ("Sigmoid", T.DOUBLE), ("Add", T.FLOAT16),
                                  ("Relu", T.BFLOAT16), ("IsNaN", T.FLOAT8E5M2)]:
        assert defaults[op_type, element_type] == EXPENSIVE_MINIMUM_ELEMENTS
    assert defaults["Equal", T.STRING] == defaults["Where", T.STRING] == SERIAL_ONLY
    for op in OPS:
        for element_type in op.types:
            types = input_types_for(op, element_type, max(op.arity.minimum, 1))
            kernel = build(op.op_type, types)
            assert kernel.minimum_elements == defaults[op.op_type, element_type]


def test_tuning_key_uses_the_key_input() -> None:
    assert build("Add", [T.INT8, T.INT8]).tuning_key() == KernelTuningKey(
        "onnx_light", "Add", "portable", T.INT8)
    assert build("Where", [T.BOOL, T.DOUBLE, T.DOUBLE]).tuning_key().element_type == T.DOUBLE
    assert build("Pow", [T.INT64, T.FLOAT]).tuning_key().element_type == T.INT64
    assert build("Equal", [T.STRING, T.STRING]).tuning_key().element_type == T.STRING
    keys = {s.key for s in tuning_schemas()}
    for op in OPS:
        for t in op.types:
            types = input_types_for(op, t, max(op.arity.minimum, 1))
            assert build(op.op_type, types).tuning_key() in keys


def test_uses_parallel_follows_the_configured_value() -> None:
    kernel = build("Abs", [T.FLOAT])
    assert kernel.minimum_elements == DEFAULT_MINIMUM_ELEMENTS
    assert not kernel.uses_parallel(2**40)  # not configured: no pool
    with ThreadPool(2) as two, ThreadPool(1) as one:
        kernel.bind(two).configure({MINIMUM_ELEMENTS: 100})
        assert kernel.minimum_elements == 100
        assert not kernel.uses_parallel(99)
        assert kernel.uses_parallel(100)
        kernel.configure(None)  # no resolved values: keeps the configured value
        assert kernel.uses_parallel(100)
        kernel.bind(one).configure({MINIMUM_ELEMENTS: 100})
        assert not kernel.uses_parallel(10**9)  # one thread: always serial
    for bad in (0, -5, True, 1.5, "8"):
        with pytest.raises(KernelError, match=r"Abs/portable\[float\].*'parallel\.minimum_elements'"):
            build("Abs", [T.FLOAT]).configure({MINIMUM_ELEMENTS: bad})
    with pytest.raises(KernelError,
                       match=r"unknown parameter 'parallel\.mode'; valid: \['parallel\.minimum_elements'\]"):
        build("Abs", [T.FLOAT]).configure({"parallel.mode": 1})


class RecordingPool:
    """A pool stand-in that records parallel_for calls and runs the blocks inline."""

    def __init__(self, num_threads: int) -> None:
        self.num_threads = num_threads
        self.calls: list[int] = []

    def parallel_for(self, n: int, fn: Callable[[int, int], None], *,
                     max_blocks: int | None = None) -> None:
        self.calls.append(n)
        bounds = np.linspace(0, n, self.num_threads + 1).astype(int)
        for start, stop in itertools.pairwise(bounds):
            if stop > start:
                fn(int(start), int(stop))


def test_run_uses_the_decision_method(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = build("Add", [T.FLOAT, T.FLOAT])
    recorder = RecordingPool(4)
    kernel.bind(recorder).configure({MINIMUM_ELEMENTS: 1000})  # type: ignore[arg-type]
    x = np.arange(2000, dtype=np.float32)
    kernel.run(x[:999], x[:999])
    assert recorder.calls == []
    (out,) = kernel.run(x, x)
    assert recorder.calls == [2000]
    np.testing.assert_array_equal(out, x + x)
    monkeypatch.setattr(kernel, "uses_parallel", lambda n: True)
    kernel.run(x[:3], x[:3])
    assert recorder.calls == [2000, 3]
    monkeypatch.setattr(kernel, "uses_parallel", lambda n: False)
    kernel.run(x, x)
    assert recorder.calls == [2000, 3]


def test_general_broadcast_splits_along_one_axis() -> None:
    kernel = build("Mul", [T.FLOAT, T.FLOAT])
    recorder = RecordingPool(3)
    kernel.bind(recorder).configure(PARALLEL)  # type: ignore[arg-type]
    x = np.arange(12, dtype=np.float32).reshape(4, 1, 3)
    y = np.arange(10, dtype=np.float32).reshape(5, 2)[:, :1]  # (5, 1), non-contiguous
    (out,) = kernel.run(x, y)
    assert recorder.calls == [4]  # axis 0 of the (4, 5, 3) output
    np.testing.assert_array_equal(out, x * y)


def test_concurrent_runs_of_one_kernel(pool: ThreadPool) -> None:
    """No per-call state on the kernel: threads sharing one kernel get their own results."""
    kernel = build("Add", [T.DOUBLE, T.DOUBLE])
    kernel.bind(pool).configure({MINIMUM_ELEMENTS: 64})
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for size in (10, 100, 5000) * 5:
                a, b = rng.standard_normal(size), rng.standard_normal((1,))
                (out,) = kernel.run(a, b)
                assert np.array_equal(out, a + b)
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


# --------------------------------------------------------------------------------------------
# Errors


def test_errors_name_the_node() -> None:
    with pytest.raises(KernelError, match=r"Abs_node.*Abs-13 \(opset \d+\) does not take element type bool"):
        build("Abs", [T.BOOL])
    with pytest.raises(KernelError, match="expects 2 input"):
        build("Add", [T.FLOAT])
    with pytest.raises(KernelError, match="approximate"):
        build("Gelu", [T.FLOAT], approximate="erf")
    with pytest.raises(KernelError, match="fmod"):
        build("Mod", [T.INT32, T.INT32], fmod=2)
    kernel = build("Add", [T.FLOAT, T.FLOAT])
    with pytest.raises(KernelError, match="broadcast"):
        kernel.run(np.zeros((2, 3), np.float32), np.zeros((4,), np.float32))
    with pytest.raises(KernelError, match="expects 2 input"):
        kernel.run(np.zeros(3, np.float32))
    with pytest.raises(KernelError, match="required"):
        kernel.run(np.zeros(3, np.float32), None)
    with pytest.raises(KernelError, match="not supported"):
        kernel.run(np.zeros(3, bool), np.zeros(3, bool))


def test_untyped_graph_values_take_the_type_of_the_inputs(pool: ThreadPool) -> None:
    kernel = build("Less", [None, None])
    assert kernel.tuning_key() is None
    kernel.bind(pool)
    (out,) = kernel.run(np.array([1, 5], np.int16), np.array([2, 2], np.int16))
    assert out.tolist() == [True, False]


def test_empty_and_string_inputs(pool: ThreadPool) -> None:
    kernel = build("Add", [T.FLOAT, T.FLOAT])
    kernel.bind(pool).configure(PARALLEL)
    (out,) = kernel.run(np.zeros((0, 3), np.float32), np.zeros((1, 3), np.float32))
    assert out.shape == (0, 3) and out.dtype == np.float32
    equal = build("Equal", [T.STRING, T.STRING])
    equal.bind(pool).configure(PARALLEL)
    (out,) = equal.run(np.array(["a", "bc"]), np.array(["a", "b"], dtype=object))
    assert out.tolist() == [True, False]


# --------------------------------------------------------------------------------------------
# erf and erfc


def test_erf_accuracy() -> None:
    x = np.concatenate([np.linspace(-7.0, 7.0, 200_001), np.geomspace(1e-300, 0.5, 2001),
                        -np.geomspace(1e-300, 0.5, 2001)])
    expected = np.array([math.erf(v) for v in x])
    actual = math_functions.erf(x)
    nonzero = expected != 0
    relative = np.abs(actual - expected)[nonzero] / np.abs(expected[nonzero])
    assert relative.max() < 1e-15
    specials = math_functions.erf(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]))
    assert np.isnan(specials[0]) and specials[1:3].tolist() == [1.0, -1.0]
    assert np.signbit(specials[4]) and not np.signbit(specials[3])


def test_erfc_accuracy() -> None:
    x = np.linspace(-6.0, 26.0, 100_001)  # erfc(26) ~ 6e-296 is still a normal number
    expected = np.array([math.erfc(v) for v in x])
    relative = np.abs(math_functions.erfc(x) - expected) / expected
    assert relative.max() < 2e-15
    specials = math_functions.erfc(np.array([np.nan, np.inf, -np.inf, 30.0, -30.0]))
    assert np.isnan(specials[0]) and specials[1:].tolist() == [0.0, 2.0, 0.0, 2.0]


def test_erf_in_place_and_coefficients() -> None:
    x = np.linspace(-8, 8, 1001)
    expected = math_functions.erf(x)
    math_functions.erf(x, out=x)
    assert np.array_equal(x, expected)
    assert erf_derivation.derive_coefficients() == (math_functions.SERIES, math_functions.CHEBYSHEV)


def test_bfloat16_is_ml_dtypes() -> None:
    (out,) = build("Abs", [T.BFLOAT16]).run(np.array([-1.5], ml_dtypes.bfloat16))
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("inside", [False, True])
def test_no_floating_point_warnings_inside_or_outside_a_quiet_region(inside: bool,
                                                                     pool: ThreadPool) -> None:
    """Kernels skip their own np.errstate inside base.quiet() (a session's run) and keep it
    outside; warnings are errors in this test suite, so either way nothing may warn."""
    x = np.array([1.0, 0.0, -1.0, np.inf], np.float32)
    zero = np.zeros(4, np.float32)
    for op, inputs in (("Div", (x, zero)), ("Log", (zero - 1,)), ("Exp", (x * 1e30,))):
        kernel = build(op, [T.FLOAT] * len(inputs))
        kernel.bind(pool)
        if inside:
            with quiet():
                assert quiet_already()
                kernel.run(*inputs)
        else:
            kernel.run(*inputs)
    assert not quiet_already()
