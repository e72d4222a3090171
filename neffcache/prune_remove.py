"""Removing an entry's files: in which order, how, and the journal that lets a rerun finish.

The order is what keeps readers safe while files go (see :func:`delete_order`); the journal
(``.neffcache/prune/<plan>-<n>.json``, written before a chunk's files go and removed after) is
what lets the next plan find and finish the entries a killed execution left half-removed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from neffcache.entry import Entry
from neffcache.errors import EntryNotFound
from neffcache.layouts import get_layout
from neffcache.stores.base import CONTROL_DIR, Store
from neffcache.stores.local import LocalStore

JOURNAL_DIR = f"{CONTROL_DIR}/prune"


def delete_order(entry: Entry) -> list[list[str]]:
    """An entry's files in removal phases (store paths): the layout's order, see
    :meth:`neffcache.layouts.base.Layout.removal_phases` for why it is safe."""
    phases = get_layout(entry.layout).removal_phases(entry)
    return [[entry.store_path(n) for n in phase] for phase in phases]


def discard(store: Store, paths: list[str], *, prune_dirs: bool = True) -> None:
    """Remove ``paths`` without counting them (S3 would list their directories to count).

    On a local store the paths came from the store's own listing, so they are unlinked directly:
    ``LocalStore.delete`` re-validates each path and walks each parent with pathlib, which costs
    more than the unlink itself at 100k entries. ``prune_dirs`` removes the directories the
    unlinks emptied (an entry's, its shard's), never the root.
    """
    if not paths:
        return
    if isinstance(store, LocalStore):
        store.check_writable()
        _unlink_local(store, paths, prune_dirs=prune_dirs)
        return
    store.discard(paths)


def _unlink_local(store: LocalStore, paths: list[str], *, prune_dirs: bool) -> None:
    # Through the store's descriptor walk: a symlinked directory on the way is refused, never
    # followed (a planted ``.neffcache -> /home/x`` must not turn a prune into ``rm`` there).
    store.unlink_many(paths, prune_dirs=prune_dirs, control=True)


def remove_empty_dirs(store: Store, directories: Iterable[str]) -> None:
    """Remove each directory and its parents while they are empty (local stores; never the root)."""
    if not isinstance(store, LocalStore):
        return  # object stores have no directories
    store.remove_empty_dirs(directories, control=True)


def drop_leases(store: Store, paths: list[str]) -> None:
    """Remove lease files, leaving their shard directories: the next lease would make each
    emptied ``leases/ab/`` directory again (two directory operations per entry, the slowest
    calls on a filesystem)."""
    discard(store, paths, prune_dirs=False)


def read_journals(store: Store) -> dict[str, dict[str, list[str]]]:
    """Journal path -> {entry path: files it was removing}, of prunes that did not finish."""
    out: dict[str, dict[str, list[str]]] = {}
    for info in store.iter_files(JOURNAL_DIR):
        if not info.path.endswith(".json"):
            continue
        try:
            data = json.loads(store.read_bytes(info.path))
            out[info.path] = {str(p): [str(f) for f in files] for p, files in data["entries"].items()}
        except (EntryNotFound, ValueError, KeyError, TypeError, AttributeError):
            out[info.path] = {}  # torn or foreign: nothing to finish, removed after the next execution
    return out
