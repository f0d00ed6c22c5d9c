"""Rotary embeddings written out (runtime/rotary_fusion.py) against the unfused graph."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.attention import RotaryEmbedding
from onnx_light.kernels.base import NodeContext
from onnx_light.runtime import RuntimeSession

F = TensorProto.FLOAT
INT_MAX = np.iinfo(np.int64).max


def angles(sequence, size, equal_halves=True):
    freqs = np.outer(np.arange(sequence), 1.0 / 10000 ** (np.arange(0, size, 2) / size))
    second = freqs if equal_halves else freqs * 1.5
    full = np.concatenate([freqs, second], axis=-1)
    return np.cos(full).astype(np.float32)[None, None], np.sin(full).astype(np.float32)[None, None]


def rotary_model(shape, *, swap=False, equal_halves=True, keep=None, cos_batch=1):
    _, _, sequence, size = shape
    half = size // 2
    cos, sin = angles(sequence, size, equal_halves)
    cos = np.repeat(cos, cos_batch, axis=0)
    ints = {"zero": 0, "half": half, "end": INT_MAX, "axis": -1}
    inits = [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin"),
             *(numpy_helper.from_array(np.array([v], np.int64), n) for n, v in ints.items())]
    nodes = [helper.make_node("Mul", ["cos", "x"] if swap else ["x", "cos"], ["a"]),
             helper.make_node("Slice", ["x", "zero", "half", "axis"], ["x1"]),
             helper.make_node("Slice", ["x", "half", "end", "axis"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["n"]),
             helper.make_node("Concat", ["n", "x1"], ["r"], axis=-1),
             helper.make_node("Mul", ["sin", "r"] if swap else ["r", "sin"], ["b"]),
             helper.make_node("Add", ["b", "a"] if swap else ["a", "b"], ["y"])]
    outputs = ["y"] + ([keep] if keep else [])
    graph = helper.make_graph(nodes, "rotary", [helper.make_tensor_value_info("x", F, list(shape))],
                              [helper.make_tensor_value_info(n, F, None) for n in outputs], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def check(model, shape, fused):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    session = RuntimeSession(model)
    kernels = [getattr(step.run, "__self__", None) for step in session._plan]
    assert sum(isinstance(k, RotaryEmbedding) for k in kernels) == int(fused)
    assert session.fused_nodes == (6 if fused else 0)
    plain = RuntimeSession(model, fuse=False)
    for got, expected in zip(session.run(None, {"x": x}), plain.run(None, {"x": x}), strict=True):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()  # the same products and sums, rounded alike


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("shape", [(1, 4, 7, 8), (2, 3, 5, 16)])
def test_fused_is_bit_identical(swap, shape):
    check(rotary_model(shape, swap=swap), shape, fused=True)


def test_caches_per_batch_item():
    check(rotary_model((2, 2, 3, 4), cos_batch=2), (2, 2, 3, 4), fused=True)


@pytest.mark.parametrize("case", ["halves", "kept"])
def test_refused(case):
    """Angles that differ between the halves are not a rotation of the halves; an
    intermediate value that is a graph output stays one."""
    shape = (1, 2, 3, 8)
    model = rotary_model(shape, equal_halves=False) if case == "halves" else rotary_model(shape, keep="r")
    check(model, shape, fused=False)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), heads=st.integers(1, 4), sequence=st.integers(1, 9),
       half=st.integers(1, 12), rest=st.sampled_from([0, 2, 6]), interleaved=st.booleans(),
       three_d=st.booleans(), frozen=st.booleans(), seed=st.integers(0, 2**16))
def test_prepared_is_run_bit_for_bit(batch, heads, sequence, half, rest, interleaved, three_d, frozen, seed):
    """The compiled pass (RotaryEmbedding.prepare) gives run's values, bit for bit: halves or
    neighbours, all or the first 2 half features rotated, 3-D or 4-D X, constant caches."""
    rng = np.random.default_rng(seed)
    size = 2 * half + rest
    attributes = {"interleaved": int(interleaved)} | ({"rotary_embedding_dim": 2 * half} if rest else {})
    x = (rng.standard_normal((batch, heads, sequence, size)) * 10).astype(np.float32)
    if three_d:
        attributes["num_heads"] = heads
        x = np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(batch, sequence, heads * size)
    angles = rng.random((batch, sequence, half)) * 20
    caches = [np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)]
    for cache in caches:
        cache.flags.writeable = not frozen
    ctx = NodeContext("rotary", "RotaryEmbedding", "", 23, attributes, (F,) * 3, (F,), 3, 1)
    kernel = RotaryEmbedding(ctx)
    prepared = kernel.prepare([(a.shape, a.dtype) for a in (x, *caches)])
    assert prepared is not None and prepared.shape == x.shape and prepared.dtype == np.float32
    out = np.full(x.shape, np.nan, np.float32)
    prepared.compute(x, *caches, out=out)
    assert out.tobytes() == kernel.run(x, *caches)[0].tobytes()


def test_prepare_refuses():
    """Positions, other types and caches of the wrong shape stay with run (which checks them)."""
    ctx = NodeContext("rotary", "RotaryEmbedding", "", 23, {}, (F,) * 3, (F,), 3, 1)
    kernel, f32 = RotaryEmbedding(ctx), np.dtype(np.float32)
    x = ((1, 2, 3, 8), f32)
    assert kernel.prepare([x, ((1, 3, 4), f32), ((1, 3, 4), f32), ((1, 3), np.dtype(np.int64))]) is None
    assert kernel.prepare([((1, 2, 3, 8), np.dtype(np.float16)), ((1, 3, 4), f32), ((1, 3, 4), f32)]) is None
    assert kernel.prepare([x, ((1, 3, 3), f32), ((1, 3, 3), f32)]) is None
    assert kernel.prepare([((1, 3, 8), f32), ((1, 3, 4), f32), ((1, 3, 4), f32)]) is None  # no num_heads
