"""Listing S3: a large prefix in parallel, which of some keys exist, unfinished multipart uploads.

ListObjectsV2 returns 1000 keys per request, strictly one page after the other, so a flat
listing of a 100k-entry cache (half a million keys) is hundreds of sequential round trips.
The walk below splits the key space instead, without listing anything twice:

1. one flat page of the prefix (the *head*); if it is not truncated, that is the answer, so a
   small cache costs one request, exactly like a flat listing;
2. otherwise the prefix's children are listed with ``Delimiter="/"`` (cheap: no keys). The
   head already holds the complete children before the one it stopped in; it also tells how
   many keys a child holds, which decides what to do with the rest:
   - *big children* (namespaces, shard directories): each is walked the same way, in
     parallel; the child the head stopped in inherits its part of the head as its own head;
   - *small children* (the ``MODULE_*`` directories of one namespace, ~5 keys each): they
     are cut into contiguous ranges of about one page each, listed flat from ``StartAfter``
     up to the next range's first child, all ranges in parallel.

S3 returns keys in UTF-8 byte order, which for ``str`` is code-point order, so the ranges
are exact: every key below the prefix is yielded by exactly one task. No task waits on
another (the caller's thread submits the follow-up work), so sharing the pool cannot deadlock.

S3 does not say which keys a DeleteObjects removed: :func:`existing_keys` finds out by listing
their parent "directories" first (or, for a prune spanning thousands, their common prefix with
the walk above). :func:`list_uploads` pages through the multipart uploads never completed.
"""

from __future__ import annotations

import math
import posixpath
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass
from typing import Any

PAGE = 1000  # the S3 maximum
BIG_CHILD = 250  # children with this many keys or more are walked one by one

ListPage = Callable[..., dict[str, Any]]  # client.list_objects_v2 with Bucket bound


@dataclass(frozen=True)
class Listed:
    key: str
    size: int
    mtime: float


@dataclass(frozen=True)
class _Work:
    files: list[Listed]
    follow_up: list[Callable[[], _Work]]


def _listed(page: dict[str, Any]) -> list[Listed]:
    # Keys ending in "/" are "folder" placeholders some consoles create: not files.
    return [Listed(o["Key"], int(o.get("Size", 0)), o["LastModified"].timestamp())
            for o in page.get("Contents", ()) if not o["Key"].endswith("/")]


def _child(prefix: str, key: str) -> str | None:
    """The child "directory" of ``prefix`` that ``key`` lies in (None for a direct file)."""
    rest = key[len(prefix):]
    cut = rest.find("/")
    return prefix + rest[: cut + 1] if cut >= 0 else None


class ParallelLister:
    def __init__(self, list_page: ListPage, pool: Executor, concurrency: int) -> None:
        self.list_page = list_page
        self.pool = pool
        self.concurrency = max(1, concurrency)

    def iter_keys(self, prefix: str) -> Iterator[Listed]:
        """Every key below ``prefix`` ("" or ending in "/"), in no set order."""
        pending: set[Future[_Work]] = {self.pool.submit(self._level, prefix, None)}
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

    def _pages(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            page = self.list_page(**kwargs, **({"ContinuationToken": token} if token else {}))
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs.pop("StartAfter", None)

    def _level(self, prefix: str, head: list[Listed] | None) -> _Work:
        if head is None:
            page = self.list_page(Prefix=prefix, MaxKeys=PAGE)
            head = _listed(page)
            if not page.get("IsTruncated"):
                return _Work(head, [])
        direct: list[Listed] = []
        children: list[str] = []
        for page in self._pages(Prefix=prefix, Delimiter="/", MaxKeys=PAGE):
            direct.extend(_listed(page))
            children.extend(p["Prefix"] for p in page.get("CommonPrefixes", ()))
        children.sort()
        if not head:
            return _Work(direct, [self._bind_level(c, None) for c in children])
        last = head[-1].key
        boundary = _child(prefix, last) or last  # children before it are complete in the head
        kept = [h for h in head if (c := _child(prefix, h.key)) is not None and c < boundary]
        partial = [h for h in head if _child(prefix, h.key) == boundary]
        complete = len({_child(prefix, h.key) for h in kept})
        per_child = max(len(kept) / complete if complete else 0.0, float(len(partial)), 1.0)
        rest = [c for c in children if c >= boundary]
        if per_child >= BIG_CHILD:
            follow = [self._bind_level(c, partial if c == boundary and partial else None) for c in rest]
            return _Work(direct + kept, follow)
        # Small children: ranges of about one page each; the first resumes after the head.
        per_range = max(1, int(PAGE / per_child))
        starts = rest[::per_range]
        max_keys = min(PAGE, math.ceil(per_range * per_child * 1.5) + 10)
        follow = []
        for i, lo in enumerate(starts):
            hi = starts[i + 1] if i + 1 < len(starts) else None
            resume = last if (i == 0 and lo == boundary and partial) else None
            follow.append(self._bind_range(prefix, lo, hi, resume, max_keys))
        return _Work(direct + kept + (partial if starts and starts[0] == boundary else []), follow)

    def _bind_level(self, prefix: str, head: list[Listed] | None) -> Callable[[], _Work]:
        return lambda: self._level(prefix, head)

    def _bind_range(self, prefix: str, lo: str, hi: str | None, resume: str | None,
                    max_keys: int) -> Callable[[], _Work]:
        return lambda: _Work(self._range(prefix, lo, hi, resume, max_keys), [])

    def _range(self, prefix: str, lo: str, hi: str | None, resume: str | None, max_keys: int) -> list[Listed]:
        """Keys of the children in [lo, hi), listed flat (after ``resume`` when given)."""
        out: list[Listed] = []
        # lo ends with "/": lo[:-1] sorts before every key of lo; the filter below drops
        # whatever of an earlier child lies in between.
        for page in self._pages(Prefix=prefix, MaxKeys=max_keys, StartAfter=resume or lo[:-1]):
            for item in _listed(page):
                if hi is not None and item.key >= hi:
                    return out
                # Direct files of the level came with the delimiter listing already.
                if item.key >= lo and "/" in item.key[len(prefix):]:
                    out.append(item)
        return out


def existing_keys(list_page: ListPage,
                  map_: Callable[[Callable[[str], set[str]], Sequence[str]], list[set[str]]],
                  pool: Callable[[], Executor], max_concurrency: int, keys: list[str], *,
                  parents_limit: int) -> set[str]:
    """Which of ``keys`` exist: one listing per parent directory, or, past ``parents_limit``
    parents, one parallel listing of their common prefix (a big prune). ``list_page`` is ListObjectsV2, ``map_`` runs a
    function over items on the store's pool."""
    wanted = set(keys)
    parents: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        parents[key.rsplit("/", 1)[0] + "/" if "/" in key else ""].append(key)
    if len(parents) > parents_limit:
        # A big prune: one parallel listing of what the keys have in common is cheaper.
        common = posixpath.commonpath([p.rstrip("/") for p in parents])
        common = common + "/" if common else ""
        lister = ParallelLister(list_page, pool(), max_concurrency)
        return {item.key for item in lister.iter_keys(common) if item.key in wanted}

    def listed(parent: str) -> set[str]:
        found: set[str] = set()
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": parent, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            page = list_page(**kwargs)
            found.update(o["Key"] for o in page.get("Contents", ()) if o["Key"] in wanted)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return found

    return set().union(*map_(listed, sorted(parents)))


def list_uploads(list_page: ListPage, prefix: str,
                 older_than: float | None) -> list[tuple[str, str, float]]:
    """(key, upload id, start time) of the multipart uploads under ``prefix`` never completed,
    started ``older_than`` seconds ago or earlier. ``list_page`` is ListMultipartUploads."""
    out: list[tuple[str, str, float]] = []
    kwargs: dict[str, Any] = {"Prefix": prefix}
    cutoff = time.time() - older_than if older_than is not None else None
    while True:
        page = list_page(**kwargs)
        for up in page.get("Uploads", ()):
            started = up["Initiated"].timestamp()
            if cutoff is None or started <= cutoff:
                out.append((up["Key"], up["UploadId"], started))
        if not page.get("IsTruncated"):
            return out
        kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
        kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")
