"""Removing an entry's files: in which order, how, and the journal that lets a rerun finish.

The order is what keeps readers safe while files go (see :func:`delete_order`); the journal
(``.neffcache/prune/<plan>-<n>.json``, written before a chunk's files go and removed after) is
what lets the next plan find and finish the entries a killed execution left half-removed.
A chunk reads and removes through its store's ``removal()`` (held directory descriptors on a
local store: neffcache/stores/removal.py).
"""

from __future__ import annotations

import json

from neffcache.entry import Entry
from neffcache.errors import EntryNotFound, UnsafePath
from neffcache.layouts import get_layout
from neffcache.prune.sweep import control_files
from neffcache.stores.base import CONTROL_DIR, Store

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
