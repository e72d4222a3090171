"""Modules that fit in a head: none over 400 lines, no function over 60 (docs/STYLE: "split by
responsibility, not by layer of helpers").

The rule covers the installed package's folders (``neffcache/``, ``cli/``, ``server/``,
``warmers/``); the database migrations are history and are left as written. A function's length
is from its ``def`` line (decorators excluded) to its last line, docstring and comments
included: what a reader has to hold. Nested functions count within their parent and on their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("neffcache", "cli", "server", "warmers")
EXCLUDED = ("server/storage/migrations",)
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return [path for folder in FOLDERS for path in sorted((REPO / folder).rglob("*.py"))
            if not any(path.relative_to(REPO).as_posix().startswith(ex + "/") for ex in EXCLUDED)]


def _too_long(path: Path, source: str) -> list[str]:
    rel = path.relative_to(REPO).as_posix()
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{rel}:1: module of {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source, filename=rel)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{rel}:{node.lineno}: function {node.name} of {length} lines "
                             f"(at most {MAX_FUNCTION_LINES})")
    return found


def test_the_rule_covers_every_folder() -> None:
    assert all((REPO / folder).is_dir() for folder in FOLDERS)
    assert len(_modules()) > 50
    assert not any("migrations/" in p.as_posix() for p in _modules())


def test_no_module_or_function_is_too_long() -> None:
    problems = [problem for path in _modules() for problem in _too_long(path, path.read_text())]
    assert not problems, "split these by responsibility:\n" + "\n".join(problems)


@pytest.mark.parametrize(("source", "expected"), [
    ("x = 1\n" * 401, "module of 401 lines"),
    ("def f():\n" + "    x = 1\n" * 60, "function f of 61 lines"),
    ("class A:\n    async def g(self):\n" + "        x = 1\n" * 60, "function g of 61 lines"),
])
def test_a_long_module_or_function_is_named_with_its_line(source: str, expected: str) -> None:
    found = _too_long(REPO / "neffcache" / "probe.py", source)
    assert len(found) == 1 and expected in found[0] and found[0].startswith("neffcache/probe.py:")


def test_sixty_lines_pass() -> None:
    assert _too_long(REPO / "neffcache" / "probe.py", "def f():\n" + "    x = 1\n" * 59) == []
