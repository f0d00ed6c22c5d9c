"""RuntimeSession: load a model once, configure every kernel once, run many times.

Initialization follows the spec's five steps, in order, once per session:

1. dispatch constructs each node's kernel for its operator, opset and element type;
2. each kernel returns its exact tuning key;
3. the session captures one immutable registry generation;
4. that snapshot resolves every key for this processor and thread count;
5. each kernel validates and copies the values into its typed configuration.

``run`` then walks a plan of already-configured kernels. It never reads the
registry or the cache, so publishing new values later changes new sessions
only.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import itertools
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..kernels import DECLARATIONS
from ..kernels.base import Kernel, KernelError, NodeContext, numpy_dtype, quiet
from ..parallel import BLAS, get_pool
from ..tuning.keys import element_type_name
from ..tuning.processor import execution_descriptor
from ..tuning.registry import KernelTuningRegistry, default_registry
from .branches import Branches, group_branches
from .dispatch import ONNX_DOMAINS, UnsupportedOperator, UnsupportedOperatorError, find_kernel
from .fusion import fuse as fuse_steps
from .qdq import rewrite_qdq
from .subgraphs import attach_subgraphs, op_types, outer_names
from .values import ValueFeed, hand_over
from .values import type_text as value_type_text

__all__ = ["InvalidInputError", "NodeArg", "RuntimeSession"]


class InvalidInputError(ValueError):
    """Feeds that do not fit the model: unknown or missing names, wrong type, rank or shape."""


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output: name, ``tensor(<type>)`` and shape (ints, names or None)."""

    name: str
    type: str
    shape: list[int | str | None] | None


# Called before each step of a run with the node's name and op type; may return a callable to
# call once the step is done.
NodeHook = Callable[[str, str], Callable[[], None] | None]

# Operators whose outputs may differ between runs with the same inputs: never folded.
NONDETERMINISTIC = frozenset({"Dropout", "RandomNormal", "RandomNormalLike", "RandomUniform",
                              "RandomUniformLike", "Multinomial", "Bernoulli"})


# A folded value takes at most this many bytes; a node whose outputs would take more is left
# to run with every run (where running out of memory is an error naming the node). The light
# real models build their weights with ConstantOfShape: VGG-19 folds one of 392 MiB.
FOLD_MAXIMUM_BYTES = 1 << 30

Slots = tuple[int | None, ...]


@dataclass(frozen=True)
class _Step:
    run: Any
    inputs: Slots
    outputs: Slots
    release: tuple[int, ...]
    node: str
    op_type: str


@dataclass(frozen=True)
class _Handoff:
    """Which outputs of a plan a run copies before handing them over: those that may share
    memory (``roots``: per output slot, the slots whose memory it may share) with a value the
    plan did not make (a feed, a constant) or with an output handed over before them.
    ``every``: the flags for all outputs in graph order."""

    roots: Mapping[int, frozenset[int]]
    made: frozenset[int]
    every: tuple[bool, ...]

    @classmethod
    def of(cls, steps: Sequence[tuple[Kernel, Slots, Slots]], outputs: Sequence[int]) -> _Handoff:
        """From the plan's steps: an output a step makes anew is its own root; one a step
        makes as a view (``Kernel.views``) has the roots of the inputs it views."""
        roots: dict[int, frozenset[int]] = {}
        for kernel, inputs, made in steps:
            views = kernel.views()
            for index, s in enumerate(made):
                if s is None:
                    continue
                viewed = [inputs[i] for i in (views[index] if index < len(views) else ())
                          if i < len(inputs) and inputs[i] is not None]
                roots[s] = (frozenset().union(*(roots.get(v, frozenset((v,))) for v in viewed))
                            if viewed else frozenset((s,)))
        made_slots = frozenset(s for _, _, made in steps for s in made if s is not None)
        output_roots = {s: roots.get(s, frozenset((s,))) for s in outputs}
        handoff = cls(output_roots, made_slots, ())
        return dataclasses.replace(handoff, every=handoff.copies(outputs))

    def copies(self, slots: Iterable[int]) -> tuple[bool, ...]:
        """For each of ``slots`` in turn, whether it must be copied."""
        seen: set[int] = set()
        flags = []
        for s in slots:
            roots = self.roots[s]
            flags.append(not roots <= self.made or not roots.isdisjoint(seen))
            seen |= roots
        return tuple(flags)


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a graph and its subgraphs: initializers and attribute values."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    yield from _attribute_tensors(graph.node)


def _attribute_tensors(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for sparse in (*([attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []),
                           *attribute.sparse_tensors):
                yield from (sparse.values, sparse.indices)
            for subgraph in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                yield from _tensors(subgraph)


def _without_external_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """A model given in memory has no folder: its external data would be read relative to
    the working directory, so such a model is refused."""
    functions = (_attribute_tensors(function.node) for function in model.functions)
    for tensor in itertools.chain(_tensors(model.graph), *functions):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            raise ValueError(
                f"tensor {tensor.name!r} keeps its data in the external file {location!r}; give "
                "the model's path so that external data is read from the model's folder only")
    return model


def _plan(steps: list[tuple[Kernel, Slots, Slots]], keep: set[int]) -> tuple[_Step, ...]:
    """Bound steps; each frees the values (other than ``keep``) it reads or makes last."""
    last_use: dict[int, int] = {}
    for index, (_, inputs, outputs) in enumerate(steps):
        for s in inputs:
            if s is not None:
                last_use[s] = index
        for s in outputs:
            if s is not None:
                last_use.setdefault(s, index)  # produced but never read: free at once
    release: dict[int, list[int]] = {}
    for s, last in last_use.items():
        if s not in keep:
            release.setdefault(last, []).append(s)
    return tuple(
        _Step(kernel.run, inputs, outputs, tuple(release.get(index, ())), kernel.ctx.name,
              kernel.ctx.op_type)
        for index, (kernel, inputs, outputs) in enumerate(steps)
    )


def _fold(kernel: Kernel, arguments: list[np.ndarray | None],
          output_shapes: list[list[int | str | None] | None]) -> list[np.ndarray] | None:
    """A foldable node's outputs, computed now; None when they would take more than
    ``FOLD_MAXIMUM_BYTES`` (told before computing them from the kernel or from the inferred
    shapes where either knows, else measured after) or do not fit in memory."""
    itemsize = max((numpy_dtype(t).itemsize for t in kernel.ctx.output_types if t), default=8)
    elements = kernel.output_elements(arguments)
    if elements is None and all(shape is not None and all(isinstance(d, int) for d in shape)
                                for shape in output_shapes):
        elements = sum(math.prod(shape) for shape in output_shapes)
    if elements is not None and elements * itemsize > FOLD_MAXIMUM_BYTES:
        return None
    try:
        results = list(kernel.run(*arguments))
    except MemoryError:
        return None
    if any(value is None or isinstance(value, list) for value in results):
        return None  # sequences and optionals are left to the runs: only tensors are folded
    results = [np.asarray(array) for array in results]
    if sum(array.nbytes for array in results) > FOLD_MAXIMUM_BYTES:
        return None
    return results


def _work(steps: Sequence[tuple[Kernel, Slots, Slots]],
          known: Mapping[int, np.ndarray], shapes: Mapping[int, list[int | str | None]]
          ) -> list[int | None]:
    """Each step's work estimate (``Kernel.work``) from the shapes known at construction:
    the constants' and the inferred ones (None where a dimension is symbolic; outputs the
    node leaves out are not passed)."""
    def shape(s: int | None) -> tuple[int, ...] | None:
        if s is None:
            return None
        if s in known:
            return known[s].shape
        dims = shapes.get(s)
        if dims is None or not all(isinstance(d, int) and d >= 0 for d in dims):
            return None
        return tuple(dims)

    return [kernel.work([shape(s) for s in inputs], [shape(s) for s in outputs if s is not None])
            for kernel, inputs, outputs in steps]


def _load_model(model: onnx.ModelProto | str | os.PathLike[str] | bytes) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return _without_external_data(model)
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            loaded = onnx.load_from_string(bytes(model))
        except Exception as exc:  # protobuf raises its own DecodeError
            raise ValueError(f"the bytes are not a serialized ONNX model: {exc}") from None
        return _without_external_data(loaded)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if os.path.isdir(path):
            raise FileNotFoundError(f"no ONNX model file at {path!r}: it is a folder")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no ONNX model file at {path!r}")
        try:
            return onnx.load(path)
        except Exception as exc:
            what = _what_file(path)
            if what:
                raise ValueError(f"{path!r} is not an ONNX model: {what}") from None
            raise ValueError(f"{path!r} is not a readable ONNX model: {exc}") from None
    raise TypeError(f"model must be an onnx.ModelProto, a path or bytes, got {type(model).__name__}")


def _what_file(path: str) -> str:
    """What a file that does not parse as a model is, when its first bytes tell: a text file
    (with its first line), a NumPy array, a zip archive; '' otherwise."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return ""
    if head.startswith(b"\x93NUMPY"):
        return "it is a NumPy array (.npy); feed it to a model's input instead"
    if head.startswith(b"PK\x03\x04"):
        return "it is a zip archive (an .npz file?)"
    try:  # incremental: a character cut at the end of the head is not an error
        text = codecs.getincrementaldecoder("utf-8")().decode(head)
    except UnicodeDecodeError:
        return ""
    if "\x00" in text or not text.strip():
        return ""
    first = text.strip().splitlines()[0][:60]
    return f"it is a text file (first line {first!r}); an ONNX model is a binary protobuf file"


# The element kinds a Python feed (list, tuple, scalar) may take, by the kind numpy reads it as.
_PYTHON_TARGET_KINDS = {"b": "biuf", "i": "iuf", "f": "f"}


@dataclass(frozen=True)
class _Feed:
    """One graph input as a run takes it: its slot and what its declared type asks for,
    read from the model once."""

    name: str
    slot: int
    type_text: str | None  # tensor(<type>); None: not declared
    dtype: np.dtype | None
    rank: int | None
    dimensions: tuple[tuple[int, int], ...]  # (axis, size) of the fixed dimensions
    shape: list[int | str | None] | None

    @classmethod
    def of(cls, info: onnx.ValueInfoProto, slot: int) -> _Feed | ValueFeed:
        kind = info.type.WhichOneof("value")
        if kind in ("sequence_type", "optional_type"):
            element = onnx.ValueInfoProto(name=info.name, type=getattr(info.type, kind).elem_type)
            return ValueFeed(kind, cls.of(element, slot))
        element_type = _element_type(info.type)
        shape = _shape(info.type)
        return cls(info.name, slot,
                   None if element_type is None else f"tensor({element_type_name(element_type)})",
                   None if element_type is None else numpy_dtype(element_type),
                   None if shape is None else len(shape),
                   () if shape is None else tuple((axis, size) for axis, size in enumerate(shape)
                                                  if isinstance(size, int) and size > 0),
                   shape)

    def check(self, value: Any) -> np.ndarray:
        """The feed as the plan sees it: a read-only ndarray (so no run can write the
        caller's data, and views of it are read-only too) of the input's type and shape.

        An ndarray subclass gives its data as a plain ndarray (a masked array its data, as
        onnxruntime takes it; np.matrix its 2-d array); an array in the other byte order its
        values in the native one; Python lists, tuples and scalars the input's element type
        when that keeps their values' kind (bools and ints to ints or floats, within range;
        floats to floats, not to ints). Arrays and numpy scalars must have the element type
        exactly."""
        try:
            array = value if type(value) is np.ndarray else np.asarray(value)
        except (ValueError, TypeError) as exc:  # ragged nested lists, say
            raise InvalidInputError(f"input {self.name!r}: not an array: {exc}") from None
        expected = self.dtype
        if (expected is not None and array.dtype != expected
                and not (expected.kind == "O" and array.dtype.kind in "OU")):
            array = self._converted(value, array, expected)
        if self.rank is not None:
            if array.ndim != self.rank:
                raise InvalidInputError(f"input {self.name!r}: expected rank {self.rank} "
                                        f"(shape {self.shape}), got rank {array.ndim} {array.shape}")
            for axis, size in self.dimensions:
                if array.shape[axis] != size:
                    raise InvalidInputError(f"input {self.name!r}: dimension {axis} must be "
                                            f"{size}, got shape {array.shape}")
        if array.flags.writeable:
            array = array.view()
            array.flags.writeable = False
        return array

    def _converted(self, value: Any, array: np.ndarray, expected: np.dtype) -> np.ndarray:
        """A feed of another dtype in the input's type, or an error naming the input."""
        if array.dtype.newbyteorder("=") == expected:
            return array.astype(expected)
        python = not isinstance(value, (np.ndarray, np.generic))
        if python and expected.kind in _PYTHON_TARGET_KINDS.get(array.dtype.kind, ""):
            try:
                return np.asarray(value, dtype=expected)
            except OverflowError as exc:  # an int out of the type's range
                raise InvalidInputError(f"input {self.name!r}: {exc}") from None
        raise InvalidInputError(f"input {self.name!r}: expected element type {self.type_text} "
                                f"({expected}), got {array.dtype}")


def _attribute_value(attribute: onnx.AttributeProto) -> Any:
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    if isinstance(value, list) and value and isinstance(value[0], onnx.TensorProto):
        return [numpy_helper.to_array(v) for v in value]
    return value


# Initializers with more elements than this are left out of the copy of the model that the
# checker and shape inference see: both serialize the whole model (VGG-19 with its 550 MB of
# weights as initializers: 9.5 s of a 10.4 s construction); a typed graph input stands in.
SKELETON_MINIMUM = 1 << 12


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without the data of its large initializers, for checking and inference.

    Each large initializer becomes a graph input of its type and shape (as IR 3 models list
    them anyway); small ones stay, since inference may read their values (Reshape's shape).
    """
    graph = model.graph
    large = [t for t in graph.initializer if math.prod(t.dims) > SKELETON_MINIMUM]
    if not large:
        return model
    skeleton = onnx.ModelProto(ir_version=model.ir_version, producer_name=model.producer_name,
                               producer_version=model.producer_version, domain=model.domain,
                               model_version=model.model_version, doc_string=model.doc_string)
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    skeleton.metadata_props.extend(model.metadata_props)
    target = skeleton.graph
    target.name, target.doc_string = graph.name, graph.doc_string
    for field in ("node", "input", "output", "value_info", "sparse_initializer",
                  "quantization_annotation"):
        getattr(target, field).extend(getattr(graph, field))
    left_out = {t.name for t in large}
    target.initializer.extend(t for t in graph.initializer if t.name not in left_out)
    declared = {info.name for info in graph.input}
    target.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                        for t in large if t.name not in declared)
    return skeleton


# The newest opset of each domain the installed onnx defines ("" and "ai.onnx" are one domain).
_NEWEST_OPSETS = {"": onnx.defs.onnx_opset_version, "ai.onnx": onnx.defs.onnx_opset_version,
                  "ai.onnx.ml": onnx.defs.onnx_ml_opset_version}


@functools.cache
def _since_version(op_type: str, opset: int) -> int | None:
    """The version of an ONNX operator in force at ``opset``, as the installed onnx defines
    it; None for an operator it does not know."""
    try:
        return onnx.defs.get_schema(op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        return None


def _check_opsets(model: onnx.ModelProto) -> None:
    """Refuse an opset newer than the installed onnx defines: its operators' meaning is unknown here."""
    for entry in model.opset_import:
        newest = _NEWEST_OPSETS.get(entry.domain)
        if newest is not None and entry.version > newest():
            domain = "the default domain 'ai.onnx'" if entry.domain in ("", "ai.onnx") else repr(entry.domain)
            raise ValueError(f"invalid ONNX model: it imports opset {entry.version} of {domain}; the newest "
                             f"supported (onnx {onnx.__version__}) is {newest()}")


def _has_shapeless_tensor(type_proto: onnx.TypeProto) -> bool:
    """A tensor type without a shape (unknown rank), also inside a sequence, optional or map."""
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        return not getattr(type_proto, kind).HasField("shape")
    if kind in ("sequence_type", "optional_type"):
        return _has_shapeless_tensor(getattr(type_proto, kind).elem_type)
    if kind == "map_type":
        return _has_shapeless_tensor(type_proto.map_type.value_type)
    return False


def _give_shapes(type_proto: onnx.TypeProto) -> None:
    """Give every shapeless tensor type in ``type_proto`` an empty shape (see :func:`_check`)."""
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        getattr(type_proto, kind).shape.SetInParent()
    elif kind in ("sequence_type", "optional_type"):
        _give_shapes(getattr(type_proto, kind).elem_type)
    elif kind == "map_type":
        _give_shapes(type_proto.map_type.value_type)


def _check(skeleton: onnx.ModelProto) -> onnx.ModelProto:
    """Check the model against the ONNX spec; returns it with inferred shapes and types.

    What ``onnx.checker.check_model(full_check=True)`` does, in its two steps, with one rule
    relaxed as onnxruntime and onnx's ReferenceEvaluator relax it: a graph input or output may
    lack a shape (a tensor of unknown rank), which the IR asks of a main graph but hand-built
    and converted models often omit. The structural check sees a copy where such tensors have
    a placeholder shape; strict type and shape inference sees the model as declared. An
    element type is still required, as onnxruntime requires it.
    """
    _check_opsets(skeleton)
    checked = skeleton
    graph = skeleton.graph
    for kind, infos in (("input", graph.input), ("output", graph.output)):
        for info in infos:
            if info.type.HasField("tensor_type") and not info.type.tensor_type.elem_type:
                raise ValueError(f"invalid ONNX model: graph {kind} {info.name!r} has no element type")
    shapeless = [info for info in (*graph.input, *graph.output) if _has_shapeless_tensor(info.type)]
    if shapeless:
        checked = onnx.ModelProto()
        checked.CopyFrom(skeleton)
        for info in (*checked.graph.input, *checked.graph.output):
            _give_shapes(info.type)
    try:
        onnx.checker.check_model(checked)
        # full_check's second step: strict inference adds type checks (Add(float, int64) is refused)
        return onnx.shape_inference.infer_shapes(skeleton, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError,
            UnicodeDecodeError) as exc:  # the last: a name that is not UTF-8
        raise ValueError(f"invalid ONNX model: {exc}") from None


def _value_types(model: onnx.ModelProto, inferred: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Declared and inferred types of every value, by name (``inferred``: the model after inference)."""
    graph = inferred.graph
    types: dict[str, onnx.TypeProto] = {}
    for info in (*graph.value_info, *graph.input, *graph.output):
        types[info.name] = info.type
    for initializer in model.graph.initializer:
        types.setdefault(initializer.name, onnx.helper.make_tensor_type_proto(
            initializer.data_type, list(initializer.dims)))
    return types


def _element_type(type_proto: onnx.TypeProto | None) -> int | None:
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return None
    return type_proto.tensor_type.elem_type or None


def _shape(type_proto: onnx.TypeProto) -> list[int | str | None] | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in type_proto.tensor_type.shape.dim]


def _node_kernel(node: onnx.NodeProto, index: int, opsets: Mapping[str, int],
                 types: Mapping[str, onnx.TypeProto]) -> Kernel | UnsupportedOperator:
    """Step 1 for one node (``index``: its place in its graph): its kernel, or why none."""
    domain = node.domain or ""
    opset = opsets.get(domain)
    ctx = None if opset is None or domain not in ONNX_DOMAINS else NodeContext(
        name=node.name or f"{node.op_type}_{index}",
        op_type=node.op_type,
        domain=node.domain,
        opset=opset,
        attributes={a.name: _attribute_value(a) for a in node.attribute},
        input_types=tuple(_element_type(types.get(n)) if n else None for n in node.input),
        output_types=tuple(_element_type(types.get(n)) if n else None for n in node.output),
        num_inputs=len(node.input),
        num_outputs=len(node.output),
    )
    found = find_kernel(DECLARATIONS, domain, node.op_type, opset, ctx,
                        None if ctx is None else _since_version(node.op_type, opset))
    return found if isinstance(found, UnsupportedOperator) else found(ctx)


def _node_arg(info: onnx.ValueInfoProto) -> NodeArg:
    element_type = _element_type(info.type)
    type_text = (f"tensor({element_type_name(element_type)})" if element_type
                 else value_type_text(info.type) or "unknown")
    return NodeArg(info.name, type_text, _shape(info.type))


class RuntimeSession:
    """Runs one ONNX model on the CPU with kernels tuned for this processor.

    ``model`` is an ``onnx.ModelProto``, a path or serialized bytes.
    ``num_threads`` sets the effective thread count (default: the CPUs this
    process may use). ``registry`` defaults to the process-wide one. ``fuse``
    lets construction fuse operators (``runtime/fusion.py``: per-channel affine
    chains into convolutions, activations into their producers); False runs
    every node as the graph states, with the same results up to rounding.
    ``branches`` lets a run with several threads compute independent branches
    of the graph side by side, each on one thread (``runtime/branches.py``);
    the results are the same either way. ``fold`` lets construction run the
    nodes whose inputs are all constant once (constant folding); False leaves
    every node to the runs.
    """

    def __init__(self, model: onnx.ModelProto | str | os.PathLike[str] | bytes, *,
                 num_threads: int | None = None,
                 registry: KernelTuningRegistry | None = None, fuse: bool = True,
                 branches: bool = True, fold: bool = True) -> None:
        started = time.perf_counter()
        model = _load_model(model)
        if registry is not None and not isinstance(registry, KernelTuningRegistry):
            raise TypeError(f"registry must be a KernelTuningRegistry, got {type(registry).__name__}")
        for name, flag in (("fuse", fuse), ("branches", branches), ("fold", fold)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {type(flag).__name__}")
        if fuse:  # QDQ products as integer operators (runtime/qdq.py)
            model = rewrite_qdq(model)
        skeleton = _skeleton(model)
        inferred = _check(skeleton)
        self.descriptor = execution_descriptor(num_threads)
        self.num_threads = self.descriptor.num_threads
        self._pool = get_pool(self.num_threads)
        graph = model.graph
        opsets = {entry.domain or "": entry.version for entry in model.opset_import}
        types = _value_types(skeleton, inferred)

        # Step 1: dispatch constructs every kernel (and lists every unsupported operator).
        # Control-flow nodes' graphs are dispatched with them (runtime/subgraphs.py); their
        # kernels (``nested``) are configured with the session's own in steps 2-5.
        kernels, nested, unsupported = [], [], []
        for index, node in enumerate(graph.node):
            found = _node_kernel(node, index, opsets, types)
            if isinstance(found, UnsupportedOperator):
                if found not in unsupported:
                    unsupported.append(found)
                continue
            kernels.append(found)
            nested += attach_subgraphs(found, inferred.graph.node[index], types, opsets,
                                       _node_kernel, unsupported)
        if unsupported:
            raise UnsupportedOperatorError(unsupported)

        # Steps 2-5: keys, one snapshot, resolution, configuration.
        tuning_started = time.perf_counter()
        tuned = [*kernels, *nested]
        keys = [kernel.tuning_key() for kernel in tuned]
        snapshot = (registry or default_registry()).snapshot()
        self.generation = snapshot.generation
        resolutions = [None if key is None else snapshot.resolve(key, self.descriptor)
                       for key in keys]
        for kernel, resolution in zip(tuned, resolutions, strict=True):
            kernel.bind(self._pool).configure(None if resolution is None else resolution.values)
        self.tuning_resolution_seconds = time.perf_counter() - tuning_started
        self._tuning = [(kernel.ctx.name, resolution) for kernel, resolution
                        in zip(tuned, resolutions, strict=True) if resolution is not None]

        self._inputs = [info for info in graph.input]
        self._outputs = [info for info in graph.output]
        self._kernels = kernels
        self._build_plan(graph, kernels, types, fuse, branches, fold)
        self.construction_seconds = time.perf_counter() - started

    def _build_plan(self, graph: onnx.GraphProto, kernels: list[Kernel],
                    types: Mapping[str, onnx.TypeProto], fuse: bool, branches: bool,
                    fold: bool) -> None:
        slots: dict[str, int] = {}

        def slot(name: str) -> int:
            return slots.setdefault(name, len(slots))

        constants: dict[int, np.ndarray] = {}
        for initializer in graph.initializer:
            try:  # the checker saw the small initializers only (see _skeleton)
                array = numpy_helper.to_array(initializer)
            except Exception as exc:
                raise ValueError(f"invalid ONNX model: initializer {initializer.name!r} "
                                 f"(shape {list(initializer.dims)}): {exc}") from None
            array.flags.writeable = False  # kernels must never change shared data
            constants[slot(initializer.name)] = array
        self._feed_slots = {info.name: slot(info.name) for info in graph.input}
        self._feeds = tuple(_Feed.of(info, self._feed_slots[info.name]) for info in graph.input)
        self._required = [info.name for info in graph.input if slots[info.name] not in constants]
        # Constant folding: a deterministic node whose inputs are all fixed (initializers, or
        # outputs of folded nodes) runs once, here. Initializers that are also graph inputs
        # (every one, in IR < 4 models) are defaults a feed may override: a run that feeds one
        # the folding used takes the plan without folding.
        overridable = set(self._feed_slots.values()) & set(constants)
        depends: dict[int, set[int]] = {s: ({s} if s in overridable else set()) for s in constants}
        folded: dict[int, np.ndarray] = {}
        known = dict(constants)  # constants and folded values: what the folded plan starts with
        every_step, steps = [], []
        with BLAS.scope(1):
            for node, kernel in zip(graph.node, kernels, strict=True):
                inputs = tuple(slot(name) if name else None
                               for name in (*node.input, *outer_names(kernel)))
                outputs = tuple(slot(name) if name else None for name in node.output)
                every_step.append((kernel, inputs, outputs))
                if not fold or not NONDETERMINISTIC.isdisjoint(op_types(node)) or not all(
                        s is None or s in depends for s in inputs):
                    steps.append((kernel, inputs, outputs))
                    continue
                results = _fold(kernel, [None if s is None else known[s] for s in inputs],
                                [_shape(types[name]) if name in types else None
                                 for name in node.output if name])
                if results is None:  # too large to keep: computed by every run instead
                    steps.append((kernel, inputs, outputs))
                    continue
                sources = set().union(*(depends[s] for s in inputs if s is not None))
                for s, array in zip(outputs, results, strict=False):
                    if s is not None:
                        array.flags.writeable = False
                        folded[s] = known[s] = array
                        depends[s] = sources
        self.folded_nodes = len(every_step) - len(steps)
        self._output_slots = {info.name: slots[info.name] for info in graph.output
                              if info.name in slots}
        self._output_names = list(self._output_slots)
        missing = [info.name for info in graph.output if info.name not in slots]
        if missing:
            raise ValueError(f"graph outputs {missing} are produced by no node")
        fold_sources = set().union(*(depends[s] for s in folded))
        num_slots = len(slots)
        unfused = len(steps)
        shapes = {slots[name]: shape for name, value_type in types.items()
                  if name in slots and (shape := _shape(value_type)) is not None}
        if fuse:
            def add_constant(array: np.ndarray) -> int:
                nonlocal num_slots
                num_slots += 1
                return num_slots - 1

            fusion = fuse_steps(steps, known, set(self._output_slots.values()), shapes, add_constant)
            steps = fusion.steps
            folded.update(fusion.constants)
            known.update(fusion.constants)
            fold_sources.update(*(depends[s] for s in fusion.sources))
        self.fused_nodes = unfused - len(steps)
        # Kernels may specialize for the inputs that are constant in the folded plan.
        steps = [(kernel.specialize([None if s is None else known.get(s) for s in inputs]) or kernel,
                  inputs, outputs) for kernel, inputs, outputs in steps]
        self._plan = _plan(steps, set(constants) | set(folded) | set(self._output_slots.values()))
        self._handoff = _Handoff.of(steps, list(self._output_slots.values()))
        self._handoff_unfolded = _Handoff.of(every_step, list(self._output_slots.values()))
        self._plan_unfolded = _plan(every_step, set(constants) | set(self._output_slots.values()))
        if branches and self.num_threads > 1:
            self._plan = group_branches(self._plan, _work(steps, known, shapes), self.num_threads)
            self._plan_unfolded = group_branches(self._plan_unfolded,
                                                 _work(every_step, constants, shapes),
                                                 self.num_threads)
        self.branch_groups = sum(type(item) is Branches for item in self._plan)
        self._fold_sources = frozenset(fold_sources)
        self._constants = constants
        self._folded = folded
        self._num_slots = num_slots
        self._slots = slots

    def _execute(self, plan: Sequence[Any], values: list[Any], hook: NodeHook | None = None) -> None:
        """Run ``plan``'s steps in order, each writing its outputs into ``values`` and freeing
        the values it reads last; a :class:`Branches` item runs its branches on the pool."""
        for step in plan:
            if type(step) is Branches:
                step.run(functools.partial(self._execute_branch, values=values, hook=hook),
                         self._pool)
                for s in step.release:
                    values[s] = None
                continue
            done = None if hook is None else hook(step.node, step.op_type)
            arguments = [None if s is None else values[s] for s in step.inputs]
            try:
                results = step.run(*arguments)
            except KernelError:
                raise
            except Exception as exc:
                raise RuntimeError(f"node {step.node!r} ({step.op_type}) failed: "
                                   f"{type(exc).__name__}: {str(exc) or '(no message)'}") from exc
            if done is not None:
                done()
            for s, result in zip(step.outputs, results, strict=False):
                if s is not None:
                    values[s] = result
            for s in step.release:
                values[s] = None

    def _execute_branch(self, steps: Sequence[Any], values: list[Any],
                        hook: NodeHook | None) -> None:
        """One branch, on whichever pool thread took it; numpy's error state is per thread,
        so the branch sets it there too (its kernels then skip their own)."""
        with quiet():
            self._execute(steps, values, hook)

    def folded_values(self) -> dict[str, np.ndarray]:
        """The values of the graph computed once at construction (constant folding), by
        name: read-only arrays, the same for every run that overrides no initializer."""
        return {name: self._folded[s] for name, s in self._slots.items() if s in self._folded}

    def get_inputs(self) -> list[NodeArg]:
        """The graph inputs a caller feeds (initializers excluded)."""
        return [_node_arg(info) for info in self._inputs if info.name in self._required]

    def get_outputs(self) -> list[NodeArg]:
        """The graph outputs."""
        return [_node_arg(info) for info in self._outputs]

    def tuning_report(self) -> list[dict[str, Any]]:
        """Per tunable node: its name, key, values, their source and the generation."""
        return [{"node": name, **resolution.to_dict()} for name, resolution in self._tuning]

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], *,
            node_hook: NodeHook | None = None) -> list[np.ndarray]:
        """Compute ``output_names`` (all outputs when None) from ``input_feed``.

        Same signature and return type as ``onnxruntime.InferenceSession.run``; as there,
        the outputs share memory with no feed, no constant and no other output, and the
        feeds are never written (docs/reliability.md lists the feeds accepted). A sequence
        is fed and returned as a list of arrays, an optional as its element or None.
        ``node_hook(node_name, op_type)``, when given, is called before each step of the
        plan on the thread that runs it (a fused step carries the name of its first node);
        it may raise to stop the run, and returns None or a callable to call once the step
        is done (profiling and ``RunOptions.terminate`` in ``onnx_light.InferenceSession``).
        """
        if not isinstance(input_feed, Mapping):
            raise TypeError(f"input_feed must be a dict of name -> array, "
                            f"got {type(input_feed).__name__}")
        if isinstance(output_names, str):
            raise TypeError(f"output_names must be a list of names or None, got the string "
                            f"{output_names!r}")
        names = self._output_names if output_names is None else list(output_names)
        unknown_outputs = [n for n in names if n not in self._output_slots]
        if unknown_outputs:
            raise InvalidInputError(f"unknown output(s) {unknown_outputs}; "
                                    f"outputs: {list(self._output_slots)}")
        unknown = [n for n in input_feed if n not in self._feed_slots]
        if unknown:
            defaults = len(self._feed_slots) - len(self._required)
            also = f" ({defaults} initializer(s) listed as graph inputs may also be fed)" \
                if defaults else ""
            raise InvalidInputError(f"unknown input(s) {unknown}; inputs: {self._required}{also}")
        missing = [n for n in self._required if n not in input_feed]
        if missing:
            raise InvalidInputError(f"missing input(s) {missing}")
        values: list[Any] = [None] * self._num_slots
        for s, array in self._constants.items():
            values[s] = array
        fed = set()
        for feed in self._feeds:
            if feed.name in input_feed:
                fed.add(feed.slot)
                values[feed.slot] = feed.check(input_feed[feed.name])
        plan, handoff = self._plan, self._handoff
        if fed & self._fold_sources:  # a default the folding used is overridden
            plan, handoff = self._plan_unfolded, self._handoff_unfolded
        else:
            for s, array in self._folded.items():
                values[s] = array
        # One BLAS thread by default; a kernel that wants BLAS's own threads raises the
        # count for its call (at most the session's thread count) and restores it.
        with BLAS.scope(1), quiet():
            self._execute(plan, values, node_hook)
        # The caller gets arrays of its own: a copy of each output that may share memory with
        # a feed, a constant or an output before it, and of any read-only one.
        slots = [self._output_slots[n] for n in names]
        copies = handoff.every if output_names is None else handoff.copies(slots)
        return [hand_over(values[s], copy) for s, copy in zip(slots, copies, strict=True)]
