"""Warming a runtime that keeps a node-local tier beside the shared one (vLLM-Neuron).

Such a runtime (a layout with :meth:`~neffcache.layouts.base.Layout.node_local_env`) reads
the store as its shared tier and compiles into a tier on the node; it prints no line per
graph, and it promotes to the shared tier only when told to. So for each bucket:

- **before**: the workload gets a private, empty node-local tier (under the warm-up's own
  directory, removed at the end) and the keys committed in the shared tier (the work store's
  namespace, at the path the layout's readers look: :meth:`Layout.plan_entry`) are noted;
- **after**, from the caches, not from lines: every key committed in the private tier or newly
  in the shared tier that was not in the shared tier before is *compiled* by this bucket;
  every key in the private tier that was in the shared tier before was *fetched* (a hit: the
  private tier started empty, so nothing else put it there). Buckets run at once: a key new in
  the shared tier that another bucket's private tier holds is that bucket's (its runtime saved
  it), and a key is claimed once per warm-up: the first bucket to account for it counts the
  compile, the others a hit (two buckets that both hold a graph cannot be told apart: one of
  them compiled it, the other fetched what the first saved). A key another host saved
  meanwhile counts as this bucket's: from the caches alone it cannot be told apart;
- **promotion**: every committed entry of the private tier that the shared tier lacks is
  copied into the work store by :func:`~neffcache.operations.ingest.transfer` (verified,
  atomic, where the layout's writers put it: flat for vLLM), with a manifest of the warm's
  toolchain and tags; entries the runtime saved itself get theirs in place
  (:meth:`Placement.adopt`, created exclusively). Then the compiled ones go to the other tiers
  and the index like any warmed entry (:meth:`Placement.ingest_many`), with a miss and a
  compile event each; each fetched one gets a hit event.

Nothing here names a runtime: the layouts say which have such a tier and where entries lie.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from neffcache.entry import Entry, EntryState, Namespace
from neffcache.errors import NeffcacheError
from neffcache.events import EventKind
from neffcache.layouts import LAYOUTS
from neffcache.layouts.base import Layout
from neffcache.operations.ingest import transfer
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain

from .matrix import Bucket
from .placement import Placement
from .report import GroupReport

log = logging.getLogger(__name__)


@dataclass
class Served:
    """What one bucket's node-local tiers say it did."""

    hits: int = 0
    compiled: int = 0
    bytes: int = 0
    published: int = 0  # copies made to tiers beyond the work store
    notes: list[str] = field(default_factory=list)

    def add_to(self, row: GroupReport) -> None:
        row.hits += self.hits
        row.compiled += self.compiled
        row.bytes += self.bytes
        row.graphs += self.hits + self.compiled


class NodeTiers:
    """The private node-local tiers of one warm-up's buckets, under ``base``."""

    def __init__(self, placement: Placement, toolchain: Toolchain, base: Path) -> None:
        self.placement = placement
        self.toolchain = toolchain
        self.base = base
        self.layouts: list[tuple[Layout, Namespace]] = [
            (lay, ns) for lay in LAYOUTS.values()
            if lay.node_local_env(str(base), ns := lay.namespace_for(toolchain))]
        self._claimed: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def root(self, bucket: Bucket) -> Path:
        return self.base / f"{bucket.index:03d}"

    def env_for(self, bucket: Bucket) -> dict[str, str]:
        """The variables that give ``bucket``'s workload its private node-local tier."""
        env: dict[str, str] = {}
        for lay, ns in self.layouts:
            env.update(lay.node_local_env(str(self.root(bucket)), ns))
        return env

    def before(self) -> dict[str, frozenset[str]]:
        """The keys committed in the shared tier, per namespace path."""
        return {ns.path: self._shared(lay, ns) for lay, ns in self.layouts}

    def _shared(self, lay: Layout, ns: Namespace) -> frozenset[str]:
        return frozenset(e.key for e in scan(self.placement.work, prefix=ns.path).entries
                         if e.state is EntryState.SUCCESS and e.namespace == ns
                         and e.path == lay.plan_entry(ns, e.key).path)

    def account(self, bucket: Bucket, before: Mapping[str, frozenset[str]], tags: Mapping[str, str]) -> Served:
        """Count, promote and report what ``bucket``'s workload did (the module docstring)."""
        served = Served()
        for lay, ns in self.layouts:
            self._account(lay, ns, self.root(bucket), before.get(ns.path, frozenset()), tags, served)
        return served

    def _account(self, lay: Layout, ns: Namespace, root: Path, before: frozenset[str], tags: Mapping[str, str],
                 served: Served) -> None:
        placement, work = self.placement, self.placement.work
        local = LocalStore(root) if root.is_dir() else None
        mine: dict[str, Entry] = {}
        if local is not None:
            mine = {e.key: e for e in scan(local, prefix=ns.path).entries
                    if e.state is EntryState.SUCCESS and e.namespace == ns}
        shared = self._shared(lay, ns)
        # New in the shared tier but not in ours: saved by this run's runtime, unless another
        # bucket's private tier holds it (that bucket's runtime saved it).
        saved = {k for k in shared - before - mine.keys() if not self._elsewhere(lay, ns, k, root)}
        new = (mine.keys() - before) | saved
        with self._lock:
            compiled = sorted(k for k in new if (ns.path, k) not in self._claimed)
            self._claimed.update((ns.path, k) for k in compiled)
        fetched = sorted(k for k in mine if k not in compiled)
        for key in sorted(mine.keys() - shared):
            assert local is not None
            try:
                transfer(local, mine[key], work, tags=tags)
            except (NeffcacheError, OSError) as exc:
                served.notes.append(f"{lay.plan_entry(ns, key).path}: could not publish it from the node-local "
                                    f"tier: {exc}")
        paths = {lay.plan_entry(ns, key).path: key for key in compiled}
        adopted = placement.ingest_many([(path, tags, None) for path in paths], toolchain=self.toolchain)
        served.compiled += len(compiled)
        for path, (entry, held) in adopted.items():
            served.published += len(held) - 1
            served.bytes += entry.size
            placement.event(EventKind.MISS, path, entry.namespace)
            placement.event(EventKind.COMPILE, path, entry.namespace)
        hit_paths = [lay.plan_entry(ns, key).path for key in fetched]
        for path in hit_paths:
            placement.event(EventKind.HIT, path, ns)
        placement.stamp(hit_paths)
        served.hits += len(fetched)

    def _elsewhere(self, lay: Layout, ns: Namespace, key: str, root: Path) -> bool:
        """Whether another bucket's private tier holds entry ``key``."""
        where = lay.runtime_local_path(ns, key)
        if where is None:
            return False
        try:
            others = [d for d in self.base.iterdir() if d != root]
        except OSError:
            return False
        return any((d / where).is_dir() for d in others)

    def close(self) -> None:
        """Remove the private tiers (what they held the shared tier now has)."""
        shutil.rmtree(self.base, ignore_errors=True)


def private_base(local_root: str | None) -> Path:
    """A directory of this warm-up's own under the node-local root (default: the temp dir)."""
    parent = Path(local_root) if local_root else Path(tempfile.gettempdir())
    return parent / f"warm-{os.getpid()}-{os.urandom(4).hex()}"
