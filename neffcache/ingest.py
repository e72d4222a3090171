"""Manifests for entries, and copying entries between stores with verification.

Every pull from a remote tier goes through :func:`transfer`: the files land in a staging
directory, their digests are checked against the source manifest, and only then is the
entry published (atomically) at the destination. Entries the runtimes wrote themselves have
no manifest: one is computed on ingest and marked ``computed``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from neffcache.entry import Entry, EntryState
from neffcache.errors import CorruptEntry, EntryNotFound
from neffcache.layouts import get_layout
from neffcache.manifest import FileDigest, Manifest, sha256_bytes, sha256_file, sha256_stream
from neffcache.publish import PublishResult, publish
from neffcache.stores.base import Source, Store
from neffcache.toolchain import Toolchain

log = logging.getLogger(__name__)


def build_manifest(
    layout: str,
    key: str,
    files: Mapping[str, Source],
    *,
    toolchain: Toolchain | None,
    flags: Sequence[str] = (),
    tags: Mapping[str, str] | None = None,
    compile_seconds: float | None = None,
    computed: bool = False,
    created: float | None = None,
    exclude: Sequence[str] = (),
) -> Manifest:
    digests = {
        name: sha256_bytes(src) if isinstance(src, bytes) else sha256_file(src)
        for name, src in files.items()
        if name not in exclude
    }
    manifest = Manifest(layout=layout, key=key, files=digests, toolchain=toolchain, flags=tuple(flags),
                        tags=dict(tags or {}), compile_seconds=compile_seconds, computed=computed)
    if created is not None:
        manifest = dataclasses.replace(manifest, created=created)
    return manifest


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


def check_digests(local: Mapping[str, Path], manifest: Manifest, where: str) -> None:
    problems = []
    for name, expected in manifest.files.items():
        path = local.get(name)
        if path is None:
            problems.append(f"{name} is missing")
            continue
        got = sha256_file(path)
        if got != expected:
            problems.append(
                f"{name}: sha256 {got.sha256[:12]}… ({got.size} B), manifest says "
                f"{expected.sha256[:12]}… ({expected.size} B)"
            )
    if problems:
        raise CorruptEntry(where, problems)


def manifest_for(store: Store, entry: Entry, local: Mapping[str, Path],
                 tags: Mapping[str, str] | None = None) -> Manifest:
    """The entry's own manifest (checked against the local copies) or one computed now."""
    if entry.manifest is not None:
        check_digests(local, entry.manifest, f"{store.url}/{entry.path}")
        if tags:
            merged = {**entry.manifest.tags, **tags}
            return dataclasses.replace(entry.manifest, tags=merged)
        return entry.manifest
    return build_manifest(
        entry.layout, entry.key, local, toolchain=entry.namespace.toolchain,
        flags=read_flags(store, entry), tags=tags, computed=True, created=entry.mtime,
    )


def transfer(src: Store, entry: Entry, dst: Store, *, tags: Mapping[str, str] | None = None,
             known_absent: bool = False) -> PublishResult:
    """Copy one SUCCESS entry from ``src`` to ``dst``, verified, published atomically.

    Raises CorruptEntry when the source files do not match the source manifest: nothing
    is then written at the destination.
    """
    if entry.state is not EntryState.SUCCESS:
        raise CorruptEntry(entry.path, [f"only SUCCESS entries are transferred, not {entry.state}"])
    names = transferable_names(entry)
    with dst.staging_dir() as staging:
        local: dict[str, Path] = {}
        for i, name in enumerate(names):
            direct = src.local_path(entry.store_path(name))
            if direct is not None and dst.local_path(entry.store_path(name)) is None:
                local[name] = direct  # local source to a remote store: upload in place
                continue
            dest = staging / f"{i}.part"
            src.get_file(entry.store_path(name), dest)
            local[name] = dest
        manifest = manifest_for(src, entry, local, tags)
        movable = all(str(p).startswith(str(staging)) for p in local.values())
        sources: dict[str, Source] = dict(local)
        return publish(dst, entry.namespace, entry.key, sources, manifest, move=movable,
                       known_absent=known_absent)


def digest_of(store: Store, path: str) -> FileDigest:
    local = store.local_path(path)
    if local is not None:
        try:
            return sha256_file(local)
        except FileNotFoundError:
            raise EntryNotFound(f"{path} not found in {store.url}", store=store.url, path=path) from None
    with store.open_read(path) as stream:
        return sha256_stream(stream)
