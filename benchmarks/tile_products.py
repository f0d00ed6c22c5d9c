"""The model zoo's int8 networks with onnx_light's integer products on AMX tiles (the ``amx``
default where the processor has them), on the byte dot-product kernel (the tiles off:
``packed``) and onnxruntime, side by side in one process, interleaved rounds; medians and
bests in milliseconds, and each over onnxruntime's.

The models are the zoo's cached exports (``python benchmarks/model_zoo.py --models
resnet50_int8 --export-only`` makes them): this script only times them.

    PYTHONPATH=. python benchmarks/tile_products.py [--models resnet50_int8 mobilenet_v2_int8]
        [--threads 1] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from unittest import mock

import numpy as np
import onnx
from _common import onnxruntime_session
from model_zoo import default_cache_dir

from onnx_light.kernels import tile_matrices
from onnx_light.runtime import RuntimeSession


def _sessions(model: onnx.ModelProto, threads: int, feeds: dict[str, np.ndarray]
              ) -> dict[str, Callable[[], object]]:
    tiles = RuntimeSession(model, num_threads=threads)
    with mock.patch.object(tile_matrices, "available", lambda: False):
        vnni = RuntimeSession(model, num_threads=threads)
    ort = onnxruntime_session(model, threads)
    return {"amx": lambda: tiles.run(None, feeds), "vnni": lambda: vnni.run(None, feeds),
            "ort": lambda: ort.run(None, feeds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50_int8", "mobilenet_v2_int8"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    if not tile_matrices.available():
        raise SystemExit("no AMX-INT8 tiles here: nothing to compare")
    print(f"load average {os.getloadavg()}")
    print("| model | threads | amx median (ms) | VNNI median (ms) | onnxruntime median (ms) | amx / ort "
          "| VNNI / ort | amx best | VNNI best | ort best | amx / ort (best) | VNNI / ort (best) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        paths = sorted(default_cache_dir().glob(f"{name}-*.onnx"))
        if not paths:
            raise SystemExit(f"{name} is not in {default_cache_dir()}: export it with model_zoo.py")
        model = onnx.load(paths[-1])
        shape = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
        image = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        feeds = {model.graph.input[0].name: image}
        for threads in args.threads:
            runs = _sessions(model, threads, feeds)
            outputs = {key: run()[0] for key, run in runs.items()}
            assert np.array_equal(outputs["amx"], outputs["vnni"]), "the tiles changed an output"
            samples: dict[str, list[float]] = {key: [] for key in runs}
            for r in range(args.rounds):
                keys = list(runs)
                for key in keys[r % 3:] + keys[:r % 3]:
                    start = time.perf_counter()
                    runs[key]()
                    samples[key].append((time.perf_counter() - start) * 1e3)
            med = {key: statistics.median(v) for key, v in samples.items()}
            best = {key: min(v) for key, v in samples.items()}
            print(f"| {name} | {threads} | {med['amx']:.1f} | {med['vnni']:.1f} | {med['ort']:.1f} | "
                  f"{med['amx'] / med['ort']:.2f} | {med['vnni'] / med['ort']:.2f} | {best['amx']:.1f} | "
                  f"{best['vnni']:.1f} | {best['ort']:.1f} | {best['amx'] / best['ort']:.2f} | "
                  f"{best['vnni'] / best['ort']:.2f} |", flush=True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
