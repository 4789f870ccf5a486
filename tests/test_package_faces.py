"""The three packages use each other only through their public faces.

A face is a package `__init__` with an `__all__`: `gateway`, `cache`, `backends` and
`backends.local` (what the semantic cache needs from local engines). An import from another
package must name a face and only names in its `__all__`, so internals can move without
breaking a neighbour, and the data flow stays one way: gateway → cache → backends.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "cache", "backends")
FACES = ("gateway", "cache", "backends", "backends.local")
# Who may import whom (the architecture's one-way flow).
ALLOWED = {"gateway": {"cache", "backends"}, "cache": {"backends"}, "backends": set()}


def _imports(package: str) -> list[tuple[str, int, str, list[str]]]:
    """(file, line, module, names) for every `from X import ...` / `import X` in a package."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.append((rel, node.lineno, node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                out.extend((rel, node.lineno, a.name, []) for a in node.names)
    return out


@pytest.mark.parametrize("face", FACES)
def test_each_face_declares_what_it_exports(face: str) -> None:
    module = importlib.import_module(face)
    exported = getattr(module, "__all__", None)
    assert exported, f"{face} has no __all__"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{face}.__all__ names what it does not have: {missing}"


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_across_packages_go_through_faces(package: str) -> None:
    faces = {face: set(importlib.import_module(face).__all__) for face in FACES}
    problems = []
    for rel, line, module, names in _imports(package):
        top = module.split(".")[0]
        if top not in PACKAGES or top == package:
            continue
        where = f"{rel}:{line}: {module}"
        if top not in ALLOWED[package]:
            problems.append(f"{where}: {package} must not import {top}")
        elif module not in faces:
            problems.append(f"{where}: not a public face ({', '.join(FACES)})")
        else:
            hidden = [n for n in names if n not in faces[module]]
            if hidden:
                problems.append(f"{where}: {hidden} not in its __all__")
    assert not problems, "\n".join(problems)
