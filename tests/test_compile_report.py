"""The first construction with numba's cache empty reports its compile time; later ones compile nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A model whose construction compiles one kernel function (the small MatMul with its bias).
SCRIPT = """
import json, logging, sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx_light import RuntimeSession

records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("onnx_light").addHandler(handler)
logging.getLogger("onnx_light").setLevel(logging.INFO)
w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
b = numpy_helper.from_array(np.ones(3, np.float32), "b")
graph = helper.make_graph(
    [helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])], "g",
    [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w, b])
session = RuntimeSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
(y,) = session.run(None, {"a": np.ones((2, 4), np.float32)})
assert np.array_equal(y, np.full((2, 3), 5, np.float32))
print(json.dumps({"count": session.compiled_functions, "seconds": session.compile_seconds,
                  "messages": [(r.levelname, r.getMessage()) for r in records]}))
"""


def _construct(cache: Path) -> dict:
    env = {**os.environ, "ONNX_LIGHT_NUMBA_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("NUMBA_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_first_construction_with_an_empty_cache_reports_its_compile_time(tmp_path):
    first = _construct(tmp_path)
    assert first["count"] >= 1 and first["seconds"] > 0
    ((level, message),) = first["messages"]
    assert level in ("INFO", "WARNING") and "compiled" in message and str(tmp_path) in message
    second = _construct(tmp_path)  # loads what the first one cached
    assert second == {"count": 0, "seconds": 0.0, "messages": []}
