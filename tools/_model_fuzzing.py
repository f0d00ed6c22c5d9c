"""Mutations of ONNX models and a worker process that runs them one at a time, so that a
crash or a hang of one case is seen and counted instead of ending the run.

Everything is deterministic given a seed. Used by ``tools/model_fuzz.py`` and the
bad-input tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from _cache_fuzzing import MUTATIONS
from _small_model import small_model
from onnx import helper

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
LIGHT_MODELS = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

def light_model_paths() -> list[Path]:
    return sorted(LIGHT_MODELS.glob("*.onnx"))


def model_source(name: str) -> bytes:
    """The bytes of model ``name``: ``small`` or a light model's file stem."""
    if name == "small":
        return small_model().SerializeToString()
    return (LIGHT_MODELS / f"{name}.onnx").read_bytes()


def _random_node(rng: random.Random, model: onnx.ModelProto) -> onnx.NodeProto | None:
    nodes = list(model.graph.node)
    return rng.choice(nodes) if nodes else None


def _field_mutation(rng: random.Random, model: onnx.ModelProto) -> str:
    """Change one field of a parsed model; returns what was done."""
    graph = model.graph
    node = _random_node(rng, model)
    choice = rng.randrange(16)
    if choice == 0 and node is not None:
        node.op_type = rng.choice(["Relu", "Add", "MatMul", "Conv", "Softmax", "Reshape", "Gemm",
                                   "NoSuchOp", "", "Loop", "If", "Concat", "Transpose", "Identity"])
        return f"op_type of {node.name or node.output[0]} -> {node.op_type}"
    if choice == 1 and node is not None:
        graph.node.remove(node)
        return "node removed"
    if choice == 2 and len(graph.node) > 1:
        i, j = rng.randrange(len(graph.node)), rng.randrange(len(graph.node))
        a, b = onnx.NodeProto(), onnx.NodeProto()
        a.CopyFrom(graph.node[i])
        b.CopyFrom(graph.node[j])
        graph.node[i].CopyFrom(b)
        graph.node[j].CopyFrom(a)
        return "two nodes swapped"
    if choice == 3 and node is not None and node.input:
        names = [n for other in graph.node for n in other.output] + [i.name for i in graph.input]
        index = rng.randrange(len(node.input))
        node.input[index] = rng.choice([*names, "", "missing_value"])
        return f"input {index} of a node rewired to {node.input[index]!r}"
    if choice == 4 and node is not None and node.attribute:
        attribute = rng.choice(node.attribute)
        value = rng.choice([0, -1, 1, 2, 3, 7, 2**31, -(2**40), 10**6])
        if attribute.type == onnx.AttributeProto.INT:
            attribute.i = value
        elif attribute.type == onnx.AttributeProto.INTS and attribute.ints:
            attribute.ints[rng.randrange(len(attribute.ints))] = value
        elif attribute.type == onnx.AttributeProto.FLOAT:
            attribute.f = rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e30])
        elif attribute.type == onnx.AttributeProto.STRING:
            attribute.s = rng.choice([b"", b"NOTSET", b"SAME_UPPER", b"garbage", b"\xff"])
        else:
            attribute.name = "no_such_attribute"
        return f"attribute {attribute.name} changed"
    if choice == 5 and node is not None:
        node.attribute.add().CopyFrom(helper.make_attribute("no_such_attribute", 1))
        return "unknown attribute added"
    if choice == 6 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        if tensor.dims:
            tensor.dims[rng.randrange(len(tensor.dims))] = rng.choice([0, 1, 3, 10**6, -1])
        return f"dims of initializer {tensor.name} changed"
    if choice == 7 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        graph.initializer.remove(tensor)
        return f"initializer {tensor.name} removed"
    if choice == 8 and graph.input:
        info = rng.choice(graph.input)
        info.type.tensor_type.elem_type = rng.choice([0, 2, 6, 7, 8, 9, 10, 11, 16, 99])
        return f"element type of input {info.name} -> {info.type.tensor_type.elem_type}"
    if choice == 9 and graph.input:
        dims = rng.choice(graph.input).type.tensor_type.shape.dim
        if dims:
            dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 1, 2, 5, 10**5])
        return "an input dimension changed"
    if choice == 10 and model.opset_import:
        model.opset_import[0].version = rng.choice([0, 1, 6, 9, 13, 22, 10**6])
        return f"opset -> {model.opset_import[0].version}"
    if choice == 11 and node is not None:
        node.domain = rng.choice(["com.example", "ai.onnx.ml", "ai.onnx", "\u00e9"])
        return f"domain -> {node.domain}"
    if choice == 12 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        if tensor.raw_data:
            tensor.raw_data = tensor.raw_data[:rng.randrange(len(tensor.raw_data) + 1)]
            return f"raw data of {tensor.name} truncated"
    if choice == 13 and node is not None:
        graph.node.append(onnx.NodeProto())
        graph.node[-1].CopyFrom(node)
        return "a node duplicated"
    if choice in (14, 15) and graph.initializer:
        tensor = rng.choice(graph.initializer)
        try:
            values = onnx.numpy_helper.to_array(tensor).copy()
        except ValueError:  # an earlier mutation broke it already
            values = np.zeros(0)
        if values.size and values.dtype.kind in "iuf":
            flat = values.reshape(-1)
            candidates = [0, 1, 2, 3, 7, -1, 255, 2**31 - 1] if values.dtype.kind in "iu" else [
                0.0, -1.0, 1e30, float("nan"), float("inf"), -0.0]
            if values.dtype.kind == "u":
                candidates = [c for c in candidates if c >= 0]
            flat[rng.randrange(flat.size)] = rng.choice(candidates)
            tensor.CopyFrom(onnx.numpy_helper.from_array(values, tensor.name))
            return f"a value of initializer {tensor.name} changed"
    model.ir_version = rng.choice([0, 1, 3, 7, 10, 11, 99])
    return f"ir_version -> {model.ir_version}"


def mutate_model(data: bytes, seed: int) -> tuple[bytes, str]:
    """One mutation of a serialized model: bytes (flips, overwrites, truncation, insertion)
    or a field of the parsed model. Returns the new bytes and a description."""
    rng = random.Random(seed)
    if rng.random() < 0.4:
        kind = rng.choice(["flip_bits", "overwrite_bytes", "truncate", "insert"])
        if kind == "insert":
            position = rng.randrange(len(data) + 1)
            return data[:position] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) \
                + data[position:], "bytes inserted"
        return MUTATIONS[kind](rng, data), kind
    model = onnx.load_from_string(data)
    done = [_field_mutation(rng, model) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    return model.SerializeToString(), "; ".join(done)


def feeds_for(session: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    from onnx_light.kernels.base import numpy_dtype
    from onnx_light.tuning.keys import element_type_code

    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in (arg.shape or [])]
        if int(np.prod(shape, dtype=np.int64)) > 1 << 24:
            raise ValueError(f"input {arg.name} of shape {shape} is too large for the fuzzer")
        try:
            dtype = numpy_dtype(element_type_code(arg.type))
        except (ValueError, TypeError, KeyError):
            dtype = np.dtype(np.float32)
        if dtype.kind == "O":
            feeds[arg.name] = np.full(shape, "a", dtype=object)
        elif dtype.kind == "b":
            feeds[arg.name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            feeds[arg.name] = rng.integers(0, 3, size=shape).astype(dtype)
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def classify_model(data: bytes) -> tuple[str, str]:
    """Build and run one (possibly broken) model; returns (outcome, message). The outcome is
    ``"ran"``, or ``"<stage>: <ErrorType>"`` with stage ``construction`` or ``run``, with
    `` (MemoryError)`` appended when a node ran out of memory (the runtime wraps it in a
    RuntimeError naming the node) and `` (unexpected)`` when the error is neither that nor a
    ValueError or TypeError, or has no message."""
    from onnx_light import RuntimeSession

    stage = "construction"
    try:
        session = RuntimeSession(data, num_threads=2)
        stage = "run"
        session.run(None, feeds_for(session, np.random.default_rng(0)))
    except Exception as exc:
        outcome = f"{stage}: {type(exc).__name__}"
        if isinstance(exc.__cause__, MemoryError):  # a node's output is too large
            outcome += " (MemoryError)"
        elif not isinstance(exc, (ValueError, TypeError)) or not str(exc).strip():
            outcome += " (unexpected)"
        return outcome, str(exc)[:300]
    return "ran", ""


def model_worker() -> None:
    """Read cases ``{"model": name, "seed": n}`` (one JSON per line) from stdin; for each,
    write ``{"outcome": ..., "detail": ...}`` on stdout. The address space is limited so a
    mutated shape cannot take the machine's memory: allocations past it raise MemoryError."""
    import resource

    limit = int(os.environ.get("RELIABILITY_MEMORY_LIMIT", str(4 << 30)))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sources: dict[str, bytes] = {}
    out = sys.stdout
    for line in sys.stdin:
        case = json.loads(line)
        if case["model"] not in sources:
            sources[case["model"]] = model_source(case["model"])
        try:
            data, detail = (mutate_model(sources[case["model"]], case["seed"]) if case["seed"] >= 0
                            else (sources[case["model"]], "original"))
        except Exception as exc:  # a bug of the mutator, not of onnx_light
            out.write(json.dumps({"outcome": "mutation failed", "detail": repr(exc)}) + "\n")
            out.flush()
            continue
        try:
            outcome, message = classify_model(data)
        except MemoryError as exc:
            outcome, message = "MemoryError", str(exc)[:300]
        out.write(json.dumps({"outcome": outcome, "detail": detail, "message": message}) + "\n")
        out.flush()


class ModelWorker:
    """A subprocess running :func:`model_worker`; restarted after a crash or a timeout."""

    def __init__(self, timeout_s: float, nice: int = 0) -> None:
        self.timeout_s = timeout_s
        self.nice = nice
        self.process: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        code = "import _model_fuzzing; _model_fuzzing.model_worker()"
        command = [sys.executable, "-c", code]
        if self.nice:
            command = ["nice", "-n", str(self.nice), *command]
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(TOOLS), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1"}
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=environment, cwd=ROOT)

    def run(self, model: str, seed: int) -> dict[str, str]:
        """One case; the outcome also says ``crash (signal N)`` or ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps({"model": model, "seed": seed}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        if not ready:
            self.close()
            return {"outcome": "timeout", "detail": f"no answer within {self.timeout_s} s"}
        code = self.process.wait(timeout=30)
        self.close()
        return {"outcome": f"crash (exit {code})", "detail": "the worker died"}

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            self.process = None
