"""The graphs a job missed, as ``neffcache run --report`` records them for ``why-miss``.

Each is a :class:`~neffcache.misses.wanted.WantedGraph` (the form ``plan --json`` writes too)
with a ``status`` (:class:`~neffcache.misses.inputs.ReportedStatus`): its path in the work
store and what that store says of its key's parts. After the job, a compiled entry has the
manifest ``run`` gave it (digests, flags, toolchain); a failed one has its HLO and flags file,
and its HLO is hashed here (it is on the local work store: one read per failed graph). A path
the store no longer holds is reported with what its name says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from neffcache.layouts import LAYOUTS
from neffcache.misses.inputs import ReportedStatus
from neffcache.misses.nearest import StoreCatalog
from neffcache.misses.wanted import WantedGraph
from neffcache.scan.report import load_entry
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain


def reported_graph(store: Store, path: str, status: ReportedStatus, *, toolchain: Toolchain,
                   tags: Mapping[str, str]) -> dict[str, Any] | None:
    """The report's record of the graph at ``path`` in ``store``; None when no layout names it."""
    entry = load_entry(store, path)
    if entry is None:
        located = next((got for lay in LAYOUTS.values() if (got := lay.locate_entry(path))), None)
        if located is None:
            return None
        graph = WantedGraph(path=located.path, layout=located.namespace.layout, namespace=located.namespace.path,
                            key=located.key, toolchain=toolchain, tags=dict(tags))
        return {**graph.to_json(), "status": status.value}
    catalog = StoreCatalog(store, {entry.path: entry})
    digest = catalog.hlo_digest(entry)
    parts = catalog.parts(entry)
    graph = WantedGraph(path=entry.path, layout=entry.layout, namespace=entry.namespace.path, key=entry.key,
                        toolchain=entry.toolchain or toolchain, hlo_sha256=digest, hlo_size=parts.hlo_size,
                        flags=parts.flags, bucket=tags.get("bucket"), tags={**tags, **parts.tags})
    return {**graph.to_json(), "status": status.value}
