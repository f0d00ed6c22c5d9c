"""Reference pages generated at build time from onnx_light itself.

The text builders are plain functions returning reStructuredText, so the tests
call them without Sphinx:

* :func:`tuning_keys_rst`: every registered kernel tuning key, grouped by kernel,
  with its parameters (type, default, bounds, description) and whether a
  calibration callback is registered; read from
  ``onnx_light.tuning.default_registry().snapshot()``.
* :func:`operators_rst`: every operator of ``onnx_light.kernels.KERNELS`` (and of
  ``onnx_light.kernels.ml.KERNELS``, the ``ai.onnx.ml`` domain, and
  ``onnx_light.kernels.contrib.KERNELS``, onnxruntime's ``com.microsoft``) with its
  since_versions and, where the library declares them, its element types.
* :func:`cli_reference_rst`: the help of ``onnx_light.cli.build_parser()`` and of
  each subcommand.
* :func:`console_rst`: a command of the command line and its output, run at build time so
  that the samples of the how-to cannot drift from the code.
* :func:`markdown_pages`: the Markdown notes in ``docs/`` that a toctree should list.

:func:`setup` registers one directive per builder (``onnx-light-tuning-keys``,
``onnx-light-operators``, ``onnx-light-cli``, ``onnx-light-console``) and
``onnx-light-markdown-toctree``.
Sphinx and docutils are imported only there.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "cli_reference_rst",
    "console_rst",
    "format_value",
    "markdown_pages",
    "operators_rst",
    "setup",
    "tuning_keys_rst",
]

# Section underlines of generated text: the page title uses "=", so these nest below it.
SECTION, SUBSECTION = "-", "~"
# Markdown notes listed first, in this order, by onnx-light-markdown-toctree; others follow by name.
MARKDOWN_ORDER = ("architecture", "kernel-tuning", "cache-format", "parallel", "elementwise", "gemm",
                  "benchmarks")

_SPECIAL = re.compile(r"([\\`*_|<>\[\]])")


def escape(text: str) -> str:
    """Plain text safe inside reStructuredText (no markup is interpreted)."""
    return _SPECIAL.sub(r"\\\1", re.sub(r"\s+", " ", str(text)))


def literal(text: str) -> str:
    """Inline literal; the ``:code:`` role keeps backticks and backslashes intact."""
    text = str(text)
    if "`" in text or "\\" in text or text != text.strip() or not text:
        return ":code:`" + text.replace("\\", "\\\\").replace("`", "\\`") + "`"
    return f"``{text}``"


def heading(text: str, underline: str) -> list[str]:
    """A section title (the text is escaped)."""
    title = escape(text)
    return [title, underline * len(title), ""]


def label_name(*parts: str) -> str:
    """A reference label made of ``parts`` (lower-case, safe characters only)."""
    return "-".join(re.sub(r"[^a-z0-9]+", "-", p.lower()).strip("-") for p in parts)


def format_value(value: Any) -> str:
    """A tuning value as the cache file spells it (JSON), with 2^k for large powers of two."""
    text = json.dumps(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 \
            and value & (value - 1) == 0:
        text += f" (2^{value.bit_length() - 1})"
    return text


def list_table(header: Sequence[str], rows: Iterable[Sequence[str]], *,
               widths: Sequence[int] | None = None, css: str = "") -> list[str]:
    """A ``list-table`` whose cells are already reStructuredText."""
    lines = [".. list-table::", "   :header-rows: 1"]
    if widths:
        lines.append("   :widths: " + " ".join(str(w) for w in widths))
    if css:
        lines.append(f"   :class: {css}")
    lines.append("")
    for row in [header, *rows]:
        for index, cell in enumerate(row):
            lines.append(("   * - " if index == 0 else "     - ") + (cell or ""))
    return [*lines, ""]


# --------------------------------------------------------------------------------------------
# Kernel tuning keys, from the registry


def _snapshot(snapshot: Any | None) -> Any:
    if snapshot is not None:
        return snapshot
    import onnx_light  # noqa: F401  (the import registers the built-in kernels)
    from onnx_light.tuning import default_registry

    return default_registry().snapshot()


def _bounds(parameter: Any) -> str:
    if parameter.choices is not None:
        return "one of " + ", ".join(literal(format_value(c)) for c in parameter.choices)
    low, high = parameter.minimum, parameter.maximum
    if low is not None and high is not None:
        return f"{format_value(low)} to {format_value(high)}"
    if low is not None:
        return f"at least {format_value(low)}"
    if high is not None:
        return f"at most {format_value(high)}"
    return "any finite value" if parameter.type == "float" else "any"


def _per_type(values_by_type: Mapping[str, str]) -> str:
    """One cell: the value when all element types agree, else ``type: value`` groups."""
    groups: dict[str, list[str]] = {}
    for element_type, value in values_by_type.items():
        groups.setdefault(value, []).append(element_type)
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"{', '.join(types)}: {value}" for value, types in groups.items())


def kernel_groups(snapshot: Any | None = None) -> dict[tuple[str, str, str], list[Any]]:
    """Registered keys grouped by (library, kernel, implementation), each group sorted."""
    groups: dict[tuple[str, str, str], list[Any]] = {}
    registered = _snapshot(snapshot).keys()  # a sorted tuple, not a dict view
    for key in registered:
        groups.setdefault((key.library, key.kernel, key.implementation), []).append(key)
    return dict(sorted(groups.items()))


def tuning_label(library: str, kernel: str, implementation: str) -> str:
    """The reference label of a kernel's section on the tuning keys page."""
    return label_name("l-tuning", library, kernel, implementation)


def _calibratable(snapshot: Any, keys: Sequence[Any]) -> str:
    count = sum(1 for key in keys if snapshot.callbacks.get(key) is not None)
    return "yes" if count == len(keys) else "no" if count == 0 else f"{count} of {len(keys)}"


def varying_defaults(snapshot: Any, keys: Sequence[Any]) -> list[str]:
    """Parameter names whose portable default differs between the keys (declaration order)."""
    names: list[str] = []
    for key in keys:
        names += [n for n in snapshot.schema(key).names if n not in names]
    return [n for n in names
            if len({json.dumps(snapshot.schema(k).defaults.get(n)) for k in keys}) > 1]


def _kernel_section(snapshot: Any, group: tuple[str, str, str], keys: list[Any],
                    show_library: bool) -> list[str]:
    library, kernel, implementation = group
    title = f"{kernel} ({implementation})" if implementation != "portable" else kernel
    if show_library:
        title = f"{library}: {title}"
    schemas = {key: snapshot.schema(key) for key in keys}
    names: list[str] = []
    for schema in schemas.values():
        names += [name for name in schema.names if name not in names]
    abis = sorted({key.tuning_abi for key in keys})
    devices = sorted({key.device for key in keys})
    lines = [f".. _{tuning_label(*group)}:", "", *heading(title, SECTION)]
    pattern = (f"{library}/{kernel}/{implementation}[<element type>]@"
               f"{'|'.join(devices)}#{'|'.join(map(str, abis))}")
    types = ", ".join(key.element_type_name for key in keys)
    lines += [f"Keys {literal(pattern)}, for {len(keys)} element type"
              f"{'s' if len(keys) != 1 else ''}: {escape(types)}. "
              f"Calibratable: {_calibratable(snapshot, keys)}.", ""]

    varying = varying_defaults(snapshot, keys)
    rows = []
    for name in names:
        present = {k.element_type_name: s.parameter(name) for k, s in schemas.items() if name in s.names}
        rows.append([
            literal(name),
            _per_type({t: p.type for t, p in present.items()}),
            "by element type (below)" if name in varying
            else _per_type({t: literal(format_value(p.default)) for t, p in present.items()}),
            _per_type({t: _bounds(p) for t, p in present.items()}),
            _per_type({t: escape(p.description) or "-" for t, p in present.items()}),
        ])
    lines += list_table(["Parameter", "Type", "Portable default", "Bounds", "Description"], rows,
                        widths=[18, 6, 16, 20, 40], css="onnx-light-parameters")

    validators = [s.validator for s in schemas.values() if s.validator is not None]
    if validators:
        docs = sorted({(v.__doc__ or "").strip().splitlines()[0]
                       for v in validators if (getattr(v, "__doc__", None) or "").strip()})
        rule = ": " + " ".join(escape(d) for d in docs) if docs else "."
        lines += [f"A rule across parameters also applies{rule}", ""]

    key_rows = []
    for key in keys:
        defaults = schemas[key].defaults
        key_rows.append([
            literal(str(key)),
            escape(key.element_type_name),
            *(literal(format_value(defaults[n])) if n in defaults else "-" for n in varying),
            "yes" if snapshot.callbacks.get(key) is not None else "no",
        ])
    lines += list_table(["Key", "Element type", *(f"Default of {literal(n)}" for n in varying),
                         "Calibratable"], key_rows, css="onnx-light-keys")

    shipped = [(key, entry) for key in keys for entry in snapshot.profiles.get(key, ())]
    if shipped:
        lines += ["Shipped processor profiles:", ""]
        for key, entry in shipped:
            values = ", ".join(f"{n}={format_value(v)}" for n, v in entry.values.items())
            lines.append(f"* {literal(str(key))}: {escape(entry.profile.describe())}: "
                         f"{literal(values)}")
        lines.append("")
    else:
        lines += ["No shipped processor profile: values resolve to this machine's published "
                  "profile, else the portable defaults.", ""]
    return lines


def tuning_keys_rst(snapshot: Any | None = None) -> str:
    """Every registered key grouped by kernel, as reStructuredText.

    ``snapshot`` defaults to the process-wide registry's current generation after
    ``import onnx_light``.
    """
    snapshot = _snapshot(snapshot)
    groups = kernel_groups(snapshot)
    libraries = {library for library, _, _ in groups}
    show_library = len(libraries) > 1
    total = sum(len(keys) for keys in groups.values())
    calibratable = sum(1 for keys in groups.values() for k in keys if snapshot.callbacks.get(k))
    lines = [f"{total} keys for {len(groups)} kernels are registered; {calibratable} of them have a "
             "calibration callback (calibratable), the others are schema-only and are tuned by "
             "setting values by hand.", ""]
    summary = []
    for group, keys in groups.items():
        library, kernel, implementation = group
        names: list[str] = []
        for key in keys:
            names += [n for n in snapshot.schema(key).names if n not in names]
        summary.append([
            f":ref:`{escape(kernel)} <{tuning_label(*group)}>`"
            + (f" ({escape(library)})" if show_library else ""),
            literal(implementation),
            str(len(keys)),
            ", ".join(literal(n) for n in names),
            _calibratable(snapshot, keys),
        ])
    lines += list_table(["Kernel", "Implementation", "Element types", "Parameters", "Calibratable"],
                        summary, widths=[16, 12, 10, 46, 12], css="onnx-light-summary")
    for group, keys in groups.items():
        lines += _kernel_section(snapshot, group, keys, show_library)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Operators, from the dispatch table


def _kernel_module(kernel_class: type) -> str:
    """The kernel module a class belongs to: its own module, or the package of which it is a
    module when only the package has a ``KERNELS`` table (``onnx_light.kernels.conv``)."""
    module = kernel_class.__module__
    package = module.rpartition(".")[0]
    if package and not hasattr(sys.modules.get(module), "KERNELS") \
            and hasattr(sys.modules.get(package), "KERNELS"):
        return package
    return module


def _module_title(module: str) -> str:
    return module.rsplit(".", 1)[-1].replace("_", " ").capitalize()


def _tunable(kernel_class: type) -> bool:
    declaration = getattr(kernel_class, "declaration", None)
    return declaration is not None and declaration.tunable


def operator_element_types(op_type: str, kernel_class: type, snapshot: Any) -> tuple[list[str], str]:
    """The element types the library declares for an operator's newest version, and where
    they come from: the kernel's declaration, else the tuning keys registered for it."""
    from onnx_light.tuning import element_type_name

    declaration = getattr(kernel_class, "declaration", None)
    if declaration is not None and declaration.versions[max(declaration.versions)]:
        return ([element_type_name(t) for t in declaration.versions[max(declaration.versions)]],
                "declaration")
    if _tunable(kernel_class):
        registered = snapshot.keys()
        implementation = getattr(kernel_class, "implementation", "portable")
        keys = [k for k in registered if k.kernel == op_type and k.implementation == implementation]
        if keys:
            return [k.element_type_name for k in keys], "tuning keys"
    return [], ""


def _operator_sections(kernels: Mapping[str, Mapping[int, type]], snapshot: Any, groups: Any,
                       level: str, label_prefix: str) -> list[str]:
    """One section per kernel module of ``kernels``, each a table of its operators."""
    by_module: dict[str, list[str]] = {}
    for op_type, versions in kernels.items():
        classes = [versions[v] for v in sorted(versions)]
        by_module.setdefault(_kernel_module(classes[-1]), []).append(op_type)
    lines: list[str] = []
    for module in sorted(by_module, key=lambda m: (m.rsplit(".", 1)[-1] != "elementwise", m)):
        doc = (importlib.import_module(module).__doc__ or "").strip().splitlines()
        lines += [f".. _{label_name(label_prefix, module.rsplit('.', 1)[-1])}:", "",
                  *heading(_module_title(module), level)]
        if doc:
            lines += [escape(doc[0]) + f" ({literal(module)})", ""]
        rows = []
        for op_type in sorted(by_module[module]):
            versions = kernels[op_type]
            newest = versions[max(versions)]
            types, _ = operator_element_types(op_type, newest, snapshot)
            tunable = _tunable(newest)
            group = (getattr(newest, "__module__", "").split(".")[0], op_type,
                     getattr(newest, "implementation", "portable"))
            tuning = (f":ref:`yes <{tuning_label(*group)}>`" if tunable and group in groups
                      else "yes" if tunable else "no")
            rows.append([literal(op_type), ", ".join(str(v) for v in sorted(versions)),
                         escape(", ".join(types)) if types else "-", tuning])
        lines += list_table(["Operator", "since_versions", "Element types", "Tunable"], rows,
                            widths=[18, 22, 48, 12], css="onnx-light-operators")
    return lines


def operators_rst(kernels: Mapping[str, Mapping[int, type]] | None = None,
                  snapshot: Any | None = None,
                  ml_kernels: Mapping[str, Mapping[int, type]] | None = None,
                  contrib_kernels: Mapping[str, Mapping[int, type]] | None = None) -> str:
    """Every operator of the dispatch table, grouped by kernel module, as reStructuredText:
    the default domain's (``kernels``), then ``ai.onnx.ml``'s (``ml_kernels``), then
    onnxruntime's ``com.microsoft`` (``contrib_kernels``)."""
    if kernels is None:
        from onnx_light.kernels import KERNELS

        kernels = KERNELS
    if ml_kernels is None:
        from onnx_light.kernels.ml import KERNELS as ml_kernels
    if contrib_kernels is None:
        from onnx_light.kernels.contrib import KERNELS as contrib_kernels
    snapshot = _snapshot(snapshot)
    groups = kernel_groups(snapshot)
    lines = [f"{len(kernels)} operators of the default ONNX domain (``ai.onnx``) are implemented, "
             f"{len(ml_kernels)} of the ``ai.onnx.ml`` domain "
             f"(:ref:`{label_name('l-operators', 'ai-onnx-ml')}`) and {len(contrib_kernels)} of "
             f"onnxruntime's ``com.microsoft`` domain "
             f"(:ref:`{label_name('l-operators', 'com-microsoft')}`). "
             "A node of opset *n* (the opset the model imports for the node's domain) runs the "
             "kernel of the highest since_version not above *n*; a model whose opset is below "
             "an operator's first listed since_version is rejected for that operator.", ""]
    lines += _operator_sections(kernels, snapshot, groups, SECTION, "l-operators")
    lines += [f".. _{label_name('l-operators', 'ai-onnx-ml')}:", "",
              *heading("Classic machine learning (ai.onnx.ml)", SECTION),
              "The ``ai.onnx.ml`` operators that scikit-learn models converted by skl2onnx use "
              f"({literal('onnx_light.kernels.ml')}); none is tunable. Tree ensembles walk their "
              "trees in a compiled loop (numba), blocks of rows across the session's threads.", ""]
    lines += _operator_sections(ml_kernels, snapshot, groups, SUBSECTION, "l-operators-ml")
    lines += [f".. _{label_name('l-operators', 'com-microsoft')}:", "",
              *heading("onnxruntime's contrib operators (com.microsoft)", SECTION),
              "The operators onnxruntime's own tools write, so that the models they produce run "
              "here: its quantizer's QOperator format (``quantize_static`` with "
              "``QuantFormat.QOperator``) and its transformer optimizer's fusions "
              f"(``optimize_model``), in {literal('onnx_light.kernels.contrib')}. Each is "
              "version 1 of the domain, which a model must import; onnx has no schemas for them, "
              "so the types of their outputs come from the kernels. None is tunable. "
              "``SimplifiedLayerNormalization``, and ``LayerNormalization`` below opset 17, are "
              "the operators onnxruntime adds to the default domain: a session runs such nodes "
              "with the kernels of the same name listed here.", ""]
    lines += _operator_sections(contrib_kernels, snapshot, groups, SUBSECTION, "l-operators-contrib")
    lines += ["Element types are those the kernel's declaration takes at the newest "
              "since_version (for the elementwise ops exactly the types the latest ONNX version "
              "of the operator allows); a session refuses a node of another type, naming the "
              "operator, version and type. \"-\" means the kernel checks the types itself when "
              "a session builds the node.", ""]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Command line, from the argparse parser


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand, in the order they were added."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases map to the same parser
                    seen.add(id(sub))
                    found.append((name, helps.get(name, ""), sub))
    return found


def _fixed_width(parser: argparse.ArgumentParser, width: int) -> None:
    """Help text independent of the terminal the docs are built in."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=width)


def _literal_block(text: str) -> list[str]:
    body = ("   " + line if line.strip() else "" for line in text.rstrip().splitlines())
    return [".. code-block:: text", "", *body, ""]


def _help_sentence(text: str) -> str:
    """A subcommand's one-line help as a sentence, options as literals."""
    sentence = text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")
    parts = re.split(r"(--[A-Za-z][\w-]*)", sentence)
    return "".join(literal(p) if p.startswith("--") else escape(p) for p in parts)


def cli_reference_rst(parser: argparse.ArgumentParser | None = None, width: int = 80) -> str:
    """The top-level help and each subcommand's help, as reStructuredText."""
    if parser is None:
        from onnx_light.cli import build_parser

        parser = build_parser("python -m onnx_light")  # not the name of the builder's program
    _fixed_width(parser, width)
    lines = _literal_block(parser.format_help())
    for name, help_text, sub in _subcommands(parser):
        _fixed_width(sub, width)
        lines += [f".. _{label_name('l-cli', name)}:", "", *heading(name, SECTION)]
        if help_text:
            lines += [_help_sentence(help_text), ""]
        lines += _literal_block(sub.format_help())
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Command output

CONSOLE_COLUMNS = 100  # the width the samples are fitted to (the CLI reads $COLUMNS)
CONSOLE_HOME = "/home/me"  # stands for the scratch folder the commands run in
CONSOLE_CACHE = "try-kernel-tuning-cache.txt"  # the how-to's scratch cache, in that folder


def console_rst(arguments: str, folder: str | Path, timeout: float = 300) -> str:
    """``python -m onnx_light ARGUMENTS`` run in ``folder`` (its cache a file there), as a
    console block: the command and what it printed, standard error included.

    Commands of one page share the folder, so that a report after ``--apply`` shows what it
    calibrated. Raises ``RuntimeError`` when the command fails with a usage error (status 2).
    """
    folder = Path(folder)
    env = {**os.environ, "COLUMNS": str(CONSOLE_COLUMNS),
           "ONNX_LIGHT_KERNEL_TUNING_CACHE": str(folder / CONSOLE_CACHE)}
    done = subprocess.run([sys.executable, "-m", "onnx_light", *shlex.split(arguments)],
                          cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, check=False)
    output = done.stdout.replace(str(folder), CONSOLE_HOME)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"python -m onnx_light {arguments} exited with status "
                           f"{done.returncode}: {output.strip()}")
    body = [f"$ python -m onnx_light {arguments}", *output.rstrip().splitlines()]
    return "\n".join([".. code-block:: console", "", *("    " + line if line.strip() else ""
                                                       for line in body), ""]) + "\n"


# --------------------------------------------------------------------------------------------
# Markdown notes


def markdown_pages(srcdir: str | Path, exclude: Iterable[str] = ()) -> list[str]:
    """Docnames of the ``*.md`` files directly in ``srcdir``, known ones first."""
    excluded = set(exclude)
    names = sorted(p.stem for p in Path(srcdir).glob("*.md") if p.stem not in excluded)
    known = [n for n in MARKDOWN_ORDER if n in names]
    return known + [n for n in names if n not in known]


# --------------------------------------------------------------------------------------------
# Sphinx


def _depend_on_package(env: Any) -> None:
    """Read the page again whenever onnx_light's code or this extension changes."""
    import onnx_light

    env.note_dependency(__file__)
    for path in sorted(Path(onnx_light.__file__).parent.rglob("*.py")):
        env.note_dependency(str(path))


def _directives() -> dict[str, type]:
    from docutils import nodes
    from docutils.parsers.rst import Directive, directives
    from docutils.statemachine import StringList
    from sphinx.directives.other import TocTree
    from sphinx.util.nodes import nested_parse_with_titles

    class Generated(Directive):
        """Parses generated reStructuredText in place of the directive."""

        has_content = False
        builder: Any = None

        def run(self) -> list[Any]:
            _depend_on_package(self.state.document.settings.env)
            text = type(self).builder()
            source = f"<generated by {self.name}>"
            content = StringList(text.splitlines(), source=source)
            node = nodes.section()
            node.document = self.state.document
            nested_parse_with_titles(self.state, content, node)
            return list(node.children)

    class TuningKeys(Generated):
        builder = staticmethod(tuning_keys_rst)

    class Operators(Generated):
        builder = staticmethod(operators_rst)

    class Cli(Generated):
        builder = staticmethod(cli_reference_rst)

    class Console(Directive):
        """``python -m onnx_light ARGUMENTS`` and its output, run when the page is read, in a
        scratch folder shared by the page's commands."""

        required_arguments = 1
        final_argument_whitespace = True

        def run(self) -> list[Any]:
            env = self.state.document.settings.env
            _depend_on_package(env)
            scratch = env.temp_data.setdefault(  # removed with the page's temp_data
                "onnx_light_console", tempfile.TemporaryDirectory(prefix="onnx_light-docs-"))
            try:
                text = console_rst(self.arguments[0], scratch.name)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                raise self.error(str(exc)) from None
            content = StringList(text.splitlines(), source=f"<{self.name}>")
            node = nodes.section()
            node.document = self.state.document
            nested_parse_with_titles(self.state, content, node)
            return list(node.children)

    class MarkdownToctree(TocTree):
        """A toctree of every ``*.md`` page in the source folder but the excluded ones."""

        has_content = False
        option_spec = {**TocTree.option_spec, "exclude": directives.unchanged}

        def run(self) -> list[Any]:
            env = self.state.document.settings.env
            env.note_dependency(env.srcdir)  # a new note changes the folder's mtime
            exclude = (self.options.pop("exclude", "") or "").split()
            pages = markdown_pages(env.srcdir, exclude)
            self.content = StringList(pages, source="<onnx-light-markdown-toctree>")
            return super().run()

    return {
        "onnx-light-tuning-keys": TuningKeys,
        "onnx-light-operators": Operators,
        "onnx-light-cli": Cli,
        "onnx-light-console": Console,
        "onnx-light-markdown-toctree": MarkdownToctree,
    }


def setup(app: Any) -> dict[str, Any]:
    """Sphinx entry point."""
    for name, directive in _directives().items():
        app.add_directive(name, directive)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
