"""Control flow, onnx_light against onnxruntime, side by side in one process.

Two models: the exported-style model of ``tools/_control_flow_model.py`` (an RNN cell as a
Scan over the time axis, an accumulating Loop with an If in its body, a data-dependent If) at
a small and a larger size, and a Loop of ``--trips`` iterations of one Add on 4 floats, whose
time is the cost of one iteration of a nested plan (one step, its bookkeeping). Medians of
interleaved samples (``_common.interleaved``) at ``--threads`` threads for both runtimes,
random weights; the load average is printed with the table.

Run: ``python benchmarks/control_flow.py [--threads 1] [--rounds 5] [--trips 1000]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np
import onnx
from _common import ROOT, interleaved
from onnx import TensorProto, helper, numpy_helper
from real_models import onnxruntime_session

sys.path.insert(0, str(ROOT / "tools"))
from _control_flow_model import Sizes, exported_model

from onnx_light.runtime import RuntimeSession


def loop_of_adds(trips: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A Loop whose body adds one to a carried vector of 4 floats, ``trips`` times."""
    def info(name: str, element_type: int, shape: list[int]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, element_type, shape)

    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "one"], ["v_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [info("i", TensorProto.INT64, []), info("c_in", TensorProto.BOOL, []),
         info("v_in", TensorProto.FLOAT, [4])],
        [info("c_out", TensorProto.BOOL, []), info("v_out", TensorProto.FLOAT, [4])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["m", "", "x"], ["y"], body=body)], "loop",
        [info("m", TensorProto.INT64, []), info("x", TensorProto.FLOAT, [4])],
        [info("y", TensorProto.FLOAT, [4])],
        initializer=[numpy_helper.from_array(np.ones(1, np.float32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"m": np.array(trips), "x": np.zeros(4, np.float32)}


def cases(trips: int) -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)
    found = {}
    for sizes, steps in ((Sizes(2, 3, 4), 5), (Sizes(16, 64, 128), 64)):
        x = rng.standard_normal((sizes.batch, steps, sizes.features)).astype(np.float32)
        found[f"Scan+Loop+If, batch {sizes.batch}, {steps} steps, hidden {sizes.hidden}"] = (
            exported_model(sizes), {"x": x})
    found[f"Loop of {trips} Adds"] = loop_of_adds(trips)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trips", type=int, default=1000)
    parser.add_argument("--sample", type=float, default=0.05, help="seconds per sample")
    args = parser.parse_args(argv)
    groups = {}
    for name, (model, feeds) in cases(args.trips).items():
        ours = RuntimeSession(model, num_threads=args.threads)
        theirs = onnxruntime_session(model, args.threads)
        for a, b in zip(ours.run(None, feeds), theirs.run(None, feeds), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)
        groups[name] = {"onnx_light": lambda s=ours, f=feeds: s.run(None, f),
                        "onnxruntime": lambda s=theirs, f=feeds: s.run(None, f)}
    load = os.getloadavg()[0]
    medians = interleaved(groups, args.rounds, args.sample)
    print(f"threads {args.threads}, {args.rounds} rounds, load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    print(f"{'case':<50} {'onnx_light (us)':>16} {'onnxruntime (us)':>17} {'ratio':>7}")
    for name, times in medians.items():
        ours, theirs = times["onnx_light"] * 1e6, times["onnxruntime"] * 1e6
        print(f"{name:<50} {ours:>16.0f} {theirs:>17.0f} {ours / theirs:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
