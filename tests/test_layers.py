"""The four parts of docs/architecture.md import in one direction: the tuning core and the
thread pool import nothing else of ours, the kernel library never imports the runtime or the
face, the runtime never imports the face. Imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "onnx_light"
FACE = {"__init__", "__main__", "backend", "cli", "cli_common", "cli_tune", "fleet",
        "inference_session", "plotting", "profiling", "terminal"}


def part(module: str) -> str:
    """The part of ``onnx_light.<module>``: tuning, parallel, kernels, runtime or face."""
    top = module.split(".")[0]
    if top in ("tuning", "parallel", "kernels", "runtime"):
        return top
    if top in FACE:
        return "face"
    raise AssertionError(f"onnx_light.{module} belongs to no part of docs/architecture.md")


ALLOWED = {"tuning": {"tuning"}, "parallel": {"parallel"},
           "kernels": {"kernels", "tuning", "parallel"},
           "runtime": {"runtime", "kernels", "tuning", "parallel"},
           "face": {"face", "runtime", "kernels", "tuning", "parallel"}}


def imported(path: Path) -> set[str]:
    """The modules of ours that ``path`` imports anywhere, relative to the package."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[:len(here) - node.level])
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                if not target:  # from . import x at the package's top: a module or a name of it
                    names.update(alias.name if (PACKAGE / alias.name).exists()
                                 or (PACKAGE / f"{alias.name}.py").exists() else "__init__"
                                 for alias in node.names)
                else:
                    names.add(target)
            elif node.module and node.module.startswith("onnx_light."):
                names.add(node.module.removeprefix("onnx_light."))
        elif isinstance(node, ast.Import):
            names.update(alias.name.removeprefix("onnx_light.") for alias in node.names
                         if alias.name.startswith("onnx_light."))
    return names


MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_follow_the_layers(path: Path) -> None:
    source = part(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    wrong = sorted(name for name in imported(path) if part(name) not in ALLOWED[source])
    assert not wrong, f"{path.relative_to(PACKAGE)} ({source}) imports {wrong}"
