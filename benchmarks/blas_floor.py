"""What BLAS alone needs for a model's convolutions, against whole runs of onnx_light and
onnxruntime, side by side, in one run.

For each Conv of a light model (shapes from ONNX shape inference, batch 1) the script times
the matrix product an im2col convolution makes: filters x (channels/group * kernel size)
times (channels/group * kernel size) x output positions, once per group, with numpy's BLAS
on one thread and on ``--threads`` BLAS threads, on random data. The sum is the floor of any
convolution path built on that BLAS product (copies, transforms and Python cost come on
top); Winograd (``algorithm=winograd``) goes below it by making fewer products. The table
sets it beside onnx_light's and onnxruntime's whole-model medians at 1 and ``--threads``
threads (random weights, the interleaved rounds of ``real_models.Rounds``).

Run: ``python benchmarks/blas_floor.py --models resnet50 vgg19 [--threads 2] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time

import numpy as np
import onnx
from real_models import MODELS, Rounds, model_input, model_path, onnxruntime_session, with_random_weights

from onnx_light.parallel import BLAS
from onnx_light.runtime.session import RuntimeSession

MAX_RETAKES = 3  # rounds retaken per model when other processes disturbed them


def conv_products(model: onnx.ModelProto) -> list[tuple[int, int, int, int]]:
    """(groups, M, K, N) of each Conv's im2col product, batch 1."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = [d.dim_value for d in dims]
    for initializer in model.graph.initializer:
        shapes[initializer.name] = list(initializer.dims)
    products = []
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        w, y = shapes[node.input[1]], shapes[node.output[0]]
        products.append((group, w[0] // group, math.prod(w[1:]), math.prod(y[2:])))
    return products


def product_seconds(products: list[tuple[int, int, int, int]], threads: int, rounds: int) -> float:
    """Median over ``rounds`` of the summed time of every product on ``threads`` BLAS threads."""
    rng = np.random.default_rng(0)
    operands = [(rng.random((g, m, k), np.float32), rng.random((g, k, n), np.float32))
                for g, m, k, n in products]
    totals = []
    with BLAS.scope(threads):
        for _ in range(rounds + 1):
            started = time.perf_counter()
            for a, b in operands:
                np.matmul(a, b)
            totals.append(time.perf_counter() - started)
    return float(np.median(totals[1:]))


def whole_runs(model: onnx.ModelProto, threads: int, rounds: int) -> dict[str, float]:
    """Medians of onnx_light and onnxruntime runs at ``threads``, interleaved."""
    input_name, x = model_input(model)
    feeds = {input_name: x}
    runs = {"onnx_light": RuntimeSession(model, num_threads=threads).run,
            "onnxruntime": onnxruntime_session(model, threads).run}
    samples = Rounds(MAX_RETAKES).run([functools.partial(run, None, feeds) for run in runs.values()],
                                      rounds)
    return {name: float(np.median(times)) for name, times in zip(runs, samples, strict=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["resnet50", "vgg19"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print("median ms; ratio = time / onnxruntime's at the same thread count")
    print(f"{'model':<14} {'threads':>7} {'GFLOP':>6} {'BLAS floor':>16} {'onnx_light':>16} "
          f"{'onnxruntime':>11}")
    for name in args.models:
        model = with_random_weights(onnx.load(model_path(name)))
        products = conv_products(model)
        flops = 2 * sum(g * m * k * n for g, m, k, n in products) / 1e9
        for threads in sorted({1, args.threads}):
            floor = product_seconds(products, threads, args.rounds)
            whole = whole_runs(model, threads, args.rounds)
            peer = whole["onnxruntime"]
            print(f"{name:<14} {threads:>7} {flops:6.2f} {floor * 1e3:9.1f} ({floor / peer:4.2f}) "
                  f"{whole['onnx_light'] * 1e3:9.1f} ({whole['onnx_light'] / peer:4.2f}) "
                  f"{peer * 1e3:11.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
