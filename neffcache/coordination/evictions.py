"""Eviction tombstones: what a size budget removed, so a later miss on it can be counted as a
*regretted eviction* (``prune --regret``).

Each execution of a prune that removed entries for a budget leaves, per store, one small
record in the store's control directory::

    .neffcache/evictions/20261207T051502.123456Z-3f9c1a2b7d0e4c11-1.json

holding, per evicted entry, its path (its runtime key in the layout), bytes, the compile
seconds the policy weighed (recorded, or the default it was costed at), when and by which
policy. A record is written whole through ``put_file`` (a temp file and a rename on a mount,
one PUT on S3), so a reader never sees half of one.

Bounded by count and age: a record holds at most :data:`MAX_PER_RECORD` tombstones (a bigger
eviction is split into parts), records older than :data:`TOMBSTONE_DAYS` are ignored by
readers and removed by the next write, which also keeps only the newest :data:`MAX_RECORDS`.
Read as untrusted input: a record above :data:`MAX_RECORD_BYTES`, one that is not JSON of the
expected shape, or a tombstone with a path that is not a canonical relative path, a size or
time that is not a number in range, is skipped and said so; nothing else is affected.
"""

from __future__ import annotations

import calendar
import json
import logging
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from neffcache.entry import FileInfo
from neffcache.errors import EntryNotFound, NeffcacheError
from neffcache.keys import is_canonical_relpath
from neffcache.manifest import MAX_SECONDS
from neffcache.stores.base import CONTROL_DIR, Store

log = logging.getLogger(__name__)
EVICTIONS_DIR = f"{CONTROL_DIR}/evictions"
TOMBSTONE_DAYS = 30.0  # a miss a month after an eviction says more about demand than the policy
MAX_PER_RECORD = 2000  # tombstones per record: ~0.4 MB
MAX_RECORDS = 100  # records kept per store: at most 200,000 tombstones to read
MAX_RECORD_BYTES = 1 << 20
MAX_PATH = 1024
_STAMP = "%Y%m%dT%H%M%S"
_NAME = re.compile(r"^(\d{8}T\d{6})\.(\d{6})Z-[0-9a-f]{1,32}-\d{1,6}\.json$")
_POLICY = re.compile(r"^[a-z][a-z0-9-]{0,15}$")


@dataclass(frozen=True)
class Tombstone:
    """One entry a budget evicted from ``store``."""

    store: str
    path: str
    bytes: int
    compile_seconds: float  # what the policy weighed: recorded, or the default it was costed at
    at: float
    policy: str

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "path": self.path, "bytes": self.bytes,
                "compile_seconds": self.compile_seconds, "at": self.at, "policy": self.policy}


def record_time(path: str) -> float | None:
    """The UTC time a record's name starts with, or None for a name that is not a record's."""
    match = _NAME.match(path.rsplit("/", 1)[-1])
    if match is None:
        return None
    try:
        return calendar.timegm(time.strptime(match.group(1), _STAMP)) + int(match.group(2)) / 1e6
    except ValueError:
        return None


def record_files(store: Store) -> list[tuple[float, FileInfo]]:
    """(time, file) of every tombstone record, oldest first."""
    out = []
    for info in store.iter_files(EVICTIONS_DIR):
        at = record_time(info.path)
        if at is not None:
            out.append((at, info))
    return sorted(out, key=lambda t: (t[0], t[1].path))


def write_tombstones(store: Store, plan_id: str, evicted: Sequence[Tombstone], *, now: float | None = None) -> int:
    """Record ``evicted`` (entries just removed from ``store`` for a budget) and drop expired
    and surplus records. Returns the tombstones written. Never raises for the store: the
    evictions are done, and failing to record them must not report the prune as failed."""
    if not evicted:
        return 0
    at = time.time() if now is None else now
    stamp = time.strftime(_STAMP, time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"
    plan = re.sub(r"[^0-9a-f]", "", plan_id.lower())[:32] or "0"
    written = 0
    try:
        for part, start in enumerate(range(0, len(evicted), MAX_PER_RECORD), 1):
            chunk = evicted[start:start + MAX_PER_RECORD]
            body = {"format": 1, "plan": plan_id, "at": at,
                    "evictions": [{k: v for k, v in t.to_json().items() if k != "store"} for t in chunk]}
            store.put_file(f"{EVICTIONS_DIR}/{stamp}-{plan}-{part}.json", json.dumps(body).encode())
            written += len(chunk)
        _trim(store, at)
    except (NeffcacheError, OSError) as exc:
        log.warning("cannot record the evictions of %s: %s", store.url, exc)
    return written


def _trim(store: Store, now: float) -> None:
    files = record_files(store)
    expired = [info.path for at, info in files if now - at > TOMBSTONE_DAYS * 86400]
    surplus = [info.path for _, info in files[: max(len(files) - MAX_RECORDS, 0)]]
    gone = sorted(set(expired) | set(surplus))
    if gone:
        store.discard(gone)


def read_tombstones(store: Store, *, now: float | None = None, warnings: list[str] | None = None) -> list[Tombstone]:
    """The store's tombstones younger than :data:`TOMBSTONE_DAYS`, oldest first."""
    now = time.time() if now is None else now
    out: list[Tombstone] = []
    for at, info in record_files(store)[-MAX_RECORDS:]:
        if now - at > TOMBSTONE_DAYS * 86400:
            continue
        if info.size > MAX_RECORD_BYTES:
            _warn(warnings, f"{store.url}: {info.path}: {info.size} bytes, too large for a tombstone record: skipped")
            continue
        try:
            raw = store.read_bytes(info.path)
        except (EntryNotFound, FileNotFoundError):
            continue  # trimmed by a writer while we listed
        except (NeffcacheError, OSError) as exc:
            _warn(warnings, f"{store.url}: {info.path}: {exc}")
            continue
        found, bad = parse_record(store.url, raw[: MAX_RECORD_BYTES + 1])
        if found is None:
            _warn(warnings, f"{store.url}: {info.path}: not a tombstone record: skipped")
            continue
        if bad:
            _warn(warnings, f"{store.url}: {info.path}: {bad} malformed tombstones skipped")
        out.extend(found)
    return out


def parse_record(store: str, raw: bytes) -> tuple[list[Tombstone] | None, int]:
    """The tombstones of one record's bytes and how many were malformed; None when the record
    itself is not one."""
    if len(raw) > MAX_RECORD_BYTES:
        return None, 0
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None, 0
    items = data.get("evictions") if isinstance(data, dict) and data.get("format") == 1 else None
    if not isinstance(items, list):
        return None, 0
    found = [t for t in (_tombstone(store, item) for item in items) if t is not None]
    return found, len(items) - len(found)


def _tombstone(store: str, item: Any) -> Tombstone | None:
    if not isinstance(item, dict):
        return None
    path, size, seconds, at, policy = (item.get(k) for k in ("path", "bytes", "compile_seconds", "at", "policy"))
    if not (isinstance(path, str) and len(path) <= MAX_PATH and is_canonical_relpath(path)):
        return None
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 1 << 62:
        return None
    cost, when = _number(seconds), _number(at)
    if cost is None or not 0 < cost <= MAX_SECONDS or when is None or when <= 0:
        return None
    if not (isinstance(policy, str) and _POLICY.match(policy)):
        return None
    return Tombstone(store, path, size, cost, when, policy)


def _number(value: Any) -> float | None:
    """A finite number from JSON, or None (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _warn(warnings: list[str] | None, message: str) -> None:
    if warnings is not None:
        warnings.append(message)
    else:
        log.warning("%s", message)


def by_path(tombstones: Iterable[Tombstone]) -> dict[tuple[str, str], Tombstone]:
    """(store, path) -> its newest tombstone."""
    out: dict[tuple[str, str], Tombstone] = {}
    for t in tombstones:
        key = (t.store, t.path)
        if key not in out or t.at >= out[key].at:
            out[key] = t
    return out


@dataclass(frozen=True)
class Regret:
    """An eviction a later miss proved wrong: the compile it cost to have the entry back."""

    tombstone: Tombstone
    misses: int  # misses of its path the index counted since (about) the eviction
    last_miss: float

    def to_json(self) -> dict[str, Any]:
        return {**self.tombstone.to_json(), "misses": self.misses, "last_miss": self.last_miss}


@dataclass(frozen=True)
class RegretReport:
    tombstones: int  # evictions on record (the newest per store and path)
    regretted: tuple[Regret, ...]

    @property
    def seconds(self) -> float:
        return sum(r.tombstone.compile_seconds for r in self.regretted)

    def by_policy(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for r in self.regretted:
            slot = out.setdefault(r.tombstone.policy, {"regretted": 0, "seconds": 0.0})
            slot["regretted"] += 1
            slot["seconds"] += r.tombstone.compile_seconds
        return out

    def to_json(self) -> dict[str, Any]:
        return {"tombstones": self.tombstones, "regretted": len(self.regretted),
                "regret_seconds": self.seconds, "by_policy": self.by_policy(),
                "evictions": [r.to_json() for r in self.regretted]}


def regret(tombstones: Iterable[Tombstone], misses: dict[str, tuple[int, float]]) -> RegretReport:
    """Match tombstones with misses (entry path -> (misses, last miss), from the index): an
    eviction is regretted when its path was missed after it. One regretted eviction costs one
    compile, whatever the number of misses: the first miss compiles the entry back (its
    other misses are the runtime's or a cold tier's, not the budget's). Misses are counted per
    path over the whole window, so ``misses`` may include some from before the eviction."""
    newest = by_path(tombstones)
    found = []
    for t in newest.values():
        count, last = misses.get(t.path, (0, 0.0))
        if count and last > t.at:
            found.append(Regret(t, count, last))
    found.sort(key=lambda r: (-r.tombstone.compile_seconds, r.tombstone.path))
    return RegretReport(len(newest), tuple(found))
