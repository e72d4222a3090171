"""The prune model, as data: the policy, the reasons, the items, the plan and its result.

A :class:`PrunePlan` lists every item it would remove with its reason, size, toolchain and
store (tier), the totals per reason, per toolchain and per tier, what it deliberately kept
(live leases, recent hits, locks of running compiles) and the guard rails it trips. Building
one changes nothing (:func:`neffcache.prune.plan.plan_prune`);
:func:`neffcache.prune.execute.execute_plan` is the only way to act on it, and execution
re-checks every item right before removing it. Everything here is a value: this module
imports nothing else of the package but the retention policy's values (``value``).
"""

from __future__ import annotations

import enum
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from neffcache.entry import FileInfo
from neffcache.errors import ConfigError
from neffcache.prune.value import Retention, ValuePolicy
from neffcache.toolchain import validate_version

DAY = 86400.0
ALL_STORES = "*"


def ago(seconds: float) -> str:
    """A duration for people: 45m, 7h, 30d."""
    if seconds >= 2 * DAY:
        return f"{seconds / DAY:.0f}d"
    if seconds >= 7200:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 60:.0f}m"



class FailedSelect(enum.StrEnum):
    """Which failed entries ``--failed`` removes (their failure logs say why they failed:
    :mod:`neffcache.failures`)."""

    ALL = "all"
    COMPILER = "compiler"  # compiler errors: what the runtime rightly skips
    ENVIRONMENT = "environment"  # the host failed them (Ctrl-C, an OOM kill...): the graph is fine
    EXPIRED = "expired"  # any failure older than the failure TTL (failed_ttl)


@dataclass(frozen=True)
class PrunePolicy:
    """What to prune. Rules are off unless asked for; the grace periods have safe defaults."""

    keep_compilers: tuple[str, ...] = ()  # compiler versions to keep (already resolved, no "current")
    keep_last: int | None = None  # keep the N newest compiler versions per target
    older_than: float | None = None  # seconds without use
    max_size: Mapping[str, int] = field(default_factory=dict)  # store URL (or "*") -> bytes
    failed: bool = False
    failed_select: FailedSelect = FailedSelect.ALL  # with ``failed``: which failures
    failed_ttl: float | None = None  # seconds: ``expired`` failures are older than this
    stale_locks: bool = False
    garbage: bool = False
    # A write younger than this may still be in flight: its temp files and uncommitted entries stay.
    grace: float = 3600.0
    # An entry used this recently is never pruned by age or size, whatever the plan said.
    hit_grace: float = 3600.0
    # A runtime's compile lock (no neffcache lease; the runtime never refreshes it) older than
    # this is taken as the leftover of a killed compile. Longer than the longest compile.
    lock_age: float = 6 * 3600.0
    # A plan removing more than this share of a store's entry bytes needs force (guard.py).
    max_share: float = 0.5
    # What --keep-compiler current resolved to: exempt from the "keep filter matches nothing" error.
    current: str | None = None
    # Quarantined entries older than this go with --garbage (reason quarantine-expired).
    quarantine_days: float = 30.0
    # What --max-size evicts first (value.py): lowest value density, or least recently used.
    retention: Retention = Retention.VALUE
    value: ValuePolicy = field(default_factory=ValuePolicy)
    # Entry paths a scheduled job needs (--pin-from-report): a budget keeps them whatever their
    # score, as long as they take at most pin_max_share of the budget.
    pins: frozenset[str] = frozenset()
    pin_max_share: float = 0.5

    def __post_init__(self) -> None:
        for version in self.keep_compilers:
            validate_version(version)
        if self.keep_last is not None and self.keep_last < 1:
            raise ConfigError("--keep-last must be at least 1 (to remove every toolchain, name none to keep)")
        for name in ("older_than", "grace", "hit_grace", "lock_age"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name.replace('_', '-')} cannot be negative")
        if not 0.0 <= self.max_share <= 1.0:
            raise ConfigError(f"--max-share must be between 0 and 1, not {self.max_share:g}")
        if not 0.0 <= self.pin_max_share <= 1.0:
            raise ConfigError(f"--pin-max-share must be between 0 and 1, not {self.pin_max_share:g}")
        if self.quarantine_days < 0:
            raise ConfigError("quarantine_days cannot be negative")
        if self.failed and self.failed_select is FailedSelect.EXPIRED and not self.failed_ttl:
            raise ConfigError("--failed expired needs the failure TTL: --failed-ttl 7d (or failed_ttl, "
                              "NEFFCACHE_FAILED_TTL)")
        for store, limit in self.max_size.items():
            if limit < 0:
                raise ConfigError(f"--max-size for {store} cannot be negative")

    @property
    def prunes_compilers(self) -> bool:
        return bool(self.keep_compilers) or self.keep_last is not None

    @property
    def selects_entries(self) -> bool:
        return self.prunes_compilers or self.older_than is not None or bool(self.max_size) or self.failed

    @property
    def anything(self) -> bool:
        return self.selects_entries or self.stale_locks or self.garbage

    def budget_for(self, store: str) -> int | None:
        return self.max_size.get(store, self.max_size.get(ALL_STORES))

    def to_json(self) -> dict[str, Any]:
        return {"keep_compilers": list(self.keep_compilers), "keep_last": self.keep_last,
                "older_than": self.older_than, "max_size": dict(self.max_size), "failed": self.failed,
                "failed_select": self.failed_select, "failed_ttl": self.failed_ttl,
                "stale_locks": self.stale_locks, "garbage": self.garbage, "grace": self.grace,
                "hit_grace": self.hit_grace, "lock_age": self.lock_age, "max_share": self.max_share,
                "current": self.current, "quarantine_days": self.quarantine_days,
                "retention": self.retention.value, "half_life": self.value.half_life,
                "default_compile_seconds": self.value.default_compile_seconds, "pins": len(self.pins),
                "pin_max_share": self.pin_max_share}



class Reason(enum.StrEnum):
    COMPILER = "compiler"  # a toolchain that is not kept
    AGE = "age"  # not used for longer than --older-than
    SIZE = "size"  # lowest value (or least recently used), over the tier's --max-size budget
    FAILED = "failed"  # a cached compiler failure
    STALE_LOCK = "stale-lock"  # a lease or runtime lock whose holder is gone
    GARBAGE = "garbage"  # neffcache's temp files, uncommitted writes, staging, stamps, aborted uploads
    INTERRUPTED = "interrupted"  # an entry a killed prune had started removing
    QUARANTINE_EXPIRED = "quarantine-expired"  # a quarantined file older than quarantine_days (--garbage)
    HISTORY_EXPIRED = "history-expired"  # an action record older than the journal's retention (--garbage)


class ItemKind(enum.StrEnum):
    ENTRY = "entry"  # a whole entry: commit marker first, then blobs, then the anchor file
    FILE = "file"  # one loose file of neffcache's (temp file, staging, stamp of a removed entry)
    LOCK = "lock"  # a runtime lock file inside an entry (the entry itself stays)
    LEASE = "lease"  # a neffcache lease file past its expiry or of a dead holder
    UPLOAD = "upload"  # an S3 multipart upload nobody completed


class LastUseBasis(enum.StrEnum):
    """Where an entry's last use came from (age and size reasons only)."""

    STAMP = "stamp"  # neffcache's per-entry stamp in the store
    INDEX = "index"  # the index server's last hit
    CREATED = "created"  # no record of any use: the time the entry was committed to this store


@dataclass(frozen=True)
class PruneItem:
    store: str  # the store URL (tier) that holds it
    path: str  # entry path, file path, lease file path or upload key
    kind: ItemKind
    reason: Reason
    size: int
    detail: str
    toolchain: str = "-"
    layout: str | None = None
    state: str | None = None
    files: tuple[FileInfo, ...] = ()  # what the plan saw: execution skips the item if this changed
    last_used: float | None = None
    basis: LastUseBasis | None = None
    token: str | None = None  # the lease token or S3 upload id the plan saw
    # Size reason only: what the budget weighed (value.py). ``compile_seconds`` is the recorded
    # time (None: not recorded, costed at the policy's default); ``score`` the value density.
    cost: Cost | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "store": self.store, "path": self.path, "kind": self.kind.value, "reason": self.reason.value,
            "bytes": self.size, "detail": self.detail, "toolchain": self.toolchain, "layout": self.layout,
            "state": self.state, "last_used": self.last_used,
            "basis": self.basis.value if self.basis else None,
        }
        if self.cost is not None:
            out.update(self.cost.to_json())
        return out


@dataclass(frozen=True)
class Cost:
    """What a size budget weighed for one evicted entry."""

    policy: Retention
    compile_seconds: float | None  # recorded; None: costed at ``costed_seconds``, the default
    costed_seconds: float
    hits: int
    score: float  # value density: expected recompute seconds avoided per MiB (value.score)
    used: float  # the last use the policy weighed (the commit time when no use is recorded)
    superseded: bool = False  # of an older toolchain than the newest of its target

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy.value, "compile_seconds": self.compile_seconds,
                "compile_seconds_default": self.compile_seconds is None, "costed_seconds": self.costed_seconds,
                "hits": self.hits, "score": self.score, "weighed_use": self.used, "superseded": self.superseded}


@dataclass(frozen=True)
class Kept:
    """An item a rule selected but that stays, and why: kept by a safety rule when planning
    (a live lease, a recent hit, a running compile), skipped by the re-check when executing
    (changed since the plan, gone already), or failed when its removal was attempted."""

    store: str
    path: str
    reason: Reason
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "path": self.path, "reason": self.reason.value, "why": self.why}


class Rule(enum.StrEnum):
    """The guard rails a plan may trip (see :mod:`neffcache.prune.guard`)."""

    EMPTIES_STORE = "empties-store"
    EMPTIES_NEWEST = "empties-newest-toolchain"
    MAX_SHARE = "max-share"
    BUDGET_UNMET = "budget-unmet"


@dataclass(frozen=True)
class Guard:
    """One rule a plan trips on one store, with its numbers."""

    store: str
    rule: str
    message: str
    entries: int  # entries the plan removes (that the rule counts)
    of_entries: int  # entries the rule counts in the store (or the toolchain)
    bytes: int
    of_bytes: int
    toolchain: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "rule": self.rule, "message": self.message, "entries": self.entries,
                "of_entries": self.of_entries, "bytes": self.bytes, "of_bytes": self.of_bytes,
                "share": round(self.bytes / self.of_bytes, 4) if self.of_bytes else None,
                "toolchain": self.toolchain}


@dataclass(frozen=True)
class Budget:
    """One tier's size budget and how the plan meets it."""

    store: str
    limit: int
    size_before: int  # committed entries before the plan
    size_after: int  # what stays if the plan runs

    @property
    def met(self) -> bool:
        return self.size_after <= self.limit


@dataclass(frozen=True)
class Subtotal:
    """A plan's items of one reason, toolchain or store: how many, and their bytes."""

    items: int
    bytes: int


def _group(items: Iterable[PruneItem], key: Callable[[PruneItem], str]) -> dict[str, Subtotal]:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for item in items:
        slot = counts[key(item)]
        slot[0] += 1
        slot[1] += item.size
    return {k: Subtotal(v[0], v[1]) for k, v in sorted(counts.items())}


@dataclass(frozen=True)
class Foreign:
    """Files of one store that no layout classified and neffcache did not write: other tools'
    (optimum-neuron's registry, nested traced models, NxD's files) or unknown. Reported, kept:
    no rule and no flag removes them."""

    store: str
    files: int
    bytes: int
    paths: tuple[str, ...]  # the first few, for the plan's text


@dataclass(frozen=True)
class PrunePlan:
    """An immutable list of what to remove, and why. ``execute_plan`` acts on it."""

    stores: tuple[str, ...]
    items: tuple[PruneItem, ...]
    created_at: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    policy: PrunePolicy = field(default_factory=PrunePolicy)
    protected: tuple[Kept, ...] = ()
    budgets: tuple[Budget, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    # Journals of killed executions this plan finishes (store URL -> journal paths): the
    # execution removes them once their entries are done.
    journals: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    foreign: tuple[Foreign, ...] = ()  # per listed store with foreign files: kept, never removed
    # The guard rails this plan trips (guard.py): executing it then needs force=True.
    guards: tuple[Guard, ...] = ()

    @property
    def expected_freed_size(self) -> int:
        return sum(item.size for item in self.items)

    @property
    def entries(self) -> int:
        return sum(1 for item in self.items if item.kind is ItemKind.ENTRY)

    def by_reason(self) -> dict[str, Subtotal]:
        return _group(self.items, lambda i: i.reason.value)

    def by_toolchain(self) -> dict[str, Subtotal]:
        return _group(self.items, lambda i: i.toolchain)

    def by_store(self) -> dict[str, Subtotal]:
        return _group(self.items, lambda i: i.store)

    def for_store(self, url: str) -> list[PruneItem]:
        return [item for item in self.items if item.store == url]

    def to_json(self, *, items: bool = True) -> dict[str, Any]:
        def groups(data: dict[str, Subtotal]) -> dict[str, dict[str, int]]:
            return {k: {"items": g.items, "bytes": g.bytes} for k, g in data.items()}

        out: dict[str, Any] = {
            "id": self.id, "created_at": self.created_at, "stores": list(self.stores),
            "policy": self.policy.to_json(), "expected_freed_bytes": self.expected_freed_size,
            "entries": self.entries, "item_count": len(self.items),
            "by_reason": groups(self.by_reason()), "by_toolchain": groups(self.by_toolchain()),
            "by_store": groups(self.by_store()),
            "budgets": [{"store": b.store, "limit": b.limit, "size_before": b.size_before,
                         "size_after": b.size_after, "met": b.met} for b in self.budgets],
            "protected": [p.to_json() for p in self.protected],
            "notes": list(self.notes), "seconds": round(self.seconds, 3),
            "foreign": [{"store": f.store, "files": f.files, "bytes": f.bytes, "paths": list(f.paths)}
                        for f in self.foreign],
            "guard": [g.to_json() for g in self.guards],
        }
        if items:
            out["items"] = [item.to_json() for item in self.items]
        return out


@dataclass(frozen=True)
class PruneResult:
    plan_id: str
    removed: tuple[PruneItem, ...]
    skipped: tuple[Kept, ...]
    seconds: float
    # Items whose removal failed (an undeletable file, a name no store path may have): the rest
    # were done; ``why`` says what stopped these. A failed entry may be left half-removed, which
    # reads as uncommitted (never served); the next ``prune --garbage`` finds it again.
    failed: tuple[Kept, ...] = ()

    @property
    def freed_bytes(self) -> int:
        return sum(item.size for item in self.removed)

    def to_json(self, *, items: bool = True) -> dict[str, Any]:
        by_reason: dict[str, dict[str, int]] = {}
        for item in self.removed:
            slot = by_reason.setdefault(item.reason.value, {"items": 0, "bytes": 0})
            slot["items"] += 1
            slot["bytes"] += item.size
        out: dict[str, Any] = {
            "plan": self.plan_id, "freed_bytes": self.freed_bytes, "removed": len(self.removed),
            "removed_entries": sum(1 for i in self.removed if i.kind is ItemKind.ENTRY),
            "by_reason": by_reason, "skipped": [s.to_json() for s in self.skipped],
            "failed": [s.to_json() for s in self.failed], "seconds": round(self.seconds, 3),
        }
        if items:
            out["removed_items"] = [{"store": i.store, "path": i.path, "reason": i.reason.value, "bytes": i.size}
                                    for i in self.removed]
        return out
