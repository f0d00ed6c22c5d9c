"""wav2vec2's 1-D convolutions one node at a time: onnx_light under Conv settings and
onnxruntime, at 1 and 2 threads, timed at quiet instants.

The shapes are those of ``model_zoo.py``'s wav2vec2 (1 s of 16 kHz audio): the feature
extractor's seven convolutions (128 channels; kernel 10 stride 5 on the waveform, then kernel
3 stride 2 four times and kernel 2 stride 2 twice) and the positional convolution (256
channels in 16 groups, kernel 64, padding 32, with its bias). Each is a one-node model with
seeded random constant weights; ``--gelu`` appends the exported GELU (``x * (erf(x / sqrt 2)
+ 1) * 0.5``), which onnx_light fuses into the convolution's step where it can.

Each setting is a set of Conv (float) values published over the portable defaults, as in
``conv_settings.py`` (``algorithm=im2col,parallel.split=output_rows``); an empty setting is
the portable defaults. A timed run counts only if no other task was runnable just before and
just after it (``session_threads.measure``), so two-thread figures are those of quiet
instants; ``--every-run`` counts every run. The table gives the median time of each session
and its ratio to onnxruntime's at the same thread count.

Run: ``python benchmarks/conv1d_speech.py [--threads 1 2] [--setting ""] [--samples 25]
[--gelu] [--layers 1 2 7]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from _common import Table, load_average, onnxruntime_session  # noqa: E402
from conv_settings import parse_setting, registry_with  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from session_threads import measure  # noqa: E402

from onnx_light.runtime.session import RuntimeSession  # noqa: E402

# name: (channels in, channels out, input length, kernel, stride, groups, pad, bias)
LAYERS = {
    "1": (1, 128, 16000, 10, 5, 1, 0, False),
    "2": (128, 128, 3199, 3, 2, 1, 0, False),
    "3": (128, 128, 1599, 3, 2, 1, 0, False),
    "4": (128, 128, 799, 3, 2, 1, 0, False),
    "5": (128, 128, 399, 3, 2, 1, 0, False),
    "6": (128, 128, 199, 2, 2, 1, 0, False),
    "7": (128, 128, 99, 2, 2, 1, 0, False),
    "pos": (256, 256, 49, 64, 1, 16, 32, True),
}


def conv_model(layer: str, gelu: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The one-node model of ``layer`` (and its GELU) and its feed."""
    cin, cout, length, kernel, stride, groups, pad, bias = LAYERS[layer]
    rng = np.random.default_rng(0)
    depth = cin // groups * kernel
    w = (rng.standard_normal((cout, cin // groups, kernel)) / np.sqrt(depth)).astype(np.float32)
    initializers = [numpy_helper.from_array(w, "w")]
    inputs = ["x", "w"]
    if bias:
        initializers.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["c"], kernel_shape=[kernel], strides=[stride],
                              pads=[pad, pad], group=groups)]
    if gelu:
        for name, value in (("r2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5)):
            initializers.append(numpy_helper.from_array(np.array(value, np.float32), name))
        nodes += [helper.make_node("Div", ["c", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["f"]), helper.make_node("Mul", ["c", "f"], ["g"]),
                  helper.make_node("Mul", ["g", "half"], ["y"])]
    out = "y" if gelu else "c"
    out_length = (length + 2 * pad - kernel) // stride + 1
    graph = helper.make_graph(
        nodes, f"conv1d_{layer}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, length])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, cout, out_length])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((1, cin, length)).astype(np.float32)}


class Peer:
    """An onnxruntime session with ``RuntimeSession.run``'s interface (``session_threads.measure``
    calls ``run(None, feeds)``)."""

    def __init__(self, session: object) -> None:
        self.session = session

    def run(self, _: object, feeds: dict[str, np.ndarray]) -> object:
        return self.session.run(None, feeds)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", nargs="+", default=list(LAYERS), choices=list(LAYERS))
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--setting", action="append", default=None,
                        help="name=value[,name=value] of Conv; repeat for each ('' = portable)")
    parser.add_argument("--samples", type=int, default=25)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--gelu", action="store_true", help="append the exported GELU")
    parser.add_argument("--every-run", action="store_true", help="count runs whatever the load")
    args = parser.parse_args(argv)
    settings = args.setting if args.setting is not None else [""]
    print(f"load average (1 min) at start {load_average()}; medians of {args.samples} runs in ms "
          f"(ratio to onnxruntime's at the same thread count)")
    columns = ["layer", "threads", *[s or "(portable)" for s in settings], "onnxruntime", "max diff",
               "retaken"]
    table = Table(f"## wav2vec2's convolutions{' with GELU' if args.gelu else ''}", columns)
    for layer in args.layers:
        model, feeds = conv_model(layer, args.gelu)
        for threads in args.threads:
            sessions = {}
            for text in settings:
                setting, options = parse_setting(text)
                sessions[text] = RuntimeSession(model, num_threads=threads,
                                                registry=registry_with(setting, threads), **options)
            peer = onnxruntime_session(model, threads)
            expected = peer.run(None, feeds)[0]
            diff = max(float(np.max(np.abs(s.run(None, feeds)[0] - expected))) for s in sessions.values())

            sessions["onnxruntime"] = Peer(peer)
            times, retakes = measure(sessions, feeds, args.samples, time.monotonic() + args.max_seconds,
                                     gate=not args.every_run)
            medians = {key: statistics.median(v) if v else float("nan") for key, v in times.items()}
            theirs = medians["onnxruntime"]
            cells = [f"{medians[t] * 1e3:.3f} ({medians[t] / theirs:.2f})" for t in settings]
            table.add(layer, threads, *cells, f"{theirs * 1e3:.3f}", f"{diff:.1e}", retakes)
    print(table.markdown())
    print(f"load average (1 min) at end {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
