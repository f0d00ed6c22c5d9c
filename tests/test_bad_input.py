"""The bad input catalogue (issue 7): one row per case.

* every public function given wrong types, unknown kernels, parameters and element types,
  out-of-range values, invalid paths and locations where nothing can be written: a clear
  exception (type and message), with the registry generation and every file unchanged;
* every CLI subcommand likewise: a non-zero exit status and exactly one line on stderr;
* broken models (bytes, graphs, types, feeds) and fuzzed mutations of small and real
  models: a ValueError or TypeError with a message, at construction or at run, never a
  crash and never a hang (a timeout per case; the fuzzed ones run in a worker process).

As root, chmod does not stop writes, so "read-only" locations are a path below a regular
file (the folder cannot exist) and ``/proc`` (nothing can be created there).
The cases that the existing tests already cover (test_api_cli.py, test_session.py) are not
repeated here.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from _model_fuzzing import ModelWorker, feeds_for, model_source
from _small_model import small_feeds, small_model
from onnx import TensorProto, helper

import onnx_light
from onnx_light import RuntimeSession
from onnx_light.cli import main
from onnx_light.runtime import InvalidInputError, UnsupportedOperatorError
from onnx_light.tuning import default_registry
from onnx_light.tuning.cache import CacheEntry, update_cache
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.processor import execution_descriptor
from onnx_light.tuning.schema import KernelTuningSchema, Parameter

MIN = "parallel.minimum_elements"
ADD = KernelTuningKey("onnx_light", "Add", "portable", "float")


MANUAL = KernelTuningKey("badinput", "BadInputManual", "portable", "float")  # a schema without callback


@pytest.fixture(scope="module", autouse=True)
def _schema_only_key():
    registry = default_registry()
    if MANUAL not in registry.snapshot().schemas:
        registry.register(schemas=[KernelTuningSchema(MANUAL, (Parameter(MIN, "int", 10, minimum=1),))])


@dataclasses.dataclass
class Sandbox:
    """A folder with a cache file, a model, a regular file used as a "folder" and .npy inputs."""

    root: Path
    cache: Path
    blocker: Path
    model: Path

    def state(self) -> tuple[int, dict[str, bytes | str]]:
        """The registry generation and every file under the root (the default cache's folder
        included); lock files aside, which an update may create before failing."""
        files: dict[str, bytes | str] = {}
        for item in sorted(self.root.rglob("*")):
            if item.name.endswith(".lock"):
                continue
            key = str(item.relative_to(self.root))
            files[key] = ("-> " + os.readlink(item) if item.is_symlink() else
                          item.read_bytes() if item.is_file() else "<dir>")
        return default_registry().generation, files

    def proposal(self, **changes: Any) -> dict[str, Any]:
        proposal = onnx_light.propose_kernel_tuning_updates("Abs", "int8", path=self.cache,
                                                            num_threads=2)
        return {**proposal, **changes}


@pytest.fixture
def sandbox(tmp_path: Path, isolated_tuning: Path) -> Sandbox:
    cache = tmp_path / "cache.txt"
    update_cache(cache, [CacheEntry(ADD, execution_descriptor(2), {MIN: 4321}, {"origin": "manual"})])
    with cache.open("a") as handle:
        handle.write("a damaged line: any write would leave a backup\n")
    blocker = tmp_path / "regular-file"
    blocker.write_text("I am not a folder")
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), model)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    np.save(inputs / "x.npy", small_feeds()["x"])
    np.save(inputs / "x_int32.npy", small_feeds()["x"].astype(np.int32))
    np.save(inputs / "x_pickled.npy", np.array([_Marker(tmp_path / "executed")], dtype=object),
            allow_pickle=True)
    (inputs / "not_npy.npy").write_bytes(b"\x93NUMPY garbage")
    bad = tmp_path / "models"
    bad.mkdir()
    (bad / "garbage.onnx").write_bytes(b"\x00\x01 this is no model \xff" * 10)
    onnx.save(_unsupported_model(), bad / "unsupported.onnx")
    yield Sandbox(tmp_path, cache, blocker, model)
    assert not (tmp_path / "executed").exists()


class _Marker:
    """Unpickling creates the file: proof that something was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _unsupported_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Foo", ["x"], ["a"], domain="com.example"),
             helper.make_node("Bar", ["a"], ["y"], domain="com.example")]
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.example", 1)])


def _session() -> RuntimeSession:
    return RuntimeSession(small_model(), num_threads=2)


k = onnx_light.kernel_tuning_parameters
set_ = onnx_light.set_kernel_tuning_parameters
reset = onnx_light.reset_kernel_tuning_parameters
calibrate = onnx_light.calibrate_kernel_tuning
propose = onnx_light.propose_kernel_tuning_updates
apply = onnx_light.apply_kernel_tuning_updates
X = small_feeds()["x"]
QUICK = {"num_threads": 2, "max_duration_ms": 30}  # a real calibration, briefly

Case = tuple[str, Callable[[Sandbox], Any], type, str]

FUNCTION_CASES: list[Case] = [
    # kernel_tuning_parameters
    ("parameters: a kernel list holding a number", lambda s: k(["Add", 5]), TypeError,
     "kernel must be strings"),
    ("parameters: element type 3.5", lambda s: k("Add", 3.5), TypeError,
     "element type must be an int, a name, a numpy dtype or a list of them, got float"),
    ("parameters: element type 999", lambda s: k("Add", 999), ValueError,
     "unknown ONNX element type 999; valid: float"),
    ("parameters: unknown implementation", lambda s: k("Add", implementation="blocked"), KeyError,
     "unknown implementation blocked; known: portable"),
    ("parameters: library not a string", lambda s: k("Add", library=7), TypeError,
     "library must be a string or a list of strings, got int"),
    ("parameters: path of a wrong type", lambda s: k(path=3.5), TypeError,
     "path must be a str or os.PathLike, got float"),
    ("parameters: num_threads as text", lambda s: k("Add", num_threads="2"), TypeError,
     "num_threads must be an int, got str"),
    # inspect_kernel_tuning_cache
    ("inspect: path of a wrong type", lambda s: onnx_light.inspect_kernel_tuning_cache(["x"]),
     TypeError, "path must be a str or os.PathLike, got list"),
    ("inspect: negative num_threads",
     lambda s: onnx_light.inspect_kernel_tuning_cache(s.cache, num_threads=-1), ValueError,
     "num_threads"),
    # load_kernel_tuning_cache
    ("load: path as bytes", lambda s: onnx_light.load_kernel_tuning_cache(bytes(s.cache)),
     TypeError, "path must be a str or os.PathLike, got bytes"),
    ("load: num_threads as a float",
     lambda s: onnx_light.load_kernel_tuning_cache(s.cache, num_threads=2.0), TypeError,
     "num_threads must be an int, got float"),
    # set_kernel_tuning_parameters
    ("set: element type 999", lambda s: set_("Add", 999, {MIN: 5}, path=s.cache), ValueError,
     "unknown ONNX element type 999"),
    ("set: unknown library", lambda s: set_("Add", "float", {MIN: 5}, library="nolib", path=s.cache),
     KeyError, "unknown library nolib; known: "),
    ("set: unknown implementation",
     lambda s: set_("Add", "float", {MIN: 5}, implementation="fast", path=s.cache), KeyError,
     "unknown implementation fast"),
    ("set: a choice not offered",
     lambda s: set_("MatMul", "float", {"parallel.mode": "fast"}, path=s.cache), ValueError,
     "'parallel.mode': 'fast' is not one of ['tiles', 'blas', 'split_rows', 'split_columns', 'split']"),
    ("set: below the minimum of another parameter",
     lambda s: set_("MatMul", "float", {"split.minimum_rows": -3}, path=s.cache), ValueError,
     "'split.minimum_rows': -3 is below the minimum 1"),
    ("set: a float for an int", lambda s: set_("Add", "float", {MIN: 10.5}, path=s.cache),
     TypeError, "expected int, got float 10.5"),
    ("set: NaN", lambda s: set_("Add", "float", {MIN: float("nan")}, path=s.cache), TypeError,
     "expected int, got float nan"),
    ("set: None", lambda s: set_("Add", "float", {MIN: None}, path=s.cache), TypeError,
     "expected int, got NoneType None"),
    ("set: a parameter name that is a number", lambda s: set_("Add", "float", {5: 10}, path=s.cache),
     KeyError, "unknown parameter 5; valid: ['parallel.minimum_elements']"),
    ("set: num_threads zero", lambda s: set_("Add", "float", {MIN: 5}, path=s.cache, num_threads=0),
     ValueError, "num_threads"),
    ("set: cache below a regular file",
     lambda s: set_("Add", "float", {MIN: 5}, path=s.blocker / "cache.txt"), FileExistsError,
     "cannot be written (File exists: "),
    ("set: cache two levels below a regular file",
     lambda s: set_("Add", "float", {MIN: 5}, path=s.blocker / "sub" / "cache.txt"),
     NotADirectoryError, "cannot be written (Not a directory: "),
    ("set: cache in /proc",
     lambda s: set_("Add", "float", {MIN: 5}, path="/proc/self/onnx-light-cache.txt"),
     FileNotFoundError, "kernel tuning cache /proc/self/onnx-light-cache.txt cannot be written"),
    ("set: cache is a folder", lambda s: set_("Add", "float", {MIN: 5}, path=s.root),
     IsADirectoryError, "exists and is not a regular file"),
    ("set: the lock file is a folder",
     lambda s: (Path(str(s.cache) + ".lock").unlink(), Path(str(s.cache) + ".lock").mkdir(),
                set_("Add", "float", {MIN: 5}, path=s.cache)),
     IsADirectoryError, "cannot be written (Is a directory: "),
    ("set: a NUL byte in the path", lambda s: set_("Add", "float", {MIN: 5}, path=f"{s.root}/a\0b"),
     ValueError, "null byte"),
    # reset_kernel_tuning_parameters
    ("reset: unknown kernel", lambda s: reset("Nope", path=s.cache), KeyError, "unknown kernel Nope"),
    ("reset: unknown element type", lambda s: reset("Add", "quux", path=s.cache), ValueError,
     "unknown ONNX element type 'quux'"),
    ("reset: path of a wrong type", lambda s: reset("Add", "float", path=3), TypeError,
     "path must be a str or os.PathLike, got int"),
    ("reset: cache is a folder", lambda s: reset("Add", "float", path=s.root), IsADirectoryError,
     "exists and is not a regular file"),
    ("reset: a file in /proc", lambda s: reset("Add", "float", path="/proc/self/status"),
     FileNotFoundError, "kernel tuning cache /proc/self/status cannot be written"),
    # calibrate_kernel_tuning
    ("calibrate: kernel is a number", lambda s: calibrate(5, path=s.cache), TypeError,
     "kernel must be a string or a list of strings, got int"),
    ("calibrate: unknown kernel", lambda s: calibrate("Nope", path=s.cache), KeyError,
     "unknown kernel Nope"),
    ("calibrate: unknown element type", lambda s: calibrate("Add", "quux", path=s.cache), ValueError,
     "unknown ONNX element type 'quux'"),
    ("calibrate: zero duration", lambda s: calibrate("Add", "float", max_duration_ms=0, path=s.cache),
     ValueError, "max_duration_ms must be a number > 0, got 0"),
    ("calibrate: NaN duration",
     lambda s: calibrate("Add", "float", max_duration_ms=float("nan"), path=s.cache), ValueError,
     "max_duration_ms must be a number > 0, got nan"),
    ("calibrate: duration as text", lambda s: calibrate("Add", "float", max_duration_ms="100"),
     ValueError, "max_duration_ms must be a number > 0, got '100'"),
    ("calibrate: duration True", lambda s: calibrate("Add", "float", max_duration_ms=True),
     ValueError, "max_duration_ms must be a number > 0, got True"),
    ("calibrate: zero memory",
     lambda s: calibrate("Add", "float", max_memory_bytes=0, num_threads=2, path=s.cache),
     ValueError, "max_memory_bytes must be an int > 0, got 0"),
    ("calibrate: memory as a float",
     lambda s: calibrate("Add", "float", max_memory_bytes=1e9, num_threads=2, path=s.cache),
     ValueError, "max_memory_bytes must be an int > 0, got 1000000000.0"),
    ("calibrate: cache below a regular file",
     lambda s: calibrate("Abs", "int8", path=s.blocker / "c.txt", **QUICK), FileExistsError,
     "cannot be written"),
    # propose_kernel_tuning_updates
    ("propose: kernels is a number", lambda s: propose(5, path=s.cache), TypeError,
     "kernel must be a string or a list of strings, got int"),
    ("propose: unknown library", lambda s: propose("Add", library="nolib", path=s.cache), KeyError,
     "unknown library nolib"),
    ("propose: path of a wrong type", lambda s: propose("Add", path=1), TypeError,
     "path must be a str or os.PathLike, got int"),
    ("propose: zero threads", lambda s: propose("Add", path=s.cache, num_threads=0), ValueError,
     "num_threads"),
    # apply_kernel_tuning_updates
    ("apply: None", lambda s: apply(None), TypeError,
     "proposal must be the dict returned by propose_kernel_tuning_updates"),
    ("apply: no descriptor", lambda s: apply({"missing_calibratable": []}), TypeError,
     "proposal must be the dict returned by propose_kernel_tuning_updates"),
    ("apply: keys given as one string",
     lambda s: apply(s.proposal(missing_calibratable="onnx_light/Abs/portable[int8]@cpu#1")),
     TypeError, "proposal must be the dict returned by propose_kernel_tuning_updates"),
    ("apply: a descriptor that is no descriptor",
     lambda s: apply(s.proposal(descriptor={"cpu": 5, "num_threads": 2})), ValueError,
     "cpu must be a dict, got int"),
    ("apply: a key that is no key", lambda s: apply(s.proposal(missing_calibratable=["Abs"])),
     ValueError, "not a kernel tuning key: 'Abs'"),
    ("apply: an unregistered key",
     lambda s: apply(s.proposal(missing_calibratable=["nolib/X/portable[float]@cpu#1"])), KeyError,
     "no kernel tuning schema registered for nolib/X/portable[float]@cpu#1"),
    ("apply: a schema-only key",
     lambda s: apply(s.proposal(missing_calibratable=[str(MANUAL)])),
     ValueError, "badinput/BadInputManual/portable[float]@cpu#1 has no calibration callback"),
    ("apply: progress not callable", lambda s: apply(s.proposal(), progress=5), TypeError,
     "progress must be a callable(done, total, key), got int"),
    ("apply: negative duration", lambda s: apply(s.proposal(), max_duration_ms=-1), ValueError,
     "max_duration_ms must be a number > 0, got -1"),
    ("apply: cache in /proc",
     lambda s: apply(s.proposal(), path="/proc/self/onnx-light.txt", max_duration_ms=30),
     FileNotFoundError, "kernel tuning cache /proc/self/onnx-light.txt cannot be written"),
    # RuntimeSession
    ("session: zero threads", lambda s: RuntimeSession(s.model, num_threads=0), ValueError,
     "num_threads"),
    ("session: threads as text", lambda s: RuntimeSession(s.model, num_threads="2"), TypeError,
     "num_threads must be an int, got str"),
    ("session: registry of a wrong type", lambda s: RuntimeSession(s.model, registry="default"),
     TypeError, "registry must be a KernelTuningRegistry, got str"),
    ("session: fuse as text", lambda s: RuntimeSession(s.model, fuse="no"), TypeError,
     "fuse must be True or False, got str"),
    ("session: model is a folder", lambda s: RuntimeSession(s.root), FileNotFoundError,
     "no ONNX model file at"),
    ("session: model below a regular file", lambda s: RuntimeSession(s.blocker / "m.onnx"),
     FileNotFoundError, "no ONNX model file at"),
    ("session: model None", lambda s: RuntimeSession(None), TypeError,
     "model must be an onnx.ModelProto, a path or bytes, got NoneType"),
    ("session: model /proc/self/mem", lambda s: RuntimeSession("/proc/self/mem"), ValueError,
     "'/proc/self/mem' is not a readable ONNX model"),
    # run
    ("run: feeds as a list", lambda s: _session().run(None, [X]), TypeError,
     "input_feed must be a dict of name -> array, got list"),
    ("run: output names as one string", lambda s: _session().run("y", {"x": X}), TypeError,
     "output_names must be a list of names or None, got the string 'y'"),
    ("run: an output name that is a number", lambda s: _session().run([5], {"x": X}),
     InvalidInputError, "unknown output(s) [5]; outputs: ['y']"),
    ("run: an input name that is a number", lambda s: _session().run(None, {1: X}),
     InvalidInputError, "unknown input(s) [1]; inputs: ['x']"),
    ("run: a ragged list", lambda s: _session().run(None, {"x": [[1.0], [1.0, 2.0]]}),
     InvalidInputError, "input 'x': not an array"),
    ("run: None", lambda s: _session().run(None, {"x": None}), InvalidInputError,
     "input 'x': expected element type tensor(float) (float32), got object"),
    ("run: int32 data", lambda s: _session().run(None, {"x": X.astype(np.int32)}),
     InvalidInputError, "got int32"),
    ("run: strings", lambda s: _session().run(None, {"x": np.full(X.shape, "a")}),
     InvalidInputError, "got <U1"),
    ("run: a scalar", lambda s: _session().run(None, {"x": np.float32(1)}), InvalidInputError,
     "expected rank 2"),
    ("run: a wrong dimension", lambda s: _session().run(None, {"x": X[:, :3]}), InvalidInputError,
     "dimension 1 must be 48"),
]


@pytest.mark.parametrize(("call", "error", "message"),
                         [pytest.param(c, e, m, id=i) for i, c, e, m in FUNCTION_CASES])
def test_public_functions_reject_bad_input_and_change_nothing(sandbox: Sandbox, call, error: type,
                                                              message: str) -> None:
    before = sandbox.state()
    with pytest.raises(error) as info:
        call(sandbox)
    text = str(info.value)
    assert message in text
    assert "\n" not in text and len(text) < 1000
    if error is ValueError:
        assert not isinstance(info.value, (TypeError, KeyError))
    assert sandbox.state() == before


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------

QUICK_APPLY = ["--apply", "--quiet", "--kernel", "Abs", "--element-type", "int8", "--threads", "2",
               "--max-duration-ms", "30"]

CLI_CASES: list[tuple[str, Callable[[Sandbox], list[str]], str]] = [
    ("no subcommand", lambda s: [], "the following arguments are required: COMMAND"),
    ("unknown subcommand", lambda s: ["tune"], "invalid choice: 'tune'"),
    ("tune-kernels: unknown option", lambda s: ["tune-kernels", "--fast"],
     "unrecognized arguments: --fast"),
    ("tune-kernels: duration not a number", lambda s: ["tune-kernels", "--max-duration-ms", "abc"],
     "argument --max-duration-ms: expected a positive number, got 'abc'"),
    ("tune-kernels: negative duration",
     lambda s: ["tune-kernels", "--apply", "--kernel", "Add", "--element-type", "float", "--cache",
                str(s.cache), "--max-duration-ms", "-5"], "expected a positive number, got -5"),
    ("tune-kernels: zero memory", lambda s: ["tune-kernels", "--max-memory-mb", "0"],
     "expected a positive integer, got 0"),
    ("tune-kernels: threads not a number", lambda s: ["tune-kernels", "--threads", "many"],
     "expected a positive integer, got 'many'"),
    ("tune-kernels: element type 999",
     lambda s: ["tune-kernels", "--kernel", "Add", "--element-type", "999"],
     "unknown ONNX element type 999"),
    ("tune-kernels: unknown kernel with a cache",
     lambda s: ["tune-kernels", "--kernel", "Nope", "--cache", str(s.cache)], "unknown kernel Nope"),
    ("tune-kernels --apply: cache below a regular file",
     lambda s: ["tune-kernels", *QUICK_APPLY, "--cache", str(s.blocker / "c.txt")],
     "cannot be written (File exists: "),
    ("tune-kernels --apply: cache in /proc",
     lambda s: ["tune-kernels", *QUICK_APPLY, "--cache", "/proc/self/onnx-light.txt"],
     "kernel tuning cache /proc/self/onnx-light.txt cannot be written"),
    ("tune-kernels --apply: cache is a folder",
     lambda s: ["tune-kernels", *QUICK_APPLY, "--cache", str(s.root)], "is not a regular file"),
    ("run: no model", lambda s: ["run"], "the following arguments are required: model"),
    ("run: missing model", lambda s: ["run", str(s.root / "absent.onnx")], "no ONNX model file at"),
    ("run: model is a folder", lambda s: ["run", str(s.root)], "no ONNX model file at"),
    ("run: garbage model", lambda s: ["run", str(s.root / "models" / "garbage.onnx")],
     "is not a readable ONNX model"),
    ("run: unsupported operators (a multi-line message)",
     lambda s: ["run", str(s.root / "models" / "unsupported.onnx")],
     "the model uses 2 unsupported operator(s):; com.example::Foo"),
    ("run: --input without a file", lambda s: ["run", str(s.model), "--input", "x"],
     "--input expects NAME=FILE.npy, got 'x'"),
    ("run: --input missing file",
     lambda s: ["run", str(s.model), "--input", f"x={s.root / 'inputs' / 'absent.npy'}"],
     "No such file or directory"),
    ("run: --input not a .npy file",
     lambda s: ["run", str(s.model), "--input", f"x={s.root / 'inputs' / 'not_npy.npy'}"],
     "error: "),
    ("run: --input a pickled object array (never unpickled)",
     lambda s: ["run", str(s.model), "--input", f"x={s.root / 'inputs' / 'x_pickled.npy'}"],
     "allow_pickle=False"),
    ("run: --input of the wrong element type",
     lambda s: ["run", str(s.model), "--input", f"x={s.root / 'inputs' / 'x_int32.npy'}"],
     "input 'x': expected element type tensor(float) (float32), got int32"),
    ("run: --input for an unknown input",
     lambda s: ["run", str(s.model), "--input", f"z={s.root / 'inputs' / 'x.npy'}"],
     "unknown input(s) ['z']"),
    ("run: zero repeats", lambda s: ["run", str(s.model), "--repeat", "0"],
     "expected a positive integer, got 0"),
    ("run: negative threads", lambda s: ["run", str(s.model), "--threads", "-1"],
     "expected a positive integer, got -1"),
    ("run: --output below a regular file",
     lambda s: ["run", str(s.model), "--repeat", "1", "--output", str(s.blocker / "out.npz")],
     "Not a directory"),
    ("cpu: zero threads", lambda s: ["cpu", "--threads", "0"], "expected a positive integer, got 0"),
    ("cpu: threads not a number", lambda s: ["cpu", "--threads", "x"],
     "expected a positive integer, got 'x'"),
    ("cpu: extra argument", lambda s: ["cpu", "extra"], "unrecognized arguments: extra"),
]


@pytest.mark.parametrize(("argv", "message"), [pytest.param(a, m, id=i) for i, a, m in CLI_CASES])
def test_cli_rejects_bad_input_with_one_line(sandbox: Sandbox, capsys, argv, message: str) -> None:
    _, files = sandbox.state()
    try:
        status = main(argv(sandbox))
    except SystemExit as exit_:  # argparse's usage errors
        status = exit_.code
    _, err = capsys.readouterr()
    assert status == 2
    *warnings, error = err.splitlines()  # warnings (a busy machine, a damaged cache) may come first
    assert all(line.startswith("warning: ") for line in warnings), err
    assert err.endswith("\n") and message in error, err
    assert "Traceback" not in err
    assert sandbox.state()[1] == files


# --------------------------------------------------------------------------------------------
# Broken models
# --------------------------------------------------------------------------------------------

def _model(nodes, inputs, outputs, initializers=(), opsets=(("", 21),)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def _info(name: str, element_type: int = TensorProto.FLOAT, shape=(2,)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, element_type, list(shape))


def _short_initializer() -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.raw_data = w.raw_data[:8]
    return _model([helper.make_node("Add", ["x", "w"], ["z"])], [_info("x", shape=[4])],
                  [_info("z", shape=[4])], [w])


def _light(name: str) -> bytes:
    return model_source(name)


def _flipped(data: bytes, seed: int, flips: int) -> bytes:
    rng, out = random.Random(seed), bytearray(data)
    for _ in range(flips):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


SMALL = small_model().SerializeToString()
ANY = ""  # any message, as long as there is one

# (id, model, feeds or None for the small model's, stage, error type, message)
MODEL_CASES: list[tuple[str, Callable[[], Any], Callable[[], dict] | None, str, type, str]] = [
    ("truncated bytes", lambda: SMALL[: len(SMALL) // 2], None, "construction", ValueError,
     "the bytes are not a serialized ONNX model"),
    ("random bytes", lambda: bytes(random.Random(1).randrange(256) for _ in range(512)), None,
     "construction", ValueError, "the bytes are not a serialized ONNX model"),
    ("empty bytes", lambda: b"", None, "construction", ValueError, "invalid ONNX model"),
    ("a cycle", lambda: _model([helper.make_node("Add", ["x", "b"], ["a"]),
                                helper.make_node("Relu", ["a"], ["b"])], [_info("x")], [_info("a")]),
     None, "construction", ValueError, "topologically sorted"),
    ("an unknown operator", lambda: _model([helper.make_node("Frobnicate", ["x"], ["z"])],
                                           [_info("x")], [_info("z")]),
     None, "construction", ValueError, "No Op registered for Frobnicate"),
    ("an unknown domain", lambda: _unsupported_model(), None, "construction",
     UnsupportedOperatorError, "com.example::Foo (opset 1): domain 'com.example' is not supported"),
    ("a domain without opset", lambda: _model([helper.make_node("Foo", ["x"], ["z"], domain="x.y")],
                                              [_info("x")], [_info("z")]),
     None, "construction", ValueError, "No opset import for domain 'x.y'"),
    ("a missing initializer", lambda: _model([helper.make_node("Add", ["x", "w"], ["z"])],
                                             [_info("x")], [_info("z")]),
     None, "construction", ValueError, "input 'w' of node"),
    ("an initializer shorter than its shape", _short_initializer, None, "construction", ValueError,
     "raw_data size (8 bytes) is too small"),
    ("mismatched element types", lambda: _model([helper.make_node("Add", ["x", "y"], ["z"])],
                                                [_info("x"), _info("y", TensorProto.INT64)],
                                                [_info("z")]),
     None, "construction", ValueError, "inconsistent type"),
    ("mismatched shapes", lambda: _model([helper.make_node("MatMul", ["x", "y"], ["z"])],
                                         [_info("x", shape=(2, 3)), _info("y", shape=(4, 5))],
                                         [_info("z", shape=(2, 5))]),
     None, "construction", ValueError, "Incompatible dimensions"),
    ("too few inputs", lambda: _model([helper.make_node("Add", ["x"], ["z"])], [_info("x")],
                                      [_info("z")]),
     None, "construction", ValueError, "input size 1 not in range"),
    ("an attribute of the wrong type",
     lambda: _model([helper.make_node("Transpose", ["x"], ["z"], perm=1.5)],
                    [_info("x", shape=(2, 3))], [_info("z", shape=(3, 2))]),
     None, "construction", ValueError, "Mismatched attribute type"),
    ("an output no node produces", lambda: _model([helper.make_node("Relu", ["x"], ["z"])],
                                                  [_info("x")], [_info("q")]),
     None, "construction", ValueError, "Graph output 'q' is not an output of any node"),
    ("a string input to Relu", lambda: _model([helper.make_node("Relu", ["x"], ["z"])],
                                              [_info("x", TensorProto.STRING)],
                                              [_info("z", TensorProto.STRING)]),
     None, "construction", ValueError, "Relu"),
    ("an index out of range at run", lambda: _model(
        [helper.make_node("Gather", ["x", "i"], ["z"])],
        [_info("x", shape=(3,)), _info("i", TensorProto.INT64, (1,))], [_info("z", shape=(1,))]),
     lambda: {"x": np.ones(3, np.float32), "i": np.array([7])}, "run", ValueError,
     "indices must lie in [-3, 2], got [7"),
    ("an input of the wrong shape", small_model, lambda: {"x": X[:5]}, "run", InvalidInputError,
     "input 'x': dimension 0 must be 64, got shape (5, 48)"),
    ("an input of the wrong dtype", small_model, lambda: {"x": X.astype(np.float16)}, "run",
     InvalidInputError, "got float16"),
    ("a missing input", small_model, lambda: {}, "run", InvalidInputError, "missing input(s) ['x']"),
    *[(f"squeezenet with bits flipped ({seed})",
       lambda seed=seed: _flipped(_light("light_squeezenet"), seed, 4), None, "any", ValueError, ANY)
      for seed in range(4)],
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("model", "feeds", "stage", "error", "message"),
                         [pytest.param(*row[1:], id=row[0]) for row in MODEL_CASES])
def test_broken_models_give_a_clear_error(model, feeds, stage: str, error: type, message: str) -> None:
    source = model()
    built = None
    try:
        built = RuntimeSession(source, num_threads=2)
        if feeds is None and stage == "any":
            built.run(None, feeds_for(built, np.random.default_rng(0)))
            return  # a mutation that still runs is fine
        built.run(None, small_feeds() if feeds is None else feeds())
    except Exception as exc:
        assert isinstance(exc, error), (type(exc), exc)
        assert message in str(exc) and str(exc).strip()
        assert stage in ("any", "run" if built is not None else "construction")
        return
    pytest.fail("no error")


def test_fuzzed_models_never_crash_or_hang() -> None:
    """Mutated small and light models, one at a time in a worker process (memory-limited,
    60 s per case): every outcome is a run or a ValueError/TypeError with a message."""
    worker = ModelWorker(timeout_s=60)
    outcomes: dict[str, int] = {}
    bad = []
    try:
        for seed in range(90):
            model = ("small", "light_squeezenet", "light_inception_v1")[seed % 3]
            result = worker.run(model, seed)
            outcomes[result["outcome"]] = outcomes.get(result["outcome"], 0) + 1
            if not (result["outcome"] in ("ran", "MemoryError") or (
                    result["outcome"].startswith(("construction: ", "run: "))
                    and not result["outcome"].endswith("(unexpected)"))):
                bad.append((model, seed, result))
    finally:
        worker.close()
    assert bad == [], bad
    assert outcomes.get("ran", 0) >= 1 and sum(outcomes.values()) == 90


@pytest.mark.timeout(120)
def test_the_worker_reports_crashes_and_hangs(monkeypatch) -> None:
    """The fuzzing harness itself: a case without an answer in time is a timeout, a worker
    that dies is a crash, and the next case runs in a fresh worker."""
    worker = ModelWorker(timeout_s=0.01)  # nothing answers that fast
    try:
        assert worker.run("small", -1)["outcome"] == "timeout"
        worker.timeout_s = 60
        assert worker.run("small", -1)["outcome"] == "ran"
        worker.close()
        monkeypatch.setenv("RELIABILITY_MEMORY_LIMIT", "not a number")  # the worker dies at start
        assert worker.run("small", -1)["outcome"].startswith("crash")
    finally:
        worker.close()


# Memory bombs (issue 14, item 5): nodes whose outputs would take hundreds of GiB.
def _i64(name: str, values) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(values, np.int64), name)


def _f32(name: str, values) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(values, np.float32), name)


HUGE = [100_000, 100_000, 10]  # 1e11 elements: 373 GiB of float32
# (id, node, its initializers, output rank)
BOMBS = [
    ("ConstantOfShape", helper.make_node("ConstantOfShape", ["s"], ["y"], name="bomb"),
     [_i64("s", HUGE)], 3),
    ("Range", helper.make_node("Range", ["a", "b", "c"], ["y"], name="bomb"),
     [_f32("a", 0), _f32("b", 1e12), _f32("c", 1)], 1),
    ("Expand", helper.make_node("Expand", ["a", "s"], ["y"], name="bomb"),
     [_f32("a", [1.0]), _i64("s", HUGE)], 3),
    ("Tile", helper.make_node("Tile", ["a", "s"], ["y"], name="bomb"),
     [_f32("a", np.ones((2, 2))), _i64("s", [100_000, 1_000_000])], 2),
    ("broadcast Add (sized by shape inference)", helper.make_node("Add", ["a", "b"], ["y"], name="bomb"),
     [_f32("a", np.ones((1_000_000, 1))), _f32("b", np.ones((1, 1_000_000)))], 2),
]


@pytest.mark.parametrize(("node", "initializers", "rank"),
                         [pytest.param(*row[1:], id=row[0]) for row in BOMBS])
def test_a_memory_bomb_of_constants_is_not_folded_and_fails_at_run_naming_its_node(
        node, initializers, rank) -> None:
    model = _model([node], [], [_info("y", shape=[None] * rank)], initializers)
    session = RuntimeSession(model)  # before: a bare MemoryError here
    assert session.folded_nodes == 0
    with pytest.raises(RuntimeError) as info:
        session.run(None, {})
    message = str(info.value)
    assert message.startswith(f"node 'bomb' ({node.op_type}) failed: MemoryError: Unable to allocate")
    assert "iB for an array with shape" in message  # numpy names the size asked for
    assert isinstance(info.value.__cause__, MemoryError)


@pytest.mark.parametrize(("op", "feeds"), [
    ("ConstantOfShape", {"s": np.array(HUGE, np.int64)}),
    ("Range", {"a": np.float32(0), "b": np.float32(1e12), "c": np.float32(1)}),
])
def test_a_memory_bomb_that_depends_on_a_feed_fails_at_run_naming_its_node(op, feeds) -> None:
    inputs = [_info(n, TensorProto.INT64 if op == "ConstantOfShape" else TensorProto.FLOAT,
                    a.shape) for n, a in feeds.items()]
    model = _model([helper.make_node(op, list(feeds), ["y"], name="bomb")], inputs,
                   [_info("y", shape=[None] * (3 if op == "ConstantOfShape" else 1))])
    with pytest.raises(RuntimeError, match=rf"^node 'bomb' \({op}\) failed: MemoryError: "
                                           "Unable to allocate .* [GT]iB"):
        RuntimeSession(model).run(None, feeds)


def test_values_above_the_folding_bound_are_computed_by_every_run(monkeypatch) -> None:
    """Told before computing (the kernel's count, inferred shapes) or measured after (NonZero,
    whose output shape inference leaves open): above the bound, the node runs at run time
    and gives the same values; at the bound it is folded."""
    from onnx_light.runtime import folding

    monkeypatch.setattr(folding, "FOLD_MAXIMUM_BYTES", 4096)
    nodes = [helper.make_node("ConstantOfShape", ["small"], ["a"], value=_f32("v", [2.0])),
             helper.make_node("ConstantOfShape", ["large"], ["b"], value=_f32("v", [3.0])),
             helper.make_node("NonZero", ["ones"], ["c"]),
             helper.make_node("Range", ["zero", "limit", "one"], ["d"])]
    initializers = [_i64("small", [1024]), _i64("large", [1025]), _f32("ones", np.ones(600)),
                    _f32("zero", 0), _f32("limit", 2000), _f32("one", 1)]
    outputs = [_info("a", shape=[1024]), _info("b", shape=[1025]),
               _info("c", TensorProto.INT64, [1, None]), _info("d", shape=[None])]
    session = RuntimeSession(_model(nodes, [], outputs, initializers))
    assert session.folded_nodes == 1  # a (4096 bytes); b, c (4800 bytes) and d (8000) are not
    a, b, c, d = session.run(None, {})
    np.testing.assert_array_equal(a, np.full(1024, 2.0, np.float32))
    np.testing.assert_array_equal(b, np.full(1025, 3.0, np.float32))
    np.testing.assert_array_equal(c, np.arange(600)[None])
    np.testing.assert_array_equal(d, np.arange(2000, dtype=np.float32))


def test_a_memory_error_while_folding_leaves_the_node_to_the_run(monkeypatch) -> None:
    """A node whose size nothing tells in advance and whose folding runs out of memory."""
    from onnx_light.kernels import structural

    calls = []

    def starved(self, x):
        calls.append(x)
        if len(calls) == 1:  # at construction
            raise MemoryError("Unable to allocate 1.00 TiB")
        return [np.array(np.nonzero(x), np.int64).reshape(x.ndim, -1)]

    monkeypatch.setattr(structural.NonZero, "run", starved)
    model = _model([helper.make_node("NonZero", ["ones"], ["c"], name="nz")], [],
                   [_info("c", TensorProto.INT64, [1, None])], [_f32("ones", np.ones(3))])
    session = RuntimeSession(model)
    assert session.folded_nodes == 0
    np.testing.assert_array_equal(session.run(None, {})[0], [[0, 1, 2]])
