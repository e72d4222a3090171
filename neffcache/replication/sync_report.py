"""What a sync copies and what it reports: the entry filter, the outcomes, the report.

:func:`neffcache.replication.sync.sync` decides per source entry (a
:class:`~neffcache.outcomes.TransferOutcome`: filtered out, skipped, copied, failed) and
copies on worker threads; the outcomes are collected in a :class:`Tally` under a lock and
returned as one frozen :class:`SyncReport`, which the CLI renders and ``--json`` prints. Kept
apart from the copying so the report's shape can be read (and rendered) without the machinery.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from neffcache.entry import Entry, EntryState
from neffcache.errors import ConfigError
from neffcache.keys import safe_relpath
from neffcache.manifest import Manifest
from neffcache.outcomes import TransferOutcome
from neffcache.stores.base import Store
from neffcache.trust import TrustPolicy

SyncProgress = Callable[[int, int, int], None]  # (entries done, entries to do, bytes copied)
COPYABLE_STATES = frozenset({EntryState.SUCCESS, EntryState.FAILED, EntryState.EMPTY})
# The outcomes a report lists entry by entry (FILTERED is only counted).
_COUNTED = frozenset({TransferOutcome.COPIED, TransferOutcome.SKIPPED, TransferOutcome.FAILED})


@dataclass(frozen=True)
class EntryFilter:
    """Which source entries to copy. Empty tuples mean "any"."""

    namespaces: tuple[str, ...] = ()  # namespace paths, or a leading part (trn2-lnc2)
    compiler_versions: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    states: frozenset[EntryState] = frozenset({EntryState.SUCCESS})
    tags: Mapping[str, str] = field(default_factory=dict)  # all must match the manifest's
    paths: frozenset[str] | None = None  # exactly these entries
    # The reader's trust policy (pull): a SUCCESS entry it refuses, or whose own inputs
    # contradict its namespace, is reported as failed and not copied (operations/claims.py).
    policy: TrustPolicy | None = None
    # push: why an entry without a manifest must not get one minted (its manifest was lost:
    # neffcache/operations/lost_manifests.py), or None; unset with --adopt.
    lost: Callable[[Store, Entry], str | None] | None = None
    promote: bool = False  # re-vouch each copied manifest: signed again by this publisher (promote)

    def __post_init__(self) -> None:
        bad = self.states - COPYABLE_STATES
        if bad:
            raise ConfigError(f"entries in state {', '.join(sorted(bad))} cannot be copied; "
                              f"choose from {', '.join(sorted(COPYABLE_STATES))}")
        for ns in self.namespaces:
            safe_relpath(ns)

    def matches(self, entry: Entry) -> bool:
        ns = entry.namespace
        if self.paths is not None and entry.path not in self.paths:
            return False
        if self.namespaces and not any(ns.path == n.strip("/") or ns.path.startswith(n.strip("/") + "/")
                                       for n in self.namespaces):
            return False
        if self.compiler_versions and ns.compiler_version not in self.compiler_versions:
            return False
        if self.targets and ns.target not in self.targets:
            return False
        return entry.state in self.states

    def matches_tags(self, manifest: Manifest | None) -> bool:
        if not self.tags:
            return True
        return manifest is not None and all(manifest.tags.get(k) == v for k, v in self.tags.items())


@dataclass(frozen=True)
class EntryOutcome:
    path: str
    reason: str = ""
    bytes: int = 0


@dataclass(frozen=True)
class SyncReport:
    src: str
    dst: str
    copied: tuple[EntryOutcome, ...]
    skipped: tuple[EntryOutcome, ...]
    failed: tuple[EntryOutcome, ...]
    filtered: int  # source entries the filters left out
    bytes: int
    seconds: float
    # Source files that are no entry's (another tool's, unknown, or a name no store path may
    # have such as "notes (1).txt"): never copied, left where they are, reported.
    foreign: tuple[str, ...] = ()
    created_destination: bool = False  # DST did not exist: opening it made it (say so: a typo?)

    @property
    def ok(self) -> bool:
        return not self.failed

    def skipped_reasons(self) -> dict[str, int]:
        return dict(Counter(s.reason for s in self.skipped))

    def to_json(self) -> dict[str, object]:
        return {
            "src": self.src,
            "dst": self.dst,
            "copied": len(self.copied),
            "skipped": len(self.skipped),
            "failed": len(self.failed),
            "filtered": self.filtered,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "skipped_reasons": self.skipped_reasons(),
            "failures": [{"path": f.path, "reason": f.reason} for f in self.failed],
            "copied_paths": [c.path for c in self.copied],
            "foreign": {"files": len(self.foreign), "paths": list(self.foreign[:100])},
            "created_destination": self.created_destination,
        }


class Tally:
    """Outcomes from worker threads, and the progress callback."""

    def __init__(self, total: int, progress: SyncProgress | None, todo: list[Entry] | None = None) -> None:
        self.lock = threading.Lock()
        self.todo: list[Entry] = todo if todo is not None else []  # the entries to copy, biggest first
        self.copied: list[EntryOutcome] = []
        self.skipped: list[EntryOutcome] = []
        self.failed: list[EntryOutcome] = []
        self.filtered = 0
        self.bytes = 0
        self.done = 0
        self.total = total
        self.progress = progress

    def add(self, kind: TransferOutcome, outcome: EntryOutcome | None) -> None:
        """Count one final outcome (COPIED, SKIPPED, FAILED with its outcome; FILTERED with
        None). Called from worker threads: every counter changes under ``lock``, and the
        progress callback gets a consistent snapshot taken under it."""
        with self.lock:
            if kind is TransferOutcome.FILTERED:
                self.filtered += 1
            else:
                # BUSY is retried and CANCELLED dropped by sync: neither ever gets here.
                assert outcome is not None and kind in _COUNTED, f"{kind} is not a counted outcome"
                if kind is TransferOutcome.COPIED:
                    self.copied.append(outcome)
                    self.bytes += outcome.bytes
                elif kind is TransferOutcome.SKIPPED:
                    self.skipped.append(outcome)
                else:
                    self.failed.append(outcome)
            self.done += 1
            done, total, size = self.done, self.total, self.bytes
        if self.progress is not None:
            self.progress(done, total, size)

    def report(self, src: str, dst: str, seconds: float, foreign: list[str], created: bool) -> SyncReport:
        return SyncReport(src, dst, tuple(sorted(self.copied, key=lambda o: o.path)),
                          tuple(sorted(self.skipped, key=lambda o: o.path)),
                          tuple(sorted(self.failed, key=lambda o: o.path)),
                          self.filtered, self.bytes, seconds, tuple(sorted(foreign)), created)
