"""The index-server client the stores, the CLI and the warmers use.

Two kinds of call, on purpose:
- *reports* (``record``, ``register_entries``) never raise and never wait long: they are buffered,
  written to the on-disk spool in batches, and delivered when the index answers. An index that is
  down costs one short connection attempt per cool-down period, then nothing until it is back;
- *questions* (``lookup``, ``find_entries``, ``stats``, leases) need an answer, retry briefly and
  raise :class:`~neffcache.errors.IndexServerError` when the index cannot give one.

A refused token (401, or 403: a token without write scope) is decided thus: the reports are
*spooled and the refusal is said*, the command does not fail. The cache work the command did is
done and correct; failing it would invite a rerun that redoes the work and meets the same token.
Nothing is lost: once the token is fixed, ``neffcache flush`` delivers the spool. But it is a
configuration error, not an outage, so it is neither retried (the token this process sends
cannot change: the client stops delivering for the rest of the process) nor silent:
:attr:`IndexClient.on_problem` is called once, from the sender thread, while the command still
runs, and :meth:`IndexClient.counts` carries the reason (``problem``, ``token_refused``) that
the CLI prints in its last line. ``neffcache flush`` with a refused token fails (exit 7).

This module holds the reports (buffer, spool, sender thread) and is the one class callers use;
the questions and the HTTP request they share are :mod:`neffcache.index.queries`, sending a batch
and a spool round is :mod:`neffcache.index.delivery`, the fork and exit hooks are
:mod:`neffcache.index.process_hooks`.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neffcache import __version__
from neffcache.errors import IndexServerError
from neffcache.events import EventKind
from neffcache.index.delivery import KEEP_STATUS, Rejected, deliver_spooled, send_batch
from neffcache.index.process_hooks import at_exit, track_forks
from neffcache.index.queries import AskedQuestions, IndexQueries
from neffcache.index.records import EntryRecord, Event, new_owner
from neffcache.index.reports import FlushReport, ReportCounts, describe_failure
from neffcache.index.spool import Spool

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)
_AUTH_STATUS = frozenset({401, 403})  # the token: no retry in this process can fix it
_MAX_BUFFERED = 100_000  # events kept in memory when even the spool cannot be written


class IndexClient(AskedQuestions):
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
        self.spool = Spool(spool_dir, url=self.url)
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.down_cooldown = down_cooldown
        self.defaults = dict(defaults or {})
        self.owner = owner or new_owner()
        headers = {"User-Agent": f"neffcache/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # Imported here, not with the module: httpx costs 0.1-0.15 s of start-up, and every
        # command imports this module for its types while most never talk to an index.
        import httpx

        self._http = httpx.Client(base_url=self.url, headers=headers, transport=transport,
                                  timeout=httpx.Timeout(timeout, connect=connect_timeout))
        self.queries = IndexQueries(self._http, self.url, owner=self.owner, retries=retries, backoff=backoff)
        self._init_threading()
        self._events: list[dict[str, Any]] = []
        self._entries: list[dict[str, Any]] = []
        self._oldest = 0.0
        self._down_until = 0.0
        self._closed = False
        self._tally = {"reported": 0, "spooled": 0, "sent_direct": 0, "lost": 0, "delivered": 0}
        self._spool_error: str | None = None
        self._problem: str | None = None  # why the last delivery failed; None once one succeeded
        self._token_refused = False
        self._announced = False
        # Called once, from the sender thread, when the index refuses the token while the
        # command still runs (a warm-up of an hour should not wait an hour to say so).
        self.on_problem: Callable[[str], None] | None = None
        # At interpreter exit, put what is still buffered on disk (no network): the next process
        # that talks to this index delivers it.
        self._exit_hook = at_exit(self._at_exit)

    def _init_threading(self) -> None:
        self._lock = threading.RLock()  # the buffers; never held across network calls
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._sender: threading.Thread | None = None
        track_forks(self)

    def _at_exit(self) -> None:
        # Let a delivery in flight finish (briefly), so its batch is not left claimed for the
        # stale-claim timeout; then put the buffer on disk. No new network work at exit.
        self._closed = True
        self._wake.set()
        sender = self._sender
        if sender is not None and sender.is_alive():
            sender.join(timeout=5)
        self._spill()

    def after_fork_in_child(self) -> None:
        # The parent's sender thread does not exist here; the child starts its own when needed.
        # Buffered events were copied into the child too: if both spool them, the server's
        # idempotence by event id counts them once.
        self._init_threading()

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
            self._tally["reported"] += 1
        self._maybe_flush()

    def register_entry(self, record: EntryRecord | Mapping[str, Any]) -> None:
        self.register_entries([record])

    def register_entries(self, records: Iterable[EntryRecord | Mapping[str, Any]]) -> None:
        """Report entries published to a store (one record per store that holds the entry)."""
        with self._lock:
            if not self._events and not self._entries:
                self._oldest = time.monotonic()
            before = len(self._entries)
            self._entries.extend(dict(r) for r in records)
            self._tally["reported"] += len(self._entries) - before
        self._maybe_flush()

    @property
    def spool_directory(self) -> Path:
        return self.spool.directory

    def pending_batches(self) -> int:
        """Batches of reports in this index's spool, waiting for ``flush`` (or the next command)."""
        return len(self.spool.pending())

    def counts(self) -> ReportCounts:
        """What became of every report handed to this client so far (see :class:`ReportCounts`),
        and what waits in the spool for this index."""
        batches, waiting = self.spool.pending_reports()
        with self._lock:
            return ReportCounts(**self._tally, buffered=len(self._events) + len(self._entries),
                                spool_error=self._spool_error, waiting=waiting, waiting_batches=batches,
                                problem=self._problem if batches else None, token_refused=self._token_refused)

    def _delivery_failed(self, exc: IndexServerError) -> None:
        """Remember why, and stop asking for a while: a down index for ``down_cooldown``; a
        refused token for the rest of the process (the token it sends cannot change)."""
        self._problem = describe_failure(exc)
        if exc.status in _AUTH_STATUS:
            self._token_refused = True
            self._down_until = float("inf")
        elif exc.status is None or exc.status >= 500 or exc.status in KEEP_STATUS:
            self._down_until = time.monotonic() + self.down_cooldown

    def _maybe_flush(self) -> None:
        with self._lock:
            full = len(self._events) + len(self._entries) >= self.batch_size
            old = time.monotonic() - self._oldest >= self.flush_interval
        if full or old:
            self._kick()

    def _kick(self) -> None:
        """Wake the sender thread: disk and network work happen there, never on the caller's thread."""
        if self._closed:
            return
        with self._lock:
            if self._sender is None or not self._sender.is_alive():
                self._sender = threading.Thread(target=_sender_loop, args=(weakref.ref(self),),
                                                name="neffcache-index-sender", daemon=True)
                self._sender.start()
        self._wake.set()

    def _background_round(self) -> None:
        with self._lock:
            due = bool(self._events or self._entries) and (
                len(self._events) + len(self._entries) >= self.batch_size
                or time.monotonic() - self._oldest >= self.flush_interval)
        if due:
            try:
                self._spill()
            except OSError as exc:
                self._spool_failed(exc)
                if time.monotonic() >= self._down_until:
                    self._send_buffers(attempts=1)
                self._trim_buffers()
        if time.monotonic() >= self._down_until and self.spool.pending():
            self.deliver(attempts=1)  # one try per round; the next round is the retry
        if self._token_refused and not self._announced and self.on_problem is not None:
            self._announced = True
            self.on_problem(f"{self._problem}; reports wait in the spool until it is fixed, "
                            "then `neffcache flush` delivers them")

    def flush(self, *, attempts: int | None = None) -> FlushReport:
        """Spool what is buffered, then deliver the spool if the index is reachable. Never raises."""
        try:
            self._spill()
        except OSError as exc:  # a full or read-only disk: send them straight away, else keep them in memory
            self._spool_failed(exc)
            sent = self._send_buffers(attempts) if time.monotonic() >= self._down_until else None
            self._trim_buffers()
            if sent is not None and sent.error is None:
                return sent
            return FlushReport(error=f"cannot write the index spool: {exc}"
                               + (f"; {sent.error}" if sent is not None and sent.error else ""))
        if time.monotonic() < self._down_until:
            return FlushReport(pending_batches=len(self.spool.pending()), error="index down (cooling off)")
        return self.deliver(attempts=attempts)

    def _spool_failed(self, exc: OSError) -> None:
        log.warning("cannot write the index spool %s: %s", self.spool.directory, exc)
        with self._lock:
            self._spool_error = f"cannot write the index spool {self.spool.directory}: {exc}"

    def _trim_buffers(self) -> None:
        with self._lock:
            extra = len(self._events) - _MAX_BUFFERED
            if extra > 0:
                log.warning("index reports cannot be spooled; dropping the %d oldest events", extra)
                del self._events[:extra]
                self._tally["lost"] += extra

    def _spill(self) -> None:
        """Write the buffers to the spool, batch by batch; a batch the disk refuses stays
        buffered with everything after it (OSError), the ones before it are on disk."""
        with self._lock:
            for kind, items in (("entries", self._entries), ("events", self._events)):
                while items:
                    batch = items[:self.batch_size]
                    self.spool.put(kind, batch)
                    del items[:len(batch)]
                    self._tally["spooled"] += len(batch)

    def _send_buffers(self, attempts: int | None) -> FlushReport:
        """Deliver the buffers without the spool (it could not be written). What the index
        refuses as invalid is lost (there is no disk to keep it on for a human); what it cannot
        take now stays buffered."""
        counts = {"events": 0, "duplicates": 0, "entries": 0, "rejected": 0}
        error: str | None = None
        with self._send_lock:
            for kind in ("entries", "events"):
                while True:
                    with self._lock:
                        items = self._entries if kind == "entries" else self._events
                        batch = items[:self.batch_size]
                    if not batch:
                        break
                    try:
                        send_batch(self.queries, kind, batch, counts, attempts)
                    except Rejected as exc:
                        log.warning("index refused %d %s it could not spool (%s): lost", len(exc.items or batch),
                                    kind, exc)
                        with self._lock:
                            self._tally["lost"] += len(exc.items or batch)
                            self._tally["sent_direct"] += len(batch) - len(exc.items or batch)
                    except IndexServerError as exc:
                        error = str(exc)
                        self._delivery_failed(exc)
                        break
                    else:
                        with self._lock:
                            self._tally["sent_direct"] += len(batch)
                    with self._lock:
                        del items[:len(batch)]
                if error is not None:
                    break
        with self._lock:
            self._tally["delivered"] += counts["events"] + counts["duplicates"] + counts["entries"]
        return FlushReport(counts["events"], counts["duplicates"], counts["entries"], counts["rejected"],
                           0, error)

    def deliver(self, *, attempts: int | None = None) -> FlushReport:
        """Send every spooled batch, oldest first; stop at the first sign the index is down."""
        counts = {"events": 0, "duplicates": 0, "entries": 0, "rejected": 0}
        error: str | None = None
        # One sender per client; a thread that finds another one sending does not wait for it
        # (reports are on disk already), so recording an event never waits for the network.
        if not self._send_lock.acquire(blocking=False):
            return FlushReport(pending_batches=len(self.spool.pending()), error="another thread is delivering")
        try:
            failure = deliver_spooled(self.spool, self.queries, counts, attempts)
            if failure is not None:
                error = str(failure)
                self._delivery_failed(failure)
            else:
                self._down_until = 0.0
                self._problem = None
        finally:
            self._send_lock.release()
        with self._lock:
            self._tally["delivered"] += counts["events"] + counts["duplicates"] + counts["entries"]
        return FlushReport(counts["events"], counts["duplicates"], counts["entries"], counts["rejected"],
                           len(self.spool.pending()), error)

    def close(self) -> None:
        """Flush (spooling whatever cannot be delivered) and release the connection pool."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        sender = self._sender
        if sender is not None and sender is not threading.current_thread():
            sender.join(timeout=30)
        self.flush()
        with self._lock:
            # Nothing will write these any more: the spool refused them and the index was not there.
            left = len(self._events) + len(self._entries)
            if left:
                log.warning("%d index reports could not be spooled or delivered: lost", left)
                self._tally["lost"] += left
                self._events, self._entries = [], []
        atexit.unregister(self._exit_hook)
        self._http.close()

    def __enter__(self) -> IndexClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sender_loop(ref: weakref.ref[IndexClient]) -> None:
    """Spill and deliver in the background. Holds the client only weakly, so an abandoned client
    is collected (its atexit hook then has nothing to do) and the thread ends."""
    while True:
        client = ref()
        if client is None or client._closed:
            return
        wake, interval = client._wake, client.flush_interval
        del client
        wake.wait(timeout=interval)
        wake.clear()
        client = ref()
        if client is None or client._closed:
            return
        try:
            client._background_round()
        except Exception:  # the thread must survive anything a round can raise; the spool keeps the data
            log.warning("index sender round failed", exc_info=True)
        del client

