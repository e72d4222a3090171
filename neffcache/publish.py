"""Publishing an entry into a store: whole or not at all, and never over a healthy entry.

The order is what makes it safe to ``kill -9`` at any instant:

1. take the entry's publish lease (so two publishers never interleave their files);
2. write the manifest (``neffcache.json``: every file's sha256 and size) — from here on the
   layout reads the directory as *uncommitted*, never as an EMPTY entry a runtime would take;
3. write the data files, each whole (temp name + rename, or a staged S3 object);
4. create the runtime's commit marker exclusively (``model.done`` in layout A, the ``.neff``
   itself in layout B) — the one file both the runtime and neffcache treat as "this entry
   exists". Until it is there, a reader treats the entry as absent; a publisher killed
   before it leaves only files that ``prune --garbage`` removes.

The marker, not the manifest, is the commit point because it is the one the real runtime
honours: were the manifest last, a runtime could serve an entry neffcache still considered
absent, or a killed publish could leave a directory a runtime reads as an EMPTY graph.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from neffcache.entry import Namespace
from neffcache.layouts import get_layout
from neffcache.layouts.neuronxcc import HLO, LOCK_SUFFIX
from neffcache.lease import Lease, try_acquire
from neffcache.manifest import Manifest, sha256_bytes, sha256_file
from neffcache.stores.base import Source, Store

log = logging.getLogger(__name__)
PUBLISH_LEASE_TTL = 300.0
# A runtime lock younger than this means a job is compiling the entry right now.
RUNTIME_LOCK_FRESH_SECONDS = 3600.0


class PublishStatus(enum.StrEnum):
    PUBLISHED = "published"
    EXISTS = "exists"  # someone else's healthy entry is there: losing the race is success
    BUSY = "busy"  # another publisher or a compiling runtime holds it right now


@dataclass(frozen=True)
class PublishResult:
    path: str
    status: PublishStatus
    bytes: int = 0
    manifest: Manifest | None = None  # the manifest that was published (PUBLISHED only)

    @property
    def ok(self) -> bool:
        return True


def publish_lease_name(entry_path: str) -> str:
    return f"publish:{entry_path}"


def digest_source(source: Source) -> tuple[str, int]:
    d = sha256_bytes(source) if isinstance(source, bytes) else sha256_file(source)
    return d.sha256, d.size


def publish(
    store: Store,
    namespace: Namespace,
    key: str,
    files: Mapping[str, Source],
    manifest: Manifest,
    *,
    move: bool = False,
    known_absent: bool = False,
) -> PublishResult:
    """Publish ``files`` (names relative to the entry's base) with ``manifest`` into ``store``.

    ``manifest`` must already describe ``files`` (see :func:`neffcache.ingest.build_manifest`);
    the caller verified them. ``move`` lets a local store consume source files by rename.
    ``known_absent``: the caller's own listing of ``store`` just showed neither the entry nor a
    runtime lock, so the two lookups before the lease are skipped (a remote store pays a
    request for each); the check under the lease, which decides races, always runs.
    """
    layout = get_layout(namespace.layout)
    plan = layout.plan_entry(namespace, key)
    marker_path = _join(plan.base, plan.marker_name)
    if not known_absent:
        if store.stat(marker_path) is not None:
            return PublishResult(plan.path, PublishStatus.EXISTS)
        if namespace.layout == "neuronxcc" and _runtime_compiling(store, plan.base):
            return PublishResult(plan.path, PublishStatus.BUSY)

    got = try_acquire(store, publish_lease_name(plan.path), ttl=PUBLISH_LEASE_TTL)
    if not isinstance(got, Lease):
        log.debug("%s is being published by %s", plan.path, got.owner)
        return PublishResult(plan.path, PublishStatus.BUSY)
    lease = got
    lease.keep_alive()
    try:
        if store.stat(marker_path) is not None:
            return PublishResult(plan.path, PublishStatus.EXISTS)
        names = [n for n in files if n not in (plan.manifest_name, plan.marker_name)]
        store.put_file(_join(plan.base, plan.manifest_name), manifest.to_bytes())
        for name in layout.write_order(names, plan.marker_name, plan.manifest_name):
            store.put_file(_join(plan.base, name), files[name], move=move)
        marker_source = files.get(plan.marker_name, b"")
        if lease.lost:
            # Our heartbeat lapsed and someone took over: let them commit.
            return PublishResult(plan.path, PublishStatus.BUSY)
        if not store.put_file(marker_path, marker_source, exclusive=True, move=move):
            return PublishResult(plan.path, PublishStatus.EXISTS)
        return PublishResult(plan.path, PublishStatus.PUBLISHED, manifest.size, manifest)
    finally:
        lease.release()


def _runtime_compiling(store: Store, base: str) -> bool:
    info = store.stat(_join(base, HLO + LOCK_SUFFIX))
    return info is not None and time.time() - info.mtime < RUNTIME_LOCK_FRESH_SECONDS


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name

