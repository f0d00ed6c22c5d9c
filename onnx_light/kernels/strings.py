"""String kernels: StringConcat, StringSplit, StringNormalizer, RegexFullMatch.

Strings are numpy object arrays of Python ``str``; each kernel is one Python-level pass
(``str`` methods, ``re``) over the elements. RegexFullMatch compiles its pattern with
Python's ``re`` once, when the node is built: RE2's syntax (what ONNX names) is a subset of
it, apart from a few escapes (``\\pN``, ``\\C``) ``re`` rejects with a clear error; ``re``
also accepts what RE2 does not (backreferences, lookarounds). Not tunable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "RegexFullMatch", "StringConcat", "StringNormalizer", "StringSplit"]

Arrays = Sequence[np.ndarray]
_STRING = {1: (T.STRING,)}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _StringKernel(Kernel):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)


class StringConcat(_StringKernel):
    """ONNX StringConcat (20): X + Y element by element, broadcast as numpy does."""

    op_type: ClassVar[str] = "StringConcat"

    def run(self, x: np.ndarray, y: np.ndarray) -> Arrays:
        try:
            joined = np.add(x.astype(object), y.astype(object))
        except ValueError:
            raise self.ctx.error(f"cannot broadcast shapes {list(x.shape)} and {list(y.shape)}") from None
        return [np.asarray(joined, object)]


class StringSplit(_StringKernel):
    """ONNX StringSplit (20): each string's parts on ``delimiter`` (runs of whitespace, trimmed,
    without one), at most ``maxsplit`` splits, padded with "" to the longest, and their counts."""

    op_type: ClassVar[str] = "StringSplit"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        delimiter = _text(ctx.attribute("delimiter", ""))
        self.delimiter = delimiter or None
        self.maxsplit = int(ctx.attribute("maxsplit", -1))
        if self.maxsplit < -1:
            raise ctx.error(f"maxsplit must not be negative, got {self.maxsplit}")

    def run(self, x: np.ndarray) -> Arrays:
        parts = [_text(s).split(self.delimiter, self.maxsplit) for s in x.reshape(-1)]
        width = max((len(p) for p in parts), default=0)
        y = np.full((len(parts), width), "", object)
        for row, pieces in zip(y, parts, strict=True):
            row[:len(pieces)] = pieces
        counts = np.array([len(p) for p in parts], np.int64).reshape(x.shape)
        return [y.reshape(*x.shape, width), counts]


class StringNormalizer(_StringKernel):
    """ONNX StringNormalizer (10): a [C] or [1, C] tensor without its ``stopwords`` (compared
    case-insensitively unless ``is_case_sensitive``), lowercased, uppercased or left as is."""

    op_type: ClassVar[str] = "StringNormalizer"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.action = _text(ctx.attribute("case_change_action", "NONE"))
        if self.action not in ("LOWER", "UPPER", "NONE"):
            raise ctx.error(f"case_change_action must be 'LOWER', 'UPPER' or 'NONE', got {self.action!r}")
        self.case_sensitive = bool(ctx.attribute("is_case_sensitive", 0))
        words = [_text(w) for w in ctx.attribute("stopwords", []) or []]
        self.stopwords = set(words) if self.case_sensitive else {w.casefold() for w in words}

    def run(self, x: np.ndarray) -> Arrays:
        if not (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1)):
            raise self.ctx.error(f"input must have shape [C] or [1, C], got {list(x.shape)}")
        kept = [_text(s) for s in x.reshape(-1)
                if (_text(s) if self.case_sensitive else _text(s).casefold()) not in self.stopwords]
        if self.action == "LOWER":
            kept = [s.lower() for s in kept]
        elif self.action == "UPPER":
            kept = [s.upper() for s in kept]
        y = np.array(kept or [""], object)
        return [y.reshape(-1) if x.ndim == 1 else y.reshape(1, -1)]


class RegexFullMatch(_StringKernel):
    """ONNX RegexFullMatch (20): whether each string matches ``pattern`` as a whole."""

    op_type: ClassVar[str] = "RegexFullMatch"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        pattern = ctx.attribute("pattern")
        if pattern is None:
            raise ctx.error("attribute 'pattern' is required")
        try:
            self.pattern = re.compile(_text(pattern))
        except re.error as error:
            raise ctx.error(f"pattern {_text(pattern)!r} is not a valid regular expression: "
                            f"{error}") from None

    def run(self, x: np.ndarray) -> Arrays:
        matches = [self.pattern.fullmatch(_text(s)) is not None for s in x.reshape(-1)]
        return [np.array(matches, bool).reshape(x.shape)]


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(RegexFullMatch, (20,), types=_STRING),
    declare(StringConcat, (20,), types=_STRING),
    declare(StringNormalizer, (10,), types=_STRING),
    declare(StringSplit, (20,), types=_STRING),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
