"""The server's import graph: from the library it imports only the values it names (``LIBRARY``).

``neffcache.server`` is deployed on its own (a container with no cache stores), so it may use
the library's values and the index records, never its stores, layouts, sync or prune. The
import-linter contract (pyproject.toml, ``server-library``) forbids those packages; this holds
the server to an allow-list instead, each module with why it is needed, so a new library
module is not used by the server unnoticed. Inside the server, ``storage`` < ``services`` <
``observability`` < ``api`` < ``ui`` < ``connections`` < ``workers`` < ``app`` (``LAYERS``): a
module imports its own layer and those below it, which the ``server-layers`` contract checks
(tests/test_import_contracts.py holds it to ``LAYERS``). This reads every module's AST (imports
inside functions and ``TYPE_CHECKING`` blocks count too), so nothing has to be imported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parents[2] / "server"
PACKAGE = "neffcache.server"

# Lowest first. config is the settings, which every layer may read.
LAYERS = ("config", "storage", "services", "observability", "api", "ui", "connections", "workers", "app")

# What the server may import from the library, and why it needs each.
LIBRARY = {
    "neffcache.errors": "the one error hierarchy (ConfigError, InvalidKey, IndexServerError)",
    "neffcache.events": "EventKind: the kinds of event it validates and counts, the ones the client sends",
    "neffcache.failure_groups": "error events grouped by signature for /v1/failures, as `neffcache failures` "
                                "groups the stores' failure logs",
    "neffcache.index.records": "what clients send: the records the server validates and stores",
    "neffcache.instances": "the instance catalog: the operator's prices must name instance types it knows",
    "neffcache.keys": "safe_relpath: the one check that an entry path from outside stays relative",
    "neffcache.readiness": "the readiness rule (hit weights, the rewarm tag) upgrade-report uses too",
    "neffcache.toolchain": "Toolchain: the one definition of a valid compiler version, target and LNC",
    "neffcache.units": "human_bytes: sizes in the one unit system the CLI prints too",
    "neffcache.tags": "what a user-given tag may be: the CLI checks with the same rules",
}
# ``from neffcache import __version__`` (API title, dashboard footer): the package root's value.
ROOT_NAMES = {"__version__"}

# Imports the rules refuse that wait for the library to move a value (the integrator removes an
# entry when its import is gone; a stale entry fails the test so the list only shrinks).
PENDING: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    path: str  # relative to server/
    line: int
    target: str  # the module imported (a submodule when ``from package import module``)
    names: tuple[str, ...]

    def __str__(self) -> str:
        return f"server/{self.path}:{self.line}: imports {self.target}"


def _module_name(rel: str) -> str:
    parts = list(Path(rel).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _is_server_module(name: str) -> bool:
    rel = Path(*name.split(".")[2:]) if name != PACKAGE else Path()
    return (SERVER / rel).with_suffix(".py").is_file() or (SERVER / rel / "__init__.py").is_file()


def _imports(rel: str, source_text: str) -> list[Import]:
    """The imports of the module at ``server/<rel>`` whose text is ``source_text``."""
    module = _module_name(rel)
    package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source_text, filename=rel)):
        if isinstance(node, ast.Import):
            out += [Import(rel, node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            names = tuple(alias.name for alias in node.names)
            # ``from neffcache.server.services import tokens`` imports the module services.tokens.
            subs = [f"{source}.{n}" for n in names if _is_server_module(f"{source}.{n}")]
            if source.startswith(PACKAGE) and subs:
                out += [Import(rel, node.lineno, sub, ()) for sub in subs]
            else:
                out.append(Import(rel, node.lineno, source, names))
    return out


def _all_imports() -> list[Import]:
    return [imp for path in sorted(SERVER.rglob("*.py"))
            for imp in _imports(path.relative_to(SERVER).as_posix(), path.read_text())]


def _layer(server_module: str) -> str | None:
    """The layer of a module under neffcache.server (None for the package itself)."""
    parts = server_module.split(".")
    return parts[2] if len(parts) > 2 else None


def _library_problem(imp: Import) -> str | None:
    if imp.target == "neffcache":
        extra = set(imp.names) - ROOT_NAMES
        return f"names {sorted(extra)} from the package root (allowed: {sorted(ROOT_NAMES)})" if extra else None
    if imp.target in LIBRARY or (imp.path, imp.target) in PENDING:
        return None
    return "a library module the server may not use (allowed: " + ", ".join(sorted(LIBRARY)) + ")"


def test_the_layers_are_known() -> None:
    tops = {p.stem for p in SERVER.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert tops == set(LAYERS), f"server/ holds {sorted(tops)}; this test knows the layers {LAYERS}"


def test_the_server_imports_only_values_from_the_library() -> None:
    problems = []
    for imp in _all_imports():
        if imp.target == "neffcache" or (imp.target.startswith("neffcache.") and not imp.target.startswith(PACKAGE)):
            why = _library_problem(imp)
            if why:
                problems.append(f"{imp}: {why}")
    assert not problems, "the server imports from the library what it may not:\n" + "\n".join(problems)


def test_pending_exceptions_are_still_needed() -> None:
    used = {(imp.path, imp.target) for imp in _all_imports()}
    stale = sorted(PENDING - used)
    assert not stale, f"remove these from PENDING in {Path(__file__).name}, the imports are gone: {stale}"


@pytest.mark.parametrize(("source", "expected"), [
    ("from neffcache.server.api.deps import ReadAccess\n", "neffcache.server.api.deps"),
    ("from ..api import deps\n", "neffcache.server.api.deps"),
    ("from . import db\n", "neffcache.server.storage.db"),
    ("def f():\n    import neffcache.server.ui.charts\n", "neffcache.server.ui.charts"),
    ("from neffcache.server.services import tokens, leases\n", "neffcache.server.services.tokens"),
])
def test_the_walker_resolves_every_import_form(source: str, expected: str) -> None:
    """Absolute, relative, nested and ``from package import module`` imports all name their
    module (a walker that missed a form would let its imports through unchecked)."""
    assert expected in [imp.target for imp in _imports("storage/probe.py", source)]
