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
from threading import Lock

from neffcache.entry import EntryState, Namespace
from neffcache.layouts import get_layout
from neffcache.operations.scan import scan
from neffcache.stores.base import Store


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


class Announced:
    """Per bucket of a warm-up, the compiles its own ``stored`` lines announce; across buckets,
    the compiles the cache shows that no line announced (TorchNeuron's kernels log none).

    Which bucket's entry is which cannot be read from the cache (with --parallel, the first
    bucket to look finds another's entries too), but each bucket's lines say how many it
    stored: those are its count, and what is left over of what appeared is reported once, when
    every bucket has ended. The sum is what appeared, whatever the order buckets end in."""

    def __init__(self) -> None:
        self.unannounced = 0  # compiles found minus compiles announced, so far
        self._lock = Lock()

    def bucket(self, stored: Sequence[str], found: int) -> dict[str, int]:
        """A bucket's compiles by namespace (``stored``: the namespace of each of its stored
        lines), given the ``found`` new entries it claimed."""
        counts: dict[str, int] = {}
        for ns_path in stored:
            counts[ns_path] = counts.get(ns_path, 0) + 1
        with self._lock:
            self.unannounced += found - len(stored)
        return counts
