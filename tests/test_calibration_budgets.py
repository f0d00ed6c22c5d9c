"""Every calibration callback of the library honours its duration budget, on real kernels.

One key per distinct callback (the elementwise crossover search, Softmax's rows crossover,
Gemm and MatMul's and Conv's configuration searches), at one and two threads: the tuning API discards a result
that arrives after ``max(2 * budget, budget + 1 s)`` (``api._check_result``), so a callback
that overran its budget shows up as a failure here. The Gemm search overran on one thread
before the searches projected a case's cost before starting it.
"""

from __future__ import annotations

import functools

import pytest

import onnx_light
from onnx_light import kernels

pytestmark = pytest.mark.usefixtures("isolated_tuning")

BUDGET_MS = 500


def one_key_per_callback() -> list[str]:
    """The kernel of one float key of each distinct calibration function."""
    chosen: dict[object, str] = {}
    for key, callback in kernels.calibration_callbacks().items():
        function = callback.func if isinstance(callback, functools.partial) else callback
        if key.element_type_name == "float" and function not in chosen:
            chosen[function] = key.kernel
    return sorted(chosen.values())


def test_the_four_searches_are_covered():
    chosen = one_key_per_callback()
    assert {"Conv", "Gemm", "Softmax"} <= set(chosen) and len(chosen) == 4, chosen  # and one elementwise


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kernel", one_key_per_callback())
def test_calibration_keeps_to_its_duration_budget(kernel, threads, tmp_path):
    report = onnx_light.calibrate_kernel_tuning(kernel, "float", num_threads=threads,
                                                path=tmp_path / "c.txt", max_duration_ms=BUDGET_MS)
    assert report["failed"] == [], report["failed"]
    (result,) = report["calibrated"]
    assert result["duration_s"] <= 2 * BUDGET_MS / 1000


@pytest.mark.parametrize("kernel", ["Gemm", "MatMul"])
def test_gemm_on_one_thread_keeps_its_portable_values_without_measuring(kernel, tmp_path):
    """Every parameter of Gemm and MatMul chooses how to use more than one thread: a search on
    one thread would time the same serial product under several names and adopt noise."""
    report = onnx_light.calibrate_kernel_tuning(kernel, "float", num_threads=1,
                                                path=tmp_path / "c.txt", max_duration_ms=5000)
    (result,) = report["calibrated"]
    assert result["portable_kept"] and result["measurements"] == []
    assert "only 1 thread available" in result["diagnostics"][0]
