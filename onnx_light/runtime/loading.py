"""Load and check a model: the bytes or file, the ONNX checker and shape inference, the types.

The checker and shape inference see a skeleton of the model without its large initializers'
data (both would serialize the whole model); a model given in memory may not keep external
data, since there is no folder to read it from.
"""

from __future__ import annotations

import codecs
import itertools
import math
import os
import sys
from collections.abc import Iterable, Iterator

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = [
    "SKELETON_MINIMUM",
    "check_model",
    "constant_arrays",
    "load_model",
    "skeleton",
    "tensor_array",
    "tensor_element_type",
    "tensor_shape",
    "value_types",
]


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



def load_model(model: onnx.ModelProto | str | os.PathLike[str] | bytes) -> onnx.ModelProto:
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
            return _load_file(path)
        except Exception as exc:
            what = _what_file(path)
            if what:
                raise ValueError(f"{path!r} is not an ONNX model: {what}") from None
            raise ValueError(f"{path!r} is not a readable ONNX model: {exc}") from None
    raise TypeError(f"model must be an onnx.ModelProto, a path or bytes, got {type(model).__name__}")


def _load_file(path: str) -> onnx.ModelProto:
    """``onnx.load(path)``, its format told by the file's extension as there, with the walk over
    every tensor for external data only when the file names a data file (its entries hold the
    key ``location``): the walk took most of the load of a small model."""
    with open(path, "rb") as handle:
        data = handle.read()
    extension = os.path.splitext(path)[1]
    model = onnx.load_model_from_string(
        data, format=onnx.serialization.registry.get_format_from_file_extension(extension))
    if b"location" in data:
        onnx.load_external_data_for_model(model, os.path.dirname(path))
    return model


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



# Initializers with more elements than this are left out of the copy of the model that the
# checker and shape inference see: both serialize the whole model (VGG-19 with its 550 MB of
# weights as initializers: 9.5 s of a 10.4 s construction); a typed graph input stands in.
SKELETON_MINIMUM = 1 << 12


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
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
    """Give every shapeless tensor type in ``type_proto`` an empty shape (see :func:`check_model`)."""
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        getattr(type_proto, kind).shape.SetInParent()
    elif kind in ("sequence_type", "optional_type"):
        _give_shapes(getattr(type_proto, kind).elem_type)
    elif kind == "map_type":
        _give_shapes(type_proto.map_type.value_type)


def check_model(skeleton: onnx.ModelProto) -> onnx.ModelProto:
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
    try:  # each step takes the serialized model: serialize once when both see the same one
        serialized = skeleton.SerializeToString()
        onnx.checker.check_model(serialized if checked is skeleton else checked)
        # full_check's second step: strict inference adds type checks (Add(float, int64) is refused)
        return onnx.shape_inference.infer_shapes(serialized, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError,
            UnicodeDecodeError) as exc:  # the last: a name that is not UTF-8
        raise ValueError(f"invalid ONNX model: {exc}") from None


# Element types whose raw data numpy reads as it is on a little-endian host.
_RAW_DTYPES = {onnx.TensorProto.FLOAT: np.dtype(np.float32), onnx.TensorProto.DOUBLE: np.dtype(np.float64),
               onnx.TensorProto.INT64: np.dtype(np.int64), onnx.TensorProto.INT32: np.dtype(np.int32),
               onnx.TensorProto.INT8: np.dtype(np.int8), onnx.TensorProto.UINT8: np.dtype(np.uint8),
               onnx.TensorProto.BOOL: np.dtype(np.bool_)}
_LITTLE_ENDIAN = sys.byteorder == "little"


# The typed field that holds the values of these element types when there is no raw data.
_VALUE_FIELDS = {onnx.TensorProto.FLOAT: "float_data", onnx.TensorProto.DOUBLE: "double_data",
                 onnx.TensorProto.INT64: "int64_data", onnx.TensorProto.INT32: "int32_data"}


def tensor_array(tensor: onnx.TensorProto) -> np.ndarray:
    """``numpy_helper.to_array(tensor)``, reading the common cases (a plain numeric type stored
    in the model, as raw data or in its typed field) directly: a model holds hundreds of
    small tensors."""
    dtype = _RAW_DTYPES.get(tensor.data_type)
    if (dtype is None or not _LITTLE_ENDIAN or tensor.data_location == onnx.TensorProto.EXTERNAL
            or tensor.HasField("segment")):
        return numpy_helper.to_array(tensor)
    if tensor.HasField("raw_data"):
        return np.frombuffer(tensor.raw_data, dtype).reshape(tensor.dims)
    field = _VALUE_FIELDS.get(tensor.data_type)
    if field is None:
        return numpy_helper.to_array(tensor)
    return np.asarray(getattr(tensor, field), dtype).reshape(tensor.dims)


def constant_arrays(graph: onnx.GraphProto) -> list[np.ndarray]:
    """The initializers' values, in order, read-only (kernels must never change shared data);
    one that does not decode is the model's error, naming it (the checker saw the small
    initializers only: see :func:`skeleton`)."""
    arrays = []
    for initializer in graph.initializer:
        try:
            array = tensor_array(initializer)
        except Exception as exc:
            raise ValueError(f"invalid ONNX model: initializer {initializer.name!r} "
                             f"(shape {list(initializer.dims)}): {exc}") from None
        array.flags.writeable = False
        arrays.append(array)
    return arrays


def value_types(model: onnx.ModelProto, inferred: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Declared and inferred types of every value, by name (``inferred``: the model after inference)."""
    graph = inferred.graph
    types: dict[str, onnx.TypeProto] = {}
    for info in (*graph.value_info, *graph.input, *graph.output):
        types[info.name] = info.type
    for initializer in model.graph.initializer:
        if initializer.name not in types:
            types[initializer.name] = onnx.helper.make_tensor_type_proto(initializer.data_type,
                                                                         list(initializer.dims))
    return types


def tensor_element_type(type_proto: onnx.TypeProto | None) -> int | None:
    """A tensor type's element type code; None for another type or none given."""
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return None
    return type_proto.tensor_type.elem_type or None


def tensor_shape(type_proto: onnx.TypeProto) -> list[int | str | None] | None:
    """A tensor type's dimensions (sizes, names or None); None without a shape."""
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in type_proto.tensor_type.shape.dim]

