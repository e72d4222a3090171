"""Listing a large S3 prefix in parallel.

ListObjectsV2 returns 1000 keys per request, strictly one page after the other, so a flat
listing of a 100k-entry cache (half a million keys) is hundreds of sequential round trips.
The walk below splits the key space instead:

1. probe a prefix with one flat page; if it is not truncated, that page is the answer (a small
   cache costs exactly one request, like a flat listing);
2. otherwise list its children with ``Delimiter="/"``; a few children (namespaces, shard
   directories) are walked the same way in parallel; many children (the ``MODULE_*``
   directories of a namespace) are cut into contiguous ranges, and each range is listed flat
   from ``StartAfter`` up to the next range's first child, all ranges in parallel.

S3 returns keys in UTF-8 byte order, which for ``str`` is code-point order, so the ranges
are exact: every key below the prefix lands in exactly one task. No task waits on another
(the caller's thread submits the follow-up work), so sharing the pool cannot deadlock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass
from typing import Any

PAGE = 1000
RECURSE_LIMIT = 256  # up to this many children: walk each (they are probably big)
KEYS_PER_RANGE_CHILD = 20  # cut many children into ranges of about this many each

ListPage = Callable[..., dict[str, Any]]  # client.list_objects_v2 with Bucket bound


@dataclass(frozen=True)
class Listed:
    key: str
    size: int
    mtime: float


def _listed(obj: dict[str, Any]) -> Listed:
    return Listed(obj["Key"], int(obj.get("Size", 0)), obj["LastModified"].timestamp())


def _files(page: dict[str, Any]) -> list[Listed]:
    # Keys ending in "/" are "folder" placeholders some consoles create: not files.
    return [_listed(o) for o in page.get("Contents", ()) if not o["Key"].endswith("/")]


@dataclass(frozen=True)
class _Work:
    files: list[Listed]
    follow_up: list[Callable[[], _Work]]


class ParallelLister:
    def __init__(self, list_page: ListPage, pool: Executor, concurrency: int) -> None:
        self.list_page = list_page
        self.pool = pool
        self.concurrency = max(1, concurrency)

    def iter_keys(self, prefix: str) -> Iterator[Listed]:
        """Every key below ``prefix`` ("" or ending in "/"), in no set order."""
        pending: set[Future[_Work]] = {self.pool.submit(self._level, prefix)}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    work = future.result()
                    pending |= {self.pool.submit(task) for task in work.follow_up}
                    yield from work.files
        finally:
            for future in pending:
                future.cancel()

    def _level(self, prefix: str) -> _Work:
        probe = self.list_page(Prefix=prefix, MaxKeys=PAGE)
        if not probe.get("IsTruncated"):
            return _Work(_files(probe), [])
        children: list[str] = []
        direct: list[Listed] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": prefix, "Delimiter": "/", "MaxKeys": PAGE}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.list_page(**kwargs)
            direct.extend(_files(page))
            children.extend(p["Prefix"] for p in page.get("CommonPrefixes", ()))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        children.sort()
        if len(children) <= RECURSE_LIMIT:
            follow = [self._bind_level(c) for c in children]
        else:
            groups = min(4 * self.concurrency, math.ceil(len(children) / KEYS_PER_RANGE_CHILD))
            step = math.ceil(len(children) / groups)
            starts = children[::step]
            follow = [self._bind_range(prefix, lo, starts[i + 1] if i + 1 < len(starts) else None)
                      for i, lo in enumerate(starts)]
        return _Work(direct, follow)

    def _bind_level(self, prefix: str) -> Callable[[], _Work]:
        return lambda: self._level(prefix)

    def _bind_range(self, prefix: str, lo: str, hi: str | None) -> Callable[[], _Work]:
        return lambda: _Work(self._range(prefix, lo, hi), [])

    def _range(self, prefix: str, lo: str, hi: str | None) -> list[Listed]:
        """Keys of the children in [lo, hi): a flat listing from just before ``lo``."""
        out: list[Listed] = []
        # lo ends with "/": lo[:-1] sorts before every key of lo and after no key of an
        # earlier child we would keep (the filter below drops whatever lies in between).
        start_after = lo[:-1]
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": prefix, "MaxKeys": PAGE}
            if token:
                kwargs["ContinuationToken"] = token
            else:
                kwargs["StartAfter"] = start_after
            page = self.list_page(**kwargs)
            for item in _files(page):
                if hi is not None and item.key >= hi:
                    return out
                # Direct files of the level came with the delimiter listing already.
                if item.key >= lo and "/" in item.key[len(prefix):]:
                    out.append(item)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return out
