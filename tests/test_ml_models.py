"""scikit-learn models converted by skl2onnx, run through RuntimeSession (the ai.onnx.ml
kernels) and compared with scikit-learn's own predictions and with onnxruntime on the same
ONNX model: labels equal, probabilities and predictions within float32 tolerance.

The data are small and seeded (60 rows, 4 features), and so are the models (a few shallow
trees), to keep the file quick; classifiers are converted without ZipMap, but for one test
of its output, a list of dicts.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")
ort = pytest.importorskip("onnxruntime")
skl2onnx = pytest.importorskip("skl2onnx")

from sklearn.base import is_classifier  # noqa: E402
from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.ensemble import (  # noqa: E402
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import OneHotEncoder, StandardScaler  # noqa: E402
from sklearn.svm import SVC, SVR  # noqa: E402
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor  # noqa: E402

from onnx_light.runtime import RuntimeSession  # noqa: E402

RNG = np.random.default_rng(7)
X = RNG.standard_normal((60, 4)).astype(np.float32)
Y3 = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 0.7)  # three classes
Y2 = (X[:, 0] - X[:, 3] > 0).astype(np.int64)
YR = (X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1 * RNG.standard_normal(60)).astype(np.float32)


def _convert(model, x, zipmap=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = {id(model): {"zipmap": False}} if is_classifier(model) and not zipmap else None
        return skl2onnx.to_onnx(model, x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})


def _both(onnx_model, feeds):
    ours = RuntimeSession(onnx_model, num_threads=1).run(None, feeds)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    theirs = ort.InferenceSession(
        onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    return ours, theirs


CLASSIFIERS = {
    "scaler+logistic (3 classes)": (lambda: make_pipeline(StandardScaler(), LogisticRegression()), Y3),
    "scaler+logistic (binary)": (lambda: make_pipeline(StandardScaler(), LogisticRegression()), Y2),
    "random forest": (lambda: RandomForestClassifier(n_estimators=8, max_depth=4, random_state=0), Y3),
    "random forest (binary)": (
        lambda: RandomForestClassifier(n_estimators=8, max_depth=4, random_state=0),
        Y2,
    ),
    "gradient boosting (3 classes)": (
        lambda: GradientBoostingClassifier(n_estimators=10, max_depth=2, random_state=0),
        Y3,
    ),
    "gradient boosting (binary)": (
        lambda: GradientBoostingClassifier(n_estimators=10, max_depth=2, random_state=0),
        Y2,
    ),
    "scaler+gradient boosting (3 classes)": (
        lambda: make_pipeline(
            StandardScaler(), GradientBoostingClassifier(n_estimators=10, max_depth=2, random_state=0)
        ),
        Y3,
    ),
    "decision tree": (lambda: DecisionTreeClassifier(max_depth=5, random_state=0), Y3),
    "svc (rbf)": (lambda: SVC(random_state=0), Y3),
    "svc (linear, probabilities)": (lambda: SVC(kernel="linear", probability=True, random_state=0), Y3),
}


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_a_classifier_matches_scikit_learn_and_onnxruntime(name):
    build, y = CLASSIFIERS[name]
    with warnings.catch_warnings():  # scikit-learn 1.9 deprecates SVC(probability=True)
        warnings.simplefilter("ignore", FutureWarning)
        model = build().fit(X, y)
    onnx_model = _convert(model, X)
    (labels, scores), (ort_labels, ort_scores) = _both(onnx_model, {"X": X})
    np.testing.assert_array_equal(labels, ort_labels)
    np.testing.assert_array_equal(labels, model.predict(X))
    np.testing.assert_allclose(scores, ort_scores, rtol=1e-4, atol=1e-5)
    if hasattr(model, "predict_proba") and (not isinstance(model, SVC) or model.probability):
        # libsvm's probabilities are fitted by cross-validation; ONNX applies the fitted sigmoid
        tolerance = 2e-2 if isinstance(model, SVC) else 1e-5
        np.testing.assert_allclose(scores, model.predict_proba(X), atol=tolerance)


@pytest.mark.parametrize(("name", "y"), [("string labels", Y3.astype(str)), ("integer labels", Y2)])
def test_a_classifier_with_zipmap_gives_onnxruntimes_list_of_dicts(name, y):
    model = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
    onnx_model = _convert(model, X, zipmap=True)
    session = RuntimeSession(onnx_model, num_threads=1)
    ort_session = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [o.type for o in session.get_outputs()] == [o.type for o in ort_session.get_outputs()]
    (labels, rows), (ort_labels, ort_rows) = _both(onnx_model, {"X": X})
    np.testing.assert_array_equal(labels, ort_labels)
    assert isinstance(rows, list) and len(rows) == len(X)
    assert [sorted(row) for row in rows] == [sorted(row) for row in ort_rows]
    for row, ort_row in zip(rows, ort_rows, strict=True):
        np.testing.assert_allclose([row[k] for k in ort_row], list(ort_row.values()), rtol=1e-5, atol=1e-6)
    assert session.run(None, {"X": X})[1][0] is not rows[0]  # every run makes its own dicts


REGRESSORS = {
    "random forest": lambda: RandomForestRegressor(n_estimators=8, max_depth=4, random_state=0),
    "gradient boosting": lambda: GradientBoostingRegressor(n_estimators=10, max_depth=3, random_state=0),
    "decision tree": lambda: DecisionTreeRegressor(max_depth=5, random_state=0),
    "scaler+linear": lambda: make_pipeline(StandardScaler(), LinearRegression()),
    "scaler+gradient boosting": lambda: make_pipeline(
        StandardScaler(), GradientBoostingRegressor(n_estimators=10, max_depth=3, random_state=0)
    ),
    "svr": lambda: SVR(),
}


@pytest.mark.parametrize("name", REGRESSORS)
def test_a_regressor_matches_scikit_learn_and_onnxruntime(name):
    model = REGRESSORS[name]().fit(X, YR)
    onnx_model = _convert(model, X)
    (ours,), (theirs,) = _both(onnx_model, {"X": X})
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.reshape(-1), model.predict(X), rtol=1e-4, atol=1e-4)


def test_a_column_transformer_with_one_hot_encoding_matches():
    """One-hot encoded categories (int64 codes) beside scaled numbers, then a linear model."""
    categories = RNG.integers(0, 4, (60, 1)).astype(np.int64)
    target = (YR + categories[:, 0]).astype(np.float32)
    frame_columns = ColumnTransformer(
        [("onehot", OneHotEncoder(handle_unknown="ignore"), [0]), ("scale", StandardScaler(), [1, 2, 3, 4])]
    )
    data = np.hstack([categories, X]).astype(np.float32)
    model = make_pipeline(frame_columns, LinearRegression()).fit(data, target)
    onnx_model = _convert(model, data)
    (ours,), (theirs,) = _both(onnx_model, {"X": data})
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.reshape(-1), model.predict(data), rtol=1e-4, atol=1e-4)
