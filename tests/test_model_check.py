"""What construction refuses and what it runs, each case next to onnxruntime's behaviour.

Graph inputs and outputs without a shape (unknown rank), with symbolic dimensions, and
value_info without a shape run as onnxruntime runs them; opsets newer than the installed onnx
defines are refused, as onnxruntime refuses them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnx_light import RuntimeSession

X = np.array([[-1.5, 2.0, 0.0]], np.float32)
DEFAULT_NEWEST = onnx.defs.onnx_opset_version()
ML_NEWEST = onnx.defs.onnx_ml_opset_version()
UNSET: Any = object()


def relu_neg(input_shape: Any, output_shape: Any, middle_shape: Any = UNSET,
             opsets: tuple[tuple[str, int], ...] = (("", 21),)) -> onnx.ModelProto:
    """x -> Relu -> t -> Neg -> y, with the declared shapes given (None: no shape at all)."""
    value_info = [] if middle_shape is UNSET else [helper.make_tensor_value_info("t", TensorProto.FLOAT,
                                                                                  middle_shape)]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Neg", ["t"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)], value_info=value_info)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def onnxruntime_run(model: onnx.ModelProto) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": X})[0]


RUNS = {
    "an output without a shape": relu_neg([1, 3], None),
    "an input without a shape": relu_neg(None, [1, 3]),
    "input and output without a shape": relu_neg(None, None),
    "symbolic dimensions": relu_neg(["batch", 3], ["batch", "width"]),
    "anonymous dimensions": relu_neg([None, None], [None, 3]),
    "value_info without a shape": relu_neg([1, 3], [1, 3], None),
    "value_info with symbolic dimensions": relu_neg([1, 3], [1, 3], ["a", "b"]),
    "the newest opsets of both domains": relu_neg([1, 3], [1, 3], opsets=(("", DEFAULT_NEWEST),
                                                                          ("ai.onnx.ml", ML_NEWEST))),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_runs_as_onnxruntime_runs(name: str) -> None:
    model = RUNS[name]
    expected = onnxruntime_run(model)
    [got] = RuntimeSession(model, num_threads=1).run(None, {"x": X})
    np.testing.assert_array_equal(got, expected)


def test_a_shapeless_input_is_listed_without_a_shape() -> None:
    [x] = RuntimeSession(relu_neg(None, None), num_threads=1).get_inputs()
    assert (x.name, x.type, x.shape) == ("x", "tensor(float)", None)


def _missing_element_type() -> onnx.ModelProto:
    model = relu_neg([1, 3], None)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.UNDEFINED
    return model


def _missing_type() -> onnx.ModelProto:
    model = relu_neg([1, 3], [1, 3])
    model.graph.output[0].ClearField("type")
    return model


REFUSED = {
    "default domain opset 99": (relu_neg([1, 3], [1, 3], opsets=(("", 99),)),
                                f"opset 99 of the default domain 'ai.onnx'; the newest supported "
                                f"(onnx {onnx.__version__}) is {DEFAULT_NEWEST}"),
    "ai.onnx spelled out, opset 99": (relu_neg([1, 3], [1, 3], opsets=(("ai.onnx", 99),)),
                                      f"opset 99 of the default domain 'ai.onnx'; the newest supported "
                                      f"(onnx {onnx.__version__}) is {DEFAULT_NEWEST}"),
    "ai.onnx.ml one past its newest": (relu_neg([1, 3], [1, 3],
                                                opsets=(("", 21), ("ai.onnx.ml", ML_NEWEST + 1))),
                                       f"opset {ML_NEWEST + 1} of 'ai.onnx.ml'; the newest supported "
                                       f"(onnx {onnx.__version__}) is {ML_NEWEST}"),
    "default domain one past its newest": (relu_neg([1, 3], [1, 3], opsets=(("", DEFAULT_NEWEST + 1),)),
                                           f"opset {DEFAULT_NEWEST + 1} of the default domain"),
    "an output without an element type": (_missing_element_type(),
                                           "graph output 'y' has no element type"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_at_construction_as_onnxruntime_refuses(name: str) -> None:
    model, message = REFUSED[name]
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own exception types
        onnxruntime_run(model)
    with pytest.raises(ValueError, match="invalid ONNX model") as raised:
        RuntimeSession(model, num_threads=1)
    assert message in str(raised.value)


def test_an_output_without_a_type_is_refused() -> None:
    """The IR requires a main graph's outputs to have a type; onnxruntime runs one without, we do not."""
    onnxruntime_run(_missing_type())
    with pytest.raises(ValueError, match="invalid ONNX model: Field 'type' of 'value_info' is required"):
        RuntimeSession(_missing_type(), num_threads=1)


def test_a_shapeless_output_still_gets_type_checks() -> None:
    """The relaxed rule is the shape's presence only: strict type inference still runs."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "i"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("i", TensorProto.INT64, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ValueError, match=r"invalid ONNX model: .*inconsistent type"):
        RuntimeSession(model, num_threads=1)


def test_tensor_values_read_directly_equal_onnx_numpy_helper():
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    from onnx_light.runtime.loading import tensor_array

    tensors = [helper.make_tensor("a", T.FLOAT, [2, 2], [1, 2, 3, 4]),
               helper.make_tensor("b", T.INT64, [3], [1, -2, 3]),
               helper.make_tensor("c", T.DOUBLE, [], [2.5]),
               helper.make_tensor("d", T.INT32, [2], [7, 8]),
               helper.make_tensor("e", T.BOOL, [2], [1, 0]),
               helper.make_tensor("f", T.FLOAT16, [2], [1, 2]),
               numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "g"),
               numpy_helper.from_array(np.array([True, False]), "h"),
               numpy_helper.from_array(np.arange(3, dtype=np.int8), "i"),
               numpy_helper.from_array(np.arange(4, dtype=np.uint16), "j")]
    for tensor in tensors:
        got, expected = tensor_array(tensor), numpy_helper.to_array(tensor)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    short = T(name="short", data_type=T.FLOAT, dims=[3])
    short.float_data.extend([1.0, 2.0])
    with pytest.raises(ValueError, match="reshape"):
        tensor_array(short)
