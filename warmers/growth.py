"""What a run compiled, for runtimes whose log lines do not say: the entries it added to the cache.

TorchNeuron's ``[NEFF_CACHE] Cache MISS`` lines come from an in-process dictionary consulted
before the disk cache (docs/runtimes.md, "torchneuron"): a MISS may be a disk hit, a HIT is a
graph the process had already, and its kernel path prints nothing at all. A layout whose lines
cannot be counted says so (:attr:`~neffcache.layouts.Layout.counts_from_cache`); for its
namespaces a run takes the committed entries before it starts and after it ends, and what is
new is what it compiled. What it looked up is the distinct keys of its lookup lines; the
lookups it did not compile were served by the disk (:func:`disk_hits`).

Why a listing and not modification times: entries copied in (a prefetch, a pull) keep their
writers' times, and a shared mount's clock is another host's. The listing is of the work
store, a local directory the run was pointed at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from threading import Lock

from neffcache.entry import EntryState, Namespace
from neffcache.layouts import get_layout
from neffcache.scan.report import scan
from neffcache.stores.base import Store

from .logscan import LogCounter


def counted_from_cache(namespaces: Sequence[Namespace]) -> list[Namespace]:
    """The namespaces whose runtime's compiles are counted from the cache, not from its lines."""
    return [ns for ns in namespaces if get_layout(ns.layout).counts_from_cache]


class CacheGrowth:
    """The committed entries of ``namespaces`` in ``store`` when made; :meth:`added` says which
    appeared since."""

    def __init__(self, store: Store, namespaces: Sequence[Namespace]) -> None:
        self.store = store
        self.namespaces = counted_from_cache(namespaces)
        self.before = self._committed()

    def _committed(self) -> dict[str, str]:
        """Entry path -> namespace path, of every SUCCESS entry now."""
        out: dict[str, str] = {}
        for ns in self.namespaces:
            for entry in scan(self.store, prefix=ns.path).entries:
                if entry.state is EntryState.SUCCESS and entry.namespace.path == ns.path:
                    out[entry.path] = ns.path
        return out

    def added(self) -> dict[str, str]:
        """Entry path -> namespace path, of every SUCCESS entry that was not there before."""
        return {path: ns for path, ns in self._committed().items() if path not in self.before}


def disk_hits(lookups: int, compiled: int) -> int:
    """The lookups a run made that the disk served: those it did not compile. A compile its
    lines do not announce (TorchNeuron's kernel path) makes this a lower bound, never more."""
    return max(0, lookups - compiled)


@dataclass(frozen=True)
class BucketCounts:
    """What one bucket of a warm-up did in the namespaces counted from the cache."""

    found: list[str]  # new entries this bucket claims (it publishes them)
    namespaces: frozenset[str]  # the namespaces counted from the cache
    compiled: dict[str, int]  # its compiles, by namespace
    served: dict[str, int]  # its disk hits, by namespace


class CountedFromCache:
    """A warm-up's buckets counted from the cache, across buckets.

    Which bucket's entry is which cannot be read from the cache (with --parallel, the first
    bucket to look finds another's entries too: it claims them, and publishes them with its
    tags), but each bucket's ``stored`` lines say how many it made: those are its count, and
    what is left over of what appeared (TorchNeuron's kernels log none) is :attr:`unannounced`,
    reported once when every bucket has ended. The sum is what appeared, whatever the order
    buckets end in; a bucket's hits are its lookups less its compiles."""

    def __init__(self, store: Store | None, namespaces: Sequence[Namespace]) -> None:
        self.growth = CacheGrowth(store, namespaces) if store is not None else None
        self.claimed: set[str] = set()
        self.unannounced = 0  # compiles found minus compiles announced, so far
        self._lock = Lock()

    @classmethod
    def nothing(cls) -> CountedFromCache:
        """Before a warm-up starts: no namespace is counted."""
        return cls(None, ())

    def bucket(self, counter: LogCounter, named: Sequence[str]) -> BucketCounts:
        """What the bucket whose lines ``counter`` read did (``named``: the entries its lines named)."""
        if self.growth is None:
            return BucketCounts([], frozenset(), {}, {})
        namespaces = frozenset(ns.path for ns in self.growth.namespaces)
        stored: dict[str, int] = {}
        for event in counter.events:
            if event.kind == "stored" and event.namespace in namespaces:
                stored[event.namespace] = stored.get(event.namespace, 0) + 1
        with self._lock:
            found = [p for p in self.growth.added() if p not in named and p not in self.claimed]
            self.claimed.update(found)
            self.unannounced += len(found) - sum(stored.values())
        served = {ns: disk_hits(n, stored.get(ns, 0)) for ns, n in counter.lookups().items() if ns in namespaces}
        return BucketCounts(found, namespaces, stored, served)
