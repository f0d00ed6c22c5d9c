"""Smoke tests of the whole-model benchmark scripts ``benchmarks/conv_settings.py`` and
``benchmarks/blas_floor.py``: their parsing, their registries, the products they time, and one
tiny run each (no timing is asserted: the rows must be there with positive finite numbers)."""

from __future__ import annotations

import importlib
import math
import re
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto

from onnx_light.kernels import conv
from onnx_light.tuning.processor import execution_descriptor
from onnx_light.tuning.schema import UnknownParameterError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
pytest.importorskip("onnxruntime")
# _common first: it imports real_models without letting real_models move the default cache
real_models = importlib.import_module("_common").real_models
blas_floor = importlib.import_module("blas_floor")
conv_settings = importlib.import_module("conv_settings")

NUMBER = re.compile(r"(\d+\.\d+) \((\d+\.\d+)\)")


def test_settings_parse_into_typed_values_and_session_options():
    assert conv_settings.parse_setting("") == ({}, {})
    assert conv_settings.parse_setting("im2col.block_bytes=2097152,algorithm=im2col") == (
        {"im2col.block_bytes": 2097152, "algorithm": "im2col"}, {})
    assert conv_settings.parse_setting("branches=off, fuse=On,algorithm=im2col") == (
        {"algorithm": "im2col"}, {"branches": False, "fuse": True})
    with pytest.raises(SystemExit, match="'block' is not name=value"):
        conv_settings.parse_setting("algorithm=auto,block")
    with pytest.raises(SystemExit, match="branches takes on or off, got 'maybe'"):
        conv_settings.parse_setting("branches=maybe")


def test_a_setting_is_published_for_conv_float_only():
    registry = conv_settings.registry_with({conv.BLOCK_BYTES: 1 << 20}, 2)
    snapshot, local = registry.snapshot(), execution_descriptor(2)
    floats = snapshot.resolve(conv.conv_schema(TensorProto.FLOAT).key, local).values
    assert floats[conv.BLOCK_BYTES] == 1 << 20
    double = snapshot.resolve(conv.conv_schema(TensorProto.DOUBLE).key, local).values
    assert double[conv.BLOCK_BYTES] == conv.conv_schema(TensorProto.DOUBLE).defaults[conv.BLOCK_BYTES]
    with pytest.raises(UnknownParameterError, match=r"'im2col\.block'"):
        conv_settings.registry_with({"im2col.block": 1}, 2)


def test_the_floor_times_one_product_per_convolution():
    model = real_models.with_random_weights(onnx.load(real_models.model_path("squeezenet")))
    products = blas_floor.conv_products(model)
    assert len(products) == sum(node.op_type == "Conv" for node in model.graph.node)
    first = next(node for node in model.graph.node if node.op_type == "Conv")
    weights = next(i for i in model.graph.initializer if i.name == first.input[1])
    groups, filters, depth, positions = products[0]
    assert (groups, filters, depth) == (1, weights.dims[0], math.prod(weights.dims[1:]))
    assert positions == 111 * 111  # 224x224 input, 3x3 stride 2, no padding


def _rows(output: str, name: str) -> list[list[float]]:
    rows = [[float(v) for pair in NUMBER.findall(line) for v in pair]
            for line in output.splitlines() if line.startswith(name)]
    assert rows and all(values and all(v > 0 and math.isfinite(v) for v in values) for values in rows)
    return rows


def test_conv_settings_prints_a_row_per_setting_and_onnxruntime(capsys):
    conv_settings.main(["--models", "squeezenet", "--rounds", "1", "--setting", "",
                        "--setting", "im2col.block_bytes=2097152,branches=off"])
    output = capsys.readouterr().out
    rows = _rows(output, "squeezenet")
    assert len(rows) == 3 and "(portable)" in output and "onnxruntime" in output


def test_blas_floor_prints_a_row_per_thread_count(capsys):
    blas_floor.main(["--models", "squeezenet", "--rounds", "1", "--threads", "2"])
    assert len(_rows(capsys.readouterr().out, "squeezenet")) == 2
