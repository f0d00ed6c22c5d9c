"""RuntimeSession: loading, the five initialization steps, captured generations, run()."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnx_light import kernels
from onnx_light.parallel import ThreadPool
from onnx_light.runtime import InvalidInputError, RuntimeSession, UnsupportedOperatorError
from onnx_light.tuning import cache as cache_module
from onnx_light.tuning.keys import KernelTuningKey
from onnx_light.tuning.processor import execution_descriptor
from onnx_light.tuning.registry import KernelTuningRegistry, PublishedProfile, RegistrySnapshot

N = 1 << 14


def _model(nodes, inputs, outputs, opset=21, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _add_model(n=N):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [n])
    return _model([helper.make_node("Add", ["x", "y"], ["z"], name="add")], [x, y], [z])


@pytest.fixture
def registry():
    fresh = KernelTuningRegistry()
    kernels.register(fresh)
    return fresh


ADD_FLOAT = KernelTuningKey("onnx_light", "Add", "portable", "float")


def _publish(registry, threads, minimum):
    registry.publish([PublishedProfile(ADD_FLOAT, execution_descriptor(threads),
                                       {"parallel.minimum_elements": minimum})])


def _feeds(n=N):
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal(n).astype(np.float32),
            "y": rng.standard_normal(n).astype(np.float32)}


def test_model_from_proto_path_and_bytes(tmp_path, registry):
    model = _add_model()
    path = tmp_path / "add.onnx"
    onnx.save(model, path)
    feeds = _feeds()
    expected = feeds["x"] + feeds["y"]
    for source in (model, path, str(path), model.SerializeToString()):
        (z,) = RuntimeSession(source, registry=registry).run(None, feeds)
        np.testing.assert_array_equal(z, expected)


@pytest.mark.parametrize("source, error", [
    (b"\x00garbage\xff", ValueError),
    ("/nonexistent/model.onnx", FileNotFoundError),
    (42, TypeError),
])
def test_bad_model_sources(source, error):
    with pytest.raises(error):
        RuntimeSession(source)


def test_every_unsupported_operator_listed_at_construction():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Foo", ["a"], ["b"], domain="com.example"),
             helper.make_node("Bar", ["b"], ["y"], domain="com.example")]
    model = _model(nodes, [x], [y])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOperatorError) as info:
        RuntimeSession(model)
    message = str(info.value)
    assert "com.example::Foo" in message and "com.example::Bar" in message
    assert len(info.value.operators) == 2


def test_run_signature_and_io_description(registry):
    session = RuntimeSession(_add_model(), registry=registry)
    assert [(a.name, a.type, a.shape) for a in session.get_inputs()] == [
        ("x", "tensor(float)", [N]), ("y", "tensor(float)", [N])]
    assert [a.name for a in session.get_outputs()] == ["z"]
    feeds = _feeds()
    outputs = session.run(["z"], feeds)
    assert isinstance(outputs, list) and len(outputs) == 1
    np.testing.assert_array_equal(outputs[0], feeds["x"] + feeds["y"])


@pytest.mark.parametrize("change, words", [
    (lambda f: {**f, "w": f["x"]}, ["unknown input", "'w'"]),
    (lambda f: {"x": f["x"]}, ["missing input", "'y'"]),
    (lambda f: {**f, "x": f["x"].astype(np.float64)}, ["'x'", "float", "float64"]),
    (lambda f: {**f, "y": f["y"].reshape(2, -1)}, ["'y'", "rank"]),
    (lambda f: {**f, "y": f["y"][:10]}, ["'y'", "dimension 0"]),
])
def test_bad_feeds_name_the_input(registry, change, words):
    session = RuntimeSession(_add_model(), registry=registry)
    with pytest.raises(InvalidInputError) as info:
        session.run(None, change(_feeds()))
    for word in words:
        assert word in str(info.value)


def test_unknown_output_name(registry):
    with pytest.raises(InvalidInputError, match="unknown output"):
        RuntimeSession(_add_model(), registry=registry).run(["nope"], _feeds())


def test_initialization_follows_the_five_steps_in_order(monkeypatch, registry):
    events = []
    add_class = kernels.KERNELS["Add"][max(kernels.KERNELS["Add"])]
    original_init, original_key = add_class.__init__, add_class.tuning_key
    original_configure = add_class.configure
    original_snapshot, original_resolve = registry.snapshot, RegistrySnapshot.resolve

    monkeypatch.setattr(add_class, "__init__",
                        lambda self, ctx: (events.append("dispatch"), original_init(self, ctx))[1])
    monkeypatch.setattr(add_class, "tuning_key",
                        lambda self: (events.append("key"), original_key(self))[1])
    monkeypatch.setattr(registry, "snapshot",
                        lambda: (events.append("snapshot"), original_snapshot())[1])
    monkeypatch.setattr(RegistrySnapshot, "resolve",
                        lambda self, k, d: (events.append("resolve"), original_resolve(self, k, d))[1])
    monkeypatch.setattr(add_class, "configure",
                        lambda self, v: (events.append("configure"), original_configure(self, v))[1])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Add", ["a", "x"], ["z"])]
    RuntimeSession(_model(nodes, [x], [z]), registry=registry)
    # a kernel may name its key again in its own error messages while configuring
    events = [e for i, e in enumerate(events) if not (e == "key" and "snapshot" in events[:i])]
    # both kernels have the same key: it is resolved once
    assert events == ["dispatch", "dispatch", "key", "key", "snapshot", "resolve",
                      "configure", "configure"]


def test_steady_state_run_never_touches_registry_or_cache(monkeypatch, registry):
    session = RuntimeSession(_add_model(), registry=registry)
    feeds = _feeds()

    def forbidden(*args, **kwargs):
        raise AssertionError("registry or cache accessed during run")

    for owner, name in [(KernelTuningRegistry, "snapshot"), (KernelTuningRegistry, "publish"),
                        (RegistrySnapshot, "resolve"), (RegistrySnapshot, "schema"),
                        (cache_module, "read_cache"), (cache_module, "load_into"),
                        (cache_module, "update_cache")]:
        monkeypatch.setattr(owner, name, forbidden)
    for _ in range(50):
        (z,) = session.run(None, feeds)
    np.testing.assert_array_equal(z, feeds["x"] + feeds["y"])


def _count_parallel_calls(monkeypatch):
    calls = []
    original = ThreadPool.parallel_for

    def counting(self, n, fn, **kwargs):
        calls.append(n)
        return original(self, n, fn, **kwargs)

    monkeypatch.setattr(ThreadPool, "parallel_for", counting)
    return calls


def test_existing_session_keeps_its_generation(monkeypatch, registry):
    _publish(registry, 2, 1 << 40)  # serial for this size
    old = RuntimeSession(_add_model(), num_threads=2, registry=registry)
    _publish(registry, 2, 1)  # parallel from one element
    new = RuntimeSession(_add_model(), num_threads=2, registry=registry)
    assert old.generation < new.generation
    assert old.tuning_report()[0]["values"] == {"parallel.minimum_elements": 1 << 40}
    assert new.tuning_report()[0]["values"] == {"parallel.minimum_elements": 1}
    calls = _count_parallel_calls(monkeypatch)
    feeds = _feeds()
    (z_old,) = old.run(None, feeds)
    assert calls == []  # the old session took the serial path
    (z_new,) = new.run(None, feeds)
    assert calls == [N]  # the new one split the work across the pool
    assert z_old.tobytes() == z_new.tobytes()


def test_tuning_report(registry):
    session = RuntimeSession(_add_model(), num_threads=2, registry=registry)
    (entry,) = session.tuning_report()
    assert entry["node"] == "add"
    assert entry["key"] == str(ADD_FLOAT)
    assert entry["source"] == "portable_default"
    assert entry["generation"] == registry.generation
    assert session.tuning_resolution_seconds >= 0


def test_tuning_report_describes_the_plan_that_runs(registry):
    """Folding and fusion come before the tuning step: a folded product has no entry, and a
    Relu fused into its Add leaves the Add's, as the step that runs (the Add broadcasts a
    row, so that it stays an Add rather than the product's residual)."""
    w = np.ones((4, 4), np.float32)
    initializers = [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(w, "v")]
    nodes = [helper.make_node("MatMul", ["w", "v"], ["wv"], name="folded"),
             helper.make_node("MatMul", ["x", "wv"], ["p"], name="product"),
             helper.make_node("Add", ["p", "r"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["z"], name="relu")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    r = helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 4])
    session = RuntimeSession(_model(nodes, [x, r], [z], initializers=initializers), registry=registry)
    assert (session.folded_nodes, session.fused_nodes) == (1, 1)
    assert [entry["node"] for entry in session.tuning_report()] == ["product", "add"]
    unfused = RuntimeSession(_model(nodes, [x, r], [z], initializers=initializers), registry=registry,
                             fold=False, fuse=False)
    assert [entry["node"] for entry in unfused.tuning_report()] == ["folded", "product", "add",
                                                                    "relu"]
    feeds = {"x": np.arange(16, dtype=np.float32).reshape(4, 4) - 8,
             "r": np.array([-40, 3, 0, 25], np.float32)}
    np.testing.assert_allclose(session.run(None, feeds)[0], unfused.run(None, feeds)[0])


def test_sessions_run_from_many_threads(registry):
    _publish(registry, 2, 1)
    session = RuntimeSession(_add_model(), num_threads=2, registry=registry)
    rng = np.random.default_rng(1)
    problems, errors = [], []
    for _ in range(8):
        feeds = {"x": rng.standard_normal(N).astype(np.float32),
                 "y": rng.standard_normal(N).astype(np.float32)}
        problems.append((feeds, feeds["x"] + feeds["y"]))

    def work(feeds, expected):
        try:
            for _ in range(30):
                (z,) = session.run(None, feeds)
                assert np.array_equal(z, expected)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=problem) for problem in problems]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def test_initializers_are_protected_and_intermediates_released(registry):
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Abs", ["a"], ["z"])]
    session = RuntimeSession(_model(nodes, [x], [z], initializers=[w]), registry=registry)
    assert [a.name for a in session.get_inputs()] == ["x"]
    (out,) = session.run(None, {"x": np.array([-5, 0, 0, 0], np.float32)})
    np.testing.assert_array_equal(out, [4, 2, 3, 4])
    (out,) = session.run(None, {"x": np.array([-5, 0, 0, 0], np.float32)})
    np.testing.assert_array_equal(out, [4, 2, 3, 4])


def test_blas_threads_held_at_one_during_run(monkeypatch, registry):
    from onnx_light.parallel import BLAS

    if not BLAS.get():
        pytest.skip("no BLAS library visible to threadpoolctl")
    seen = []
    add_class = kernels.KERNELS["Add"][max(kernels.KERNELS["Add"])]
    original, original_prepare = add_class.run, add_class.prepare
    monkeypatch.setattr(add_class, "run",
                        lambda self, *xs: (seen.append(BLAS.get()), original(self, *xs))[1])

    def prepare(self, specs):  # the prepared computation the plan calls instead of run
        prepared = original_prepare(self, specs)

        def compute(*xs, out):
            seen.append(BLAS.get())
            prepared.compute(*xs, out=out)

        return None if prepared is None else prepared._replace(compute=compute)

    monkeypatch.setattr(add_class, "prepare", prepare)
    before = BLAS.get()
    session = RuntimeSession(_add_model(), num_threads=2, registry=registry)
    session.run(None, _feeds())
    session.run(None, _feeds(), node_hook=lambda name, op_type: None)  # the walk with a hook
    assert seen == [(1,) * len(before)] * 2
    assert BLAS.get() == before  # restored after the run


def test_constant_subgraphs_are_folded_at_construction(registry):
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [4])
    default = helper.make_tensor("d", TensorProto.FLOAT, [4], [1.0, 1.0, 1.0, 1.0])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    d = helper.make_tensor_value_info("d", TensorProto.FLOAT, [4])  # an input with a default
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["w"],
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])),
        helper.make_node("Relu", ["w"], ["c"]),           # folded too: its input is folded
        helper.make_node("Add", ["x", "c"], ["a"]),        # depends on a feed: runs
        helper.make_node("Mul", ["d", "d"], ["dd"]),       # folded from d's default ...
        helper.make_node("Add", ["a", "dd"], ["z"]),       # ... recomputed when d is fed
    ]
    model = _model(nodes, [x, d], [z, c], initializers=[shape, default])
    session = RuntimeSession(model, registry=registry)
    assert session.folded_nodes == 3
    assert len(session._plan) == 2
    x_value = np.arange(4, dtype=np.float32)
    z_out, c_out = session.run(None, {"x": x_value})
    np.testing.assert_array_equal(z_out, x_value + 3)
    np.testing.assert_array_equal(c_out, [2, 2, 2, 2])
    c_out[0] = 99  # callers get their own copy of a folded output
    np.testing.assert_array_equal(session.run(["c"], {"x": x_value})[0], [2, 2, 2, 2])
    z_fed, _ = session.run(None, {"x": x_value, "d": np.full(4, 3, np.float32)})
    np.testing.assert_array_equal(z_fed, x_value + 2 + 9)
    np.testing.assert_array_equal(session.run(["z"], {"x": x_value})[0], x_value + 3)


def _large_initializer_model(values, element_type=TensorProto.FLOAT):
    n = values.size
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [n])
    weights = helper.make_tensor("w", element_type, [n], values.tobytes(), raw=True)
    return _model([helper.make_node("Add", ["x", "w"], ["z"])], [x], [z], initializers=[weights])


def test_large_initializers_are_checked_without_being_serialized_again():
    """The checker and shape inference see a copy without large initializer data (they would
    serialize the whole model); the session still validates and uses that data."""
    from onnx_light.runtime.loading import SKELETON_MINIMUM

    n = 4 * SKELETON_MINIMUM
    values = np.arange(n, dtype=np.float32)
    session = RuntimeSession(_large_initializer_model(values))
    x = np.ones(n, np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x + values)
    # a type error involving a large initializer is still caught by the checker
    with pytest.raises(ValueError, match="invalid ONNX model"):
        RuntimeSession(_large_initializer_model(np.arange(n, dtype=np.int64), TensorProto.INT64))
    # truncated data of a large initializer: a clear error that names it
    model = _large_initializer_model(values)
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:-4]
    with pytest.raises(ValueError, match="initializer 'w'"):
        RuntimeSession(model)


def _folding_model():
    """y = Relu(x * (c + c)): the Add folds, Mul and Relu run."""
    c = helper.make_tensor("c", TensorProto.FLOAT, [3], [1.0, -2.0, 3.0])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Add", ["c", "c"], ["cc"], name="double"),
             helper.make_node("Mul", ["x", "cc"], ["t"], name="scale"),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    return _model(nodes, [x], [y], initializers=[c])


def test_fold_false_leaves_every_node_to_the_runs(registry):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    folding = RuntimeSession(_folding_model(), registry=registry, fuse=False)
    plain = RuntimeSession(_folding_model(), registry=registry, fuse=False, fold=False)
    assert folding.folded_nodes == 1
    assert list(folding.folded_values()) == ["cc"]
    np.testing.assert_array_equal(folding.folded_values()["cc"], [2.0, -4.0, 6.0])
    assert plain.folded_nodes == 0 and plain.folded_values() == {}
    np.testing.assert_array_equal(plain.run(None, {"x": x})[0], folding.run(None, {"x": x})[0])
    with pytest.raises(TypeError, match="fold must be True or False"):
        RuntimeSession(_folding_model(), registry=registry, fold=1)


def test_node_hook_sees_every_step_and_may_stop_the_run(registry):
    session = RuntimeSession(_folding_model(), registry=registry, fuse=False, fold=False)
    x = np.ones((2, 3), np.float32)
    calls = []

    def hook(name, op_type):
        calls.append((name, op_type))
        return lambda: calls.append("done")

    session.run(None, {"x": x}, node_hook=hook)
    assert calls == [("double", "Add"), "done", ("scale", "Mul"), "done", ("relu", "Relu"), "done"]

    class Stop(Exception):
        pass

    def stop_at_mul(name, op_type):
        if op_type == "Mul":
            raise Stop(name)

    with pytest.raises(Stop, match="scale"):
        session.run(None, {"x": x}, node_hook=stop_at_mul)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], [[2, 0, 6]] * 2)


# Feeds that are not plain arrays of the input's type (issue 14, item 8): what onnxruntime
# runs, onnx_light runs with the same values; what it refuses, onnx_light names.
def _matmul_model():
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8], np.linspace(-1, 1, 128).tolist())
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], initializers=[w])


_X = np.linspace(-2, 2, 64, dtype=np.float32).reshape(4, 16)


def _read_only(x):
    x = x.copy()
    x.flags.writeable = False
    return x


def _memmap(tmp_path):
    np.save(tmp_path / "x.npy", _X)
    return np.load(tmp_path / "x.npy", mmap_mode="r")


@pytest.mark.parametrize("make", [
    pytest.param(lambda tmp: np.ma.masked_array(_X, mask=_X > 1), id="masked array (its data)"),
    pytest.param(lambda tmp: np.matrix(_X), id="np.matrix",
                 marks=pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")),
    pytest.param(_memmap, id="read-only memmap"),
    pytest.param(lambda tmp: np.asfortranarray(_X), id="Fortran order"),
    pytest.param(lambda tmp: np.repeat(_X, 2, axis=1)[:, ::2], id="strided view"),
    pytest.param(lambda tmp: _X.astype(_X.dtype.newbyteorder()), id="other byte order"),
    pytest.param(lambda tmp: _read_only(_X), id="read-only"),
    pytest.param(lambda tmp: _X.tolist(), id="list of floats"),
    pytest.param(lambda tmp: tuple(map(tuple, _X.tolist())), id="tuples"),
])
def test_feeds_that_hold_the_values_run_as_plain_arrays(tmp_path, make):
    session = RuntimeSession(_matmul_model())
    expected = session.run(None, {"x": _X.copy()})[0]
    feed = make(tmp_path)
    (y,) = session.run(None, {"x": feed})
    assert type(y) is np.ndarray and y.shape == (4, 8) and y.dtype == np.float32
    np.testing.assert_array_equal(y, expected)
    assert not np.shares_memory(y, np.asarray(feed))


def _scalar_model(element_type):
    return _model([helper.make_node("Identity", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", element_type, [])],
                  [helper.make_tensor_value_info("y", element_type, [])])


@pytest.mark.parametrize(("element_type", "feed", "expected"), [
    (TensorProto.FLOAT, np.array(1.5, np.float32), np.float32(1.5)),
    (TensorProto.FLOAT, np.float32(1.5), np.float32(1.5)),
    (TensorProto.FLOAT, 1.5, np.float32(1.5)),
    (TensorProto.FLOAT, 3, np.float32(3)),
    (TensorProto.FLOAT, True, np.float32(1)),
    (TensorProto.INT64, 7, np.int64(7)),
    (TensorProto.INT32, -7, np.int32(-7)),
    (TensorProto.BOOL, False, np.False_),
    (TensorProto.UINT8, 255, np.uint8(255)),
])
def test_zero_dimensional_feeds_and_python_scalars(element_type, feed, expected):
    (y,) = RuntimeSession(_scalar_model(element_type)).run(None, {"x": feed})
    assert y.shape == () and y.dtype == expected.dtype and y == expected


@pytest.mark.parametrize(("element_type", "feed", "words"), [
    (TensorProto.INT64, 1.5, ["'x'", "tensor(int64)", "float64"]),  # floats are not truncated
    (TensorProto.INT32, 2 ** 40, ["'x'", "out of bounds for int32"]),
    (TensorProto.UINT8, -1, ["'x'", "out of bounds for uint8"]),
    (TensorProto.FLOAT, np.float64(1.5), ["'x'", "tensor(float)", "float64"]),  # as onnxruntime
    (TensorProto.FLOAT, np.array(1.5), ["'x'", "tensor(float)", "float64"]),
    (TensorProto.FLOAT, [1.5], ["'x'", "expected rank 0", "(1,)"]),
    (TensorProto.FLOAT, "1.5", ["'x'", "tensor(float)", "<U3"]),
    (TensorProto.BOOL, 1, ["'x'", "tensor(bool)", "int64"]),
])
def test_feeds_that_would_change_values_or_shapes_are_refused_naming_the_input(element_type, feed,
                                                                               words):
    with pytest.raises(InvalidInputError) as info:
        RuntimeSession(_scalar_model(element_type)).run(None, {"x": feed})
    for word in words:
        assert word in str(info.value)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_a_matrix_of_the_wrong_rank_is_refused_not_reshaped():
    """np.matrix is always 2-d: for a 1-d input it is refused, not flattened."""
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    with pytest.raises(InvalidInputError, match="input 'x': expected rank 1"):
        RuntimeSession(model).run(None, {"x": np.matrix([1.0, 2.0, 3.0], np.float32)})


def _conv_model(batch):
    rng = np.random.default_rng(11)
    w = onnx.numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
                  [x], [y], initializers=[w])


@pytest.mark.parametrize("batch", [2, "n"])
def test_conv_decides_its_algorithm_once_for_the_inferred_shapes(monkeypatch, registry, batch):
    """With the shapes known, construction decides the algorithm and parallel plan once and
    the report says which; with a symbolic dimension every run decides, with the same values."""
    from onnx_light.kernels.conv import ConvKernel

    session = RuntimeSession(_conv_model(batch), num_threads=1, registry=registry)
    (entry,) = session.tuning_report()
    calls = []
    original = ConvKernel.problem
    monkeypatch.setattr(ConvKernel, "problem",
                        lambda self, *args: (calls.append(args[0]), original(self, *args))[1])
    x = np.random.default_rng(12).standard_normal((2, 3, 8, 8)).astype(np.float32)
    got = session.run(None, {"x": x})[0]
    if batch == 2:
        assert entry["decisions"]["algorithm"] in ("im2col", "im2col_wide", "shifted", "winograd",
                                                   "filters_blocked")
        assert entry["decisions"]["parallel plan"] == "serial"
        assert calls == []
    else:  # a symbolic batch: nothing settled, every run decides
        assert "decisions" not in entry
        assert calls == [(2, 3, 8, 8)]
    plain = RuntimeSession(_conv_model("n"), num_threads=1, registry=registry, fold=False)
    np.testing.assert_array_equal(got, plain.run(None, {"x": x})[0])


@pytest.mark.parametrize("enabled", [True, False])
def test_construction_leaves_the_garbage_collector_as_it_found_it(registry, enabled):
    import gc

    was = gc.isenabled()
    try:
        if not enabled:
            gc.disable()
        RuntimeSession(_add_model(), registry=registry)
        assert gc.isenabled() is enabled
        with pytest.raises(ValueError, match="invalid ONNX model"):
            RuntimeSession(b"\x08\x01", registry=registry)  # fails during the paused block
        assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()


def _chunk_model(batch):
    """A channel chunk as torch exports it: Shape -> Gather -> Add -> Div -> Mul -> Slice, and
    the input's Size."""
    ints = {name: helper.make_tensor(name, TensorProto.INT64, [1], [value])
            for name, value in (("one", 1), ("two", 2), ("zero", 0), ("big", 1 << 30))}
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("Shape", ["y"], ["shape"], start=1, end=2),
             helper.make_node("Gather", ["shape", "zero"], ["channels"]),
             helper.make_node("Add", ["channels", "one"], ["rounded"]),
             helper.make_node("Div", ["rounded", "two"], ["half"]),
             helper.make_node("Mul", ["half", "one"], ["middle"]),
             helper.make_node("Slice", ["y", "zero", "middle", "one"], ["first"]),
             helper.make_node("Slice", ["y", "middle", "big", "one"], ["second"]),
             helper.make_node("Size", ["y"], ["size"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 5, 3])
    outputs = [helper.make_tensor_value_info(name, element, None)
               for name, element in (("first", TensorProto.FLOAT), ("second", TensorProto.FLOAT),
                                     ("size", TensorProto.INT64))]
    return _model(nodes, [x], outputs, initializers=list(ints.values()))


@pytest.mark.parametrize("batch", [2, "N"])
def test_shapes_fixed_for_every_run_fold_the_nodes_they_decide(registry, batch):
    """Shape and Size of a value whose inferred shape is static fold at construction, and with
    them the arithmetic on their outputs; a symbolic dimension leaves them to the runs."""
    session = RuntimeSession(_chunk_model(batch), registry=registry)
    assert session.folded_nodes == (6 if batch == 2 else 0)
    x = np.arange(30, dtype=np.float32).reshape(2, 5, 3) - 10
    first, second, size = session.run(None, {"x": x})
    y = np.maximum(x, 0)
    np.testing.assert_array_equal(first, y[:, :3])
    np.testing.assert_array_equal(second, y[:, 3:])
    assert size == 30
