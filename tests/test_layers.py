"""What import-linter cannot say of the library's import graph: every module has a layer,
the layer table names no module that is gone, there is no import cycle (within a layer too),
and the simulated runtime asks no store or layout.

Every module of ``neffcache/`` (the library; ``neffcache.testing`` is a simulated runtime
beside it, with the store contract suite in ``neffcache.testing.store_contract``) belongs to
one layer of ``LAYERS``. That a module imports only its own layer and those below, that the
library never imports the parts beside it, that the warmers and the simulation use the library
only, and that the CLI reaches the server only through its facade (``SERVER_FACADE``) are
import-linter contracts in pyproject.toml, which ``lint-imports`` checks in ``make test``;
tests/test_import_contracts.py holds them to these tables.

This reads every module's AST (imports inside functions and ``TYPE_CHECKING`` blocks count
too), so nothing has to be imported to be checked. docs/architecture.md draws the same table.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The folders of the installed package (pyproject.toml's [tool.setuptools.package-dir]).
FOLDERS = {"neffcache": "neffcache", "neffcache.cli": "cli", "neffcache.server": "server",
           "neffcache.warmers": "warmers"}

# The library's layers, lowest first. A name ending in ".*" is a package and every module in
# it; any other name is one module. A module imports its own layer and the layers below.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Values: the error hierarchy, the instance catalog and toolchains, neffcache's key
    # function, entries and their manifests, sizes and durations for people (units), the names
    # of the operations' outcomes, why a compile failed and its signature (failures) and
    # failures grouped by signature (failure_groups: the index server groups with them too),
    # what a user-given tag may be (tags: the index server checks with the same rules), the kinds
    # of cache event (events: the index client sends them, the server counts them), who made
    # an entry (provenance), its signature as a record (signature) and with its crypto (signing),
    # and which signatures a reader trusts (trust), and secrets out of what is written down
    # (redaction).
    # Plain data and pure functions; no I/O but reading a manifest's bytes and a key file.
    ("values", ("neffcache", "neffcache.errors", "neffcache.instances", "neffcache.toolchain",
                "neffcache.keys", "neffcache.manifest", "neffcache.entry", "neffcache.units",
                "neffcache.outcomes", "neffcache.placeholder", "neffcache.regular",
                "neffcache.readiness", "neffcache.failures", "neffcache.failure_groups", "neffcache.tags",
                "neffcache.events", "neffcache.provenance", "neffcache.signature", "neffcache.signing",
                "neffcache.trust", "neffcache.redaction")),
    # Where bytes live: the Store interface, its backends and the URL registry. A store owns
    # every backend difference and its own file names (the control dir, the temp-name marker).
    ("stores", ("neffcache.stores.*",)),
    # How each runtime arranges entries under a root: every runtime fact (file names, markers,
    # states, flags) lives here, read through a Store.
    ("layouts", ("neffcache.layouts.*",)),
    # The scan engine: the walk plan made from the layouts, grouping listed files into entries
    # and judging them, the streaming summary with its tally and sinks, and the full report.
    ("scan", ("neffcache.scan.*",)),
    # What one process tells the others: lease files, the publish and prune-group leases that
    # keep an entry's writers apart, last-use stamps, the prune history, and the index client
    # (events, catalog records, the spool). Each module is the single home of its file names
    # and formats. The index is a reporter the operations above call (verify, sync, prune), so
    # it sits below them and imports none of them.
    ("coordination", ("neffcache.coordination.*", "neffcache.index.*")),
    # Operations on one store: scanning it, publishing an entry, copying entries in (ingest),
    # verifying digests, NeffCache.get/put.
    ("one-store operations", ("neffcache.operations.*",)),
    # Operations between stores (or a store and the index): push/pull, tier chains,
    # reconciling the index with a store, prune (its own order: tests/prune/test_package_order.py),
    # and the read-only questions over stores and index: what a job will miss and why (misses),
    # how ready a compiler upgrade is (upgrades: old graphs beside their successors, by hits).
    ("between-store operations", ("neffcache.replication.*", "neffcache.prune.*", "neffcache.misses.*",
                                  "neffcache.upgrades.*")),
    # What the CLI and the warmers start from: user settings, the job environment a runtime is
    # pointed at, the doctor's checks, the warm logs kept on disk.
    ("application", ("neffcache.application.*",)),
)

BESIDE_LIBRARY = ("neffcache.testing", "neffcache.cli", "neffcache.server", "neffcache.warmers")
# What the CLI may import from the server (its commands `serve`, `token`, `db` and the demo).
SERVER_FACADE = ("neffcache.server.app", "neffcache.server.config", "neffcache.server.services.admin")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    path: str  # its file, relative to the repository
    line: int
    target: str  # the module imported (a submodule when ``from package import module``)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.module} imports {self.target}"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _files() -> dict[str, Path]:
    """Every module of the installed package, by its import name."""
    out = {}
    for package, folder in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            if package == "neffcache" and any(_within(name, p) for p in BESIDE_LIBRARY):
                continue  # neffcache/ holds no cli/server/warmers folder, but never count one twice
            out[name] = path
    return out


MODULES = _files()


def _imports(module: str, path: str, source_text: str, known: set[str]) -> Iterator[Import]:
    """The imports of ``neffcache.*`` modules in ``source_text``, the module ``module``."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source_text, filename=path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            # ``from neffcache.stores import base`` imports the module neffcache.stores.base.
            subs = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in known]
            targets = subs or [source]
        else:
            continue
        for target in targets:
            if _within(target, "neffcache"):
                yield Import(module, path, node.lineno, target)


def _all_imports() -> list[Import]:
    known = set(MODULES)
    return [imp for name, path in MODULES.items()
            for imp in _imports(name, path.relative_to(REPO).as_posix(), path.read_text(), known)]


def _is_library(module: str) -> bool:
    return not any(_within(module, p) for p in BESIDE_LIBRARY)


def _layer(module: str) -> int | None:
    """The index in LAYERS of a library module's layer (None: the table does not place it)."""
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            if (member.endswith(".*") and _within(module, member[:-2])) or module == member:
                return index
    return None


def test_every_library_module_has_a_layer() -> None:
    unplaced = sorted(m for m in MODULES if _is_library(m) and _layer(m) is None)
    assert not unplaced, f"place these modules in a layer of LAYERS in {Path(__file__).name}: {unplaced}"


def test_every_layer_entry_names_a_module() -> None:
    stale = [member for _, members in LAYERS for member in members
             if member.removesuffix(".*") not in MODULES]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_the_simulated_runtime_imports_no_store_or_layout() -> None:
    """The simulation writes what a real runtime writes, by itself: were it to ask the layouts or
    stores, tests of those would check the code against itself. The store contract suite beside
    it tests the stores, so it imports them."""
    problems = [f"{imp}" for imp in _all_imports()
                if _within(imp.module, "neffcache.testing")
                and not _within(imp.module, "neffcache.testing.store_contract")
                and (_within(imp.target, "neffcache.stores") or _within(imp.target, "neffcache.layouts"))]
    assert not problems, "the simulated runtime imports stores or layouts:\n" + "\n".join(problems)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing
    itself), by Tarjan's algorithm, iteratively so a deep graph cannot hit the recursion limit."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        out.append(sorted(component))
    return out


def test_there_is_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    where: dict[tuple[str, str], Import] = {}
    for imp in _all_imports():
        if imp.target in graph:
            graph[imp.module].add(imp.target)
            where.setdefault((imp.module, imp.target), imp)
    problems = []
    for component in _cycles(graph):
        members = set(component)
        edges = [str(where[(a, b)]) for a in component for b in sorted(graph[a] & members)]
        problems.append(" <-> ".join(component) + "\n    " + "\n    ".join(edges))
    assert not problems, "import cycles:\n" + "\n".join(problems)


@pytest.mark.parametrize(("source", "expected"), [
    ("from neffcache.stores.base import Store\n", "neffcache.stores.base"),
    ("from .base import Store\n", "neffcache.stores.base"),
    ("from .. import errors\n", "neffcache.errors"),
    ("from . import base\n", "neffcache.stores.base"),
    ("def f():\n    import neffcache.layouts.base\n", "neffcache.layouts.base"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from neffcache.scan.report import Scan\n",
     "neffcache.scan.report"),
    ("from neffcache.stores import base, local\n", "neffcache.stores.local"),
])
def test_the_walker_resolves_every_import_form(source: str, expected: str) -> None:
    """Absolute, relative, nested, TYPE_CHECKING and ``from package import module`` imports all
    name their module (a walker that missed a form would let its imports through unchecked)."""
    found = _imports("neffcache.stores.probe", "neffcache/stores/probe.py", source, set(MODULES))
    assert expected in [imp.target for imp in found]


def test_an_upward_import_is_found_with_its_line() -> None:
    imp = next(_imports("neffcache.stores.probe", "neffcache/stores/probe.py",
                        "import os\n\nfrom neffcache.layouts.base import Layout\n", set(MODULES)))
    assert (str(imp), _layer(imp.module), _layer(imp.target)) == (
        "neffcache/stores/probe.py:3: neffcache.stores.probe imports neffcache.layouts.base", 1, 2)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"], ["e"]]
