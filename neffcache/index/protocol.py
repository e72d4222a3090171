"""What every index answers: :class:`Index`, the one protocol :class:`~neffcache.index.client.IndexClient`
and :class:`~neffcache.index.null.NullIndex` both satisfy, checked by mypy where each is assigned
to it below. A caller outside this package holds an ``Index`` and asks it; it never tests which
class it got (tests/test_layers.py finds any ``isinstance``/``getattr`` on one), so a difference
between a configured and an absent index is a member here that each answers its own way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from neffcache.events import EventKind
from neffcache.index.records import CompileSample, EntryRecord, Event, IndexLease
from neffcache.index.reports import FlushReport, ReportCounts


class Index(Protocol):
    """An index server's client, or the stand-in when none is configured."""

    # Whether reports reach a server and questions get answers (False: the NullIndex).
    enabled: bool
    # Called once when the server refuses the token mid-command (a CLI prints it at once).
    on_problem: Callable[[str], None] | None

    @property
    def url(self) -> str | None: ...

    @property
    def spool_directory(self) -> Path | None:
        """Where undelivered reports wait (None: no index, nothing waits)."""

    def pending_batches(self) -> int:
        """Batches of reports waiting in the spool for ``flush`` (0 without an index)."""

    def record(self, kind: EventKind, **fields: Any) -> Event: ...

    def add_event(self, event: Event) -> None: ...

    def register_entry(self, record: EntryRecord | Mapping[str, Any]) -> None: ...

    def register_entries(self, records: Iterable[EntryRecord | Mapping[str, Any]]) -> None: ...

    def flush(self) -> FlushReport: ...

    def counts(self) -> ReportCounts: ...

    def deliver(self) -> FlushReport: ...

    def close(self) -> None: ...

    def lookup(self, path: str) -> dict[str, Any] | None: ...

    def lookup_many(self, paths: Iterable[str]) -> dict[str, dict[str, Any] | None]: ...

    def similar(self, *, hlo_sha256: str | None = None, model: str | None = None,
                limit: int = 50) -> list[dict[str, Any]]: ...

    def compile_samples(self, target: str, *, limit: int = 1000) -> list[CompileSample]: ...

    def find_entries(self, *, page_size: int = 500, **filters: Any) -> Iterator[dict[str, Any]]: ...

    def forget(self, path: str, store: str | None = None) -> dict[str, Any] | None: ...

    def stats(self, window: str = "7d", group_by: str = "team", **filters: str | None) -> dict[str, Any]: ...

    def failures(self, window: str = "7d", top: int = 100) -> dict[str, Any]: ...

    def usage_hits(self, toolchain: str, *, since: float, until: float) -> dict[str, int]: ...

    def usage_misses(self, *, since: float, until: float) -> dict[str, tuple[int, float]]: ...

    def acquire(self, name: str, ttl: float = 600.0) -> IndexLease: ...

    def renew(self, lease: IndexLease, ttl: float = 600.0) -> IndexLease: ...

    def release(self, lease: IndexLease) -> bool: ...

    def healthy(self) -> bool: ...
