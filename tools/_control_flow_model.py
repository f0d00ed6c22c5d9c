"""A model with control flow as exporters write it: an RNN cell as a Scan, an accumulating
Loop (trip count from the input's shape) with an If inside, and a data-dependent If.

Random weights, built with onnx's helpers (no torch). Used by tests/test_control_flow.py
(against onnxruntime) and benchmarks/control_flow.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
OPSET = 17


class Sizes(NamedTuple):
    batch: int
    features: int
    hidden: int


SIZES = Sizes(batch=2, features=3, hidden=4)


def _info(name: str, element_type: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, element_type, shape)


def _constant(name: str, values, dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def rnn_scan(sizes: Sizes = SIZES) -> onnx.NodeProto:
    """An RNN cell over the time axis of x (axis 1): h = tanh(x_t Wx + h Wh + b), the states
    stacked on axis 1. The weights are the main graph's initializers (outer scope)."""
    batch, features, hidden = sizes.batch, sizes.features, sizes.hidden
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "Wx"], ["xw"], name="input_product"),
         helper.make_node("MatMul", ["h_prev", "Wh"], ["hw"], name="state_product"),
         helper.make_node("Add", ["xw", "hw"], ["pre"]),
         helper.make_node("Add", ["pre", "b"], ["pre_b"]),
         helper.make_node("Tanh", ["pre_b"], ["h"]),
         helper.make_node("Identity", ["h"], ["h_out"])],
        "rnn_cell",
        [_info("h_prev", F, [batch, hidden]), _info("x_t", F, [batch, features])],
        [_info("h", F, [batch, hidden]), _info("h_out", F, [batch, hidden])])
    return helper.make_node("Scan", ["h0", "x"], ["h_last", "states"], name="rnn", body=body,
                            num_scan_inputs=1, scan_input_axes=[1], scan_output_axes=[1])


def accumulating_loop(sizes: Sizes = SIZES) -> onnx.NodeProto:
    """As torch.jit.script exports ``for i in range(x.shape[1])``: the trip count from Shape
    and Gather, cond a constant true; the body reads ``states`` and ``decay`` of the main
    graph and holds an If (odd steps subtract) that reads them two levels out."""
    batch, hidden = sizes.batch, sizes.hidden
    odd = helper.make_graph([helper.make_node("Mul", ["state_i", "decay"], ["scaled"]),
                             helper.make_node("Sub", ["acc_in", "scaled"], ["acc_odd"])],
                            "odd", [], [_info("acc_odd", F, [batch, hidden])])
    even = helper.make_graph([helper.make_node("Add", ["acc_in", "state_i"], ["acc_even"])],
                             "even", [], [_info("acc_even", F, [batch, hidden])])
    body = helper.make_graph(
        [helper.make_node("Gather", ["states", "i"], ["state_i"], axis=1, name="step_state"),
         helper.make_node("Mod", ["i", "two"], ["parity"]),
         helper.make_node("Cast", ["parity"], ["is_odd"], to=B),
         helper.make_node("If", ["is_odd"], ["acc_out"], name="odd_or_even",
                          then_branch=odd, else_branch=even),
         helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "accumulate",
        [_info("i", I64, []), _info("cond_in", B, []), _info("acc_in", F, [batch, hidden])],
        [_info("cond_out", B, []), _info("acc_out", F, [batch, hidden]), _info("total", F, [])],
        initializer=[_constant("two", 2, np.int64)])
    return helper.make_node("Loop", ["steps", "true", "acc0"], ["acc", "totals"], name="accumulate",
                            body=body)


def exported_model(sizes: Sizes = SIZES, seed: int = 7) -> onnx.ModelProto:
    """An RNN (Scan), an accumulating loop with an If inside (Loop), and a data-dependent If
    whose else branch returns an outer value as it is (through Identity: the checker refuses
    a graph output that no node of the graph makes). Random weights from ``seed``."""
    batch, features, hidden = sizes.batch, sizes.features, sizes.hidden
    then_branch = helper.make_graph([helper.make_node("MatMul", ["acc", "Wo"], ["projected"]),
                                     helper.make_node("Relu", ["projected"], ["positive"])],
                                    "then", [], [_info("positive", F, [batch, hidden])])
    else_branch = helper.make_graph([helper.make_node("Identity", ["acc"], ["acc_as_is"])],
                                    "else", [], [_info("acc_as_is", F, [batch, hidden])])
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "one"], ["steps"], axis=0),
        helper.make_node("Gather", ["x_shape", "zero"], ["batch"], axis=0),
        helper.make_node("Concat", ["batch", "hidden"], ["state_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["state_shape"], ["h0"]),
        helper.make_node("ConstantOfShape", ["state_shape"], ["acc0"]),
        rnn_scan(sizes),
        accumulating_loop(sizes),
        helper.make_node("ReduceSum", ["x"], ["x_sum"], keepdims=0),
        helper.make_node("Greater", ["x_sum", "zero_f"], ["positive_input"]),
        helper.make_node("If", ["positive_input"], ["y"], name="head", then_branch=then_branch,
                         else_branch=else_branch),
    ]
    rng = np.random.default_rng(seed)
    # Scaled by 1 / sqrt(fan-in), the recurrence contracting: with larger weights the RNN is
    # chaotic and float rounding differences grow step by step.
    weights = [_constant("Wx", rng.standard_normal((features, hidden)) / np.sqrt(features)),
               _constant("Wh", rng.standard_normal((hidden, hidden)) * 0.5 / np.sqrt(hidden)),
               _constant("b", rng.standard_normal(hidden)),
               _constant("Wo", rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)),
               _constant("decay", 0.5),
               _constant("zero_f", 0.0),
               _constant("one", 1, np.int64), _constant("zero", [0], np.int64),
               _constant("hidden", [hidden], np.int64),
               _constant("true", True, np.bool_)]
    graph = helper.make_graph(
        nodes, "control_flow", [_info("x", F, ["batch", "time", features])],
        [_info(name, F, None) for name in ("h_last", "states", "acc", "totals", "y")],
        initializer=weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
