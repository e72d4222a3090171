"""Verifying entries against their manifests, and quarantining the ones that fail.

A quarantined entry is moved under ``.neffcache/quarantine/<UTC time>Z/`` with its commit
marker first, so no reader can be served a NEFF whose bytes do not match what was published.
Every quarantine is recorded in the store's action journal (:mod:`neffcache.coordination.history`), and
quarantined files stay ``quarantine_days`` (``prune --garbage`` removes them after that).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from neffcache.coordination.history import ActionItem
from neffcache.coordination.history import record as record_action
from neffcache.coordination.lease import read_lease
from neffcache.coordination.write_leases import publish_lease_name
from neffcache.entry import Entry, EntryState
from neffcache.errors import EntryNotFound, InvalidKey, StoreError, StoreUnavailable
from neffcache.events import EventKind
from neffcache.failures import FailureCause, Verdict, note
from neffcache.index import Index
from neffcache.layouts import get_layout
from neffcache.operations.claims import admission, self_problems, store_reader
from neffcache.operations.ingest import digest_of
from neffcache.operations.lost_manifests import lost_problem, recorded_digests
from neffcache.scan.report import UNREADABLE, scan
from neffcache.stores.base import CONTROL_DIR, Store
from neffcache.trust import TrustPolicy

log = logging.getLogger(__name__)
QUARANTINE_DIR = f"{CONTROL_DIR}/quarantine"


class CheckStatus(enum.StrEnum):
    OK = "ok"
    CORRUPT = "corrupt"
    UNVERIFIED = "unverified"  # no manifest: written by a runtime, nothing to check against
    FAILED = "failed"  # could not be checked (unreadable, a bad file name): reported, never quarantined
    # Its files match its manifest, but the reader's trust policy refuses who vouches for it
    # (a bad or revoked signature, a key outside its scope; unsigned under --require-signed).
    REFUSED = "refused"
    MISMATCH = "mismatch"  # its own inputs contradict its namespace (kind target: or compiler:)


@dataclass(frozen=True)
class EntryCheck:
    path: str
    status: CheckStatus
    problems: tuple[str, ...] = ()
    quarantined_to: str | None = None
    error: str | None = None  # why --fix could not quarantine it (it stays corrupt)
    trust: str | None = None  # the trust verdict (neffcache.trust.Verdict) when a policy judged it


@dataclass(frozen=True)
class VerifyReport:
    store: str
    checks: tuple[EntryCheck, ...]
    seconds: float
    # Parts of the store the listing would not enter (a symlinked or unreadable namespace or
    # top-level directory): whatever lies there was not checked, so the run is not "all ok".
    listing_problems: tuple[str, ...] = ()

    def count(self, status: CheckStatus) -> int:
        return sum(1 for c in self.checks if c.status is status)

    @property
    def corrupt(self) -> list[EntryCheck]:
        return [c for c in self.checks if c.status is CheckStatus.CORRUPT]

    @property
    def failed(self) -> list[EntryCheck]:
        """Entries that could not be checked, or not quarantined: the faults of this run."""
        return [c for c in self.checks if c.status is CheckStatus.FAILED or c.error is not None]

    @property
    def untrusted(self) -> list[EntryCheck]:
        """Entries no reader should load although their bytes match: refused or mismatched."""
        return [c for c in self.checks if c.status in (CheckStatus.REFUSED, CheckStatus.MISMATCH)]

    def verdicts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for c in self.checks:
            if c.trust is not None:
                counts[c.trust] = counts.get(c.trust, 0) + 1
        return dict(sorted(counts.items()))

    def to_json(self) -> dict[str, object]:
        return {
            "store": self.store,
            "checked": len(self.checks),
            "ok": self.count(CheckStatus.OK),
            "corrupt": self.count(CheckStatus.CORRUPT),
            "unverified": self.count(CheckStatus.UNVERIFIED),
            "failed": self.count(CheckStatus.FAILED),
            "refused": self.count(CheckStatus.REFUSED),
            "mismatch": self.count(CheckStatus.MISMATCH),
            "trust": self.verdicts(),
            "untrusted": [{"path": c.path, "status": c.status.value, "trust": c.trust, "problems": list(c.problems)}
                          for c in self.untrusted],
            "problems": [
                {"path": c.path, "problems": list(c.problems), "quarantined_to": c.quarantined_to}
                | ({"error": c.error} if c.error else {})
                for c in self.corrupt
            ],
            "failures": [{"path": c.path, "problems": list(c.problems)}
                         for c in self.checks if c.status is CheckStatus.FAILED],
            "listing_problems": list(self.listing_problems),
            "seconds": round(self.seconds, 3),
        }


def check_entry(store: Store, entry: Entry, policy: TrustPolicy | None = None) -> EntryCheck:
    """Hash every file the manifest records and compare; then, for an entry whose bytes match,
    what it proves about itself (neffcache/operations/claims.py): under ``policy``, whether the
    reader trusts who signed it (REFUSED when not), and whether its own inputs agree with its
    namespace (MISMATCH). An unsigned entry under a policy that does not require signatures is
    OK with its verdict (``unsigned``) reported.

    A file or manifest that cannot be read (permissions, an I/O error, a store error, a name
    no store path may have) makes the entry FAILED, not CORRUPT: its bytes may be fine, and
    ``--fix`` must not quarantine it.
    """
    check = _check_digests(store, entry)
    if check.status not in (CheckStatus.OK, CheckStatus.UNVERIFIED):
        return check
    verdict = admission(policy, store.url, entry) if policy is not None else None
    trust = verdict.verdict.value if verdict is not None else None
    if verdict is not None and verdict.refused:
        return EntryCheck(entry.path, CheckStatus.REFUSED, (f"{verdict.verdict.value}: {verdict.detail}",),
                          trust=trust)
    claims = self_problems(entry, store_reader(store, entry))
    if claims:
        return EntryCheck(entry.path, CheckStatus.MISMATCH, (*check.problems, *claims), trust=trust)
    return dataclasses.replace(check, trust=trust)


def _check_digests(store: Store, entry: Entry) -> EntryCheck:
    if entry.state is EntryState.CORRUPT:
        # A manifest that could not be read at all (a name no store path may have, a swap for
        # a symlink) says nothing of the bytes: not checked, and never quarantined.
        unread = tuple(p for p in entry.problems if p.startswith(UNREADABLE))
        if unread:
            return EntryCheck(entry.path, CheckStatus.FAILED, unread)
        return EntryCheck(entry.path, CheckStatus.CORRUPT, entry.problems)
    problems = _content_problems(store, entry)
    if entry.manifest is None:
        # A runtime wrote it: what its name should be is a runtime fact neffcache only infers
        # (docs/runtimes.md says which are unverified), so a mismatch is reported, never a
        # reason to quarantine the runtime's own files. A manifest's entry was checked on publish.
        return EntryCheck(entry.path, CheckStatus.UNVERIFIED, tuple(problems))
    for name, expected in sorted(entry.manifest.files.items()):
        try:
            got = digest_of(store, entry.store_path(name))
        except EntryNotFound:
            problems.append(f"{name} is missing")
            continue
        except (InvalidKey, OSError) as exc:
            return EntryCheck(entry.path, CheckStatus.FAILED, (f"cannot read {name}: {exc}",))
        if got != expected:
            problems.append(f"{name} does not match its manifest sha256 ({got.sha256[:12]}… vs "
                            f"{expected.sha256[:12]}…)")
    if problems:
        return EntryCheck(entry.path, CheckStatus.CORRUPT, tuple(problems))
    return EntryCheck(entry.path, CheckStatus.OK)


MAX_KEYED_FILE = 16 << 20  # bytes read of the file a key is a hash of (NxDI's config)


def _content_problems(store: Store, entry: Entry) -> list[str]:
    """What the entry's content says against its name (NxDI: a directory named by another
    configuration's hash; :meth:`Layout.key_from_content`). Layouts without such a rule read nothing."""

    try:
        get_layout(entry.layout).key_from_content(entry.key, store_reader(store, entry, MAX_KEYED_FILE))
    except EntryNotFound as exc:
        return [f"cannot check its name: {exc}"]
    except ValueError as exc:
        return [str(exc)]
    return []


def quarantine_stamp() -> str:
    """The quarantine directory's name: UTC, as the retention reads it (neffcache.prune.sweep)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def quarantine(store: Store, entry: Entry, *, stamp: str | None = None, why: str | None = "failed its digests",
               ) -> str:
    """Move the entry's files under the quarantine directory, commit marker first.

    Raises StoreError, moving nothing, when nothing of the entry can be moved: an entry whose
    directory is a symlink or unreadable lists no file, and saying "quarantined" (a journal
    record, an evict sent to the index) for an entry left where it was would be false.
    With ``why`` the move is recorded in the store's action journal as one action; a caller
    quarantining many entries passes None and records them together."""
    if not entry.files:
        raise StoreError("cannot quarantine: none of its files could be listed (a symlinked or "
                         "unreadable directory); it stays where it is", store=store.url, path=entry.path)
    where = f"{QUARANTINE_DIR}/{stamp or quarantine_stamp()}/{entry.path}"
    names = sorted(entry.files, key=lambda n: (n != entry.marker_name, n))
    moved = 0
    for name in names:
        try:
            store.move(entry.store_path(name), f"{where}/{name}")
        except EntryNotFound:
            continue
        moved += 1
    if not moved:
        raise StoreError("cannot quarantine: its files were gone when moved", store=store.url,
                         path=entry.path)
    log.warning("quarantined %s to %s", entry.path, where)
    if why is not None:
        record_action(store, "quarantine", why, [ActionItem(entry.path, "corrupt", entry.size, f"moved to {where}")])
    return where


def verify(store: Store, *, prefix: str = "", fix: bool = False, workers: int = 8,
           progress: Callable[[int, int], None] | None = None, index: Index | None = None,
           policy: TrustPolicy | None = None) -> VerifyReport:
    """Check every entry's files against its manifest; with ``fix``, quarantine the bad ones.
    ``policy``: the reader's trust policy, judged on every entry whose files match (REFUSED
    entries are reported, never quarantined: another reader may trust their key).

    What the listing could not enter is in ``listing_problems``: a report with none of those
    and no FAILED check has looked at every entry the store holds.

    With ``index``, every corrupt entry is reported as an ``error`` event and every quarantined
    one as an ``evict`` from this store (the index then stops listing it there).
    """
    started = time.monotonic()
    report = scan(store, prefix=prefix, read_manifests=True)
    candidates = [e for e in report.entries if e.state in (EntryState.SUCCESS, EntryState.CORRUPT)]
    done = 0

    def one(entry: Entry) -> EntryCheck:
        nonlocal done
        try:
            check = check_entry(store, entry, policy)
        except StoreUnavailable:
            raise  # every further entry would fail the same way
        except Exception as exc:  # faults are per entry: this one is reported, the rest checked
            log.debug("verify %s", entry.path, exc_info=True)
            check = EntryCheck(entry.path, CheckStatus.FAILED, (f"{type(exc).__name__}: {exc}",))
        done += 1
        if progress is not None:
            progress(done, len(candidates))
        return check

    with ThreadPoolExecutor(max_workers=workers) as pool:
        checks = list(pool.map(one, candidates))
    if index is not None and index.enabled:
        checks = _lost_manifests(store, index, {e.path: e for e in candidates}, checks)
    if fix:
        checks = _quarantine_corrupt(store, {e.path: e for e in candidates}, checks)
    if index is not None and index.enabled:
        _report(index, store, {e.path: e for e in candidates}, checks)
    return VerifyReport(store.url, tuple(checks), time.monotonic() - started, report.listing_problems)

def _lost_manifests(store: Store, index: Index, by_path: dict[str, Entry], checks: list[EntryCheck]
                    ) -> list[EntryCheck]:
    """Entries without a manifest that the index recorded as published: MISMATCH, never the
    runtime's own (neffcache/operations/lost_manifests.py). Not quarantined: the NEFF may be the
    one that was published, and ``push --adopt`` can vouch for it again."""
    bare = [c.path for c in checks if c.status is CheckStatus.UNVERIFIED]
    recorded = recorded_digests(index, bare)
    def lost(c: EntryCheck) -> EntryCheck:
        said = lost_problem(store, by_path[c.path], recorded[c.path])
        return EntryCheck(c.path, CheckStatus.MISMATCH, (*c.problems, said), trust=c.trust)

    return [lost(c) if c.path in recorded else c for c in checks]


def _quarantine_corrupt(store: Store, by_path: dict[str, Entry], checks: list[EntryCheck]) -> list[EntryCheck]:
    """``verify --fix``: move each CORRUPT entry no one is publishing to quarantine, record the
    moves in the prune history, and return the checks with where each entry went."""
    fixed = []
    stamp = quarantine_stamp()
    for check in checks:
        entry = by_path[check.path]
        if check.status is not CheckStatus.CORRUPT:
            fixed.append(check)
            continue
        try:
            live = read_lease(store, publish_lease_name(entry.path))
            if live is not None and not live.expired():
                fixed.append(check)
                continue
            moved = quarantine(store, entry, stamp=stamp, why=None)
        except StoreUnavailable:
            raise
        except (InvalidKey, OSError) as exc:
            # An undeletable file, a name no store path may have: this entry stays (its
            # marker may have moved already, so it serves nothing); the others go on.
            said = str(exc) if str(exc).startswith("cannot quarantine") else f"cannot quarantine: {exc}"
            log.warning("%s: %s", entry.path, said)
            fixed.append(dataclasses.replace(check, error=said))
            continue
        fixed.append(EntryCheck(check.path, check.status, check.problems, moved))
    moved_items = [ActionItem(c.path, "corrupt", by_path[c.path].size,
                              f"moved to {c.quarantined_to}: {'; '.join(c.problems)}"[:1000])
                   for c in fixed if c.quarantined_to is not None]
    if moved_items:
        record_action(store, "quarantine", "verify --fix: files do not match their manifest", moved_items,
                      details={"checked": len(fixed)})
    return fixed



def _report(index: Index, store: Store, entries: dict[str, Entry], checks: list[EntryCheck]) -> None:
    for check in checks:
        if check.status is not CheckStatus.CORRUPT:
            continue
        entry = entries[check.path]
        where: dict[str, Any] = {"path": entry.path, "key": entry.key, "namespace": entry.namespace.path,
                                 "toolchain": entry.toolchain, "store": store.url}
        # Its own class in `neffcache failures` (storage): the note says so, whoever reads it.
        said = f"corrupt: {'; '.join(check.problems)}"
        index.record(EventKind.ERROR, message=f"{said}\n{note(Verdict(FailureCause.CORRUPT_ENTRY, said))}", **where)
        if check.quarantined_to is not None:
            index.record(EventKind.EVICT, message=f"verify --fix: quarantined to {check.quarantined_to}", **where)
