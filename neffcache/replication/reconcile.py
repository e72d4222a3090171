"""Comparing the index server's catalog with what the stores hold, and fixing the index.

The two drift apart for ordinary reasons: a runtime writes entries the index never hears of,
an evict event is lost, an operator deletes a directory by hand, a publish happens while the
index is down and its spool is wiped. :func:`plan_reconcile` lists, per store,

- entries the index says the store holds but the store does not (fix: forget that location),
- entries the store holds that the index does not list for it (fix: register them),
- entries both know but record in different states (fix: register them again);

as a frozen plan, like a prune: :meth:`ReconcilePlan.execute` applies the fixes. The stores'
entries are never changed: a store is the truth about its own bytes, the index is a catalog of it.

That truth has one trap: a store that is *not there* looks empty. An FSx mount that did not come
up, a mistyped path or prefix, a bucket with the wrong credentials listing nothing: each would
make every record of that store "missing in the store", and ``--yes`` would forget them all,
blinding every job's lookups and ``plan``. So the forgetting side has the prune's guard rails
(:func:`guard_forgets`): a plan that forgets every record of a store whose scan found no entry,
or more than ``max_share`` of a store's records, is refused (:class:`~neffcache.errors.RefusedPlan`)
unless forced. Registering never loses anything and is never refused. What a reconcile forgot
is journalled in each store's action history (``prune --history`` shows it), like a prune.

The index is reached through :class:`IndexCatalog`, the four calls used here, so anything
with those methods (the HTTP client, a test double) can stand in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from neffcache.coordination.history import ActionItem, record
from neffcache.entry import Entry
from neffcache.errors import (
    ConfigError,
    CorruptEntry,
    EntryNotFound,
    InvalidKey,
    NeffcacheError,
    ReadOnlyStore,
    RefusedPlan,
    StoreUnavailable,
)
from neffcache.index.records import EntryRecord, entry_record
from neffcache.keys import is_canonical_relpath
from neffcache.manifest import Manifest, read_manifest
from neffcache.scan.report import scan
from neffcache.stores.base import Store
from neffcache.units import plural

FIXES = ("both", "forget", "register")
DEFAULT_MAX_SHARE = 0.5  # as prune's --max-share: forgetting more of a store's records needs --force


class IndexCatalog(Protocol):
    @property
    def url(self) -> str | None: ...

    def find_entries(self, *, page_size: int = 500, **filters: Any) -> Iterator[dict[str, Any]]: ...

    def forget(self, path: str, store: str | None = None) -> dict[str, Any] | None: ...

    def register_entries(self, records: Iterable[EntryRecord]) -> None: ...

    def flush(self) -> Any: ...


@dataclass(frozen=True)
class Mismatch:
    store: str
    path: str
    detail: str
    record: EntryRecord | None = None  # what registering would send


@dataclass(frozen=True)
class ReconcileResult:
    forgotten: int
    registered: int
    errors: tuple[str, ...] = ()

    def summary(self) -> str:
        text = (f"index fixed: {plural(self.forgotten, 'record')} forgotten, "
                f"{plural(self.registered, 'entry')} registered")
        return text + (f"; {len(self.errors)} errors: {self.errors[0]}" if self.errors else "")

    def to_json(self) -> dict[str, Any]:
        return {"forgotten": self.forgotten, "registered": self.registered, "errors": list(self.errors)}


@dataclass(frozen=True)
class ReconcilePlan:
    stores: tuple[str, ...]
    index: str
    matched: int
    missing_in_store: tuple[Mismatch, ...]
    missing_in_index: tuple[Mismatch, ...]
    differ: tuple[Mismatch, ...]
    fix: str = "both"
    created_at: float = field(default_factory=time.time)
    guards: tuple[str, ...] = ()  # why forgetting looks like a mistake (one line per store it trips on)
    # Entries whose names no index record may have (``MODULE_1 (copy)+…``, bytes that are not
    # UTF-8): reported per entry, never sent (one would get the whole batch refused).
    unaddressable: tuple[Mismatch, ...] = ()

    @property
    def to_forget(self) -> tuple[Mismatch, ...]:
        return self.missing_in_store if self.fix in ("both", "forget") else ()

    @property
    def to_register(self) -> tuple[Mismatch, ...]:
        return self.missing_in_index + self.differ if self.fix in ("both", "register") else ()

    @property
    def fixes(self) -> int:
        return len(self.to_forget) + len(self.to_register)

    def execute(self, index: IndexCatalog, *, force: bool = False,
                journal: Sequence[Store] = ()) -> ReconcileResult:
        """Apply the fixes. Registrations are reports (spooled if the index is down); a forget is a
        question and its failure is listed, not raised, so one bad record does not stop the rest.
        A plan with guards raises RefusedPlan, changing nothing, unless ``force``. The forgets
        are journalled in the stores of ``journal`` they concern (matched by URL)."""
        if self.guards and self.to_forget and not force:
            raise RefusedPlan("reconcile refused: " + "; ".join(self.guards)
                              + ". Nothing was changed: check the store is mounted and its URL right, or "
                              "add --force to forget them anyway", tuple(self.guards))
        forgotten: list[Mismatch] = []
        errors: list[str] = []
        for m in self.to_forget:
            try:
                if index.forget(m.path, store=m.store) is not None:
                    forgotten.append(m)
            except (NeffcacheError, OSError) as exc:  # reported per record; the rest still runs
                errors.append(f"{m.path}: {exc}")
        records = [m.record for m in self.to_register if m.record is not None]
        for start in range(0, len(records), 500):
            index.register_entries(records[start:start + 500])
        index.flush()
        self._journal(forgotten, journal, force)
        return ReconcileResult(len(forgotten), len(records), tuple(errors))

    def _journal(self, forgotten: Sequence[Mismatch], stores: Sequence[Store], force: bool) -> None:
        by_url = {s.url: s for s in stores}
        for url in dict.fromkeys(m.store for m in forgotten):
            if url in by_url:
                items = [ActionItem(m.path, "index-record-forgotten", 0, m.detail) for m in forgotten if m.store == url]
                record(by_url[url], "reconcile", f"index {self.index}: records no file backs forgotten",
                       items, details={"forced": force, "guards": list(self.guards)})

    def to_json(self) -> dict[str, Any]:
        def rows(items: Sequence[Mismatch]) -> list[dict[str, str]]:
            return [{"store": m.store, "path": m.path, "detail": m.detail} for m in items]

        return {"stores": list(self.stores), "index": self.index, "matched": self.matched, "fix": self.fix,
                "guards": list(self.guards),
                "missing_in_store": rows(self.missing_in_store), "missing_in_index": rows(self.missing_in_index),
                "differ": rows(self.differ), "unaddressable": rows(self.unaddressable), "fixes": self.fixes}


def _with_manifests(store: Store, entries: Sequence[Entry]) -> dict[str, Manifest | None]:
    def read(entry: Entry) -> tuple[str, Manifest | None]:
        if not entry.has_manifest:
            return entry.path, None
        try:
            return entry.path, read_manifest(store, entry.store_path(entry.manifest_name))
        except (StoreUnavailable, ReadOnlyStore):
            raise
        except (EntryNotFound, CorruptEntry, InvalidKey, OSError):  # one entry's problem: registered without
            return entry.path, None

    with ThreadPoolExecutor(8) as pool:
        return dict(pool.map(read, entries))


def guard_forgets(store_url: str, listed: int, held: int, forgets: int, max_share: float) -> str | None:
    """Why forgetting ``forgets`` of the ``listed`` index records of a store whose scan found
    ``held`` entries looks like a mistake, or None. A store that lists nothing while the index
    knows entries there is most likely not mounted (or a wrong URL), not emptied."""
    if not forgets:
        return None
    if held == 0:
        return (f"{store_url} holds no entry while the index lists {listed} there: an unmounted store or a "
                "wrong URL would forget them all")
    if forgets > max_share * listed:
        return (f"it would forget {forgets} of the {listed} records of {store_url} "
                f"({forgets / listed:.0%}, more than --max-share {max_share:.0%})")
    return None


def plan_reconcile(stores: Sequence[Store], index: IndexCatalog, *, fix: str = "both",
                   progress: Callable[[int], None] | None = None,
                   max_share: float = DEFAULT_MAX_SHARE) -> ReconcilePlan:
    """Compare ``index`` with ``stores``. Reads only (manifests only of entries to register)."""
    if fix not in FIXES:
        raise ConfigError(f"--fix must be one of {', '.join(FIXES)}")
    if not 0.0 <= max_share <= 1.0:
        raise ConfigError(f"--max-share must be from 0 to 1, not {max_share!r}")
    guards: list[str] = []
    matched = 0
    missing_store: list[Mismatch] = []
    missing_index: list[Mismatch] = []
    differ: list[Mismatch] = []
    odd: list[Mismatch] = []
    for store in stores:
        rows: Mapping[str, dict[str, Any]] = {row["path"]: row for row in index.find_entries(store=store.url,
                                                                                              page_size=1000)}
        report = scan(store, progress=progress)
        held = {e.path: e for e in report.entries}
        gone = [Mismatch(store.url, path, f"{row.get('state')} entry, {row.get('size')} B, not in the store")
                for path, row in sorted(rows.items()) if path not in held]
        missing_store.extend(gone)
        guard = guard_forgets(store.url, len(rows), len(held), len(gone), max_share)
        if guard is not None:
            guards.append(guard)
        register: list[tuple[Entry, str]] = []
        for path, entry in held.items():
            known = rows.get(path)
            if not is_canonical_relpath(path):
                odd.append(Mismatch(store.url, path, "a name no index record may have (characters outside "
                                                     "[A-Za-z0-9_.+=@,-]): not registered"))
            elif known is None:
                register.append((entry, f"{entry.state.value} entry ({entry.layout}) unknown to the index"))
            elif known.get("state") != entry.state.value:
                detail = f"index says {known.get('state')}, the store holds a {entry.state.value} entry"
                register.append((entry, detail))
            else:
                matched += 1
        manifests = _with_manifests(store, [e for e, _ in register])
        for entry, detail in sorted(register, key=lambda pair: pair[0].path):
            mismatch = Mismatch(store.url, entry.path, detail, entry_record(entry, store.url, manifests[entry.path]))
            (differ if entry.path in rows else missing_index).append(mismatch)
    return ReconcilePlan(tuple(s.url for s in stores), str(index.url or "(index)"), matched,
                         tuple(missing_store), tuple(missing_index), tuple(differ), fix, guards=tuple(guards),
                         unaddressable=tuple(odd))
