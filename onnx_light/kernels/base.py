"""What every kernel shares: the node context, the kernel interface, element type groups.

The runtime builds one :class:`Kernel` per node. A tunable kernel returns its
exact :class:`~onnx_light.tuning.keys.KernelTuningKey` for the node's element
type, then receives the resolved values in :meth:`Kernel.configure`, validates
them and copies them into its own typed configuration. ``run`` afterwards reads
only that configuration: never the registry, never the cache.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..parallel import ThreadPool
from ..tuning.keys import ElementType, KernelTuningKey, element_type_name
from ..tuning.schema import Value

__all__ = [
    "ALL_TYPES",
    "FLOAT8_TYPES",
    "FLOAT_TYPES",
    "INTEGER_TYPES",
    "LIBRARY",
    "NUMERIC_TYPES",
    "SIGNED_TYPES",
    "Kernel",
    "KernelError",
    "NodeContext",
    "check_element_type",
    "compute_dtype",
    "ints",
    "item_size",
    "narrow_float_dtypes",
    "normalize_axes",
    "normalize_axis",
    "numpy_dtype",
    "quiet",
    "quiet_already",
    "since",
]

LIBRARY = "onnx_light"

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


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """numpy's floating point warnings off on this thread (ONNX semantics ignore overflow,
    invalid and division by zero), marked so that kernels called inside skip their own
    ``np.errstate`` (2 us each here): a runtime wraps a whole run in it."""
    previous = getattr(_thread_state, "quiet", False)
    with np.errstate(all="ignore"):
        _thread_state.quiet = True
        try:
            yield
        finally:
            _thread_state.quiet = previous


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

    def attribute(self, name: str, default: Any = None) -> Any:
        """An attribute's value, or ``default`` when the node does not set it."""
        return self.attributes.get(name, default)

    def error(self, message: str) -> KernelError:
        """An error that names the node and its operator."""
        return KernelError(f"node {self.name!r} ({self.op_type}): {message}")


def check_element_type(ctx: NodeContext, element_type: int | None,
                       by_opset: Mapping[int, tuple[int, ...]]) -> None:
    """Reject an element type the node's opset does not allow (``by_opset``: since_version ->
    allowed types), naming the node, the type and the valid ones."""
    usable = [v for v in by_opset if v <= ctx.opset]
    allowed = by_opset[max(usable)] if usable else ()
    if element_type is not None and element_type not in allowed:
        raise ctx.error(f"element type {element_type_name(element_type)} is not allowed at opset "
                        f"{ctx.opset}; valid: {[element_type_name(t) for t in allowed]}")


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


class Kernel:
    """One node's implementation.

    Subclasses set ``op_type`` and implement :meth:`run`. Tunable kernels set
    ``tunable = True`` and implement :meth:`_configure` to copy the validated
    values into attributes of their own.
    """

    op_type: ClassVar[str] = ""
    implementation: ClassVar[str] = "portable"
    tuning_abi: ClassVar[int] = 1
    tunable: ClassVar[bool] = False
    # Whether run applies ``epilogue`` (an in-place activation the runtime fused into this
    # node) to every block of its first output while the block is still in cache.
    accepts_epilogue: ClassVar[bool] = False

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.pool: ThreadPool | None = None
        self.epilogue: Callable[[np.ndarray], None] | None = None

    @property
    def element_type(self) -> int | None:
        """The element type the kernel computes in (its first typed input by default)."""
        for element_type in (*self.ctx.input_types, *self.ctx.output_types):
            if element_type:
                return element_type
        return None

    def tuning_key(self) -> KernelTuningKey | None:
        """The exact key for this kernel and element type, or None if not tunable."""
        if not self.tunable or self.element_type is None:
            return None
        return KernelTuningKey(LIBRARY, self.op_type, self.implementation, self.element_type,
                               "cpu", self.tuning_abi)

    def configure(self, values: Mapping[str, Value] | None, pool: ThreadPool) -> None:
        """Step 5 of session initialization: take the resolved values and the pool."""
        self.pool = pool
        if values is not None:
            self._configure(values)

    def _configure(self, values: Mapping[str, Value]) -> None:
        """Copy validated values into the kernel's typed configuration."""

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

    def views(self) -> Sequence[Sequence[int]]:
        """For each output, the inputs (by position) it may be or be a view of; an output
        past the end or with no entry is made anew by every run. The runtime hands a caller
        a copy of an output that may share memory with a feed, a constant or another output
        (views between nodes stay views)."""
        return ()

    def output_elements(self, inputs: Sequence[np.ndarray | None]) -> int | None:
        """How many elements the outputs for these inputs would hold, told from the inputs'
        values without computing the outputs, for kernels whose output size the values set
        (ConstantOfShape, Range, Expand, Tile); None when not known. The runtime leaves such
        a node unfolded when its outputs would be too large (see ``FOLD_MAXIMUM_BYTES``)."""
        return None

    def run(self, *inputs: np.ndarray | None) -> Sequence[np.ndarray]:
        """Compute the node's outputs from its inputs (None for omitted optional inputs)."""
        raise NotImplementedError


def since(kernel: type[Kernel], *versions: int) -> dict[int, type[Kernel]]:
    """A dispatch table row: the same kernel class under each of ONNX's since_versions."""
    return dict.fromkeys(versions, kernel)
