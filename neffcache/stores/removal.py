"""A batch of reads and removals, as a prune's chunk makes them (:meth:`Store.removal`).

:class:`Removal` is what the chunk reads and removes through. :class:`StoreRemoval` is the
default, the store's own calls, which is right for an object store with no directories to hold
open. A local store returns a :class:`~neffcache.stores.local_remove.LocalRemoval` instead. It
opens each directory once for the batch rather than walking from the root in every phase, and
that module says why this keeps every containment property.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from neffcache.entry import FileInfo


class Removal(Protocol):
    """A batch of reads and removals; use as a context manager, closed with the batch."""

    def __enter__(self) -> Removal: ...
    def __exit__(self, *exc: object) -> None: ...
    def list_files(self, rel: str) -> list[FileInfo]: ...
    def stat(self, path: str) -> FileInfo | None: ...
    def exists(self, path: str) -> bool: ...
    def discard(self, paths: Iterable[str], *, prune_dirs: bool = False) -> None: ...


class StoreCalls(Protocol):
    """The calls of a :class:`~neffcache.stores.base.Store` that :class:`StoreRemoval` makes
    (named here: the base module imports this one)."""

    def iter_files(self, prefix: str = "") -> Iterator[FileInfo]: ...
    def stat(self, path: str) -> FileInfo | None: ...
    def exists(self, path: str) -> bool: ...
    def discard(self, paths: Iterable[str], *, prune_dirs: bool = False) -> None: ...


class StoreRemoval:
    """:class:`Removal` through the store's own calls, each one independent of the others."""

    def __init__(self, store: StoreCalls) -> None:
        self.store = store

    def __enter__(self) -> StoreRemoval:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def list_files(self, rel: str) -> list[FileInfo]:
        return list(self.store.iter_files(rel))

    def stat(self, path: str) -> FileInfo | None:
        return self.store.stat(path)

    def exists(self, path: str) -> bool:
        return self.store.exists(path)

    def discard(self, paths: Iterable[str], *, prune_dirs: bool = False) -> None:
        self.store.discard(paths, prune_dirs=prune_dirs)
