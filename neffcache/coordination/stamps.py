"""Last-use stamps: when neffcache last served an entry, recorded by neffcache itself.

Shared mounts often run with ``noatime`` and S3 has no access time at all, so age-based
pruning can never read atime. Whoever serves an entry (the ``run`` wrapper, a tier promotion,
a warm-up hit) records the use as a small file ``.neffcache/stamps/<entry path>.used``; the
file's modification time (S3: LastModified) is the last use, so prune learns every entry's
last use from a single listing of the stamp directory, without opening a file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from neffcache.stores.base import CONTROL_DIR, Store

STAMP_DIR = f"{CONTROL_DIR}/stamps"
_SUFFIX = ".used"


def stamp_path(entry_path: str) -> str:
    return f"{STAMP_DIR}/{entry_path}{_SUFFIX}"


def record_use(store: Store, entry_paths: Iterable[str], *, when: float | None = None) -> int:
    """Stamp each entry as used now (best effort: a read-only store records nothing)."""
    if store.read_only:
        return 0
    body = json.dumps({"last_used": when if when is not None else time.time()}).encode()
    count = 0
    for path in dict.fromkeys(entry_paths):  # once per entry, in order
        store.put_file(stamp_path(path), body)
        count += 1
    return count


def last_used(store: Store, prefix: str = "") -> dict[str, float]:
    """Entry path -> last-use time, for every stamped entry below ``prefix``."""
    root = f"{STAMP_DIR}/{prefix}".rstrip("/")
    out: dict[str, float] = {}
    for info in store.iter_files(root):
        if info.path.endswith(_SUFFIX):
            out[info.path[len(STAMP_DIR) + 1 : -len(_SUFFIX)]] = info.mtime
    return out
