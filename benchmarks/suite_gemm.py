"""Section 3 of the suite: Gemm and MatMul, float, on the calibration corpus and large squares.

Four strategies side by side: the kernel with its portable defaults, the kernel with the values
a session resolves after calibrating Gemm and MatMul (float) on this machine, ``numpy.matmul``
(with BLAS's own thread count) and onnxruntime (a one-node model, same ``intra_op_num_threads``,
sequential, no spinning). The onnx_light kernels are timed inside ``BLAS.scope(1)``, as a session runs them
(``gemm_sweep._sample``). GFLOP/s counts 2*M*N*K floating point operations per call.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from _common import Context, SectionResult, Table, gemm_sweep, interleaved, log, onnxruntime_session, section
from onnx import TensorProto as T
from onnx import helper

from onnx_light.kernels import gemm
from onnx_light.kernels.base import NodeContext
from onnx_light.kernels.calibration import GEMM_CORPUS
from onnx_light.tuning.keys import KernelTuningKey

STRATEGIES = ("portable", "calibrated", "numpy", "onnxruntime")
BLAS_SPIN_S = 0.15


def cases(ctx: Context) -> list[tuple[str, gemm_sweep.Case]]:
    """(op, shape) pairs: Gemm on every corpus entry, MatMul on those without transposes, and both
    on the large squares."""
    config = ctx.config
    corpus = [entry for entry in GEMM_CORPUS
              if config.gemm_cases is None or entry[0] in config.gemm_cases]
    corpus += [(f"square {s}", s, s, s, False, False) for s in config.gemm_squares]
    found = []
    for name, m, k, n, trans_a, trans_b in corpus:
        case = gemm_sweep.Case(name, m, k, n, T.FLOAT, trans_a, trans_b)
        found.append(("Gemm", case))
        if not (trans_a or trans_b):
            found.append(("MatMul", case))
    return found


def _kernel(op: str, case: gemm_sweep.Case, values: dict[str, Any], ctx: Context) -> gemm._ProductKernel:
    if op == "Gemm":
        return gemm_sweep._kernel(case, values, ctx.pool)
    node = NodeContext("bench", "MatMul", "", 13, {}, (T.FLOAT, T.FLOAT), (T.FLOAT,), 2, 1)
    kernel = gemm.MatMulKernel(node)
    kernel.bind(ctx.pool).configure(values)
    return kernel


def onnx_model(op: str, case: gemm_sweep.Case, a: np.ndarray, b: np.ndarray) -> onnx.ModelProto:
    attributes = {"transA": int(case.trans_a), "transB": int(case.trans_b)} if op == "Gemm" else {}
    inputs = [helper.make_tensor_value_info("A", T.FLOAT, list(a.shape)),
              helper.make_tensor_value_info("B", T.FLOAT, list(b.shape))]
    output = helper.make_tensor_value_info("Y", T.FLOAT, [case.m, case.n])
    node = helper.make_node(op, ["A", "B"], ["Y"], **attributes)
    graph = helper.make_graph([node], f"{op} {case.label}", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _flops(value: int) -> str:
    return f"2^{value.bit_length() - 1}" if value & (value - 1) == 0 else str(value)


def gemm_sweep_section(ctx: Context) -> SectionResult:
    """Section 3."""
    config = ctx.config
    with section(3, "Gemm and MatMul (float): GFLOP/s side by side") as result:
        report = ctx.calibrate(("Gemm", "MatMul"), ("float",))
        values = {}
        calibration = Table(f"Calibration of Gemm and MatMul, float ({report['seconds']:.1f} s):",
                            ["key", "portable", "calibrated", "source in a new session", "outcome"])
        diagnostics = {r["key"]: r["diagnostics"][-1] if r["diagnostics"] else ""
                       for r in report["calibrated"]}
        for op in ("Gemm", "MatMul"):
            key = KernelTuningKey("onnx_light", op, "portable", T.FLOAT, tuning_abi=gemm.TUNING_ABI)
            portable = dict(gemm.gemm_schema(op, T.FLOAT).defaults)
            resolved, source = ctx.resolved(key)
            values[op] = {"portable": portable, "calibrated": resolved}

            def text(v: dict[str, Any]) -> str:
                return (f"{v[gemm.MODE]}, minimum_flops {_flops(v[gemm.MINIMUM_FLOPS])}, "
                        f"minimum_rows {v[gemm.MINIMUM_ROWS]}")

            failed = {f["key"]: f["error"] for f in report["failed"]}
            outcome = (f"failed: {failed[str(key)]}" if str(key) in failed
                       else diagnostics.get(str(key), "").split(": ", 1)[-1])
            calibration.add(str(key), text(portable), text(resolved), source, outcome)

        rng = np.random.default_rng(0)
        groups: dict[Any, dict[str, Any]] = {}
        plans: dict[Any, dict[str, str]] = {}
        for op, case in cases(ctx):
            a, b = gemm_sweep._inputs(case, rng)
            a_used = a.T if case.trans_a else a
            b_used = b.T if case.trans_b else b
            kernels = {s: _kernel(op, case, values[op][s], ctx) for s in ("portable", "calibrated")}
            session = onnxruntime_session(onnx_model(op, case, a, b), config.threads)
            functions: dict[str, Any] = {
                s: ((lambda k=kernel, a=a, b=b: k.run(a, b)), True) for s, kernel in kernels.items()}
            functions["numpy"] = lambda a=a_used, b=b_used: np.matmul(a, b)
            functions["onnxruntime"] = lambda s=session, f={"A": a, "B": b}: s.run(None, f)
            reference = np.matmul(a_used.astype(np.float64), b_used.astype(np.float64))
            scale = float(np.abs(reference).max()) or 1.0
            for name, timed in functions.items():
                fn = timed[0] if isinstance(timed, tuple) else timed
                got = np.asarray(fn()[0] if name != "numpy" else fn(), dtype=np.float64)
                if not np.allclose(got, reference, rtol=0, atol=1e-3 * scale):
                    raise AssertionError(f"{op} {case.label}: {name} disagrees with float64 matmul")
            groups[op, case.label] = functions
            plans[op, case.label] = {s: k.plan(case.m, case.n, case.k) for s, k in kernels.items()}
        # OpenBLAS's threads spin for about 0.1 s after a multi-threaded call (docs/gemm.md): wait
        # that out after numpy (and "blas" plans) so that it does not slow the next function down.
        settle = {"numpy": BLAS_SPIN_S}
        for strategy in ("portable", "calibrated"):
            if any(values[op][strategy][gemm.MODE] == "blas" for op in values):
                settle[strategy] = BLAS_SPIN_S
        medians = interleaved(groups, config.rounds, config.sample_s, log, settle=settle)

        table = Table("GFLOP/s (2*M*N*K / median time); ratios are times (> 1: onnx_light slower):",
                      ["op", "shape (MxKxN)", "portable plan", "calibrated plan",
                       *(f"{s} GFLOP/s" for s in STRATEGIES),
                       "calibrated / portable", "calibrated / numpy", "calibrated / onnxruntime"],
                      ratios=("calibrated / portable", "calibrated / numpy", "calibrated / onnxruntime"))
        shapes = {case.label: case for _, case in cases(ctx)}
        for (op, label), m in medians.items():
            case = shapes[label]
            flops = 2 * case.m * case.n * case.k
            table.add(op, label, plans[op, label]["portable"], plans[op, label]["calibrated"],
                      *(flops / m[s] / 1e9 for s in STRATEGIES),
                      m["calibrated"] / m["portable"], m["calibrated"] / m["numpy"],
                      m["calibrated"] / m["onnxruntime"])
        result.tables = [calibration, table]
        if report["failed"]:
            result.notes.append("A failed calibration publishes nothing: those keys keep their "
                                "portable values.")
        result.notes.append(
            "numpy.matmul runs with BLAS's default thread count; the kernels' plans: serial = one "
            "BLAS call on one BLAS thread, split_rows / split_columns = the output split across the "
            "pool, blas = one call on the pool's thread count of BLAS threads (docs/gemm.md).")
        result.data = {"medians": medians, "plans": plans}
    return result

