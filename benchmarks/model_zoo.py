"""Architectures people run, exported from PyTorch with seeded random weights, in onnx_light and
onnxruntime at 1 and 2 threads, side by side, in one process.

Each model is built from a configuration, never downloaded: torchvision's constructors with
``weights=None`` and transformers' ``*Config`` + ``*Model`` classes, after ``torch.manual_seed``.
It is exported once with ``torch.onnx.export`` (the TorchScript exporter, opset ``OPSET``: the
dynamo exporter needs onnxscript, which is no dependency of ours) into a cache folder
(``--cache-dir``, by default ``<platformdirs user cache>/onnx_light/model-zoo``) under a name
keyed by the model's name and configuration, the torch, torchvision and transformers versions
and this script's export settings: another version or setting exports again. A cached model
runs without torch installed.

The ``*_int8`` entries are the torchvision CNNs quantized by onnxruntime's static quantizer
(``quant_pre_process``, then ``quantize_static``: QDQ format, per channel, uint8 activations
and int8 weights, as onnxruntime recommends on x86; 7-bit weights, its ``reduce_range``, where
its byte products saturate: ``quantized_models.onnxruntime_saturates``) from the cached float
export, calibrated on a few seeded random images; their cache key adds ``QUANTIZATION``, the
weights' range and onnxruntime's version to the float model's. Their rows compare int8 with
int8 (time and outputs), and a second table sets each one beside its float model's row of the
same run (onnx_light int8 / onnx_light float, likewise for onnxruntime), so run both
(``--models resnet50 resnet50_int8``).

For every model the script builds an onnx_light and an onnxruntime session per thread count
(``--threads``, default 1 2), all in this process, and times them in interleaved rounds with
``real_models.Rounds`` (each run settled by 0.2 s of untimed runs, the starting session rotating
every round, a round disturbed by other processes retaken); onnxruntime is set up by
``_common.onnxruntime_session`` (its spinning turned off). The table gives medians, the ratio
onnx_light / onnxruntime at each thread count, each runtime's two-thread scaling (time at the
last thread count / time at the first) and the largest difference between the outputs of the
two runtimes (absolute, and relative to the largest absolute value of onnxruntime's output).
A model onnx_light cannot construct or run is a row with the error (for unsupported operators,
their list), not a crash. onnx_light uses the user's kernel tuning cache, as an application would.

Run (torch, torchvision and transformers come with the ``zoo`` extra: ``pip install -e
".[zoo]"``): ``python benchmarks/model_zoo.py [--models bert resnet50] [--threads 1 2]
[--rounds 5] [--cache-dir DIR] [--export-only] [--json results.json]``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _common  # noqa: E402  (imports real_models without letting it move the tuning cache)
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from quantized_models import onnxruntime_saturates  # noqa: E402

from onnx_light.runtime import RuntimeSession, UnsupportedOperatorError  # noqa: E402

real_models = _common.real_models

OPSET = 17  # the TorchScript exporter's opsets that onnx_light's kernels cover
SEED = 0
# Part of every cache key: change it whenever the export below changes what it writes.
EXPORT_SETTINGS = {"exporter": "torchscript", "opset": OPSET, "seed": SEED, "constant_folding": True,
                   "layout": 2}
VERSIONED_PACKAGES = ("torch", "torchvision", "transformers")
# Part of the quantized models' cache key, with onnxruntime's version (its quantizer writes them).
QUANTIZATION = {"pre_process": True, "format": "QDQ", "per_channel": True, "activations": "QUInt8",
                "weights": "QInt8", "calibration_images": 4, "calibration_seed": SEED + 1}

Feeds = dict[str, np.ndarray]


# ---------------------------------------------------------------------------- the models

@dataclass(frozen=True)
class ModelSpec:
    """One architecture: how to build it (torch, lazily) and its inputs (numpy, seeded).

    ``build(config)`` returns a ``torch.nn.Module`` whose ``forward`` takes the feeds in the
    order of ``feeds``' keys and returns one tensor; ``config`` is part of the cache key."""

    name: str
    family: str  # "torchvision" or "transformers"
    build: Callable[[dict[str, Any]], Any]
    feeds: Callable[[np.random.Generator], Feeds]
    config: dict[str, Any] = field(default_factory=dict)
    source: ModelSpec | None = None  # set for a model quantized from the float ``source``


def int8_variant(spec: ModelSpec) -> ModelSpec:
    """``spec`` quantized (``QUANTIZATION``) from its float export, with the same inputs."""
    return ModelSpec(f"{spec.name}_int8", "quantized", spec.build, spec.feeds, spec.config, spec)


def _image(batch: int = 1, size: int = 224) -> Callable[[np.random.Generator], Feeds]:
    return lambda rng: {"pixels": rng.standard_normal((batch, 3, size, size), dtype=np.float32)}


def _tokens(vocab: int, batch: int, sequence: int) -> Callable[[np.random.Generator], Feeds]:
    return lambda rng: {"input_ids": rng.integers(0, vocab, (batch, sequence), dtype=np.int64)}


def _waveform(batch: int, samples: int) -> Callable[[np.random.Generator], Feeds]:
    return lambda rng: {"input_values": rng.standard_normal((batch, samples), dtype=np.float32)}


def _torchvision(constructor: str) -> Callable[[dict[str, Any]], Any]:
    def build(config: dict[str, Any]) -> Any:
        import torchvision

        return getattr(torchvision.models, constructor)(weights=None, **config)

    return build


def _last_hidden_state(model: Any, argument: str) -> Any:
    """A transformers model as a module of one input (``argument``) returning one tensor. Token
    models get an all-ones attention mask made in the graph: without one, transformers looks for
    packed sequences with ``torch.diff``, which the TorchScript exporter cannot export."""
    import torch

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, inputs: Any) -> Any:
            extra = {"attention_mask": torch.ones_like(inputs)} if argument == "input_ids" else {}
            return self.model(**{argument: inputs}, **extra, return_dict=True).last_hidden_state

    return LastHiddenState()


def _transformers(config_class: str, model_class: str,
                  argument: str = "input_ids") -> Callable[[dict[str, Any]], Any]:
    def build(config: dict[str, Any]) -> Any:
        import transformers

        settings = getattr(transformers, config_class)(use_cache=False, **config)
        settings._attn_implementation = "eager"  # plain MatMul/Softmax, no fused SDPA call to trace
        return _last_hidden_state(getattr(transformers, model_class)(settings), argument)

    return build


VOCAB = 1000
_BERT = {"vocab_size": VOCAB, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
         "intermediate_size": 1024, "max_position_embeddings": 128}

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (
    ModelSpec("bert", "transformers", _transformers("BertConfig", "BertModel"), _tokens(VOCAB, 2, 32),
              _BERT),
    ModelSpec("distilbert", "transformers", _transformers("DistilBertConfig", "DistilBertModel"),
              _tokens(VOCAB, 2, 32),
              {"vocab_size": VOCAB, "dim": 256, "n_layers": 4, "n_heads": 4, "hidden_dim": 1024,
               "max_position_embeddings": 128}),
    ModelSpec("gpt2", "transformers", _transformers("GPT2Config", "GPT2Model"), _tokens(VOCAB, 1, 64),
              {"vocab_size": VOCAB, "n_embd": 256, "n_layer": 4, "n_head": 4, "n_positions": 128}),
    ModelSpec("llama", "transformers", _transformers("LlamaConfig", "LlamaModel"), _tokens(VOCAB, 1, 64),
              {"vocab_size": VOCAB, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
               "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 128,
               "hidden_act": "silu"}),
    ModelSpec("vit", "transformers", _transformers("ViTConfig", "ViTModel", "pixel_values"),
              _image(1, 224),
              {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
               "intermediate_size": 1024, "image_size": 224, "patch_size": 16}),
    ModelSpec("wav2vec2", "transformers", _transformers("Wav2Vec2Config", "Wav2Vec2Model", "input_values"),
              _waveform(1, 16000),
              {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
               "intermediate_size": 1024, "conv_dim": [128] * 7, "num_conv_pos_embeddings": 64}),
    ModelSpec("mobilenet_v2", "torchvision", _torchvision("mobilenet_v2"), _image()),
    ModelSpec("mobilenet_v3_small", "torchvision", _torchvision("mobilenet_v3_small"), _image()),
    ModelSpec("efficientnet_b0", "torchvision", _torchvision("efficientnet_b0"), _image()),
    ModelSpec("shufflenet_v2", "torchvision", _torchvision("shufflenet_v2_x1_0"), _image()),
    ModelSpec("resnet50", "torchvision", _torchvision("resnet50"), _image()),
    ModelSpec("convnext_tiny", "torchvision", _torchvision("convnext_tiny"), _image()),
)}
MODELS.update({spec.name: spec for spec in map(int8_variant, (MODELS["mobilenet_v2"], MODELS["resnet50"]))})


# ---------------------------------------------------------------------------- export and cache

def package_versions() -> dict[str, str]:
    """The versions that go into the cache key (read from the metadata: torch is not imported)."""
    versions = {}
    for package in (*VERSIONED_PACKAGES, "onnxruntime"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "absent"
    return versions


def cache_key(spec: ModelSpec, versions: dict[str, str]) -> str:
    """A file name: the model's name and a digest of its configuration, the exporting packages'
    versions and ``EXPORT_SETTINGS``; for a quantized model, of its float model's key,
    ``QUANTIZATION`` and onnxruntime's version."""
    if spec.source is not None:
        identity = {"model": spec.name, "source": cache_key(spec.source, versions),
                    "quantization": QUANTIZATION, "reduce_range": onnxruntime_saturates(),
                    "onnxruntime": versions.get("onnxruntime", "absent")}
    else:
        identity = {"model": spec.name, "family": spec.family, "config": spec.config,
                    "versions": {package: versions.get(package, "absent") for package in VERSIONED_PACKAGES},
                    "export": EXPORT_SETTINGS}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{spec.name}-{digest}.onnx"


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("onnx_light")) / "model-zoo"


def torch_export(spec: ModelSpec, feeds: Feeds, path: Path) -> None:
    """Build ``spec`` from seeded random weights and export it to ``path``."""
    import torch

    torch.manual_seed(SEED)
    module = spec.build(spec.config).eval()
    arguments = tuple(torch.from_numpy(value) for value in feeds.values())
    with torch.no_grad(), warnings.catch_warnings():
        # the TorchScript exporter is chosen (see the module's docstring), and torch deprecates
        # it and its helpers; its tracer warns of every Python branch on a shape, which the
        # outputs' comparison with onnxruntime covers
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch.onnx.export(module, arguments, str(path), opset_version=OPSET, dynamo=False,
                          do_constant_folding=EXPORT_SETTINGS["constant_folding"],
                          input_names=list(feeds), output_names=["output"])


Exporter = Callable[[ModelSpec, Feeds, Path], None]


def calibration_feeds(spec: ModelSpec) -> list[Feeds]:
    """``QUANTIZATION["calibration_images"]`` seeded inputs, none of them the timed one."""
    rng = np.random.default_rng(QUANTIZATION["calibration_seed"])
    return [spec.feeds(rng) for _ in range(QUANTIZATION["calibration_images"])]


def quantizer(float_path: Path) -> Exporter:
    """An exporter that writes the model at ``float_path`` quantized by onnxruntime's static
    quantizer with ``QUANTIZATION``, calibrated on ``calibration_feeds(spec)``. The pre-processing
    onnxruntime recommends (shape inference and its graph optimizations) comes first: without it
    the TorchScript exporter's ``Identity`` nodes in front of shared biases keep the quantizer
    from quantizing those biases, and their convolutions stay float between DQ and Q."""
    def quantize(spec: ModelSpec, feeds: Feeds, path: Path) -> None:
        from onnxruntime import quantization

        class Reader(quantization.CalibrationDataReader):
            def __init__(self) -> None:
                self.samples = iter(calibration_feeds(spec))

            def get_next(self) -> Feeds | None:
                return next(self.samples, None)

        source = float_path
        if QUANTIZATION["pre_process"]:
            source = path.with_suffix(".pre.onnx")
            quantization.quant_pre_process(str(float_path), str(source))
        try:
            quantization.quantize_static(
                str(source), str(path), Reader(),
                quant_format=quantization.QuantFormat[QUANTIZATION["format"]],
                per_channel=QUANTIZATION["per_channel"],
                activation_type=quantization.QuantType[QUANTIZATION["activations"]],
                weight_type=quantization.QuantType[QUANTIZATION["weights"]],
                reduce_range=onnxruntime_saturates())
        finally:
            if source != float_path:
                source.unlink(missing_ok=True)

    return quantize


def model_file(spec: ModelSpec, feeds: Feeds, cache_dir: Path, versions: dict[str, str],
               export: Exporter) -> tuple[Path, bool]:
    """``cached_model`` for any entry: a quantized one is made from its float model's file (itself
    exported with ``export`` if absent)."""
    if spec.source is None:
        return cached_model(spec, feeds, cache_dir, versions, export)
    float_path, _ = cached_model(spec.source, feeds, cache_dir, versions, export)
    return cached_model(spec, feeds, cache_dir, versions, quantizer(float_path))


def cached_model(spec: ModelSpec, feeds: Feeds, cache_dir: Path, versions: dict[str, str],
                 export: Exporter = torch_export) -> tuple[Path, bool]:
    """The model's file in the cache, exported first if absent or unreadable; (path, exported).
    The export writes a temporary file renamed into place, so an interrupted export leaves no
    half file under the key."""
    path = cache_dir / cache_key(spec, versions)
    if path.exists():
        try:
            onnx.load(str(path), load_external_data=False)
            return path, False
        except Exception:  # a corrupt file: export again
            path.unlink()
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    export(spec, feeds, partial)
    partial.replace(path)
    return path, True


def model_feeds(spec: ModelSpec) -> Feeds:
    return spec.feeds(np.random.default_rng(SEED))


def parameter_count(model: onnx.ModelProto) -> int:
    """Elements of the model's initializers and Constant nodes' tensors."""
    count = sum(int(np.prod(tensor.dims)) for tensor in model.graph.initializer)
    for node in model.graph.node:
        if node.op_type == "Constant":
            count += sum(int(np.prod(a.t.dims)) for a in node.attribute if a.name == "value")
    return count


# ---------------------------------------------------------------------------- measurement

@dataclass
class Result:
    """One model's row: medians in seconds per thread count, or the error that stopped it."""

    name: str
    parameters: int | None = None
    onnx_light: dict[int, float] = field(default_factory=dict)
    onnxruntime: dict[int, float] = field(default_factory=dict)
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    error: str | None = None
    exported: bool = False

    def ratio(self, threads: int) -> float | None:
        if threads in self.onnx_light and threads in self.onnxruntime:
            return self.onnx_light[threads] / self.onnxruntime[threads]
        return None

    @staticmethod
    def scaling(times: dict[int, float], first: int, last: int) -> float | None:
        if first in times and last in times:
            return times[last] / times[first]
        return None


def describe_error(error: BaseException) -> str:
    """One line: the unsupported operators' names, or the exception's type and first line."""
    if isinstance(error, UnsupportedOperatorError):
        return "unsupported: " + ", ".join(sorted({op.op_type for op in error.operators}))
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}"[:200]


def measure(name: str, model: onnx.ModelProto, feeds: Feeds, threads: Sequence[int], rounds: int,
            timing: real_models.Rounds) -> Result:
    """Time onnx_light and onnxruntime at every thread count, interleaved in the same rounds. A
    runtime that cannot build or run the model is left out of the timing and named in ``error``."""
    result = Result(name, parameters=parameter_count(model))
    serialized = model.SerializeToString()
    builders = {"onnx_light": lambda count: RuntimeSession(serialized, num_threads=count),
                "onnxruntime": lambda count: _common.onnxruntime_session(model, count)}
    functions: list[tuple[str, int, Callable[[], object]]] = []
    outputs, errors = {}, []
    for runtime, build in builders.items():
        try:
            for count in threads:
                session = build(count)
                outputs[runtime] = session.run(None, feeds)
                functions.append((runtime, count, lambda s=session: s.run(None, feeds)))
        except Exception as error:  # the row says why; the other models go on
            errors.append(("" if runtime == "onnx_light" else f"{runtime}: ") + describe_error(error))
            functions = [f for f in functions if f[0] != runtime]
            outputs.pop(runtime, None)
    result.error = "; ".join(errors) or None
    samples = timing.run([fn for _, _, fn in functions], rounds) if functions else []
    for (runtime, count, _), values in zip(functions, samples, strict=True):
        getattr(result, runtime)[count] = statistics.median(values)
    if len(outputs) == 2:
        result.max_abs_diff, result.max_rel_diff = _differences(outputs["onnx_light"],
                                                                outputs["onnxruntime"])
    return result


def _differences(ours: list[np.ndarray], theirs: list[np.ndarray]) -> tuple[float, float]:
    absolute = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(ours, theirs, strict=True))
    scale = max(float(np.max(np.abs(b))) for b in theirs)
    return absolute, absolute / scale if scale > 0 else math.inf


# ---------------------------------------------------------------------------- the table

def table(results: Sequence[Result], threads: Sequence[int], rounds: int) -> _common.Table:
    first, last = threads[0], threads[-1]
    columns = ["model", "params (M)"]
    ratios = []
    for count in threads:
        columns += [f"onnx_light {count}t (ms)", f"onnxruntime {count}t (ms)", f"ratio {count}t"]
        ratios.append(f"ratio {count}t")
    if len(threads) > 1:
        columns += [f"onnx_light t{last}/t{first}", f"onnxruntime t{last}/t{first}"]
        ratios += columns[-2:]
    columns += ["max abs diff", "max rel diff", "error"]
    out = _common.Table(f"medians of {rounds} interleaved rounds; ratio = onnx_light / onnxruntime",
                        columns, ratios=tuple(ratios))
    for result in results:
        cells: list[Any] = [result.name, None if result.parameters is None else result.parameters / 1e6]
        for count in threads:
            ours, theirs = result.onnx_light.get(count), result.onnxruntime.get(count)
            cells += [None if ours is None else ours * 1e3, None if theirs is None else theirs * 1e3,
                      result.ratio(count)]
        if len(threads) > 1:
            cells += [Result.scaling(result.onnx_light, first, last),
                      Result.scaling(result.onnxruntime, first, last)]
        cells += [result.max_abs_diff, result.max_rel_diff, result.error or ""]
        out.add(*cells)
    return out


def int8_table(results: Sequence[Result], threads: Sequence[int]) -> _common.Table | None:
    """Each quantized model's times over its float model's, for both runtimes, when both rows
    ran here; None without quantized models."""
    by_name = {result.name: result for result in results}
    quantized = [r for r in results if MODELS.get(r.name) is not None and MODELS[r.name].source is not None]
    if not quantized:
        return None
    columns = ["model"]
    for count in threads:
        columns += [f"onnx_light int8/float {count}t", f"onnxruntime int8/float {count}t",
                    f"int8 ratio {count}t"]
    out = _common.Table("int8 against float (below 1: int8 is faster); int8 ratio = onnx_light int8 / "
                        "onnxruntime int8", columns, ratios=tuple(columns[1:]))
    for result in quantized:
        source = by_name.get(MODELS[result.name].source.name, Result(""))
        cells: list[Any] = [result.name]
        for count in threads:
            cells += [_over(result.onnx_light, source.onnx_light, count),
                      _over(result.onnxruntime, source.onnxruntime, count), result.ratio(count)]
        out.add(*cells)
    return out


def _over(times: dict[int, float], reference: dict[int, float], count: int) -> float | None:
    return times[count] / reference[count] if count in times and count in reference else None


def summary(results: Sequence[Result], threads: Sequence[int]) -> list[str]:
    """Geometric means of the ratios over the models that ran."""
    lines = []
    for count in threads:
        ratios = [r.ratio(count) for r in results if r.ratio(count) is not None]
        if ratios:
            lines.append(f"geometric mean of the ratios at {count} thread(s): {_common.geomean(ratios):.2f} "
                         f"over {len(ratios)} model(s)")
    return lines


# ---------------------------------------------------------------------------- the command

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per model")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where the exported models are kept (default: the user cache)")
    parser.add_argument("--export-only", action="store_true", help="export (or find) the models, no timing")
    parser.add_argument("--max-retakes", type=int, default=5, help="per model")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    return parser


def run(args: argparse.Namespace, timing: real_models.Rounds,
        log: Callable[[str], None] = _common.log) -> list[Result]:
    cache_dir = args.cache_dir or default_cache_dir()
    versions = package_versions()
    results = []
    for name in args.models:
        spec = MODELS[name]
        feeds = model_feeds(spec)
        started = time.perf_counter()
        try:
            path, exported = model_file(spec, feeds, cache_dir, versions, torch_export)
        except Exception as error:  # no torch, the exporter or quantizer failed: a row, not a crash
            results.append(Result(name, error="export: " + describe_error(error)))
            log(f"{name}: export failed: {results[-1].error}")
            continue
        log(f"{name}: {'exported to' if exported else 'cached at'} {path} "
            f"({time.perf_counter() - started:.1f} s)")
        if args.export_only:
            results.append(Result(name, parameters=parameter_count(onnx.load(str(path))), exported=exported))
            continue
        started = time.perf_counter()
        result = measure(name, onnx.load(str(path)), feeds, args.threads, args.rounds, timing)
        result.exported = exported
        results.append(result)
        log(f"{name}: timed in {time.perf_counter() - started:.1f} s {result.error or ''}")
    return results


def header(args: argparse.Namespace) -> str:
    """Date, versions, BLAS and ``python -m onnx_light cpu``."""
    import onnxruntime

    versions = ", ".join(f"{k} {v}" for k, v in package_versions().items() if k in VERSIONED_PACKAGES)
    lines = [f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}  ",
             f"numpy {np.__version__}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}, "
             f"{versions}; opset {OPSET}, seed {SEED}, {args.rounds} interleaved rounds  "]
    lines += _common.gemm_sweep.blas_lines()
    lines += ["", "```", real_models.descriptor_text(max(args.threads)), "```", ""]
    return "\n".join(lines)


def _load(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started, load_start = time.perf_counter(), _common.load_average()
    timing = real_models.Rounds(args.max_retakes)
    results = run(args, timing)
    print(f"# onnx_light vs onnxruntime on the model zoo ({', '.join(map(str, args.threads))} threads)\n")
    print(header(args))
    if args.export_only:
        for result in results:
            state = result.error or ("exported" if result.exported else "cached")
            print(f"- {result.name}: {state}")
    else:
        print(table(results, args.threads, args.rounds).markdown() + "\n")
        int8 = int8_table(results, args.threads)
        if int8 is not None:
            print(int8.markdown() + "\n")
        print(f"{timing.retaken} round(s) retaken because other processes were busy (at most "
              f"{args.max_retakes} per model)  ")
        for line in summary(results, args.threads):
            print(line + "  ")
    print(f"\nload average (1 min) at start {_load(load_start)}, at end {_load(_common.load_average())}; "
          f"total {time.perf_counter() - started:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps([vars(r) for r in results], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
