"""The documentation's generated parts, commands and example, checked without Sphinx.

* The reference tables that ``docs/_ext/onnx_light_docs.py`` generates list every
  registered tuning key (with its defaults and calibratability), every operator of
  ``KERNELS`` and every CLI subcommand with its options.
* The API page documents every name of ``onnx_light.__all__``; every page is in a toctree.
* Every command and Python block of the how-to runs, in order, on a scratch cache.
* The gallery example runs with a tiny budget (``ONNX_LIGHT_EXAMPLE_QUICK=1``, backend Agg).
* When Sphinx and the docs extras are installed, the site builds with warnings as errors.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from html import unescape
from pathlib import Path

import pytest

import onnx_light
from onnx_light.cli import build_parser
from onnx_light.kernels import KERNELS
from onnx_light.tuning import default_registry

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"


def _load_extension():
    spec = importlib.util.spec_from_file_location("onnx_light_docs", DOCS / "_ext" / "onnx_light_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ext = _load_extension()


def _rows(text: str) -> list[list[str]]:
    """The rows of every list-table in generated text, as lists of cell texts."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("   * - "):
            rows.append([line[len("   * - "):]])
        elif line.startswith("     - ") and rows:
            rows[-1].append(line[len("     - "):])
    return rows


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["ONNX_LIGHT_KERNEL_TUNING_CACHE"] = str(tmp_path / "kernel-tuning-cache.txt")
    env.update(extra)
    return env


# --------------------------------------------------------------------------------------------
# Generated reference tables


def test_tuning_keys_table_has_one_row_per_registered_key_with_its_defaults():
    snapshot = default_registry().snapshot()
    text = ext.tuning_keys_rst(snapshot)
    by_key = {row[0]: row for row in _rows(text) if row[0].startswith("``") and "/" in row[0]}
    keys = snapshot.keys()
    assert keys, "no registered key"
    assert set(by_key) == {f"``{key}``" for key in keys}
    groups = ext.kernel_groups(snapshot)
    for group_keys in groups.values():
        varying = ext.varying_defaults(snapshot, group_keys)
        for key in group_keys:
            row = by_key[f"``{key}``"]
            defaults = snapshot.schema(key).defaults
            assert row[1] == key.element_type_name
            # a parameter only some element types have (Gemm's float weights.product): "-"
            assert row[2:-1] == [f"``{ext.format_value(defaults[n])}``" if n in defaults else "-"
                                 for n in varying], key
            assert row[-1] == ("yes" if snapshot.callbacks.get(key) is not None else "no"), key
        constant = [p for p in snapshot.schema(group_keys[0]).parameters if p.name not in varying]
        for parameter in constant:  # one default for the whole kernel, in its parameter table
            assert f"``{ext.format_value(parameter.default)}``" in text


def test_tuning_keys_table_groups_by_kernel_and_describes_every_parameter():
    snapshot = default_registry().snapshot()
    text = ext.tuning_keys_rst(snapshot)
    groups = ext.kernel_groups(snapshot)
    for (library, kernel, implementation), keys in groups.items():
        assert f".. _{ext.tuning_label(library, kernel, implementation)}:" in text
        for key in keys:
            for parameter in snapshot.schema(key).parameters:
                assert f"``{parameter.name}``" in text
                if parameter.description:
                    assert ext.escape(parameter.description) in text
    assert f"{len(keys_all := snapshot.keys())} keys for {len(groups)} kernels" in text
    assert len(keys_all) == sum(len(k) for k in groups.values())


def test_tuning_keys_table_shows_rules_profiles_and_other_libraries():
    from onnx_light.tuning import (
        ExactProcessor,
        KernelTuningKey,
        KernelTuningRegistry,
        KernelTuningSchema,
        Parameter,
        ProcessorProfile,
    )

    def ordered(values):
        """low must not exceed high."""
        if values["low"] > values["high"]:
            raise ValueError("low > high")

    registry = KernelTuningRegistry()
    keys = [KernelTuningKey("other_lib", "Blur", "simd", t) for t in ("float", "double")]
    schemas = [KernelTuningSchema(key, (
        Parameter("low", "int", 1 if key.element_type_name == "float" else 2, "lower bound",
                  minimum=0, maximum=10),
        Parameter("high", "int", 5, "upper bound"),
        Parameter("mode", "str", "a", "a *mode* | with_underscores_", choices=("a", "b")),
        Parameter("scale", "float", 0.5, ""),
        Parameter("fast", "bool", True, "go fast"),
    ), validator=ordered) for key in keys]
    profile = ProcessorProfile(keys[0], ExactProcessor("amd", 25, 17), {"high": 7})
    registry.register(schemas, [profile], {keys[1]: lambda *args: None})
    registry.register([KernelTuningSchema(KernelTuningKey("onnx_light", "Add", "portable", "float"),
                                          (Parameter("x", "int", 1),))])
    text = ext.tuning_keys_rst(registry.snapshot())
    assert "other\\_lib: Blur (simd)" in text  # two libraries: titles name them
    assert "A rule across parameters also applies: low must not exceed high." in text
    assert "exact\\_processor\\_profile \\[amd family 25 model 17\\]" in text
    assert 'high=7, mode="a", scale=0.5, fast=true``' in text  # the complete values
    assert "0 to 10" in text and 'one of ``"a"``, ``"b"``' in text
    assert "a \\*mode\\* \\| with\\_underscores\\_" in text
    assert "Calibratable: 1 of 2." in text
    rows = {row[0]: row for row in _rows(text)}
    assert rows["``other_lib/Blur/simd[float]@cpu#1``"] == [
        "``other_lib/Blur/simd[float]@cpu#1``", "float", "``1``", "no"]
    assert rows["``other_lib/Blur/simd[double]@cpu#1``"][-1] == "yes"
    assert rows["``fast``"] == ["``fast``", "bool", "``true``", "any", "go fast"]
    assert rows["``low``"][2] == "by element type (below)"


def test_format_value_spells_values_as_the_cache_does():
    assert ext.format_value(True) == "true"
    assert ext.format_value("split") == '"split"'
    assert ext.format_value(1 << 20) == "1048576 (2^20)"
    assert ext.format_value(1000) == "1000"
    assert ext.format_value(0.5) == "0.5"


def test_operators_table_lists_every_operator_with_versions_and_types():
    from onnx_light.kernels.elementwise import ELEMENTWISE_TYPES
    from onnx_light.tuning import element_type_name

    text = ext.operators_rst(KERNELS)
    rows = {row[0]: row for row in _rows(text[:text.index("Classic machine learning (ai.onnx.ml)")])}
    assert set(KERNELS) <= {name.strip("`") for name in rows}
    for op_type, versions in KERNELS.items():
        row = rows[f"``{op_type}``"]
        assert row[1] == ", ".join(str(v) for v in sorted(versions)), op_type
        if op_type in ELEMENTWISE_TYPES:
            listed = ext.escape(", ".join(element_type_name(t) for t in ELEMENTWISE_TYPES[op_type]))
            assert row[2] == listed, op_type
        tunable = any(cls.declaration.tunable for cls in versions.values())
        assert row[3].startswith(":ref:`yes") or row[3] == ("yes" if tunable else "no"), op_type
    assert f"{len(KERNELS)} operators" in text


def test_operators_table_lists_the_ai_onnx_ml_operators_in_their_own_section():
    from onnx_light.kernels import ml

    text = ext.operators_rst()
    ml_part = text[text.index("Classic machine learning (ai.onnx.ml)"):text.index("(com.microsoft)\n")]
    rows = {row[0]: row for row in _rows(ml_part)}
    assert {f"``{op}``" for op in ml.KERNELS} == set(rows) - {"Operator"}  # less the header rows
    assert rows["``TreeEnsembleClassifier``"][1] == "1, 3"
    assert rows["``LabelEncoder``"][1] == "1, 2, 4"
    assert f"{len(ml.KERNELS)} of the ``ai.onnx.ml`` domain" in text


def test_operators_table_lists_the_com_microsoft_operators_in_their_own_section():
    from onnx_light.kernels import contrib

    text = ext.operators_rst()
    contrib_part = text[text.index("onnxruntime's contrib operators (com.microsoft)"):]
    rows = {row[0]: row for row in _rows(contrib_part)}
    assert {f"``{op}``" for op in contrib.KERNELS} == set(rows) - {"Operator"}
    assert rows["``QLinearAdd``"][1:] == ["1", "uint8, int8", "no"]
    assert rows["``SkipLayerNormalization``"][1] == "1"
    assert f"{len(contrib.KERNELS)} of onnxruntime's ``com.microsoft`` domain" in text


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_cli_reference_has_every_subcommand_and_option():
    text = ext.cli_reference_rst()
    subcommands = _subcommands(build_parser())
    assert subcommands
    for name, sub in subcommands.items():
        assert f"\n{name}\n{'-' * len(name)}\n" in text, name
        assert f"usage: python -m onnx_light {name}" in text, name
        for action in sub._actions:
            for option in action.option_strings:
                assert option in text, (name, option)


def test_markdown_pages_lists_known_notes_first(tmp_path):
    for name in ("zeta", "cache-format", "architecture", "alpha"):
        (tmp_path / f"{name}.md").write_text("# x\n", encoding="utf-8")
    assert ext.markdown_pages(tmp_path) == ["architecture", "cache-format", "alpha", "zeta"]
    assert ext.markdown_pages(tmp_path, exclude=["architecture"]) == ["cache-format", "alpha", "zeta"]


# --------------------------------------------------------------------------------------------
# Pages


def test_api_page_documents_every_public_name():
    text = (DOCS / "api.rst").read_text(encoding="utf-8")
    for name in onnx_light.__all__:
        assert re.search(rf"^\.\. auto(function|class):: onnx_light\.{name}$", text, re.M), name


def _toctree_entries(text: str) -> list[str]:
    entries, inside = [], False
    for line in text.splitlines():
        if line.startswith(".. toctree::"):
            inside = True
        elif inside and line and not line.startswith(" "):
            inside = False
        elif inside and line.strip() and not line.strip().startswith(":"):
            entries.append(line.strip())
    return entries


def test_every_page_is_in_a_toctree_and_every_entry_exists():
    text = (DOCS / "index.rst").read_text(encoding="utf-8")
    entries = _toctree_entries(text)
    excluded = re.search(r":exclude: (.*)", text).group(1).split()
    for entry in entries:
        if entry != "auto_examples/index":
            assert (DOCS / f"{entry}.rst").exists() or (DOCS / f"{entry}.md").exists(), entry
    pages = {p.stem for p in DOCS.glob("*.rst")} - {"index"}
    assert pages <= set(entries)
    # Markdown notes: the listed ones, the rest through onnx-light-markdown-toctree.
    assert set(excluded) <= set(entries)


# --------------------------------------------------------------------------------------------
# The how-to's commands


def _howto_script(text: str) -> str:
    """The how-to's console commands (``onnx-light-console`` ones included) and Python blocks,
    in order, as one bash script."""
    text = re.sub(r"^\.\. onnx-light-console:: (.+)$",
                  r".. code-block:: console\n\n    $ python -m onnx_light \1", text, flags=re.M)
    parts = ["set -euo pipefail"]
    blocks = re.split(r"^\.\. code-block:: (\w+)\n", text, flags=re.M)
    for language, body in zip(blocks[1::2], blocks[2::2], strict=True):
        lines = []
        for line in body.splitlines():
            if line.strip() and not line.startswith("    "):
                break
            lines.append(line)
        code = textwrap.dedent("\n".join(lines)).strip("\n")
        if language == "console":
            command: list[str] = []
            for line in code.splitlines():
                if line.startswith("$ ") or command:
                    command.append(line[2:] if line.startswith("$ ") else line)
                    if not line.endswith("\\"):
                        parts.append("\n".join(command))
                        command = []
        elif language == "python":
            parts.append(f"python - <<'PYTHON'\n{code}\nPYTHON")
    return "\n".join(parts) + "\n"


def test_howto_commands_run_in_order(tmp_path):
    script = _howto_script((DOCS / "howto-tune-kernels.rst").read_text(encoding="utf-8"))
    assert "tune-kernels --apply" in script and "reset_kernel_tuning_parameters" in script
    # The profile export calibrates every float kernel (3 s per key by default: minutes on two
    # cores); here it exports two kernels' (a total budget would skip keys under load, and a
    # skipped key makes the command exit 1).
    assert script.count("--export-profile") == 1
    script = script.replace("--export-profile", "--kernel Add --kernel Relu --export-profile")
    # The how-to says `python`: the interpreter running these tests, as a user's venv gives it.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=_env(tmp_path, PATH=path),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    add = [re.split(r"\s{2,}", line) for line in out.splitlines()
           if line.startswith("onnx_light/Add/portable[float]@cpu#1  ")]
    assert add[0][1:3] == ["missing", "portable default"], add  # the first report
    assert ["covered", "calibrated"] in [row[1:3] for row in add], add  # after --apply
    assert "is not one of" in out  # the invalid manual value is refused
    assert re.search(r"^forgot the values of 1 key\(s\)", out, re.M)  # tune-kernels --reset
    assert add[-1][1:3] == ["missing", "portable default"], add  # the report after the reset


def test_console_directive_shows_the_command_and_what_it_printed(tmp_path):
    text = ext.console_rst("tune-kernels --kernel Add --element-type float", tmp_path)
    lines = text.rstrip().splitlines()
    assert lines[:3] == [".. code-block:: console", "",
                         "    $ python -m onnx_light tune-kernels --kernel Add --element-type float"]
    env = _env(tmp_path, COLUMNS=str(ext.CONSOLE_COLUMNS))
    env["ONNX_LIGHT_KERNEL_TUNING_CACHE"] = str(tmp_path / ext.CONSOLE_CACHE)
    done = subprocess.run([sys.executable, "-m", "onnx_light", "tune-kernels", "--kernel", "Add",
                           "--element-type", "float"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    expected = done.stdout.replace(str(tmp_path), ext.CONSOLE_HOME).rstrip().splitlines()
    assert [line[4:] for line in lines[3:]] == expected
    assert f"cache: {ext.CONSOLE_HOME}/{ext.CONSOLE_CACHE}" in expected
    assert all(len(line) <= ext.CONSOLE_COLUMNS for line in expected)
    with pytest.raises(RuntimeError, match=r"exited with status 2: .*unknown kernel Nope"):
        ext.console_rst("tune-kernels --kernel Nope", tmp_path)


# --------------------------------------------------------------------------------------------
# The gallery


@pytest.mark.parametrize("script", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_example_runs_quickly(script, tmp_path):
    pytest.importorskip("matplotlib")
    env = _env(tmp_path, MPLBACKEND="Agg", ONNX_LIGHT_EXAMPLE_QUICK="1")
    done = subprocess.run([sys.executable, "-W", "error", str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (tmp_path / "kernel-tuning-cache.txt").exists(), "the example wrote the default cache"


def test_kernel_tuning_example_shows_generations(tmp_path):
    pytest.importorskip("matplotlib")
    env = _env(tmp_path, MPLBACKEND="Agg", ONNX_LIGHT_EXAMPLE_QUICK="1")
    done = subprocess.run([sys.executable, str(EXAMPLES / "plot_kernel_tuning.py")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line[:18].strip(): line[18:].split() for line in done.stdout.splitlines()
            if line.startswith(("before ", "after calibration ", "after manual set "))}
    assert list(rows) == ["before", "after calibration", "after manual set"], done.stdout
    generations = [int(row[1]) for row in rows.values()]
    assert generations[0] < generations[1] < generations[2], rows
    assert rows["before"][2] == "portable_default", rows  # kept although newer ones exist
    assert rows["after calibration"][2] == "published_profile", rows
    assert rows["after manual set"][3] == "parallel.minimum_elements=4096", rows
    assert all(row[-1] == "True" for row in rows.values()), rows  # every session still runs
    # without a display (MPLBACKEND=Agg) the figures are saved, and the example says where
    saved = [Path(line.split(": ", 1)[1]) for line in done.stdout.splitlines()
             if line.startswith("figure saved: ")]
    assert saved == [tmp_path / "plot_kernel_tuning-1.png", tmp_path / "plot_kernel_tuning-2.png"]
    assert all(path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for path in saved)
    # the session plot compares paths that differ: forced serial against forced parallel
    assert re.search(r"^Add: parallel / serial time: 4096: \d+\.\d\d \(noise \d+\.\d\d\)",
                     done.stdout, re.M), done.stdout


# --------------------------------------------------------------------------------------------
# The whole site


def test_sphinx_build_has_no_warning(tmp_path):
    """The documented build command, on a copy of docs/ and examples/ (nothing is written here)."""
    for module in ("sphinx", "sphinx_gallery", "myst_parser", "matplotlib"):
        pytest.importorskip(module)
    skip = shutil.ignore_patterns("_build", "auto_examples", "__pycache__")
    shutil.copytree(DOCS, tmp_path / "docs", ignore=skip)
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=skip)
    env = _env(tmp_path, MPLBACKEND="Agg", ONNX_LIGHT_EXAMPLE_QUICK="1")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "docs", "docs/_build/html"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    html = tmp_path / "docs" / "_build" / "html"
    keys = unescape((html / "tuning-keys.html").read_text(encoding="utf-8"))
    assert "onnx_light/Add/portable[float]@cpu#1" in keys
    howto = unescape((html / "howto-tune-kernels.html").read_text(encoding="utf-8"))
    howto = re.sub(r"<[^>]+>", "", howto)  # the samples, as text
    assert re.search(r"^key +cache +values from", howto, re.M)  # run at build time
    assert "covered before: 0, calibrated now: 2" in howto
    assert (html / "auto_examples" / "plot_kernel_tuning.html").exists()
    assert list((html / "_images").glob("sphx_glr_plot_kernel_tuning_00*.png"))
