"""Readiness of a compiler upgrade: one rule for ``neffcache upgrade-report`` and the index server.

Readiness is the share of the old compiler's graphs that the new compiler's namespace already
holds (SUCCESS), each graph weighted by how much jobs use it::

    weight(graph) = hits in the window + UNUSED_WEIGHT
    readiness     = sum(weights of the ready graphs) / sum(weights of all the old graphs)

With hits counted, readiness is close to the share of tomorrow's lookups that would hit if the
fleet switched compilers now, which is the question before a switch. The floor keeps a graph
nobody used in the window from counting for nothing (a weekly job's graphs fall outside a short
window, and the window may be older than the event retention): ten unused graphs weigh as much as
one hit. Without hit counts (no index configured) every graph weighs the floor, and readiness is
the plain share of graphs.

The index server knows no runtime's naming rules, yet its dashboard shows readiness too. It pairs
an old graph with its new entry by key (what a runtime of the same flags-file era looks up) or by
:data:`REWARMED_FROM_TAG`, the tag ``neffcache rewarm`` puts on every entry it compiles: the key of
the entry it was compiled from (the new key differs for neuronxcc across a flags-file era and for
torchneuron, whose key covers the compiler version).

A value module: the library and the server both import it.
"""

from __future__ import annotations

import math

UNUSED_WEIGHT = 0.1
REWARMED_FROM_TAG = "rewarmed_from"


def graph_weight(hits: int) -> float:
    """What one graph with ``hits`` hits in the window weighs in :func:`readiness`."""
    return max(0, hits) + UNUSED_WEIGHT


def readiness(graphs: int, hits: int, ready_graphs: int, ready_hits: int) -> float | None:
    """The hit-weighted share of ``graphs`` (with ``hits`` in all) that are ready, from sums:
    ``ready_graphs`` of them, with ``ready_hits`` hits, have a SUCCESS entry under the new
    compiler. None when there are no graphs (nothing to be ready for)."""
    if graphs <= 0:
        return None
    total = max(0, hits) + UNUSED_WEIGHT * graphs
    ready = max(0, ready_hits) + UNUSED_WEIGHT * max(0, ready_graphs)
    share = ready / total
    return min(1.0, share) if math.isfinite(share) else None
