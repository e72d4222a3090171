"""A directory outside the store root that hostile symlinks point at, and its fingerprint."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

Fingerprint = dict[str, tuple[str, int, int, str]]


def make_sentinel(base: Path) -> Path:
    sentinel = base / "sentinel"
    (sentinel / "sub").mkdir(parents=True)
    (sentinel / "model.neff").write_bytes(b"NOT YOURS" * 100)
    (sentinel / "precious.txt").write_text("keep me\n")
    (sentinel / "sub" / "model.done").write_bytes(b"")
    return sentinel


def fingerprint(directory: Path) -> Fingerprint:
    """Every name below ``directory`` with its type, size, mtime and content digest."""
    out: Fingerprint = {}
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = path.lstat()
            kind = "l" if path.is_symlink() else "d" if path.is_dir() else "f"
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if kind == "f" else ""
            out[str(path.relative_to(directory))] = (kind, st.st_size if kind == "f" else 0, st.st_mtime_ns, digest)
    return out
