"""The CLI stays thin: exit codes named in cli/errors.py, small modules and functions, one unit system."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import neffcache.cli
from neffcache import units
from neffcache.cli import errors

CLI_DIR = Path(neffcache.cli.__file__).parent
MODULES = sorted(CLI_DIR.glob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_sys_exit_takes_a_named_code_never_a_literal(path: Path) -> None:
    literals = [node.lineno for node in ast.walk(_tree(path))
                if isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.exit"
                and node.args and isinstance(node.args[0], ast.Constant)]
    assert literals == [], f"{path.name}: sys.exit with a literal code at lines {literals}; name it in cli/errors.py"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_modules_and_functions_fit_in_a_head(path: Path) -> None:
    assert path.read_text().count("\n") <= 400
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(_tree(path))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and (n.end_lineno or 0) - n.lineno + 1 > 60]
    assert long == []


def test_exit_codes_are_distinct() -> None:
    named = {name: value for name, value in vars(errors).items()
             if name.isupper() and not name.startswith("_") and type(value) is int}
    assert len(set(named.values())) == len(named), named
    assert errors.killed_by(15) == 143


def test_human_bytes_uses_decimal_units() -> None:
    assert units.human_bytes(999) == "999 B"
    assert units.human_bytes(2_000_000) == "2.0 MB"
    assert units.human_bytes(1536) == "1.5 kB"
    assert units.human_bytes(5 * 10**15, grouped=True) == "5,000.0 TB"


def test_dashboard_shows_sizes_in_the_cli_units() -> None:
    pytest.importorskip("fastapi")
    from neffcache.server.ui.dashboard import human_bytes

    assert human_bytes(2_000_000) == units.human_bytes(2_000_000) == "2.0 MB"
