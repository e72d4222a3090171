"""What losing an entry costs, as the value policy of a size budget weighs it: its recorded
compile seconds and its hits.

The index's record comes first when an index is configured (its hit count, and the compile
seconds its publish registered); an entry the index gives no compile time for has its manifest
read (one bounded read, in parallel). Both sources are untrusted: a manifest that does not
parse, a count that is not a number, negative, not finite or beyond :data:`MAX_SECONDS` is
taken as *not recorded*, and the entry is costed at the policy's stated default, which the
plan reports. Nothing here selects anything: it annotates candidates the store's listing
found, and a path only the index names is ignored (an index row never causes a removal).
``--policy lru`` orders without costs: only the manifests of its evictions are read, for the
plan and the tombstones (:func:`with_recorded_costs`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from neffcache.entry import Entry
from neffcache.errors import CorruptEntry, EntryNotFound, IndexServerError, InvalidKey
from neffcache.manifest import MAX_SECONDS, read_manifest
from neffcache.prune.candidates import PruneCandidate, prefetched
from neffcache.prune.model import PruneItem, Reason

if TYPE_CHECKING:
    from neffcache.index import Index
    from neffcache.stores.base import Store

MAX_HITS = 1 << 53  # a count beyond a double's exact integers is not a count


@dataclass(frozen=True)
class Recorded:
    compile_seconds: float | None = None
    hits: int = 0


def seconds_of(value: Any) -> float | None:
    """A compile time from untrusted input, or None when it is not a plausible one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS else None


def hits_of(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_HITS:
        return 0
    return value


def index_costs(index: Index | None, store_url: str, notes: list[str]) -> dict[str, Recorded]:
    """Entry path -> what the index recorded for entries of ``store_url``; empty (and a note)
    when it is down: the manifests then say what they can."""
    if index is None or not index.enabled:
        return {}
    out: dict[str, Recorded] = {}
    try:
        for row in prefetched(index.find_entries(store=store_url, page_size=1000)):
            path = row.get("path") if isinstance(row, dict) else None
            if isinstance(path, str):
                out[path] = Recorded(seconds_of(row.get("compile_seconds")), hits_of(row.get("hit_count")))
    except IndexServerError as exc:
        notes.append(f"index unreachable ({exc}): compile seconds from manifests only, no hit counts")
        return {}
    return out


def manifest_seconds(store: Store, entries: Iterable[Entry]) -> dict[str, float]:
    """Entry path -> the compile seconds its manifest records, for ``entries`` with a manifest.
    A manifest that is gone or does not parse records nothing."""
    wanted = [e for e in entries if e.has_manifest]

    def read(entry: Entry) -> tuple[str, float | None]:
        info = entry.files.get(entry.manifest_name)
        try:
            manifest = read_manifest(store, entry.store_path(entry.manifest_name),
                                     size=info.size if info is not None else None)
        except (EntryNotFound, CorruptEntry, InvalidKey, OSError):  # a name no store path may have: no cost known
            return entry.path, None
        return entry.path, seconds_of(manifest.compile_seconds)

    with ThreadPoolExecutor(8) as pool:
        return {path: s for path, s in pool.map(read, wanted) if s is not None}


def with_costs(store: Store, entries: Iterable[Entry], candidates: Mapping[str, PruneCandidate],
               index: Index | None, notes: list[str]) -> dict[str, PruneCandidate]:
    """``candidates`` with their compile seconds and hits. Only committed entries are costed:
    a size budget weighs nothing else."""
    recorded = index_costs(index, store.url, notes)
    committed = [e for e in entries if e.path in candidates and candidates[e.path].committed]
    unknown = [e for e in committed if recorded.get(e.path, Recorded()).compile_seconds is None]
    from_manifests = manifest_seconds(store, unknown)
    out = dict(candidates)
    for entry in committed:
        got = recorded.get(entry.path, Recorded())
        seconds = got.compile_seconds if got.compile_seconds is not None else from_manifests.get(entry.path)
        out[entry.path] = replace(candidates[entry.path], compile_seconds=seconds, hits=got.hits)
    return out


def with_recorded_costs(store: Store, entries: Iterable[Entry], items: list[PruneItem]) -> list[PruneItem]:
    """``items`` with the compile seconds the manifests of ``store``'s size evictions record,
    where the plan has none: LRU orders without them, so only its victims are read (what the
    plan shows for each, and what their tombstones keep for the regret). A score is
    proportional to the cost, so it is scaled with it."""
    wanted = {i.path for i in items if i.store == store.url and i.reason is Reason.SIZE
              and i.cost is not None and i.cost.compile_seconds is None}
    if not wanted:
        return items
    seconds = manifest_seconds(store, [e for e in entries if e.path in wanted])
    out = []
    for item in items:
        found = seconds.get(item.path) if item.store == store.url and item.path in wanted else None
        if found is None or item.cost is None:
            out.append(item)
            continue
        cost = replace(item.cost, compile_seconds=found, costed_seconds=found,
                       score=item.cost.score * found / item.cost.costed_seconds)
        out.append(replace(item, cost=cost))
    return out
