"""An ``onnx.backend.base.Backend`` over :class:`RuntimeSession`, for ONNX's backend tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from .runtime import RuntimeSession

__all__ = ["OnnxLightBackend", "OnnxLightRep", "prepare", "run_model", "run_node",
           "supports_device"]


class OnnxLightRep(BackendRep):
    """A prepared model: one session, run with positional or named inputs."""

    def __init__(self, session: RuntimeSession) -> None:
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        names = [arg.name for arg in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feeds = inputs
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(names, inputs, strict=False))
        outputs = self.session.run(None, feeds)
        return namedtupledict("Outputs", [a.name for a in self.session.get_outputs()])(*outputs)


class OnnxLightBackend(Backend):
    """onnx_light as an ONNX backend (CPU only)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> OnnxLightRep:
        if not cls.supports_device(device):
            raise ValueError(f"onnx_light runs on the CPU only, not on {device!r}")
        return OnnxLightRep(RuntimeSession(model, num_threads=kwargs.get("num_threads")))

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node by wrapping it in a one-node model (types taken from the inputs)."""
        values = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
        graph_inputs = [
            onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(v.dtype),
                                               list(v.shape))
            for name, v in zip(node.input, values, strict=False) if name
        ]
        graph_outputs = [onnx.helper.make_empty_tensor_value_info(name) for name in node.output]
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(
            onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs),
            opset_imports=[onnx.helper.make_opsetid("", opset)])
        return cls.prepare(model, device).run(values)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().split(":")[0] == "CPU"


prepare = OnnxLightBackend.prepare
run_model = OnnxLightBackend.run_model
run_node = OnnxLightBackend.run_node
supports_device = OnnxLightBackend.supports_device
