"""The kinds of cache event the library reports to the index, and the index server counts.

One enum for both sides: the client (:mod:`neffcache.index.records`) checks an event's kind
with it and the server (``server/services/records.py``) validates and counts with it, so a kind
added on one side and not the other cannot happen. Members are StrEnums whose values are the
wire strings (``EventKind.HIT == "hit"``, ``json.dumps`` writes ``"hit"``, the drivers bind
``'hit'``), so the JSON the client sends, the rows the server stores and its metrics' labels
are the strings they were before the enum existed.

A value module: no I/O, imports nothing of neffcache, so every layer and the server may name a kind.
"""

from __future__ import annotations

import enum


class EventKind(enum.StrEnum):
    """What happened to one entry (or a lookup that named none) in a job, a warm-up or a prune."""

    HIT = "hit"  # looked up and found: the compile it saved is counted
    MISS = "miss"  # looked up and not found: a compile follows or the job stopped
    COMPILE = "compile"  # compiled (after a miss), with the seconds it took
    EVICT = "evict"  # removed from a store (prune, verify --fix's quarantine)
    ERROR = "error"  # a compile failed or an entry was found corrupt
