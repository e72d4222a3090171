"""Where each of many entry paths is held: the stores, fastest first, and the index in one request.

``plan`` asks this for every graph a job will look up. The answer per path:

- the first store (in the order given: fastest tier first) holding a *committed SUCCESS* entry
  there, i.e. what the runtime pointed at that store would serve. The stores are asked in order
  and each only for the paths no faster store held, so a warm NVMe tier answers nearly
  everything and S3 is asked about the rest;
- what the index knows of the path (one batch request for every path:
  :meth:`~neffcache.index.client.IndexClient.lookup_many`), in particular the stores it says
  hold it. A path no configured store holds but the index places in another store is
  ``elsewhere``: still a compile for this job, unless someone pulls it first.

A store asks for few paths one entry at a time (:func:`~neffcache.scan.report.load_entry`,
in parallel); for many, one listing of each namespace they lie in is cheaper (on S3, a LIST
per thousand keys instead of a request per key), the habit of :mod:`neffcache.replication.sync`.

Faults are notes, never failures: a store that cannot be read, or an index that is down or
refuses, leaves those answers unknown (the paths count as not held there) and says so; the
other stores still answer. Read-only: nothing is written anywhere, nothing is reported.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from neffcache.entry import EntryState
from neffcache.errors import IndexServerError, StoreError
from neffcache.index.records import CompileSample
from neffcache.layouts import LAYOUTS
from neffcache.scan.report import load_entry, scan
from neffcache.stores.base import Store

log = logging.getLogger(__name__)
FEW_PATHS = 256  # up to this many paths a store is asked entry by entry, beyond it listed
_LOOKUP_THREADS = 16


class IndexQuestions(Protocol):
    """What lookup and the forecast ask of the index (an IndexClient or a NullIndex answer it)."""

    enabled: bool

    def lookup_many(self, paths: Iterable[str]) -> dict[str, dict[str, Any] | None]: ...

    def similar(self, *, hlo_sha256: str | None = None, model: str | None = None,
                limit: int = 50) -> list[dict[str, Any]]: ...

    def compile_samples(self, target: str, *, limit: int = 1000) -> list[CompileSample]: ...


class HeldStatus(enum.StrEnum):
    """Whether the job will find a graph: in a configured store, only in another store the
    index knows, or nowhere (it will be compiled)."""

    HIT = "hit"
    ELSEWHERE = "elsewhere"
    MISS = "miss"


@dataclass(frozen=True)
class Holding:
    """Where one path is held. ``store``: the first configured store holding it (None: none);
    ``index``: the index's record (None: no record, or the index was not asked)."""

    path: str
    store: str | None = None
    index: Mapping[str, Any] | None = None

    @property
    def index_stores(self) -> tuple[str, ...]:
        """The stores the index says hold a healthy copy."""
        if self.index is None or self.index.get("state") != EntryState.SUCCESS.value:
            return ()
        stores = self.index.get("stores")
        return tuple(s for s in stores if isinstance(s, str)) if isinstance(stores, list) else ()

    def status(self, asked: Sequence[str] = ()) -> HeldStatus:
        """HIT when a store held it; ELSEWHERE when the index places it in a store not among
        ``asked`` (the stores looked in: one of those that lacked it is just a stale record)."""
        if self.store is not None:
            return HeldStatus.HIT
        if any(s not in asked for s in self.index_stores):
            return HeldStatus.ELSEWHERE
        return HeldStatus.MISS

    def to_json(self, asked: Sequence[str] = ()) -> dict[str, Any]:
        return {"status": self.status(asked), "store": self.store, "index_stores": list(self.index_stores)}


@dataclass(frozen=True)
class LookupReport:
    holdings: Mapping[str, Holding]
    stores: tuple[str, ...]  # the stores looked in, fastest first
    index_asked: bool = False  # the index answered (its records are in the holdings)
    notes: tuple[str, ...] = ()

    def status(self, path: str) -> HeldStatus:
        return self.holdings.get(path, Holding(path)).status(self.stores)

    def holding(self, path: str) -> Holding:
        return self.holdings.get(path, Holding(path))


def lookup(paths: Iterable[str], stores: Sequence[Store], index: IndexQuestions | None = None, *,
           threads: int = _LOOKUP_THREADS) -> LookupReport:
    """Where each of ``paths`` is held (see the module docstring)."""
    wanted = list(dict.fromkeys(paths))
    notes: list[str] = []
    found: dict[str, str] = {}
    for store in stores:
        left = [p for p in wanted if p not in found]
        if not left:
            break
        try:
            held = held_in(store, left, threads=threads)
        except (StoreError, OSError) as exc:
            notes.append(f"store {store.url} could not be read ({type(exc).__name__}: {exc}); "
                         "its entries count as missing")
            continue
        found.update(dict.fromkeys(held, store.url))
    records, index_note = _ask_index(index, wanted)
    if index_note:
        notes.append(index_note)
    holdings = {p: Holding(p, found.get(p), records.get(p)) for p in wanted}
    return LookupReport(holdings, tuple(s.url for s in stores), index_note is None and index is not None
                        and index.enabled, tuple(notes))


def held_in(store: Store, paths: Sequence[str], *, threads: int = _LOOKUP_THREADS) -> set[str]:
    """The paths ``store`` holds as committed SUCCESS entries."""
    if len(paths) <= FEW_PATHS:
        with ThreadPoolExecutor(max(1, min(threads, len(paths)))) as pool:
            entries = list(pool.map(lambda p: load_entry(store, p, read_manifest=False), paths))
        return {e.path for e in entries if e is not None and e.committed and e.state is EntryState.SUCCESS}
    wanted = set(paths)
    held: set[str] = set()
    for prefix in sorted(_namespaces(paths)):
        held.update(e.path for e in scan(store, prefix=prefix).entries
                    if e.path in wanted and e.state is EntryState.SUCCESS)
    return held


def _namespaces(paths: Iterable[str]) -> set[str]:
    """The namespace directories the paths lie in (the root, "", for a path no layout places)."""
    out = set()
    for path in paths:
        probe = next((got for lay in LAYOUTS.values() if (got := lay.locate_entry(path))), None)
        out.add(probe.namespace.path if probe is not None else "")
    return out


def _ask_index(index: IndexQuestions | None, paths: list[str]) -> tuple[dict[str, dict[str, Any] | None], str | None]:
    if index is None or not index.enabled or not paths:
        return {}, None
    try:
        return index.lookup_many(paths), None
    except IndexServerError as exc:
        return {}, f"the index did not answer ({exc}); the stores answered alone"


# -- what the index remembers of compiles, for the forecast ------------------------------------
@dataclass(frozen=True)
class History:
    """The index's compile history the forecast reads: per HLO digest, the compile seconds of
    the same graph (under any compiler) with the target it was built for; per target, samples
    of (HLO size, compile seconds)."""

    by_hlo: Mapping[str, tuple[tuple[str | None, float], ...]] = field(default_factory=dict)
    samples: Mapping[str, tuple[CompileSample, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def ask_history(index: IndexQuestions | None, digests: Iterable[str], targets: Iterable[str], *,
                threads: int = 8) -> History:
    """What the index knows of these graphs' and targets' compiles. One question per distinct
    digest (in parallel) and per target; an index that fails stops being asked (one note)."""
    if index is None or not index.enabled:
        return History()
    unique = sorted(set(digests))
    try:
        with ThreadPoolExecutor(max(1, min(threads, len(unique) or 1))) as pool:
            answers = list(pool.map(lambda d: index.similar(hlo_sha256=d), unique))
        samples = {t: tuple(index.compile_samples(t)) for t in sorted(set(targets))}
    except IndexServerError as exc:
        return History(notes=(f"the index's compile history is unavailable ({exc}): no forecast from it",))
    by_hlo = {d: tuple(pair for r in records if (pair := _seconds_of(r, d)) is not None)
              for d, records in zip(unique, answers, strict=True)}
    return History({d: v for d, v in by_hlo.items() if v}, samples)


def _seconds_of(record: Mapping[str, Any], digest: str) -> tuple[str | None, float] | None:
    """(target, compile seconds) of one index record, if it is of this HLO and has a usable time."""
    if record.get("hlo_sha256") not in (None, digest):
        return None  # a record matched on something else (a model tag): not this graph's time
    seconds = record.get("compile_seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < 1e7:
        return None  # NaN, negative, absurd: untrusted input never reaches the arithmetic
    toolchain = record.get("toolchain")
    target = toolchain.get("target") if isinstance(toolchain, Mapping) else None
    return (target if isinstance(target, str) else None), float(seconds)
