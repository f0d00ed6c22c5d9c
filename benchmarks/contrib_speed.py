"""Models that carry onnxruntime's ``com.microsoft`` operators, in onnx_light and onnxruntime
side by side in one run: CNNs quantized by ``quantize_static`` (per channel, uint8
activations) in the QOperator format (QLinearConv with the contrib QLinearAdd,
QLinearGlobalAveragePool, QGemm) and in the QDQ format, and a BERT-style encoder fused by the
transformer optimizer (EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu)
or dynamically quantized, each beside the float model it came from; and a LLaMA-style decoder
as onnxruntime's model builder writes one (4-bit MatMulNBits, GroupQueryAttention), over a
prompt and over one decoding step with the prompt's cache.

Every model is built by ``contrib_models`` with seeded random weights, larger than the tests'.
The runs are interleaved (``_common.interleaved``: rounds rotating the order, medians, a round
disturbed by other processes taken again); onnx_light runs with its portable defaults. The
last column is the largest difference of onnx_light's outputs from onnxruntime's on the same
model.

Run: ``python benchmarks/contrib_speed.py [--threads 2] [--rounds 7] [--size 96]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import contrib_models
import numpy as np
import onnx
from _common import interleaved, onnxruntime_session

from onnx_light.runtime.session import RuntimeSession


def _cnn_variants(build: Callable[..., onnx.ModelProto], size: int, folder: Path
                  ) -> dict[str, onnx.ModelProto]:
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal((1, 3, size, size)).astype(np.float32) for _ in range(4)]
    float_model = build(size=size)
    return {"float": float_model,
            "QOperator": contrib_models.quantize_static_model(float_model, folder, samples, "QOperator"),
            "QDQ": contrib_models.quantize_static_model(float_model, folder, samples, "QDQ")}


def _bert_variants(sequence: int, folder: Path) -> dict[str, onnx.ModelProto]:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    float_model = contrib_models.bert_like(sequence=sequence)
    source, fused, dynamic = folder / "bert.onnx", folder / "bert.fused.onnx", folder / "bert.dq.onnx"
    onnx.save(float_model, source)
    optimize_model(str(source), model_type="bert", num_heads=4, hidden_size=64,
                   opt_level=0).save_model_to_file(str(fused))
    quantize_dynamic(str(source), str(dynamic), weight_type=QuantType.QInt8)
    return {"float": float_model, "fused": onnx.load(fused), "dynamic int8": onnx.load(dynamic)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=96, help="the CNNs' input height and width")
    parser.add_argument("--sequence", type=int, default=128, help="the encoder's sequence length")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        models = {(name, variant): model
                  for name, build in (("MobileNetV2-like", contrib_models.mobilenet_like),
                                      ("ResNet-like", contrib_models.resnet_like))
                  for variant, model in _cnn_variants(build, args.size, folder).items()}
        models.update({("BERT-like", variant): model
                       for variant, model in _bert_variants(args.sequence, folder).items()})
    feeds = {"x": rng.standard_normal((1, 3, args.size, args.size)).astype(np.float32)}
    inputs_of = {"BERT-like": contrib_models.bert_feeds(rng, batch=1, sequence=args.sequence)}
    decoder = contrib_models.decoder_like(positions=args.sequence + 1)
    for variant, (tokens, past) in {"prompt": (args.sequence, 0), "one step": (1, args.sequence)}.items():
        models["LLaMA-like decoder", variant] = decoder
        inputs_of[f"LLaMA-like decoder {variant}"] = {
            "input_ids": rng.integers(0, 50, (1, tokens)).astype(np.int64),
            "seqlens_k": np.array([past + tokens - 1], np.int32),
            "total_sequence_length": np.array(past + tokens, np.int32),
            **{f"past_key_values.{layer}.{kind}": rng.standard_normal((1, 2, past, 16)).astype(np.float32)
               for layer in range(2) for kind in ("key", "value")}}
    groups, differences = {}, {}
    for key, model in models.items():
        inputs = inputs_of.get(key[0], inputs_of.get(" ".join(key), feeds))
        ours = RuntimeSession(model, num_threads=args.threads)
        theirs = onnxruntime_session(model, args.threads)
        differences[key] = float(np.max(np.abs(ours.run(None, inputs)[0].astype(np.float64)
                                               - theirs.run(None, inputs)[0])))
        groups[key] = {"onnx_light": lambda s=ours, f=inputs: s.run(None, f),
                       "onnxruntime": lambda s=theirs, f=inputs: s.run(None, f)}
    load = os.getloadavg()[0]
    medians = interleaved(groups, args.rounds, 0.05)
    print(f"threads {args.threads}, {args.rounds} rounds, CNN input {args.size}x{args.size}, "
          f"encoder sequence {args.sequence}; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print("| model | variant | onnx_light (ms) | onnxruntime (ms) | onnx_light / onnxruntime "
          "| / onnx_light float | max difference |")
    print("|---|---|---|---|---|---|---|")
    for (name, variant), times in medians.items():
        ours, theirs = times["onnx_light"], times["onnxruntime"]
        own_float = medians[name, "float"]["onnx_light"] if (name, "float") in medians else None
        versus_float = "-" if own_float is None else f"{ours / own_float:.2f}"
        print(f"| {name} | {variant} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | {ours / theirs:.2f} "
              f"| {versus_float} | {differences[name, variant]:.3g} |")


if __name__ == "__main__":
    main()
