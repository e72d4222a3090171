"""``neffcache run --local DIR``: the job runs against a node-local tier neffcache fills before it
and empties into the shared tiers while it runs and after it ends.

- **before**: the job's entries are copied from the shared tiers (the placement's lower tiers)
  into DIR by :func:`~neffcache.replication.prefetch.prefetch`, verified and under the reader's
  trust policy; the job gets the exports of :func:`~neffcache.application.jobenv.local_tier_env`
  (vLLM-Neuron: ``VLLM_CACHE_ROOT`` under DIR, ``NEURON_LIBTORCH_REMOTE_CACHE`` the shared
  filesystem tier);
- **during**: a :class:`~neffcache.replication.watch.WriteBack` per writable shared tier
  publishes what the job commits in DIR, so a spot reclaim loses little;
- **after**: the write-backs drain, then ``run``'s own accounting publishes and reports
  (:func:`neffcache.warmers.wrap._after`).

**One manifest per entry.** What the write-back publishes and what ``run`` publishes afterwards
must not be two manifests of one entry (the shared store keeps the first writer's): the one
that lands there must carry the run's tags and compile seconds. So the write-back never
publishes an entry this run compiled before it has that manifest: each round hands the entries
it is about to copy to :meth:`LocalSession.adopt` first (``WriteBack(prepare=...)``), which
writes the manifest into DIR, created exclusively, with the run's toolchain, tags and the compile
seconds known then (the runtime's lines, else the files' times). Every later copy of the entry,
the write-back's and ``run``'s, is a transfer of the entry *with* that manifest, whichever wins
a tier's first-writer race; ``run``'s own adoption finds it there and keeps it, and reports the
seconds it records. What this run compiled is what DIR gained since the run started without a
manifest (a prefetched entry or one the runtime fetched from the shared tier came with one, or
keeps its old times): only that gets the run's tags.

**Events once per graph.** The write-back sends no events (it registers copies with the index,
an upsert); ``run`` sends hit, miss and compile events once, after the job. A runtime that reads
the shared tier itself (vLLM-Neuron) copies entries into DIR that it did not compile: an entry
DIR gained that the shared tier held before the job is a hit (:class:`LocalGrowth`), not a
compile. vLLM-Neuron prints no line per graph, so the entries it found in DIR leave no trace:
its hits are those it fetched, a lower bound.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neffcache.application.jobenv import local_tier_env, runtime_root
from neffcache.entry import Entry, EntryState, Namespace
from neffcache.errors import NeffcacheError
from neffcache.events import EventKind
from neffcache.index import entry_record
from neffcache.layouts import entry_forms, get_layout
from neffcache.manifest import Manifest
from neffcache.replication.inotify import open_watch
from neffcache.replication.prefetch import PrefetchReport, PrefetchRequest, prefetch
from neffcache.replication.watch import WatchReport, WriteBack
from neffcache.scan.report import scan
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain

from .growth import CacheGrowth, counted_from_cache
from .logscan import KINDS, LogCounter
from .placement import Placement

log = logging.getLogger(__name__)
SLACK = 1.0  # seconds: file times and our clock may differ by the filesystem's granularity


@dataclass(frozen=True)
class LocalRun:
    """What ``run --local`` was asked (the placement's work store is the node-local tier)."""

    prefetch: PrefetchRequest
    usage: Mapping[str, float] | None = None  # entry path -> last use, the index's (prefetch order)
    interval: float = 2.0  # write-back rounds without an inotify wake-up
    drain_timeout: float = 30.0


def _reads_shared(ns: Namespace) -> bool:
    """Whether the runtime of ``ns`` reads the shared tier itself (a node-local tier of its own)."""
    return bool(get_layout(ns.layout).node_local_env("/", ns))


class LocalGrowth(CacheGrowth):
    """:class:`CacheGrowth` of the node-local tier, counting also the runtimes that print no line
    per graph and read the shared tier themselves; an entry those copied in from the shared tier
    (``shared`` held it before the job) is in :attr:`fetched`, not among the compiles."""

    def __init__(self, store: Store, namespaces: Sequence[Namespace], shared: Store | None) -> None:
        self.store = store
        readers = [ns for ns in namespaces if _reads_shared(ns)]
        counted = counted_from_cache(namespaces)
        self.namespaces = [*counted, *(ns for ns in readers if ns not in counted)]
        self.shared_before = _forms(shared, readers) if shared is not None else set()
        self.before = self._committed()
        self.fetched: dict[str, str] = {}

    def added(self) -> dict[str, str]:
        new = super().added()
        self.fetched = {p: ns for p, ns in new.items() if self.shared_before.intersection(entry_forms(p))}
        return {p: ns for p, ns in new.items() if p not in self.fetched}


def _forms(shared: Store, namespaces: Sequence[Namespace]) -> set[str]:
    """Every path of every entry committed in ``shared``'s ``namespaces`` now; none when it
    cannot be listed (then what the runtime fetched counts as compiled: reported, not hidden)."""
    try:
        return {form for ns in namespaces for e in _committed(shared, ns) for form in entry_forms(e.path)}
    except (NeffcacheError, OSError) as exc:
        log.warning("cannot list %s before the job: %s", shared.url, exc)
        return set()


def _committed(store: Store, ns: Namespace) -> list[Entry]:
    return [e for e in scan(store, prefix=ns.path).entries if e.state is EntryState.SUCCESS and e.committed
            and e.namespace.path == ns.path]


@dataclass
class LocalSession:
    """One ``run --local``: its prefetch, exports, write-backs and what they did."""

    spec: LocalRun
    placement: Placement
    toolchain: Toolchain
    tags: Mapping[str, str]
    since: float  # the run's start (wall clock): what DIR gains after it, the run compiled
    publish: bool = True
    prefetched: PrefetchReport | None = None
    prefetch_error: str | None = None
    counter: LogCounter | None = None
    writers: list[tuple[WriteBack, threading.Thread]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def shared_url(self) -> str | None:
        """The first shared tier a runtime can read as a directory (vLLM-Neuron's remote tier)."""
        return next((s.url for s in self.placement.remotes if runtime_root(s.url)[1]), None)

    def run_prefetch(self) -> int:
        """The prefetch; the entries it copied. A shared tier that cannot be listed is reported,
        and the job runs without the prefetch (it compiles what it lacks), never not at all."""
        try:
            self.prefetched = prefetch(self.placement.remotes, self.placement.work, self.spec.prefetch,
                                       usage=self.spec.usage)
        except (NeffcacheError, OSError) as exc:
            self.prefetch_error = f"{type(exc).__name__}: {exc}"
            log.warning("prefetch failed, the job runs without it: %s", self.prefetch_error)
            return 0
        for failure in [*self.prefetched.failed, *self.prefetched.refused]:
            log.warning("prefetch of %s from %s: %s", failure.path, failure.store, failure.detail)
        return len(self.prefetched.copied)

    def env(self) -> tuple[dict[str, str], list[str]]:
        return local_tier_env(self.placement.work_root, self.shared_url, self.toolchain)

    def growth(self, namespaces: Sequence[Namespace]) -> LocalGrowth:
        shared = next((s for s in self.placement.remotes if s.url == self.shared_url), None)
        return LocalGrowth(self.placement.work, namespaces, shared)

    # -- during the job ---------------------------------------------------------------------------
    def start_write_back(self, counter: LogCounter, namespaces: Sequence[Namespace]) -> None:
        """A write-back thread per writable shared tier that is up (none without ``publish``)."""
        self.counter = counter
        if not self.publish:
            return
        index = self.placement.index
        for dst in self.placement.writable[1:]:
            def register(entry: Entry, manifest: Manifest | None, dst: Store = dst) -> None:
                index.register_entry(entry_record(entry, dst.url, manifest))

            watch = open_watch(self.placement.work.watchable_root)
            writer = WriteBack(self.placement.work, dst, namespaces=[ns.path for ns in namespaces],
                               interval=self.spec.interval, on_copied=register if index.enabled else None,
                               wake=watch.wait if watch is not None else None, prepare=self.adopt)
            thread = threading.Thread(target=self._write_back, args=(writer, watch), daemon=True,
                                      name=f"neffcache-write-back-{len(self.writers)}")
            self.writers.append((writer, thread))
            thread.start()

    def _write_back(self, writer: WriteBack, watch: Any) -> None:
        try:
            writer.run(self._stop, drain_timeout=self.spec.drain_timeout)
        except (NeffcacheError, OSError) as exc:  # a tier that went away: run's own push reports it
            log.warning("write-back to %s stopped: %s", writer.dst.url, exc)
        finally:
            if watch is not None:
                watch.close()

    def adopt(self, entries: list[Entry]) -> None:
        """Give each entry this run compiled its manifest before it is copied (the module
        docstring): the run's toolchain and tags, the compile seconds known now."""
        for entry in entries:
            marker = entry.files.get(entry.marker_name)
            if entry.has_manifest or marker is None or marker.mtime < self.since - SLACK:
                continue
            seconds = self.counter.compile_seconds(entry.path) if self.counter is not None else None
            if seconds is None:
                seconds = self.placement.compile_seconds_of(entry.path, self.since)
            try:
                self.placement.adopt(entry, toolchain=self.toolchain, tags=self.tags, compile_seconds=seconds)
            except (NeffcacheError, OSError) as exc:  # faults are per entry: it is published as it is
                log.warning("%s: no manifest of this run before its write-back: %s", entry.path, exc)

    def stop_write_back(self) -> None:
        """The job ended: each write-back drains (within ``drain_timeout``) and stops."""
        self._stop.set()
        for _, thread in self.writers:
            thread.join(self.spec.drain_timeout + 5.0)

    # -- after the job ----------------------------------------------------------------------------
    def count_fetched(self, growth: LocalGrowth, by_path: Mapping[str, Namespace], counts: dict[str, int],
                      namespaces: dict[str, dict[str, int]]) -> None:
        """The entries the runtime fetched from the shared tier itself: hits, stamped, one event each."""
        for path, ns_path in growth.fetched.items():
            ns = by_path.get(ns_path)
            if ns is None:
                continue
            self.placement.event(EventKind.HIT, path, ns)
            counts["hit"] = counts.get("hit", 0) + 1
            namespaces.setdefault(ns_path, dict.fromkeys(KINDS, 0))["hit"] += 1
        self.placement.stamp(list(growth.fetched))

    def report(self) -> dict[str, Any]:
        """What the prefetch and the write-backs did, for ``run``'s report."""
        reports: list[WatchReport] = [writer.report for writer, _ in self.writers]
        lag = sorted(x for r in reports for x in r.lag)
        return {
            "prefetch": self.prefetched.to_json() if self.prefetched is not None else {"error": self.prefetch_error},
            "write_back": {
                "tiers": [r.to_json() for r in reports],
                "published": sum(len(r.published) for r in reports),
                "failed": sum(len(r.failed) for r in reports),
                "drained": all(r.drained for r in reports),
                "lag_p50": round(lag[len(lag) // 2], 3) if lag else None,
                "lag_p99": round(lag[min(len(lag) - 1, int(len(lag) * 0.99))], 3) if lag else None,
            },
        }
