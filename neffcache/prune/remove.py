"""Removing an entry's files: in which order, how, and the journal that lets a rerun finish.

The order is what keeps readers safe while files go (see :func:`delete_order`); the journal
(``.neffcache/prune/<plan>-<n>.json``, written before a chunk's files go and removed after) is
what lets the next plan find and finish the entries a killed execution left half-removed.
A chunk reads and removes through :func:`chunk_files` (held directory descriptors on a local
store).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Protocol

from neffcache.entry import Entry, FileInfo
from neffcache.errors import EntryNotFound, UnsafePath
from neffcache.layouts import get_layout
from neffcache.prune.sweep import control_files
from neffcache.stores.base import CONTROL_DIR, Store
from neffcache.stores.local_remove import LocalRemoval
from neffcache.stores.safepath import SafeRoot

JOURNAL_DIR = f"{CONTROL_DIR}/prune"


def delete_order(entry: Entry) -> list[list[str]]:
    """An entry's files in removal phases (store paths): the layout's order, see
    :meth:`neffcache.layouts.base.Layout.removal_phases` for why it is safe."""
    phases = get_layout(entry.layout).removal_phases(entry)
    return [[entry.store_path(n) for n in phase] for phase in phases]


def read_journals(store: Store, notes: list[str] | None = None) -> dict[str, dict[str, list[str]]]:
    """Journal path -> {entry path: files it was removing}, of prunes that did not finish."""
    out: dict[str, dict[str, list[str]]] = {}
    for info in control_files(store, JOURNAL_DIR, notes):
        if not info.path.endswith(".json"):
            continue
        try:
            data = json.loads(store.read_bytes(info.path))
            out[info.path] = {str(p): [str(f) for f in files] for p, files in data["entries"].items()}
        except (EntryNotFound, UnsafePath, ValueError, KeyError, TypeError, AttributeError):
            out[info.path] = {}  # torn or foreign: nothing to finish, removed after the next execution
    return out


class ChunkFiles(Protocol):
    """What a chunk reads and removes through: a local store's :class:`LocalRemoval` (each
    directory opened once for the chunk), or :class:`StoreFiles` (the store's own calls)."""

    def list_files(self, rel: str) -> list[FileInfo]: ...
    def stat(self, path: str) -> FileInfo | None: ...
    def exists(self, path: str) -> bool: ...
    def discard(self, paths: Iterable[str], *, prune_dirs: bool = False) -> None: ...


class StoreFiles:
    """:class:`ChunkFiles` of a store with no local root (S3, fsspec): its own calls."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> StoreFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def list_files(self, rel: str) -> list[FileInfo]:
        return list(self.store.iter_files(rel))

    def stat(self, path: str) -> FileInfo | None:
        return self.store.stat(path)

    def exists(self, path: str) -> bool:
        return self.store.exists(path)

    def discard(self, paths: Iterable[str], *, prune_dirs: bool = False) -> None:
        self.store.discard(paths, prune_dirs=prune_dirs)


def chunk_files(store: Store) -> LocalRemoval | StoreFiles:
    """A local store's chunk goes through descriptors held for the chunk: one ``openat`` per
    directory instead of a walk from the root per phase (neffcache/stores/local_remove.py says
    why that keeps every containment property)."""
    root = store.local_root
    return LocalRemoval(SafeRoot(str(root), store.url)) if root is not None else StoreFiles(store)
