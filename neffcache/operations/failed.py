"""The failed entries of a store, read and judged: which failures stand, and why each failed.

A FAILED entry is one the runtime (or neffcache's compile pool) recorded as failed: layout A
keeps the compiler's text in the entry's failure log, and every later run skips the graph
until it is retried. :func:`read_failed` reads that log through the entry's layout (the log's
form is a runtime fact) and gives its verdict (:mod:`neffcache.failures`: compiler error or
environment) and signature, so ``scan``, ``prune --failed environment``, the warm-ups and
``neffcache failures`` judge a failure alike.

A failure *stands* (:meth:`FailedGraph.stands`) when it should keep the graph from being
compiled again: a compiler error younger than the failure TTL. An environment failure never
stands (the host failed, not the graph), and neither does one older than the TTL (the
compiler may have been fixed since).

The log is untrusted input from a store: only its first 16 KiB (where the runtime writes the
command) and its last 240 KiB (where the compiler's error is) are kept, so a crafted or
runaway log costs a bounded read of memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from neffcache.entry import Entry, EntryState
from neffcache.errors import EntryNotFound, StoreError
from neffcache.failure_groups import SeenIn, Sighting, sighting
from neffcache.failures import Verdict, classify_text, first_error, signature
from neffcache.layouts import get_layout
from neffcache.scan.report import scan
from neffcache.stores.base import Store

log = logging.getLogger(__name__)
_HEAD = 16 * 1024
_TAIL = 240 * 1024
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class FailedGraph:
    """One FAILED entry of one store: what its failure log says and what neffcache makes of it."""

    store: str  # the store's URL
    entry: Entry
    log_name: str  # the failure log's name in the entry
    failed_at: float  # the log's mtime: when the failure was recorded
    command: tuple[str, ...] | None  # the compiler command, when the log names it
    text: str  # what the compiler printed, as the log holds it
    verdict: Verdict
    signature: str

    @property
    def path(self) -> str:
        return self.entry.path

    @property
    def message(self) -> str:
        return first_error(self.text)

    def stands(self, now: float, ttl: float | None) -> bool:
        """True when this failure should keep the graph from compiling again: a compiler error
        recorded less than ``ttl`` seconds before ``now`` (no TTL: for ever, as the runtime)."""
        if self.verdict.is_environment:
            return False
        return ttl is None or now - self.failed_at < ttl

    def sighting(self) -> Sighting:
        """This failure as ``neffcache failures`` groups it."""
        return sighting(self.text, seen=self.failed_at, path=self.path, source=SeenIn.STORE,
                        compiler_version=self.entry.namespace.compiler_version, store=self.store)

    def to_json(self) -> dict[str, object]:
        tc = self.entry.toolchain
        verdict = self.verdict
        return {"store": self.store, "path": self.path, "class": verdict.failure_class, "cause": verdict.cause,
                "detail": verdict.detail, "signature": self.signature, "message": self.message,
                "failed_at": self.failed_at, "compiler_version": self.entry.namespace.compiler_version,
                "toolchain": tc.to_json() if tc else None}


def read_log(store: Store, path: str) -> bytes:
    """The first 16 KiB and the last 240 KiB of the file at ``path`` (all of a smaller one)."""
    head = b""
    tail = bytearray()
    skipped = False
    with store.open_read(path) as stream:
        while len(head) < _HEAD and (chunk := stream.read(min(_CHUNK, _HEAD - len(head)))):
            head += chunk
        while chunk := stream.read(_CHUNK):
            tail += chunk
            if len(tail) > _TAIL:
                del tail[:len(tail) - _TAIL]
                skipped = True
    return head + (b"\n...\n" if skipped else b"") + bytes(tail)


def read_failed(store: Store, entry: Entry) -> FailedGraph | None:
    """``entry``'s failure, or None when it is not a FAILED entry with a failure log (or the log
    went away meanwhile: a retry replaced it)."""
    if entry.state is not EntryState.FAILED:
        return None
    layout = get_layout(entry.layout)
    name = layout.failure_log_of(entry)
    if name is None:
        return None
    try:
        data = read_log(store, entry.store_path(name))
    except EntryNotFound:
        return None
    record = layout.read_failure_log(data)
    info = entry.files[name]
    return FailedGraph(store.url, entry, name, info.mtime, record.command, record.output,
                       classify_text(record.output), signature(record.output))


def failed_graphs(store: Store, entries: Iterable[Entry], *, workers: int = 8,
                  warnings: list[str] | None = None) -> list[FailedGraph]:
    """The failures of the FAILED ``entries`` of ``store``, read ``workers`` at a time (one
    small read each; on S3 a GET each). An entry whose log cannot be read is left out and
    named in ``warnings``: one unreadable log must not hide the rest."""
    wanted = [e for e in entries if e.state is EntryState.FAILED]

    def one(entry: Entry) -> FailedGraph | None:
        try:
            return read_failed(store, entry)
        except StoreError as exc:
            if warnings is not None:
                warnings.append(f"{store.url}/{entry.path}: cannot read its failure log: {exc}")
            return None

    if not wanted:
        return []
    with ThreadPoolExecutor(max(1, min(workers, len(wanted))), thread_name_prefix="neffcache-failed") as pool:
        return [got for got in pool.map(one, wanted) if got is not None]


def standing_failure(store: Store, entry: Entry, *, ttl: float | None, now: float | None = None
                     ) -> FailedGraph | None:
    """``entry``'s failure when it stands (:meth:`FailedGraph.stands`), else None."""
    failed = read_failed(store, entry)
    if failed is None or not failed.stands(time.time() if now is None else now, ttl):
        return None
    return failed


def store_failures(store: Store, *, since: float | None = None, warnings: list[str] | None = None
                   ) -> list[FailedGraph]:
    """Every failure of ``store`` (one listing, then a small read per FAILED entry), those
    recorded at or after ``since`` when given; the scan's own warnings go to ``warnings``."""
    report = scan(store)
    if warnings is not None:
        warnings.extend(f"{store.url}: {w}" for w in report.warnings[:20])
    return [f for f in failed_graphs(store, report.entries, warnings=warnings)
            if since is None or f.failed_at >= since]
