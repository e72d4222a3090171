"""Publishing an entry into a store: whole or not at all, and never over a healthy entry.

The order is what makes it safe to ``kill -9`` at any instant. Where the layout names an
*anchor*, a data file whose presence alone reads as uncommitted (layout A: ``model.neff``
without ``model.done``; :meth:`neffcache.layouts.base.Layout.data_before_manifest`):

1. take the entry's publish lease (so two publishers never interleave their files), then, on
   a store only this host writes, wait while a prune holds the entry's prune group (see
   :mod:`neffcache.coordination.write_leases`);
2. write the anchor *exclusively*. It can already be there only if an entry was committed
   here since the caller looked (its marker then says so: EXISTS, and nothing of ours was
   written over it) or a killed publish left it (no marker: garbage, overwritten). So this
   write answers what a lookup of the marker under the lease would ask, without that request
   when the entry is absent, the common case. From here on the directory reads as
   *uncommitted*, never as an EMPTY entry a runtime would take;
3. the other data files, each whole (temp name + rename, or one S3 object);
4. the manifest (``neffcache.json``: every file's sha256 and size);
5. create the runtime's commit marker exclusively (``model.done`` in layout A, the NEFF of
   its text form, which has no ``model.done``: ``Layout.publish_plan``; the ``.neff`` itself
   in layout B) — the one file both the runtime and neffcache treat as "this entry
   exists". Until it is there, a reader treats the entry as absent; a publisher killed
   before it leaves only files that ``prune --garbage`` removes.

Every data file is checked by the store in the same read that writes or sends it: against
the manifest (``expect``), or, for an entry whose manifest is computed from what is sent (a
runtime-written entry pushed to a remote store, ``unhashed``), by having its digest taken
from those very bytes (``Store.put_hashed``: a source that moved during its read is refused
before it becomes visible, one modified moments before is read twice). Such a manifest is
made of exactly those digests, so it describes what the store holds; the marker's own bytes,
tiny by definition, are read once into memory, hashed and later sent from there. A file
rewritten meanwhile fails the publish before the manifest and the marker.

A layout without an anchor (B's HLO alone reads as EMPTY, C's artifacts alone as a vLLM
compile) writes the manifest first instead, after looking for the marker under the lease:
from then on its directory reads as uncommitted. Its computed manifests are hashed before
the files are sent: a second read, checked like any other by the store (``expect``).

The marker, not the manifest, is the commit point because it is the one the real runtime
honours: were the manifest last, a runtime could serve an entry neffcache still considered
absent, or a killed publish could leave a directory a runtime reads as an EMPTY graph.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from neffcache.coordination.releases import BatchedReleases
from neffcache.coordination.write_leases import exclusive_write
from neffcache.entry import Namespace
from neffcache.errors import PlaceholderNeff
from neffcache.layouts import get_layout
from neffcache.layouts.base import Layout
from neffcache.layouts.records import EntryPlan
from neffcache.manifest import FileDigest, Manifest, sha256_bytes, sha256_file
from neffcache.operations import publisher
from neffcache.outcomes import PublishStatus
from neffcache.placeholder import placeholders_among
from neffcache.stores.base import FileSource, Store

log = logging.getLogger(__name__)
# A runtime lock younger than this means a job is compiling the entry right now.
RUNTIME_LOCK_FRESH_SECONDS = 3600.0
MARKER_IN_MEMORY = 1 << 20  # bytes: a commit marker is empty or tiny; a bigger one is hashed first


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


def digest_source(source: FileSource) -> tuple[str, int]:
    d = sha256_bytes(source) if isinstance(source, bytes) else sha256_file(source)
    return d.sha256, d.size


def publish(
    store: Store,
    namespace: Namespace,
    key: str,
    files: Mapping[str, FileSource],
    manifest: Manifest,
    *,
    move: bool = False,
    known_absent: bool = False,
    verified: Collection[str] = (),
    unhashed: Collection[str] = (),
    releases: BatchedReleases | None = None,
    local: bool = False,
) -> PublishResult:
    """Publish ``files`` (names relative to the entry's base) with ``manifest`` into ``store``.

    ``manifest`` must already describe ``files`` (see :func:`neffcache.operations.ingest.build_manifest`).
    Every file the manifest lists is written with its digest as ``expect``: the store hashes
    the bytes it writes or sends and refuses a mismatch (SourceChanged, CorruptEntry) before
    the commit marker exists. A NEFF that is a ``plan`` placeholder is refused before anything
    is written (:class:`~neffcache.errors.PlaceholderNeff`). ``verified`` names sources the
    caller hashed itself from the very bytes it hands over (private staged copies, consumed
    with ``move``): not hashed again. ``move`` lets a local store consume source files by rename.
    ``known_absent``: the caller's own listing of ``store`` just showed neither the entry nor a
    runtime lock, so the two lookups before the lease are skipped (a remote store pays a
    request for each); the check under the lease, which decides races, always runs.
    ``unhashed`` names local source files ``manifest`` does not describe yet: their digests
    are taken from the bytes sent and completed into the manifest (the module docstring says
    in which order, and why it stays safe). ``releases``: release the lease in a batch (coordination/
    releases.py). ``local``: into a node-local tier, in its runtime's form (:meth:`Layout.publish_plan`).
    """
    layout = get_layout(namespace.layout)
    plan = layout.publish_plan(namespace, key, files.keys(), local=local)
    carried = manifest  # as handed in: what a signature it carries covers (publisher.seal)
    # The file a runtime loads: the NEFF (layout B's is its marker too); layouts without one: the marker.
    _refuse_placeholders(plan.path, files, [layout.names(namespace, key).neff or plan.marker_name])
    marker_path = _join(plan.base, plan.marker_name)
    manifest = manifest if plan.marker_name in files else manifest.with_marker(plan.marker_name)  # written empty
    if not known_absent:
        if store.stat(marker_path) is not None:
            return PublishResult(plan.path, PublishStatus.EXISTS)
        runtime_lock = layout.names(namespace, key).runtime_lock
        if runtime_lock is not None and _runtime_compiling(store, _join(plan.base, runtime_lock)):
            return PublishResult(plan.path, PublishStatus.BUSY)

    with exclusive_write(store, plan.path, releases) as lease:
        if lease is None:
            return PublishResult(plan.path, PublishStatus.BUSY)
        written = _write_entry(store, layout, plan, files, manifest, move=move, verified=frozenset(verified),
                               unhashed=frozenset(unhashed), seal=lambda m: publisher.seal(m, carried, namespace, key))
        if written is None:
            return PublishResult(plan.path, PublishStatus.EXISTS)
        manifest, marker_source = written
        if lease.lost:  # our heartbeat lapsed and someone took over: let them commit
            return PublishResult(plan.path, PublishStatus.BUSY)
        marker_expect = None if plan.marker_name in verified else manifest.files.get(plan.marker_name)
        if not store.put_file(marker_path, marker_source, exclusive=True, move=move, expect=marker_expect):
            return PublishResult(plan.path, PublishStatus.EXISTS)
        return PublishResult(plan.path, PublishStatus.PUBLISHED, manifest.size, manifest)


def _refuse_placeholders(path: str, files: Mapping[str, FileSource], names: list[str | None]) -> None:
    """Every commit to a store passes through publish (push, pull, promotion, warm-ups): this is
    the one gate that keeps ``plan``'s placeholder NEFFs out of real stores, whatever backend
    then writes the bytes."""
    refused = placeholders_among(files, names)
    if refused:
        raise PlaceholderNeff(path, refused)


def _write_entry(store: Store, layout: Layout, plan: EntryPlan, files: Mapping[str, FileSource], manifest: Manifest,
                 *, move: bool, verified: frozenset[str], unhashed: frozenset[str],
                 seal: Callable[[Manifest], Manifest]) -> tuple[Manifest, FileSource] | None:
    """Everything but the commit marker, in the order the module docstring argues; returns the
    manifest written and the marker's source (its bytes, when it was read to be hashed), or
    None when the entry turned out to be committed already (nothing of ours was written).
    ``seal`` completes the manifest once every digest is known: signed, or its carried
    signature kept or dropped (neffcache/operations/publisher.py)."""
    names = [n for n in files if n not in (plan.manifest_name, plan.marker_name)]
    marker_source = files.get(plan.marker_name, b"")
    anchored = layout.data_before_manifest(names)
    if unhashed and (anchored is None or not _small(marker_source)):
        manifest = _completed(manifest, {n: sha256_file(_local(files[n])) for n in unhashed})
        unhashed = frozenset()
    if plan.marker_name in unhashed:
        marker_source = _local(marker_source).read_bytes()  # hashed from, and sent from, these bytes

    def put(name: str, *, exclusive: bool = False) -> FileDigest | bool | None:
        """Write one data file: its digest when hashed on the way, else whether it was written."""
        path, source = _join(plan.base, name), files[name]
        if name in unhashed:
            return store.put_hashed(path, _local(source), exclusive=exclusive)
        return store.put_file(path, source, exclusive=exclusive, move=move,
                              expect=None if name in verified else manifest.files.get(name))

    marker_path = _join(plan.base, plan.marker_name)
    manifest_path = _join(plan.base, plan.manifest_name)
    if anchored is None:
        if store.stat(marker_path) is not None:
            return None
        manifest = seal(manifest)
        store.put_file(manifest_path, manifest.to_bytes())
        for name in layout.write_order(names, plan.marker_name, plan.manifest_name):
            put(name)
        return manifest, marker_source
    # The anchor goes exclusively: it exists only if an entry was committed here (then the
    # marker says so) or a killed publish left it (garbage, overwritten). This answers what the
    # marker lookup under the lease asks, without its request when nothing is there.
    got = {anchored[0]: put(anchored[0], exclusive=True)}
    if got[anchored[0]] in (None, False):
        if store.stat(marker_path) is not None:
            return None
        got[anchored[0]] = put(anchored[0])
    got.update((name, put(name)) for name in anchored[1:])
    digests = {n: d for n, d in got.items() if isinstance(d, FileDigest)}
    if plan.marker_name in unhashed:
        digests[plan.marker_name] = sha256_bytes(_local_bytes(marker_source))
    manifest = seal(_completed(manifest, digests))
    store.put_file(manifest_path, manifest.to_bytes())
    return manifest, marker_source


def _completed(manifest: Manifest, digests: Mapping[str, FileDigest]) -> Manifest:
    return dataclasses.replace(manifest, files={**manifest.files, **digests})


def _small(marker: FileSource) -> bool:
    """A marker small enough to hold in memory between hashing it and sending it."""
    return isinstance(marker, bytes) or marker.stat().st_size <= MARKER_IN_MEMORY


def _local(source: FileSource) -> Path:
    if isinstance(source, bytes):
        raise TypeError("an unhashed source must be a local file")
    return source


def _local_bytes(source: FileSource) -> bytes:
    if not isinstance(source, bytes):
        raise TypeError("the marker was read into memory")
    return source


def _runtime_compiling(store: Store, lock_path: str) -> bool:
    info = store.stat(lock_path)
    return info is not None and time.time() - info.mtime < RUNTIME_LOCK_FRESH_SECONDS


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name

