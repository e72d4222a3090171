"""mypy checks the package as installed: .typing/neffcache links every child of neffcache/ and
the three folders mapped into it (tools/typing_tree.py says why)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from typing_tree import TREE, wanted_links  # noqa: E402


def test_every_part_of_the_package_is_linked_for_mypy() -> None:
    have = {p.name: os.readlink(p) for p in TREE.iterdir() if p.is_symlink()} if TREE.is_dir() else {}
    assert have == wanted_links(), "the mypy tree is stale: run `python tools/typing_tree.py` and commit .typing/"


def test_the_links_reach_the_real_files() -> None:
    assert (TREE / "server" / "app.py").resolve() == REPO / "server" / "app.py"
    assert (TREE / "keys.py").resolve() == REPO / "neffcache" / "keys.py"
