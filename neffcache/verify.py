"""Verifying entries against their manifests, and quarantining the ones that fail.

A quarantined entry is moved under ``.neffcache/quarantine/<time>/`` with its commit marker
first, so no reader can be served a NEFF whose bytes do not match what was published.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from neffcache.entry import Entry, EntryState
from neffcache.errors import EntryNotFound
from neffcache.index import Index
from neffcache.ingest import digest_of
from neffcache.lease import read_lease
from neffcache.publish import publish_lease_name
from neffcache.scan import scan
from neffcache.stores.base import CONTROL_DIR, Store, move_file

log = logging.getLogger(__name__)
QUARANTINE_DIR = f"{CONTROL_DIR}/quarantine"


class CheckStatus(enum.StrEnum):
    OK = "ok"
    CORRUPT = "corrupt"
    UNVERIFIED = "unverified"  # no manifest: written by a runtime, nothing to check against


@dataclass(frozen=True)
class EntryCheck:
    path: str
    status: CheckStatus
    problems: tuple[str, ...] = ()
    quarantined_to: str | None = None


@dataclass(frozen=True)
class VerifyReport:
    store: str
    checks: tuple[EntryCheck, ...]
    seconds: float

    def count(self, status: CheckStatus) -> int:
        return sum(1 for c in self.checks if c.status is status)

    @property
    def corrupt(self) -> list[EntryCheck]:
        return [c for c in self.checks if c.status is CheckStatus.CORRUPT]

    def to_json(self) -> dict[str, object]:
        return {
            "store": self.store,
            "checked": len(self.checks),
            "ok": self.count(CheckStatus.OK),
            "corrupt": self.count(CheckStatus.CORRUPT),
            "unverified": self.count(CheckStatus.UNVERIFIED),
            "problems": [
                {"path": c.path, "problems": list(c.problems), "quarantined_to": c.quarantined_to}
                for c in self.corrupt
            ],
            "seconds": round(self.seconds, 3),
        }


def check_entry(store: Store, entry: Entry) -> EntryCheck:
    """Hash every file the manifest records and compare."""
    if entry.state is EntryState.CORRUPT:
        return EntryCheck(entry.path, CheckStatus.CORRUPT, entry.problems)
    if entry.manifest is None:
        return EntryCheck(entry.path, CheckStatus.UNVERIFIED)
    problems = []
    for name, expected in sorted(entry.manifest.files.items()):
        try:
            got = digest_of(store, entry.store_path(name))
        except EntryNotFound:
            problems.append(f"{name} is missing")
            continue
        if got != expected:
            problems.append(f"{name} does not match its manifest sha256 ({got.sha256[:12]}… vs "
                            f"{expected.sha256[:12]}…)")
    if problems:
        return EntryCheck(entry.path, CheckStatus.CORRUPT, tuple(problems))
    return EntryCheck(entry.path, CheckStatus.OK)


def quarantine(store: Store, entry: Entry, *, stamp: str | None = None) -> str:
    """Move the entry's files under the quarantine directory, commit marker first."""
    where = f"{QUARANTINE_DIR}/{stamp or time.strftime('%Y%m%dT%H%M%S')}/{entry.path}"
    names = sorted(entry.files, key=lambda n: (n != entry.marker_name, n))
    for name in names:
        try:
            move_file(store, entry.store_path(name), f"{where}/{name}")
        except EntryNotFound:
            continue
    log.warning("quarantined %s to %s", entry.path, where)
    return where


def verify(store: Store, *, prefix: str = "", fix: bool = False, workers: int = 8,
           progress: Callable[[int, int], None] | None = None, index: Index | None = None) -> VerifyReport:
    """Check every entry's files against its manifest; with ``fix``, quarantine the bad ones.

    With ``index``, every corrupt entry is reported as an ``error`` event and every quarantined
    one as an ``evict`` from this store (the index then stops listing it there).
    """
    started = time.monotonic()
    report = scan(store, prefix=prefix, read_manifests=True)
    candidates = [e for e in report.entries if e.state in (EntryState.SUCCESS, EntryState.CORRUPT)]
    done = 0

    def one(entry: Entry) -> EntryCheck:
        nonlocal done
        check = check_entry(store, entry)
        done += 1
        if progress is not None:
            progress(done, len(candidates))
        return check

    with ThreadPoolExecutor(max_workers=workers) as pool:
        checks = list(pool.map(one, candidates))
    if fix:
        by_path = {e.path: e for e in candidates}
        fixed = []
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for check in checks:
            entry = by_path[check.path]
            live = read_lease(store, publish_lease_name(entry.path))
            if check.status is CheckStatus.CORRUPT and (live is None or live.expired()):
                moved = quarantine(store, entry, stamp=stamp)
                fixed.append(EntryCheck(check.path, check.status, check.problems, moved))
            else:
                fixed.append(check)
        checks = fixed
    if index is not None and index.enabled:
        _report(index, store, {e.path: e for e in candidates}, checks)
    return VerifyReport(store.url, tuple(checks), time.monotonic() - started)


def _report(index: Index, store: Store, entries: dict[str, Entry], checks: list[EntryCheck]) -> None:
    for check in checks:
        if check.status is not CheckStatus.CORRUPT:
            continue
        entry = entries[check.path]
        where: dict[str, Any] = {"path": entry.path, "key": entry.key, "namespace": entry.namespace.path,
                                 "toolchain": entry.toolchain, "store": store.url}
        index.record("error", message=f"corrupt: {'; '.join(check.problems)}", **where)
        if check.quarantined_to is not None:
            index.record("evict", message=f"verify --fix: quarantined to {check.quarantined_to}", **where)
