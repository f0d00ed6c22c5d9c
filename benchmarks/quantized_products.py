"""The integer products (MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv) of onnx_light
against onnxruntime, one node each, side by side in one run.

Each round times every runtime once per case, in turn (the best of ``--rounds``); the
table gives both times, their ratio and the largest difference of the outputs (0 for the
exact int32 products; the QLinear outputs may differ by one step of the output scale, which
onnxruntime's fixed-point requantization rounds otherwise). The "float64 BLAS" column times
numpy's float64 product of the same shifted operands: exact too for int8 operands (each sum
stays far below 2**53), and the measure of what a BLAS path would gain over numpy's integer
loop, which onnx_light uses.

Run: ``python benchmarks/quantized_products.py [--threads 1] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import onnx
from _common import onnxruntime_session
from onnx import TensorProto, helper, numpy_helper

from onnx_light.runtime.session import RuntimeSession

RNG = np.random.default_rng(0)


def _bytes(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


def _model(op: str, inputs: list[str], x_shape: tuple[int, ...], y_type: int,
           constants: dict[str, np.ndarray], **attributes: object) -> onnx.ModelProto:
    node = helper.make_node(op, inputs, ["y"], **attributes)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("x", TensorProto.UINT8, x_shape)],
        [helper.make_tensor_value_info("y", y_type, None)],
        [numpy_helper.from_array(np.asarray(v), name) for name, v in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def cases() -> list[tuple[str, onnx.ModelProto, np.ndarray, Callable[[np.ndarray], object]]]:
    """(name, model, input, the float64 BLAS product of the same operands)."""
    b = _bytes(np.int8, (768, 768))
    x = _bytes(np.uint8, (128, 768))
    matmul = _model("MatMulInteger", ["x", "b", "az", "bz"], x.shape, TensorProto.INT32,
                    {"b": b, "az": np.uint8(3), "bz": np.int8(0)})
    qmatmul = _model("QLinearMatMul", ["x", "as", "az", "b", "bs", "bz", "ys", "yz"], x.shape,
                     TensorProto.UINT8, {"as": np.float32(0.02), "az": np.uint8(3), "b": b,
                                         "bs": np.float32(0.01), "bz": np.int8(0),
                                         "ys": np.float32(2.0), "yz": np.uint8(128)})
    b64 = b.astype(np.float64)

    def blas_matmul(v: np.ndarray) -> object:
        return (v.astype(np.float64) - 3) @ b64

    w = _bytes(np.int8, (64, 64, 3, 3))
    image = _bytes(np.uint8, (1, 64, 56, 56))
    conv = _model("ConvInteger", ["x", "w", "xz", "wz"], image.shape, TensorProto.INT32,
                  {"w": w, "xz": np.uint8(128), "wz": np.int8(0)}, pads=[1, 1, 1, 1])
    qconv = _model("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], image.shape,
                   TensorProto.UINT8, {"xs": np.float32(0.02), "xz": np.uint8(128), "w": w,
                                       "ws": np.full(64, 0.01, np.float32), "wz": np.zeros(64, np.int8),
                                       "ys": np.float32(0.5), "yz": np.uint8(100)}, pads=[1, 1, 1, 1])
    w64 = w.reshape(64, -1).astype(np.float64)

    def blas_conv(v: np.ndarray) -> object:
        padded = np.pad(v[0].astype(np.float64) - 128, ((0, 0), (1, 1), (1, 1)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))
        return w64 @ windows.transpose(0, 3, 4, 1, 2).reshape(64 * 9, -1)

    return [("MatMulInteger 128x768 @ 768x768", matmul, x, blas_matmul),
            ("QLinearMatMul 128x768 @ 768x768", qmatmul, x, blas_matmul),
            ("ConvInteger 1x64x56x56, 64x64x3x3", conv, image, blas_conv),
            ("QLinearConv 1x64x56x56, 64x64x3x3", qconv, image, blas_conv)]


def row(name: str, model: onnx.ModelProto, x: np.ndarray, blas: Callable[[np.ndarray], object],
        threads: int, rounds: int) -> str:
    """One case's table row: the best time of each runtime over interleaved rounds."""
    ours = RuntimeSession(model, num_threads=threads)
    theirs = onnxruntime_session(model, threads)
    runs = {"ours": lambda: ours.run(None, {"x": x}), "theirs": lambda: theirs.run(None, {"x": x}),
            "blas": lambda: blas(x)}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for key, run in runs.items():
            start = time.perf_counter()
            run()
            best[key] = min(best[key], time.perf_counter() - start)
    difference = np.abs(runs["ours"]()[0].astype(np.int64) - runs["theirs"]()[0].astype(np.int64)).max()
    return (f"| {name} | {best['ours'] * 1e3:.2f} | {best['theirs'] * 1e3:.2f} | "
            f"{best['ours'] / best['theirs']:.0f} | {best['blas'] * 1e3:.2f} | {difference} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("| case | onnx_light (ms) | onnxruntime (ms) | onnx_light / onnxruntime | "
          "float64 BLAS (ms) | max output difference |")
    print("|---|---|---|---|---|---|")
    for case in cases():
        print(row(*case, args.threads, args.rounds))


if __name__ == "__main__":
    main()
