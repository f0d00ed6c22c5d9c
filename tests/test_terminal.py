"""Tables and lines fitted to a terminal's width (onnx_light/terminal.py)."""

from __future__ import annotations

import pytest

from onnx_light import terminal
from onnx_light.terminal import fit_table, wrap_words

HEADER = ("key", "state", "values")
ROWS = [("onnx_light/Add/portable[float]@cpu#1", "missing", "a.b=1 c.d=2 e.f=3"),
        ("onnx_light/Conv/portable[float]@cpu#2", "covered",
         "algorithm=auto im2col.block_bytes=16777216 parallel.split=auto")]


def test_a_table_that_fits_keeps_one_line_per_row() -> None:
    lines = fit_table(HEADER, ROWS, 200, wrap=(2,))
    assert lines == fit_table(HEADER, ROWS, None, wrap=(2,))  # no limit: a pipe
    assert len(lines) == 3 and lines[0].split() == ["key", "state", "values"]
    assert lines[2].endswith("parallel.split=auto") and lines[1].index("missing") == 39


def test_a_wrapped_column_stays_in_its_column_and_breaks_between_words() -> None:
    lines = fit_table(HEADER, ROWS, 90, wrap=(2,))
    assert max(map(len, lines)) <= 90 and len(lines) > 3
    start = lines[0].index("values")
    for line in lines[2:]:
        assert line[:start].strip() in ("", ROWS[1][0] + "  covered")
    assert " ".join(line[start:] for line in lines[2:]) == ROWS[1][2]


def test_a_narrow_terminal_stacks_the_wrapped_columns_below_each_row() -> None:
    lines = fit_table(HEADER, ROWS, 50, wrap=(2,))
    assert max(map(len, lines)) <= 50
    assert lines[:3] == ["key                                    state",
                         "onnx_light/Add/portable[float]@cpu#1   missing",
                         "    values  a.b=1 c.d=2 e.f=3"]
    assert lines[4].startswith("    values  algorithm=auto") and lines[5].startswith(" " * 12)


def test_columns_that_cannot_wrap_go_below_too_when_they_alone_are_too_wide() -> None:
    lines = fit_table(HEADER, ROWS, 42, wrap=(2,))
    assert max(map(len, lines)) <= 42
    assert lines[:4] == ["key",
                         "onnx_light/Add/portable[float]@cpu#1",
                         "    state   missing",
                         "    values  a.b=1 c.d=2 e.f=3"]


def test_a_table_without_header() -> None:
    lines = fit_table(None, [("features", "avx avx2 fma sse4_2"), ("cores", "2")], 20, wrap=(1,))
    assert lines == ["features  avx avx2", "          fma sse4_2", "cores     2"]
    assert fit_table(None, [], 20) == []


@pytest.mark.parametrize("width", [10, 17, 30])
def test_wrap_words_breaks_lists_after_commas_and_never_exceeds_the_width(width: int) -> None:
    text = "features: avx,avx2,avx512f,fma,sse4_2 and parallel.minimum_elements=4611686018427387904"
    lines = wrap_words(text, width, indent="  ")
    assert all(len(line) <= width for line in lines)
    assert all(line.startswith("  ") for line in lines[1:])
    assert "".join(line.strip() for line in lines).replace(" ", "") == text.replace(" ", "")


def test_terminal_width_reads_columns_and_is_unlimited_for_a_pipe(monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "97")
    assert terminal.terminal_width() == 97
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr(terminal.sys.stdout, "isatty", lambda: False, raising=False)
    assert terminal.terminal_width() is None
