"""Write-back: ``neffcache push LOCAL SHARED --watch``, a sidecar that publishes what a job commits.

A job compiling into a node-local tier (a prefetched one, vLLM-Neuron's ``VLLM_CACHE_ROOT``)
keeps its new NEFFs to itself unless someone copies them out: vLLM-Neuron only promotes to its
shared tier when ``save_cache()`` is called, spot reclaims lose whatever a pod compiled, and
teams script flushers by hand. The watcher owns that: every entry the runtime *commits*
locally reaches the shared tier within seconds, under the publish rules (a lease, the bytes
hashed are the bytes sent, per-entry faults, the index told), and on SIGTERM it drains what is
committed within ``drain_timeout``, so a pod's termination grace period is enough.

Why it never publishes a half entry: it copies only what a listing classifies SUCCESS and
committed (the runtime's own commit marker is there: ``model.done``, the NEFF renamed into
place, ``.compilation_complete``); an entry whose compile still holds its lock is LOCKED, one
without its marker is absent. The copy itself is :func:`~neffcache.replication.sync.sync`'s.

Why it is cheap: the first round diffs both sides once; later rounds list only the local tier
(a local directory: milliseconds for thousands of entries) and copy the committed entries not
yet published, by path.

``prepare`` (``run --local``'s): called with the committed entries a round is about to copy,
before it copies them (it gives each the manifest the run publishes it with). With it every
round, the first too, copies exactly the entries it handed to ``prepare``, by path: an entry
committed after the round's listing waits for the next round, so none is ever copied without
having been prepared. A round starts when the local tier may have changed: at once when the
platform tells (Linux inotify on the tier's directories, :mod:`.inotify`), else every
``interval`` seconds; both, so a missed event costs at most one interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from neffcache.entry import Entry, EntryState
from neffcache.replication.sync import OnCopied, sync
from neffcache.replication.sync_report import EntryOutcome, SyncReport
from neffcache.scan.report import scan
from neffcache.stores.base import Store

log = logging.getLogger(__name__)
Wake = Callable[[float], bool]  # wait up to N seconds for a change; True when one was seen
Prepare = Callable[[list[Entry]], None]  # called with the entries a round is about to copy


@dataclass
class WatchReport:
    src: str
    dst: str
    rounds: int = 0
    published: list[EntryOutcome] = field(default_factory=list)
    failed: list[EntryOutcome] = field(default_factory=list)
    drained: bool = True  # the last round finished within the drain timeout
    left: int = 0  # committed entries the drain did not get to
    lag: list[float] = field(default_factory=list)  # seconds from local commit to published, per entry
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        lag = sorted(self.lag)
        return {"src": self.src, "dst": self.dst, "rounds": self.rounds, "published": len(self.published),
                "failed": [{"path": f.path, "reason": f.reason} for f in self.failed[-100:]],
                "drained": self.drained, "left": self.left, "seconds": round(self.seconds, 3),
                "lag_p50": round(lag[len(lag) // 2], 3) if lag else None,
                "lag_p99": round(lag[min(len(lag) - 1, int(len(lag) * 0.99))], 3) if lag else None}


class WriteBack:
    """Publishes the committed entries of ``src`` (below ``namespaces``) to ``dst``, round by round."""

    def __init__(self, src: Store, dst: Store, *, namespaces: Collection[str] = (), interval: float = 2.0,
                 parallel: int = 8, on_copied: OnCopied | None = None, wake: Wake | None = None,
                 prepare: Prepare | None = None) -> None:
        self.src, self.dst = src, dst
        self.prepare = prepare
        self.namespaces = tuple(namespaces)
        self.interval = interval
        self.parallel = parallel
        self.on_copied = on_copied
        self.wake = wake
        self.report = WatchReport(src.url, dst.url)
        self._done: set[str] = set()  # published (or there already): never looked at again

    def run(self, stop: threading.Event, *, drain_timeout: float = 30.0) -> WatchReport:
        """Rounds until ``stop`` is set, then one last round bounded by ``drain_timeout``."""
        started = time.monotonic()
        self._round(first=True)
        while not stop.is_set():
            if self.wake is not None:
                self.wake(self.interval)
            else:
                stop.wait(self.interval)
            if not stop.is_set():
                self._round()
        self._drain(drain_timeout)
        self.report.seconds = time.monotonic() - started
        return self.report

    def _drain(self, timeout: float) -> None:
        finished = threading.Event()

        def last_round() -> None:
            self._round()
            finished.set()

        worker = threading.Thread(target=last_round, name="neffcache-drain", daemon=True)
        worker.start()
        worker.join(timeout)
        if not finished.is_set():
            self.report.drained = False
            self.report.left = len(self._committed().keys() - self._done)
            log.warning("write-back: the drain did not finish in %.0fs: %d committed entries left unpublished",
                        timeout, self.report.left)

    def _committed(self) -> dict[str, Entry]:
        prefixes = [n.strip("/") for n in self.namespaces] or [""]
        return {e.path: e for p in prefixes for e in scan(self.src, prefix=p).entries
                if e.state is EntryState.SUCCESS and e.committed}

    def _round(self, *, first: bool = False) -> None:
        """One pass: everything the destination lacks on the first, new committed entries after
        (with ``prepare``, always the new committed entries: the module docstring says why)."""
        self.report.rounds += 1
        if first and self.prepare is None:
            report = self._sync(None)
        else:
            new = {p: e for p, e in self._committed().items() if p not in self._done}
            if not new:
                return
            if self.prepare is not None:
                self.prepare(list(new.values()))
            report = self._sync(set(new))
        self._account(report)

    def _sync(self, paths: set[str] | None) -> SyncReport:
        return sync(self.src, self.dst, namespaces=self.namespaces, paths=paths, parallel=self.parallel,
                    on_copied=self.on_copied)

    def _account(self, report: SyncReport) -> None:
        now = time.time()
        for outcome in report.copied:
            self._done.add(outcome.path)
            self.report.published.append(outcome)
            committed_at = self._commit_time(outcome.path)
            if committed_at is not None:
                self.report.lag.append(max(0.0, now - committed_at))
        for outcome in report.skipped:
            self._done.add(outcome.path)  # there already, or another publisher's: not ours to repeat
        self.report.failed.extend(report.failed)
        for failure in report.failed:
            log.warning("write-back of %s failed: %s (retried next round)", failure.path, failure.reason)

    def _commit_time(self, path: str) -> float | None:
        from neffcache.scan.report import load_entry
        entry = load_entry(self.src, path, read_manifest=False)
        marker = entry.files.get(entry.marker_name) if entry is not None else None
        return marker.mtime if marker is not None else None
