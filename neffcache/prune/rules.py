"""The rules that choose entries to prune: toolchain, age, size budget, failed (all, or by
class: compiler errors, environment failures, failures past the failure TTL).

Rules see :class:`~neffcache.prune.candidates.PruneCandidate` records, not store listings, so the
same rules run on a scan of a store or on the index server's rows. Each entry gets at most one
reason, the first rule that selects it in the order compiler, failed, age, size; the size
budget runs last because it depends on what the other rules leave behind, and evicts in the
order of :mod:`neffcache.prune.value` (lowest value density first, or least recently used).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from neffcache.entry import EntryState
from neffcache.failures import FailureClass
from neffcache.prune.candidates import PruneCandidate, entry_item
from neffcache.prune.model import Budget, Cost, FailedSelect, Kept, LastUseBasis, PruneItem, PrunePolicy, Reason, ago
from neffcache.prune.value import Retention, compile_seconds, eviction_order, score
from neffcache.toolchain import version_key

TargetLnc = tuple[str | None, int | None]  # (target, lnc); None where the root has no target directory


def kept_versions(candidates: Iterable[PruneCandidate], policy: PrunePolicy) -> dict[TargetLnc, set[str]]:
    """Per (target, lnc): the versions to keep. ``--keep-last`` counts each target's own versions,
    because trn1 and trn2 fleets move to a new compiler on their own schedules."""
    seen: dict[TargetLnc, set[str]] = defaultdict(set)
    for c in candidates:
        if c.compiler_version:
            seen[(c.target, c.lnc)].add(c.compiler_version)
    kept: dict[TargetLnc, set[str]] = {}
    for group, versions in seen.items():
        keep = {v for v in versions if v in policy.keep_compilers}
        if policy.keep_last is not None:
            keep |= set(sorted(versions, key=version_key, reverse=True)[: policy.keep_last])
        kept[group] = keep
    return kept


@dataclass
class Selection:
    items: list[PruneItem] = field(default_factory=list)
    protected: list[Kept] = field(default_factory=list)
    budgets: list[Budget] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def select_entries(candidates: Sequence[PruneCandidate], policy: PrunePolicy, now: float | None = None,
                   stores: Sequence[str] = ()) -> Selection:
    """Apply the entry rules to ``candidates`` (committed and uncommitted entries of every store)."""
    now = time.time() if now is None else now
    out = Selection()
    chosen: set[tuple[str, str]] = set()

    def guard(c: PruneCandidate, reason: Reason) -> bool:
        """True when a safety rule keeps ``c`` (and records why)."""
        why = None
        if c.lease_holder:
            why = f"being published by {c.lease_holder} (live lease)"
        elif c.state is EntryState.LOCKED and not c.stale_locks:
            why = "locked by a compile that may still run"
        elif reason in (Reason.AGE, Reason.SIZE) and c.last_used is not None and now - c.last_used < policy.hit_grace:
            why = f"used {ago(now - c.last_used)} ago, within the {ago(policy.hit_grace)} grace period"
        if why:
            out.protected.append(Kept(c.store, c.path, reason, why))
        return why is not None

    def take(c: PruneCandidate, reason: Reason, detail: str) -> None:
        if (c.store, c.path) in chosen or guard(c, reason):
            return
        chosen.add((c.store, c.path))
        out.items.append(entry_item(c, reason, detail))

    if policy.prunes_compilers:
        kept = kept_versions(candidates, policy)
        keeping = {group: ", ".join(sorted(keep, key=version_key)) or "none" for group, keep in kept.items()}
        unknown = 0
        for c in candidates:
            if not c.compiler_version:
                unknown += c.committed
                continue
            if c.compiler_version not in kept.get((c.target, c.lnc), ()):
                # Uncommitted leftovers of an obsolete namespace go with it: no grace needed, a
                # publish in flight holds its lease and is protected by it.
                names = keeping.get((c.target, c.lnc), "none")
                take(c, Reason.COMPILER, f"compiler {c.compiler_version} not kept (keeping {names})")
        if unknown:
            out.notes.append(f"{unknown} entries of unknown toolchain (runtime-written, no manifest, no "
                             "version directory) kept: compiler rules cannot tell what made them")
    committed = [c for c in candidates if c.committed]
    if policy.failed:
        _failed(committed, policy, now, take, out)
    if policy.older_than is not None:
        cutoff = now - policy.older_than
        for c in committed:
            if c.used < cutoff:
                what = "last used" if c.last_used is not None else "committed (no record of any use)"
                take(c, Reason.AGE, f"{what} {ago(now - c.used)} ago ({c.basis.value})")
    if policy.max_size:
        _budgets(committed, policy, now, stores, chosen, take, out)
    no_use = sum(1 for it in out.items if it.basis is LastUseBasis.CREATED)
    if no_use:
        out.notes.append(f"{no_use} entries have no last-use record (no stamp, no index hit): their age is "
                         "the time they were committed to the store")
    return out


def _failed(committed: Sequence[PruneCandidate], policy: PrunePolicy, now: float,
            take: Callable[[PruneCandidate, Reason, str], None], out: Selection) -> None:
    """``--failed all|compiler|environment|expired``: the FAILED entries of that kind. A class
    is known only from the failure log (a plan from the index has none): an entry whose class
    is unknown is kept by the class rules, and the plan says how many."""
    unknown = 0
    for c in committed:
        if c.state is not EntryState.FAILED:
            continue
        cls = c.failure_class
        sig = f", signature {c.failure_signature}" if c.failure_signature else ""
        what = f"{cls} failure{sig}" if cls else "cached failure"
        if policy.failed_select is FailedSelect.ALL:
            take(c, Reason.FAILED, f"{what} (the runtime skips it until retried)")
        elif policy.failed_select is FailedSelect.EXPIRED:
            assert policy.failed_ttl is not None  # PrunePolicy refuses expired without a TTL
            if now - c.created > policy.failed_ttl:
                take(c, Reason.FAILED, f"{what} recorded {ago(now - c.created)} ago, past the failure TTL "
                                       f"of {ago(policy.failed_ttl)}")
        elif cls is None:
            unknown += 1
        elif cls.value == policy.failed_select.value:
            why = ("the host failed the compile, not the graph" if cls is FailureClass.ENVIRONMENT
                   else "the compiler rejected the graph")
            take(c, Reason.FAILED, f"{what}: {why}")
    if unknown:
        out.notes.append(f"{unknown} failed entries kept: their failure logs were not read (a plan from the index), "
                         f"so whether they are {policy.failed_select} failures is unknown")


def _budgets(committed: Sequence[PruneCandidate], policy: PrunePolicy, now: float, stores: Sequence[str],
             chosen: set[tuple[str, str]], take: Callable[[PruneCandidate, Reason, str], None],
             out: Selection) -> None:
    """Evict in the policy's order (value.py) until each budgeted store fits; pinned graphs
    (``--pin-from-report``) stay, up to their cap. Entries other rules chose already count as
    gone: the budget weighs what they leave behind."""
    by_store: dict[str, list[PruneCandidate]] = defaultdict(list)
    for c in committed:
        by_store[c.store].append(c)
    for store in stores or sorted(by_store):
        limit = policy.budget_for(store)
        if limit is None:
            continue
        entries = by_store.get(store, [])
        before = sum(c.size for c in entries)
        size = sum(c.size for c in entries if (store, c.path) not in chosen)
        old = superseded(entries)
        pinned = _pinned(entries, policy, limit, old, out)
        for c in eviction_order(entries, policy.retention, policy.value, _among(old)):
            if size <= limit:
                break
            if (store, c.path) in chosen:
                continue
            if c.path in pinned:
                out.protected.append(Kept(store, c.path, Reason.SIZE, "pinned: a scheduled job needs it "
                                          "(--pin-from-report)"))
                continue
            take(c, Reason.SIZE, _why(c, policy, limit, now, c.path in old))
            if (store, c.path) in chosen:
                size -= c.size
                out.items[-1] = replace(out.items[-1], cost=_cost(c, policy, now, c.path in old))
        out.budgets.append(Budget(store, limit, before, size))
        if size > limit:
            out.notes.append(f"{store}: the budget of {limit} B cannot be met ({size} B stay): the rest is "
                             "protected (recent use, live lease, running compile or a pin)")
    costed = [it for it in out.items if it.cost is not None and it.cost.compile_seconds is None]
    if costed and policy.retention is Retention.VALUE:
        out.notes.append(f"{len(costed)} entries evicted for a budget have no recorded compile time (no manifest "
                         f"or index record says): costed at the default of "
                         f"{policy.value.default_compile_seconds:g} s")


def superseded(entries: Sequence[PruneCandidate]) -> set[str]:
    """Paths of entries of an older compiler than the newest of their target and LNC in the
    same store: after a compiler bump only jobs on the old image can still hit them."""
    newest: dict[TargetLnc, str] = {}
    for c in entries:
        if c.compiler_version:
            group = (c.target, c.lnc)
            if group not in newest or version_key(c.compiler_version) > version_key(newest[group]):
                newest[group] = c.compiler_version
    return {c.path for c in entries
            if c.compiler_version and c.compiler_version != newest[(c.target, c.lnc)]}


def _among(paths: set[str]) -> Callable[[PruneCandidate], bool]:
    return lambda c: c.path in paths


def _pinned(entries: Sequence[PruneCandidate], policy: PrunePolicy, limit: int, old: set[str],
            out: Selection) -> set[str]:
    """The pinned paths a budget keeps: the most valuable first, up to ``pin_max_share`` of
    the budget (a report naming everything must not turn the budget off)."""
    named = [c for c in entries if c.path in policy.pins]
    if not named:
        return set()
    cap = int(limit * policy.pin_max_share)
    kept: set[str] = set()
    used = 0
    for c in reversed(eviction_order(named, policy.retention, policy.value, lambda c: c.path in old)):
        if used + c.size <= cap:
            kept.add(c.path)
            used += c.size
    if len(kept) < len(named):
        out.notes.append(f"{len(named) - len(kept)} of {len(named)} pinned graphs in {entries[0].store} exceed "
                         f"the pin cap ({policy.pin_max_share:.0%} of the budget, {cap} B): ranked as usual")
    return kept


def _cost(c: PruneCandidate, policy: PrunePolicy, now: float, old: bool) -> Cost:
    return Cost(policy.retention, c.compile_seconds, compile_seconds(c, policy.value), c.hits,
                score(c, policy.value, now), c.used, old)


def _why(c: PruneCandidate, policy: PrunePolicy, limit: int, now: float, old: bool) -> str:
    used = f"last used {ago(now - c.used)} ago ({c.basis.value})"
    if policy.retention is Retention.LRU:
        return f"over the {limit} B budget, least recently used; {used}"
    seconds = compile_seconds(c, policy.value)
    recorded = f"{seconds:.0f} s compile" + ("" if c.compile_seconds is not None else " (default: not recorded)")
    return (f"over the {limit} B budget, lowest value: {score(c, policy.value, now):.3g} s/MiB ({recorded}, "
            f"{c.hits} hits, {used})" + ("; superseded toolchain" if old else ""))
