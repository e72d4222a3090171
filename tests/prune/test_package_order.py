"""neffcache/prune/ is one package with one import direction (see its __init__ docstring):
each module imports only the modules before it, at the top, and stays small."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "neffcache" / "prune"
ORDER = ["value", "model", "candidates", "costs", "rules", "sweep", "guard", "remove", "plan", "reserve", "run",
         "execute"]


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text()) for p in sorted(PACKAGE.glob("*.py")) if p.stem != "__init__"}


def test_every_module_has_its_place() -> None:
    assert sorted(_modules()) == sorted(ORDER)


def test_imports_go_one_way_and_at_the_top() -> None:
    wrong = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("neffcache.prune"):
                dep = (node.module or "").rpartition(".")[2]
                if dep == "prune" or ORDER.index(dep) >= ORDER.index(name):
                    wrong.append(f"{name} imports {node.module} (line {node.lineno})")
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                wrong.extend(f"{name}.{node.name} imports inside a function (line {inner.lineno})"
                             for inner in ast.walk(node) if isinstance(inner, ast.Import | ast.ImportFrom))
    assert not wrong, "\n".join(wrong)


def test_modules_and_functions_fit_in_a_head() -> None:
    big = []
    for path in sorted(PACKAGE.glob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > 400:
            big.append(f"{path.name}: {lines} lines")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    big.append(f"{path.name}:{node.lineno} {node.name}: {length} lines")
    assert not big, "\n".join(big)
