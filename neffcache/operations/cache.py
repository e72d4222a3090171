"""``NeffCache``: get and put NEFFs by what they were compiled from.

The programmatic face of the cache for tools that compile graphs themselves: the key is
:func:`neffcache.keys.cache_key` over the HLO bytes, flags and toolchain, and entries land in
layout B (``torchneuron``), so TorchNeuron's native cache and neffcache share them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from neffcache.entry import Entry, EntryState
from neffcache.errors import CorruptEntry
from neffcache.keys import cache_key, check_key
from neffcache.layouts import get_layout
from neffcache.layouts.base import KEYED_LAYOUT
from neffcache.manifest import sha256_bytes
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import PublishResult, publish
from neffcache.scan.report import load_entry
from neffcache.stores import open_store
from neffcache.stores.base import FileSource, Store
from neffcache.toolchain import Toolchain

_LAYOUT = get_layout(KEYED_LAYOUT)


class NeffCache:
    def __init__(self, store: Store | str) -> None:
        self.store = open_store(store) if isinstance(store, str) else store

    @staticmethod
    def key(hlo: bytes, flags: Sequence[str], toolchain: Toolchain) -> str:
        return cache_key(hlo, flags, toolchain)

    def entry(self, key: str, toolchain: Toolchain) -> Entry | None:
        plan = _LAYOUT.plan_entry(_LAYOUT.namespace_for(toolchain), check_key(key))
        return load_entry(self.store, plan.path)

    def get(self, hlo: bytes, flags: Sequence[str], toolchain: Toolchain) -> bytes | None:
        """The NEFF compiled from ``hlo`` with ``flags`` by ``toolchain``, verified; else None."""
        key = self.key(hlo, flags, toolchain)
        entry = self.entry(key, toolchain)
        if entry is None or entry.state is not EntryState.SUCCESS:
            return None
        neff = self.store.read_bytes(entry.store_path(entry.marker_name))
        if entry.manifest is not None:
            expected = entry.manifest.files.get(entry.marker_name)
            if expected is None or sha256_bytes(neff) != expected:
                raise CorruptEntry(entry.path, ["the NEFF does not match its manifest"])
        return neff

    def put(
        self,
        hlo: bytes,
        flags: Sequence[str],
        toolchain: Toolchain,
        neff: bytes | Path,
        *,
        compile_seconds: float | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> PublishResult:
        key = self.key(hlo, flags, toolchain)
        namespace = _LAYOUT.namespace_for(toolchain)
        names = _LAYOUT.names(namespace, key)
        assert names.hlo is not None and names.flags is not None and names.neff is not None
        files: dict[str, FileSource] = {
            names.hlo: hlo,
            names.flags: ("[" + ", ".join(f'"{f}"' for f in flags) + "]").encode(),
            names.neff: neff,
        }
        manifest = build_manifest(_LAYOUT.name, key, files, toolchain=toolchain, flags=flags,
                                  tags=tags, compile_seconds=compile_seconds)
        return publish(self.store, namespace, key, files, manifest)
