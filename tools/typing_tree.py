"""Write ``.typing/``: the installed package's tree as mypy must see it.

pyproject.toml maps four folders into one import namespace (``neffcache.cli`` is ``cli/``,
``neffcache.server`` is ``server/``, ``neffcache.warmers`` is ``warmers/``). The editable
install does that with an import hook, which mypy cannot follow: checked as folders, the server
is module ``server.app`` and every ``from neffcache.server... import`` resolves to ``Any``, so
calls across the parts go unchecked. ``.typing/neffcache/`` is the package as installed, made of
relative symlinks (one per child of ``neffcache/``, plus ``cli``, ``server``, ``warmers``);
mypy checks ``-p neffcache`` from there (``mypy_path`` in pyproject.toml).

The tree is committed; tests/values/test_typing_tree.py fails, naming this command, when a new
child of ``neffcache/`` has no link yet::

    python tools/typing_tree.py
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREE = REPO / ".typing" / "neffcache"
PARTS = {"cli": "cli", "server": "server", "warmers": "warmers"}  # pyproject's [tool.setuptools.package-dir]
SKIP = {"__pycache__"}


def wanted_links() -> dict[str, str]:
    """Link name in .typing/neffcache -> its relative target."""
    links = {child.name: os.path.join("..", "..", "neffcache", child.name)
             for child in sorted((REPO / "neffcache").iterdir())
             if child.name not in SKIP and not child.name.startswith(".")}
    links.update({name: os.path.join("..", "..", folder) for name, folder in PARTS.items()})
    return links


def write_tree() -> None:
    if TREE.parent.exists():
        shutil.rmtree(TREE.parent)
    TREE.mkdir(parents=True)
    for name, target in wanted_links().items():
        (TREE / name).symlink_to(target)


if __name__ == "__main__":
    write_tree()
    sys.stdout.write(f"wrote {TREE.relative_to(REPO)} ({len(wanted_links())} links)\n")
