"""The index when none is configured (no ``NEFFCACHE_INDEX_URL``): same interface as
:class:`~neffcache.index.client.IndexClient`; reports go nowhere, questions that need an answer
raise a clear :class:`~neffcache.errors.IndexServerError`, lookups find nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from neffcache.errors import IndexServerError
from neffcache.events import EventKind
from neffcache.index.records import CompileSample, EntryRecord, Event, IndexLease
from neffcache.index.reports import FlushReport, ReportCounts


class NullIndex:
    """The index when none is configured: reports go nowhere, questions get a clear error."""

    enabled = False
    url = None
    on_problem: Callable[[str], None] | None = None  # never called: there is no token to refuse
    spool_directory = None

    def pending_batches(self) -> int:
        return 0

    def record(self, kind: EventKind, **fields: Any) -> Event:
        return Event(kind=kind, **fields)

    def add_event(self, event: Event) -> None:
        return None

    def register_entry(self, record: EntryRecord | Mapping[str, Any]) -> None:
        return None

    def register_entries(self, records: Iterable[EntryRecord | Mapping[str, Any]]) -> None:
        return None

    def flush(self) -> FlushReport:
        return FlushReport()

    def counts(self) -> ReportCounts:
        return ReportCounts()

    def deliver(self) -> FlushReport:
        return FlushReport()

    def close(self) -> None:
        return None

    def __enter__(self) -> NullIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def lookup(self, path: str) -> dict[str, Any] | None:
        return None

    def lookup_many(self, paths: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        return dict.fromkeys(paths)

    def similar(self, *, hlo_sha256: str | None = None, model: str | None = None,
                limit: int = 50) -> list[dict[str, Any]]:
        return []

    def compile_samples(self, target: str, *, limit: int = 1000) -> list[CompileSample]:
        return []

    def find_entries(self, *, page_size: int = 500, **filters: Any) -> Iterator[dict[str, Any]]:
        return iter(())

    def forget(self, path: str, store: str | None = None) -> dict[str, Any] | None:
        return None

    def stats(self, window: str = "7d", group_by: str = "team", **filters: str | None) -> dict[str, Any]:
        raise _not_configured()

    def failures(self, window: str = "7d", top: int = 100) -> dict[str, Any]:
        raise _not_configured()

    def usage_hits(self, toolchain: str, *, since: float, until: float) -> dict[str, int]:
        return {}

    def usage_misses(self, *, since: float, until: float) -> dict[str, tuple[int, float]]:
        return {}

    def acquire(self, name: str, ttl: float = 600.0) -> IndexLease:
        raise _not_configured()

    def renew(self, lease: IndexLease, ttl: float = 600.0) -> IndexLease:
        raise _not_configured()

    def release(self, lease: IndexLease) -> bool:
        raise _not_configured()

    def healthy(self) -> bool:
        return False


def _not_configured() -> IndexServerError:
    return IndexServerError("no index server configured: set NEFFCACHE_INDEX_URL (and NEFFCACHE_TOKEN)")
