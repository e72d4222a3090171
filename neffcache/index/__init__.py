"""The index-server client: register entries, report events, take compile leases, read stats.

Typical use from a store or a warmer::

    from neffcache.index import open_index

    index = open_index()                    # NEFFCACHE_INDEX_URL / NEFFCACHE_TOKEN; NullIndex if unset
    index.register_entry({...})             # on publish; never raises, spooled when the index is down
    index.record(EventKind.HIT, path=p, key=k, namespace=ns, toolchain=tc, model="llama", team="ml")
    lease = index.acquire(path, ttl=900)    # raises IndexServerError when the index is down
    if lease.held: ...; index.release(lease)
    index.close()                           # flush; undelivered reports stay in the spool

Environment: ``NEFFCACHE_INDEX_URL``, ``NEFFCACHE_TOKEN``, ``NEFFCACHE_SPOOL_DIR`` (default
``$XDG_CACHE_HOME/neffcache/spool`` or ``~/.cache/neffcache/spool``), and defaults for events:
``NEFFCACHE_JOB``, ``NEFFCACHE_MODEL``, ``NEFFCACHE_TEAM``, ``NEFFCACHE_INSTANCE_TYPE``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neffcache.events import EventKind
from neffcache.index.client import IndexClient
from neffcache.index.null import NullIndex
from neffcache.index.protocol import Index
from neffcache.index.records import (
    MAX_LOOKUP_BATCH,
    CompileSample,
    EntryRecord,
    Event,
    IndexLease,
    entry_record,
    new_event_id,
    new_owner,
)
from neffcache.index.reports import FlushReport, ReportCounts
from neffcache.index.spool import Spool

ENV_URL = "NEFFCACHE_INDEX_URL"
ENV_TOKEN = "NEFFCACHE_TOKEN"  # noqa: S105 - the variable name, not a secret
ENV_SPOOL = "NEFFCACHE_SPOOL_DIR"
_ENV_DEFAULTS = {"job": "NEFFCACHE_JOB", "model": "NEFFCACHE_MODEL", "team": "NEFFCACHE_TEAM",
                 "instance_type": "NEFFCACHE_INSTANCE_TYPE"}


def default_spool_root() -> Path:
    explicit = os.environ.get(ENV_SPOOL)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "neffcache" / "spool"


def spool_dir_for(url: str, root: Path | None = None) -> Path:
    """One spool per index URL, so reports wait for the index they were meant for."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    return (root or default_spool_root()) / digest


@dataclass(frozen=True)
class WaitingSpool:
    """A spool directory with reports waiting, and the index URL they wait for (None when the
    spool predates URL files: its directory is a digest, not reversible)."""

    directory: Path
    url: str | None
    batches: int
    reports: int


def waiting_spools(root: Path | None = None) -> list[WaitingSpool]:
    """Every spool under ``root`` that holds undelivered batches, for any index URL: a command
    run with another ``--index-url`` leaves reports a plain ``neffcache flush`` never delivers."""
    base = root or default_spool_root()
    try:
        dirs = sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []
    found = []
    for directory in dirs:
        spool = Spool(directory)
        batches, reports = spool.pending_reports()
        if batches:
            found.append(WaitingSpool(directory, spool.recorded_url(), batches, reports))
    return found


def event_defaults() -> dict[str, str]:
    return {field: os.environ[var] for field, var in _ENV_DEFAULTS.items() if os.environ.get(var)}


def open_index(url: str | None = None, token: str | None = None, *, spool_root: Path | None = None,
               defaults: Mapping[str, str] | None = None, **options: Any) -> Index:
    """An :class:`IndexClient` for ``url`` (default ``$NEFFCACHE_INDEX_URL``), or a
    :class:`NullIndex` when no URL is configured. ``options`` go to :class:`IndexClient`."""
    url = url or os.environ.get(ENV_URL) or None
    if not url:
        return NullIndex()
    token = token or os.environ.get(ENV_TOKEN) or None
    merged = {**event_defaults(), **(defaults or {})}
    return IndexClient(url, token, spool_dir=spool_dir_for(url, spool_root), defaults=merged, **options)


# Both classes satisfy the protocol: mypy checks these two lines, member by member.
_CLIENT: type[Index] = IndexClient
_NULL: type[Index] = NullIndex


__all__ = [
    "ENV_SPOOL", "ENV_TOKEN", "ENV_URL", "MAX_LOOKUP_BATCH", "CompileSample", "EntryRecord",
    "Event", "EventKind",
    "FlushReport", "Index", "IndexClient", "IndexLease", "NullIndex", "ReportCounts", "Spool",
    "WaitingSpool", "default_spool_root", "entry_record", "event_defaults", "new_event_id", "new_owner",
    "open_index", "spool_dir_for", "waiting_spools",
]
