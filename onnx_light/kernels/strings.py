"""Text kernels: StringConcat, StringSplit, StringNormalizer, RegexFullMatch, TfIdfVectorizer.

TfIdfVectorizer counts the n-grams of a pool in token sequences (strings or integer ids).

Strings are numpy object arrays of Python ``str``; each kernel is one Python-level pass
(``str`` methods, ``re``) over the elements. RegexFullMatch compiles its pattern with
Python's ``re`` once, when the node is built: RE2's syntax (what ONNX names) is a subset of
it, apart from a few escapes (``\\pN``, ``\\C``) ``re`` rejects with a clear error; ``re``
also accepts what RE2 does not (backreferences, lookarounds). TfIdfVectorizer looks each
n-gram of a row up in a dict of the pool's n-grams built when the node is built. Not tunable.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..tuning.keys import ElementType as T
from .base import Kernel, NodeContext
from .declaration import KernelDeclaration, declare, dispatch_table

__all__ = ["KERNELS", "RegexFullMatch", "StringConcat", "StringNormalizer", "StringSplit", "TfIdfVectorizer"]

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
            row[: len(pieces)] = pieces
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
        kept = [
            _text(s)
            for s in x.reshape(-1)
            if (_text(s) if self.case_sensitive else _text(s).casefold()) not in self.stopwords
        ]
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
            raise ctx.error(
                f"pattern {_text(pattern)!r} is not a valid regular expression: {error}"
            ) from None

    def run(self, x: np.ndarray) -> Arrays:
        matches = [self.pattern.fullmatch(_text(s)) is not None for s in x.reshape(-1)]
        return [np.array(matches, bool).reshape(x.shape)]


class TfIdfVectorizer(Kernel):
    """ONNX TfIdfVectorizer (9): for each row of a [C] or [N, C] tensor of tokens, how often
    each n-gram of the pool occurs, its n from ``min_gram_length`` to ``max_gram_length``,
    with up to ``max_skip_count`` tokens skipped between its items (unigrams counted once);
    the counts (TF), their indicator (IDF) or either times ``weights`` (TFIDF, IDF), at the
    output columns ``ngram_indexes`` gives."""

    op_type: ClassVar[str] = "TfIdfVectorizer"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.mode = _text(ctx.attribute("mode", ""))
        if self.mode not in ("TF", "IDF", "TFIDF"):
            raise ctx.error(f"mode must be 'TF', 'IDF' or 'TFIDF', got {self.mode!r}")
        self.min_n = int(ctx.attribute("min_gram_length", 0))
        self.max_n = int(ctx.attribute("max_gram_length", 0))
        self.max_skip = int(ctx.attribute("max_skip_count", 0))
        if not 1 <= self.min_n <= self.max_n or self.max_skip < 0:
            raise ctx.error(
                f"need 1 <= min_gram_length ({self.min_n}) <= max_gram_length "
                f"({self.max_n}) and max_skip_count ({self.max_skip}) >= 0"
            )
        integers, strings = ctx.attribute("pool_int64s"), ctx.attribute("pool_strings")
        if (integers is None) == (strings is None):
            raise ctx.error("exactly one of pool_int64s and pool_strings must be set")
        pool = [int(v) for v in integers] if strings is None else [_text(v) for v in strings]
        starts = [int(c) for c in ctx.attribute("ngram_counts", [])]
        indexes = [int(i) for i in ctx.attribute("ngram_indexes", [])]
        self.grams = self._grams(pool, starts)
        if len(indexes) != sum(len(grams) for grams in self.grams.values()):
            raise ctx.error(
                f"ngram_indexes has {len(indexes)} entries, the pool holds "
                f"{sum(len(grams) for grams in self.grams.values())} n-grams"
            )
        if any(i < 0 for i in indexes):
            raise ctx.error("ngram_indexes must not be negative")
        weights = ctx.attribute("weights")
        if weights is not None and len(weights) != len(indexes):
            raise ctx.error(f"weights has {len(weights)} entries, ngram_indexes {len(indexes)}")
        self.columns = np.array(indexes, np.int64)
        self.width = max(indexes, default=-1) + 1
        self.weights = None if weights is None else np.array(weights, np.float32)

    def _grams(self, pool: list, starts: list[int]) -> dict[int, dict[tuple, int]]:
        """The pool's n-grams for each n: ``{n: {n-gram: its position among all n-grams}}``."""
        bounds = [*starts, len(pool)]
        if any(not 0 <= a <= b <= len(pool) for a, b in itertools.pairwise(bounds)):
            raise self.ctx.error(f"ngram_counts {starts} are not ascending starts in the pool of {len(pool)}")
        grams: dict[int, dict[tuple, int]] = {}
        position = 0
        for n, (begin, end) in enumerate(itertools.pairwise(bounds), start=1):
            if (end - begin) % n:
                raise self.ctx.error(f"the pool's {n}-grams span {end - begin} items, not a multiple of {n}")
            grams[n] = {}
            for start in range(begin, end, n):
                grams[n][tuple(pool[start : start + n])] = position
                position += 1
        return grams

    def _counts(self, row: list) -> np.ndarray:
        counts = np.zeros(len(self.columns), np.float32)
        for n in range(self.min_n, self.max_n + 1):
            grams = self.grams.get(n)
            if not grams:
                continue
            for skip in range(self.max_skip + 1 if n > 1 else 1):
                step = skip + 1
                for start in range(len(row) - (n - 1) * step):
                    found = grams.get(tuple(row[start : start + (n - 1) * step + 1 : step]))
                    if found is not None:
                        counts[found] += 1
        return counts

    def run(self, x: np.ndarray) -> Arrays:
        if x.ndim not in (1, 2):
            raise self.ctx.error(f"input must have shape [C] or [N, C], got {list(x.shape)}")
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        convert = _text if x.dtype.kind in "OSU" else int
        y = np.zeros((len(rows), self.width), np.float32)
        for out, row in zip(y, rows, strict=True):
            counts = self._counts([convert(v) for v in row])
            if self.mode == "IDF":
                counts = (counts > 0).astype(np.float32)
            if self.mode != "TF" and self.weights is not None:
                counts *= self.weights
            np.add.at(out, self.columns, counts)
        return [y.reshape(-1) if x.ndim == 1 else y]


# Every since_version ONNX 1.23 defines for each op; one class serves them all.
DECLARATIONS: tuple[KernelDeclaration, ...] = (
    declare(RegexFullMatch, (20,), types=_STRING),
    declare(StringConcat, (20,), types=_STRING),
    declare(StringNormalizer, (10,), types=_STRING),
    declare(StringSplit, (20,), types=_STRING),
    declare(TfIdfVectorizer, (9,), types=(T.STRING, T.INT32, T.INT64)),
)
KERNELS: dict[str, dict[int, type[Kernel]]] = dispatch_table(DECLARATIONS)
