"""Quantized inference in onnx_light against onnxruntime: the integer products one node each,
and int8 models made by onnxruntime's quantizer, at 1 and 2 threads, side by side in one run.

Each round times every runtime once per case, in turn (the best of ``--rounds`` is kept). The
node cases are MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv on shapes of real
layers; the model cases are ``quantized_models``' CNN (static QDQ, per channel, and dynamic)
and encoder-shaped MatMul stack (static QDQ; the MLP part dynamic), at a larger size than the
tests use, with onnx_light's time for the float model beside them (what int8 has to beat). The
last column is the largest difference of the outputs, in steps of the output scale for
quantized outputs (0: bit-for-bit) and absolute for float ones. onnx_light uses the portable
defaults of its integer products (``product.algorithm`` ``auto``: docs/quantization.md), so
AMX tiles where the processor has them, else the byte dot-product kernel where it has VNNI,
else the int16 pairs kernel; the "byte kernel" column is the same session on the byte
dot-product kernel (``packed``: VNNI's ``vpdpbusd``, or its portable vector code where the
processor lacks it, what ran before the pairs kernel), shown where ``auto`` is another.

Run: ``python benchmarks/quantized_products.py [--threads 1 2] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np
import onnx
import quantized_models
from _common import onnxruntime_session
from onnx import TensorProto, helper, numpy_helper

from onnx_light.kernels import byte_vectors, tile_matrices
from onnx_light.kernels.integer_gemm import packed_layout
from onnx_light.runtime.session import RuntimeSession

RNG = np.random.default_rng(0)


def _bytes(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


def _node_model(op: str, inputs: list[str], x: np.ndarray, y_type: int,
                constants: dict[str, np.ndarray], **attributes: object) -> onnx.ModelProto:
    node = helper.make_node(op, inputs, ["y"], **attributes)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
        [helper.make_tensor_value_info("y", y_type, None)],
        [numpy_helper.from_array(np.asarray(v), name) for name, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


# (name, model, input, output step (0: not quantized), float model or None)
Case = tuple[str, onnx.ModelProto, np.ndarray, float, onnx.ModelProto | None]


def node_cases() -> list[Case]:
    """The four products on a transformer projection, two ResNet-50 convolutions and a
    MobileNetV2 depthwise one."""
    b, x = _bytes(np.int8, (768, 768)), _bytes(np.uint8, (128, 768))
    scales = {"as": np.float32(0.02), "az": np.uint8(3), "bs": np.float32(0.01), "bz": np.int8(0),
              "ys": np.float32(2.0), "yz": np.uint8(128)}
    cases: list[Case] = [
        ("MatMulInteger 128x768 @ 768x768", _node_model(
            "MatMulInteger", ["x", "b", "az", "bz"], x, TensorProto.INT32, {"b": b, "az": scales["az"],
                                                                            "bz": scales["bz"]}), x, 0, None),
        ("QLinearMatMul 128x768 @ 768x768", _node_model(
            "QLinearMatMul", ["x", "as", "az", "b", "bs", "bz", "ys", "yz"], x, TensorProto.UINT8,
            {**scales, "b": b}), x, 1, None),
    ]
    for label, channels, size, kernel, filters, group in (
            ("3x3", 64, 56, 3, 64, 1), ("1x1", 256, 28, 1, 64, 1), ("3x3 depthwise", 144, 56, 3, 144, 144)):
        w = _bytes(np.int8, (filters, channels // group, kernel, kernel))
        image = _bytes(np.uint8, (1, channels, size, size))
        attributes = {"pads": [kernel // 2] * 4, "group": group}
        shape = f"1x{channels}x{size}x{size}, {filters}x{channels // group}x{label}"
        if group == 1:
            cases.append((f"ConvInteger {shape}", _node_model(
                "ConvInteger", ["x", "w", "xz", "wz"], image, TensorProto.INT32,
                {"w": w, "xz": np.uint8(128), "wz": np.int8(0)}, **attributes), image, 0, None))
        cases.append((f"QLinearConv {shape}", _node_model(
            "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], image, TensorProto.UINT8,
            {"xs": np.float32(0.02), "xz": np.uint8(128), "w": w,
             "ws": RNG.uniform(0.005, 0.02, filters).astype(np.float32),
             "wz": np.zeros(filters, np.int8), "ys": np.float32(0.5), "yz": np.uint8(100)}, **attributes),
            image, 1, None))
    return cases


def model_cases(folder: Path) -> list[Case]:
    """The quantized models (made here, in ``folder``) with their float originals."""
    made = [("CNN 32x64x64 static QDQ", quantized_models.cnn(RNG, channels=32, size=64), "static"),
            ("CNN 32x64x64 dynamic", quantized_models.cnn(RNG, channels=32, size=64), "dynamic"),
            ("encoder 128x256 static QDQ", quantized_models.transformer(RNG, tokens=128, width=256),
             "static"),
            ("MLP 128x256 dynamic", quantized_models.transformer(RNG, tokens=128, width=256,
                                                                   attention=False), "dynamic")]
    cases: list[Case] = []
    for index, (name, model, mode) in enumerate(made):
        model.graph.name = f"{model.graph.name}{index}"
        path = quantized_models.quantize(model, folder, mode)
        quantized = onnx.load(path)
        x = quantized_models.calibration_samples(model, 1, seed=3)[0]
        last = quantized.graph.node[-1]
        step = 0.0
        if last.op_type == "DequantizeLinear":
            step = float(next(numpy_helper.to_array(i) for i in quantized.graph.initializer
                              if i.name == last.input[1]))
        cases.append((name, quantized, x, step, model))
    return cases


def _best(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for key, run in runs.items():
            start = time.perf_counter()
            run()
            best[key] = min(best[key], time.perf_counter() - start)
    return best


def row(case: Case, threads: int, rounds: int) -> str:
    """One case's table row at one thread count."""
    name, model, x, step, float_model = case
    ours = RuntimeSession(model, num_threads=threads)
    theirs = onnxruntime_session(model, threads)
    runs: dict[str, Callable[[], object]] = {"ours": lambda: ours.run(None, {"x": x}),
                                             "theirs": lambda: theirs.run(None, {"x": x})}
    if packed_layout("auto") != "packed":
        with mock.patch.object(tile_matrices, "available", lambda: False), \
                mock.patch.object(byte_vectors, "available", lambda: True):
            byte_kernel = RuntimeSession(model, num_threads=threads)
            byte_kernel.run(None, {"x": x})  # the contrib products pack B at their first run
        runs["bytes"] = lambda: byte_kernel.run(None, {"x": x})
    if float_model is not None:
        ours_float = RuntimeSession(float_model, num_threads=threads)
        runs["float"] = lambda: ours_float.run(None, {"x": x})
    best = _best(runs, rounds)
    mine, reference = ours.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0]
    difference = float(np.abs(mine.astype(np.float64) - reference.astype(np.float64)).max())
    shown = f"{difference / step:.0f} steps" if step and mine.dtype.kind == "f" else f"{difference:.3g}"
    float_ms = f"{best['float'] * 1e3:.2f}" if "float" in best else "-"
    bytes_ms = f"{best['bytes'] * 1e3:.2f}" if "bytes" in best else "-"
    return (f"| {name} | {threads} | {best['ours'] * 1e3:.2f} | {bytes_ms} | {best['theirs'] * 1e3:.2f} | "
            f"{best['ours'] / best['theirs']:.1f} | {float_ms} | {shown} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    print(f"packed layout of 'auto' here: {packed_layout('auto')}")
    print("| case | threads | onnx_light (ms) | onnx_light byte kernel (ms) | onnxruntime (ms) | "
          "onnx_light / onnxruntime | onnx_light float model (ms) | max output difference |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for case in (*node_cases(), *model_cases(Path(folder))):
            for threads in args.threads:
                print(row(case, threads, args.rounds), flush=True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
