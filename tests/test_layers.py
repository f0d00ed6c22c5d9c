"""The four parts of docs/architecture.md import in one direction: the tuning core and the
thread pool import nothing else of ours, the kernel library never imports the runtime or the
face, the runtime never imports the face. Imports inside functions count too.

The modules are parsed in a fresh interpreter (this file run as a script): CPython 3.11's
``ast.parse`` can fail with "AST constructor recursion depth mismatch" while other threads
(the fleet tests' Ray threads) run Python code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


def violations() -> list[str]:
    """One line per module that imports against the direction."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = part(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        wrong = sorted(name for name in imported(path) if part(name) not in ALLOWED[source])
        if wrong:
            found.append(f"{path.relative_to(PACKAGE)} ({source}) imports {wrong}")
    return found


def test_imports_follow_the_layers() -> None:
    result = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and not result.stdout, result.stdout + result.stderr


if __name__ == "__main__":
    print("\n".join(violations()), end="")
