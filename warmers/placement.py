"""Where a warm-up reads, writes, coordinates and reports.

- the **work store**: the first local tier (NVMe, FSx). The runtimes need a filesystem path,
  so the workloads read and write here; without a local tier, a local cache under
  ``$XDG_CACHE_HOME/neffcache/store`` is put in front of the remote ones;
- the **writable tiers**: every new entry is published to each of them (work store first);
- the **coordinator**: the last writable tier, the one shared most widely (S3 or FSx across
  hosts). Compile leases live there, so two hosts never compile the same graph;
- the **index**, optional: entries are registered and events sent through the client's spool,
  so an index that is down never fails a warm-up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from neffcache.config import default_cache_home
from neffcache.entry import Entry, EntryState, Namespace
from neffcache.errors import ConfigError, StoreError
from neffcache.index import Index, open_index
from neffcache.index.records import EntryRecord, EventKind
from neffcache.ingest import build_manifest, read_flags, transfer, transferable_names
from neffcache.layouts.neuronxcc import HLO, NEFF
from neffcache.manifest import Manifest
from neffcache.publish import PublishStatus
from neffcache.scan import load_entry
from neffcache.stamps import record_use
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.sync import pull
from neffcache.toolchain import Toolchain

log = logging.getLogger(__name__)


@dataclass
class Placement:
    work: Store
    tiers: list[Store]  # every tier, in the order given (work included)
    index: Index
    event_fields: dict[str, str] = field(default_factory=dict)  # model, team, job for events

    @property
    def work_root(self) -> str:
        assert isinstance(self.work, LocalStore)
        return str(self.work.root).rstrip("/")

    @property
    def remotes(self) -> list[Store]:
        return [s for s in self.tiers if s is not self.work]

    @property
    def writable(self) -> list[Store]:
        return [self.work, *(s for s in self.remotes if not s.read_only)]

    @property
    def coordinator(self) -> Store:
        return self.writable[-1]

    def close(self) -> None:
        self.index.close()
        for store in self.tiers:
            store.close()

    # -- reading --------------------------------------------------------------------------
    def prefetch(self, namespaces: Sequence[Namespace], *, tags: Mapping[str, str] | None = None,
                 parallel: int = 16) -> tuple[int, int]:
        """Pull the namespaces' entries the work store lacks from the remote tiers, verified.

        Returns (entries, bytes). Faster tiers first: what one tier supplied, the next skips.
        """
        entries = size = 0
        for remote in self.remotes:
            report = pull(remote, self.work, namespaces=[ns.path for ns in namespaces], tags=tags,
                          parallel=parallel)
            entries += len(report.copied)
            size += report.bytes
            for failure in report.failed:
                log.warning("prefetch of %s from %s failed: %s", failure.path, remote.url, failure.reason)
        return entries, size

    def find(self, path: str) -> tuple[Store, Entry] | None:
        """The first tier holding a SUCCESS entry at ``path``."""
        for store in self.tiers:
            entry = load_entry(store, path)
            if entry is not None and entry.state is EntryState.SUCCESS:
                return store, entry
        return None

    def bring_to_work(self, path: str) -> bool:
        """Make the work store hold ``path`` if any tier does (a concurrent host compiled it)."""
        found = self.find(path)
        if found is None:
            return False
        store, entry = found
        if store is not self.work:
            transfer(store, entry, self.work)
        return True

    def compile_seconds_of(self, path: str, since: float) -> float | None:
        """A runtime-compiled entry's compile time, from its files: HLO written (or ``since``,
        if older) to NEFF written. The runtimes log no duration; this is the honest bound."""
        entry = load_entry(self.work, path, read_manifest=False)
        if entry is None:
            return None
        neff = entry.files.get(entry.marker_name if entry.layout == "torchneuron" else NEFF)
        hlo = next((f for n, f in entry.files.items() if n.endswith((HLO, ".hlo"))), None)
        if neff is None:
            return None
        begin = max(since, hlo.mtime) if hlo is not None else since
        return round(max(0.0, neff.mtime - begin), 3)

    # -- writing --------------------------------------------------------------------------
    def ingest(self, path: str, *, toolchain: Toolchain, tags: Mapping[str, str],
               compile_seconds: float | None = None, skip_managed: bool = False
               ) -> tuple[Entry, list[Store]] | None:
        """Manifest, publish and register an entry the runtime wrote into the work store.

        Returns the entry and the stores holding it; None when it is not a whole SUCCESS entry
        (a compile stopped midway), or with ``skip_managed`` when it has a manifest already
        (a hit on an entry neffcache published before: nothing new to publish).
        """
        entry = load_entry(self.work, path)
        if entry is None or entry.state is not EntryState.SUCCESS:
            return None
        if entry.has_manifest and skip_managed:
            return None
        entry = self.adopt(entry, toolchain=toolchain, tags=tags, compile_seconds=compile_seconds)
        held = self.publish_remote(entry)
        self.register(entry, held)
        return entry, held

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
        self.work.put_file(entry.store_path(entry.manifest_name), manifest.to_bytes(), exclusive=True)
        return load_entry(self.work, entry.path) or entry

    def publish_remote(self, entry: Entry) -> list[Store]:
        """Copy a work-store entry to every other writable tier; the stores that now hold it."""
        held = [self.work]
        for store in self.writable[1:]:
            try:
                result = transfer(self.work, entry, store)
            except StoreError as exc:
                log.warning("could not publish %s to %s: %s", entry.path, store.url, exc)
                continue
            if result.status is not PublishStatus.BUSY:
                held.append(store)
        return held

    def register(self, entry: Entry, stores: Iterable[Store]) -> None:
        manifest = entry.manifest
        records = [entry_record(entry, store.url, manifest) for store in stores]
        self.index.register_entries(records)

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


def entry_record(entry: Entry, store_url: str, manifest: Manifest | None) -> EntryRecord:
    tc = entry.toolchain
    neff = manifest.files.get(entry.marker_name if entry.layout == "torchneuron" else "model.neff") \
        if manifest else None
    record: EntryRecord = {
        "path": entry.path, "layout": "torchneuron" if entry.layout == "torchneuron" else "neuronxcc",
        "key": entry.key, "namespace": entry.namespace.path,
        "toolchain": tc.to_json() if tc else None,  # type: ignore[typeddict-item]
        "state": "SUCCESS", "size": manifest.size if manifest else entry.size,
        "neff_sha256": neff.sha256 if neff else None, "store": store_url,
        "tags": dict(manifest.tags) if manifest else {},
        "created": manifest.created if manifest else time.time(),
        "producer": manifest.producer if manifest else "",
        "compile_seconds": manifest.compile_seconds if manifest else None,
    }
    return record


def open_placement(urls: Sequence[str], *, index_url: str | None, token: str | None,
                   event_fields: Mapping[str, str] | None = None) -> Placement:
    """Open the tiers named by ``urls`` (fastest first) and the index."""
    tiers = [open_store(u) for u in urls]
    work: Store | None = next((s for s in tiers if isinstance(s, LocalStore) and not s.read_only), None)
    if work is None:
        # Only remote tiers: the runtimes still need a directory, so a local cache goes in front.
        work = open_store(str(default_cache_home() / "store"))
        tiers.insert(0, work)
    if work.read_only:
        raise ConfigError(f"the work store {work.url} must be writable")
    return Placement(work, tiers, open_index(index_url, token), dict(event_fields or {}))
