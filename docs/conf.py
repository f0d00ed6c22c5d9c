"""Sphinx configuration of the onnx_light documentation.

Build (warnings are errors)::

    pip install -e ".[docs]"
    python -m sphinx -W -b html docs docs/_build/html

The reference tables (tuning keys, operators, command line) are generated from
onnx_light at build time by ``docs/_ext/onnx_light_docs.py``; the gallery runs
``examples/*.py`` with sphinx-gallery.
"""

from __future__ import annotations

import os
import shutil
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "_ext"))

project = "onnx_light"
author = "the onnx_light developers"
copyright = "2026, the onnx_light developers"
version = release = metadata.version("onnx_light")

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "onnx_light_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []
suppress_warnings = [
    # The Markdown notes are written for reading on their own (a code forge renders them too):
    # their heading levels and code-fence languages are not checked against Sphinx.
    "myst.header",
    "misc.highlighting_failure",
]

# -- autodoc ---------------------------------------------------------------------------------
autodoc_typehints = "description"
autodoc_typehints_description_target = "all"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True}
autodoc_mock_imports = ["ray"]  # onnx_light.fleet's pages build without the ray extra

# -- MyST ------------------------------------------------------------------------------------
myst_heading_anchors = 3

# -- sphinx-gallery --------------------------------------------------------------------------
# sphinx-gallery wants a header file beside the examples; examples/ holds scripts only, so the
# gallery reads a staging copy (in the ignored _build folder) with the header written here.
GALLERY_HEADER = """\
.. _l-gallery:

Examples
========

Scripts that run on the reader's machine; each page shows the output of its last build.
Run one yourself with ``python examples/<name>.py`` (``pip install -e ".[plot]"`` for the
figures). ``ONNX_LIGHT_EXAMPLE_QUICK=1`` shrinks their budgets to a few seconds.
"""


def _stage_examples() -> str:
    staging = HERE / "_build" / "gallery-src"
    staging.mkdir(parents=True, exist_ok=True)
    wanted = {p.name for p in (ROOT / "examples").glob("*.py")}
    for old in staging.iterdir():
        if old.name not in wanted and old.name != "GALLERY_HEADER.rst":
            old.unlink()
    for name in sorted(wanted):
        source, target = ROOT / "examples" / name, staging / name
        if not target.exists() or target.read_bytes() != source.read_bytes():
            shutil.copyfile(source, target)
    header = staging / "GALLERY_HEADER.rst"
    if not header.exists() or header.read_text(encoding="utf-8") != GALLERY_HEADER:
        header.write_text(GALLERY_HEADER, encoding="utf-8")
    return os.path.relpath(staging, HERE)


sphinx_gallery_conf = {
    "examples_dirs": _stage_examples(),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "write_computation_times": False,
    "download_all_examples": False,
    "remove_config_comments": True,
}

# -- HTML ------------------------------------------------------------------------------------
html_theme = "alabaster"
html_title = f"onnx_light {release}"
html_theme_options = {
    "description": "A lightweight ONNX runtime whose kernels tune themselves to the processor.",
    "fixed_sidebar": True,
    "page_width": "1180px",
    "body_max_width": "none",
    "sidebar_width": "250px",
}
html_static_path: list[str] = []
html_show_sourcelink = True
