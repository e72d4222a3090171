"""Planning a prune: what no current toolchain can use, what nobody used, what breaks budgets,
failed compiles, stale locks and garbage — always as a plan first.

::

    from neffcache.prune import PrunePolicy, execute_plan, plan_prune

    plan = plan_prune([store], PrunePolicy(keep_compilers=("2.27.5334.0+f702b353",), garbage=True))
    print(plan.expected_freed_size, plan.by_toolchain())
    result = execute_plan(plan, [store])    # re-checks every item right before removing it

:func:`plan_prune` only reads: one listing per store (``scan``), the lease directory, the
last-use stamps, and — when an index is configured — the index's last hits. The rules live in
:mod:`neffcache.prune.rules` (entries) and :mod:`neffcache.prune.sweep` (locks, garbage);
execution in :mod:`neffcache.prune.execute`. The safety rules hold at execution time, not only
at planning time: an entry with a live lease, one published after the plan was made, one
changed since, or one used within the hit grace period (age and size reasons) is skipped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from neffcache.coordination.write_leases import publish_lease_name
from neffcache.entry import Entry, EntryState, FileInfo
from neffcache.errors import (
    ConfigError,
    CorruptEntry,
    EntryNotFound,
    IndexServerError,
    InvalidKey,
    ReadOnlyStore,
    StoreUnavailable,
)
from neffcache.manifest import read_manifest
from neffcache.prune.candidates import PruneCandidate, created_time, entry_item, index_usage, prefetched, with_failures
from neffcache.prune.costs import with_costs, with_recorded_costs
from neffcache.prune.guard import budget_guards, check_keep_filters, guard_plan
from neffcache.prune.model import (
    ALL_STORES,
    Foreign,
    ItemKind,
    Kept,
    LastUseBasis,
    PruneItem,
    PrunePlan,
    PrunePolicy,
    Reason,
)
from neffcache.prune.remove import read_journals
from neffcache.prune.rules import select_entries
from neffcache.prune.sweep import (
    LeaseFile,
    LockJudge,
    live_holders,
    read_leases,
    stamp_files,
    sweep_garbage,
    sweep_locks,
    sweep_retention,
)
from neffcache.prune.value import Retention
from neffcache.scan.report import ScanReport, entry_at, scan
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain, compiler_version

if TYPE_CHECKING:
    from neffcache.index import Index

CURRENT = "current"
FOREIGN_SHOWN = 5  # foreign paths a plan names per store


def resolve_keep_compilers(values: Iterable[str], *, compiler: str | os.PathLike[str] | None = None,
                           compiler_version_override: str | None = None) -> tuple[str, ...]:
    """``--keep-compiler`` values with ``current`` replaced by the installed compiler's version
    (``neuronx-cc --version``), or by ``compiler_version_override`` when one is named."""
    out: list[str] = []
    for value in values:
        version = (compiler_version_override or compiler_version(compiler)) if value == CURRENT else value
        if version not in out:
            out.append(version)
    return tuple(out)


def _manifest_toolchains(store: Store, entries: Sequence[Entry]) -> dict[str, Toolchain]:
    """Toolchains of entries whose directory does not say (bare layout-B roots), from their manifests."""
    wanted = [e for e in entries if not e.namespace.compiler_version and e.has_manifest]

    def read(entry: Entry) -> tuple[str, Toolchain | None]:
        try:
            manifest = read_manifest(store, entry.store_path(entry.manifest_name))
        except (EntryNotFound, CorruptEntry):
            return entry.path, None
        return entry.path, manifest.toolchain

    with ThreadPoolExecutor(8) as pool:
        return {path: tc for path, tc in pool.map(read, wanted) if tc is not None}


def _candidate(store: Store, entry: Entry, stamps: Mapping[str, FileInfo], usage: Mapping[str, float],
               live: Mapping[str, str], judge: LockJudge, toolchains: Mapping[str, Toolchain]) -> PruneCandidate:
    ns = entry.namespace
    version, target, lnc = ns.compiler_version, ns.target, ns.lnc
    tc = toolchains.get(entry.path)
    if not version and tc is not None:
        version, target, lnc = tc.compiler_version, tc.target, tc.lnc
    uses = []
    stamp = stamps.get(entry.path)
    if stamp is not None:
        uses.append((stamp.mtime, LastUseBasis.STAMP))
    if entry.path in usage and usage[entry.path] >= created_time(entry) - 1.0:
        # An index hit older than this commit was a hit of other bytes at this path (or a forged
        # record): it says nothing of this entry and must not age it.
        uses.append((usage[entry.path], LastUseBasis.INDEX))
    last_used, basis = max(uses) if uses else (None, LastUseBasis.CREATED)
    return PruneCandidate(
        store=store.url, path=entry.path, layout=entry.layout, compiler_version=version, target=target, lnc=lnc,
        state=entry.state, size=entry.size, created=created_time(entry), last_used=last_used, basis=basis,
        committed=entry.committed, files=tuple(sorted(entry.files.values(), key=lambda f: f.path)),
        stale_locks=entry.state is EntryState.LOCKED and judge.all_stale(entry),
        lease_holder=live.get(publish_lease_name(entry.path)) if live else None,  # most often no live lease
    )


def _store_entry(store: Store, path: object) -> tuple[Entry | None, str | None]:
    """The entry the store holds at an index row's ``path`` (listed now), or why there is none
    that counts. A row is a claim any write token can make, so only this listing is believed."""
    if not isinstance(path, str) or not path:
        return None, "a record with no entry path"
    try:
        entry = entry_at(path, store.iter_files, store.stat)
    except (StoreUnavailable, ReadOnlyStore):
        raise
    except (InvalidKey, OSError, ValueError) as exc:
        return None, f"{path}: {type(exc).__name__}: {exc}"
    if entry is None or entry.path != path:
        return None, None  # not in the store: a forged, stale or mistyped record
    return entry, None


def _index_candidates(index: Index, store: Store, policy: PrunePolicy, now: float,
                      draft: _Draft) -> list[PruneCandidate]:
    """Candidates named by the index's rows for ``store`` and confirmed by the store itself.

    The index saves the plan a listing of everything else (foreign files, other namespaces) and
    says when entries were last hit; it never says what exists or how big it is. Each named
    entry is listed in the store (in parallel) and the candidate is built from that listing, as
    a ``--source store`` plan builds it: path, toolchain (its namespace directory, or its
    manifest), state, size and commit time are the store's. A record the store does not back
    is counted in a note and never reaches a rule, so no record causes a deletion on its own.
    """
    usage: dict[str, float] = {}
    paths: list[object] = []
    for row in prefetched(index.find_entries(store=store.url, page_size=1000)):
        path = row.get("path")
        if path not in usage and path not in paths:
            paths.append(path)
        last_used = row.get("last_used")
        if isinstance(path, str) and isinstance(last_used, (int, float)):
            usage[path] = max(float(last_used), usage.get(path, 0.0))
    with ThreadPoolExecutor(16) as pool:
        found = list(pool.map(lambda p: _store_entry(store, p), paths))
    entries = [e for e, _ in found if e is not None]
    problems = [why for _, why in found if why]
    absent = sum(1 for e, why in found if e is None and not why)
    if absent:
        draft.notes.append(f"{store.url}: {absent} index records name entries not in the store: not counted "
                           "(reconcile forgets them)")
    draft.notes.extend(f"{store.url}: index record not checked, not counted: {why}" for why in problems[:20])
    toolchains = _manifest_toolchains(store, entries) if policy.prunes_compilers else {}
    judge = LockJudge(store, policy, now, {})
    mine = {e.path: _candidate(store, e, {}, usage, {}, judge, toolchains) for e in entries}
    return list(_weighed(store, entries, mine, policy, index, draft).values())


def _weighed(store: Store, entries: Sequence[Entry], mine: dict[str, PruneCandidate], policy: PrunePolicy,
             index: Index | None, draft: _Draft) -> dict[str, PruneCandidate]:
    """``mine`` with what losing each entry costs where the value policy will evict: a store
    within its budget has nothing to weigh, and weighing costs one manifest read per entry the
    index gives no compile time for. The entries are kept for ``--policy lru``, which reads
    only its victims' manifests once it has chosen them."""
    limit = policy.budget_for(store.url)
    if limit is None:
        return mine
    draft.entries[store.url] = [e for e in entries if e.committed]
    if policy.retention is Retention.VALUE and sum(c.size for c in mine.values() if c.committed) > limit:
        return with_costs(store, entries, mine, index, draft.notes)
    return mine


def _interrupted(store: Store, journals: Mapping[str, Mapping[str, list[str]]],
                 candidates: Mapping[str, PruneCandidate], plan_taken: set[str]) -> list[PruneItem | Kept]:
    """Entries a killed execution had started on: files left are a strict part of what it removed."""
    out: list[PruneItem | Kept] = []
    for journal, entries in journals.items():
        for path, files in entries.items():
            c = candidates.get(path)
            if c is None or path in plan_taken:
                continue
            left = {f.path for f in c.files}
            if left and left < set(files):
                if c.lease_holder:
                    out.append(Kept(store.url, path, Reason.INTERRUPTED, f"being published by {c.lease_holder}"))
                else:
                    plan_id = journal.rsplit("/", 1)[-1].split("-", 1)[0]
                    detail = f"left half-removed by an interrupted prune ({plan_id})"
                    out.append(entry_item(c, Reason.INTERRUPTED, detail))
                plan_taken.add(path)
    return out


def _bind(progress: Callable[[str, int], None] | None, url: str) -> Callable[[int], None] | None:
    if progress is None:
        return None
    return lambda n: progress(url, n)


@dataclass
class _Draft:
    """What the plan collects while it goes through the stores."""

    candidates: list[PruneCandidate] = field(default_factory=list)
    items: list[PruneItem] = field(default_factory=list)
    extra: list[PruneItem] = field(default_factory=list)  # loose items: files, locks, leases, uploads
    protected: list[Kept] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    journals: dict[str, tuple[str, ...]] = field(default_factory=dict)
    foreign: list[Foreign] = field(default_factory=list)
    entries: dict[str, list[Entry]] = field(default_factory=dict)  # committed, of stores with a budget


@dataclass
class _Listed:
    """One listed store, as the second pass (interrupted entries, garbage) needs it."""

    store: Store
    report: ScanReport
    stamps: dict[str, FileInfo]
    live: dict[str, str]
    candidates: dict[str, PruneCandidate]
    journals: dict[str, dict[str, list[str]]]


def _check_request(stores: Sequence[Store], policy: PrunePolicy, index: Index | None, source: str) -> None:
    if not policy.anything:
        raise ConfigError("nothing to prune: choose --keep-compiler/--keep-last, --older-than, --max-size, "
                          "--failed, --stale-locks or --garbage")
    if source not in ("store", "index"):
        raise ConfigError(f"unknown plan source {source!r} (store or index)")
    if source == "index" and (index is None or not index.enabled):
        raise ConfigError("a plan from the index needs an index server (NEFFCACHE_INDEX_URL)")
    if source == "index" and (policy.garbage or policy.stale_locks):
        raise ConfigError("--garbage and --stale-locks need a listing of the store: plan them with --source store")
    unknown = set(policy.max_size) - {s.url for s in stores} - {ALL_STORES}
    if unknown:
        raise ConfigError(f"--max-size names {', '.join(sorted(unknown))}, which is not among the --store URLs")


def _usage(store: Store, policy: PrunePolicy, index: Index | None, draft: _Draft) -> dict[str, float]:
    if not (policy.older_than is not None or policy.max_size) or index is None or not index.enabled:
        return {}
    try:
        return index_usage(index, store.url)
    except IndexServerError as exc:
        draft.notes.append(f"index unreachable ({exc}): last use from stamps only")
        return {}


def _list_store(store: Store, policy: PrunePolicy, index: Index | None, now: float, draft: _Draft,
                progress: Callable[[int], None] | None) -> _Listed:
    """One store's listing: its candidates, stale locks and what the second pass needs."""
    report = scan(store, progress=progress)
    draft.notes.extend(f"{store.url}: {w}" for w in report.warnings[:20])
    if report.foreign:
        draft.foreign.append(Foreign(store.url, len(report.foreign), report.foreign_size,
                                     tuple(f.path for f in report.foreign[:FOREIGN_SHOWN])))
    leases: list[LeaseFile] = read_leases(store, draft.notes)
    live = live_holders(leases, now)
    judge = LockJudge(store, policy, now, live)
    needs_usage = policy.older_than is not None or bool(policy.max_size)
    stamps = stamp_files(store, draft.notes) if needs_usage or policy.garbage else {}
    usage = _usage(store, policy, index, draft)
    toolchains = _manifest_toolchains(store, report.entries) if policy.prunes_compilers else {}
    mine = {e.path: _candidate(store, e, stamps, usage, live, judge, toolchains)
            for e in (*report.entries, *report.uncommitted)}
    if policy.failed:  # which failures are compiler errors and which the host's: their logs say
        mine = with_failures(store, report.entries, mine)
    mine = _weighed(store, report.entries, mine, policy, index, draft)
    draft.candidates.extend(mine.values())
    found = read_journals(store, draft.notes)
    draft.journals[store.url] = tuple(found)
    if policy.stale_locks:
        swept = sweep_locks(store, report, leases, judge, now, policy)
        draft.extra.extend(swept.items)
        draft.protected.extend(swept.protected)
    return _Listed(store, report, stamps, live, mine, found)


def _finish_store(listed: _Listed, policy: PrunePolicy, now: float, draft: _Draft) -> None:
    """One store's second pass, once the rules chose: interrupted entries and garbage."""
    store = listed.store
    taken = {i.path for i in draft.items if i.store == store.url}
    for got in _interrupted(store, listed.journals, listed.candidates, taken):
        if isinstance(got, PruneItem):
            draft.items.append(got)
        else:
            draft.protected.append(got)
    if policy.garbage:
        swept, uncommitted = sweep_garbage(store, listed.report, listed.stamps, listed.live, now, policy, taken)
        draft.items.extend(entry_item(listed.candidates[e.path], Reason.GARBAGE, "uncommitted write (no commit "
                                      "marker), older than the grace period") for e in uncommitted)
        draft.extra.extend(swept.items)
        draft.protected.extend(swept.protected)
        draft.notes.extend(swept.notes)
        draft.extra.extend(sweep_retention(store, now, policy, draft.notes))


def plan_prune(stores: Sequence[Store], policy: PrunePolicy, *, index: Index | None = None, source: str = "store",
               now: float | None = None, progress: Callable[[str, int], None] | None = None) -> PrunePlan:
    """Build the plan for ``stores`` (tiers, fastest first). Reads only; changes nothing.

    ``source="index"`` takes the entries from the index server instead of listing the stores
    (a bucket with millions of keys); garbage and stale locks need a listing and are refused.
    """
    _check_request(stores, policy, index, source)
    started = time.monotonic()
    now = time.time() if now is None else now
    draft = _Draft()
    listed: list[_Listed] = []
    for store in stores:
        if source == "index":
            assert index is not None
            draft.candidates.extend(_index_candidates(index, store, policy, now, draft))
        else:
            listed.append(_list_store(store, policy, index, now, draft, _bind(progress, store.url)))
    check_keep_filters(draft.candidates, policy)
    selection = select_entries(draft.candidates, policy, now, stores=[s.url for s in stores])
    draft.items.extend(selection.items)
    draft.protected.extend(selection.protected)
    draft.notes.extend(selection.notes)
    if policy.retention is Retention.LRU:
        for store in stores:
            draft.items = with_recorded_costs(store, draft.entries.get(store.url, ()), draft.items)
    for one in listed:
        _finish_store(one, policy, now, draft)
    # A lock inside an entry that goes anyway goes with it, as part of the entry.
    gone = {(i.store, i.path) for i in draft.items if i.kind is ItemKind.ENTRY}
    items = [*draft.items, *(i for i in draft.extra
                             if i.kind is not ItemKind.LOCK or (i.store, i.path.rpartition("/")[0]) not in gone)]
    return PrunePlan(stores=tuple(s.url for s in stores), items=tuple(items), created_at=now, policy=policy,
                     protected=tuple(draft.protected), budgets=tuple(selection.budgets), notes=tuple(draft.notes),
                     seconds=time.monotonic() - started, journals=draft.journals, foreign=tuple(draft.foreign),
                     guards=(*guard_plan(draft.candidates, items, policy), *budget_guards(selection.budgets, items)))
