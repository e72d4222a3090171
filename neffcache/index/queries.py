"""The index client's *questions*: the calls that need an answer, and the request they share.

``lookup``, ``find_entries``, ``forget``, ``stats`` and the compile leases wait for the index,
retry briefly (a 429 or 50x, a dropped connection, honouring ``Retry-After``) and raise
:class:`~neffcache.errors.IndexServerError` when it cannot answer. The *reports* (events and
entry registrations) go through the same :meth:`IndexQueries.request` but never raise to their
caller: :class:`~neffcache.index.client.IndexClient` buffers and spools them, and
:mod:`neffcache.index.delivery` sends the spool.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from neffcache.errors import IndexServerError
from neffcache.index.records import MAX_LOOKUP_BATCH, MAX_LOOKUP_BYTES, CompileSample, IndexLease
from neffcache.keys import safe_relpath

if TYPE_CHECKING:
    import httpx

RETRY_STATUS = frozenset({429, 502, 503, 504})


class IndexQueries:
    """The questions to one index server, over the client's connection pool. Thread-safe."""

    def __init__(self, http: httpx.Client, url: str, *, owner: str, retries: int, backoff: float) -> None:
        self.http = http
        self.url = url
        self.owner = owner
        self.retries = retries
        self.backoff = backoff

    def lookup(self, path: str) -> dict[str, Any] | None:
        """The index's record of one entry, or None if it has none."""
        try:
            found: dict[str, Any] = self.request("GET", f"/v1/entries/{path}")
        except IndexServerError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def lookup_many(self, paths: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        """The index's record of each of ``paths`` (None where it has none), in one request per
        :data:`MAX_LOOKUP_BATCH` paths (or :data:`MAX_LOOKUP_BYTES` of them): a job's thousand
        graphs cost one round trip, not a thousand. A path that could leave a store root raises
        :class:`~neffcache.errors.InvalidKey` before anything is sent."""
        unique = list(dict.fromkeys(paths))
        # The server answers with canonical paths (``a//b`` is ``a/b``); map them back to the asked.
        asked = {safe_relpath(path): path for path in unique}
        found: dict[str, dict[str, Any] | None] = dict.fromkeys(unique)
        for chunk in lookup_chunks(list(asked)):
            body = self.request("POST", "/v1/entries/lookup", json={"paths": chunk})
            for entry in body["found"]:
                original = asked.get(entry.get("path"))
                if original is not None:
                    found[original] = entry
        return found

    def similar(self, *, hlo_sha256: str | None = None, model: str | None = None,
                limit: int = 50) -> list[dict[str, Any]]:
        """Entries that share the HLO digest, or the ``model`` tag, of a graph (newest first):
        what ``why-miss`` compares a missed graph against, fleet-wide, without listing a store."""
        params = {"hlo_sha256": hlo_sha256, "model": model, "limit": limit}
        body = self.request("GET", "/v1/entries/similar",
                            params={k: v for k, v in params.items() if v is not None})
        entries: list[dict[str, Any]] = body["entries"]
        return entries

    def compile_samples(self, target: str, *, limit: int = 1000) -> list[CompileSample]:
        """Recent compiles for ``target`` with their HLO sizes: what a forecast fits compile time on."""
        body = self.request("GET", "/v1/entries/compile-samples", params={"target": target, "limit": limit})
        return [CompileSample(int(item["hlo_size"]), float(item["compile_seconds"]),
                              item.get("compiler_version"), item.get("hlo_sha256")) for item in body["samples"]]

    def find_entries(self, *, page_size: int = 500, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every entry matching ``filters`` (key, namespace, toolchain, compiler_version, target,
        lnc, state=[...], store, tag=["team=x"], unused_since), following pages."""
        params: dict[str, Any] = {k: v for k, v in filters.items() if v is not None}
        params["limit"] = page_size
        while True:
            page = self.request("GET", "/v1/entries", params=params)
            yield from page["entries"]
            if page.get("next_cursor") is None:
                return
            params["cursor"] = page["next_cursor"]

    def forget(self, path: str, store: str | None = None) -> dict[str, Any] | None:
        """Tell the index ``store`` no longer holds ``path`` (every store if None)."""
        try:
            result: dict[str, Any] = self.request(
                "DELETE", f"/v1/entries/{path}", params={"store": store} if store else None)
        except IndexServerError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def stats(self, window: str = "7d", group_by: str = "team", **filters: str | None) -> dict[str, Any]:
        params = {"window": window, "group_by": group_by, **{k: v for k, v in filters.items() if v}}
        stats: dict[str, Any] = self.request("GET", "/v1/stats", params=params)
        return stats

    def failures(self, window: str = "7d", top: int = 100) -> dict[str, Any]:
        """The error events of ``window`` grouped by signature (GET /v1/failures)."""
        found: dict[str, Any] = self.request("GET", "/v1/failures", params={"window": window, "top": top})
        return found

    def usage_hits(self, toolchain: str, *, since: float, until: float, page_size: int = 5000) -> dict[str, int]:
        """Hits per entry path the index counted for ``toolchain`` (a label such as
        ``trn2-lnc2/neuronxcc-2.27.5334.0+f702b353``) from ``since`` to ``until``, every page.
        An answer that is not a list of (path, count), or a cursor that does not move forward,
        is an IndexServerError: the counts weigh a gate (``upgrade-report``)."""
        params: dict[str, Any] = {"toolchain": toolchain, "since": since, "until": until, "limit": page_size}
        found: dict[str, int] = {}

        def take(row: Any) -> None:
            path, hits = row["path"], row["hits"]
            if not isinstance(path, str) or not isinstance(hits, int) or hits < 0:
                raise TypeError(row)
            found[path] = found.get(path, 0) + hits

        self._usage_pages("hits", params, take)
        return found

    def usage_misses(self, *, since: float, until: float, page_size: int = 5000) -> dict[str, tuple[int, float]]:
        """Entry path -> (misses, last miss) the index counted from ``since`` to ``until``,
        every page (what ``prune --regret`` matches with eviction tombstones). Malformed
        answers are an IndexServerError, as :meth:`usage_hits`'s."""
        params: dict[str, Any] = {"since": since, "until": until, "limit": page_size}
        found: dict[str, tuple[int, float]] = {}

        def take(row: Any) -> None:
            path, misses, last = row["path"], row["misses"], row["last_miss"]
            if (not isinstance(path, str) or isinstance(misses, bool) or not isinstance(misses, int) or misses < 0
                    or isinstance(last, bool) or not isinstance(last, int | float) or not math.isfinite(last)):
                raise TypeError(row)
            count, seen = found.get(path, (0, float(last)))
            found[path] = (count + misses, max(seen, float(last)))

        self._usage_pages("misses", params, take)
        return found

    def _usage_pages(self, what: str, params: dict[str, Any], take: Callable[[Any], None]) -> None:
        """Every row of ``/v1/usage/<what>`` through ``take``, page after page; a row ``take``
        refuses (TypeError, KeyError) makes the answer malformed."""
        seen: set[str] = set()  # the database's collation orders the cursors, not Python's
        while True:
            page = self.request("GET", f"/v1/usage/{what}", params=params)
            try:
                for row in page[what]:
                    take(row)
                cursor = page.get("next_cursor")
            except (TypeError, KeyError, AttributeError) as exc:
                raise IndexServerError(f"index {self.url}: malformed usage answer ({exc!r:.200})") from None
            if cursor is None:
                return
            if not isinstance(cursor, str) or cursor in seen:
                raise IndexServerError(f"index {self.url}: usage pages do not move forward (cursor {cursor!r:.200})")
            seen.add(cursor)
            params["cursor"] = cursor

    def acquire(self, name: str, ttl: float = 600.0) -> IndexLease:
        """Try to take a compile lease; check ``.held``. Raises IndexServerError if the index is down
        (callers fall back to lease files)."""
        body = self.request("POST", "/v1/leases/acquire", json={"name": name, "owner": self.owner, "ttl": ttl})
        return IndexLease.from_json(self.owner, body)

    def renew(self, lease: IndexLease, ttl: float = 600.0) -> IndexLease:
        try:
            body = self.request("POST", "/v1/leases/renew", json={"name": lease.name, "owner": lease.owner,
                                                                   "ttl": ttl})
        except IndexServerError as exc:
            if exc.status in (404, 409):
                return IndexLease(lease.name, lease.owner, False, None, None, None)
            raise
        return IndexLease.from_json(lease.owner, body)

    def release(self, lease: IndexLease) -> bool:
        """Give the lease back; False if it was not ours any more (expired and taken over)."""
        try:
            self.request("POST", "/v1/leases/release", json={"name": lease.name, "owner": lease.owner})
        except IndexServerError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    def healthy(self) -> bool:
        try:
            self.request("GET", "/readyz", attempts=1)
        except IndexServerError:
            return False
        return True

    def request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                 attempts: int | None = None) -> Any:
        import httpx  # loaded already: self.http is an httpx.Client (client.py says why it is not at the top)

        tries = (attempts if attempts is not None else self.retries + 1)
        for attempt in range(1, tries + 1):
            try:
                response = self.http.request(method, path, json=json, params=params)
            except httpx.TransportError as exc:
                if attempt == tries:
                    raise IndexServerError(f"index {self.url} unreachable: {exc}") from exc
                self._sleep(attempt, None)
                continue
            if response.status_code in RETRY_STATUS and attempt < tries:
                self._sleep(attempt, response.headers.get("Retry-After"))
                continue
            if response.status_code >= 400:
                raise IndexServerError(
                    f"index {self.url}: {method} {path} -> {response.status_code}: {error_detail(response)}",
                    status=response.status_code) from ErrorBody(response)
            return response.json() if response.content else None
        raise AssertionError("unreachable")

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        delay = self.backoff * 2 ** (attempt - 1) * (0.5 + random.random())
        if retry_after and retry_after.isdigit():
            delay = max(delay, min(5.0, float(retry_after)))
        time.sleep(delay)


def lookup_chunks(paths: list[str]) -> Iterator[list[str]]:
    """``paths`` in order, in slices of at most :data:`MAX_LOOKUP_BATCH` paths and about
    :data:`MAX_LOOKUP_BYTES` (a slice always takes at least one path, so every path is sent)."""
    chunk: list[str] = []
    size = 0
    for path in paths:
        cost = len(path.encode()) + 4  # the quotes, comma and space around it in the JSON body
        if chunk and (len(chunk) >= MAX_LOOKUP_BATCH or size + cost > MAX_LOOKUP_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(path)
        size += cost
    if chunk:
        yield chunk


class ErrorBody(Exception):
    """Carries the server's structured error as the ``__cause__`` of an IndexServerError."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response.status_code)
        try:
            self.body: Any = response.json()
        except ValueError:
            self.body = None


def error_detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    detail = data.get("detail") if isinstance(data, dict) else None
    return str(detail)[:500] if detail else response.reason_phrase


class AskedQuestions:
    """The questions as methods of the client that owns ``queries`` (callers hold one object,
    :class:`~neffcache.index.client.IndexClient`, for reports and questions alike)."""

    queries: IndexQueries

    def lookup(self, path: str) -> dict[str, Any] | None:
        """The index's record of one entry, or None if it has none."""
        return self.queries.lookup(path)

    def lookup_many(self, paths: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        """The index's record of each path, None where it has none (batched; see IndexQueries)."""
        return self.queries.lookup_many(paths)

    def similar(self, *, hlo_sha256: str | None = None, model: str | None = None,
                limit: int = 50) -> list[dict[str, Any]]:
        """Entries sharing a graph's HLO digest or model tag (see :meth:`IndexQueries.similar`)."""
        return self.queries.similar(hlo_sha256=hlo_sha256, model=model, limit=limit)

    def compile_samples(self, target: str, *, limit: int = 1000) -> list[CompileSample]:
        """Recent compiles for ``target`` with their HLO sizes, for compile-time forecasts."""
        return self.queries.compile_samples(target, limit=limit)

    def find_entries(self, *, page_size: int = 500, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every entry matching ``filters``, following pages (see :meth:`IndexQueries.find_entries`)."""
        return self.queries.find_entries(page_size=page_size, **filters)

    def forget(self, path: str, store: str | None = None) -> dict[str, Any] | None:
        """Tell the index ``store`` no longer holds ``path`` (every store if None)."""
        return self.queries.forget(path, store)

    def stats(self, window: str = "7d", group_by: str = "team", **filters: str | None) -> dict[str, Any]:
        return self.queries.stats(window, group_by, **filters)

    def failures(self, window: str = "7d", top: int = 100) -> dict[str, Any]:
        """Failed graphs of ``window`` grouped by error signature (see :meth:`IndexQueries.failures`)."""
        return self.queries.failures(window, top)

    def usage_hits(self, toolchain: str, *, since: float, until: float) -> dict[str, int]:
        """Hits per entry path for a toolchain label in a time range (see :meth:`IndexQueries.usage_hits`)."""
        return self.queries.usage_hits(toolchain, since=since, until=until)

    def usage_misses(self, *, since: float, until: float) -> dict[str, tuple[int, float]]:
        """(Misses, last miss) per entry path in a time range (see :meth:`IndexQueries.usage_misses`)."""
        return self.queries.usage_misses(since=since, until=until)

    def acquire(self, name: str, ttl: float = 600.0) -> IndexLease:
        """Try to take a compile lease; check ``.held``. Raises IndexServerError if the index is down."""
        return self.queries.acquire(name, ttl)

    def renew(self, lease: IndexLease, ttl: float = 600.0) -> IndexLease:
        return self.queries.renew(lease, ttl)

    def release(self, lease: IndexLease) -> bool:
        """Give the lease back; False if it was not ours any more."""
        return self.queries.release(lease)

    def healthy(self) -> bool:
        return self.queries.healthy()
