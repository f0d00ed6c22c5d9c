"""
.. _l-example-plot-kernel-tuning:

Calibrate elementwise kernels on this machine
=============================================

An elementwise kernel such as ``Add`` runs serially on the calling thread, or splits
its output into blocks for the intra-op thread pool once the output has at least
``parallel.minimum_elements`` elements. Where splitting starts to pay depends on the
processor, its caches and the thread count, so onnx_light measures it: calibration
times the forced-serial and the parallel path on the same inputs over a series of
sizes and keeps the smallest size from which the parallel path wins on every larger
size (the *crossover*). When no stable crossover appears, the portable default stays.

This example calibrates ``Add``, ``Abs`` and ``Exp`` for ``float`` with a small
budget, plots what was measured, times sessions forced to the serial and to the
parallel path against the threshold chosen, and shows that a session keeps the
registry generation it captured when it was built. The values are saved to a
temporary cache file, never to your own cache; the figures to PNG files in the
current folder (their paths are printed).

Set ``ONNX_LIGHT_EXAMPLE_QUICK=1`` to shrink every budget (the tests do).
"""

import os
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from onnx import TensorProto, helper

import onnx_light
from onnx_light import kernels
from onnx_light.plotting import plot_calibration
from onnx_light.tuning import KernelTuningRegistry, PublishedProfile

QUICK = os.environ.get("ONNX_LIGHT_EXAMPLE_QUICK", "") not in ("", "0")
OPS = ("Add", "Abs", "Exp")
ELEMENT_TYPE = "float"
PARAMETER = "parallel.minimum_elements"
BUDGET_MS = (150 if QUICK else 2000) * len(OPS)  # for the whole calibration
SIZES = [1 << e for e in (range(12, 19, 3) if QUICK else range(12, 23, 2))]
REPEATS = 3 if QUICK else 15

scratch = tempfile.TemporaryDirectory(prefix="onnx_light-example-")
cache_path = Path(scratch.name) / "kernel-tuning-cache.txt"
print(f"processor: {onnx_light.tuning.execution_descriptor().short()}")
print(f"temporary cache: {cache_path}")

# %%
# One-node models, and a session built before calibration
# --------------------------------------------------------
# The first dimension is symbolic, so one session serves every size. A session
# resolves its kernels' values once, from the registry generation current when it is
# built.


def one_node_model(op_type: str) -> bytes:
    """A model computing ``Y = op_type(inputs)`` on float vectors of any length."""
    names = ["A", "B"] if op_type == "Add" else ["X"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N"]) for n in names]
    output = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N"])
    node = helper.make_node(op_type, names, ["Y"], name=op_type.lower())
    graph = helper.make_graph([node], f"one_{op_type.lower()}", inputs, [output])
    opsets = [helper.make_opsetid("", 17)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


models = {op: one_node_model(op) for op in OPS}
portable_values = {record["key"]: record["defaults"][PARAMETER]
                   for record in onnx_light.kernel_tuning_parameters(list(OPS), ELEMENT_TYPE)}
before = onnx_light.RuntimeSession(models["Add"])
for entry in before.tuning_report():
    print(f"node {entry['node']}: {entry['key']} {entry['values']}")
    print(f"  from {entry['source']}, generation {entry['generation']}")

# %%
# Calibrate with a small budget
# -----------------------------
# ``calibrate_kernel_tuning`` runs each key's calibration callback within its share of
# the budget, then publishes all results in one new registry generation and, with
# ``save=True``, writes them to the cache file at ``path``.

report = onnx_light.calibrate_kernel_tuning(
    list(OPS), ELEMENT_TYPE, max_duration_ms=BUDGET_MS, path=cache_path, save=True
)
results = {r["key"]: r for r in report["calibrated"]}
print(f"generation {report['generation']}, {report['duration_s']:.2f} s")
for key, result in results.items():
    kept = result["portable_kept"]
    state = "portable value kept" if kept else f"crossover {result['crossover']}"
    count = len(result["measurements"])
    print(f"{key}: {result['values']} ({state}; {count} measurements)")
for line in report["diagnostics"]:
    print(line)
for failure in report["failed"]:
    print(f"FAILED {failure['key']}: {failure['error']}")

# %%
# Serial and parallel times per size
# ----------------------------------
# Each point is the median of interleaved samples. ``Add`` is measured on three cases
# (equal shapes, a scalar operand, broadcasting along two axes); the crossover must
# hold for all of them. The red line is the value now in force: the crossover found,
# or the portable default when none was stable (the usual outcome on a busy or
# single-core machine).


def key_of(op_type: str) -> str:
    key = onnx_light.KernelTuningKey("onnx_light", op_type, "portable", ELEMENT_TYPE)
    return str(key)


fig = plot_calibration([results[key_of(op)] for op in OPS if key_of(op) in results])

# %%
# The crossover, measured through sessions
# ----------------------------------------
# What the threshold decides, seen from a model: sessions whose registry forces the
# serial path (a threshold above every size plotted) or the parallel path (a threshold
# of 1) run the same inputs in turn. The upper plot shows their times, with the value
# in force (calibrated or portable) as a red line and the portable default as a grey
# one; the lower plot their ratio, below 1 where the parallel path is faster: the
# threshold belongs where the curve goes below 1 and stays there. The grey band is
# the noise of these timings: the ratio between two sessions that are the same
# (both serial), at each size. A small budget on a busy machine can choose a threshold
# that these timings do not confirm: calibrate on an idle machine with the default
# budget (3 s per key) for values to keep.

descriptor = onnx_light.tuning.execution_descriptor()
rng = np.random.default_rng(0)


def forced(op_type: str, threshold: int) -> onnx_light.RuntimeSession:
    """A session of ``op_type`` whose registry publishes ``threshold`` for this machine."""
    registry = KernelTuningRegistry()
    kernels.register(registry)
    key = onnx_light.KernelTuningKey.parse(key_of(op_type))
    registry.publish([PublishedProfile(key, descriptor, {PARAMETER: threshold})])
    return onnx_light.RuntimeSession(models[op_type], registry=registry)


def median_times(sessions: list, feeds: dict, repeats: int) -> list[float]:
    """Median wall time of ``run`` for each session, the sessions sampled in turn."""
    for session in sessions:
        session.run(None, feeds)  # warm up
    samples: list[list[float]] = [[] for _ in sessions]
    for _ in range(repeats):
        for index, session in enumerate(sessions):
            started = time.perf_counter()
            session.run(None, feeds)
            samples[index].append(time.perf_counter() - started)
    return [statistics.median(s) for s in samples]


fig, axes = plt.subplots(2, len(OPS), figsize=(4.2 * len(OPS), 5.6), sharex=True,
                         gridspec_kw={"height_ratios": [3, 2]})
for (ax, ratio_ax), op_type in zip(axes.T, OPS, strict=True):
    serial, serial_again = forced(op_type, 2 * max(SIZES)), forced(op_type, 2 * max(SIZES))
    parallel = forced(op_type, 1)
    (in_force,) = onnx_light.RuntimeSession(models[op_type]).tuning_report()
    times = []
    for size in SIZES:
        feeds = {arg.name: rng.standard_normal(size).astype(np.float32)
                 for arg in serial.get_inputs()}
        times.append(median_times([serial, parallel, serial_again], feeds, REPEATS))
    ax.plot(SIZES, [t[0] for t in times], "C0-o", label="serial (forced)")
    ax.plot(SIZES, [t[1] for t in times], "C1--x", label="parallel (forced)")
    threshold = in_force["values"][PARAMETER]
    portable_value = portable_values[key_of(op_type)]
    ax.axvline(threshold, color="C3", linewidth=1.5, label=f"{in_force['source']} ({threshold})")
    ax.axvline(portable_value, color="grey", linestyle=":", label=f"portable ({portable_value})")
    ax.set(title=f"{op_type} [{ELEMENT_TYPE}]: session run", yscale="log")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    ratios = [t[1] / t[0] for t in times]
    noise = [abs(t[2] / t[0] - 1.0) for t in times]
    ratio_ax.fill_between(SIZES, [1 - n for n in noise], [1 + n for n in noise], color="grey",
                          alpha=0.3, label="noise (serial / serial)")
    ratio_ax.plot(SIZES, ratios, "C1-x", label="parallel / serial")
    ratio_ax.axhline(1.0, color="grey", linewidth=1)
    ratio_ax.axvline(threshold, color="C3", linewidth=1.5)
    ratio_ax.set_xlabel("output elements")
    ratio_ax.legend(fontsize=7)
    listed = ", ".join(f"{n}: {r:.2f} (noise {e:.2f})"
                       for n, r, e in zip(SIZES, ratios, noise, strict=True))
    print(f"{op_type}: parallel / serial time: {listed}")
axes[0, 0].set_ylabel("median time per run (s)")
axes[1, 0].set_ylabel("parallel / serial")
fig.tight_layout()

# %%
# Generations: a session keeps what it captured
# ---------------------------------------------
# ``before`` was built before the calibration was published; a new session sees the
# new generation. A value set by hand is one more generation: only sessions built
# afterwards use it, while ``before`` keeps running with the values it resolved when
# it was built.

after = onnx_light.RuntimeSession(models["Add"])
onnx_light.set_kernel_tuning_parameters(
    "Add", ELEMENT_TYPE, {PARAMETER: 4096}, path=cache_path)
manual = onnx_light.RuntimeSession(models["Add"])
x = np.ones(8, dtype=np.float32)
sessions = {"before": before, "after calibration": after, "after manual set": manual}
for name, session in sessions.items():
    (entry,) = session.tuning_report()
    (y,) = session.run(None, {"A": x, "B": x})
    print(f"{name:<18} generation {entry['generation']:>3}  {entry['source']:<17} "
          f"{PARAMETER}={entry['values'][PARAMETER]}  run ok: {bool((y == 2).all())}")

# %%
# The cache file, and clean-up
# ----------------------------
# The file has a version header and one JSON entry per line (key, execution
# descriptor, values, provenance). Resetting forgets this machine's values for the
# selected keys, in the registry and in the file, so later sessions resolve the
# portable values again.

lines = cache_path.read_text(encoding="utf-8").splitlines()
print(lines[0])
for line in lines[1:]:
    print(line[:80] + " ...")
reset = onnx_light.reset_kernel_tuning_parameters(
    list(OPS), ELEMENT_TYPE, path=cache_path)
print(f"reset {len(reset['keys'])} keys, generation {reset['generation']}")
print(onnx_light.RuntimeSession(models["Add"]).tuning_report()[0]["source"])
scratch.cleanup()

# %%
# The figures
# -----------
# Saved as PNG files in the current folder, so that a run without a display (over
# SSH, in CI) keeps them too; shown as well where matplotlib has a window to show
# them in.

for number in plt.get_fignums():
    figure_path = Path.cwd() / f"plot_kernel_tuning-{number}.png"
    plt.figure(number).savefig(figure_path, dpi=100)
    print(f"figure saved: {figure_path}")
plt.show()
