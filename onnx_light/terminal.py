"""Text for a terminal: lines and tables fitted to its width, never wrapped by it.

The command line prints tables whose cells (tuning keys, parameter lists, reasons) are
long; a terminal that wraps them mixes the columns up. :func:`fit_table` wraps the
columns that may be wrapped inside their column, and when even that cannot fit, puts
them on indented lines of their own below each row.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from collections.abc import Sequence

__all__ = ["fit_table", "terminal_width", "wrap_words"]

GAP = "  "
INDENT = "    "


def terminal_width() -> int | None:
    """The columns to fit: ``$COLUMNS`` when set, else the terminal's width when standard
    output is a terminal; None (no limit) when it goes to a pipe or a file, so that every
    row stays on one line for ``grep``."""
    if os.environ.get("COLUMNS", "").strip().isdigit() or sys.stdout.isatty():
        return max(shutil.get_terminal_size().columns, 20)
    return None


def wrap_words(text: str, width: int | None, indent: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken between words, or inside a
    word after a comma (a list) or an equals sign (``name=value``); a longer part is cut.
    Lines after the first start with ``indent``."""
    if width is None or len(text) <= width:
        return [text]
    lines: list[str] = []
    line = ""
    for word in text.split():
        for index, part in enumerate(_parts(word)):
            joined = f"{line} {part}" if line and index == 0 else line + part
            limit = width - (len(indent) if lines else 0)
            if line and len(joined) > limit:
                lines.append(line)
                line = part
            else:
                line = joined
    lines.append(line)
    cut = [piece for number, line in enumerate(lines) for piece in (
        textwrap.wrap(line, width - (len(indent) if number else 0), break_on_hyphens=False)
        or [""])]
    return cut[:1] + [indent + line for line in cut[1:]]


def _parts(word: str) -> list[str]:
    """Where a word may be broken: after each comma and equals sign."""
    return re.findall(r"[^,=]+[,=]?|[,=]", word)


def _column_minimum(cells: Sequence[str]) -> int:
    """How narrow a wrapped column may be: as wide as the longest word of nine cells in ten
    (the others break inside a word, after ``,`` or ``=``), and never narrower than a part."""
    words = sorted(max((len(w) for w in cell.split()), default=0) for cell in cells)
    parts = max((len(p) for cell in cells for w in cell.split() for p in _parts(w)), default=0)
    return max(words[(len(words) * 9) // 10] if words else 0, parts)


def fit_table(header: Sequence[str] | None, rows: Sequence[Sequence[str]], width: int | None,
              wrap: Sequence[int] = ()) -> list[str]:
    """The lines of a table with ``header`` (None: no header line), its columns aligned, at
    most ``width`` wide.

    Columns whose index is in ``wrap`` may be wrapped between words to fit. When they
    cannot be as wide as their longest words (see :func:`_column_minimum`), each row shows
    the other columns on its first line and every wrapped column on an indented line of
    its own, named by its header.
    """
    if header is None:
        return fit_table([""] * len(rows[0]), rows, width, wrap)[1:] if rows else []
    table = [list(header), *(list(row) for row in rows)]
    natural = [max(len(row[i]) for row in table) for i in range(len(header))]
    total = sum(natural) + len(GAP) * (len(natural) - 1)
    if width is None or total <= width or not wrap:
        return [_join(row, natural) for row in table]
    fixed = sum(w for i, w in enumerate(natural) if i not in wrap) + len(GAP) * (len(natural) - 1)
    widths = list(natural)
    room = width - fixed
    minimum = {i: _column_minimum([row[i] for row in table[1:]]) for i in wrap}
    while sum(widths[i] for i in wrap) > room:
        widest = max(wrap, key=lambda i: widths[i] - minimum[i])
        if widths[widest] <= minimum[widest]:
            return _stacked(table, natural, wrap, width)
        widths[widest] -= 1
    lines = []
    for row in table:
        cells = [wrap_words(cell, widths[i]) if i in wrap else [cell] for i, cell in enumerate(row)]
        for depth in range(max(len(c) for c in cells)):
            lines.append(_join([c[depth] if depth < len(c) else "" for c in cells], widths))
    return lines


def _stacked(table: list[list[str]], natural: list[int], wrap: Sequence[int],
             width: int) -> list[str]:
    """Each row's unwrapped columns on one line and the others on indented lines below it;
    where even the unwrapped columns are too wide, their last ones go below too."""
    kept = [i for i in range(len(natural)) if i not in wrap]
    while len(kept) > 1 and sum(natural[i] for i in kept) + len(GAP) * (len(kept) - 1) > width:
        kept.pop()
    below = [i for i in range(len(natural)) if i not in kept]
    names = max(len(table[0][i]) for i in below)
    hanging = INDENT + " " * (names + len(GAP))
    lines = [_join([table[0][i] for i in kept], [natural[i] for i in kept])]
    for row in table[1:]:
        lines.append(_join([row[i] for i in kept], [natural[i] for i in kept]))
        for i in below:
            text = wrap_words(row[i], max(width - len(hanging), 10))
            lines.append(f"{INDENT}{table[0][i]:<{names}}{GAP}{text[0]}".rstrip())
            lines += [hanging + more for more in text[1:]]
    return lines


def _join(cells: Sequence[str], widths: Sequence[int]) -> str:
    return GAP.join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()
