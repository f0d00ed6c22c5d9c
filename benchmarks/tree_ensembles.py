"""Tree ensembles of scikit-learn, converted by skl2onnx: onnx_light against onnxruntime.

A random forest (100 trees, depth up to 12, 20 features) as classifier and regressor and a
gradient-boosted classifier (100 stages, depth 3), run on 1000 random rows, in one process:
the runtimes' runs are interleaved round after round (``_common.interleaved``), at the same
thread count, and the table gives the median milliseconds per run and their ratio. The
session's construction, which compiles the tree walk on the first use of an empty numba
cache, is timed apart (once per runtime).

Run: ``python benchmarks/tree_ensembles.py [--threads 1 2] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from _common import interleaved, load_average, onnxruntime_session

from onnx_light.runtime.session import RuntimeSession


def models(rows: int, features: int) -> dict[str, tuple[object, np.ndarray]]:
    """Name -> (ONNX model, input rows): the forests fitted on random data."""
    import skl2onnx
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier, RandomForestRegressor

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, features)).astype(np.float32)
    labels = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(np.int64) + (x[:, 3] > 1)
    target = (x[:, :5] @ rng.standard_normal(5) + np.sin(x[:, 5])).astype(np.float32)
    fitted = {
        "random forest classifier": RandomForestClassifier(100, max_depth=12, random_state=0).fit(x, labels),
        "random forest regressor": RandomForestRegressor(100, max_depth=12, random_state=0).fit(x, target),
        "gradient boosting classifier": GradientBoostingClassifier(n_estimators=100, max_depth=3,
                                                                   random_state=0).fit(x, labels),
    }
    rows_x = rng.standard_normal((rows, features)).astype(np.float32)
    converted = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, model in fitted.items():
            options = {id(model): {"zipmap": False}} if "classifier" in name else None
            converted[name] = (skl2onnx.to_onnx(model, x[:1], options=options,
                                                target_opset={"": 17, "ai.onnx.ml": 3}), rows_x)
    return converted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()
    cases = models(args.rows, 20)
    print(f"load average at start: {load_average()}")
    print("| model | threads | construction onnx_light (ms) | construction onnxruntime (ms) | "
          "onnx_light (ms) | onnxruntime (ms) | onnx_light / onnxruntime | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for threads in args.threads:
        for name, (model, x) in cases.items():
            started = time.perf_counter()
            ours = RuntimeSession(model, num_threads=threads)
            built = time.perf_counter() - started
            started = time.perf_counter()
            theirs = onnxruntime_session(model, threads)
            peer_built = time.perf_counter() - started
            feeds = {"X": x}
            difference = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                             for a, b in zip(ours.run(None, feeds), theirs.run(None, feeds), strict=True))
            times = interleaved({name: {"onnx_light": lambda s=ours, f=feeds: s.run(None, f),
                                        "onnxruntime": lambda s=theirs, f=feeds: s.run(None, f)}},
                                args.rounds, 0.2)[name]
            print(f"| {name} | {threads} | {1e3 * built:.0f} | {1e3 * peer_built:.0f} | "
                  f"{1e3 * times['onnx_light']:.2f} | {1e3 * times['onnxruntime']:.2f} | "
                  f"{times['onnx_light'] / times['onnxruntime']:.2f} | {difference:.1e} |")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
