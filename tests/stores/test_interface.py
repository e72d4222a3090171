"""Stores own every backend difference: code outside ``neffcache/stores/`` never asks which class
a store is (``isinstance(x, LocalStore)``) nor probes it for an ability (``getattr(store, ...)``).
What differs between backends is a method or property of ``Store`` (see neffcache.stores.base),
and the store contract suite tests it on every backend.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import neffcache.stores.base as base
from neffcache.stores import fsspec_store, local, s3

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("neffcache", "cli", "warmers")
EXEMPT = ROOT / "neffcache" / "stores"


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
