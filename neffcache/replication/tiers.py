"""Tiers: an ordered chain of stores, fastest first (local NVMe -> FSx -> S3).

Reads walk down the chain and promote what they find into every faster writable tier;
writes go to every writable tier; a tier that is down is reported and skipped, never fatal.

:class:`Tiers` is deliberately *not* a :class:`~neffcache.stores.base.Store`. A store is a
handful of file primitives with a crisp contract; a chain is about entries, and part of it
may be down. Behind ``put_file``/``stat`` it would have to lie: which tier answered ``stat``,
what ``put_file`` returns when two of three tiers took the file, how a caller learns that S3
was skipped. What its callers need is entry-level, and that is the whole API:

- a job's environment points at the first tier's directory: :attr:`Tiers.local`;
- a reader wants a verified local copy of one entry: :meth:`Tiers.get_entry`;
- a warmer publishes a new entry everywhere: :meth:`Tiers.publish`;
- the ``run`` wrapper prefetches a namespace before the job (:meth:`Tiers.prefetch`) and
  pushes the job's new local entries down afterwards (:meth:`Tiers.push_new`).

Every pull from a lower tier goes through :func:`neffcache.operations.ingest.transfer`: digests are
checked before the entry becomes visible above. A mismatch is reported (a :class:`TierProblem`
of kind ``corrupt``) and never served; the remote copy is left alone unless
``quarantine_remote=True`` (another host may be reading it, and a bad local disk on *this*
host can produce the same symptom). A failed write *above* (NoSpace, any error carrying the
target's URL) blames that tier, and a source rewritten mid-copy (SourceChanged) is a miss:
neither ever quarantines the healthy source. A tier that fails is skipped for ``down_for`` seconds so a
dead endpoint costs its timeout once, not on every lookup.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neffcache.entry import Entry, EntryState, Namespace
from neffcache.errors import (
    ConfigError,
    CorruptEntry,
    EntryNotFound,
    SourceChanged,
    StoreError,
    StoreUnavailable,
    UntrustedEntry,
)
from neffcache.layouts import entry_forms
from neffcache.manifest import Manifest
from neffcache.operations import claims
from neffcache.operations.ingest import transfer
from neffcache.operations.publish import PublishResult, publish
from neffcache.operations.verify import CheckStatus, check_entry, quarantine
from neffcache.outcomes import PublishStatus, TierOp, TierProblemKind
from neffcache.replication.sync import SyncReport, pull, push
from neffcache.scan.report import load_entry
from neffcache.stores import open_store
from neffcache.stores.base import FileSource, Store
from neffcache.trust import TrustPolicy

log = logging.getLogger(__name__)
# What "this tier is not working" looks like: unreachable, denied, or any store/OS failure.
TIER_ERRORS = (StoreError, OSError)


@dataclass(frozen=True)
class TierProblem:
    tier: str
    op: TierOp
    kind: TierProblemKind
    message: str
    path: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"tier": self.tier, "op": self.op, "kind": self.kind, "message": self.message, "path": self.path}


@dataclass
class Tier:
    url: str
    store: Store | None
    down_until: float = 0.0
    reason: str = ""

    @property
    def up(self) -> bool:
        return self.store is not None and time.monotonic() >= self.down_until

    @property
    def writable(self) -> bool:
        return self.store is not None and not self.store.read_only


@dataclass(frozen=True)
class TierHit:
    """An entry found in the chain, as it now lies in ``store`` (the fastest tier holding it)."""

    entry: Entry
    store: Store
    found_in: str
    promoted_to: tuple[str, ...] = ()
    problems: tuple[TierProblem, ...] = ()


@dataclass(frozen=True)
class TierPublish:
    results: tuple[tuple[str, PublishResult], ...]
    problems: tuple[TierProblem, ...] = ()

    @property
    def ok(self) -> bool:
        """Published (or already there) in at least one tier."""
        return any(r.status is not PublishStatus.BUSY for _, r in self.results)


@dataclass(frozen=True)
class ChainReport:
    """What prefetch / push_new did, tier by tier."""

    reports: tuple[SyncReport, ...]
    problems: tuple[TierProblem, ...] = ()

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.reports) and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"reports": [r.to_json() for r in self.reports], "problems": [p.to_json() for p in self.problems]}


@dataclass
class _Problems:
    items: list[TierProblem] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Tiers:
    def __init__(self, tiers: Sequence[Tier | Store], *, down_for: float = 60.0, quarantine_remote: bool = False,
                 busy_wait: float = 30.0, policy: TrustPolicy | None = None) -> None:
        if not tiers:
            raise ConfigError("a chain needs at least one tier")
        self.tiers = [t if isinstance(t, Tier) else Tier(t.url, t) for t in tiers]
        self.down_for = down_for
        self.quarantine_remote = quarantine_remote
        self.busy_wait = busy_wait
        # The reader's trust policy for entries from slower tiers (the first tier is the job's
        # own directory): one it refuses is a miss there, reported, never promoted.
        self.policy = policy
        self._problems = _Problems()

    @classmethod
    def open(cls, urls: Sequence[str], *, read_only: Collection[str] = (), endpoint_url: str | None = None,
             **kwargs: Any) -> Tiers:
        """The chain for ``urls`` (fastest first); tiers that cannot be opened start out down."""
        tiers: list[Tier] = []
        problems: list[TierProblem] = []
        for url in urls:
            options: dict[str, Any] = {"endpoint_url": endpoint_url} if endpoint_url and url.startswith("s3://") else {}
            try:
                store = open_store(url, read_only=url in read_only, **options)
                tiers.append(Tier(store.url, store))  # the store's own spelling: errors carry it
            except StoreUnavailable as exc:
                tiers.append(Tier(url, None, float("inf"), str(exc)))
                problems.append(TierProblem(url, TierOp.OPEN, TierProblemKind.DOWN, str(exc)))
                log.warning("tier %s is down: %s", url, exc)
        chain = cls(tiers, **kwargs)
        chain._problems.items.extend(problems)
        return chain

    # -- state --------------------------------------------------------------------------------
    @property
    def local(self) -> Store:
        """The first tier: where jobs read and write their cache directory."""
        first = self.tiers[0]
        if first.store is None:
            raise StoreUnavailable(f"the first tier {first.url} is down: {first.reason}", store=first.url)
        return first.store

    @property
    def problems(self) -> tuple[TierProblem, ...]:
        """Everything that went wrong since the chain was opened, oldest first."""
        with self._problems.lock:
            return tuple(self._problems.items)

    def _report(self, tier: Tier, op: TierOp, kind: TierProblemKind, message: str, path: str | None
                ) -> TierProblem:
        problem = TierProblem(tier.url, op, kind, message, path)
        with self._problems.lock:
            self._problems.items.append(problem)
        log.warning("tier %s: %s %s%s: %s", tier.url, op, kind, f" {path}" if path else "", message)
        return problem

    def _down(self, tier: Tier, op: TierOp, exc: BaseException, path: str | None = None) -> TierProblem:
        tier.down_until = time.monotonic() + self.down_for
        tier.reason = str(exc)
        return self._report(tier, op, TierProblemKind.DOWN, f"{type(exc).__name__}: {exc}", path)

    def _blame(self, exc: BaseException, *candidates: Tier) -> Tier:
        """Which tier an error came from (stores put their URL on the errors they raise)."""
        where = getattr(exc, "store", None)
        return next((t for t in candidates if t.url == where), candidates[0])

    # -- reads --------------------------------------------------------------------------------
    def get_entry(self, path: str) -> TierHit | None:
        """The SUCCESS entry ``path`` from the fastest tier that has it, promoted and verified.
        A tier holding it at another of its paths (:func:`~neffcache.layouts.entry_forms`: vLLM's
        flat shared form of a local-form path) holds it too."""
        problems: list[TierProblem] = []
        forms = entry_forms(path)
        for depth, tier in enumerate(self.tiers):
            if not tier.up:
                continue
            assert tier.store is not None
            try:
                entry = self._load_any(tier.store, forms)
            except TIER_ERRORS as exc:
                problems.append(self._down(tier, TierOp.GET, exc, path))
                continue
            if entry is None:
                continue
            if depth == 0:
                return TierHit(entry, tier.store, tier.url, (), tuple(problems))
            refusal = claims.distrust(self.policy, tier.store.url, entry) if self.policy is not None else None
            if refusal is not None:
                problems.append(self._report(tier, TierOp.GET, TierProblemKind.REFUSED, refusal, entry.path))
                continue
            hit = self._promote(tier, entry, self.tiers[:depth], problems)
            if hit is not None:
                return hit
        return None

    @staticmethod
    def _load_any(store: Store, forms: Sequence[str]) -> Entry | None:
        """The first SUCCESS entry at one of ``forms`` in ``store``."""
        for form in forms:
            entry = load_entry(store, form)
            if entry is not None and entry.state is EntryState.SUCCESS:
                return entry
        return None

    def _promote(self, source: Tier, entry: Entry, above: Sequence[Tier], problems: list[TierProblem]
                 ) -> TierHit | None:
        assert source.store is not None
        promoted: list[str] = []
        origin, local = source, entry
        for target in [t for t in above if t.up and t.writable]:
            assert target.store is not None and origin.store is not None
            try:
                result = transfer(origin.store, local, target.store,
                                  vet=claims.contradiction if self.policy is not None else None)
            except (CorruptEntry, UntrustedEntry) as exc:  # untrusted: its flags contradict its namespace
                corrupt = isinstance(exc, CorruptEntry)
                problems.append(self._report(origin, TierOp.PROMOTE, TierProblemKind.CORRUPT if corrupt else
                                             TierProblemKind.REFUSED, "; ".join(exc.problems), entry.path))
                if promoted:
                    continue
                if corrupt and self.quarantine_remote and not source.store.read_only:
                    quarantine(source.store, entry, why="failed its digests on a pull to a faster tier")
                return None
            except SourceChanged as exc:
                # Rewritten while we read it: not corrupt, never quarantined; a miss for now.
                problems.append(self._report(origin, TierOp.PROMOTE, TierProblemKind.CHANGED, str(exc), entry.path))
                if promoted:
                    continue
                return None
            except EntryNotFound:
                if promoted:
                    continue
                return None  # pruned under us: a miss in this tier
            except TIER_ERRORS as exc:
                culprit = self._blame(exc, origin, target)
                problems.append(self._down(culprit, TierOp.PROMOTE, exc, entry.path))
                if culprit is source:
                    return None
                continue
            # Where the copy landed: the layout's writers' path, which may be another form of
            # the entry's (vLLM's flat shared form).
            if result.status is PublishStatus.BUSY and not self._await_commit(target, result.path):
                problems.append(self._report(target, TierOp.PROMOTE, TierProblemKind.BUSY,
                                             "another process is publishing it", entry.path))
                continue
            fresh = self._load_any(target.store, entry_forms(result.path))
            if fresh is None or fresh.state is not EntryState.SUCCESS:
                continue
            promoted.append(target.url)
            if len(promoted) == 1:
                # Later (slower) tiers are filled from this fresh, verified copy, not from afar.
                origin, local = target, fresh
        if not promoted:
            # Nowhere to copy it (no writable tier above, or all of them down or busy): serve it
            # where it lies, but only after hashing (and, with a policy, judging) it there.
            check = check_entry(source.store, entry, self.policy)
            bad = {CheckStatus.CORRUPT: TierProblemKind.CORRUPT, CheckStatus.REFUSED: TierProblemKind.REFUSED,
                   CheckStatus.MISMATCH: TierProblemKind.REFUSED}.get(check.status)
            if bad is not None:
                problems.append(self._report(source, TierOp.GET, bad, "; ".join(check.problems), entry.path))
                return None
            return TierHit(entry, source.store, source.url, (), tuple(problems))
        assert origin.store is not None and local is not entry
        return TierHit(local, origin.store, source.url, tuple(promoted), tuple(problems))

    def _await_commit(self, tier: Tier, path: str) -> bool:
        assert tier.store is not None
        deadline = time.monotonic() + self.busy_wait
        while time.monotonic() < deadline:
            found = load_entry(tier.store, path, read_manifest=False)
            if found is not None and found.state is EntryState.SUCCESS:
                return True
            time.sleep(0.2)
        return False

    # -- writes -------------------------------------------------------------------------------
    def publish(self, namespace: Namespace, key: str, files: Mapping[str, FileSource], manifest: Manifest
                ) -> TierPublish:
        """Publish a new entry into every writable tier that is up, fastest first."""
        results: list[tuple[str, PublishResult]] = []
        problems: list[TierProblem] = []
        for tier in self.tiers:
            if not (tier.up and tier.writable):
                continue
            assert tier.store is not None
            try:
                results.append((tier.url, publish(tier.store, namespace, key, files, manifest)))
            except TIER_ERRORS as exc:
                problems.append(self._down(tier, TierOp.PUBLISH, exc, key))
        return TierPublish(tuple(results), tuple(problems))

    # -- bulk ---------------------------------------------------------------------------------
    def prefetch(self, **filters: Any) -> ChainReport:
        """Pull what the lower tiers hold (``sync`` filters: namespaces, tags...) into the first."""
        local = self.local
        reports: list[SyncReport] = []
        problems: list[TierProblem] = []
        for tier in self.tiers[1:]:
            if not tier.up:
                continue
            assert tier.store is not None
            try:
                reports.append(pull(tier.store, local, **filters))
            except TIER_ERRORS as exc:
                problems.append(self._down(self._blame(exc, tier, self.tiers[0]), TierOp.PREFETCH, exc))
        return ChainReport(tuple(reports), tuple(problems))

    def push_new(self, **filters: Any) -> ChainReport:
        """Push what the first tier holds and the writable lower tiers lack (``sync`` filters)."""
        local = self.local
        reports: list[SyncReport] = []
        problems: list[TierProblem] = []
        for tier in self.tiers[1:]:
            if not (tier.up and tier.writable):
                continue
            assert tier.store is not None
            try:
                reports.append(push(local, tier.store, **filters))
            except TIER_ERRORS as exc:
                problems.append(self._down(self._blame(exc, tier, self.tiers[0]), TierOp.PUSH, exc))
        return ChainReport(tuple(reports), tuple(problems))

    def close(self) -> None:
        for tier in self.tiers:
            if tier.store is not None:
                tier.store.close()

    def __enter__(self) -> Tiers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
