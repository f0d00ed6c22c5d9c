"""What every kernel shares: the node context, the kernel interface, element type groups.

The runtime builds one :class:`Kernel` per node. Each class is bound to its
:class:`~onnx_light.kernels.declaration.KernelDeclaration`, which gives a tunable kernel
its exact :class:`~onnx_light.tuning.keys.KernelTuningKey` for the node's element type and
its schema. :meth:`Kernel.configure` checks the resolved values against that schema and
hands them to the kernel's :meth:`Kernel._configure`, which copies them into its own typed
configuration; :meth:`Kernel.bind` gives it the thread pool. ``run`` afterwards reads only
that configuration: never the registry, never the cache.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

import numpy as np

from ..parallel import ThreadPool
from ..tuning.keys import ElementType, KernelTuningKey
from ..tuning.schema import KernelTuningSchema, TuningValidationError, Value

if TYPE_CHECKING:
    from .declaration import KernelDeclaration

__all__ = [
    "ALL_TYPES",
    "FLOAT8_TYPES",
    "FLOAT_TYPES",
    "INTEGER_TYPES",
    "NUMERIC_TYPES",
    "SIGNED_TYPES",
    "Kernel",
    "KernelError",
    "NodeContext",
    "Prepared",
    "TensorSpec",
    "compute_dtype",
    "ints",
    "item_size",
    "narrow_float_dtypes",
    "normalize_axes",
    "normalize_axis",
    "numpy_dtype",
    "quiet",
    "quiet_already",
]

T = ElementType
FLOAT_TYPES = (T.FLOAT, T.DOUBLE, T.FLOAT16, T.BFLOAT16)
FLOAT8_TYPES = (T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ)
SIGNED_INTEGER_TYPES = (T.INT8, T.INT16, T.INT32, T.INT64)
UNSIGNED_INTEGER_TYPES = (T.UINT8, T.UINT16, T.UINT32, T.UINT64)
INTEGER_TYPES = SIGNED_INTEGER_TYPES + UNSIGNED_INTEGER_TYPES
SIGNED_TYPES = FLOAT_TYPES + SIGNED_INTEGER_TYPES
NUMERIC_TYPES = FLOAT_TYPES + INTEGER_TYPES
ALL_TYPES = (*NUMERIC_TYPES, T.BOOL, T.STRING)


# Bytes per element where it is not one (STRING holds object pointers).
_ITEM_SIZES = {T.FLOAT: 4, T.DOUBLE: 8, T.FLOAT16: 2, T.BFLOAT16: 2, T.UINT16: 2, T.INT16: 2,
               T.UINT32: 4, T.INT32: 4, T.UINT64: 8, T.INT64: 8, T.COMPLEX64: 8, T.COMPLEX128: 16,
               T.STRING: np.dtype(object).itemsize}


def item_size(element_type: int) -> int:
    """``numpy_dtype(element_type).itemsize``, known without importing onnx (registration needs it)."""
    return _ITEM_SIZES.get(element_type, 1)


@functools.cache
def numpy_dtype(element_type: int) -> np.dtype:
    """The numpy dtype holding an ONNX element type (ml_dtypes for bfloat16 and float8).

    onnx (and with it ml_dtypes) is imported on the first call, by a session or a
    calibration, not at ``import onnx_light``.
    """
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(element_type))


@functools.cache
def narrow_float_dtypes() -> frozenset[np.dtype]:
    """The floats narrower than float32 (float16, bfloat16, the float8 types): kernels compute
    in float32 and round the result back, as ONNX's reference does. Built on first use, since
    ml_dtypes' types come with onnx."""
    return frozenset(numpy_dtype(t) for t in (T.FLOAT16, T.BFLOAT16, *FLOAT8_TYPES))


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The type a kernel computes in: float32 for the narrow floats
    (:func:`narrow_float_dtypes`), any other type (float32, float64, integers) as it is."""
    return np.dtype(np.float32) if dtype in narrow_float_dtypes() else dtype


_thread_state = threading.local()


class _Quiet:
    """The block of :func:`quiet` (a class, not a generator: a runtime enters one per run)."""

    __slots__ = ("_errstate", "_previous")

    def __enter__(self) -> None:
        self._previous = getattr(_thread_state, "quiet", False)
        self._errstate = np.errstate(all="ignore")
        self._errstate.__enter__()
        _thread_state.quiet = True

    def __exit__(self, *exc_info: object) -> None:
        _thread_state.quiet = self._previous
        self._errstate.__exit__(*exc_info)


def quiet() -> contextlib.AbstractContextManager[None]:
    """numpy's floating point warnings off on this thread (ONNX semantics ignore overflow,
    invalid and division by zero), marked so that kernels called inside skip their own
    ``np.errstate`` (2 us each here): a runtime wraps a whole run in it."""
    return _Quiet()


def quiet_already() -> bool:
    """Whether the calling thread is inside :func:`quiet`."""
    return getattr(_thread_state, "quiet", False)


class KernelError(ValueError):
    """A node cannot be built or run: bad attributes, inputs or shapes. Names the node."""


@dataclass(frozen=True)
class NodeContext:
    """What a kernel knows of its node when it is built."""

    name: str
    op_type: str
    domain: str
    opset: int
    attributes: Mapping[str, Any] = field(default_factory=dict)
    input_types: tuple[int | None, ...] = ()
    output_types: tuple[int | None, ...] = ()
    num_inputs: int = 0
    num_outputs: int = 1
    # Positions below num_inputs that the node leaves empty ('' names an omitted input).
    omitted_inputs: frozenset[int] = frozenset()

    def given(self, index: int) -> bool:
        """Whether the node gives input ``index`` (not omitted, not beyond its inputs)."""
        return index < self.num_inputs and index not in self.omitted_inputs

    def input_dtype(self, index: int) -> np.dtype | None:
        """Input ``index``'s numpy dtype, or None when construction does not know its type (an
        input after a node onnx cannot type, or beyond the typed inputs)."""
        element_type = self.input_types[index] if index < len(self.input_types) else None
        return None if element_type is None else numpy_dtype(element_type)

    def attribute(self, name: str, default: Any = None) -> Any:
        """An attribute's value, or ``default`` when the node does not set it."""
        return self.attributes.get(name, default)

    def error(self, message: str) -> KernelError:
        """An error that names the node and its operator."""
        return KernelError(f"node {self.name!r} ({self.op_type}): {message}")


def normalize_axis(ctx: NodeContext, axis: int, rank: int) -> int:
    """``axis`` in ``[-rank, rank)`` as a non-negative axis; anything else is the node's error."""
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for a tensor of rank {rank}")
    return axis % rank


def normalize_axes(ctx: NodeContext, axes: Iterable[int], rank: int) -> tuple[int, ...]:
    """Several axes normalised by :func:`normalize_axis`; a repeated axis is an error."""
    axes = list(axes)
    result = tuple(normalize_axis(ctx, axis, rank) for axis in axes)
    if len(set(result)) != len(result):
        raise ctx.error(f"axes {axes} name the same axis twice")
    return result


def ints(value: Any) -> list[int] | None:
    """An optional integer list (attribute value or input tensor) as Python ints; None stays None."""
    if value is None:
        return None
    return [int(v) for v in np.asarray(value).reshape(-1)]


_K = TypeVar("_K", bound="Kernel")

#: An input's shape and numpy dtype, fixed for every run of a plan.
TensorSpec = tuple[tuple[int, ...], np.dtype]


class Prepared(NamedTuple):
    """A node's computation for inputs of fixed shapes and types (:meth:`Kernel.prepare`):
    ``compute(*inputs, out=buffer)`` writes the node's one output, of ``shape`` and
    ``dtype``, into ``buffer`` (C-contiguous, not one of the inputs); the inputs are
    C-contiguous arrays of the specs given, and the values are those :meth:`Kernel.run`
    gives, bit for bit. The runtime calls it inside :func:`quiet` (numpy's floating point
    warnings already off), so it needs no ``np.errstate`` of its own."""

    compute: Callable[..., None]
    shape: tuple[int, ...]
    dtype: np.dtype


class Kernel:
    """One node's implementation.

    Subclasses set ``op_type`` and implement :meth:`run`;
    :func:`~onnx_light.kernels.declaration.declare` binds the class to its declaration. A node
    whose opset or element type the declaration does not take, or that lacks an attribute
    its opset requires (``Required``), is refused at construction. A
    tunable kernel (its declaration has a schema factory) starts from the schema's portable
    defaults and implements :meth:`_configure` to copy checked values into attributes of its own.
    """

    op_type: ClassVar[str] = ""
    implementation: ClassVar[str] = "portable"
    tuning_abi: ClassVar[int] = 1
    # Bumped when the implementation's speed changes but its parameters keep their meaning:
    # values calibrated before are then reported stale (onnx_light/tuning/identity.py).
    tuning_revision: ClassVar[int] = 1
    declaration: ClassVar[KernelDeclaration | None] = None
    # Whether run applies ``epilogue`` (an in-place activation the runtime fused into this
    # node) to every block of its first output while the block is still in cache.
    accepts_epilogue: ClassVar[bool] = False

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.pool: ThreadPool | None = None
        self.epilogue: Callable[[np.ndarray], None] | None = None
        declaration = self.declaration
        if declaration is not None:
            reason = declaration.refusal(ctx.opset, self.element_type) or declaration.missing(ctx)
            if reason is not None:
                raise ctx.error(reason)
            schema = self.tuning_schema()
            if schema is not None:
                self._configure(schema.defaults)
            elif declaration.parameters is not None:  # element type unknown: the general defaults
                self._configure({p.name: p.default for p in declaration.parameters(None)})

    @classmethod
    def element_type_of(cls, ctx: NodeContext) -> int | None:
        """The element type a kernel of this class computes in for ``ctx`` (its first typed
        input or output by default): the type its declaration and tuning key are about."""
        for element_type in (*ctx.input_types, *ctx.output_types):
            if element_type:
                return element_type
        return None

    @property
    def element_type(self) -> int | None:
        """The element type the kernel computes in (:meth:`element_type_of` its node)."""
        return self.element_type_of(self.ctx)

    def tuning_key(self) -> KernelTuningKey | None:
        """The exact key for this kernel and element type, or None if not tunable."""
        schema = self.tuning_schema()
        return None if schema is None else schema.key

    def tuning_schema(self) -> KernelTuningSchema | None:
        """The schema of this kernel and element type, or None if not tunable."""
        declaration, element_type = self.declaration, self.element_type
        if declaration is None or not declaration.tunable or element_type is None:
            return None
        return declaration.schema(element_type)

    def configure(self, values: Mapping[str, Value] | None) -> None:
        """Step 5 of session initialization: take the resolved values (None keeps the
        configuration; a partial set takes the portable defaults for the names it omits).

        The values are checked against the kernel's schema, one path for every kernel:
        unknown names, types, bounds and choices, the schema's rule across parameters; a
        value that breaks one is the node's error, naming the key and the parameter.
        """
        if values is None:
            return
        schema = self.tuning_schema()
        if schema is None:
            tunable = self.declaration is not None and self.declaration.tunable
            reason = "its element type is not known" if tunable else "it is not tunable"
            raise self.ctx.error(f"cannot take tuning values: {reason}")
        try:
            checked = schema.update(schema.defaults, values)
        except TuningValidationError as exc:
            raise self.ctx.error(str(exc)) from None
        self._configure(checked)

    def _configure(self, values: Mapping[str, Value]) -> None:
        """Copy a complete set of checked values into the kernel's typed configuration."""

    def bind(self: _K, pool: ThreadPool | None) -> _K:
        """Give the kernel the session's intra-op thread pool (returned for chaining)."""
        self.pool = pool
        return self

    @property
    def num_threads(self) -> int:
        """Threads of the pool the kernel is bound to (1 without a pool)."""
        return self.pool.num_threads if self.pool is not None else 1

    def variant(self: _K, **attributes: Any) -> _K:
        """A copy of this kernel, configured and bound alike, with ``attributes`` replaced
        (for the runtime's fusion and :meth:`specialize`); this kernel is left as it is."""
        kernel = copy.copy(self)
        for name, value in attributes.items():
            if not hasattr(kernel, name):
                raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
            setattr(kernel, name, value)
        return kernel

    def work(self, input_shapes: Sequence[tuple[int, ...] | None],
             output_shapes: Sequence[tuple[int, ...] | None]) -> int | None:
        """A rough cost of one run with these shapes (None where unknown), in element
        operations: the runtime compares steps with it to decide which branches of a graph
        run side by side. By default the elements written; products override it with their
        multiply-adds."""
        if not output_shapes or any(shape is None for shape in output_shapes):
            return None
        return sum(math.prod(shape) for shape in output_shapes)

    def specialize(self, constants: Sequence[np.ndarray | None]) -> Kernel | None:
        """A kernel that may rely on the inputs that are constant for a session's plan
        (``constants``: their values, None for the others), or None to keep this one. The
        runtime calls it once, at construction, and keeps this kernel for runs where those
        inputs can differ."""
        return None

    def packed_input(self, position: int) -> Callable[[], np.ndarray] | None:
        """When a :meth:`specialize`d kernel holds the constant input at ``position`` in
        another form and reads only its shape and type at run time (packed product weights):
        a function rebuilding that input, so that the session need not keep it; None here."""
        return None

    def settle(self, input_shapes: Sequence[tuple[int, ...] | None]) -> Kernel | None:
        """A kernel that has made, once, the decisions :meth:`run` would make on every call
        for inputs of these shapes (the session's inferred ones, None where unknown): it keeps
        them for runs whose inputs have those shapes and decides again for others. None keeps
        this kernel. The runtime calls it at construction, after :meth:`configure`,
        :meth:`bind` and :meth:`specialize`."""
        return None

    def decisions(self) -> Mapping[str, Any]:
        """What :meth:`settle` decided, for the session's tuning report (empty: nothing)."""
        return {}

    def views(self) -> Sequence[Sequence[int]]:
        """For each output, the inputs (by position) it may be or be a view of; an output
        past the end or with no entry is made anew by every run. The runtime hands a caller
        a copy of an output that may share memory with a feed, a constant or another output
        (views between nodes stay views)."""
        return ()

    def prepare(self, inputs: Sequence[TensorSpec]) -> Prepared | None:
        """The node's computation with every input's shape and type fixed (the runtime's
        memory plan then hands it a buffer reused run to run), or None to be run by
        :meth:`run`. Called once, at construction, after :meth:`configure` and
        :meth:`bind`: the result may rely on the configuration and thread count (a kernel
        whose configuration would split the work returns None)."""
        return None

    def outputs_of_shapes(self, shapes: Sequence[tuple[int, ...] | None]) -> list[np.ndarray] | None:
        """The outputs when the inputs' shapes alone decide them (Shape, Size), from those
        shapes (None where one is not known), else None: constant folding folds such a node
        when the shapes are fixed for every run, whatever the values."""
        return None

    def output_elements(self, inputs: Sequence[np.ndarray | None]) -> int | None:
        """How many elements the outputs for these inputs would hold, told from the inputs'
        values without computing the outputs, for kernels whose output size the values set
        (ConstantOfShape, Range, Expand, Tile); None when not known. The runtime leaves such
        a node unfolded when its outputs would be too large (see ``FOLD_MAXIMUM_BYTES``)."""
        return None

    @property
    def op_types(self) -> frozenset[str]:
        """The operators this kernel runs: its own (control flow adds its graphs'), which
        constant folding asks (a Loop whose body draws random numbers is not deterministic)."""
        return frozenset((self.ctx.op_type,))

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        """Compute the node's outputs from its inputs (None for omitted optional inputs)."""
        raise NotImplementedError

