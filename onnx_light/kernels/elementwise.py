"""Elementwise kernels: one machinery for unary, binary, variadic and ternary ops.

Every op is one :class:`ElementwiseOp` row of :data:`OPS`: its arity, the element types ONNX
allows, the output type rule, the ONNX attributes it reads (with ONNX's defaults), the
precision it computes half-precision types in, and a compute function
``compute(*blocks, out=block, **attributes)`` that writes into a preallocated output block
(those not numpy's own live in :mod:`~onnx_light.kernels.elementwise_compute`).
:func:`kernel_class` turns each row into a :class:`~onnx_light.kernels.base.Kernel`
subclass and :data:`DECLARATIONS` declares each (its versions, types, schema factory and
calibration callback); :data:`KERNELS` is the dispatch table derived from them.

Each tunable elementwise kernel has one parameter, ``parallel.minimum_elements``: below it
the kernel makes one compute call on the calling thread; at or above it (and with more than
one thread) the output is split into contiguous blocks computed on the intra-op pool, each
block writing its slice of the same preallocated output. Both paths run the very same block
function (the serial path on the whole range), so their outputs are bit-identical.

Broadcasting is ONNX's multidirectional broadcasting. When every input has the output's
size or a single element, the output is split as a flat array. Otherwise it is split along
one output axis, and each input is sliced along that axis only where its aligned dimension
is not 1.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Literal

import numpy as np

from ..tuning.keys import ElementType as T
from ..tuning.keys import element_type_name
from ..tuning.schema import KernelTuningSchema, Parameter, Value
from .base import (
    FLOAT8_TYPES,
    FLOAT_TYPES,
    NUMERIC_TYPES,
    SIGNED_TYPES,
    Kernel,
    NodeContext,
    Prepared,
    TensorSpec,
    item_size,
    narrow_float_dtypes,
    numpy_dtype,
    quiet_already,
)
from .calibration import calibrate_elementwise
from .compiled_activations import in_place
from .compiled_elementwise import CompiledProgram, single_op
from .declaration import KernelDeclaration, declare, dispatch_table
from .elementwise_compute import (
    _celu,
    _clip,
    _div,
    _elu,
    _erf,
    _fold,
    _gelu,
    _hard_sigmoid,
    _hard_swish,
    _is_inf,
    _leaky_relu,
    _mean,
    _mod,
    _pow,
    _prelu,
    _relu,
    _selu,
    _sigmoid,
    _softplus,
    _softsign,
    _sum,
    _where,
    relu_in_place,
)
from .elementwise_op import (
    BINARY,
    TERNARY,
    UNARY,
    UNARY_WITH_BOUNDS,
    VARIADIC,
    Attribute,
    ElementwiseOp,
)

__all__ = [
    "CHEAP_MINIMUM_BYTES",
    "DECLARATIONS",
    "DEFAULT_MINIMUM_ELEMENTS",
    "ELEMENTWISE_TYPES",
    "EXPENSIVE_MINIMUM_ELEMENTS",
    "KERNELS",
    "MINIMUM_ELEMENTS",
    "OPS",
    "SERIAL_ONLY",
    "ElementwiseKernel",
    "cost_class",
    "default_minimum_elements",
    "elementwise_parameters",
    "kernel_class",
    "tuning_schemas",
]

MINIMUM_ELEMENTS = "parallel.minimum_elements"
# The portable defaults of parallel.minimum_elements, one per cost class (cost_class);
# docs/elementwise.md ("Measurements") has the runs that chose them.
# Cheap ops are memory-bound, so their threshold is in bytes of the key element type.
CHEAP_MINIMUM_BYTES = 1 << 23
EXPENSIVE_MINIMUM_ELEMENTS = 1 << 16
# String (object) loops hold the GIL: blocks cannot overlap, so never parallel by default.
SERIAL_ONLY = 1 << 62
# The default of a cheap op on a 4-byte type (float32, int32).
DEFAULT_MINIMUM_ELEMENTS = CHEAP_MINIMUM_BYTES // 4
# The ops that run float32 data as a compiled program (compiled_elementwise.py) instead of
# numpy calls: those where docs/elementwise.md ("Compiled kernels") measured it faster.
COMPILED_OPS = frozenset({"Erf", "Gelu", "Mish"})

BOOL = (T.BOOL,)
# The type lists ONNX gives ops that do not use one of base.py's groups.
CLASSIFY_TYPES = (*FLOAT_TYPES, *FLOAT8_TYPES)  # IsNaN, IsInf
PRELU_TYPES = (*FLOAT_TYPES, T.INT32, T.INT64, T.UINT32, T.UINT64)
POW_BASE_TYPES = (*FLOAT_TYPES, T.INT32, T.INT64)
EQUAL_TYPES = (*NUMERIC_TYPES, T.BOOL, T.STRING)
WHERE_TYPES = (*NUMERIC_TYPES, T.BOOL, T.STRING, T.COMPLEX64, T.COMPLEX128)


# --------------------------------------------------------------------------------------------
# The table: one row per op.

U, B, V = UNARY, BINARY, VARIADIC
F = FLOAT_TYPES
N = NUMERIC_TYPES
_OP = ElementwiseOp
_TRIG = (7, 22)
_HYPERBOLIC = (9, 22)
_CLASSIC = (1, 6, 13)
_ARITHMETIC = (7, 13, 14)

OPS: tuple[ElementwiseOp, ...] = (
    # Unary math.
    _OP("Abs", U, N, np.abs, _CLASSIC, warns="never"),
    _OP("Neg", U, SIGNED_TYPES, np.negative, _CLASSIC, warns="never"),
    _OP("Exp", U, F, np.exp, _CLASSIC, cost="transcendental"),
    _OP("Log", U, F, np.log, _CLASSIC, cost="transcendental"),
    _OP("Sqrt", U, F, np.sqrt, _CLASSIC),
    _OP("Reciprocal", U, F, np.reciprocal, _CLASSIC),
    _OP("Floor", U, F, np.floor, _CLASSIC, warns="never"),
    _OP("Ceil", U, F, np.ceil, _CLASSIC, warns="never"),
    _OP("Round", U, F, np.rint, (11, 22), warns="never"),  # half to even
    _OP("Sign", U, N, np.sign, (9, 13), warns="never"),
    _OP("Sin", U, F, np.sin, _TRIG, cost="transcendental"),
    _OP("Cos", U, F, np.cos, _TRIG, cost="transcendental"),
    _OP("Tan", U, F, np.tan, _TRIG, cost="transcendental"),
    _OP("Asin", U, F, np.arcsin, _TRIG, cost="transcendental"),
    _OP("Acos", U, F, np.arccos, _TRIG, cost="transcendental"),
    _OP("Atan", U, F, np.arctan, _TRIG, cost="transcendental"),
    _OP("Sinh", U, F, np.sinh, _HYPERBOLIC, cost="transcendental"),
    _OP("Cosh", U, F, np.cosh, _HYPERBOLIC, cost="transcendental"),
    _OP("Asinh", U, F, np.arcsinh, _HYPERBOLIC, cost="transcendental"),
    _OP("Acosh", U, F, np.arccosh, _HYPERBOLIC, cost="transcendental"),
    _OP("Atanh", U, F, np.arctanh, _HYPERBOLIC, cost="transcendental"),
    _OP("Erf", U, F, _erf, (9, 13), precision="float64", cost="transcendental"),
    _OP("IsNaN", U, CLASSIFY_TYPES, np.isnan, (9, 13, 20), output="bool", warns="never"),
    _OP("IsInf", U, CLASSIFY_TYPES, _is_inf, (10, 20), output="bool", warns="never",
        attributes=(Attribute("detect_negative", 1, (0, 1)), Attribute("detect_positive", 1, (0, 1)))),
    _OP("Not", U, BOOL, np.logical_not, (1,), warns="never"),
    # Activations.
    _OP("Relu", U, SIGNED_TYPES, _relu, (1, 6, 13, 14), warns="never", in_place=True),
    _OP("LeakyRelu", U, F, _leaky_relu, (1, 6, 16), precision="float32",
        attributes=(Attribute("alpha", 0.01),), in_place=True),
    _OP("PRelu", B, PRELU_TYPES, _prelu, (7, 9, 16)),
    _OP("Sigmoid", U, F, _sigmoid, _CLASSIC, precision="float32", cost="transcendental",
        in_place=True),
    _OP("HardSigmoid", U, F, _hard_sigmoid, (1, 6, 22), precision="float32",
        attributes=(Attribute("alpha", 0.2), Attribute("beta", 0.5)), in_place=True),
    _OP("HardSwish", U, F, _hard_swish, (14, 22), precision="float32", in_place=True),
    _OP("Tanh", U, F, np.tanh, _CLASSIC, cost="transcendental", in_place=True),
    _OP("Softplus", U, F, _softplus, (1, 22), cost="transcendental"),
    _OP("Softsign", U, F, _softsign, (1, 22), precision="float32"),
    _OP("Elu", U, F, _elu, (1, 6, 22), precision="float32", cost="transcendental",
        attributes=(Attribute("alpha", 1.0),)),
    _OP("Selu", U, F, _selu, (1, 6, 22), precision="float32", cost="transcendental",
        attributes=(Attribute("alpha", 1.67326319217681884765625),
                    Attribute("gamma", 1.05070102214813232421875))),
    _OP("Celu", U, F, _celu, (12, 28), precision="float32", cost="transcendental",
        attributes=(Attribute("alpha", 1.0),)),
    _OP("Gelu", U, F, _gelu, (20,), precision="float64", cost="transcendental",
        attributes=(Attribute("approximate", "none", ("none", "tanh")),)),
    _OP("Clip", UNARY_WITH_BOUNDS, N, _clip, (6, 11, 12, 13), in_place=True,
        attributes=(Attribute("min", -3.4028234663852886e38, before=11),
                    Attribute("max", 3.4028234663852886e38, before=11))),
    # Binary and variadic arithmetic.
    _OP("Add", B, N, np.add, _ARITHMETIC),
    _OP("Sub", B, N, np.subtract, _ARITHMETIC),
    _OP("Mul", B, N, np.multiply, _ARITHMETIC),
    _OP("Div", B, N, _div, _ARITHMETIC, warns="always"),
    _OP("Pow", B, POW_BASE_TYPES, _pow, (7, 12, 13, 15), precision="float32",
        warns="always", cost="transcendental"),
    _OP("Mod", B, N, _mod, (10, 13, 28), warns="always", attributes=(Attribute("fmod", 0, (0, 1)),)),
    _OP("Max", V, N, _fold(np.maximum), (1, 6, 8, 12, 13), warns="never"),
    _OP("Min", V, N, _fold(np.minimum), (1, 6, 8, 12, 13), warns="never"),
    _OP("Sum", V, F, _sum, (1, 6, 8, 13), precision="float32"),
    _OP("Mean", V, F, _mean, (1, 6, 8, 13), precision="float32"),
    # Comparison and logic.
    _OP("Equal", B, EQUAL_TYPES, np.equal, (7, 11, 13, 19), output="bool", warns="never"),
    _OP("Less", B, N, np.less, (7, 9, 13), output="bool", warns="never"),
    _OP("LessOrEqual", B, N, np.less_equal, (12, 16), output="bool", warns="never"),
    _OP("Greater", B, N, np.greater, (7, 9, 13), output="bool", warns="never"),
    _OP("GreaterOrEqual", B, N, np.greater_equal, (12, 16), output="bool", warns="never"),
    _OP("And", B, BOOL, np.logical_and, (7,), output="bool", warns="never"),
    _OP("Or", B, BOOL, np.logical_or, (7,), output="bool", warns="never"),
    _OP("Xor", B, BOOL, np.logical_xor, (7,), output="bool", warns="never"),
    _OP("Where", TERNARY, WHERE_TYPES, _where, (9, 16), warns="never", key_input=1),
)
del U, B, V, F, N, _OP

# --------------------------------------------------------------------------------------------
# Tuning parameters and schemas


def elementwise_parameters(default: int = DEFAULT_MINIMUM_ELEMENTS) -> tuple[Parameter, ...]:
    """The schema parameters shared by every elementwise kernel."""
    return (
        Parameter(MINIMUM_ELEMENTS, "int", default, minimum=1,
                  description="output elements from which the parallel path is used"),
    )


_SLOW_TYPES = frozenset({T.FLOAT16, T.BFLOAT16, *FLOAT8_TYPES})
CostClass = Literal["cheap", "expensive", "serial"]


def cost_class(op: ElementwiseOp, element_type: int | None) -> CostClass:
    """How an op's time grows on one key element type, which sets its portable default.

    ``"serial"``: string (object) loops hold the GIL, blocks cannot overlap. ``"expensive"``:
    transcendental ops, and any op on float16, bfloat16 or float8 (converted element by
    element). ``"cheap"``: the rest, memory-bound, so their crossover scales with bytes.
    """
    if element_type == T.STRING:
        return "serial"
    if op.cost == "transcendental" or element_type in _SLOW_TYPES:
        return "expensive"
    return "cheap"


def default_minimum_elements(op: ElementwiseOp, element_type: int | None) -> int:
    """The portable default of ``parallel.minimum_elements`` for an op and key element type."""
    cost = cost_class(op, element_type)
    if cost == "serial":
        return SERIAL_ONLY
    if cost == "expensive":
        return EXPENSIVE_MINIMUM_ELEMENTS
    if element_type is None:
        return DEFAULT_MINIMUM_ELEMENTS
    return max(1, CHEAP_MINIMUM_BYTES // item_size(element_type))


def _parameters(op: ElementwiseOp, element_type: int | None) -> tuple[Parameter, ...]:
    """The schema factory of one op: its parameters with the default for ``element_type``."""
    return elementwise_parameters(default_minimum_elements(op, element_type))


def tuning_schemas() -> list[KernelTuningSchema]:
    """One schema per elementwise op and element type (from the declarations)."""
    return [schema for declaration in DECLARATIONS for schema in declaration.schemas()]


ELEMENTWISE_TYPES: dict[str, tuple[int, ...]] = {op.op_type: op.types for op in OPS}

# --------------------------------------------------------------------------------------------
# The machinery

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


@functools.cache
def _widen(precision: str) -> dict[np.dtype, np.dtype]:
    """The operand casts of a precision; built on first use (ml_dtypes' types, imported late)."""
    half = narrow_float_dtypes()
    return {"native": {}, "float32": dict.fromkeys(half, _F32),
            "float64": dict.fromkeys((*half, _F32), _F64)}[precision]


@functools.cache
def _ml_dtypes() -> frozenset[np.dtype]:
    """The ml_dtypes element types (they warn on NaN comparisons)."""
    return frozenset(numpy_dtype(t) for t in (T.BFLOAT16, *FLOAT8_TYPES))


_BOOL_DTYPE = np.dtype(np.bool_)
_OBJECT_DTYPE = np.dtype(object)


@dataclass(frozen=True)
class _TypePlan:
    """How a kernel computes for one input element type (fixed when the kernel is built)."""

    out_dtype: np.dtype
    work_dtype: np.dtype | None  # compute into this type, then round into the output
    widen: Mapping[np.dtype, np.dtype]  # operand casts before compute
    quiet: bool  # run blocks under np.errstate(all="ignore")


def _type_plan(op: ElementwiseOp, element_type: int) -> _TypePlan:
    dtype = numpy_dtype(element_type)
    out_dtype = _BOOL_DTYPE if op.output == "bool" else dtype
    widen = _widen(op.precision)
    quiet = (op.warns == "always" or dtype in _ml_dtypes()
             or (op.warns == "float" and dtype.kind in "fc"))
    return _TypePlan(out_dtype, widen.get(out_dtype), widen, quiet)


@functools.cache
def _type_plans(op: ElementwiseOp) -> Mapping[np.dtype, _TypePlan]:
    """How an op computes for each of its element types (the same for all its kernels)."""
    return MappingProxyType({numpy_dtype(t): _type_plan(op, t) for t in op.types})


def _quietly(function: Callable[..., None]) -> Callable[..., None]:
    """``function`` with numpy's floating point warnings off (ONNX semantics ignore them)."""
    def run(*arguments: Any) -> None:
        if quiet_already():
            function(*arguments)
            return
        with np.errstate(all="ignore"):
            function(*arguments)

    return run


class ElementwiseKernel(Kernel):
    """The kernel every row of :data:`OPS` becomes; ``op`` is the row."""

    op: ClassVar[ElementwiseOp]
    accepts_epilogue = True

    def __init__(self, ctx: NodeContext) -> None:
        op = self.op
        # An op declared without a schema keeps its portable default; a tunable one takes
        # the same value from its schema, and then what configure gives it.
        self._minimum_elements = default_minimum_elements(op, self.element_type_of(ctx))
        super().__init__(ctx)
        arity = op.arity
        if ctx.num_inputs and (ctx.num_inputs < arity.minimum
                               or (arity.maximum is not None and ctx.num_inputs > arity.maximum)):
            raise ctx.error(f"expects {self._arity_text()} input(s), the node has {ctx.num_inputs}")
        self.attributes: Mapping[str, Value] = MappingProxyType({
            a.name: a.read(ctx) for a in op.attributes if a.before is None or ctx.opset < a.before
        })
        self._compute = (functools.partial(op.compute, **self.attributes) if self.attributes
                         else op.compute)
        self._plans: Mapping[np.dtype, _TypePlan] = _type_plans(op)
        self.program: CompiledProgram | None = None
        if op.op_type in COMPILED_OPS and self.element_type_of(ctx) == T.FLOAT:
            self.program = single_op(op.op_type, ctx.num_inputs or op.arity.minimum,
                                     dict(self.attributes))

    def _arity_text(self) -> str:
        arity = self.op.arity
        if arity.maximum is None:
            return f"at least {arity.minimum}"
        if arity.maximum == arity.minimum:
            return str(arity.minimum)
        return f"{arity.minimum} to {arity.maximum}"

    @classmethod
    def element_type_of(cls, ctx: NodeContext) -> int | None:
        """The type of the key input (X for Where, the base for Pow); the output's or another
        input's when the graph does not say."""
        op = cls.op
        candidates = list(ctx.input_types[op.key_input:op.key_input + 1])
        if op.output == "same":
            candidates += ctx.output_types[:1]
        elif op.arity is not UNARY:
            candidates += ctx.input_types
        return next((t for t in candidates if t), None)

    def _configure(self, values: Mapping[str, Value]) -> None:
        self._minimum_elements = int(values[MINIMUM_ELEMENTS])

    @property
    def minimum_elements(self) -> int:
        """The configured ``parallel.minimum_elements``."""
        return self._minimum_elements

    def uses_parallel(self, num_elements: int) -> bool:
        """Whether an output of ``num_elements`` elements is computed on the pool."""
        pool = self.pool
        return (pool is not None and pool.num_threads > 1
                and num_elements >= self._minimum_elements)

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """Compile the kernel's program now, at session construction (a warm cache loads it)."""
        if self.program is not None:
            self.program.compile(parallel=self.num_threads > 1)
        return None

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        """Compute the output; serial or split across the pool, with identical results."""
        operands = self._operands(inputs)
        if self.program is not None and all(x is not None for x in operands):
            out = self.program.run(operands, self.num_threads, self._minimum_elements)
            if out is not None:
                if self.epilogue is not None:
                    self.epilogue(out)
                return [out]
        key = operands[self.op.key_input]
        plan = self._plans.get(key.dtype) or self._plan_for(key.dtype)
        shape = key.shape
        same = True
        for x in operands:
            if x is not None and x.shape != shape:
                same = False
        if not same:
            shape = _broadcast_shape([x.shape for x in operands if x is not None])
            if shape is None:
                raise self.ctx.error("cannot broadcast input shapes "
                                     f"{[None if x is None else x.shape for x in operands]}")
        out = np.empty(shape, plan.out_dtype)
        n = out.size
        if n == 0:
            return [out]
        parallel = self.uses_parallel(n)
        direct = same and not parallel and out.ndim and plan.work_dtype is None
        if direct:
            widen = plan.widen
            for x in operands:
                if x is not None and (not x.flags.c_contiguous or x.dtype in widen):
                    direct = False
                    break
        if direct:
            # The serial path without the block machinery: the same call on the same memory
            # (0-d outputs take the block path, which views them as 1-d: compute functions
            # that allocate temporaries need arrays, not numpy scalars).
            if plan.quiet and not quiet_already():
                with np.errstate(all="ignore"):
                    self._compute(*operands, out=out)
            else:
                self._compute(*operands, out=out)
            if self.epilogue is not None:
                self.epilogue(out)
            return [out]
        if parallel:
            pool = self.pool
            extent, block = _blocks(self._compute, plan, operands, out, same, pool.num_threads,
                                    self.epilogue)
            pool.parallel_for(extent, block)
        else:
            extent, block = _blocks(self._compute, plan, operands, out, same, 1, self.epilogue)
            block(0, extent)
        return [out]

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The direct path of :meth:`run` (inputs of the output's shape, one serial compute
        call, then the epilogue) for inputs fixed at these specs; None where run would take
        the block or parallel path."""
        count, arity = len(inputs), self.op.arity
        if count < arity.minimum or (arity.maximum is not None and count > arity.maximum):
            return None
        shape, key_dtype = inputs[self.op.key_input]
        plan = self._plans.get(key_dtype)
        size = math.prod(shape)
        if (plan is None or plan.work_dtype is not None or not shape or size == 0
                or self.uses_parallel(size)
                or any(s != shape or d in plan.widen for s, d in inputs)):
            return None
        compute, epilogue = self._compute, self.epilogue
        prepared = compute
        if epilogue is not None and len(inputs) == 2:  # the common case, without packing arguments
            def prepared(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
                compute(a, b, out=out)
                epilogue(out)
        elif epilogue is not None:
            def prepared(*operands: np.ndarray, out: np.ndarray) -> None:
                compute(*operands, out=out)
                epilogue(out)

        return Prepared(prepared, shape, plan.out_dtype)  # called inside quiet(): see Prepared

    def in_place_function(self, element_type: int,
                          constants: Sequence[np.ndarray | None] = ()
                          ) -> Callable[[np.ndarray], None] | None:
        """This node as ``f(block)`` overwriting ``block`` (of ``element_type``) with the
        result, for fusion into the producer of its first input; ``constants``: the values of
        its other inputs (Clip's bounds), fixed for every run. None when the op cannot compute
        in place in that type exactly as :meth:`run` does."""
        op = self.op
        if not op.in_place or element_type not in op.types:
            return None
        if constants:
            dtype = numpy_dtype(element_type)
            if any(c is not None and (c.size != 1 or c.dtype != dtype) for c in constants):
                return None
            operands = [None if c is None else c.reshape(()) for c in constants]
            compute = self._compute

            def bounded(block: np.ndarray) -> None:
                compute(block, *operands, out=block)

            return bounded
        program = self.program
        if program is not None and element_type == T.FLOAT:
            def compiled_apply(block: np.ndarray) -> None:
                np.copyto(block, program.run([block]))

            return compiled_apply
        dtype = numpy_dtype(element_type)
        plan = self._plans[dtype]
        if plan.work_dtype is not None or dtype in plan.widen or plan.out_dtype != dtype:
            return None
        compute = self._compute
        if compute is _relu:
            return relu_in_place(dtype)

        def apply(block: np.ndarray) -> None:
            compute(block, out=block)

        numpy_apply = _quietly(apply) if plan.quiet else apply
        if element_type == T.FLOAT:  # one compiled pass where there is one
            return in_place(self.ctx.op_type, self.attributes, numpy_apply) or numpy_apply
        return numpy_apply

    def _operands(self, inputs: tuple[np.ndarray | None, ...]) -> list[np.ndarray | None]:
        arity = self.op.arity
        count = len(inputs)
        if count < arity.minimum or (arity.maximum is not None and count > arity.maximum):
            raise self.ctx.error(f"expects {self._arity_text()} input(s), got {count}")
        operands = list(inputs)
        for i, x in enumerate(operands):
            if type(x) is not np.ndarray:
                if x is None:
                    if i < arity.minimum or not arity.optional:
                        raise self.ctx.error(f"input {i} is required")
                else:
                    operands[i] = np.asarray(x)
        return operands

    def _plan_for(self, dtype: np.dtype) -> _TypePlan:
        if dtype.kind in "US" and _OBJECT_DTYPE in self._plans:  # strings: held as object
            return self._plans[_OBJECT_DTYPE]
        raise self.ctx.error(f"input of numpy type {dtype} is not supported; supported: "
                             f"{[element_type_name(t) for t in self.op.types]}")


def _broadcast_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """ONNX multidirectional (numpy) broadcasting of ``shapes``; None if they do not broadcast."""
    ndim = max(len(shape) for shape in shapes)
    result = [1] * ndim
    for shape in shapes:
        offset = ndim - len(shape)
        for i, extent in enumerate(shape):
            current = result[offset + i]
            if extent != current:
                if current == 1:
                    result[offset + i] = extent
                elif extent != 1:
                    return None
    return tuple(result)


def _split_axis(shape: tuple[int, ...], blocks: int) -> int:
    """The outermost axis with at least ``blocks`` entries, else the longest one."""
    for axis, extent in enumerate(shape):
        if extent >= blocks:
            return axis
    return int(np.argmax(shape))


def _blocks(compute: Callable[..., Any], plan: _TypePlan, operands: list[np.ndarray | None],
            out: np.ndarray, same: bool, blocks: int,
            epilogue: Callable[[np.ndarray], None] | None = None) -> tuple[int, Callable[[int, int], None]]:
    """The range to split and ``block(start, stop)`` computing that part of ``out`` (and
    applying ``epilogue`` to it).

    The serial path calls ``block(0, extent)``, the parallel path calls it on contiguous
    sub-ranges: the same code on the same values either way.
    """
    n = out.size
    views: list[np.ndarray | None] = []
    sliced: list[bool] = []
    if same or all(x is None or x.size == 1 or x.size == n for x in operands):
        # Flat: every operand is the whole output (made contiguous) or one element.
        for x in operands:
            whole = x is not None and x.size == n
            views.append(None if x is None else x.reshape(-1) if whole else x.reshape(()))
            sliced.append(whole)
        target = out.reshape(-1)
        lead: tuple[slice, ...] = ()
    else:
        # Along one output axis; inputs whose aligned dimension is 1 are not sliced.
        ndim = out.ndim
        axis = _split_axis(out.shape, blocks)
        for x in operands:
            view = None if x is None else x.reshape((1,) * (ndim - x.ndim) + x.shape)
            views.append(view)
            sliced.append(view is not None and view.shape[axis] != 1)
        target = out
        lead = (slice(None),) * axis
    extent = target.shape[len(lead)]
    pairs = list(zip(views, sliced, strict=True))
    widen, work = plan.widen, plan.work_dtype

    def block(start: int, stop: int) -> None:
        index = (*lead, slice(start, stop))
        args = [x[index] if s else x for x, s in pairs]
        if widen:
            args = [x.astype(widen[x.dtype]) if x is not None and x.dtype in widen else x
                    for x in args]
        destination = target[index]
        if work is None:
            compute(*args, out=destination)
        else:
            result = np.empty(destination.shape, work)
            compute(*args, out=result)
            np.copyto(destination, result, casting="unsafe")
        if epilogue is not None:
            epilogue(destination)

    return extent, (_quietly(block) if plan.quiet else block)


# --------------------------------------------------------------------------------------------
# Kernel classes and the dispatch table


def kernel_class(op: ElementwiseOp) -> type[ElementwiseKernel]:
    """The kernel class of one row (also for the rows of other modules; the class is bound
    to its declaration when the row's module declares it)."""
    name = f"{op.op_type}Kernel"
    return type(name, (ElementwiseKernel,), {
        "__doc__": f"ONNX {op.op_type} ({op.arity.name}) on the shared elementwise machinery.",
        "__module__": __name__,
        "__qualname__": name,
        "op_type": op.op_type,
        "op": op,
    })


# One declaration per row: every version takes the row's types.
DECLARATIONS: tuple[KernelDeclaration, ...] = tuple(
    declare(kernel_class(op), op.versions, types=op.types,
            parameters=functools.partial(_parameters, op), calibrate=calibrate_elementwise)
    for op in OPS
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
