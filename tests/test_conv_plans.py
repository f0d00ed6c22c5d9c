"""QLinearConv's per-shape plans (the packed and depthwise paths' setup, made once per input
shape and reused run to run): a second input shape, fed weights, zero points and biases that
change between runs, and concurrent runs, each against a fresh kernel (which makes its plan
anew) on writable copies of the same inputs."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from kernel_cases import build
from onnx import TensorProto, helper, numpy_helper

from onnx_light import RuntimeSession

NAMES = ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero", "bias"]
# (channels in, channels out, kernel, group): a pointwise, a full 3x3 and a depthwise convolution
LAYERS = {"pointwise": (8, 8, 1, 1), "full": (6, 8, 3, 1), "grouped": (8, 8, 3, 2), "depthwise": (8, 8, 3, 8)}
SHAPES = ((1, 2, 2), (2, 9, 7), (1, 2, 2))


def _inputs(layer: str, seed: int = 0) -> list[np.ndarray]:
    c, m, k, group = LAYERS[layer]
    rng = np.random.default_rng(seed)
    return [np.zeros(0, np.uint8), np.array(0.03, np.float32), np.array(rng.integers(0, 256), np.uint8),
            rng.integers(-64, 64, (m, c // group, k, k)).astype(np.int8),
            rng.uniform(0.005, 0.02, m).astype(np.float32), np.zeros(m, np.int8),
            np.array(0.07, np.float32), np.array(rng.integers(0, 256), np.uint8),
            rng.integers(-3000, 3000, m).astype(np.int32)]


def _session(layer: str, fed: tuple[str, ...] = (), threads: int = 1, seed: int = 0) -> RuntimeSession:
    """The layer's QLinearConv with a batch and plane of any size, the inputs in ``fed``
    graph inputs, the others constants."""
    c, _, k, group = LAYERS[layer]
    inputs = _inputs(layer, seed)
    types = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8,
             np.dtype(np.int32): TensorProto.INT32, np.dtype(np.float32): TensorProto.FLOAT}
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.UINT8, ["n", c, "h", "w"])]
    graph_inputs += [helper.make_tensor_value_info(name, types[value.dtype], value.shape)
                     for name, value in zip(NAMES, inputs, strict=True) if name in fed]
    constants = [numpy_helper.from_array(value, name) for name, value in zip(NAMES, inputs, strict=True)
                 if name != "x" and name not in fed]
    node = helper.make_node("QLinearConv", NAMES, ["y"], group=group, pads=[k // 2] * 4)
    graph = helper.make_graph([node], "conv", graph_inputs,
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    model.ir_version = 8
    return RuntimeSession(model, num_threads=threads)


def _fresh(layer: str, inputs: list[np.ndarray]) -> np.ndarray:
    """A fresh kernel's output (its first plan) on writable copies of ``inputs``."""
    _, _, k, group = LAYERS[layer]
    copies = [np.array(value) for value in inputs]
    return build("QLinearConv", copies, 10, group=group, pads=[k // 2] * 4)[1].run(*copies)[0]


def _x(shape: tuple[int, int, int], c: int, seed: int) -> np.ndarray:
    n, h, w = shape
    return np.random.default_rng(seed).integers(0, 256, (n, c, h, w)).astype(np.uint8)


@pytest.mark.parametrize("layer", list(LAYERS))
def test_a_second_input_shape_gets_its_own_plan(layer: str) -> None:
    session, inputs = _session(layer), _inputs(layer)
    for seed, shape in enumerate(SHAPES):
        inputs[0] = _x(shape, LAYERS[layer][0], seed)
        actual = session.run(None, {"x": inputs[0]})[0]
        assert actual.shape[:2] == (shape[0], LAYERS[layer][1])
        np.testing.assert_array_equal(actual, _fresh(layer, inputs))


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("fed", ["w", "w_zero", "x_zero", "y_zero", "bias"])
def test_fed_operands_are_read_at_every_run(layer: str, fed: str) -> None:
    """A fed weight, zero point or bias that changes between runs of the same shape changes
    the output as a fresh kernel's."""
    session, inputs = _session(layer, fed=(fed,)), _inputs(layer)
    position = NAMES.index(fed)
    for seed in range(3):
        inputs[position] = _inputs(layer, seed + 1)[position] if fed != "w_zero" else \
            np.full_like(inputs[position], seed - 1)
        inputs[0] = _x(SHAPES[1], LAYERS[layer][0], seed)
        actual = session.run(None, {"x": inputs[0], fed: inputs[position]})[0]
        np.testing.assert_array_equal(actual, _fresh(layer, inputs))


def test_a_writable_operand_changed_in_place_is_read_again() -> None:
    """A kernel called directly with the same writable bias, changed in place: no plan is
    kept for it."""
    inputs = _inputs("pointwise")
    inputs[0] = _x(SHAPES[1], LAYERS["pointwise"][0], 0)
    kernel = build("QLinearConv", inputs, 10, pads=[0] * 4)[1]
    first = kernel.run(*inputs)[0]
    inputs[8] += 2000
    second = kernel.run(*inputs)[0]
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(second, _fresh("pointwise", inputs))


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("threads", [1, 2])
def test_concurrent_runs_share_the_plans(layer: str, threads: int) -> None:
    """Two Python threads run one session (on one or two pool threads) with two input shapes
    at once; each output is a fresh kernel's and no output is another's."""
    session, inputs = _session(layer, threads=threads), _inputs(layer)
    feeds = [_x(shape, LAYERS[layer][0], seed) for seed, shape in enumerate(SHAPES[:2])]
    expected = []
    for x in feeds:
        inputs[0] = x
        expected.append(_fresh(layer, inputs))
    results: dict[int, list[Any]] = {0: [], 1: []}

    def runs(index: int) -> None:
        for _ in range(30):
            results[index].append(session.run(None, {"x": feeds[index]})[0])

    workers = [threading.Thread(target=runs, args=(index,)) for index in (0, 1)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for index in (0, 1):
        assert len(results[index]) == 30
        for actual in results[index]:
            np.testing.assert_array_equal(actual, expected[index])
    assert not any(np.shares_memory(a, b) for a in results[0] for b in results[1])
