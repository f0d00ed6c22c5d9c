"""Figures of calibration results (matplotlib, an optional dependency: ``pip install onnx_light[plot]``).

Used by ``tune-kernels --apply --plot FILE.png``, ``run --profile`` and by the example gallery.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["plot_calibration", "plot_operator_times"]

CASE_STYLES = {"equal": "-", "scalar": "--", "broadcast": ":"}


def _pyplot(path: str | None) -> Any:
    try:
        import matplotlib

        if path is not None:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'onnx_light[plot]'") from None
    return plt


def plot_operator_times(rows: Sequence[dict[str, Any]], path: str | None = None) -> Any:
    """A bar per operator type: its share of the run time, with its calls and mean time.

    ``rows`` are ``Profiler.operator_summary()`` records. Returns the matplotlib figure,
    saved to ``path`` when given.
    """
    plt = _pyplot(path)
    rows = list(rows)[::-1]  # the largest at the top
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.32 * len(rows)))
    ax.barh([row["op_type"] for row in rows], [100 * row["share"] for row in rows])
    for index, row in enumerate(rows):
        ax.text(100 * row["share"], index, f" {row['calls']} calls, {row['mean_us'] / 1e3:.3f} ms mean",
                va="center", fontsize=7)
    ax.set_xlabel("share of the run time (%)")
    ax.set_title("time per operator type", fontsize=9)
    ax.margins(x=0.35)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def plot_calibration(results: Sequence[dict[str, Any]], path: str | None = None) -> Any:
    """One panel per calibrated key: serial and candidate median times per size and case
    (for a configuration search: portable and candidate times per case, by its work), with
    the chosen crossover (or the portable value kept) marked.

    ``results`` are the ``calibrated``/``applied`` records of a calibration report. Returns
    the matplotlib figure, saved to ``path`` when given.
    """
    plt = _pyplot(path)
    results = list(results)
    if not results:
        raise ValueError("no calibration results to plot")
    columns = min(3, len(results))
    rows = -(-len(results) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(results):]:
        ax.set_visible(False)
    for ax, result in zip(axes.flat, results, strict=False):
        _panel(ax, result)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _panel(ax: Any, result: dict[str, Any]) -> None:
    ax.set_title(result["key"], fontsize=8)
    measurements = result["measurements"]
    if not measurements:
        ax.text(0.5, 0.5, "nothing measured\n" + "\n".join(result["diagnostics"])[-120:],
                ha="center", va="center", fontsize=7, transform=ax.transAxes, wrap=True)
        return
    # A crossover search measures the serial path per size; a configuration search the
    # portable configuration per corpus case, whose size is its work.
    crossover_search = "size" in measurements[0]
    size, reference = ("size", "serial") if crossover_search else ("work", "portable")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("output elements" if crossover_search else "work (multiply-adds)")
    ax.set_ylabel("median time per call (s)")
    for case in dict.fromkeys(m["case"] for m in measurements):
        points = [m for m in measurements if m["case"] == case]
        style = CASE_STYLES.get(case, "-.")
        sizes = [m[size] for m in points]
        ax.plot(sizes, [m[f"{reference}_median_s"] for m in points], "C0" + style, marker=".",
                label=f"{reference} ({case})")
        ax.plot(sizes, [m["candidate_median_s"] for m in points], "C1" + style, marker=".",
                label=f"{points[0]['candidate']} ({case})")
    crossover = result.get("crossover")
    if crossover is not None:
        ax.axvline(crossover, color="C3", linewidth=1.5, label=f"crossover {crossover}")
    else:
        ax.text(0.02, 0.98, "portable value kept", va="top", fontsize=7, color="C3",
                transform=ax.transAxes)
    ax.legend(fontsize=6)
