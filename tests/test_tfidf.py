"""TfIdfVectorizer against onnxruntime on random token rows and pools: every mode, integer
and string tokens, skips, weights, 1-D and batched inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_light.kernels.base import KernelError, NodeContext
from onnx_light.kernels.strings import TfIdfVectorizer
from onnx_light.runtime import RuntimeSession

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(9)


def _pool(vocabulary: int) -> tuple[list[int], list[int]]:
    """Distinct unigrams, bigrams and trigrams of ids below ``vocabulary``; their starts."""
    pool, starts = [], []
    for n, count in ((1, 4), (2, 6), (3, 3)):
        starts.append(len(pool))
        grams = {tuple(RNG.integers(0, vocabulary, n).tolist()) for _ in range(count)}
        pool += [token for gram in sorted(grams) for token in gram]
    return pool, starts


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize(
    ("strings", "shape", "weighted"),
    [
        (False, (2, 40), True),
        (True, (60,), False),
        (False, (3, 25), False),
        (True, (2, 30), True),
    ],
)
def test_tfidf_vectorizer_matches_onnxruntime(mode, strings, shape, weighted):
    pool, starts = _pool(5)
    grams = sum((b - a) // n for n, (a, b) in enumerate(itertools.pairwise([*starts, len(pool)]), 1))
    indexes = RNG.permutation(grams + 2)[:grams].tolist()  # a few columns no n-gram writes
    attributes = {
        "mode": mode,
        "min_gram_length": 1 if strings else 2,
        "max_gram_length": 3,
        "max_skip_count": 2,
        "ngram_counts": starts,
        "ngram_indexes": indexes,
    }
    tokens = RNG.integers(0, 5, shape)
    if strings:
        attributes["pool_strings"] = [f"w{t}" for t in pool]
        x, element_type = (
            np.array([f"w{t}" for t in tokens.reshape(-1)], object).reshape(shape),
            TensorProto.STRING,
        )
    else:
        attributes["pool_int64s"] = pool
        x, element_type = tokens.astype(np.int64), TensorProto.INT64
    if weighted:
        attributes["weights"] = RNG.uniform(0.5, 2.0, grams).tolist()
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attributes)
    graph = helper.make_graph(
        [node],
        "tfidf",
        [helper.make_tensor_value_info("x", element_type, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    (ours,) = RuntimeSession(model).run(None, {"x": x})
    (theirs,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    assert ours.any()


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"mode": "BM25"}, "mode must be 'TF', 'IDF' or 'TFIDF'"),
        ({"max_gram_length": 0}, "min_gram_length"),
        ({"pool_strings": ["a"]}, "exactly one of pool_int64s and pool_strings"),
        ({"ngram_indexes": [0, 1]}, "ngram_indexes has 2 entries, the pool holds 3 n-grams"),
        ({"ngram_counts": [0, 3]}, "2-grams span 1 items"),
        ({"weights": [1.0]}, "weights has 1 entries"),
    ],
)
def test_bad_attributes_are_refused_naming_the_node(attributes, message):
    base = {
        "mode": "TF",
        "min_gram_length": 1,
        "max_gram_length": 2,
        "max_skip_count": 0,
        "ngram_counts": [0, 2],
        "ngram_indexes": [0, 1, 2],
        "pool_int64s": [1, 2, 3, 4],
    }
    with pytest.raises(KernelError, match=message) as error:
        TfIdfVectorizer(
            NodeContext("tfidf", "TfIdfVectorizer", "", 9, {**base, **attributes}, (TensorProto.INT64,))
        )
    assert "'tfidf' (TfIdfVectorizer)" in str(error.value)
