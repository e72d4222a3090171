"""What the rules see: one :class:`PruneCandidate` per entry of a store, from a listing or from the
index server's rows, and the index's record of last use.

The same rules (:mod:`neffcache.prune.rules`) run on candidates of either source, so nothing
here lists a store: the plan builds candidates from its scan (:mod:`neffcache.prune.plan`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from queue import Queue
from typing import TYPE_CHECKING, Any, TypeVar

from neffcache.entry import Entry, EntryState, FileInfo
from neffcache.failures import FailureClass
from neffcache.operations.failed import failed_graphs
from neffcache.prune.model import ItemKind, LastUseBasis, PruneItem, Reason

if TYPE_CHECKING:
    from neffcache.index import Index
    from neffcache.stores.base import Store

T = TypeVar("T")


@dataclass(frozen=True)
class PruneCandidate:
    """One entry of one store, as the rules see it."""

    store: str
    path: str
    layout: str
    compiler_version: str | None
    target: str | None
    lnc: int | None
    state: EntryState
    size: int
    created: float  # when it was committed to this store (the commit marker's mtime)
    last_used: float | None = None  # the newest of its stamp and its index record
    basis: LastUseBasis = LastUseBasis.CREATED
    committed: bool = True
    files: tuple[FileInfo, ...] = ()  # empty for candidates from the index (no listing)
    stale_locks: bool = False  # LOCKED only by locks the stale-lock rule would remove
    lease_holder: str | None = None  # owner of a live publish lease on it, if any
    # FAILED entries: who failed the compile, from the failure log (None: not read, e.g. a plan
    # from the index, which keeps no logs); and its signature.
    failure_class: FailureClass | None = None
    failure_signature: str = ""
    # What losing it costs (costs.py; read only for a size budget's value policy): the recorded
    # compile seconds (None: none recorded) and the hits the index counted.
    compile_seconds: float | None = None
    hits: int = 0

    @property
    def used(self) -> float:
        return self.last_used if self.last_used is not None else self.created

    @property
    def toolchain(self) -> str:
        return toolchain_label(self.compiler_version, self.target, self.lnc)


def toolchain_label(version: str | None, target: str | None, lnc: int | None) -> str:
    if not version:
        return "(unknown toolchain)"
    where = f"{target} lnc={lnc}" if target else "(target not recorded)"
    return f"neuronxcc-{version} {where}"


def with_failures(store: Store, entries: Iterable[Entry],
                  candidates: dict[str, PruneCandidate]) -> dict[str, PruneCandidate]:
    """``candidates`` with the FAILED ones' failure class and signature, read from their
    failure logs (one small read each, in parallel): what ``--failed compiler|environment``
    selects by."""
    out = dict(candidates)
    for failed in failed_graphs(store, [e for e in entries if e.path in candidates]):
        c = out[failed.path]
        out[failed.path] = replace(c, failure_class=failed.verdict.failure_class, failure_signature=failed.signature)
    return out


def created_time(entry: Entry) -> float:
    marker = entry.files.get(entry.marker_name)
    return marker.mtime if marker is not None else entry.mtime


def entry_item(c: PruneCandidate, reason: Reason, detail: str) -> PruneItem:
    with_use = reason in (Reason.AGE, Reason.SIZE)
    return PruneItem(c.store, c.path, ItemKind.ENTRY, reason, c.size, detail, c.toolchain, c.layout,
                     c.state.value if c.committed else "UNCOMMITTED", c.files,
                     c.last_used if with_use else None, c.basis if with_use else None)


def prefetched(rows: Iterator[T], depth: int = 4000) -> Iterator[T]:
    """``rows`` read ahead by a thread: the next index page is on its way while this one is used."""
    queue: Queue[tuple[bool, Any]] = Queue(maxsize=depth)

    def pump() -> None:
        try:
            for row in rows:
                queue.put((True, row))
        except BaseException as exc:  # handed to the consumer, raised there
            queue.put((False, exc))
            return
        queue.put((False, None))

    threading.Thread(target=pump, name="neffcache-index-pages", daemon=True).start()
    while True:
        ok, item = queue.get()
        if ok:
            yield item
        elif item is None:
            return
        else:
            raise item


def index_usage(index: Index | None, store_url: str) -> dict[str, float]:
    """Entry path -> last hit the index recorded for entries of ``store_url`` (raises when down)."""
    if index is None or not index.enabled:
        return {}
    return {row["path"]: float(row["last_used"])
            for row in prefetched(index.find_entries(store=store_url, page_size=1000))
            if row.get("last_used") is not None}
