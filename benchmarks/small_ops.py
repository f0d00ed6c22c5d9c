"""The small operators of quantized and mobile CNNs on one node, onnx_light against onnxruntime.

QLinearAdd (ResNet-50's and MobileNetV2's residual shapes, a per-channel operand), QLinearMul,
QLinearGlobalAveragePool (ResNet-50's head), QuantizeLinear (a float32 image to uint8),
ReduceMean over the spatial axes (ShuffleNetV2's head) and GlobalAveragePool (a squeeze-and-
excitation pool of MobileNetV3), each a one-node model run by an onnx_light
``RuntimeSession`` and an onnxruntime session (same ``--threads``, no spinning), interleaved
round by round in this one process, medians; the table counts the output values that differ
from onnxruntime's (the float means: beyond 1e-6). To compare with an earlier commit, run
this script with ``PYTHONPATH`` pointing at that commit's tree (``git archive REF | tar -x -C
DIR``): it uses only the public session API.

Run: ``python benchmarks/small_ops.py [--threads 1] [--rounds 15]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import onnx
from _common import Table, interleaved, load_average, onnxruntime_session
from contrib_models import one_node
from onnx import helper

from onnx_light import RuntimeSession

Case = tuple[str, onnx.ModelProto, dict[str, np.ndarray]]
NAMES = ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "c_scale", "c_zero"]


def _bytes(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.integers(0, 256, shape).astype(np.uint8)


def _binary(op_type: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...],
            rng: np.random.Generator) -> Case:
    feeds = {"a": _bytes(rng, *a_shape), "b": _bytes(rng, *b_shape)}
    constants = {"a_scale": np.float32(0.02), "a_zero": np.uint8(128), "b_scale": np.float32(0.03),
                 "b_zero": np.uint8(120), "c_scale": np.float32(0.05 if op_type == "QLinearAdd" else 0.4),
                 "c_zero": np.uint8(110)}
    name = f"{op_type} {'x'.join(map(str, a_shape))} + {'x'.join(map(str, b_shape))}"
    return name, one_node(op_type, feeds, constants, NAMES, [np.uint8]), feeds


def _float_node(op_type: str, shape: tuple[int, ...], rng: np.random.Generator,
                inputs: dict[str, np.ndarray], output_type: int, **attributes: object) -> Case:
    """A one-node model of the default domain on a float32 ``x`` of ``shape`` plus constant ``inputs``."""
    x = rng.standard_normal(shape).astype(np.float32)
    node = helper.make_node(op_type, ["x", *inputs], ["y"], **attributes)
    graph = helper.make_graph([node], op_type,
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", output_type, None)],
                              [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inputs.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return f"{op_type} {'x'.join(map(str, shape))}", model, {"x": x}


def cases(rng: np.random.Generator) -> list[Case]:
    pool_feeds = {"x": _bytes(rng, 1, 2048, 7, 7)}
    pool_constants = {"x_scale": np.float32(0.02), "x_zero": np.uint8(3), "y_scale": np.float32(0.01),
                      "y_zero": np.uint8(0)}
    return [
        _binary("QLinearAdd", (1, 256, 56, 56), (1, 256, 56, 56), rng),
        _binary("QLinearAdd", (1, 24, 56, 56), (1, 24, 56, 56), rng),
        _binary("QLinearAdd", (1, 64, 56, 56), (1, 64, 1, 1), rng),
        _binary("QLinearMul", (1, 96, 28, 28), (1, 96, 28, 28), rng),
        ("QLinearGlobalAveragePool 1x2048x7x7",
         one_node("QLinearGlobalAveragePool", pool_feeds, pool_constants,
                  ["x", "x_scale", "x_zero", "y_scale", "y_zero"], [np.uint8]), pool_feeds),
        _float_node("QuantizeLinear", (1, 3, 224, 224), rng,
                    {"scale": np.float32(0.0186), "zero": np.uint8(114)}, onnx.TensorProto.UINT8),
        _float_node("ReduceMean", (1, 1024, 7, 7), rng, {"axes": np.array([2, 3], np.int64)},
                    onnx.TensorProto.FLOAT, keepdims=0),
        _float_node("GlobalAveragePool", (1, 576, 7, 7), rng, {}, onnx.TensorProto.FLOAT),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sample", type=float, default=0.05, help="seconds per sample")
    args = parser.parse_args(argv)
    groups: dict[str, dict[str, Callable[[], object]]] = {}
    differing: dict[str, int] = {}
    for name, model, feeds in cases(np.random.default_rng(0)):
        ours = RuntimeSession(model, num_threads=args.threads)
        theirs = onnxruntime_session(model, args.threads)
        expected, actual = theirs.run(None, feeds)[0], ours.run(None, feeds)[0]
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, name
        if expected.dtype.kind == "f":
            differing[name] = int(np.count_nonzero(~np.isclose(actual, expected, rtol=1e-6, atol=1e-6)))
        else:
            differing[name] = int(np.count_nonzero(actual != expected))
        groups[name] = {"onnx_light": lambda s=ours, f=feeds: s.run(None, f),
                        "onnxruntime": lambda s=theirs, f=feeds: s.run(None, f)}
    start = load_average()
    medians = interleaved(groups, args.rounds, args.sample)
    print(f"# Small operators, one node; {args.threads} thread(s); load average {start:.2f} at the start, "
          f"{load_average():.2f} at the end; {args.rounds} interleaved rounds")
    print()
    ratio = "onnx_light / onnxruntime"
    table = Table("Median run time:",
                  ["node", "onnx_light (ms)", "onnxruntime (ms)", ratio, "values differing"], ratios=(ratio,))
    for name, m in medians.items():
        table.add(name, m["onnx_light"] * 1e3, m["onnxruntime"] * 1e3, m["onnx_light"] / m["onnxruntime"],
                  differing[name])
    print(table.markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
