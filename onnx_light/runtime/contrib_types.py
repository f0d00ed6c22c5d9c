"""Types past the nodes onnx's shape inference does not know: onnxruntime's ``com.microsoft``
operators, and the operators onnxruntime adds to the default domain.

onnx has no schemas for the contrib operators, so its inference leaves their outputs untyped
and stops there: the nodes after them would be dispatched without element types (untuned,
unchecked). :func:`infer_contrib_types` walks the main graph once in order: a contrib node's
outputs are typed by its kernel's
:meth:`~onnx_light.kernels.contrib.base.ContribKernel.output_types`, an ONNX node left untyped
behind one by onnx's inference of that node alone; then the model is inferred again with the
contrib outputs' types declared, which types everything after them.

onnxruntime also registers a few operators in the default domain that onnx does not define
at the model's opset (:data:`DEFAULT_DOMAIN_EXTENSIONS`; its transformer optimizer writes
SimplifiedLayerNormalization there, and LayerNormalization in models below opset 17): onnx's
checker would refuse them, so :func:`adopt_default_domain_extensions` moves such nodes of the
session's copy of the model to ``com.microsoft``, whose kernels of the same name run them
(errors then name them ``com.microsoft::``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from ..kernels.declaration import KernelDeclaration
from .dispatch import CONTRIB_DOMAIN, ONNX_DOMAINS, canonical_domain
from .loading import check_model, tensor_element_type, tensor_shape

__all__ = ["DEFAULT_DOMAIN_EXTENSIONS", "adopt_default_domain_extensions", "infer_contrib_types"]

#: The operators onnxruntime runs in the default domain at any opset (version 1 there).
DEFAULT_DOMAIN_EXTENSIONS = frozenset({"SimplifiedLayerNormalization", "LayerNormalization"})


def _defined(op_type: str, opset: int) -> bool:
    """Whether onnx defines ``op_type`` in the default domain at ``opset``."""
    try:
        onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return False
    return True


def adopt_default_domain_extensions(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy whose main-graph nodes of :data:`DEFAULT_DOMAIN_EXTENSIONS` that
    onnx does not define at the model's opset are in the ``com.microsoft`` domain (imported at
    version 1)."""
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)
    moved = [index for index, node in enumerate(model.graph.node)
             if node.domain in ("", "ai.onnx") and node.op_type in DEFAULT_DOMAIN_EXTENSIONS
             and not _defined(node.op_type, opset)]
    if not moved:
        return model
    adopted = onnx.ModelProto()
    adopted.CopyFrom(model)
    for index in moved:
        adopted.graph.node[index].domain = CONTRIB_DOMAIN
    if all(entry.domain != CONTRIB_DOMAIN for entry in adopted.opset_import):
        adopted.opset_import.append(onnx.helper.make_opsetid(CONTRIB_DOMAIN, 1))
    return adopted


def _value_type(type_proto: onnx.TypeProto | None) -> tuple[int, tuple | None] | None:
    element_type = tensor_element_type(type_proto)
    if element_type is None:
        return None
    shape = tensor_shape(type_proto)  # type: ignore[arg-type]
    return element_type, None if shape is None else tuple(shape)


def _type_proto(value_type: tuple[int, tuple | None]) -> onnx.TypeProto:
    element_type, shape = value_type
    return onnx.helper.make_tensor_type_proto(element_type, None if shape is None else list(shape))


def _onnx_node_types(node: onnx.NodeProto, types: Mapping[str, onnx.TypeProto],
                     opsets: Mapping[str, int], opset_import: Sequence[onnx.OperatorSetIdProto]
                     ) -> dict[str, onnx.TypeProto]:
    """An ONNX node's output types inferred from its inputs' alone ({} when onnx cannot)."""
    if any(name and name not in types for name in node.input):
        return {}
    try:
        schema = onnx.defs.get_schema(node.op_type, opsets.get(node.domain, 0),
                                      canonical_domain(node.domain))
        return onnx.shape_inference.infer_node_outputs(
            schema, node, {name: types[name] for name in node.input if name},
            opset_imports=list(opset_import))
    except Exception:  # onnx's errors vary; the final inference reports the model's own
        return {}


def infer_contrib_types(skeleton: onnx.ModelProto, inferred: onnx.ModelProto,
                        declarations: Mapping[tuple[str, str], KernelDeclaration]) -> onnx.ModelProto:
    """``inferred`` (the checked ``skeleton``) with the types of the main graph's values after
    its contrib nodes too; the same model when it has none."""
    graph = inferred.graph
    if all(node.domain in ONNX_DOMAINS for node in graph.node):
        return inferred
    types: dict[str, onnx.TypeProto] = {
        info.name: info.type for info in (*graph.value_info, *graph.input, *graph.output)}
    for initializer in skeleton.graph.initializer:
        types.setdefault(initializer.name, onnx.helper.make_tensor_type_proto(
            initializer.data_type, list(initializer.dims)))
    opsets = {entry.domain: entry.version for entry in skeleton.opset_import}
    declared: list[onnx.ValueInfoProto] = []
    for node in graph.node:
        if all(not name or name in types for name in node.output):
            continue
        if node.domain in ONNX_DOMAINS:
            types.update(_onnx_node_types(node, types, opsets, skeleton.opset_import))
            continue
        declaration = declarations.get((node.domain, node.op_type))
        rule = getattr(declaration.kernel, "output_types", None) if declaration else None
        if rule is None:
            continue
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        inputs = [_value_type(types.get(name)) if name else None for name in node.input]
        for name, value_type in zip(node.output, rule(inputs, attributes, len(node.output)),
                                    strict=True):
            if name and value_type is not None and name not in types:
                types[name] = _type_proto(value_type)
                declared.append(onnx.helper.make_value_info(name, types[name]))
    if not declared:
        return inferred
    typed = onnx.ModelProto()
    typed.CopyFrom(skeleton)
    typed.graph.value_info.extend(declared)
    return check_model(typed)
