"""The import-linter contracts in pyproject.toml are the tables the AST tests hold
(tests/test_layers.py, tests/server/test_layers.py), and ``lint-imports`` keeps them.

Two statements of one rule drift apart unless something compares them: this does, layer by
layer, so a module added to one table and not the other fails here. The contracts run as
``make test`` and ``make lint`` run them (from ``.typing/``, the package as installed)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from tests.server import test_layers as server_layers
from tests.test_layers import LAYERS, REPO, SERVER_FACADE

CONTRACTS: dict[str, dict[str, Any]] = {
    c["id"]: c for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]}


def _layer(text: str) -> set[str]:
    return {part.strip() for part in text.split(":")}


def test_the_library_layers_are_the_layer_table() -> None:
    table = [{name.removesuffix(".*") for name in members if name != "neffcache"} for _, members in LAYERS]
    contract = [_layer(layer) for layer in reversed(CONTRACTS["library-layers"]["layers"])]
    assert contract == table


def test_the_library_is_the_source_of_its_forbidden_imports() -> None:
    library = {name.removesuffix(".*") for _, members in LAYERS for name in members if name != "neffcache"}
    assert set(CONTRACTS["library-beside"]["source_modules"]) == library


def test_the_server_layers_are_the_server_table() -> None:
    assert CONTRACTS["server-layers"]["layers"] == list(reversed(server_layers.LAYERS))
    allowed = set(server_layers.LIBRARY)
    forbidden = set(CONTRACTS["server-library"]["forbidden_modules"])
    # Each module the server may import lies outside every forbidden package, but for the one
    # the contract lets through by name.
    ignored = {rule.split("-> ")[1] for rule in CONTRACTS["server-library"]["ignore_imports"]}
    for module in allowed - ignored:
        assert not any(module == f or module.startswith(f + ".") for f in forbidden), module


def test_the_cli_reaches_the_server_through_the_facade_table() -> None:
    facade = {rule.split("-> ")[1] for rule in CONTRACTS["cli-server-facade"]["ignore_imports"]}
    assert facade == set(SERVER_FACADE)


def test_lint_imports_keeps_every_contract() -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-logo", "--no-cache",
                           "--config", str(REPO / "pyproject.toml")], cwd=REPO / ".typing", capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in done.stdout
