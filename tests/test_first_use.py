"""First use: what ``import onnx_light`` loads, the package's version, and the tables that spare
the import of onnx."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest
from onnx import TensorProto, helper

import onnx_light
from onnx_light.kernels.base import item_size, numpy_dtype
from onnx_light.tuning.keys import ELEMENT_TYPE_CODES, ElementType

HEAVY = ("onnx", "ml_dtypes", "numba", "google.protobuf", "onnx_light.runtime", "ray", "onnx_light.fleet")


def modules_after(statement: str) -> dict[str, bool]:
    """Which of HEAVY a fresh interpreter has imported after running ``statement``."""
    probe = f"import sys, json\n{statement}\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_loads_neither_onnx_nor_ml_dtypes_nor_numba_nor_ray() -> None:
    loaded = modules_after("import onnx_light")
    assert not any(loaded.values()), loaded


def test_the_runtime_is_imported_on_first_use() -> None:
    loaded = modules_after("import onnx_light\nonnx_light.RuntimeSession")
    assert loaded["onnx"] and loaded["onnx_light.runtime"], loaded
    assert onnx_light.RuntimeSession is onnx_light.runtime.RuntimeSession
    assert "RuntimeSession" in dir(onnx_light) and "hold_freed_memory" in dir(onnx_light)


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'InferenceSesion'"):
        onnx_light.InferenceSesion  # noqa: B018


def test_element_type_codes_are_onnx_s() -> None:
    """Every element type the installed onnx defines has its code here (older onnx may define fewer)."""
    theirs = dict(TensorProto.DataType.items())
    assert {name: ELEMENT_TYPE_CODES.get(name) for name in theirs} == theirs
    assert ElementType.FLOAT8E8M0 == TensorProto.FLOAT8E8M0


@pytest.mark.parametrize("name", sorted(set(ELEMENT_TYPE_CODES) - {"UNDEFINED"}))
def test_item_size_is_numpy_s(name: str) -> None:
    code = ELEMENT_TYPE_CODES[name]
    if code not in helper.get_all_tensor_dtypes():
        pytest.skip(f"the installed onnx does not define {name}")
    assert item_size(code) == numpy_dtype(code).itemsize


def test_version_is_the_installed_distribution_s() -> None:
    assert onnx_light.__version__ == importlib.metadata.version("onnx_light")


def test_cli_prints_the_version() -> None:
    done = subprocess.run([sys.executable, "-m", "onnx_light", "--version"], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.split() == ["onnx_light", onnx_light.__version__]
