"""docs/architecture.md names every module, in the paragraph of its package, and no module that is gone.

A newcomer reads architecture.md to find where a thing lives; a module it does not name is one
they cannot find, and a path it names that is gone sends them nowhere. So every module of the
library (not neffcache.testing), the CLI, the server and the warmers must be named in its
package's paragraph under "## The packages" (the one headed `stores/` for neffcache/stores/,
`neffcache/` for the root's values, `server/` for the server and all its sub-packages): as
`stem`, as a backquoted path or dotted name ending in it, or as stem.py. The paragraph, not the
whole page, because stems repeat across packages: `plan` is a module of prune/, the warmers and
the CLI. The server's numbered Alembic revisions (server/storage/migrations/versions/) are
history, not places to look: the doc names `migrations`. Reads files only, imports nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
TREES = ("neffcache", "cli", "server", "warmers")
SKIPPED = ("neffcache/testing/", "server/storage/migrations/versions/")
# Where an installed dotted name lives in this repository.
FOLDERS = {"neffcache.cli": "cli", "neffcache.server": "server", "neffcache.warmers": "warmers"}


def modules() -> list[str]:
    found = (p.relative_to(ROOT).as_posix() for tree in TREES for p in (ROOT / tree).rglob("*.py"))
    return sorted(m for m in found if not m.endswith("__init__.py") and not m.startswith(SKIPPED))


def paragraphs() -> dict[str, str]:
    """Each package paragraph under "## The packages", by its bold name (`stores/`, `server/`)."""
    section = DOC.read_text().split("\n## The packages\n", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^\*\*`([^`]+)`", section, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def paragraph_of(module: str) -> str:
    tree, *rest = module.split("/")
    return f"{rest[0]}/" if tree == "neffcache" and len(rest) > 1 else f"{tree}/"


def names(text: str) -> set[str]:
    spans = re.findall(r"`([^`\n]+)`", text)
    tails = {re.split(r"[/.]", s.removesuffix(".py").rstrip("/"))[-1] for s in spans}
    return set(spans) | tails | set(re.findall(r"\b(\w+)\.py\b", text))


def test_every_module_is_named_in_its_package_paragraph() -> None:
    given = {key: names(text) for key, text in paragraphs().items()}
    unnamed = [m for m in modules() if Path(m).stem not in given.get(paragraph_of(m), set())]
    lines = [f"  {m} (in the paragraph **`{paragraph_of(m)}`**)" for m in unnamed]
    assert not unnamed, "docs/architecture.md does not name these modules:\n" + "\n".join(lines)


def exists(ref: str) -> bool:
    if "/" in ref:  # a file: from the repository root, or from neffcache/ (`index/protocol.py`)
        return (ROOT / ref).is_file() or (ROOT / "neffcache" / ref).is_file()
    prefix = next((p for p in FOLDERS if ref == p or ref.startswith(p + ".")), "neffcache")
    path = ROOT / FOLDERS.get(prefix, "neffcache") / ref.removeprefix(prefix).lstrip(".").replace(".", "/")
    # A module, a package, or an attribute of a module (`neffcache.server.app.create_app`).
    return path.with_suffix(".py").is_file() or path.is_dir() or path.parent.with_suffix(".py").is_file()


def test_every_module_path_the_doc_names_exists() -> None:
    text = DOC.read_text()
    files = re.findall(r"(?<![\w./-])((?:\w+/)+\w+\.(?:py|c))\b", text)
    dotted = re.findall(r"`(neffcache(?:\.\w+)+)`", text)
    gone = sorted({ref for ref in files + dotted if not exists(ref)})
    assert not gone, "docs/architecture.md names modules that do not exist: " + ", ".join(gone)
