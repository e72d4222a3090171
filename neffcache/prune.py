"""Pruning caches: what no current toolchain can use, what nobody used, what breaks budgets,
failed compiles, stale locks and garbage — always as a plan first.

::

    from neffcache.prune import PrunePolicy, plan_prune

    plan = plan_prune([store], PrunePolicy(keep_compilers=("2.27.5334.0+f702b353",), garbage=True))
    print(plan.expected_freed_size, plan.by_toolchain())
    result = plan.execute([store])          # re-checks every item right before removing it

:func:`plan_prune` only reads: one listing per store (``scan``), the lease directory, the
last-use stamps, and — when an index is configured — the index's last hits. The rules live in
:mod:`neffcache.prune_rules` (entries) and :mod:`neffcache.prune_sweep` (locks, garbage);
execution in :mod:`neffcache.prune_exec`. The safety rules hold at execution time, not only
at planning time: an entry with a live lease, one published after the plan was made, one
changed since, or one used within the hit grace period (age and size reasons) is skipped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from neffcache.entry import Entry, EntryState, FileInfo
from neffcache.errors import ConfigError, CorruptEntry, EntryNotFound, IndexServerError
from neffcache.layouts import LAYOUTS
from neffcache.layouts.base import DEFAULT_LAYOUT
from neffcache.manifest import read_manifest
from neffcache.prune_exec import PruneResult, Skipped, execute
from neffcache.prune_guard import Guard, check_keep_filters, guard_plan
from neffcache.prune_plan import (
    ALL_STORES,
    Basis,
    Budget,
    Foreign,
    ItemKind,
    Protected,
    PruneItem,
    PrunePlan,
    PrunePolicy,
    Reason,
)
from neffcache.prune_remove import delete_order, read_journals
from neffcache.prune_rules import (
    Candidate,
    created_time,
    entry_item,
    index_usage,
    prefetched,
    select_entries,
    version_key,
)
from neffcache.prune_sweep import (
    LockJudge,
    live_holders,
    read_leases,
    stamp_files,
    sweep_garbage,
    sweep_locks,
    sweep_retention,
)
from neffcache.publish import publish_lease_name
from neffcache.scan import ScanReport, scan
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain, compiler_version

if TYPE_CHECKING:
    from neffcache.index import Index

CURRENT = "current"
FOREIGN_SHOWN = 5  # foreign paths a plan names per store


def _namespace_version(namespace: str) -> str | None:
    return next((v for lay in LAYOUTS.values() if (v := lay.namespace_version(namespace))), None)


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
               live: Mapping[str, str], judge: LockJudge, toolchains: Mapping[str, Toolchain]) -> Candidate:
    ns = entry.namespace
    version, target, lnc = ns.compiler_version, ns.target, ns.lnc
    tc = toolchains.get(entry.path)
    if not version and tc is not None:
        version, target, lnc = tc.compiler_version, tc.target, tc.lnc
    uses = []
    stamp = stamps.get(entry.path)
    if stamp is not None:
        uses.append((stamp.mtime, Basis.STAMP))
    if entry.path in usage:
        uses.append((usage[entry.path], Basis.INDEX))
    last_used, basis = max(uses) if uses else (None, Basis.CREATED)
    return Candidate(
        store=store.url, path=entry.path, layout=entry.layout, compiler_version=version, target=target, lnc=lnc,
        state=entry.state, size=entry.size, created=created_time(entry), last_used=last_used, basis=basis,
        committed=entry.committed, files=tuple(sorted(entry.files.values(), key=lambda f: f.path)),
        stale_locks=entry.state is EntryState.LOCKED and judge.all_stale(entry),
        lease_holder=live.get(publish_lease_name(entry.path)),
    )


def _index_candidates(index: Index, url: str) -> list[Candidate]:
    """Candidates from the index's rows for ``url``: no listing of the store at all."""
    out = []
    for row in prefetched(index.find_entries(store=url, page_size=1000)):
        tc = row.get("toolchain") or {}
        version = tc.get("compiler_version") or _namespace_version(row.get("namespace") or "")
        last_used = row.get("last_used")
        out.append(Candidate(
            store=url, path=row["path"], layout=row.get("layout") or DEFAULT_LAYOUT, compiler_version=version,
            target=tc.get("target"), lnc=tc.get("lnc"), state=EntryState(row.get("state") or "SUCCESS"),
            size=int(row.get("size") or 0), created=float(row.get("created") or row.get("registered") or 0.0),
            last_used=float(last_used) if last_used is not None else None,
            basis=Basis.INDEX if last_used is not None else Basis.CREATED))
    return out


def _interrupted(store: Store, journals: Mapping[str, Mapping[str, list[str]]],
                 candidates: Mapping[str, Candidate], plan_taken: set[str]) -> list[PruneItem | Protected]:
    """Entries a killed execution had started on: files left are a strict part of what it removed."""
    out: list[PruneItem | Protected] = []
    for journal, entries in journals.items():
        for path, files in entries.items():
            c = candidates.get(path)
            if c is None or path in plan_taken:
                continue
            left = {f.path for f in c.files}
            if left and left < set(files):
                if c.lease_holder:
                    out.append(Protected(store.url, path, Reason.INTERRUPTED, f"being published by {c.lease_holder}"))
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


def plan_prune(stores: Sequence[Store], policy: PrunePolicy, *, index: Index | None = None, source: str = "store",
               now: float | None = None, progress: Callable[[str, int], None] | None = None) -> PrunePlan:
    """Build the plan for ``stores`` (tiers, fastest first). Reads only; changes nothing.

    ``source="index"`` takes the entries from the index server instead of listing the stores
    (a bucket with millions of keys); garbage and stale locks need a listing and are refused.
    """
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
    started = time.monotonic()
    now = time.time() if now is None else now
    needs_usage = policy.older_than is not None or bool(policy.max_size)
    candidates: list[Candidate] = []
    extra: list[PruneItem] = []
    protected: list[Protected] = []
    notes: list[str] = []
    journals: dict[str, tuple[str, ...]] = {}
    foreign: list[Foreign] = []
    listed: list[tuple[Store, ScanReport, dict[str, FileInfo], dict[str, str], dict[str, Candidate],
                       dict[str, dict[str, list[str]]]]] = []
    for store in stores:
        if source == "index":
            assert index is not None
            candidates.extend(_index_candidates(index, store.url))
            continue
        report = scan(store, progress=_bind(progress, store.url))
        notes.extend(f"{store.url}: {w}" for w in report.warnings[:20])
        if report.foreign:
            foreign.append(Foreign(store.url, len(report.foreign), report.foreign_size,
                                   tuple(f.path for f in report.foreign[:FOREIGN_SHOWN])))
        leases = read_leases(store)
        live = live_holders(leases, now)
        judge = LockJudge(store, policy, now, live)
        stamps = stamp_files(store) if needs_usage or policy.garbage else {}
        usage: dict[str, float] = {}
        if needs_usage and index is not None and index.enabled:
            try:
                usage = index_usage(index, store.url)
            except IndexServerError as exc:
                notes.append(f"index unreachable ({exc}): last use from stamps only")
        toolchains = _manifest_toolchains(store, report.entries) if policy.prunes_compilers else {}
        mine = {e.path: _candidate(store, e, stamps, usage, live, judge, toolchains)
                for e in (*report.entries, *report.uncommitted)}
        candidates.extend(mine.values())
        found = read_journals(store)
        journals[store.url] = tuple(found)
        if policy.stale_locks:
            swept = sweep_locks(store, report, leases, judge, now, policy)
            extra.extend(swept.items)
            protected.extend(swept.protected)
        listed.append((store, report, stamps, live, mine, found))
    check_keep_filters(candidates, policy)
    selection = select_entries(candidates, policy, now, stores=[s.url for s in stores])
    items: list[PruneItem] = list(selection.items)
    protected.extend(selection.protected)
    notes.extend(selection.notes)
    for store, report, stamps, live, mine, found in listed:
        taken = {i.path for i in items if i.store == store.url}
        for got in _interrupted(store, found, mine, taken):
            if isinstance(got, PruneItem):
                items.append(got)
            else:
                protected.append(got)
        if policy.garbage:
            swept, uncommitted = sweep_garbage(store, report, stamps, live, now, policy, taken)
            items.extend(entry_item(mine[e.path], Reason.GARBAGE, "uncommitted write (no commit marker), "
                                    "older than the grace period") for e in uncommitted)
            extra.extend(swept.items)
            protected.extend(swept.protected)
            notes.extend(swept.notes)
            extra.extend(sweep_retention(store, now, policy))
    # A lock inside an entry that goes anyway goes with it, as part of the entry.
    gone = {(i.store, i.path) for i in items if i.kind is ItemKind.ENTRY}
    items.extend(i for i in extra if i.kind is not ItemKind.LOCK or (i.store, i.path.rpartition("/")[0]) not in gone)
    return PrunePlan(stores=tuple(s.url for s in stores), items=tuple(items), created_at=now, policy=policy,
                     protected=tuple(protected), budgets=tuple(selection.budgets), notes=tuple(notes),
                     seconds=time.monotonic() - started, journals=journals, foreign=tuple(foreign),
                     guards=tuple(guard_plan(candidates, items, policy)))


__all__ = [
    "ALL_STORES", "CURRENT", "Basis", "Budget", "Foreign", "Guard", "ItemKind", "Protected", "PruneItem", "PrunePlan",
    "PrunePolicy", "PruneResult", "Reason", "Skipped", "delete_order", "execute", "plan_prune",
    "resolve_keep_compilers", "version_key",
]
