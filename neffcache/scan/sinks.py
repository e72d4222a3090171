"""What a streaming scan hands each entry to besides its totals: the scan's **sinks**.

:func:`~neffcache.scan.summary.summarize` keeps only totals, and where a store can count
plain entries itself (the C listing helper: stores/plain.py) most entries never become Python
objects at all. A question about single entries ("the 10 largest") therefore has two sources:

- the entries the summary judges in Python (every entry on an object store, or without the C
  helper; on a local disk the few a count declines: failed, corrupt, odd names), each handed to
  the sink as a :class:`SizedEntry`;
- the entries a store counted: a count reports, besides its totals, its ``largest`` largest
  entries (``WalkPlan.largest``, ``Counted.top``: stores/walk.py), which reach the sink as SizedEntries too.

A sink that is answered by the largest entries of each count (:class:`Largest`) runs at the
plain scan's speed; it is exact because the n largest of a whole tree are among the n largest of
the part each count covered, and every entry is either judged or covered by exactly one count.
A sink whose answer needs every entry says so (``needs_every_entry``) and the summary then
turns counting off: every entry is judged in Python, at the full report's speed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol

from neffcache.entry import Entry, EntryState, Namespace

# A bound on what one count reports (the C helper's own cap): --largest beyond it is refused.
MAX_LARGEST = 10_000


class SizedEntry(NamedTuple):
    """One committed entry as a sink sees it: no file list, no manifest."""

    path: str
    size: int
    files: int
    state: EntryState
    namespace: Namespace


def sized(entry: Entry) -> SizedEntry:
    """``entry`` as a sink sees it."""
    return SizedEntry(entry.path, entry.size, len(entry.files), entry.state, entry.namespace)


class EntrySink(Protocol):
    """Something a streaming scan hands entries to (the module docstring says which)."""

    # How many of each count's largest entries this sink needs (0: none).
    largest: int
    # True: counted entries would be missed, so the summary lists and judges every entry.
    needs_every_entry: bool

    def add(self, entry: SizedEntry) -> None: ...


def _order(entry: SizedEntry) -> tuple[int, str]:
    """Largest first, then by path: a total order, so equal sizes come out the same every run."""
    return -entry.size, entry.path


class Largest:
    """The ``n`` largest committed entries of a scan (``neffcache scan --largest N``).

    Keeps at most ``2n`` entries: past that it sorts and drops all but the first ``n``, so each
    entry costs amortised O(log n) and memory stays bounded whatever the tree's size."""

    needs_every_entry = False

    def __init__(self, n: int) -> None:
        if not 0 < n <= MAX_LARGEST:
            raise ValueError(f"the number of largest entries must be 1 to {MAX_LARGEST}, not {n}")
        self.largest = n  # also what it asks of each count: its n largest
        self._kept: list[SizedEntry] = []

    def add(self, entry: SizedEntry) -> None:
        kept = self._kept
        kept.append(entry)
        if len(kept) >= 2 * self.largest:
            kept.sort(key=_order)
            del kept[self.largest:]

    def add_all(self, entries: Iterable[SizedEntry]) -> None:
        for entry in entries:
            self.add(entry)

    def entries(self) -> list[SizedEntry]:
        """The ``n`` largest (fewer when the scan found fewer), largest first, ties by path."""
        kept = sorted(self._kept, key=_order)
        del kept[self.largest:]
        return kept
