"""Kernels written with processor-specific vector code give the same results where the
processor lacks the instructions: numba compiles for a generic x86-64 target
(``NUMBA_CPU_NAME=generic``, in a subprocess with a compile cache of its own), so the portable
form of each intrinsic is what runs, the integer products without AMX tiles (and the float32
products with BLAS: the packed micro-kernel needs a target with AVX2 and FMA or AVX-512F),
checked against numpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import json
import numpy as np
from numba.core.registry import cpu_target
from onnx import TensorProto, helper, numpy_helper
from onnx_light import RuntimeSession
from onnx_light.kernels.byte_vectors import has_byte_dot_product
from onnx_light.kernels.compiled import load_numba
from onnx_light.kernels.tile_matrices import available


def run(nodes, feeds, inits, output_type=TensorProto.INT32, opset=13):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                     for n, v in feeds.items()],
        [helper.make_tensor_value_info("y", output_type, None)],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return RuntimeSession(model).run(None, feeds)[0]


rng = np.random.default_rng(3)
a = rng.integers(0, 256, (37, 70), dtype=np.uint8)
b = rng.integers(-128, 128, (70, 53), dtype=np.int8)
product = run([helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"])], {"a": a},
              {"b": b, "az": np.array(7, np.uint8)})
x = rng.integers(0, 256, (1, 16, 9, 11), dtype=np.uint8)
w = rng.integers(-128, 128, (24, 16, 3, 3), dtype=np.int8)
conv = run([helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], pads=[1, 1, 1, 1])], {"x": x},
           {"w": w, "xz": np.array(100, np.uint8)})
padded = np.pad(x.astype(np.int64) - 100, ((0, 0), (0, 0), (1, 1), (1, 1)))
windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
expected_conv = np.einsum("nchwij,kcij->nkhw", windows, w.astype(np.int64))
f = rng.standard_normal((40, 96)).astype(np.float32)
fw = rng.standard_normal((96, 80)).astype(np.float32)
fb = rng.standard_normal(80).astype(np.float32)
floats = run([helper.make_node("MatMul", ["f", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])],
             {"f": f}, {"w": fw, "b": fb}, TensorProto.FLOAT)
expected_floats = f.astype(np.float64) @ fw + fb
load_numba()
print(json.dumps({
    "floats": bool(np.allclose(floats, expected_floats, rtol=1e-5, atol=1e-4)),
    "vector_instructions": has_byte_dot_product(cpu_target.target_context.codegen()._tm_features),
    "tiles": available(),
    "product": bool(np.array_equal(product, (a.astype(np.int64) - 7) @ b.astype(np.int64))),
    "conv": bool(np.array_equal(conv, expected_conv)),
}))
"""


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "AMD64"), reason="an x86-64 target name")
def test_generic_x86_64_target_computes_the_same(tmp_path):
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "ONNX_LIGHT_NUMBA_CACHE": str(tmp_path),
           "PYTHONPATH": str(ROOT)}
    env.pop("NUMBA_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"floats": True, "vector_instructions": False, "tiles": False, "product": True,
                      "conv": True}
