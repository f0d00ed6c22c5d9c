"""Tests for the kernel tuning cache file (cache.py): format, per-entry outcomes, damage,
merging, backups and concurrent writers in several processes.

Every processor here is synthetic; the registry is a fresh one per test.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tuning_helpers import (
    MIN_ELEMENTS,
    cache_reader,
    cache_writer,
    descriptor,
    four_type_schema,
    fresh_registry,
    key,
    simple_schema,
    writer_key,
)

from onnx_light.tuning import cache as cache_module
from onnx_light.tuning import cache_format
from onnx_light.tuning.cache import (
    HEADER,
    CacheEntry,
    CacheStatus,
    LineOutcome,
    classify,
    load_into,
    read_cache,
    update_cache,
)
from onnx_light.tuning.identity import identity
from onnx_light.tuning.registry import KernelTuningRegistry
from onnx_light.tuning.schema import KernelTuningSchema

K = key()
MIXED = key("Mixed")
LOCAL = descriptor("zen3", 8)


def registry() -> KernelTuningRegistry:
    return fresh_registry([simple_schema(K), four_type_schema(MIXED)])


def entry(value: int = 5, k=K, where=LOCAL, **provenance) -> CacheEntry:
    """An entry measured now (it records this process's versions)."""
    return CacheEntry(k, where, {MIN_ELEMENTS: value}, provenance, identity(k, 1))


def write(path: Path, *lines: str | bytes, header: str = HEADER) -> bytes:
    """Write a cache file from raw lines; returns its bytes."""
    parts = [header.encode(), *(x if isinstance(x, bytes) else x.encode() for x in lines)]
    data = b"\n".join(parts) + b"\n"
    path.write_bytes(data)
    return data


def outcomes_by_line(path: Path, reg: KernelTuningRegistry, local=LOCAL) -> dict[int, tuple[str, str]]:
    outcomes, _ = classify(read_cache(path), reg.snapshot(), local)
    return {o.line: (o.outcome, o.reason) for o in outcomes}


def mixed(values: dict, where=LOCAL) -> CacheEntry:
    return CacheEntry(MIXED, where, values, {"origin": "test"}, identity(MIXED, 1))


# --------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------

VALUES = st.fixed_dictionaries({
    "p.int": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "p.float": st.floats(allow_nan=False, allow_infinity=False),
    "p.bool": st.booleans(),
    "p.str": st.text(max_size=30),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=VALUES, threads=st.integers(min_value=1, max_value=4096))
def test_update_then_read_gives_the_same_profiles(values: dict, threads: int) -> None:
    reg = registry()
    where = descriptor("icelake", threads)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cache.txt"
        update_cache(path, [mixed(values, where), entry(7, where=where)])
        cache = read_cache(path)
        assert cache.status == CacheStatus.OK
        assert cache.diagnostics == []
        outcomes, profiles = classify(cache, reg.snapshot(), where)
    assert [o.outcome for o in outcomes] == [LineOutcome.LOADED, LineOutcome.LOADED]
    assert all(o.matches_this_machine for o in outcomes)
    by_key = {p.key: p for p in profiles}
    assert by_key[MIXED].descriptor == where
    assert dict(by_key[MIXED].values) == values
    assert math.copysign(1, by_key[MIXED].values["p.float"]) == math.copysign(1, values["p.float"])
    assert dict(by_key[K].values) == {MIN_ELEMENTS: 7}
    assert by_key[MIXED].provenance["origin"] == "test"


@settings(deadline=None)
@given(values=VALUES)
def test_entry_line_round_trip(values: dict) -> None:
    from onnx_light.tuning.cache import CacheLine

    original = mixed(values)
    text = original.to_line()
    assert "\n" not in text
    line = CacheLine.parse(2, text)
    assert line.error is None
    assert line.identity == original.identity()
    parsed = line.entry()
    assert (parsed.key, parsed.descriptor, dict(parsed.values)) == (MIXED, LOCAL, values)


def test_written_file_format(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "cache.txt"  # missing folders are created
    report = update_cache(path, [entry(5), entry(6, k=MIXED)])
    assert report["written"] == 2
    assert (report["replaced"], report["kept"], report["backup"]) == (0, 0, None)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    assert lines[0] == HEADER == "onnx_light-kernel-tuning-cache 2"
    assert text.endswith("\n")
    records = [json.loads(line) for line in lines[1:] if line]
    assert [r["key"] for r in records] == [str(K), str(MIXED)]
    assert set(records[0]) == {"key", "descriptor", "values", "provenance", "measured_under"}
    assert records[0]["descriptor"] == LOCAL.to_dict()


# --------------------------------------------------------------------------------------------
# Per-entry outcomes
# --------------------------------------------------------------------------------------------


def test_each_entry_gets_its_outcome(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    other_cpu = descriptor("zen3", 8, model=33, features=frozenset({"avx2"}))
    first = mixed({"p.int": 1, "p.float": 1.0, "p.bool": True, "p.str": "a"}).to_line()
    second = mixed({"p.int": 2, "p.float": 2.0, "p.bool": False, "p.str": "b"}).to_line()
    write(
        path,
        entry(5).to_line(),                                  # 2 loaded, this machine
        entry(6, where=descriptor("zen3", 4)).to_line(),     # 3 loaded, other thread count
        entry(7, where=other_cpu).to_line(),                 # 4 incompatible
        entry(8, k=key(tuning_abi=2)).to_line(),             # 5 stale
        entry(0, k=key("Sub")).to_line(),                    # 6 unknown_key
        entry(5, k=MIXED, where=descriptor("zen3", 2)).to_line(),  # 7 invalid (values)
        "this is not json",                                  # 8 invalid (garbage)
        first,                                               # 9 duplicate
        second,                                              # 10 loaded
    )
    found = outcomes_by_line(path, registry())
    assert {n: o for n, (o, _) in found.items()} == {
        2: LineOutcome.LOADED, 3: LineOutcome.LOADED, 4: LineOutcome.INCOMPATIBLE,
        5: LineOutcome.STALE, 6: LineOutcome.UNKNOWN_KEY, 7: LineOutcome.INVALID,
        8: LineOutcome.INVALID, 9: LineOutcome.DUPLICATE, 10: LineOutcome.LOADED}
    assert found[2][1] == "matches this machine"
    assert found[3][1] == "this processor at 4 threads"
    assert found[4][1] == "processor differs in cpu.model, cpu.features"
    assert "num_threads" not in found[4][1]
    assert found[5][1] == "tuning ABI 2; registered ABI [1]"
    assert found[6][1] == "no schema registered"
    assert str(MIXED) in found[7][1]
    assert "unknown parameter" in found[7][1]
    assert "not a JSON object" in found[8][1]
    assert found[9][1] == "superseded by line 10"
    outcomes, profiles = classify(read_cache(path), registry().snapshot(), LOCAL)
    flags = {o.line: o.matches_this_machine for o in outcomes}
    assert flags[2] and not flags[3] and flags[10]
    loaded = {(p.key, p.descriptor.num_threads): dict(p.values) for p in profiles}
    assert loaded == {(K, 8): {MIN_ELEMENTS: 5}, (K, 4): {MIN_ELEMENTS: 6},
                      (MIXED, 8): {"p.int": 2, "p.float": 2.0, "p.bool": False, "p.str": "b"}}


def test_load_into_publishes_every_loadable_entry_in_one_generation(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    write(path, entry(5).to_line(), entry(6, where=descriptor("zen3", 4)).to_line(),
          entry(7, where=descriptor("icelake")).to_line(), "garbage")
    reg = registry()
    before = reg.generation
    report = load_into(reg, path, LOCAL)
    assert report["generation"] == reg.generation == before + 1
    assert report["loaded"] == 2
    assert report["status"] is CacheStatus.DAMAGED
    assert [e["outcome"] for e in report["entries"]] == [
        LineOutcome.LOADED, LineOutcome.LOADED, LineOutcome.INCOMPATIBLE, LineOutcome.INVALID]
    text = json.loads(json.dumps(report))  # the enums are their text in JSON and messages
    assert text["status"] == "damaged" and type(text["status"]) is str
    assert [e["outcome"] for e in text["entries"]] == ["loaded", "loaded", "incompatible", "invalid"]
    assert text["counts"] == {"incompatible": 1, "invalid": 1, "loaded": 2}
    assert any(":4: incompatible: processor differs in " in d for d in report["diagnostics"])
    assert any(":5:" in d for d in report["diagnostics"])
    snapshot = reg.snapshot()
    assert snapshot.resolve(K, LOCAL).values[MIN_ELEMENTS] == 5
    assert snapshot.resolve(K, descriptor("zen3", 4)).values[MIN_ELEMENTS] == 6
    assert snapshot.resolve(K, descriptor("icelake")).source == "portable_default"
    assert snapshot.published_profile(K, LOCAL).provenance["cache_line"] == 2


def test_load_into_with_nothing_loadable_keeps_the_generation(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    write(path, entry(7, where=descriptor("icelake")).to_line())
    reg = registry()
    report = load_into(reg, path, LOCAL)
    assert report["loaded"] == 0
    assert report["generation"] == reg.generation == 1


# --------------------------------------------------------------------------------------------
# Damage
# --------------------------------------------------------------------------------------------


def _bad_lines() -> list[tuple[bytes | str, str]]:
    good = json.loads(entry(5).to_line())
    threads = iter(range(100, 1000))

    def variant(**changes) -> str:
        """The good entry with ``changes``, on its own thread count (no duplicates)."""
        unique = {**good["descriptor"], "num_threads": next(threads)}
        return json.dumps({**good, "descriptor": unique, **changes})

    def raw_value(text: str) -> str:
        return variant(values={MIN_ELEMENTS: 123456789}).replace("123456789", text)

    descriptor_dict = LOCAL.to_dict()
    return [
        ("{not json", "not a JSON object"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        ("[1, 2, 3]", "not a JSON object"),
        ("null", "not a JSON object"),
        ('"just a string"', "not a JSON object"),
        ("[" * 100000 + "]" * 100000, "not a JSON object"),
        (variant(values={MIN_ELEMENTS: float("nan")}), "NaN is not allowed"),
        (variant(values={MIN_ELEMENTS: float("-inf")}), "-Infinity is not allowed"),
        (variant(values={MIN_ELEMENTS: 2**70}), "does not fit in int64"),
        (raw_value("9" * 5000), "not a JSON object"),
        (raw_value("1e400"), "expected int, got float inf"),
        (variant(values={MIN_ELEMENTS: "5"}), "expected int"),
        (variant(values={MIN_ELEMENTS: True}), "expected int, got bool"),
        (variant(values={MIN_ELEMENTS: [5]}), "expected int"),
        (variant(values={MIN_ELEMENTS: 0}), "below the minimum"),
        (variant(values={}), "missing"),
        (variant(values=[5]), "'values' must be an object"),
        (variant(provenance="me"), "'provenance' must be an object"),
        (variant(extra=1), "unknown field"),
        (variant(key=5), "needs a string 'key'"),
        (variant(key="Add"), "not a kernel tuning key"),
        (variant(key=str(K).replace("@cpu", "@gpu")), "device"),
        (variant(key=str(K).replace("[float]", "[quux]")), "element type"),
        (variant(descriptor=[]), "needs a string 'key' and an object 'descriptor'"),
        (variant(descriptor={**descriptor_dict, "num_threads": 0}), "num_threads"),
        (variant(descriptor={**descriptor_dict, "num_threads": True}), "num_threads"),
        (variant(descriptor={**descriptor_dict, "num_threads": 1.5}), "num_threads"),
    ]


def test_bad_lines_are_invalid_with_their_line_number_and_good_entries_still_load(
        tmp_path: Path) -> None:
    bad = _bad_lines()
    path = tmp_path / "cache.txt"
    good_first = entry(11, k=K, where=descriptor("zen3", 1)).to_line()
    good_last = mixed({"p.int": 3, "p.float": 0.25, "p.bool": True, "p.str": "ok"}).to_line()
    write(path, good_first, *(line for line, _ in bad), "", "# a comment", good_last)
    reg = registry()
    report = load_into(reg, path, LOCAL)
    assert report["status"] == "damaged"
    assert report["loaded"] == 2
    entries = {e["line"]: e for e in report["entries"]}
    assert entries[2]["outcome"] == "loaded"
    last = 3 + len(bad) + 2
    assert entries[last]["outcome"] == "loaded"
    for number, (_, reason) in enumerate(bad, start=3):
        assert entries[number]["outcome"] == "invalid", (number, entries[number])
        assert reason in entries[number]["reason"], (number, entries[number])
        mentions = [d for d in report["diagnostics"] if d.startswith(f"{path}:{number}: ")]
        assert len(mentions) == 1, (number, mentions)  # each damaged line reported once
    assert set(entries) == {2, last, *range(3, 3 + len(bad))}  # blank and comment lines skipped
    snapshot = reg.snapshot()
    assert snapshot.resolve(K, descriptor("zen3", 1)).values[MIN_ELEMENTS] == 11
    assert snapshot.resolve(MIXED, LOCAL).values["p.str"] == "ok"


def test_an_entry_for_another_processor_is_compared_not_validated(tmp_path: Path) -> None:
    """Only entries for this processor are validated in full (loading must not cost a
    validation per foreign entry): a descriptor with a bad field is another processor's."""
    cpu = LOCAL.to_dict()["cpu"]
    lines = [json.dumps({**json.loads(entry(5).to_line()),
                         "descriptor": {"cpu": {**cpu, **change}, "num_threads": 8}})
             for change in ({"family": "25"}, {"colour": "red"}, {"features": [1]})]
    reordered = json.loads(entry(6, where=descriptor("zen3", 3)).to_line())
    reordered["descriptor"]["cpu"]["features"].reverse()
    path = tmp_path / "cache.txt"
    write(path, *lines, json.dumps(reordered))
    found = outcomes_by_line(path, registry())
    assert found == {2: ("incompatible", "processor differs in cpu.family"),
                     3: ("incompatible", "processor differs in cpu.colour"),
                     4: ("incompatible", "processor differs in cpu.features"),
                     5: ("loaded", "this processor at 3 threads")}


def test_short_lines_are_blank_comments_or_damaged_and_past_the_listed_ones_only_counted(
        tmp_path: Path, monkeypatch) -> None:
    """Blank lines (CRLF, tabs), comments (indented too), short damaged lines (indented too,
    not UTF-8) in numbers past the listing cap, and more comments than are kept."""
    monkeypatch.setattr(cache_format, "MAX_COMMENTS", 3)
    path = tmp_path / "cache.txt"
    short = [b"\r", b"\t ", b"", b"# one", b"  # two", b" x", b"{}", b"\xff\xfe", b"#3", b"#4"]
    write(path, entry(5).to_line(), *short * 40, entry(6, where=descriptor("zen3", 1)).to_line())
    cache = read_cache(path)
    assert cache.status == CacheStatus.DAMAGED
    assert cache.comments == [(6, "# one"), (7, "# two"), (11, "#3")]
    assert cache.damaged == 40 * 3 + (40 * 4 - 3)  # short lines and comments past the three
    listed = [line for line in cache.lines if line.error is not None]
    assert [(line.number, line.error[:10]) for line in listed[:4]] == [
        (8, "not a JSON"), (9, "needs a st"), (10, "not UTF-8 "), (18, "not a JSON")]
    assert len(listed) == cache_module.LISTED_LINES
    assert cache.diagnostics[-1] == f"{path}: {cache.damaged - 100} more damaged lines not listed"
    report = load_into(registry(), path, LOCAL)
    assert report["loaded"] == 2 and report["counts"] == {"invalid": cache.damaged, "loaded": 2}


def test_float_parameter_given_a_huge_int_is_invalid(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    line = mixed({"p.int": 1, "p.float": 1.0, "p.bool": True, "p.str": "a"}).to_line()
    write(path, line.replace('"p.float":1.0', '"p.float":' + "9" * 400), entry(5).to_line())
    report = load_into(registry(), path, LOCAL)
    assert [e["outcome"] for e in report["entries"]] == ["invalid", "loaded"]
    assert "p.float" in report["entries"][0]["reason"]


def test_crlf_line_endings_load(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    path.write_bytes((HEADER + "\r\n" + entry(5).to_line() + "\r\n").encode())
    report = load_into(registry(), path, LOCAL)
    assert (report["status"], report["loaded"]) == ("ok", 1)


def _make(kind: str, path: Path) -> None:
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling symlink":
        path.symlink_to(path.parent / "nowhere.txt")
    elif kind == "wrong header":
        path.write_text("some-other-cache 1\n" + entry(5).to_line() + "\n")
    elif kind == "no header":
        path.write_text(entry(5).to_line() + "\n")
    elif kind == "header without version":
        path.write_text("onnx_light-kernel-tuning-cache\n" + entry(5).to_line() + "\n")
    elif kind == "newer version":
        path.write_text("onnx_light-kernel-tuning-cache 3\n" + entry(5).to_line() + "\n")
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)


@pytest.mark.parametrize(
    ("kind", "status", "diagnostic"),
    [
        ("missing", CacheStatus.MISSING, None),
        ("empty", CacheStatus.FOREIGN, "empty file"),
        ("directory", CacheStatus.UNREADABLE, "not a regular file"),
        ("dangling symlink", CacheStatus.UNREADABLE, "a symbolic link"),
        ("wrong header", CacheStatus.FOREIGN, "not a kernel tuning cache"),
        ("no header", CacheStatus.FOREIGN, "not a kernel tuning cache"),
        ("header without version", CacheStatus.FOREIGN, "not a kernel tuning cache"),
        ("newer version", CacheStatus.UNSUPPORTED_VERSION, "format version '3'"),
        ("binary", CacheStatus.FOREIGN, "not a kernel tuning cache"),
    ],
)
def test_unusable_files_give_diagnostics_not_exceptions(tmp_path: Path, kind: str, status: CacheStatus,
                                                        diagnostic: str | None) -> None:
    path = tmp_path / "cache.txt"
    _make(kind, path)
    cache = read_cache(path)
    assert cache.status == status
    assert cache.lines == []
    reg = registry()
    report = load_into(reg, path, LOCAL)
    assert report["status"] == status
    assert report["loaded"] == 0
    assert reg.generation == 1
    if diagnostic is None:
        assert report["diagnostics"] == []
    else:
        assert len(report["diagnostics"]) == 1
        assert diagnostic in report["diagnostics"][0]
        assert str(path) in report["diagnostics"][0]


# --------------------------------------------------------------------------------------------
# Updates: merge, remove, backup, errors
# --------------------------------------------------------------------------------------------


def test_merge_keeps_unrelated_entries_verbatim_and_replaces_same_identities(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    other_processor = entry(1, where=descriptor("icelake")).to_line()
    other_threads = entry(2, where=descriptor("zen3", 4)).to_line()
    # hand-written spacing and field order must survive
    unknown_library = ('{"values": {"x": 1}, "key": "otherlib/Conv/fast[float]@cpu#3", '
                       f'"descriptor": {json.dumps(LOCAL.to_dict())},  "provenance": {{}}}}')
    invalid_values = entry(3, k=MIXED).to_line()  # not valid for MIXED's schema, still kept
    old_same = entry(4, origin="old").to_line()
    write(path, other_processor, other_threads, unknown_library, old_same, invalid_values)
    report = update_cache(path, [entry(99, origin="new")])
    assert (report["written"], report["replaced"], report["kept"]) == (1, 1, 4)
    assert report["backup"] is None
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == HEADER
    assert lines[1:5] == [other_processor, other_threads, unknown_library, invalid_values]
    assert old_same not in lines
    assert lines[5] == entry(99, origin="new").to_line()
    assert list(tmp_path.glob("cache.txt.bad-*")) == []


def test_update_with_several_entries_of_one_identity_keeps_the_last(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [entry(1), entry(2)])
    cache = read_cache(path)
    assert len(cache.lines) == 1
    assert cache.lines[0].record["values"] == {MIN_ELEMENTS: 2}


def test_remove_drops_only_the_given_identities(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [entry(1), entry(2, where=descriptor("zen3", 4)), entry(3, k=MIXED)])
    report = update_cache(path, [], remove=[entry(0).identity(), entry(0, k=key("Nope")).identity()])
    assert (report["removed"], report["kept"], report["written"]) == (1, 2, 0)
    cache = read_cache(path)
    assert [(line.record["key"], line.record["descriptor"]["num_threads"]) for line in cache.lines] == [
        (str(K), 4), (str(MIXED), 8)]


@pytest.mark.parametrize("kind", ["garbage line", "no header", "newer version", "non-utf8"])
def test_damaged_file_is_backed_up_before_being_rewritten(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "cache.txt"
    keep = entry(1, where=descriptor("icelake")).to_line()
    if kind == "garbage line":
        old = write(path, keep, "garbage")
    elif kind == "no header":
        old = write(path, keep, header="not a cache")
    elif kind == "newer version":
        old = write(path, keep, header="onnx_light-kernel-tuning-cache 3")
    else:
        old = write(path, keep, b"\xc3\x28 broken utf-8")
    report = update_cache(path, [entry(5)])
    backup = Path(report["backup"])
    assert backup.parent == tmp_path
    assert backup.name.startswith("cache.txt.bad-")
    assert backup.read_bytes() == old
    assert report["diagnostics"]
    cache = read_cache(path)
    assert cache.status == CacheStatus.OK
    values = [line.record["values"][MIN_ELEMENTS] for line in cache.lines]
    assert values == ([1, 5] if kind in ("garbage line", "non-utf8") else [5])


def test_clean_and_missing_files_are_not_backed_up(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    assert update_cache(path, [entry(1)])["backup"] is None
    assert update_cache(path, [entry(2)])["backup"] is None
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["cache.txt"]


def test_update_into_a_directory_raises_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    path.mkdir()
    (path / "inside").write_text("x")
    with pytest.raises(IsADirectoryError, match="not a regular file") as info:
        update_cache(path, [entry(1)])
    assert str(path) in str(info.value)
    assert [p.name for p in path.iterdir()] == ["inside"]


def test_update_refuses_a_dangling_symlink(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    path.symlink_to(tmp_path / "nowhere.txt")
    with pytest.raises(OSError, match="is a symbolic link") as info:
        update_cache(path, [entry(1)])
    assert str(path) in str(info.value)
    assert path.is_symlink() and not (tmp_path / "nowhere.txt").exists()


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [entry(1)])
    old = path.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        update_cache(path, [entry(2)])
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert list(tmp_path.glob(".cache.txt.*.tmp")) == []


# --------------------------------------------------------------------------------------------
# Several processes
# --------------------------------------------------------------------------------------------


def test_concurrent_processes_lose_no_update_and_readers_never_see_a_partial_file(
        tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    path.write_text(HEADER + "\n")  # the reader needs a file from the start
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    reader = context.Process(target=cache_reader, args=(str(path), stop, results))
    writers = [context.Process(target=cache_writer, args=(str(path), worker, 10))
               for worker in range(4)]
    reader.start()
    for process in writers:
        process.start()
    for process in writers:
        process.join(timeout=120)
    stop.set()
    reads, problems, counts = results.get(timeout=120)
    reader.join(timeout=60)
    assert [p.exitcode for p in writers] == [0, 0, 0, 0]
    assert reader.exitcode == 0
    assert problems == []
    assert reads >= 1
    assert counts == sorted(counts)  # entries only ever accumulate
    assert counts[-1] == 40
    cache = read_cache(path)
    assert cache.status == CacheStatus.OK
    found = {line.record["key"]: line.record["values"][MIN_ELEMENTS] for line in cache.lines}
    expected = {str(writer_key(w, i)): w * 100 + i for w in range(4) for i in range(10)}
    assert found == expected


def test_an_unreadable_file_is_never_replaced(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [entry(1)])
    before = path.read_bytes()
    monkeypatch.setattr("onnx_light.tuning.cache.MAX_FILE_BYTES", 10)  # now "too large to read"
    with pytest.raises(OSError, match="cannot be read, so it is not replaced"):
        update_cache(path, [entry(2)])
    assert path.read_bytes() == before


def test_removing_from_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    report = update_cache(path, [], remove=[entry(1).identity()])
    assert report["written"] == 0 and report["removed"] == 0
    assert list(tmp_path.iterdir()) == []


def test_a_cache_other_users_may_change_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [entry(1)])
    assert read_cache(path).diagnostics == []
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    path.chmod(0o666)
    cache = read_cache(path)
    assert cache.status == CacheStatus.OK
    assert any("writable by other users" in d for d in cache.diagnostics)


# --------------------------------------------------------------------------------------------
# Staleness: the versions an entry was measured under, and files of format 1


@pytest.mark.parametrize("field", ["numpy", "blas", "numba", "testlib", "revision"])
def test_an_entry_measured_under_other_versions_is_stale_and_not_applied(tmp_path: Path,
                                                                         field: str) -> None:
    path = tmp_path / "cache.txt"
    measured = {**identity(K, 1), field: "0.0.1-other"}
    update_cache(path, [CacheEntry(K, LOCAL, {MIN_ELEMENTS: 5}, {}, measured)])
    reg = registry()
    report = load_into(reg, path, LOCAL)
    (outcome,) = report["entries"]
    assert outcome["outcome"] == LineOutcome.STALE
    assert f"{field} 0.0.1-other (now {identity(K, 1)[field]})" in outcome["reason"]
    assert report["loaded"] == 0
    resolution = reg.snapshot().resolve(K, LOCAL)
    assert (resolution.source, dict(resolution.values)) == ("portable_default", {MIN_ELEMENTS: 1000})


def test_a_new_kernel_revision_makes_earlier_entries_stale(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    update_cache(path, [entry(5)])  # measured under revision 1
    revised = fresh_registry([KernelTuningSchema(K, simple_schema(K).parameters, revision=2)])
    (outcome,) = load_into(revised, path, LOCAL)["entries"]
    assert outcome["outcome"] == LineOutcome.STALE
    assert "revision 1 (now 2)" in outcome["reason"]
    assert load_into(registry(), path, LOCAL)["loaded"] == 1  # the same file under revision 1


def test_a_file_of_format_1_loads_and_says_its_versions_are_unknown(tmp_path: Path) -> None:
    path = tmp_path / "cache.txt"
    old_line = CacheEntry(K, LOCAL, {MIN_ELEMENTS: 5}, {"origin": "calibrated"}).to_line()
    assert "measured_under" not in old_line
    write(path, old_line, header="onnx_light-kernel-tuning-cache 1")
    reg = registry()
    report = load_into(reg, path, LOCAL)
    assert (report["status"], report["format_version"], report["loaded"]) == (CacheStatus.OK, 1, 1)
    assert "does not record" in report["entries"][0]["reason"]
    assert any(":1: format version 1" in d for d in report["diagnostics"])
    assert dict(reg.snapshot().resolve(K, LOCAL).values) == {MIN_ELEMENTS: 5}
    # An update writes format 2, keeps the old entry verbatim and makes no backup.
    result = update_cache(path, [entry(6, where=descriptor("zen3", 2))])
    assert result["backup"] is None
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == HEADER and lines[1] == old_line


def test_versions_are_read_without_importing_anything() -> None:
    code = ("import sys, importlib.metadata as m; from onnx_light.tuning import identity; "
            "found = identity.environment(); "
            "assert 'numba' not in sys.modules, 'numba imported'; "
            "assert found['numba'] == m.version('numba'), found; "
            "assert identity.distribution_version('onnx_light') == m.version('onnx_light'); "
            "assert identity.distribution_version('no-such-distribution') == 'unknown'; "
            "print(found['blas'])")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() and run.stdout.strip() != "unknown unknown"
