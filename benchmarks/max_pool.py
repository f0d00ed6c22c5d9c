"""MaxPool on one node, onnx_light against onnxruntime (and the compiled kernel against an
earlier commit's).

The pools of ResNet-50 (1x64x112x112, kernel 3, stride 2, pad 1), SqueezeNet (1x96x109x109,
kernel 3, stride 2), ShuffleNetV2 (1x24x112x112, as ResNet-50's) and a 3x3 stride-1 pool
(1x64x56x56, pad 1), float32, and ResNet-50's on uint8 (its int8 model's), each a one-node
model run by an onnx_light ``RuntimeSession`` and an onnxruntime session (same ``--threads``,
no spinning), interleaved round by round in this one process, medians. With ``--before REF``
(float32 cases) the compiled kernel ``max_pool_planes`` of ``onnx_light/kernels/pooling.py``
at git commit ``REF`` is loaded beside the current one and both are timed on the same planes
(one thread, called directly: no session), in the same rounds.

Run: ``python benchmarks/max_pool.py [--threads 1] [--rounds 15] [--before REF]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
from _common import ROOT, Table, interleaved, load_average, onnxruntime_session
from onnx import helper

from onnx_light import RuntimeSession
from onnx_light.kernels import pooling

# (name, input shape, kernel, stride, pads, element type)
CASES = (
    ("ResNet-50 pool", (1, 64, 112, 112), 3, 2, (1, 1, 1, 1), np.float32),
    ("SqueezeNet pool", (1, 96, 109, 109), 3, 2, (0, 0, 0, 0), np.float32),
    ("ShuffleNetV2 pool", (1, 24, 112, 112), 3, 2, (1, 1, 1, 1), np.float32),
    ("3x3 stride 1", (1, 64, 56, 56), 3, 1, (1, 1, 1, 1), np.float32),
    ("ResNet-50 pool, uint8", (1, 64, 112, 112), 3, 2, (1, 1, 1, 1), np.uint8),
)


def model(shape: tuple[int, ...], kernel: int, stride: int, pads: tuple[int, ...],
          dtype: type = np.float32) -> onnx.ModelProto:
    """A one-node MaxPool model."""
    node = helper.make_node("MaxPool", ["X"], ["Y"], kernel_shape=[kernel, kernel],
                            strides=[stride, stride], pads=list(pads))
    element = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph([node], "max_pool",
                              [helper.make_tensor_value_info("X", element, shape)],
                              [helper.make_tensor_value_info("Y", element, None)])
    result = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    result.ir_version = 8
    return result


def kernel_at(ref: str, folder: Path) -> ModuleType:
    """``onnx_light/kernels/pooling.py`` as of commit ``ref``, imported as a module of the
    current package (its relative imports resolve to the current modules)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:onnx_light/kernels/pooling.py"],
                            check=True, capture_output=True, text=True).stdout
    path = folder / "pooling_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("onnx_light.kernels.pooling_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sample", type=float, default=0.05, help="seconds per sample")
    parser.add_argument("--before", help="a git commit whose compiled kernel to time beside the current one")
    args = parser.parse_args(argv)
    folder = tempfile.TemporaryDirectory()
    before = kernel_at(args.before, Path(folder.name)) if args.before else None
    rng = np.random.default_rng(0)
    groups: dict[str, dict[str, object]] = {}
    for name, shape, kernel, stride, pads, dtype in CASES:
        m = model(shape, kernel, stride, pads, dtype)
        x = (rng.standard_normal(shape) * 40).astype(dtype)
        feeds = {"X": x}
        ours, theirs = RuntimeSession(m, num_threads=args.threads), onnxruntime_session(m, args.threads)
        expected = theirs.run(None, feeds)[0]
        np.testing.assert_array_equal(ours.run(None, feeds)[0], expected)
        functions: dict[str, object] = {"onnx_light": lambda s=ours, f=feeds: s.run(None, f),
                                        "onnxruntime": lambda s=theirs, f=feeds: s.run(None, f)}
        if before is not None and np.dtype(dtype).kind == "f":
            planes = x.reshape(-1, *shape[2:])
            out = np.empty((planes.shape[0], *expected.shape[2:]), dtype)
            lowest = () if np.dtype(dtype).kind == "f" else (np.iinfo(dtype).min,)
            geometry = ((kernel, kernel), (stride, stride), (1, 1), (pads[0], pads[1]), *lowest)
            for label, module in (("kernel", pooling), ("kernel before", before)):
                dispatcher = module.max_pool_planes.dispatcher
                dispatcher(planes, out, 0, planes.shape[0], *geometry)
                np.testing.assert_array_equal(out.reshape(expected.shape), expected)
                functions[label] = lambda d=dispatcher, p=planes, o=out, g=geometry: d(p, o, 0, len(p), *g)
        groups[name] = functions
    medians = interleaved(groups, args.rounds, args.sample)
    print(f"# MaxPool, one node; {args.threads} thread(s); load average {load_average():.2f}; "
          f"{args.rounds} interleaved rounds")
    print()
    columns = ["pool", "onnx_light (ms)", "onnxruntime (ms)", "onnx_light / onnxruntime"]
    if before is not None:
        columns += ["kernel (ms)", f"kernel at {args.before} (ms)", "speed-up"]
    table = Table("Median run time:", columns, ratios=("onnx_light / onnxruntime", "speed-up"))
    for name, m in medians.items():
        cells = [name, m["onnx_light"] * 1e3, m["onnxruntime"] * 1e3, m["onnx_light"] / m["onnxruntime"]]
        if before is not None:
            cells += ([m["kernel"] * 1e3, m["kernel before"] * 1e3, m["kernel before"] / m["kernel"]]
                      if "kernel" in m else ["-"] * 3)
        table.add(*cells)
    print(table.markdown())
    folder.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
