"""Where a warm-up reads, writes, coordinates and reports, on top of :class:`~neffcache.replication.tiers.Tiers`.

- the **work store**: the first tier, a local path (NVMe, FSx). The runtimes need a directory,
  so the workloads read and write here; when the first tier is remote, a local cache under
  ``$XDG_CACHE_HOME/neffcache/store`` is put in front of the chain;
- the **writable tiers**: every new entry is published to each of them that is up (a tier
  that is down is skipped and reported, never fatal);
- the **coordinator**: the last writable tier that is up, the one shared most widely (S3 or
  FSx across hosts). Compile leases live there, so two hosts never compile the same graph;
- the **index**, optional: entries are registered and events sent through the client's spool,
  so an index that is down never fails a warm-up.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from neffcache.application.config import default_cache_home
from neffcache.coordination.stamps import record_use
from neffcache.entry import Entry, EntryState, Namespace
from neffcache.errors import ConfigError, PlaceholderNeff, StoreError
from neffcache.events import EventKind
from neffcache.index import Index, open_index
from neffcache.index.records import entry_record
from neffcache.layouts import get_layout
from neffcache.manifest import Manifest
from neffcache.operations import publisher
from neffcache.operations.ingest import build_manifest, read_flags, transferable_names
from neffcache.outcomes import PublishStatus
from neffcache.replication.tiers import Tiers
from neffcache.scan.report import load_entry
from neffcache.stores.base import FileSource, Store
from neffcache.toolchain import Toolchain
from neffcache.trust import TrustPolicy

log = logging.getLogger(__name__)
Ingested = tuple[Entry, list[Store]]


@dataclass
class Placement:
    chain: Tiers
    index: Index
    event_fields: dict[str, str] = field(default_factory=dict)  # model, team, job for events

    @property
    def work(self) -> Store:
        return self.chain.local

    @property
    def work_root(self) -> str:
        root = self.work.runtime_root
        assert root is not None  # open_placement refuses a first tier that is not a directory
        return str(root).rstrip("/")

    @property
    def tiers(self) -> list[Store]:
        return [t.store for t in self.chain.tiers if t.store is not None]

    @property
    def remotes(self) -> list[Store]:
        return self.tiers[1:]

    @property
    def writable(self) -> list[Store]:
        return [t.store for t in self.chain.tiers if t.store is not None and t.up and t.writable]

    @property
    def coordinator(self) -> Store:
        return self.writable[-1]

    def _store(self, url: str) -> Store | None:
        return next((s for s in self.tiers if s.url == url), None)

    def problem_notes(self) -> list[str]:
        return [f"tier {p.tier}: {p.op} {p.kind}{' ' + p.path if p.path else ''}: {p.message}"
                for p in self.chain.problems]

    def close(self) -> None:
        self.index.close()
        self.chain.close()

    # -- reading --------------------------------------------------------------------------
    def prefetch(self, namespaces: Sequence[Namespace], *, tags: Mapping[str, str] | None = None,
                 parallel: int = 16) -> tuple[int, int]:
        """Pull the namespaces' entries the work store lacks from the lower tiers, verified.

        Returns (entries, bytes). Faster tiers first: what one tier supplied, the next skips.
        """
        report = self.chain.prefetch(namespaces=[ns.path for ns in namespaces], tags=tags, parallel=parallel)
        for sync_report in report.reports:
            for failure in sync_report.failed:
                log.warning("prefetch of %s from %s failed: %s", failure.path, sync_report.src, failure.reason)
        return sum(len(r.copied) for r in report.reports), sum(r.bytes for r in report.reports)

    def bring_to_work(self, path: str) -> bool:
        """True when some tier holds ``path``; it is then in the work store (promoted, verified)."""
        return self.chain.get_entry(path) is not None

    def compile_seconds_of(self, path: str, since: float) -> float | None:
        """A runtime-compiled entry's compile time, from its files: HLO written (or ``since``,
        if older) to NEFF written. The runtimes log no duration; this is the honest bound."""
        entry = load_entry(self.work, path, read_manifest=False)
        if entry is None:
            return None
        layout = get_layout(entry.layout)
        neff_name, hlo_name = layout.neff_of(entry), layout.hlo_of(entry)
        neff = entry.files[neff_name] if neff_name else None
        hlo = entry.files[hlo_name] if hlo_name else None
        if neff is None:
            return None
        begin = max(since, hlo.mtime) if hlo is not None else since
        return round(max(0.0, neff.mtime - begin), 3)

    # -- writing --------------------------------------------------------------------------
    def ingest(self, path: str, *, toolchain: Toolchain, tags: Mapping[str, str],
               compile_seconds: float | None = None, skip_managed: bool = False) -> Ingested | None:
        found = self.ingest_many([(path, tags, compile_seconds)], toolchain=toolchain, skip_managed=skip_managed)
        return found.get(path)

    def ingest_many(self, items: Sequence[tuple[str, Mapping[str, str], float | None]], *, toolchain: Toolchain,
                    skip_managed: bool = False) -> dict[str, Ingested]:
        """Manifest, publish and register entries the runtime wrote into the work store.

        ``items`` are (path, tags, compile seconds). Entries that are not whole SUCCESS entries
        (a compile stopped midway) are left out, and with ``skip_managed`` those that have a
        manifest already (a hit on an entry neffcache published before: nothing new).
        """
        adopted: dict[str, Entry] = {}
        for path, tags, seconds in items:
            entry = load_entry(self.work, path)
            if entry is None or entry.state is not EntryState.SUCCESS or (entry.has_manifest and skip_managed):
                continue
            try:
                adopted[path] = self.adopt(entry, toolchain=toolchain, tags=tags, compile_seconds=seconds)
            except PlaceholderNeff as exc:  # a `plan` placeholder is no NEFF: refused, the rest go on
                log.error("%s", exc)
        if not adopted:
            return {}
        held: dict[str, list[Store]] = {path: [self.work] for path in adopted}
        if len(self.writable) > 1:
            pushed = self.chain.push_new(paths=list(adopted))
            for report in pushed.reports:
                store = self._store(report.dst)
                done = [o.path for o in report.copied] + [o.path for o in report.skipped if o.reason == "exists"]
                for path in done:
                    if store is not None and path in held:
                        held[path].append(store)
        for path, entry in adopted.items():
            self.register(entry, held[path])
        return {path: (entry, held[path]) for path, entry in adopted.items()}

    def catch_up(self, namespaces: Sequence[Namespace]) -> int:
        """Push what the work store holds in ``namespaces`` and the lower tiers lack (e.g. what
        an earlier run could not publish while a tier was down). Returns the entries copied."""
        if len(self.writable) < 2:
            return 0
        report = self.chain.push_new(namespaces=[ns.path for ns in namespaces])
        return sum(len(r.copied) for r in report.reports)

    def adopt(self, entry: Entry, *, toolchain: Toolchain, tags: Mapping[str, str],
              compile_seconds: float | None = None) -> Entry:
        """Give an entry the runtime wrote its manifest (with our tags), in place.

        The manifest is created exclusively: of several warmers that saw the same new entry,
        the first one's record stands.
        """
        if entry.has_manifest:
            return entry
        local = {n: p for n in transferable_names(entry) if (p := self.work.local_path(entry.store_path(n)))}
        manifest = build_manifest(entry.layout, entry.key, local, toolchain=toolchain,
                                  flags=read_flags(self.work, entry), tags=tags,
                                  compile_seconds=compile_seconds)
        manifest = publisher.seal(manifest, manifest, entry.namespace, entry.key)  # signed, with a key
        self.work.put_file(entry.store_path(entry.manifest_name), manifest.to_bytes(), exclusive=True)
        return load_entry(self.work, entry.path) or entry

    def publish(self, namespace: Namespace, key: str, files: Mapping[str, FileSource], manifest: Manifest
                ) -> list[Store]:
        """Publish a new entry (ours: compiled by the pool) to every writable tier that is up."""
        result = self.chain.publish(namespace, key, files, manifest)
        return [s for url, r in result.results if r.status is not PublishStatus.BUSY and (s := self._store(url))]

    def register(self, entry: Entry, stores: Iterable[Store]) -> None:
        manifest = entry.manifest
        records = [entry_record(entry, store.url, manifest) for store in stores]
        self.index.register_entries(records)

    def register_failed(self, path: str, stores: Iterable[Store]) -> None:
        """Register ``path`` with the index as each of ``stores`` holds it, when it is FAILED
        there (a failure log just written): the index's health then counts it."""
        for store in stores:
            entry = load_entry(store, path)
            if entry is not None and entry.state is EntryState.FAILED:
                self.register(entry, [store])

    def event(self, kind: EventKind, entry: str | None, namespace: Namespace, *,
              compile_seconds: float | None = None, message: str | None = None,
              tags: Mapping[str, str] | None = None) -> None:
        """Report to the index; ``tags`` (an entry's own model/team) win over the command's."""
        fields = {**self.event_fields, **{k: v for k, v in (tags or {}).items() if k in ("model", "team")}}
        self.index.record(kind, path=entry, namespace=namespace.path, toolchain=namespace.toolchain,
                          compile_seconds=compile_seconds, store=self.work.url, message=message, **fields)

    def stamp(self, paths: Sequence[str]) -> None:
        """Record use of entries served from the cache (prune by age reads these, never atime)."""
        if not paths:
            return
        for store in self.writable:
            try:
                record_use(store, paths)
            except StoreError as exc:
                log.warning("could not record use in %s: %s", store.url, exc)


def is_local_url(url: str) -> bool:
    return "://" not in url or url.startswith(("file://", "fsx://"))


def open_placement(urls: Sequence[str], *, index_url: str | None, token: str | None,
                   event_fields: Mapping[str, str] | None = None, spool_root: Path | None = None,
                   endpoint_url: str | None = None, policy: TrustPolicy | None = None) -> Placement:
    """Open the tiers named by ``urls`` (fastest first; ``endpoint_url`` for s3:// ones) and the index;
    ``policy``: the trust policy entries read from slower tiers must pass."""
    tiers = list(urls)
    if not tiers or not is_local_url(tiers[0]):
        # The runtimes need a directory: a local cache goes in front of remote-only tiers.
        tiers.insert(0, str(default_cache_home() / "store"))
    chain = Tiers.open(tiers, endpoint_url=endpoint_url, policy=policy)
    try:
        work = chain.local
        if work.read_only or work.runtime_root is None:
            raise ConfigError(f"the first tier {work.url} must be a writable local directory")
    except BaseException:
        chain.close()
        raise
    return Placement(chain, open_index(index_url, token, spool_root=spool_root), dict(event_fields or {}))
