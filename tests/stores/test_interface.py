"""Stores own every backend difference: code outside ``neffcache/stores/`` never asks which class
a store is (``isinstance(x, LocalStore)``), nor probes it for an ability (``getattr(store, ...)``),
nor works out what it is from whether it has a local root (``store.local_root is None``).
What differs between backends is a method or property of ``Store`` (see neffcache.stores.base and
neffcache.stores.roles), and the store contract suite tests it on every backend.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import neffcache.stores.base as base
from neffcache.stores import fsspec_store, local, s3

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("neffcache", "cli", "server", "warmers")
EXEMPT = ROOT / "neffcache" / "stores"
# The contract suite checks what each backend answers, local_root included.
CONTRACT = ROOT / "neffcache" / "testing" / "store_contract"


def _store_classes() -> set[str]:
    names = {"Store"}
    for module in (base, local, s3, fsspec_store):
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, base.Store):
                names.add(name)
    return names


# Abilities once probed for with getattr (now on the interface) and backend-only attributes.
PROBED = {"incomplete_uploads", "abort_uploads", "move", "created", "discard", "remove_empty_dirs",
          "root", "shared", "bucket", "prefix", "fs", "endpoint"}


def _store_attributes() -> set[str]:
    """Attributes some backend has and the interface does not, and :data:`PROBED`: a getattr
    for one of them asks the backend a question the interface should answer."""
    names: set[str] = set()
    for module in (local, s3, fsspec_store):
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, base.Store):
                names |= {n for n in vars(obj) if not n.startswith("__")}
    return (names - set(dir(base.Store))) | PROBED


def _name_of(node: ast.expr) -> str:
    """The dotted name of an expression, as far as it has one (``self.store`` -> "self.store")."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name_of(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _name_of(node.func)
    if isinstance(node, ast.Subscript):
        return _name_of(node.value)
    return ""


def _classes_in(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [n for elt in node.elts for n in _classes_in(elt)]
    return [_name_of(node).rpartition(".")[2]]


def _violations(path: Path, classes: set[str], attributes: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(ROOT)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            hit = [c for c in _classes_in(node.args[1]) if c in classes]
            if hit:
                out.append(f"{where}:{node.lineno}: {node.func.id}(..., {', '.join(hit)})")
        elif node.func.id in ("getattr", "hasattr") and len(node.args) >= 2:
            target = _name_of(node.args[0])
            attr = node.args[1].value if isinstance(node.args[1], ast.Constant) else None
            if "store" in target.lower() or (isinstance(attr, str) and attr in attributes):
                out.append(f"{where}:{node.lineno}: {node.func.id}({target or '...'}, {attr!r})")
    return out


def _sources() -> list[Path]:
    files: list[Path] = []
    for top in SCANNED:
        files.extend(p for p in sorted((ROOT / top).rglob("*.py")) if EXEMPT not in p.parents)
    return files


def test_no_backend_checks_outside_stores() -> None:
    classes, attributes = _store_classes(), _store_attributes()
    found = [v for path in _sources() for v in _violations(path, classes, attributes)]
    assert not found, "ask the Store interface instead (neffcache/stores/base.py):\n" + "\n".join(found)


def test_the_check_finds_what_it_forbids(tmp_path: Path) -> None:
    """The rule itself: each forbidden form is found, with its line; the allowed forms are not."""
    sample = ROOT / "neffcache" / "_interface_sample.py"
    code = ("def f(store, x, exc):\n"
            "    isinstance(store, LocalStore)\n"
            "    isinstance(x, (int, S3Store))\n"
            "    getattr(self.store, 'abort_uploads', None)\n"
            "    getattr(x, 'incomplete_uploads', None)\n"
            "    getattr(exc, 'reason', None)\n"
            "    isinstance(x, dict)\n")
    try:
        sample.write_text(code)
        found = _violations(sample, _store_classes(), _store_attributes())
    finally:
        sample.unlink()
    assert [v.split(":")[1] for v in found] == ["2", "3", "4", "5"], found
    assert "LocalStore" in found[0] and "S3Store" in found[1]


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _scope(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one scope (a module or function), not those of functions nested in it."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        yield child
        if not isinstance(child, FUNCTIONS):
            todo.extend(ast.iter_child_nodes(child))


def _is_local_root(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "local_root"


def _tested(node: ast.AST) -> list[tuple[ast.expr, str]]:
    """The expressions ``node`` tests, each with how: for None, or for truth."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(
            node.ops[0], (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)):
        left, right = node.left, node.comparators[0]
        for side, other in ((left, right), (right, left)):
            if isinstance(other, ast.Constant) and other.value is None:
                return [(side, "for None")]
        return []
    if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
        return [(node.test, "for truth")]
    if isinstance(node, ast.comprehension):
        return [(test, "for truth") for test in node.ifs]
    if isinstance(node, ast.BoolOp):
        return [(value, "for truth") for value in node.values]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return [(node.operand, "for truth")]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bool" and node.args:
        return [(node.args[0], "for truth")]
    return []


def _local_root_tests(source: str, where: str) -> list[str]:
    """Each test of a ``local_root`` for None or for truth in ``source`` (the file ``where``):
    of the attribute itself, or of a name the same function assigned it to."""
    tree = ast.parse(source, filename=where)
    found = set()
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, FUNCTIONS))]:
        nodes = list(_scope(scope))
        names = {n.target.id for n in nodes
                 if isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and isinstance(n.target, ast.Name)
                 and n.value is not None and _is_local_root(n.value)}
        names |= {t.id for n in nodes if isinstance(n, ast.Assign) and _is_local_root(n.value)
                  for t in n.targets if isinstance(t, ast.Name)}
        for node in nodes:
            for expr, how in _tested(node):
                if _is_local_root(expr) or (isinstance(expr, ast.Name) and expr.id in names):
                    found.add((expr.lineno, f"{where}:{expr.lineno}: tests local_root {how}"))
    return [text for _, text in sorted(found)]


def test_no_local_root_tests_outside_stores() -> None:
    found = [v for path in _sources() if CONTRACT not in path.parents
             for v in _local_root_tests(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not found, ("ask the Store member that says what differs (neffcache/stores/roles.py: "
                       "runtime_root, host_locks_visible, can_fill...) instead:\n" + "\n".join(found))


def test_the_local_root_check_finds_what_it_forbids() -> None:
    """Each forbidden form is found, with its line, through a name too; the allowed forms are not."""
    code = ("def f(store, settings):\n"
            "    if store.local_root is not None: pass\n"
            "    x = 1 if self.dst.local_root is None else 2\n"
            "    if store.local_root: pass\n"
            "    root = store.local_root\n"
            "    if root is not None and ok: pass\n"
            "    y = not root\n"
            "    watch(store.watchable_root)\n"
            "    path = store.local_root / 'x'\n"
            "    if other is None: pass\n"
            "def g(root):\n"
            "    if root is None: pass\n")
    found = _local_root_tests(code, "neffcache/sample.py")
    assert [v.split(":")[1] for v in found] == ["2", "3", "4", "6", "7"], found
    assert found[0] == "neffcache/sample.py:2: tests local_root for None"
    assert found[2].endswith("tests local_root for truth")
