"""The index-server client the stores, the CLI and the warmers use.

Two kinds of call, on purpose:
- *reports* (``record``, ``register_entries``) never raise and never wait long: they are buffered,
  written to the on-disk spool in batches, and delivered when the index answers. An index that is
  down costs one short connection attempt per cool-down period, then nothing until it is back;
- *questions* (``lookup``, ``find_entries``, ``stats``, leases) need an answer, retry briefly and
  raise :class:`~neffcache.errors.IndexServerError` when the index cannot give one.
"""

from __future__ import annotations

import atexit
import functools
import logging
import random
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from neffcache import __version__
from neffcache.errors import IndexServerError
from neffcache.index.records import EntryRecord, Event, EventKind, Lease, new_owner
from neffcache.index.spool import Spool

log = logging.getLogger(__name__)
_RETRY_STATUS = frozenset({429, 502, 503, 504})
_KEEP_STATUS = frozenset({401, 403, 404, 405, 408, 409})  # config or deployment problems: keep, retry later
_PATHS = {"entries": "/v1/entries", "events": "/v1/events"}


@dataclass(frozen=True)
class FlushReport:
    delivered_events: int = 0
    duplicate_events: int = 0
    delivered_entries: int = 0
    rejected: int = 0
    pending_batches: int = 0
    error: str | None = None


class IndexClient:
    """Talks to one index server. Thread-safe; use one per process (or per configuration)."""

    enabled = True

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        spool_dir: Path,
        timeout: float = 5.0,
        connect_timeout: float = 1.0,
        retries: int = 2,
        backoff: float = 0.2,
        batch_size: int = 500,
        flush_interval: float = 2.0,
        down_cooldown: float = 30.0,
        defaults: Mapping[str, str] | None = None,
        owner: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.spool = Spool(spool_dir)
        self.retries = retries
        self.backoff = backoff
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.down_cooldown = down_cooldown
        self.defaults = dict(defaults or {})
        self.owner = owner or new_owner()
        headers = {"User-Agent": f"neffcache/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, transport=transport,
                                  timeout=httpx.Timeout(timeout, connect=connect_timeout))
        self._lock = threading.RLock()
        self._events: list[dict[str, Any]] = []
        self._entries: list[dict[str, Any]] = []
        self._oldest = 0.0
        self._down_until = 0.0
        self._closed = False
        # At interpreter exit, put what is still buffered on disk (no network): the next process
        # that talks to this index delivers it.
        self._exit_hook = functools.partial(_call_weak, weakref.WeakMethod(self._spill))
        atexit.register(self._exit_hook)

    # ------------------------------------------------------------------ reports: never raise
    def record(self, kind: EventKind, **fields: Any) -> Event:
        """Report a cache event (see :class:`Event` for the fields). Returns the event."""
        event = Event(kind=kind, **fields)
        self.add_event(event)
        return event

    def add_event(self, event: Event) -> None:
        with self._lock:
            if not self._events and not self._entries:
                self._oldest = time.monotonic()
            self._events.append(event.to_json(self.defaults))
        self._maybe_flush()

    def register_entry(self, record: EntryRecord | Mapping[str, Any]) -> None:
        self.register_entries([record])

    def register_entries(self, records: Iterable[EntryRecord | Mapping[str, Any]]) -> None:
        """Report entries published to a store (one record per store that holds the entry)."""
        with self._lock:
            if not self._events and not self._entries:
                self._oldest = time.monotonic()
            self._entries.extend(dict(r) for r in records)
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        with self._lock:
            full = len(self._events) + len(self._entries) >= self.batch_size
            old = time.monotonic() - self._oldest >= self.flush_interval
        if full or old:
            self.flush()

    def flush(self) -> FlushReport:
        """Spool what is buffered, then deliver the spool if the index is reachable. Never raises."""
        try:
            self._spill()
        except OSError as exc:  # a full or read-only disk: keep the events in memory, try later
            log.warning("cannot write the index spool %s: %s", self.spool.directory, exc)
            return FlushReport(error=str(exc))
        if time.monotonic() < self._down_until:
            return FlushReport(pending_batches=len(self.spool.pending()), error="index down (cooling off)")
        return self.deliver()

    def _spill(self) -> None:
        with self._lock:
            events, entries = self._events, self._entries
            for kind, items in (("entries", entries), ("events", events)):
                for start in range(0, len(items), self.batch_size):
                    self.spool.put(kind, items[start:start + self.batch_size])
            self._events, self._entries = [], []

    def deliver(self) -> FlushReport:
        """Send every spooled batch, oldest first; stop at the first sign the index is down."""
        counts = {"events": 0, "duplicates": 0, "entries": 0, "rejected": 0}
        error: str | None = None
        with self._lock:
            self.spool.recover_stale()
            for path in self.spool.pending():
                claimed = self.spool.claim(path)
                if claimed is None:
                    continue
                batch = self.spool.read(claimed)
                if batch is None:
                    counts["rejected"] += 1
                    continue
                try:
                    self._send_batch(batch.kind, batch.items, counts)
                except _Rejected as exc:
                    log.warning("index refused a spooled %s batch (%s); kept in %s", batch.kind, exc,
                                self.spool.rejected_dir)
                    self.spool.reject(claimed, str(exc), exc.items)
                    counts["rejected"] += 1
                    continue
                except IndexServerError as exc:
                    self.spool.unclaim(claimed)
                    error = str(exc)
                    if exc.status is None or exc.status >= 500:
                        self._down_until = time.monotonic() + self.down_cooldown
                    break
                self.spool.done(claimed)
            else:
                self._down_until = 0.0
        return FlushReport(counts["events"], counts["duplicates"], counts["entries"], counts["rejected"],
                           len(self.spool.pending()), error)

    def _send_batch(self, kind: str, items: list[dict[str, Any]], counts: dict[str, int]) -> None:
        try:
            body = self._request("POST", _PATHS[kind], json=items)
        except IndexServerError as exc:
            if exc.status is None or exc.status in _RETRY_STATUS or exc.status in _KEEP_STATUS or exc.status >= 500:
                raise
            bad = _bad_indexes(exc, len(items))
            if not bad or len(bad) == len(items):
                raise _Rejected(str(exc), None) from None
            # Drop only the items the server named as invalid; the rest of the batch is good.
            good = [item for i, item in enumerate(items) if i not in bad]
            self._send_batch(kind, good, counts)
            raise _Rejected(str(exc), [items[i] for i in sorted(bad)]) from None
        if kind == "events":
            counts["events"] += int(body.get("accepted", 0))
            counts["duplicates"] += int(body.get("duplicates", 0))
        else:
            counts["entries"] += int(body.get("registered", 0))

    def close(self) -> None:
        """Flush (spooling whatever cannot be delivered) and release the connection pool."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        atexit.unregister(self._exit_hook)
        self._http.close()

    def __enter__(self) -> IndexClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ questions: may raise
    def lookup(self, path: str) -> dict[str, Any] | None:
        """The index's record of one entry, or None if it has none."""
        try:
            found: dict[str, Any] = self._request("GET", f"/v1/entries/{path}")
        except IndexServerError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def find_entries(self, *, page_size: int = 500, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every entry matching ``filters`` (key, namespace, toolchain, compiler_version, target,
        lnc, state=[...], store, tag=["team=x"], unused_since), following pages."""
        params: dict[str, Any] = {k: v for k, v in filters.items() if v is not None}
        params["limit"] = page_size
        while True:
            page = self._request("GET", "/v1/entries", params=params)
            yield from page["entries"]
            if page.get("next_cursor") is None:
                return
            params["cursor"] = page["next_cursor"]

    def forget(self, path: str, store: str | None = None) -> dict[str, Any] | None:
        """Tell the index ``store`` no longer holds ``path`` (every store if None)."""
        try:
            result: dict[str, Any] = self._request(
                "DELETE", f"/v1/entries/{path}", params={"store": store} if store else None)
        except IndexServerError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def stats(self, window: str = "7d", group_by: str = "team", **filters: str | None) -> dict[str, Any]:
        params = {"window": window, "group_by": group_by, **{k: v for k, v in filters.items() if v}}
        stats: dict[str, Any] = self._request("GET", "/v1/stats", params=params)
        return stats

    def acquire(self, name: str, ttl: float = 600.0) -> Lease:
        """Try to take a compile lease; check ``.held``. Raises IndexServerError if the index is down
        (callers fall back to lease files)."""
        body = self._request("POST", "/v1/leases/acquire", json={"name": name, "owner": self.owner, "ttl": ttl})
        return Lease.from_json(self.owner, body)

    def renew(self, lease: Lease, ttl: float = 600.0) -> Lease:
        try:
            body = self._request("POST", "/v1/leases/renew", json={"name": lease.name, "owner": lease.owner,
                                                                   "ttl": ttl})
        except IndexServerError as exc:
            if exc.status in (404, 409):
                return Lease(lease.name, lease.owner, False, None, None, None)
            raise
        return Lease.from_json(lease.owner, body)

    def release(self, lease: Lease) -> bool:
        """Give the lease back; False if it was not ours any more (expired and taken over)."""
        try:
            self._request("POST", "/v1/leases/release", json={"name": lease.name, "owner": lease.owner})
        except IndexServerError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    def healthy(self) -> bool:
        try:
            self._request("GET", "/readyz", attempts=1)
        except IndexServerError:
            return False
        return True

    def _request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                 attempts: int | None = None) -> Any:
        tries = (attempts if attempts is not None else self.retries + 1)
        for attempt in range(1, tries + 1):
            try:
                response = self._http.request(method, path, json=json, params=params)
            except httpx.TransportError as exc:
                if attempt == tries:
                    raise IndexServerError(f"index {self.url} unreachable: {exc}") from exc
                self._sleep(attempt, None)
                continue
            if response.status_code in _RETRY_STATUS and attempt < tries:
                self._sleep(attempt, response.headers.get("Retry-After"))
                continue
            if response.status_code >= 400:
                raise IndexServerError(
                    f"index {self.url}: {method} {path} -> {response.status_code}: {_detail(response)}",
                    status=response.status_code) from _ErrorBody(response)
            return response.json() if response.content else None
        raise AssertionError("unreachable")

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        delay = self.backoff * 2 ** (attempt - 1) * (0.5 + random.random())
        if retry_after and retry_after.isdigit():
            delay = max(delay, min(5.0, float(retry_after)))
        time.sleep(delay)


class _Rejected(Exception):
    def __init__(self, message: str, items: list[dict[str, Any]] | None) -> None:
        super().__init__(message)
        self.items = items


class _ErrorBody(Exception):
    """Carries the server's structured error as the ``__cause__`` of an IndexServerError."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response.status_code)
        try:
            self.body: Any = response.json()
        except ValueError:
            self.body = None


def _detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    detail = data.get("detail") if isinstance(data, dict) else None
    return str(detail)[:500] if detail else response.reason_phrase


def _bad_indexes(exc: IndexServerError, count: int) -> set[int]:
    cause = exc.__cause__
    body = cause.body if isinstance(cause, _ErrorBody) else None
    bad: set[int] = set()
    for error in (body or {}).get("errors", []) if isinstance(body, dict) else []:
        loc = error.get("loc") or []
        if len(loc) >= 2 and loc[0] == "body" and isinstance(loc[1], int) and 0 <= loc[1] < count:
            bad.add(loc[1])
    return bad


def _call_weak(ref: weakref.WeakMethod[Any]) -> None:
    method = ref()
    if method is not None:
        try:
            method()
        except OSError:
            log.warning("could not spool buffered index reports at exit", exc_info=True)
