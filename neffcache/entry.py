"""Entries: one compiled graph as it lies in a store, and the states it can be in."""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from neffcache.manifest import Manifest
from neffcache.toolchain import Toolchain


class FileInfo(NamedTuple):
    """One file in a store, by its path relative to the store root.

    A NamedTuple, not a dataclass: scans make one per file, hundreds of thousands at a time.
    """

    path: str
    size: int
    mtime: float


class EntryState(enum.StrEnum):
    SUCCESS = "SUCCESS"  # a NEFF the runtime will serve
    FAILED = "FAILED"  # the compiler failed; the runtime skips it unless asked to retry
    LOCKED = "LOCKED"  # a process compiles it now (or died doing so: a stale lock)
    EMPTY = "EMPTY"  # only the HLO: extracted, not compiled yet
    CORRUPT = "CORRUPT"  # files contradict each other or their manifest


@dataclass(frozen=True)
class Namespace:
    """The part of a cache root one toolchain can use.

    ``path`` is store-relative (``trn2-lnc2/neuronxcc-2.27.5334.0+f702b353``). Roots filled by
    the runtimes themselves have no target directory, so target and LNC may be unknown.

    ``flags_form`` (neuronxcc): the form of the flags file decided for this namespace (from its
    entries, or forced: :mod:`neffcache.layouts.flags_form`), which names its entries; None: the
    layout's version table. Not part of the namespace's identity (equality, hashing): it is what
    a command decided about the place, carried to the code that names entries in it.
    """

    layout: str
    path: str
    compiler_version: str | None
    target: str | None = None
    lnc: int | None = None
    flags_form: str | None = field(default=None, compare=False)

    @property
    def toolchain(self) -> Toolchain | None:
        if self.compiler_version and self.target and self.lnc:
            return Toolchain(self.compiler_version, self.target, self.lnc)
        return None

    @property
    def label(self) -> str:
        return self.path or "(root)"


@dataclass(frozen=True)
class Entry:
    """One compiled graph in a store.

    ``files`` maps names relative to ``base`` (the entry directory in neuronxcc, the namespace
    directory in torchneuron) to what the listing said about them.
    """

    namespace: Namespace
    key: str
    path: str  # the identity of the entry within the store
    base: str
    files: Mapping[str, FileInfo]
    state: EntryState
    problems: tuple[str, ...] = ()
    manifest: Manifest | None = None
    manifest_name: str = ""
    marker_name: str = ""  # the file whose presence commits the entry for the runtime
    extra: tuple[str, ...] = field(default=())  # names the layout does not know (temp files...)
    # False for the leftovers of a write that never reached its commit marker: not an entry
    # any reader may see, only garbage for prune (after a grace period: it may be in flight).
    committed: bool = True

    @classmethod
    def listed(cls, namespace: Namespace, key: str, path: str, base: str, files: Mapping[str, FileInfo],
               state: EntryState, problems: tuple[str, ...], manifest: Manifest | None, manifest_name: str,
               marker_name: str, extra: tuple[str, ...], committed: bool) -> Entry:
        """``Entry(...)`` of every field, faster: the frozen dataclass's ``__init__`` looks up
        ``object.__setattr__`` again for each field (3.7 us an entry, seconds of a million-entry
        scan); this looks it up once (2.2 us). Not ``__dict__.update``: touching ``__dict__``
        materialises a full dict per instance (+340 B an entry a full report holds). The same
        instance (tests/test_entry.py holds the two equal and this signature to the fields)."""
        entry = object.__new__(cls)
        put = object.__setattr__
        put(entry, "namespace", namespace)
        put(entry, "key", key)
        put(entry, "path", path)
        put(entry, "base", base)
        put(entry, "files", files)
        put(entry, "state", state)
        put(entry, "problems", problems)
        put(entry, "manifest", manifest)
        put(entry, "manifest_name", manifest_name)
        put(entry, "marker_name", marker_name)
        put(entry, "extra", extra)
        put(entry, "committed", committed)
        return entry

    @property
    def layout(self) -> str:
        return self.namespace.layout

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())

    @property
    def mtime(self) -> float:
        return max((f.mtime for f in self.files.values()), default=0.0)

    @property
    def has_manifest(self) -> bool:
        return self.manifest_name in self.files

    def store_path(self, name: str) -> str:
        return posixpath.join(self.base, name) if self.base else name

    @property
    def toolchain(self) -> Toolchain | None:
        if self.manifest and self.manifest.toolchain:
            return self.manifest.toolchain
        return self.namespace.toolchain
