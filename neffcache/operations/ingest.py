"""Manifests for entries, and copying entries between stores with verification.

Every copy between stores goes through :func:`transfer`: each file is read once, its digest
taken from the bytes actually written or sent, and checked against the source manifest
before the entry's commit marker is written at the destination. Entries the runtimes wrote themselves have
no manifest: one is computed on ingest and marked ``computed``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from neffcache.coordination.releases import BatchedReleases
from neffcache.entry import Entry, EntryState
from neffcache.errors import CorruptEntry, EntryNotFound, NoSpace, PlaceholderNeff, SourceChanged, UntrustedEntry
from neffcache.layouts import get_layout
from neffcache.manifest import FileDigest, Manifest, sha256_bytes, sha256_file, sha256_stream
from neffcache.operations import publisher
from neffcache.operations.publish import PublishResult, publish
from neffcache.placeholder import placeholders_among
from neffcache.regular import open_regular
from neffcache.stores.base import FileSource, Store
from neffcache.stores.hashed_io import is_no_space
from neffcache.toolchain import Toolchain

log = logging.getLogger(__name__)


def build_manifest(
    layout: str,
    key: str,
    files: Mapping[str, FileSource],
    *,
    toolchain: Toolchain | None,
    flags: Sequence[str] = (),
    tags: Mapping[str, str] | None = None,
    compile_seconds: float | None = None,
    computed: bool = False,
    created: float | None = None,
    exclude: Sequence[str] = (),
) -> Manifest:
    """The manifest of ``files``. Refuses (:class:`~neffcache.errors.PlaceholderNeff`) files that are
    ``plan`` placeholders: a manifest vouches for an entry, and ingest gives one to entries a
    runtime wrote in place."""
    refused = placeholders_among(files)
    if refused:
        raise PlaceholderNeff(key, refused)
    digests = {
        name: sha256_bytes(src) if isinstance(src, bytes) else sha256_file(src)
        for name, src in files.items()
        if name not in exclude
    }
    manifest = Manifest(layout=layout, key=key, files=digests, toolchain=toolchain, flags=tuple(flags),
                        tags=dict(tags or {}), compile_seconds=compile_seconds, computed=computed)
    if created is not None:
        manifest = dataclasses.replace(manifest, created=created)
    return publisher.current().mint(manifest)


def transferable_names(entry: Entry) -> list[str]:
    """The files that make up an entry: no locks, no temp files, not the manifest."""
    return get_layout(entry.layout).transferable_names(entry)


def read_flags(store: Store, entry: Entry) -> list[str]:
    """The compiler flags an entry was built with, from its flags file (any era; the layout
    knows the forms). [] when it has none or it cannot be read."""
    layout = get_layout(entry.layout)
    name = layout.flags_of(entry)
    if name is None:
        return []
    try:
        return layout.read_user_flags(name, store.read_bytes(entry.store_path(name)))
    except (ValueError, EntryNotFound):
        return []


Vet = Callable[[Entry, Callable[[str], bytes]], str | None]


def transfer(src: Store, entry: Entry, dst: Store, *, tags: Mapping[str, str] | None = None,
             known_absent: bool = False, releases: BatchedReleases | None = None, local: bool = False,
             vet: Vet | None = None) -> PublishResult:
    """Copy one SUCCESS entry from ``src`` to ``dst``, verified, published atomically.

    Every file is read once, and the bytes hashed are the bytes published:

    - to a remote store from a local one, the upload hashes what it sends (S3: each part as
      it is read) and the store checks it against the manifest before it makes the file
      visible, and before the commit marker (publish passes the digests down); an entry
      without a manifest gets one made of the digests of the bytes sent;
    - into a local staging directory otherwise (downloads hash as they write; a local
      source is copied, then the *staged copy* is hashed), and the staged copies, private to
      this transfer, are checked and then published by rename.

    Raises CorruptEntry when the source files do not match the source manifest, SourceChanged
    when a source file was rewritten while it was read, NoSpace when the destination (or its
    staging directory) is full: nothing is committed at the destination in any of these.
    ``releases``: the publish lease is released with a batch of others (a sync's).
    ``local``: ``dst`` is a node-local tier (a prefetch's): the entry lands in the runtime's local
    form where it has one (:func:`~neffcache.operations.publish.publish`).
    ``vet(entry, read)``: a reader's last word, asked of the verified copies just before they are
    published (``read`` reads one of them by name): a reason refuses the entry
    (:class:`~neffcache.errors.UntrustedEntry`), nothing committed (neffcache/operations/claims.py).
    """
    if entry.state is not EntryState.SUCCESS:
        raise CorruptEntry(entry.path, [f"only SUCCESS entries are transferred, not {entry.state}"])
    started = time.time()
    try:
        return _transfer(src, entry, dst, tags=tags, known_absent=known_absent, releases=releases,
                         to_local_tier=local, vet=vet)
    except CorruptEntry as exc:
        # A mismatch with a source file modified since we started is a rewrite under us, not
        # corruption at the source: say so (and tiers then never quarantine it).
        changed = _changed_since(src, entry, started)
        if changed is not None:
            raise SourceChanged(entry.store_path(changed), store=src.url) from exc
        raise


def _changed_since(src: Store, entry: Entry, started: float) -> str | None:
    for name in transferable_names(entry):
        local = src.local_path(entry.store_path(name))
        try:
            if local is not None and local.stat().st_ctime >= started:
                return name
        except OSError:
            continue
    return None


def _transfer(src: Store, entry: Entry, dst: Store, *, tags: Mapping[str, str] | None,
              known_absent: bool, releases: BatchedReleases | None, to_local_tier: bool = False,
              vet: Vet | None = None) -> PublishResult:
    names = transferable_names(entry)
    where = f"{src.url}/{entry.path}"
    with dst.staging_dir() as staging:
        local: dict[str, Path] = {}
        staged: dict[str, FileDigest] = {}
        for i, name in enumerate(names):
            direct = src.local_path(entry.store_path(name))
            if direct is not None and dst.local_path(entry.store_path(name)) is None:
                local[name] = direct  # local source to a remote store: hashed while uploading
                continue
            dest = staging / f"{i}.part"
            listed = entry.files.get(name)
            if direct is None and listed is not None and listed.size == 0:
                # The listing showed it empty (model.done): nothing to fetch, a request saved per
                # entry. Checked against the manifest like any staged copy.
                dest.touch()
                staged[name] = sha256_bytes(b"")
            else:
                staged[name] = fetch_file(src, entry.store_path(name), dest, dst)
            local[name] = dest
        if entry.manifest is not None:
            problems = [p for n, d in staged.items() if (p := _problem(n, d, entry.manifest.files.get(n)))]
            problems += [f"{n} is missing" for n in entry.manifest.files if n not in local]
            if problems:
                raise CorruptEntry(where, problems)
            manifest = _completed(entry, staged)
            manifest = dataclasses.replace(manifest, tags={**manifest.tags, **tags}) if tags else manifest
        else:
            # A runtime-written entry: the manifest is built from the staged copies' digests and,
            # for files uploaded in place, from the digests of the bytes the upload sends, taken
            # in that one read (publish's ``unhashed``, which says in what order that is safe).
            manifest = publisher.current().mint(Manifest(
                layout=entry.layout, key=entry.key, files=dict(staged), toolchain=entry.namespace.toolchain,
                flags=tuple(read_flags(src, entry)), tags=dict(tags or {}), computed=True, created=entry.mtime))
        movable = all(n in staged for n in local)
        sources: dict[str, FileSource] = dict(local)
        if entry.manifest is None:
            unhashed = frozenset(n for n in local if n not in staged)
        else:  # uploaded in place, a late payload file the manifest lacks: hashed as it is sent
            late = get_layout(entry.layout).late_payload
            unhashed = frozenset(n for n in local if n not in staged and n in late and n not in manifest.files)
        if vet is not None and (why := vet(dataclasses.replace(entry, manifest=manifest), _reader(local))):
            raise UntrustedEntry(where, [why])
        key = _content_key(entry, local, where)  # NxDI: a root's copy lands under its config hash
        manifest = dataclasses.replace(manifest, key=key) if key != manifest.key else manifest
        return publish(dst, entry.namespace, key, sources, manifest, move=movable,
                       known_absent=known_absent, verified=frozenset(staged), unhashed=unhashed,
                       releases=releases, local=to_local_tier)


MAX_KEYED_FILE = 16 << 20  # bytes: the file a key is a hash of (a config) is small; a bigger one is refused


def _reader(local: Mapping[str, Path]) -> Callable[[str], bytes]:
    """Read one of a transfer's verified copies by name, a regular file of at most
    :data:`MAX_KEYED_FILE` bytes (ValueError otherwise): what a key rule or a vet reads."""

    def read(name: str) -> bytes:
        if name not in local:
            raise ValueError(f"{name} is missing")
        with open(open_regular(local[name]), "rb") as f:
            data = f.read(MAX_KEYED_FILE + 1)
        if len(data) > MAX_KEYED_FILE:
            raise ValueError(f"{name} is larger than {MAX_KEYED_FILE} bytes")
        return data

    return read


def _content_key(entry: Entry, local: Mapping[str, Path], where: str) -> str:
    """The key the entry is published under: its own, or the one its content gives
    (:meth:`Layout.key_from_content`, read from the very copies about to be published).
    CorruptEntry when the content contradicts the name: nothing lands."""
    try:
        return get_layout(entry.layout).key_from_content(entry.key, _reader(local))
    except (ValueError, OSError) as exc:
        raise CorruptEntry(where, [str(exc)]) from None


def _completed(entry: Entry, staged: Mapping[str, FileDigest]) -> Manifest:
    """``entry``'s manifest, covering too the runtime files a manifest of its revision did not
    know to cover (:attr:`Layout.late_payload`), with the digests of the staged copies: what is
    published is what was hashed, and the destination's manifest vouches for the whole entry."""
    manifest = entry.manifest
    assert manifest is not None
    late = get_layout(entry.layout).late_payload
    added = {n: d for n, d in staged.items() if n in late and n not in manifest.files}
    if not added:
        return manifest
    return dataclasses.replace(manifest, files={**manifest.files, **added})


def fetch_file(src: Store, path: str, dest: Path, dst: Store) -> FileDigest:
    """Copy one file into ``dst``'s staging directory; the digest of the bytes written there."""
    try:
        got = src.get_file(path, dest)
        # A backend that copies without hashing (a local copy_file_range): hash the staged
        # copy, which is what gets published.
        return got if got is not None else sha256_file(dest)
    except NoSpace:
        raise
    except OSError as exc:
        if is_no_space(exc):
            raise NoSpace(dst.url, path=path, reason=exc.strerror or str(exc)) from exc
        raise


def _problem(name: str, got: FileDigest, expected: FileDigest | None) -> str | None:
    if expected is None or got == expected:
        return None
    return (f"{name}: sha256 {got.sha256[:12]}… ({got.size} B), manifest says "
            f"{expected.sha256[:12]}… ({expected.size} B)")


def digest_of(store: Store, path: str) -> FileDigest:
    local = store.local_path(path)
    if local is not None:
        try:
            return sha256_file(local)
        except FileNotFoundError:
            raise EntryNotFound(f"{path} not found in {store.url}", store=store.url, path=path) from None
    with store.open_read(path) as stream:
        return sha256_stream(stream)
