"""The random number kernels: shapes, types, ranges, seeds and the distributions drawn.

Draws cannot be compared with onnxruntime's (another generator), so the oracles are the
distributions' own statistics over many draws of a seeded node (the bounds hold with
margins of several standard errors) and numpy's seeded legacy generator.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_light.kernels import random_draws
from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.runtime import RuntimeSession

F, D = TensorProto.FLOAT, TensorProto.DOUBLE


def _session(
    op_type: str, inputs: list[tuple[str, int, list[int]]], output_type: int, **attributes
) -> RuntimeSession:
    node = helper.make_node(op_type, [name for name, _, _ in inputs], ["y"], **attributes)
    graph = helper.make_graph(
        [node],
        "draw",
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info("y", output_type, None)],
    )
    return RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)]))


def test_a_seeded_uniform_node_draws_numpys_seeded_values_on_every_run():
    session = _session("RandomUniform", [], D, shape=[200, 100], low=-2.0, high=3.0, seed=7.0, dtype=D)
    (first,), (second,) = session.run(None, {}), session.run(None, {})
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first, np.random.RandomState(7).uniform(-2.0, 3.0, (200, 100)))
    assert first.dtype == np.float64 and first.min() >= -2.0 and first.max() < 3.0
    assert abs(first.mean() - 0.5) < 0.05


def test_an_unseeded_node_draws_anew_on_every_run_and_is_not_folded():
    session = _session("RandomNormal", [], F, shape=[64])
    (first,), (second,) = session.run(None, {}), session.run(None, {})
    assert first.dtype == np.float32 and first.shape == (64,)
    assert not np.array_equal(first, second)


def test_normal_like_draws_the_inputs_shape_with_its_mean_and_scale():
    x = np.zeros((300, 100), np.float32)
    (y,) = _session("RandomNormalLike", [("x", F, [300, 100])], F, mean=4.0, scale=0.5, seed=1.0).run(
        None, {"x": x}
    )
    assert y.shape == x.shape and y.dtype == np.float32
    assert abs(y.mean() - 4.0) < 0.01 and abs(y.std() - 0.5) < 0.01


def test_uniform_like_takes_dtype_for_an_integer_input():
    (y,) = _session("RandomUniformLike", [("x", TensorProto.INT64, [5, 3])], D, dtype=D, seed=0.0).run(
        None, {"x": np.zeros((5, 3), np.int64)}
    )
    assert y.shape == (5, 3) and y.dtype == np.float64


def test_bernoulli_draws_ones_with_the_inputs_probabilities():
    p = np.repeat(np.array([[0.0, 0.2, 0.9, 1.0]], np.float32), 20000, axis=0)
    (y,) = _session(
        "Bernoulli", [("p", F, list(p.shape))], TensorProto.INT32, dtype=TensorProto.INT32, seed=3.0
    ).run(None, {"p": p})
    assert y.dtype == np.int32 and set(np.unique(y)) <= {0, 1}
    frequencies = y.mean(axis=0)
    assert frequencies[0] == 0 and frequencies[3] == 1
    np.testing.assert_allclose(frequencies[1:3], [0.2, 0.9], atol=0.015)


def test_multinomial_samples_classes_with_the_softmax_of_the_logits():
    logits = np.log(np.array([[0.1, 0.6, 0.3], [1.0, 1e-9, 1e-9]], np.float32))
    (y,) = _session(
        "Multinomial",
        [("x", F, [2, 3])],
        TensorProto.INT64,
        sample_size=20000,
        dtype=TensorProto.INT64,
        seed=5.0,
    ).run(None, {"x": logits})
    assert y.shape == (2, 20000) and y.dtype == np.int64
    np.testing.assert_allclose(np.bincount(y[0], minlength=3) / 20000, [0.1, 0.6, 0.3], atol=0.015)
    assert (y[1] == 0).all()


@pytest.mark.parametrize(
    ("op_type", "attributes", "message"),
    [
        ("RandomUniform", {"shape": [2], "dtype": TensorProto.INT32}, "dtype 6 is not supported"),
        ("RandomNormal", {"dtype": F}, "attribute 'shape' is required"),
        ("RandomUniform", {"shape": [2], "low": 2.0, "high": 1.0}, "must not exceed high"),
        ("RandomNormal", {"shape": [2], "scale": -1.0}, "scale must not be negative"),
        ("Multinomial", {"dtype": F}, "dtype 1 is not supported"),
        ("Multinomial", {"sample_size": 0}, "sample_size must be positive"),
        ("RandomUniformLike", {}, "the input's type int64 cannot hold the draws"),
    ],
)
def test_bad_attributes_are_refused_naming_the_node(op_type, attributes, message):
    """What onnx's checker lets through (or, built directly, what it would refuse)."""
    kernel = getattr(random_draws, op_type)
    with pytest.raises(KernelError, match=message) as error:
        input_type = TensorProto.INT64 if op_type.endswith("Like") else F
        kernel(NodeContext("draw", op_type, "", 22, attributes, (input_type,), (F,), 1))
    assert "'draw' (" + op_type in str(error.value)
