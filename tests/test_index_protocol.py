"""No code outside neffcache/index/ asks which index it holds. ``IndexClient`` and ``NullIndex``
satisfy one protocol (neffcache/index/protocol.py; mypy checks both against it), so a difference
between a configured index and none is a member each answers, never a type test at the caller:
``isinstance(x, IndexClient)`` or ``getattr(index, "enabled", False)`` spread the index's
knowledge of itself over its callers, and each new difference then meant finding them all.

This reads every module's AST (tests/test_layers.py's table of modules), importing nothing."""

from __future__ import annotations

import ast

from tests.test_layers import MODULES, REPO, _within

INDEX_CLASSES = frozenset({"IndexClient", "NullIndex", "Index"})


def _name(node: ast.expr) -> str:
    """The last name of ``a.b.c`` (``c``), or "" for anything else."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def type_tests(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, call) of every ``isinstance`` against an index class and every ``getattr`` on
    something named like an index, in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
            continue
        if node.func.id == "isinstance":
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(_name(c) in INDEX_CLASSES for c in classes):
                found.append((node.lineno, ast.unparse(node)))
        elif node.func.id in ("getattr", "hasattr") and "index" in _name(node.args[0]).lower():
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_check_finds_both_kinds() -> None:
    source = ("if isinstance(index, IndexClient): pass\nx = getattr(self.index, 'enabled', False)\n"
              "y = isinstance(v, (int, idx.NullIndex))\nz = getattr(store, 'url', None)\n")
    assert [line for line, _ in type_tests(source, "t.py")] == [1, 2, 3]


def test_no_caller_outside_the_index_package_type_tests_the_index() -> None:
    offenders = []
    for module, path in MODULES.items():
        if _within(module, "neffcache.index"):
            continue
        rel = path.relative_to(REPO).as_posix()
        offenders += [f"{rel}:{line}: {call}" for line, call in type_tests(path.read_text(), rel)]
    assert not offenders, "ask the index (neffcache/index/protocol.py) instead:\n" + "\n".join(offenders)
