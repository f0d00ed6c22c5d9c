"""Scaled dot-product attention fusion (runtime/attention_fusion.py) against the unfused graph."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnx_light
from onnx_light.kernels import packed_gemm
from onnx_light.kernels.attention_calibration import AttentionHeadsCrossover, _joined
from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.calibration import RowsCrossover
from onnx_light.kernels.fused_attention import FusedAttention, repeat_count
from onnx_light.kernels.reductions import ATTENTION_MINIMUM_FLOPS, Softmax
from onnx_light.parallel import get_pool
from onnx_light.runtime import RuntimeSession
from onnx_light.tuning.calibration import CalibrationResult

F = TensorProto.FLOAT
# The fused step rounds the scaled, masked softmax once where the graph rounds after the
# scale, the mask and inside Softmax: a few float32 units of the probabilities, carried
# through the product with V (sums of S terms of magnitude |V|).
RTOL, ATOL = 2e-5, 2e-6
U = 2.0 ** -24


def products_bound(q, k_t, v, scale, mask):
    """The first-order bound of compiled_attention.py between two float32 computations of
    softmax(scale q k^T + mask) v whose products sum in different orders (heads-first
    operands, float64): each score within 2 depth u scale sum |q||k| (both orders), which
    moves a probability by at most twice the row's largest score error (relative), plus 4
    units of the two softmaxes; each output within those changes times |v| plus 2 keys u
    sum P |v| (both orders of the second product)."""
    q, k_t, v = (x.astype(np.float64) for x in (q, k_t, v))
    scores = q @ k_t * scale + (0.0 if mask is None else mask)
    with np.errstate(invalid="ignore"):
        e = np.exp(scores - scores.max(-1, keepdims=True))
        p = np.nan_to_num(e / e.sum(-1, keepdims=True))
    score_error = 2 * q.shape[-1] * U * abs(scale) * (np.abs(q) @ np.abs(k_t))
    relative = 2 * score_error.max(-1, keepdims=True) + 4 * U
    return (relative + 2 * k_t.shape[-1] * U) * (p @ np.abs(v))


def attention_model(batch, heads, queries, keys, size, *, scale="Mul", mask_shape=None,
                    transposes=True, casts=0, mask_first=False, axis=-1, opset=17,
                    extra_output=None):
    """The exporters' pattern: q, k, v (batch, tokens, heads, size), the Transposes, MatMul,
    scale, mask Add, Softmax, Casts, MatMul; the mask a graph input."""
    nodes, inits = [], []
    inputs = [helper.make_tensor_value_info("q", F, [batch, queries, heads, size]),
              helper.make_tensor_value_info("k", F, [batch, keys, heads, size]),
              helper.make_tensor_value_info("v", F, [batch, keys, heads, size])]
    if transposes:
        nodes += [helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
                  helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
                  helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3])]
        q, k, v = "qt", "kt", "vt"
    else:
        inputs = [helper.make_tensor_value_info("q", F, [batch, heads, queries, size]),
                  helper.make_tensor_value_info("k", F, [batch, heads, size, keys]),
                  helper.make_tensor_value_info("v", F, [batch, heads, keys, size])]
        q, k, v = "q", "k", "v"
    nodes.append(helper.make_node("MatMul", [q, k], ["s"]))
    scores = "s"
    if scale is not None:
        inits.append(numpy_helper.from_array(np.array(8.0 if scale == "Div" else 0.125, np.float32), "c"))
        operands = ["c", scores] if scale == "Mul first" else [scores, "c"]
        nodes.append(helper.make_node("Div" if scale == "Div" else "Mul", operands, ["scaled"]))
        scores = "scaled"
    if mask_shape is not None:
        inputs.append(helper.make_tensor_value_info("mask", F, list(mask_shape)))
        operands = ["mask", scores] if mask_first else [scores, "mask"]
        nodes.append(helper.make_node("Add", operands, ["masked"]))
        scores = "masked"
    nodes.append(helper.make_node("Softmax", [scores], ["p"], axis=axis))
    probabilities = "p"
    for i in range(casts):
        nodes.append(helper.make_node("Cast", [probabilities], [f"cast{i}"], to=F))
        probabilities = f"cast{i}"
    nodes.append(helper.make_node("MatMul", [probabilities, v], ["y"]))
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if extra_output is not None:
        outputs.append(helper.make_tensor_value_info(extra_output, F, None))
    graph = helper.make_graph(nodes, "attention", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def feeds(model, rng, masked_fraction=0.3, spread=3.0):
    values = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.name == "mask":
            mask = np.where(rng.random(shape) < masked_fraction, np.float32(-np.inf), np.float32(0.0))
            mask[..., 0] = np.finfo(np.float32).min  # the large negative transformers write
            values["mask"] = mask.astype(np.float32)
        else:
            values[value.name] = (rng.standard_normal(shape) * spread).astype(np.float32)
    return values


def fused_steps(session):
    return [step for step in session._plan if isinstance(getattr(step.run, "__self__", None), FusedAttention)]


def check(model, values, fused_nodes, threads=1, bound=None):
    session = RuntimeSession(model, num_threads=threads)
    if fused_nodes:  # tuned as its Softmax node
        (entry,) = [e for e in session.tuning_report() if e["key"].startswith("onnx_light/Softmax")]
        assert set(entry["values"]) == {"parallel.minimum_elements", ATTENTION_MINIMUM_FLOPS}
    plain = RuntimeSession(model, num_threads=threads, fuse=False)
    assert session.fused_nodes == fused_nodes
    assert len(fused_steps(session)) == (1 if fused_nodes else 0)
    got, expected = session.run(None, values), plain.run(None, values)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        if bound is None:
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
        else:
            assert (np.abs(a.astype(np.float64) - b) <= bound + ATOL).all()
    if fused_nodes:  # the prepared step (FusedAttention.prepare) computes what run does
        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(FusedAttention, "prepare", lambda self, inputs: None)
            unprepared = RuntimeSession(model, num_threads=threads)
        for a, b in zip(got, unprepared.run(None, values), strict=True):
            assert a.tobytes() == b.tobytes()
    return session


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 3), heads=st.integers(1, 4), queries=st.integers(1, 9),
       keys=st.integers(1, 9), size=st.integers(1, 16),
       scale=st.sampled_from(["Mul", "Mul first", "Div", None]),
       mask=st.sampled_from(["none", "per batch", "per query", "full", "keys only"]),
       mask_first=st.booleans(), casts=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_fused_against_unfused(batch, heads, queries, keys, size, scale, mask, mask_first, casts, seed):
    mask_shape = {"none": None, "per batch": (batch, 1, 1, keys), "per query": (batch, 1, queries, keys),
                  "full": (batch, heads, queries, keys), "keys only": (keys,)}[mask]
    model = attention_model(batch, heads, queries, keys, size, scale=scale, mask_shape=mask_shape,
                            casts=casts, mask_first=mask_first)
    nodes = 3 + 1 + (scale is not None) + (mask_shape is not None) + 1 + casts + 1
    session = check(model, feeds(model, np.random.default_rng(seed)), fused_nodes=nodes - 1)
    # prepared with every input given in float32 (a step with an omitted input is not)
    assert (fused_steps(session)[0].prepared is not None) == (mask_shape is not None)


@pytest.mark.parametrize("transposes", [True, False])
def test_without_scale_mask_or_transposes(transposes):
    model = attention_model(2, 3, 5, 7, 8, scale=None, transposes=transposes)
    check(model, feeds(model, np.random.default_rng(1)), fused_nodes=(6 if transposes else 3) - 1)


def test_opset_11_softmax_on_the_last_axis_fuses():
    model = attention_model(2, 2, 4, 6, 8, opset=11, axis=3, mask_shape=(2, 1, 1, 6))
    check(model, feeds(model, np.random.default_rng(2)), fused_nodes=7)


@pytest.mark.parametrize("case", ["axis", "kept", "mask"])
def test_refused(case):
    """Not the last axis; an intermediate value that is a graph output; a mask whose static
    shape does not broadcast to the scores along their last axis (3 queries against 4)."""
    model = {"axis": lambda: attention_model(1, 2, 4, 4, 8, axis=2),
             "kept": lambda: attention_model(1, 2, 4, 4, 8, extra_output="p"),
             "mask": lambda: attention_model(1, 2, 4, 4, 8, mask_shape=(1, 1, 4, 1))}[case]()
    values = feeds(model, np.random.default_rng(3))
    if case == "mask":
        values["mask"] = np.zeros((1, 1, 4, 1), np.float32)  # broadcasts in the graph, not in the step
    check(model, values, fused_nodes=0)


def test_fully_masked_rows_are_nan_in_both():
    model = attention_model(1, 2, 3, 4, 8, mask_shape=(1, 1, 3, 4))
    values = feeds(model, np.random.default_rng(4))
    values["mask"][0, 0, 1, :] = -np.inf
    fused, plain = (RuntimeSession(model, fuse=f).run(None, values)[0] for f in (True, False))
    assert np.isnan(fused[:, :, 1]).all() and np.isnan(plain[:, :, 1]).all()
    np.testing.assert_allclose(fused[:, :, [0, 2]], plain[:, :, [0, 2]], rtol=RTOL, atol=ATOL)


def test_inputs_the_step_does_not_take_run_the_original_nodes():
    """float64 inputs (the step computes float32) give the nodes' float64 result; a mask
    that does not broadcast to the scores fails as the Add node does."""
    model = attention_model(1, 2, 3, 4, 8, mask_shape=(1, 1, 1, 4))
    (step,) = fused_steps(RuntimeSession(model))
    kernel = step.run.__self__
    values = {name: value.astype(np.float64)
              for name, value in feeds(model, np.random.default_rng(5)).items()}
    q, k, v = (values[n].transpose(0, 2, 1, 3) for n in "qkv")
    scores = q @ k.transpose(0, 1, 3, 2) * 0.125 + values["mask"]
    e = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (e / e.sum(-1, keepdims=True)) @ v
    got = kernel.run(values["q"], values["k"], values["v"], values["mask"])[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    with pytest.raises(ValueError, match="Add"):
        kernel.run(*(values[n].astype(np.float32) for n in "qkv"), np.zeros((2, 2, 2, 2), np.float32))


def _compiled_from(minimum_flops):
    """A patch of Softmax._configure giving every attention step ``minimum_flops`` (1: the
    compiled tasks at every size)."""
    original = Softmax._configure

    def configure(self, values):
        original(self, values)
        self.minimum_flops = minimum_flops

    return pytest.MonkeyPatch.context(), configure


needs_packed = pytest.mark.skipif(not packed_gemm.available(), reason="the packed products need AVX2 and FMA")


@needs_packed
@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 2), heads=st.integers(1, 3), queries=st.integers(1, 80),
       keys=st.integers(1, 40), size=st.integers(1, 70),
       mask=st.sampled_from(["none", "per batch", "per query", "full"]),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_compiled_tasks_against_unfused(batch, heads, queries, keys, size, mask, threads, seed):
    """The compiled tasks (forced at every size) against the unfused graph, over task blocks,
    partial micro-kernel blocks and panels, and masks: within the bound, prepared or not."""
    mask_shape = {"none": None, "per batch": (batch, 1, 1, keys), "per query": (batch, 1, queries, keys),
                  "full": (batch, heads, queries, keys)}[mask]
    model = attention_model(batch, heads, queries, keys, size, mask_shape=mask_shape)
    values = feeds(model, np.random.default_rng(seed))
    perms = ((0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3))
    q, k_t, v = (values[n].transpose(perm) for n, perm in zip("qkv", perms, strict=True))
    bound = products_bound(q, k_t, v, 0.125, values.get("mask"))
    context, configure = _compiled_from(1)
    with context as patched:
        patched.setattr(Softmax, "_configure", configure)
        patched.setattr(FusedAttention, "_heads", lambda *a: pytest.fail("ran the BLAS products"))
        check(model, values, fused_nodes=6 + (mask_shape is not None), threads=threads, bound=bound)


def _kernel(pool, minimum_flops, perms=((0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3))):
    ctx = NodeContext("a", "FusedAttention", "", 17, {}, (F,) * 4, (F,), 4, 1)
    softmax = Softmax(NodeContext("s", "Softmax", "", 17, {}, (F,), (F,), 1, 1))
    fused = FusedAttention(ctx, softmax, 0.25, perms, (0, 1, 2, 3), [], {}).bind(pool)
    fused.configure({ATTENTION_MINIMUM_FLOPS: minimum_flops})
    assert softmax.minimum_flops == minimum_flops
    return fused


@needs_packed
@pytest.mark.parametrize("threads", [2, 3])
def test_compiled_tasks_give_the_same_bits_at_any_thread_count(threads):
    """Serial and over the threads (one region) the same bits; BLAS's products (below the
    threshold) within the bound."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 50, 3, 16)).astype(np.float32) for _ in range(3))
    mask = np.where(rng.random((2, 1, 50, 50)) < 0.2, -np.inf, 0).astype(np.float32)
    serial = _kernel(None, 1).run(q, k, v, mask)[0]
    split = _kernel(get_pool(threads), 1).run(q, k, v, mask)[0]
    blas = _kernel(get_pool(threads), 1 << 62).run(q, k, v, mask)[0]
    assert serial.shape == split.shape == blas.shape == (2, 3, 50, 16)
    assert serial.tobytes() == split.tobytes()
    np.testing.assert_allclose(serial, blas, rtol=RTOL, atol=ATOL)


def grouped_model(batch, groups, repeat, tokens, size, *, transpose_k=True, mask=True, opset=17):
    """LLaMA's grouped-query attention as exported: q (batch, groups * repeat, tokens, size),
    k and v (batch, groups, tokens, size) each repeated by Unsqueeze, Expand and Reshape
    (``repeat_kv``), K^T by a Transpose (or k given as (batch, groups, size, tokens)), the
    scale, the causal mask, Softmax, MatMul."""
    heads = groups * repeat
    last = {"k": (tokens, size) if transpose_k else (size, tokens), "v": (tokens, size)}
    inputs = [helper.make_tensor_value_info("q", F, [batch, heads, tokens, size])]
    inits = [numpy_helper.from_array(np.array([2], np.int64), "axes"),
             numpy_helper.from_array(np.array(size ** -0.5, np.float32), "c")]
    nodes = []
    for name in "kv":
        inputs.append(helper.make_tensor_value_info(name, F, [batch, groups, *last[name]]))
        expand, merged = [batch, groups, repeat, *last[name]], [0, heads, -1, last[name][1]]
        inits += [numpy_helper.from_array(np.array(expand, np.int64), f"{name}x"),
                  numpy_helper.from_array(np.array(merged, np.int64), f"{name}h")]
        nodes += [helper.make_node("Unsqueeze", [name, "axes"], [f"{name}5"]),
                  helper.make_node("Expand", [f"{name}5", f"{name}x"], [f"{name}e"]),
                  helper.make_node("Reshape", [f"{name}e", f"{name}h"], [f"{name}r"])]
    key = "kr"
    if transpose_k:
        nodes.append(helper.make_node("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]))
        key = "kt"
    nodes += [helper.make_node("MatMul", ["q", key], ["s"]), helper.make_node("Mul", ["s", "c"], ["scaled"])]
    scores = "scaled"
    if mask:
        causal = np.triu(np.full((tokens, tokens), np.finfo(np.float32).min, np.float32), 1)
        inits.append(numpy_helper.from_array(causal.reshape(1, 1, tokens, tokens), "mask"))
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"]))
        scores = "masked"
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vr"], ["y"])]
    output = helper.make_tensor_value_info("y", F, None)
    graph = helper.make_graph(nodes, "gqa", inputs, [output], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 2), groups=st.integers(1, 3), repeat=st.integers(1, 4), tokens=st.integers(1, 9),
       size=st.integers(1, 16), transpose_k=st.booleans(), mask=st.booleans(), seed=st.integers(0, 2**16),
       minimum_flops=st.sampled_from([1 << 62] + [1] * packed_gemm.available()))
def test_grouped_query_attention_reads_k_and_v_unrepeated(batch, groups, repeat, tokens, size, transpose_k,
                                                         mask, seed, minimum_flops):
    """The repetitions fuse into the step (all nodes but one), which never falls back to
    them, and its output is the unfused graph's within the bound (BLAS's products, and the
    compiled tasks where the packed products run)."""
    model = grouped_model(batch, groups, repeat, tokens, size, transpose_k=transpose_k, mask=mask)
    nodes = len(model.graph.node)
    values = feeds(model, np.random.default_rng(seed))
    bound = None
    if minimum_flops == 1:  # the compiled tasks: the products' bound (BLAS's sum the same order)
        k_t, v = (np.repeat(values[n], repeat, axis=1) for n in "kv")
        k_t = k_t.transpose(0, 1, 3, 2) if transpose_k else k_t
        causal = np.triu(np.full((tokens, tokens), np.finfo(np.float32).min, np.float32), 1)
        bound = products_bound(values["q"], k_t, v, np.float32(size ** -0.5), causal if mask else None)
    context, configure = _compiled_from(minimum_flops)
    with context as patched:
        patched.setattr(Softmax, "_configure", configure)
        patched.setattr(FusedAttention, "_unfused", lambda *a: pytest.fail("fell back to the nodes"))
        session = check(model, values, fused_nodes=nodes - 1, bound=bound)
    (step,) = fused_steps(session)
    assert step.run.__self__.repeats[0] is not None and step.run.__self__.repeats[1] is not None
    assert (step.prepared is not None) == mask  # with every input given


def test_repeat_count_checks_that_the_shapes_repeat_the_heads_in_place():
    x = np.zeros((1, 2, 5, 4), np.float32)
    assert repeat_count(x.shape, ((1, 2, 3, 5, 4), (1, 6, 5, 4))) == 3
    assert repeat_count(x.shape, ((1, 1, 3, 1, 1), (0, -1, 5, 4))) == 3  # broadcast ones, 0 and -1
    assert repeat_count(x.shape, ((1, 2, 3, 5, 4), (0, -1, 5, 0))) is None  # 0 copies the 5-D shape's 5
    assert repeat_count(x.shape, ((1, 2, 1, 5, 4), (1, 2, 5, 4))) == 1
    assert repeat_count(x.shape, ((2, 2, 3, 5, 4), (2, 6, 5, 4))) is None  # also repeats the batch
    assert repeat_count(x.shape, ((1, 2, 3, 5, 4), (1, 2, 15, 4))) is None  # not merged into the heads
    assert repeat_count(x.shape, ((1, 2, 3, 5, 4), (1, 6, 20))) is None
    assert repeat_count(x.shape, ((1, 3, 3, 5, 4), (1, 9, 5, 4))) is None  # does not broadcast


def test_a_repetition_the_kernel_does_not_take_runs_the_original_nodes():
    """K and V of one group where the constant shapes say two: the Expand repeats the groups
    as well as the heads, which the step does not compute; the nodes do."""
    model = grouped_model(1, 2, 2, 3, 4)
    (step,) = fused_steps(RuntimeSession(model))
    kernel = step.run.__self__
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 4, 3, 4)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, 3, 4)).astype(np.float32) for _ in range(2))
    mask = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "mask"))
    scores = (q.astype(np.float64) @ k.transpose(0, 1, 3, 2)) * np.float32(0.5) + mask
    e = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (e / e.sum(-1, keepdims=True)) @ v
    got = kernel.run(q, k, v, mask)[0]
    assert got.shape == (1, 4, 3, 4)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def _softmax_declaration():
    from onnx_light.kernels import reductions

    (declaration,) = [d for d in reductions.DECLARATIONS if d.op_type == "Softmax"]
    return declaration


def test_heads_calibration_problem_times_real_attention():
    """Both of the search's functions compute softmax(Q K^T / 8 + mask) V on the case's heads."""
    problem = AttentionHeadsCrossover(_softmax_declaration(), 2, ATTENTION_MINIMUM_FLOPS)
    for case in problem.cases:
        q, k_t, v, mask = problem.make_inputs(1 << 21, case)
        assert q.shape[0] >= 2 and problem.input_bytes(1 << 21, case) >= q.nbytes + k_t.nbytes + v.nbytes
        scores = (q.astype(np.float64) @ k_t) * 0.125 + mask
        probabilities = np.exp(scores - scores.max(-1, keepdims=True))
        expected = (probabilities / probabilities.sum(-1, keepdims=True)) @ v
        serial, split = problem.serial([q, k_t, v, mask]), problem.candidate([q, k_t, v, mask])
        np.testing.assert_allclose(serial, expected, rtol=1e-4, atol=1e-5)
        assert problem.same_output(serial, split)


@pytest.mark.usefixtures("isolated_tuning")
def test_softmax_calibration_searches_the_rows_and_the_heads(tmp_path):
    report = onnx_light.calibrate_kernel_tuning("Softmax", "float", num_threads=2,
                                                path=tmp_path / "c.txt", max_duration_ms=1500)
    assert report["failed"] == []
    (result,) = report["calibrated"]
    cases = {m["case"] for m in result["measurements"]}
    assert cases & set(RowsCrossover.LENGTHS) and cases & set(AttentionHeadsCrossover.SHAPES), cases
    assert len(result["diagnostics"]) >= 2


def test_the_joined_result_takes_each_search_s_own_value():
    key = next(k for k in onnx_light.kernels.calibration_callbacks() if k.kernel == "Softmax")
    portable = {"parallel.minimum_elements": 65536, ATTENTION_MINIMUM_FLOPS: 1 << 25}
    rows = CalibrationResult(key, dict(portable), True, diagnostics=["rows"], duration_s=1.0)
    heads = CalibrationResult(key, {**portable, ATTENTION_MINIMUM_FLOPS: 1 << 22}, False,
                              diagnostics=["heads"], duration_s=2.0, setup_s=0.5)
    joined = _joined(rows, heads, ATTENTION_MINIMUM_FLOPS)
    assert joined.values == {"parallel.minimum_elements": 65536, ATTENTION_MINIMUM_FLOPS: 1 << 22}
    assert not joined.portable_kept and joined.diagnostics == ["rows", "heads"]
    assert (joined.duration_s, joined.setup_s) == (3.0, 0.5)
