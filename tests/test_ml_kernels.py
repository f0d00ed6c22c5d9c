"""The ai.onnx.ml kernels one node at a time, against onnxruntime on the same model: every
attribute form skl2onnx and the ONNX spec use, the tree ensembles' modes, aggregates, missing
values and both attribute layouts, and the errors that name the node's bad attribute."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels.base import KernelError
from onnx_light.runtime import RuntimeSession

ort = pytest.importorskip("onnxruntime")

F, D, I64, S = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.STRING
ML = "ai.onnx.ml"
RNG = np.random.default_rng(11)


def _model(op_type, inputs, outputs, ml_opset=3, **attributes):
    """A one-node ai.onnx.ml model: ``inputs``/``outputs`` are (name, element type, shape)."""
    node = helper.make_node(op_type, [n for n, _, _ in inputs], [n for n, _, _ in outputs],
                            name=f"{op_type.lower()}_node", domain=ML, **attributes)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(ML, ml_opset)])


def _both(model, feeds, threads=1):
    ours = RuntimeSession(model, num_threads=threads).run(None, feeds)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    theirs = ort.InferenceSession(model.SerializeToString(), options,
                                  providers=["CPUExecutionProvider"]).run(None, feeds)
    return ours, theirs


def _assert_same(ours, theirs, rtol=1e-5, atol=1e-6):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        if a.dtype.kind in "OUi":
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


X = RNG.standard_normal((7, 3)).astype(np.float32)

ONE_NODE = {
    "Scaler": (_model("Scaler", [("x", F, [7, 3])], [("y", F, None)], offset=[0.5, -1.0, 2.0],
                      scale=[2.0, 0.5, -1.0]), {"x": X}),
    "Scaler, one value": (_model("Scaler", [("x", D, [7, 3])], [("y", F, None)], offset=[0.5],
                                 scale=[3.0]), {"x": X.astype(np.float64)}),
    "Normalizer MAX": (_model("Normalizer", [("x", F, [7, 3])], [("y", F, None)], norm="MAX"),
                       {"x": np.abs(X) + 0.1}),
    "Normalizer L1": (_model("Normalizer", [("x", F, [7, 3])], [("y", F, None)], norm="L1"), {"x": X}),
    "Normalizer L2": (_model("Normalizer", [("x", F, [7, 3])], [("y", F, None)], norm="L2"), {"x": X}),
    "Binarizer": (_model("Binarizer", [("x", F, [7, 3])], [("y", F, None)], threshold=0.25), {"x": X}),
    "Imputer NaN": (_model("Imputer", [("x", F, [2, 3])], [("y", F, None)],
                           imputed_value_floats=[1.0, 2.0, 3.0], replaced_value_float=float("nan")),
                    {"x": np.array([[np.nan, 1, 2], [4, np.nan, np.nan]], np.float32)}),
    "Imputer int64": (_model("Imputer", [("x", I64, [2, 2])], [("y", I64, None)],
                             imputed_value_int64s=[7], replaced_value_int64=-1),
                      {"x": np.array([[-1, 3], [5, -1]], np.int64)}),
    "OneHotEncoder ints": (_model("OneHotEncoder", [("x", I64, [4, 2])], [("y", F, None)],
                                  cats_int64s=[3, 1, 4]),
                           {"x": np.array([[1, 4], [3, 9], [4, 4], [0, 1]], np.int64)}),
    "OneHotEncoder strings": (_model("OneHotEncoder", [("x", S, [3])], [("y", F, None)],
                                     cats_strings=["b", "a"]),
                              {"x": np.array(["a", "c", "b"], dtype=object)}),
    "LabelEncoder-1 strings to ints": (
        _model("LabelEncoder", [("x", S, [4])], [("y", I64, None)], ml_opset=1,
               classes_strings=["cat", "dog"], default_int64=-7),
        {"x": np.array(["dog", "cat", "emu", "dog"], dtype=object)}),
    "LabelEncoder-2 strings to floats": (
        _model("LabelEncoder", [("x", S, [3])], [("y", F, None)], ml_opset=2,
               keys_strings=["a", "b"], values_floats=[0.5, -1.5], default_float=9.0),
        {"x": np.array(["b", "z", "a"], dtype=object)}),
    "LabelEncoder-2 ints to strings": (
        _model("LabelEncoder", [("x", I64, [4])], [("y", S, None)], ml_opset=2,
               keys_int64s=[5, 1, 3], values_strings=["five", "one", "three"], default_string="?"),
        {"x": np.array([3, 4, 5, 1], np.int64)}),
    "LabelEncoder-4 tensors": (
        _model("LabelEncoder", [("x", I64, [3])], [("y", D, None)], ml_opset=4,
               keys_tensor=numpy_helper.from_array(np.array([2, 8], np.int64)),
               values_tensor=numpy_helper.from_array(np.array([0.25, 8.5])),
               default_tensor=numpy_helper.from_array(np.array([-1.0]))),
        {"x": np.array([8, 2, 0], np.int64)}),
    "CategoryMapper to ints": (
        _model("CategoryMapper", [("x", S, [3])], [("y", I64, None)], cats_strings=["x", "y"],
               cats_int64s=[10, 20], default_int64=-2),
        {"x": np.array(["y", "q", "x"], dtype=object)}),
    "CategoryMapper to strings": (
        _model("CategoryMapper", [("x", I64, [3])], [("y", S, None)], cats_strings=["x", "y"],
               cats_int64s=[10, 20], default_string="none"),
        {"x": np.array([20, 10, 30], np.int64)}),
    "ArrayFeatureExtractor": (
        _model("ArrayFeatureExtractor", [("x", F, [7, 3]), ("i", I64, [2])], [("y", F, None)]),
        {"x": X, "i": np.array([2, 0], np.int64)}),
    "FeatureVectorizer": (
        _model("FeatureVectorizer", [("a", F, [7, 3]), ("b", F, [7, 2])], [("y", F, None)],
               inputdimensions=[2, 3]),
        {"a": X, "b": np.arange(14, dtype=np.float32).reshape(7, 2)}),
    "LinearRegressor, two targets": (
        _model("LinearRegressor", [("x", F, [7, 3])], [("y", F, None)],
               coefficients=RNG.standard_normal(6).tolist(), intercepts=[0.5, -0.5], targets=2),
        {"x": X}),
}
for _transform in ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"):
    ONE_NODE[f"LinearClassifier {_transform}"] = (
        _model("LinearClassifier", [("x", F, [7, 3])], [("label", S, None), ("scores", F, None)],
               coefficients=(0.2 * RNG.standard_normal(9)).tolist(), intercepts=[0.1, 0.0, -0.1],
               classlabels_strings=["a", "b", "c"], post_transform=_transform),
        {"x": X if _transform != "PROBIT" else np.abs(X) * 0.2})
ONE_NODE["LinearClassifier binary"] = (
    _model("LinearClassifier", [("x", F, [7, 3])], [("label", I64, None), ("scores", F, None)],
           coefficients=[1.0, -2.0, 0.5], intercepts=[0.25], classlabels_ints=[4, 9],
           post_transform="LOGISTIC"), {"x": X})


@pytest.mark.parametrize("name", ONE_NODE)
def test_a_node_matches_onnxruntime(name):
    model, feeds = ONE_NODE[name]
    _assert_same(*_both(model, feeds))


def _legacy_trees(**extra):
    """Two small trees in the legacy layout: tree 0 splits feature 0 then 1, tree 1 feature 2,
    its nodes listed out of order; every mode but EQ and NEQ (which the leaves below cover)."""
    return {**dict(
        nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1],
        nodes_nodeids=[0, 1, 2, 3, 4, 2, 0, 1],
        nodes_featureids=[0, 1, 0, 0, 0, 0, 2, 0],
        nodes_modes=["BRANCH_LEQ", "BRANCH_GT", "LEAF", "LEAF", "LEAF", "LEAF", "BRANCH_LT", "LEAF"],
        nodes_values=[0.1, -0.3, 0, 0, 0, 0, 0.5, 0],
        nodes_truenodeids=[1, 2, 0, 0, 0, 0, 1, 0],
        nodes_falsenodeids=[4, 3, 0, 0, 0, 0, 2, 0],
        nodes_missing_value_tracks_true=[1, 0, 0, 0, 0, 0, 0, 0]), **extra}


X_NAN = np.vstack([X, [[np.nan, 0.0, 0.0], [1.0, np.nan, np.nan]]]).astype(np.float32)


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_a_tree_ensemble_regressor_matches_onnxruntime(aggregate):
    model = _model("TreeEnsembleRegressor", [("x", F, [9, 3])], [("y", F, None)],
                   **_legacy_trees(target_treeids=[0, 0, 0, 1, 1, 1], target_nodeids=[2, 3, 4, 1, 2, 2],
                                   target_ids=[0, 1, 0, 1, 0, 1],
                                   target_weights=[1.5, -2.0, 0.25, 3.0, -1.0, 0.5]),
                   n_targets=2, aggregate_function=aggregate, base_values=[0.5, -0.5])
    _assert_same(*_both(model, {"x": X_NAN}))


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX"])
@pytest.mark.parametrize("classes", [2, 3])
def test_a_tree_ensemble_classifier_matches_onnxruntime(classes, transform):
    weights = dict(class_treeids=[0, 0, 0, 1, 1], class_nodeids=[2, 3, 4, 1, 2],
                   class_ids=[1, 0, classes - 1, 1, 0], class_weights=[0.4, 0.6, 0.3, 0.7, 0.2])
    model = _model("TreeEnsembleClassifier", [("x", F, [9, 3])],
                   [("label", I64, None), ("scores", F, None)], **_legacy_trees(**weights),
                   classlabels_int64s=list(range(10, 10 + classes)), post_transform=transform)
    (labels, scores), (ort_labels, ort_scores) = _both(model, {"x": X_NAN})
    np.testing.assert_allclose(scores, ort_scores, rtol=1e-5, atol=1e-6)
    if classes == 2:
        # onnxruntime labels two classes that both have weights 1 or 0 (its positive and
        # negative labels), not 11 or 10; the labels are the classlabels, as in onnx's reference
        from onnx.reference import ReferenceEvaluator

        np.testing.assert_array_equal(ort_labels, ort_labels.astype(bool))
        ort_labels = ReferenceEvaluator(model).run(None, {"x": X_NAN})[0]
    np.testing.assert_array_equal(labels, ort_labels)


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC"])
def test_a_binary_tree_classifier_with_one_class_of_weights_matches_onnxruntime(transform):
    """Gradient boosting's binary form: weights for class 1 only, the other class derived."""
    model = _model("TreeEnsembleClassifier", [("x", F, [9, 3])],
                   [("label", S, None), ("scores", F, None)],
                   **_legacy_trees(class_treeids=[0, 0, 0, 1, 1], class_nodeids=[2, 3, 4, 1, 2],
                                   class_ids=[0] * 5, class_weights=[0.4, -0.6, 0.3, 0.7, -0.2]),
                   classlabels_strings=["no", "yes"], post_transform=transform, base_values=[0.1])
    _assert_same(*_both(model, {"x": X_NAN}))


def _tree_ensemble_5(x_dtype=np.float32, **extra):
    """TreeEnsemble-5: tree 0 tests set membership on feature 1, then feature 0 (GTE); tree 1
    is a single leaf."""
    splits = np.array([0.0, 0.2, 0.0], x_dtype)
    attributes = dict(
        nodes_featureids=[1, 0, 0], nodes_modes=numpy_helper.from_array(np.array([6, 2, 0], np.uint8)),
        nodes_splits=numpy_helper.from_array(splits),
        nodes_truenodeids=[1, 0, 2], nodes_trueleafs=[0, 1, 1],
        nodes_falsenodeids=[1, 1, 2], nodes_falseleafs=[1, 1, 1],
        nodes_missing_value_tracks_true=[0, 1, 0],
        membership_values=numpy_helper.from_array(np.array([1.0, 3.0, np.nan], x_dtype)),
        tree_roots=[0, 2], leaf_targetids=[0, 1, 1],
        leaf_weights=numpy_helper.from_array(np.array([1.0, 10.0, 100.0], x_dtype)), n_targets=2)
    attributes.update(extra)
    element_type = F if x_dtype == np.float32 else D
    return _model("TreeEnsemble", [("x", element_type, [5, 2])], [("y", element_type, None)],
                  ml_opset=5, **attributes)


@pytest.mark.parametrize("x_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("aggregate", [0, 1, 3])
def test_tree_ensemble_5_matches_onnxruntime(x_dtype, aggregate):
    x = np.array([[0.5, 1.0], [0.1, 3.0], [np.nan, 1.0], [0.3, 2.0], [0.0, np.nan]], x_dtype)
    _assert_same(*_both(_tree_ensemble_5(x_dtype, aggregate_function=aggregate), {"x": x}))


def test_a_forest_gives_the_same_scores_on_one_thread_and_two():
    trees, nodes = 40, 31
    tree_ids = np.repeat(np.arange(trees), nodes)
    node_ids = np.tile(np.arange(nodes), trees)
    inner = node_ids < 15
    model = _model(
        "TreeEnsembleRegressor", [("x", F, [None, 5])], [("y", F, None)],
        nodes_treeids=tree_ids.tolist(), nodes_nodeids=node_ids.tolist(),
        nodes_featureids=RNG.integers(0, 5, trees * nodes).tolist(),
        nodes_modes=["BRANCH_LEQ" if i else "LEAF" for i in inner],
        nodes_values=RNG.standard_normal(trees * nodes).tolist(),
        nodes_truenodeids=np.where(inner, 2 * node_ids + 1, 0).tolist(),
        nodes_falsenodeids=np.where(inner, 2 * node_ids + 2, 0).tolist(),
        target_treeids=tree_ids[~inner].tolist(), target_nodeids=node_ids[~inner].tolist(),
        target_ids=[0] * int((~inner).sum()), n_targets=1,
        target_weights=RNG.standard_normal(int((~inner).sum())).tolist())
    x = RNG.standard_normal((500, 5)).astype(np.float32)
    (serial,), (theirs,) = _both(model, {"x": x})
    (parallel,) = RuntimeSession(model, num_threads=2).run(None, {"x": x})
    np.testing.assert_array_equal(serial, parallel)
    np.testing.assert_allclose(serial, theirs, rtol=1e-5, atol=1e-5)


def test_zip_map_gives_one_dict_per_row_as_onnxruntime_does():
    from onnx_light.kernels.base import NodeContext
    from onnx_light.kernels.ml.features import ZipMap

    model = _model("ZipMap", [("x", F, [3, 2])], [("z", F, None)], classlabels_strings=["no", "yes"])
    scores = helper.make_map_type_proto(S, helper.make_tensor_type_proto(F, None))
    model.graph.output[0].CopyFrom(helper.make_value_info("z", helper.make_sequence_type_proto(scores)))
    x = RNG.random((3, 2)).astype(np.float32)
    (theirs,) = ort.InferenceSession(model.SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, {"x": x})
    kernel = ZipMap(NodeContext("zip", "ZipMap", ML, 1, {"classlabels_strings": ["no", "yes"]}, (F,)))
    (ours,) = kernel.run(x)
    assert [sorted(d) for d in ours] == [sorted(d) for d in theirs]
    for mine, peer in zip(ours, theirs, strict=True):
        np.testing.assert_allclose([mine[k] for k in ("no", "yes")], [peer[k] for k in ("no", "yes")])


def test_dict_vectorizer_takes_a_dict_feed_as_onnxruntime_does():
    model = _model("DictVectorizer", [("x", F, None)], [("y", F, None)],
                   string_vocabulary=["a", "b", "c"])
    model.graph.input[0].CopyFrom(helper.make_value_info(
        "x", helper.make_map_type_proto(S, helper.make_tensor_type_proto(F, None))))
    (ours,), (theirs,) = _both(model, {"x": {"c": 2.5, "a": -1.0, "zzz": 4.0}})
    np.testing.assert_array_equal(ours.reshape(theirs.shape), theirs)
    assert ours.dtype == np.float32 and ours.tolist() == [[-1.0, 0.0, 2.5]]


def test_the_tree_walk_compiles_once_for_fed_and_converted_inputs():
    """float64 feeds reach the walk read-only as they are, float32 ones converted: one type."""
    from onnx_light.kernels.ml.tree_walk import walk_rows

    x = np.array([[0.5, 1.0], [0.1, 3.0], [np.nan, 1.0], [0.3, 2.0], [0.0, np.nan]])
    for dtype in (np.float64, np.float32):
        RuntimeSession(_tree_ensemble_5(dtype)).run(None, {"x": x.astype(dtype)})
    RuntimeSession(_model("TreeEnsembleRegressor", [("x", F, [9, 3])], [("y", F, None)],
                          **_legacy_trees(target_treeids=[0], target_nodeids=[2], target_ids=[0],
                                          target_weights=[1.0]))).run(None, {"x": X_NAN})
    assert len(walk_rows.dispatcher.signatures) == 1


BAD_NODES = {
    "a loop": (_legacy_trees(nodes_truenodeids=[1, 0, 0, 0, 0, 0, 1, 0],
                             nodes_modes=["BRANCH_LEQ", "BRANCH_GT", "LEAF", "LEAF", "LEAF", "LEAF",
                                          "BRANCH_LT", "LEAF"]), "the trees' child links form a loop"),
    "a missing child": (_legacy_trees(nodes_falsenodeids=[9, 3, 0, 0, 0, 0, 2, 0]),
                        "a false child names node 9 of tree 0, which does not exist"),
    "an unknown mode": (_legacy_trees(nodes_modes=["BRANCH_LEQ", "BRANCH_SOMETIMES", "LEAF", "LEAF", "LEAF",
                                                   "LEAF", "BRANCH_LT", "LEAF"]),
                        "unknown node mode(s) ['BRANCH_SOMETIMES']; valid: ['BRANCH_LEQ', "
                        "'BRANCH_LT', 'BRANCH_GTE', 'BRANCH_GT', 'BRANCH_EQ', 'BRANCH_NEQ', 'LEAF']"),
    "a target out of range": (_legacy_trees(target_ids=[3]), "target_ids must lie in [0, 1), got [3]"),
}


@pytest.mark.parametrize("name", BAD_NODES)
def test_a_bad_tree_ensemble_is_refused_at_construction_naming_the_node(name):
    from onnx_light.kernels.base import NodeContext
    from onnx_light.kernels.ml.trees import TreeEnsembleRegressor

    attributes, message = BAD_NODES[name]
    attributes = {"target_treeids": [0], "target_nodeids": [2], "target_ids": [0],
                  "target_weights": [1.0], **attributes}
    with pytest.raises(KernelError) as info:
        TreeEnsembleRegressor(NodeContext("forest", "TreeEnsembleRegressor", ML, 3, attributes, (F,)))
    assert str(info.value) == f"node 'forest' (TreeEnsembleRegressor): {message}"


def test_bad_inputs_and_attributes_name_the_node():
    with pytest.raises(KernelError, match=r"node 'onehotencoder_node' \(OneHotEncoder\): category 9 "
                                          r"is not one of the categories \(zeros=0\)"):
        RuntimeSession(_model("OneHotEncoder", [("x", I64, [2])], [("y", F, None)], cats_int64s=[1, 2],
                              zeros=0)).run(None, {"x": np.array([1, 9], np.int64)})
    with pytest.raises(KernelError, match=r"norm must be one of \['MAX', 'L1', 'L2'\], got 'L3'"):
        RuntimeSession(_model("Normalizer", [("x", F, [2, 2])], [("y", F, None)], norm="L3"))
    with pytest.raises(KernelError, match="post_transform must be one of"):
        RuntimeSession(_model("LinearRegressor", [("x", F, [2, 2])], [("y", F, None)],
                              coefficients=[1.0, 2.0], post_transform="CUBIC"))
    with pytest.raises(KernelError, match=r"the trees read feature 2, the input has 1 feature\(s\)"):
        RuntimeSession(_model("TreeEnsembleRegressor", [("x", F, [None, 1])], [("y", F, None)],
                              **_legacy_trees(target_treeids=[0], target_nodeids=[2], target_ids=[0],
                                              target_weights=[1.0]))).run(
            None, {"x": np.zeros((2, 1), np.float32)})
