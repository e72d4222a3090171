"""A wheel ships every package: pyproject.toml's explicit package list names each folder with an
__init__.py under the four mapped folders (an editable install finds a forgotten one anyway, so
only a wheel would lose it, on a user's machine)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_the_package_list() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {name: REPO / folder for name, folder in config["package-dir"].items()}
    found = set()
    for name, root in folders.items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join([name, *rel.parts]))
    data = set(config["package-data"])  # data folders (the dashboard's): packages without __init__.py
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found - data == set(), "these listed packages have no folder"
    for name in data - found:
        parent, _, leaf = name.rpartition(".")
        assert (folders.get(name) or _folder(folders, parent) / leaf).is_dir(), f"{name} has no folder"


def _folder(folders: dict[str, Path], name: str) -> Path:
    """Where package ``name`` lives, by the nearest mapped parent (package-dir)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head in folders:
            return folders[head].joinpath(*parts[cut:])
    return REPO.joinpath(*parts)
