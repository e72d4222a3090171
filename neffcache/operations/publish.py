"""Publishing an entry into a store: whole or not at all, and never over a healthy entry.

The order is what makes it safe to ``kill -9`` at any instant:

1. take the entry's publish lease (so two publishers never interleave their files), then, on
   a store only this host writes, wait while a prune holds the entry's prune group (see
   :mod:`neffcache.coordination.write_leases`);
2. write the manifest (``neffcache.json``: every file's sha256 and size) — from here on the
   layout reads the directory as *uncommitted*, never as an EMPTY entry a runtime would take;
3. write the data files, each whole (temp name + rename, or a staged S3 object), each checked
   against the manifest by the store in the same read that writes or sends it (``expect``);
   a file rewritten meanwhile fails the publish here, before any commit marker;
4. create the runtime's commit marker exclusively (``model.done`` in layout A, the ``.neff``
   itself in layout B) — the one file both the runtime and neffcache treat as "this entry
   exists". Until it is there, a reader treats the entry as absent; a publisher killed
   before it leaves only files that ``prune --garbage`` removes.

The marker, not the manifest, is the commit point because it is the one the real runtime
honours: were the manifest last, a runtime could serve an entry neffcache still considered
absent, or a killed publish could leave a directory a runtime reads as an EMPTY graph.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from neffcache.coordination.write_leases import exclusive_write
from neffcache.entry import Namespace
from neffcache.errors import PlaceholderNeff
from neffcache.layouts import get_layout
from neffcache.manifest import FileDigest, Manifest, sha256_bytes, sha256_file
from neffcache.outcomes import PublishStatus
from neffcache.placeholder import placeholders_among
from neffcache.stores.base import Source, Store

log = logging.getLogger(__name__)
# A runtime lock younger than this means a job is compiling the entry right now.
RUNTIME_LOCK_FRESH_SECONDS = 3600.0


@dataclass(frozen=True)
class PublishResult:
    path: str
    status: PublishStatus
    bytes: int = 0
    manifest: Manifest | None = None  # the manifest that was published (PUBLISHED only)

    @property
    def ok(self) -> bool:
        """The store holds a healthy entry at ``path`` now: published by this call or already
        there. False for BUSY (another writer holds it): not there yet, look again."""
        return self.status is not PublishStatus.BUSY


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
    verified: Collection[str] = (),
) -> PublishResult:
    """Publish ``files`` (names relative to the entry's base) with ``manifest`` into ``store``.

    ``manifest`` must already describe ``files`` (see :func:`neffcache.operations.ingest.build_manifest`).
    Every file the manifest lists is written with its digest as ``expect``: the store hashes
    the bytes it writes or sends and refuses a mismatch (SourceChanged, CorruptEntry) before
    the commit marker exists. A NEFF that is a ``plan`` placeholder is refused before anything
    is written (:class:`~neffcache.errors.PlaceholderNeff`). ``verified`` names sources the
    caller hashed itself from the very bytes it hands over (private staged copies, consumed
    with ``move``): not hashed again.
    ``move`` lets a local store consume source files by rename.
    ``known_absent``: the caller's own listing of ``store`` just showed neither the entry nor a
    runtime lock, so the two lookups before the lease are skipped (a remote store pays a
    request for each); the check under the lease, which decides races, always runs.
    """
    layout = get_layout(namespace.layout)
    plan = layout.plan_entry(namespace, key)
    _refuse_placeholders(plan.path, files, [layout.names(namespace, key).neff, plan.marker_name])
    marker_path = _join(plan.base, plan.marker_name)
    if plan.marker_name not in files:  # written below as an empty file: the manifest covers it too
        manifest = manifest.with_marker(plan.marker_name)
    if not known_absent:
        if store.stat(marker_path) is not None:
            return PublishResult(plan.path, PublishStatus.EXISTS)
        runtime_lock = layout.names(namespace, key).runtime_lock
        if runtime_lock is not None and _runtime_compiling(store, _join(plan.base, runtime_lock)):
            return PublishResult(plan.path, PublishStatus.BUSY)

    with exclusive_write(store, plan.path) as lease:
        if lease is None:
            return PublishResult(plan.path, PublishStatus.BUSY)
        if store.stat(marker_path) is not None:
            return PublishResult(plan.path, PublishStatus.EXISTS)
        names = [n for n in files if n not in (plan.manifest_name, plan.marker_name)]

        def expect(name: str) -> FileDigest | None:
            return None if name in verified else manifest.files.get(name)

        store.put_file(_join(plan.base, plan.manifest_name), manifest.to_bytes())
        for name in layout.write_order(names, plan.marker_name, plan.manifest_name):
            store.put_file(_join(plan.base, name), files[name], move=move, expect=expect(name))
        marker_source = files.get(plan.marker_name, b"")
        if lease.lost:
            # Our heartbeat lapsed and someone took over: let them commit.
            return PublishResult(plan.path, PublishStatus.BUSY)
        if not store.put_file(marker_path, marker_source, exclusive=True, move=move,
                              expect=expect(plan.marker_name)):
            return PublishResult(plan.path, PublishStatus.EXISTS)
        return PublishResult(plan.path, PublishStatus.PUBLISHED, manifest.size, manifest)


def _refuse_placeholders(path: str, files: Mapping[str, Source], names: list[str | None]) -> None:
    """Every commit to a store passes through publish (push, pull, promotion, warm-ups): this is
    the one gate that keeps ``plan``'s placeholder NEFFs out of real stores, whatever backend
    then writes the bytes."""
    refused = placeholders_among(files, names)
    if refused:
        raise PlaceholderNeff(path, refused)


def _runtime_compiling(store: Store, lock_path: str) -> bool:
    info = store.stat(lock_path)
    return info is not None and time.time() - info.mtime < RUNTIME_LOCK_FRESH_SECONDS


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name

