"""Smoke test of the benchmark suite (``benchmarks/run.py``): every section runs at a tiny size.

No timing is asserted: the tables must have their columns, their ratio columns must hold
positive finite numbers, and the markdown must carry the load and the section's title.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

pytest.importorskip("onnxruntime")

import _common  # noqa: E402
import run  # noqa: E402

EXPECTED_COLUMNS = {
    1: [{"case", "elements", "serial (us)", "parallel (us)", "portable (us)", "calibrated (us)",
         "onnxruntime (us)", "numpy (us)", "calibrated regret"},
        {"case", "calibrated geomean", "calibrated worst", "portable geomean", "onnxruntime worst",
         "numpy geomean", "calibrated goal met", "calibrated decision worst"}],
    2: [{"copy", "GB/s", "fraction of parallel copy"},
        {"case", "calibrated GB/s", "calibrated fraction", "onnxruntime fraction", "numpy fraction"}],
    3: [{"op", "shape (MxKxN)", "portable GFLOP/s", "calibrated GFLOP/s", "numpy GFLOP/s",
         "onnxruntime GFLOP/s", "calibrated / onnxruntime"}],
    4: [{"runtime", "per node (us)", "marginal per node (us)", "per node / onnxruntime"}],
    5: [{"what", "value"}, {"key", "parameter", "chosen, in order", "max / min"}],
    6: [{"import", "import statement (ms)", "/ onnx_light without cache"},
        {"entries", "load (ms)"}, {"model", "onnx_light (ms)", "onnxruntime (ms)",
                                   "onnx_light / onnxruntime"}],
}


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    ctx = _common.Context(_common.Config.tiny(threads=2), tmp_path_factory.mktemp("bench"))
    yield ctx
    ctx.close()


@pytest.mark.parametrize("number", sorted(run.SECTIONS))
def test_section_runs_and_reports(context, number):
    result = run.SECTIONS[number](context)
    assert result.number == number and result.tables
    for expected in EXPECTED_COLUMNS[number]:
        assert any(expected <= set(table.columns) for table in result.tables), \
            f"no table of section {number} has the columns {sorted(expected)}"
    for table in result.tables:
        assert table.rows, table.title
        assert all(len(row) == len(table.columns) for row in table.rows)
        for name in table.ratios:
            values = [v for v in table.column(name) if v is not None]
            assert values, f"{table.title}: column {name!r} is empty"
            for value in values:
                assert isinstance(value, float) and math.isfinite(value) and value > 0, \
                    f"{table.title}: {name} = {value!r}"
    text = result.markdown()
    assert text.startswith(f"## {number}. ") and "load average (1 min) at start" in text


def test_header_names_the_execution_descriptor(context):
    text = _common.header(context.config)
    assert context.descriptor.short() in text and '"num_threads": 2' in text


def test_command_line_parses_the_documented_options():
    args = run.build_parser().parse_args(["--quick", "--threads", "2", "--output", "x.md",
                                          "--sections", "1,4", "--max-wait-minutes", "0"])
    assert args.quick and args.threads == 2 and args.output == "x.md" and args.sections == [1, 4]
    with pytest.raises(SystemExit):
        run.build_parser().parse_args(["--sections", "9"])


def test_cli_bench_runs_the_script_of_the_source_tree(monkeypatch):
    from onnx_light import cli

    assert cli.BENCHMARK_SCRIPT == BENCHMARKS / "run.py"
    calls = []
    monkeypatch.setattr(cli.subprocess, "call", lambda argv: calls.append(argv) or 0)
    assert cli.main(["bench", "--quick", "--threads", "2", "--output", "out.md"]) == 0
    assert calls == [[sys.executable, str(BENCHMARKS / "run.py"), "--quick", "--threads", "2",
                      "--output", "out.md"]]


def test_cli_bench_without_the_source_tree_says_where_the_suite_is(monkeypatch, capsys, tmp_path):
    from onnx_light import cli

    monkeypatch.setattr(cli, "BENCHMARK_SCRIPT", tmp_path / "absent" / "run.py")
    assert cli.main(["bench"]) == 2
    assert "python benchmarks/run.py" in capsys.readouterr().err
