"""Sections 1 and 2 of the suite: the elementwise sweep and the memory-bound limit.

Section 1 times, per case (op, element type, input layout) and size, six strategies side by
side: the kernel forced serial, forced parallel, with its portable default, with the values a
session resolves after calibrating the case's key on this machine, onnxruntime (a one-node
model, same ``intra_op_num_threads``, sequential execution, no spinning) and the plain numpy
expression.
Each strategy's regret at a size is its median time divided by the faster of the serial and
parallel medians at that size, from the same interleaved rounds.

Section 2 measures the machine's memory bandwidth (a large ``np.copyto`` split across the same
pool) and what fraction of it each elementwise case reaches at a large size (bytes read and
written / time), interleaved with the copy.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from _common import (
    Context,
    SectionResult,
    Table,
    elementwise_crossover,
    geomean,
    interleaved,
    log,
    onnxruntime_session,
    parallel_overhead,
    section,
)
from onnx import helper

from onnx_light.kernels.base import numpy_dtype
from onnx_light.kernels.elementwise import MINIMUM_ELEMENTS, OPS, default_minimum_elements
from onnx_light.tuning.keys import KernelTuningKey

Case = elementwise_crossover.Case
OPS_BY_NAME = {op.op_type: op for op in OPS}
SWEPT = ("Abs", "Add", "Not", "Relu", "Mul", "Sigmoid")
CASES: tuple[Case, ...] = tuple(c for c in elementwise_crossover.CASES if c.op in SWEPT)
CALIBRATED_TYPES = ("float", "int32", "bool")
STRATEGIES = ("serial", "parallel", "portable", "calibrated", "onnxruntime", "numpy")
GOAL_WORST, GOAL_GEOMEAN = 1.10, 1.03


def minor_faults(fn: Callable[[], object], calls: int = 3) -> float:
    """Minor page faults per call (``getrusage``): first touches of freshly mapped memory."""
    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


# The plain numpy expression a user would write for each op (allocating its output).
NUMPY: dict[str, Callable[..., np.ndarray]] = {
    "Abs": np.abs, "Add": np.add, "Mul": np.multiply, "Not": np.logical_not,
    "Relu": lambda x: np.maximum(x, 0), "Sigmoid": _sigmoid,
}


def key_of(case: Case) -> KernelTuningKey:
    return KernelTuningKey("onnx_light", case.op, "portable", case.element_type)


def onnx_model(case: Case) -> onnx.ModelProto:
    """One node of the case's op; the first input has the symbolic shape ["N"]."""
    names = ["X", "Y"][:case.num_inputs]
    shapes = [["N"], ["N"] if case.layout == "equal" else []][:case.num_inputs]
    inputs = [helper.make_tensor_value_info(n, case.element_type, s) for n, s in zip(names, shapes,
                                                                                     strict=True)]
    output = helper.make_tensor_value_info("Z", case.element_type, ["N"])
    graph = helper.make_graph([helper.make_node(case.op, names, ["Z"])], case.name, inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


class Strategies:
    """The six ways of computing one case, built once and reused for every size."""

    def __init__(self, ctx: Context, case: Case) -> None:
        self.case = case
        op = OPS_BY_NAME[case.op]
        portable = default_minimum_elements(op, case.element_type)
        calibrated, self.source = ctx.resolved(key_of(case))
        self.thresholds = {"portable": portable, "calibrated": int(calibrated[MINIMUM_ELEMENTS])}
        values = {"serial": 1 << 62, "parallel": 1, **self.thresholds}
        self.kernels = {}
        for name, minimum in values.items():
            kernel = elementwise_crossover.build(case)
            kernel.bind(ctx.pool).configure({MINIMUM_ELEMENTS: minimum})
            self.kernels[name] = kernel
        self.session = onnxruntime_session(onnx_model(case), ctx.config.threads)
        self.numpy = NUMPY[case.op]

    def functions(self, xs: list[np.ndarray]) -> dict[str, Callable[[], object]]:
        functions: dict[str, Callable[[], object]] = {
            name: (lambda k=kernel: k.run(*xs)) for name, kernel in self.kernels.items()}
        feeds = dict(zip(["X", "Y"], xs, strict=False))
        functions["onnxruntime"] = lambda: self.session.run(None, feeds)
        functions["numpy"] = lambda: self.numpy(*xs)
        return functions

    def check(self, xs: list[np.ndarray]) -> None:
        """Every strategy computes the same values (bit for bit among onnx_light's paths)."""
        reference = self.kernels["serial"].run(*xs)[0]
        for name, kernel in self.kernels.items():
            if kernel.run(*xs)[0].tobytes() != reference.tobytes():
                raise AssertionError(f"{self.case.name}: {name} differs from serial")
        ort = self.session.run(None, dict(zip(["X", "Y"], xs, strict=False)))[0]
        np.testing.assert_allclose(ort, reference, rtol=1e-6, atol=1e-6)


def _power(size: int) -> str:
    return f"2^{size.bit_length() - 1}"


def _threshold(value: int) -> str:
    return "never" if value >= 1 << 62 else _power(value) if value & (value - 1) == 0 else str(value)


def elementwise_sweep(ctx: Context) -> SectionResult:
    """Section 1."""
    config = ctx.config
    with section(1, "Elementwise sweep: regret of each strategy against the faster path") as result:
        report = ctx.calibrate(SWEPT, CALIBRATED_TYPES)
        calibrated = {r["key"]: r for r in report["calibrated"]}
        strategies = {case.name: Strategies(ctx, case) for case in CASES}
        sizes = [1 << e for e in config.elementwise_exponents]
        inputs = elementwise_crossover.Inputs()
        groups = {}
        for case in CASES:
            for size in sizes:
                xs = inputs.for_case(case, size)
                strategies[case.name].check(xs)
                groups[case.name, size] = strategies[case.name].functions(xs)
        medians = interleaved(groups, config.elementwise_rounds, config.sample_s, log)

        times = Table("Median time of one call (us) and regret (time / faster of serial and "
                      "parallel at that size):",
                      ["case", "elements", *(f"{s} (us)" for s in STRATEGIES), "faster path",
                       *(f"{s} regret" for s in STRATEGIES[2:])],
                      ratios=tuple(f"{s} regret" for s in STRATEGIES[2:]))
        regrets: dict[str, dict[str, list[float]]] = {}
        # The decision alone: the serial or parallel median of the path a threshold takes at that
        # size, over the faster one. Its difference from the measured regret is sampling noise
        # between identical code paths (three kernels running the same code).
        decisions: dict[str, dict[str, list[float]]] = {}
        for case in CASES:
            per = regrets[case.name] = {s: [] for s in STRATEGIES}
            decided = decisions[case.name] = {"portable": [], "calibrated": []}
            for size in sizes:
                m = medians[case.name, size]
                best = min(m["serial"], m["parallel"])
                for s in STRATEGIES:
                    per[s].append(m[s] / best)
                for s in decided:
                    path = "parallel" if strategies[case.name].kernels[s].uses_parallel(size) else "serial"
                    decided[s].append(m[path] / best)
                times.add(case.name, _power(size), *(m[s] * 1e6 for s in STRATEGIES),
                          "serial" if m["serial"] <= m["parallel"] else "parallel",
                          *(m[s] / best for s in STRATEGIES[2:]))

        columns = ["case", "portable threshold", "calibrated threshold"]
        for s in STRATEGIES:
            columns += [f"{s} geomean", f"{s} worst"]
        columns += ["calibrated decision geomean", "calibrated decision worst", "calibrated goal met",
                    "goal met by the decision"]
        summary = Table(f"Regret per case over {len(sizes)} sizes ({_power(sizes[0])} .. "
                        f"{_power(sizes[-1])}): geometric mean and worst case. Goal for the "
                        f"calibrated profile: worst <= {GOAL_WORST:.2f}, geomean <= {GOAL_GEOMEAN:.2f}.",
                        columns, ratios=tuple(c for c in columns if c.endswith(("geomean", "worst"))))

        def meets(values: list[float]) -> bool:
            return max(values) <= GOAL_WORST and geomean(values) <= GOAL_GEOMEAN

        for case in CASES:
            per = regrets[case.name]
            cells: list[Any] = [case.name, _threshold(strategies[case.name].thresholds["portable"]),
                                _threshold(strategies[case.name].thresholds["calibrated"])]
            for s in STRATEGIES:
                cells += [geomean(per[s]), max(per[s])]
            decided = decisions[case.name]["calibrated"]
            summary.add(*cells, geomean(decided), max(decided), meets(per["calibrated"]), meets(decided))
        met_all = all(meets(regrets[case.name]["calibrated"]) for case in CASES)
        decision_met = all(meets(decisions[case.name]["calibrated"]) for case in CASES)

        overall = Table("All cases and sizes together:",
                        ["strategy", "geomean regret", "worst regret", "worst at"],
                        ratios=("geomean regret", "worst regret"))
        for s in STRATEGIES:
            pairs = [(r, f"{case.name} {_power(size)}") for case in CASES
                     for r, size in zip(regrets[case.name][s], sizes, strict=True)]
            worst = max(pairs)
            overall.add(s, geomean([r for r, _ in pairs]), worst[0], worst[1])

        calibration = Table(f"Calibration of these keys ({report['seconds']:.1f} s, "
                            f"`onnx_light.calibrate_kernel_tuning(..., path=<scratch file>)`):",
                            ["key", "portable", "calibrated", "source in a new session",
                             "crossover found", "load average at calibration"])
        for case in CASES:
            key = str(key_of(case))
            if any(row[0] == key for row in calibration.rows):
                continue
            record = calibrated.get(key)
            load = record["load_average"][0] if record and record["load_average"] else None
            calibration.add(key, _threshold(strategies[case.name].thresholds["portable"]),
                            _threshold(strategies[case.name].thresholds["calibrated"]),
                            strategies[case.name].source,
                            "-" if not record or record["crossover"] is None
                            else _power(record["crossover"]), load)
        result.tables = [calibration, summary, overall, times]
        missed = [case.name for case in CASES if not meets(regrets[case.name]["calibrated"])]
        missed_decision = [case.name for case in CASES if not meets(decisions[case.name]["calibrated"])]
        result.notes.append(
            f"**Goal (calibrated: worst <= {GOAL_WORST:.2f} and geomean <= {GOAL_GEOMEAN:.2f} on every "
            f"case), on the calibrated kernel's own timings: {'met' if met_all else 'not met'}**"
            + ("" if met_all else f" (missed on: {', '.join(missed)})")
            + f"; **on its decisions alone (the measured time of the path it takes): "
            f"{'met' if decision_met else 'not met'}**"
            + ("" if decision_met else f" (missed on: {', '.join(missed_decision)})") + ".")
        for failure in report["failed"]:
            result.notes.append(f"calibration failed, nothing published: `{failure['key']}`: "
                                f"{failure['error']}")
        result.notes.append(
            "Strategies: serial / parallel = the kernel with `parallel.minimum_elements` out of "
            "reach / 1; portable = its portable default; calibrated = the value a session resolves "
            "after the calibration above; onnxruntime = `InferenceSession.run` of a one-node model "
            f"(intra_op_num_threads={config.threads}, sequential, its pool's spinning off: "
            "`_common.onnxruntime_session`); numpy = the plain expression "
            "(`np.abs(x)`, `np.add(x, y)`, `np.maximum(x, 0)`, `1 / (1 + np.exp(-x))`, ...). "
            "Every call allocates its output. Regret < 1: faster than both onnx_light paths.")
        result.data = {"medians": medians, "strategies": strategies, "regrets": regrets,
                       "decisions": decisions, "goal_met": met_all, "decision_goal_met": decision_met}
    return result


# ---------------------------------------------------------------------------- section 2

def _bytes_moved(case: Case, size: int) -> int:
    """Bytes read and written by one call: every input of the output's size, and the output."""
    itemsize = numpy_dtype(case.element_type).itemsize
    arrays = 1 + (1 if case.layout == "equal" else 0) + 1  # first input, second input, output
    return arrays * size * itemsize


def memory_bound(ctx: Context) -> SectionResult:
    """Section 2."""
    config = ctx.config
    pool = ctx.pool
    with section(2, "The memory-bound limit: bandwidth of a large copy and each op's fraction") as result:
        ctx.calibrate(SWEPT, CALIBRATED_TYPES)
        count = config.copy_bytes // 4
        source = np.random.default_rng(0).standard_normal(count).astype(np.float32)
        target = np.empty_like(source)

        def copy_block(start: int, stop: int) -> None:
            np.copyto(target[start:stop], source[start:stop])

        def fresh_block(out: np.ndarray) -> Callable[[int, int], None]:
            def block(start: int, stop: int) -> None:
                np.copyto(out[start:stop], source[start:stop])

            return block

        def fresh_parallel() -> None:
            out = np.empty_like(source)
            pool.parallel_for(count, fresh_block(out))

        copies = {
            "parallel copy (np.copyto split across the pool)": lambda: pool.parallel_for(count, copy_block),
            "serial copy (np.copyto)": lambda: np.copyto(target, source),
            "parallel copy into a fresh np.empty output": fresh_parallel,
            "serial np.copy (fresh output)": lambda: np.copy(source),
        }
        size = 1 << config.large_exponent
        inputs = elementwise_crossover.Inputs()
        groups: dict[Any, dict[str, Callable[[], object]]] = {"copy": copies}
        for case in CASES:
            strategy = Strategies(ctx, case)
            fns = strategy.functions(inputs.for_case(case, size))
            groups[case.name] = {"copy": copies["parallel copy (np.copyto split across the pool)"],
                                 "calibrated": fns["calibrated"], "parallel": fns["parallel"],
                                 "onnxruntime": fns["onnxruntime"], "numpy": fns["numpy"]}
        groups["pool"] = {"empty region": parallel_overhead._pool_region(pool, pool.num_threads)}
        faults = {case.name: {name: minor_faults(groups[case.name][name])
                              for name in ("calibrated", "onnxruntime", "numpy")} for case in CASES}
        medians = interleaved(groups, config.rounds, config.sample_s, log)
        copy_bytes = 2 * count * 4
        bandwidth = copy_bytes / medians["copy"]["parallel copy (np.copyto split across the pool)"]

        copy_table = Table(f"Copy of {config.copy_bytes >> 20} MiB (bytes moved = read + write = "
                           f"{copy_bytes >> 20} MiB; the write-allocate read is not counted):",
                           ["copy", "time (ms)", "GB/s", "fraction of parallel copy"],
                           ratios=("fraction of parallel copy",))
        for name, seconds in medians["copy"].items():
            copy_table.add(name, seconds * 1e3, copy_bytes / seconds / 1e9, copy_bytes / seconds / bandwidth)
        ops = Table(f"Each case at {_power(size)} elements; fraction = (bytes read + written) / time, "
                    "divided by the parallel copy's, sampled in the same rounds; minor page faults per "
                    "call from `getrusage` (the output's fresh pages):",
                    ["case", "MiB moved", "calibrated (ms)", "calibrated GB/s", "calibrated fraction",
                     "forced parallel fraction", "onnxruntime fraction", "numpy fraction",
                     "calibrated faults/call", "onnxruntime faults/call", "numpy faults/call"],
                    ratios=("calibrated fraction", "forced parallel fraction", "onnxruntime fraction",
                            "numpy fraction"))
        for case in CASES:
            m = medians[case.name]
            moved = _bytes_moved(case, size)
            copy_rate = copy_bytes / m["copy"]  # this group's own copy: same rounds, side by side
            ops.add(case.name, moved / (1 << 20), m["calibrated"] * 1e3, moved / m["calibrated"] / 1e9,
                    *((moved / m[name]) / copy_rate for name in ("calibrated", "parallel", "onnxruntime",
                                                                  "numpy")),
                    *(faults[case.name][name] for name in ("calibrated", "onnxruntime", "numpy")))
        result.tables = [copy_table, ops]
        result.notes.append(
            f"Multi-threaded memory bandwidth (parallel copy, {config.threads} threads): "
            f"**{bandwidth / 1e9:.1f} GB/s**. An empty `parallel_for` region of {pool.num_threads} "
            f"blocks costs {medians['pool']['empty region'] * 1e6:.1f} us (the fixed price of going "
            "parallel, docs/parallel.md).")
        result.data = {"bandwidth": bandwidth, "medians": medians}
    return result
