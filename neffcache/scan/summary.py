"""The totals of a scan without its entry lists: what a plain ``neffcache scan`` prints.

:func:`~neffcache.scan.report.scan` keeps every entry and every file it listed (a
``FileInfo`` per file, an ``Entry`` per entry): over a GB at a million entries. A summary needs
counters only, so :func:`summarize` consumes the listing as a stream, judges each entry with the
scan's own code (:func:`~neffcache.scan.grouping.judge`, the layouts' ``classify``) as
soon as all its files have been seen, adds it to the per-namespace counters and drops it. Its
totals are the full report's (tests/scan/test_summary.py compares them on trees of every
layout, with garbage, foreign files, failed, locked, corrupt and uncommitted entries).

When has an entry been seen whole? It depends on how its layout spreads its files:

- **One flat directory per entry** (layout A, ``DirectoryRole.flat``): its files are
  those of its directory and nothing below it. A store lists a directory and its subtree as one
  run: the local walk is depth first and lists each directory in one listing; an object store
  lists in key order, so every key under ``dir/`` comes between the first and the last of them
  (only the directory's own subdirectories come in between); the threaded local listing
  (shared mounts) lists each directory whole, once. So once a listing of a directory outside
  the entry's subtree arrives, no more file of the entry can come, and it is judged. At most
  a few such entries are open at a time.
- **Entries whose files lie in two trees** (layout B: ``neff/ab/cd/<key>.neff`` and
  ``hlo/ab/cd/<key>.hlo``; ``Layout.spread_trees``), which a walk reaches far apart (one whole
  tree, then the other). Where the store can (a local walk), the summary's walk plan has it
  hold those trees back and list each namespace's trees afterwards *in step* (``InStep``
  batches, stores/walk.py): ``hlo/ab/cd`` and ``neff/ab/cd`` in one batch, so an entry is
  whole once the listing has left its shard (what could not be opened below the shard
  comes before that), and at most one shard's entries are open at a time. Elsewhere (object
  stores, the threaded listing of shared mounts, a bare NEFF directory) such an entry is only
  known whole at the end. Until then it is kept as a small record, not as files: its
  namespace and base (shared per shard), and per file the name with the key taken out
  (shared: a handful of forms) and the size. A fraction of the memory of its ``FileInfo``
  objects; mtimes are not kept (a summary reports no ages).
- **Entries with nested files** (vLLM-Neuron's compile cache) are kept as groups until the
  end: the threaded listing reaches their subdirectories late. A vLLM cache holds few entries
  (one per compiled model configuration), not millions.

FAILED entries are kept (the plain scan reads each one's failure log); warnings are kept up to
``max_warnings`` (the first by path, as the full report sorts them: the listing order differs)
and counted beyond. Everything else is a counter (neffcache/scan/tally.py). A question
about single entries is a sink (neffcache/scan/sinks.py), handed each judged entry and
each store count's largest; a sink that needs every entry turns the stores' counting off.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts import LAYOUTS
from neffcache.scan.grouping import Group, Grouper, Progress
from neffcache.scan.plan import SummaryPlan
from neffcache.scan.report import NamespaceSummary, ScanReport
from neffcache.scan.sinks import EntrySink, SizedEntry
from neffcache.scan.tally import KeptEntries, Tally
from neffcache.stores.base import Store
from neffcache.stores.plain import PlainEntryDirs
from neffcache.stores.walk import Counted, DirListing, InStep

MAX_WARNINGS = 1000


@dataclass(frozen=True)
class ScanSummary:
    """What a scan found, as totals: per namespace, garbage, foreign files, warnings."""

    store: str
    namespaces: tuple[NamespaceSummary, ...]
    garbage_files: int  # temp files of interrupted writes
    uncommitted_entries: int
    garbage_size: int
    foreign_files: int
    foreign_size: int
    control_files: int
    warnings: tuple[str, ...]  # the first ``max_warnings``: listing problems, then CORRUPT entries by path
    warning_count: int
    failed: tuple[Entry, ...] = ()  # the FAILED entries (their logs are worth a read)
    seconds: float = 0.0

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.namespaces)

    @property
    def size(self) -> int:
        return sum(s.size for s in self.namespaces)

    @property
    def garbage_count(self) -> int:
        return self.garbage_files + self.uncommitted_entries

    def by_state(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for s in self.namespaces:
            counts.update(s.states)
        return {s.value: counts.get(s.value, 0) for s in EntryState}

    def to_json(self) -> dict[str, object]:
        """The keys of ``ScanReport.to_json`` a summary knows: totals, without the path lists."""
        return {"store": self.store, "entries": self.entries, "size": self.size, "states": self.by_state(),
                "namespaces": [s.to_json() for s in self.namespaces],
                "garbage": {"files": self.garbage_files, "uncommitted_entries": self.uncommitted_entries,
                            "size": self.garbage_size},
                "foreign": {"files": self.foreign_files, "size": self.foreign_size},
                "warnings": list(self.warnings), "warning_count": self.warning_count,
                "seconds": round(self.seconds, 3)}

    @classmethod
    def of_report(cls, report: ScanReport, max_warnings: int = MAX_WARNINGS) -> ScanSummary:
        """The summary of a full report: what :func:`summarize` finds in the same tree."""
        return cls(report.store, tuple(report.namespaces()), len(report.garbage), len(report.uncommitted),
                   report.garbage_size, len(report.foreign), report.foreign_size, report.control_files,
                   report.warnings[:max_warnings], len(report.warnings),
                   tuple(e for e in report.entries if e.state is EntryState.FAILED), report.seconds)


def summarize(store: Store, *, prefix: str = "", progress: Progress | None = None,
              max_warnings: int = MAX_WARNINGS, sinks: Sequence[EntrySink] = ()) -> ScanSummary:
    """The totals ``scan(store, prefix=prefix)`` reports, from one pass over the store's walk
    (``Store.walk``, steered by this summary's plan) that keeps no entry list (the module
    docstring says what it keeps, and why that is exact). ``sinks`` are handed entries as they
    are judged or counted (neffcache/scan/sinks.py): a sink that needs every entry turns
    the stores' counting off."""
    started = time.monotonic()
    tally = Tally(max_warnings, sinks=tuple(sinks))
    warnings: list[str] = []
    foreign: list[FileInfo] = []
    grouper = Grouper(progress, warnings, foreign=foreign)
    kept = KeptEntries()
    open_flat: list[Group] = []  # entries of a flat directory not yet judged
    counting = COUNT_PLAIN_SHARDS and not any(sink.needs_every_entry for sink in sinks)
    largest = max((sink.largest for sink in sinks), default=0)
    plan = SummaryPlan(grouper, counting=counting, largest=largest)
    in_step: _InStep | None = None
    for item in store.walk(prefix, plan):
        if type(item) is Counted:
            _add_counted(item, grouper, tally)
        elif type(item) is InStep:
            _judge(open_flat, grouper, tally)  # the walk is over: in-step batches come last
            open_flat = []
            if in_step is None or in_step.group != item.group:
                if in_step is not None:
                    in_step.finish()
                # Not with a sink that wants each count's largest, which the Python count cannot name.
                in_step = _InStep(item.group, grouper, tally, warnings, foreign, count=counting and not largest)
            in_step.add(item.directory, item.listings)
        else:
            listing = cast(DirListing, item)
            if open_flat:
                open_flat = _judge_left(listing, open_flat, grouper, tally)
            grouper.add(listing)
            _drain(listing, grouper, tally, kept, open_flat, warnings, foreign)
    if in_step is not None:
        in_step.finish()
    _judge(open_flat, grouper, tally)
    for group in kept.groups():
        tally.group(group)
    for group in grouper.groups.values():  # entries with nested files, kept whole
        tally.group(group)
    return _result(store, tally, grouper.control, time.monotonic() - started)


# Read at call time: tests turn it off to compare the counted shards with the judged ones.
COUNT_PLAIN_SHARDS = True


def _add_counted(item: Counted, grouper: Grouper, tally: Tally) -> None:
    """A store's count into the tally, its largest entries to the sinks."""
    namespace = item.rule.namespace
    if namespace is None:
        raise ValueError("a rule of the summary's names its namespace")
    if item.entries:
        tally.plain(namespace, item.entries, item.size)
    entry_dir = isinstance(item.rule, PlainEntryDirs)
    for directory, key, nbytes, nfiles in item.top:
        path = grouper.counted_path(directory, key, entry_dir)
        if path is None:  # the rule's checks exclude it: a count only covers what grouping places
            raise ValueError(f"a store counted {directory}/{key}, which no layout places")
        tally.counted_entry(SizedEntry(path, nbytes, nfiles, EntryState.SUCCESS, namespace))
    grouper.counted(item.files)


class _InStep:
    """Counts the entries of one group's spread trees listed in step (``InStep`` batches):
    each entry once the batches have left the relative directory whose batch made it. The
    batches come depth first, so the open ones form a path from the root: a stack.

    A shard whose entries are all plain SUCCESS entries (:meth:`Grouper.count_plain`, nearly
    every shard of a warm cache where the store did not count it itself) is counted without
    building its entries. Only once the walk has left it, as a judged shard: a batch below it
    (a subdirectory that could not be opened may be named like one of its files, and make
    that entry CORRUPT) turns it back into groups first, so it is judged as any other shard.
    Not with ``count`` off."""

    def __init__(self, group: str, grouper: Grouper, tally: Tally, warnings: list[str], foreign: list[FileInfo],
                 *, count: bool = True) -> None:
        self.group = group
        self._grouper, self._tally, self._warnings, self._foreign = grouper, tally, warnings, foreign
        self._count = count
        self._opened: list[tuple[str, list[Group]]] = []  # (relative directory, the groups its batch made)
        self._counted: tuple[str, list[DirListing], tuple[Namespace, int, int]] | None = None  # not yet left

    def add(self, rel: str, batch: list[DirListing]) -> None:
        grouper, tally, opened = self._grouper, self._tally, self._opened
        if self._counted is not None:
            counted_rel, counted_batch, totals = self._counted
            self._counted = None
            if rel.startswith(counted_rel + "/"):
                _group_batch(counted_rel, counted_batch, grouper, opened)
            else:
                tally.plain(*totals)
        while opened:
            made_in = opened[-1][0]
            if made_in and rel != made_in and not rel.startswith(made_in + "/"):
                _judge(opened.pop()[1], grouper, tally)
            else:
                break
        plain = grouper.count_plain(batch) if self._count and rel else None
        if plain is not None:
            self._counted = (rel, batch, plain)
            return
        _group_batch(rel, batch, grouper, opened)
        _drain_counters(grouper, tally, self._warnings, self._foreign)

    def finish(self) -> None:
        if self._counted is not None:
            self._tally.plain(*self._counted[2])
            self._counted = None
        for _, made in self._opened:
            _judge(made, self._grouper, self._tally)
        self._opened = []


def _group_batch(rel: str, batch: list[DirListing], grouper: Grouper, opened: list[tuple[str, list[Group]]]) -> None:
    """Group a batch's listings; the groups it made are open until the walk leaves ``rel``."""
    for listing in batch:
        grouper.add(listing)
        grouper.entry_dirs.pop(listing.directory, None)
    if grouper.created:
        opened.append((rel, grouper.created))
        grouper.created = []


def _judge(groups: Iterable[Group], grouper: Grouper, tally: Tally) -> None:
    """Judge ``groups`` (each one's files all seen) into the tally, out of the grouper."""
    for group in groups:
        tally.group(grouper.groups.pop(group.located.path))


def _judge_left(listing: DirListing, open_flat: list[Group], grouper: Grouper, tally: Tally) -> list[Group]:
    """Judge the open flat-directory entries the listing has left (it is outside their tree)."""
    directory = listing.directory
    still = []
    for group in open_flat:
        base = group.located.base
        if directory == base or directory.startswith(base + "/"):
            still.append(group)
        else:
            tally.group(grouper.groups.pop(group.located.path))
    return still


def _drain(listing: DirListing, grouper: Grouper, tally: Tally, kept: KeptEntries, open_flat: list[Group],
           warnings: list[str], foreign: list[FileInfo]) -> None:
    """Move what the last listing added out of the grouper: counters, open or kept entries."""
    grouper.entry_dirs.pop(listing.directory, None)  # a lookup saved only when a directory comes again
    for group in grouper.created:
        lay = LAYOUTS[group.located.namespace.layout]
        if group.flat:
            open_flat.append(group)
        elif not lay.entry_is_dir:
            kept.add(grouper.groups.pop(group.located.path))
    grouper.created.clear()
    _drain_counters(grouper, tally, warnings, foreign)


def _drain_counters(grouper: Grouper, tally: Tally, warnings: list[str], foreign: list[FileInfo]) -> None:
    """Move the grouper's garbage, foreign files and warnings into the counters (not its runtime temp files)."""
    if grouper.garbage:
        tally.garbage(grouper.garbage)
        grouper.garbage.clear()
    grouper.runtime_temp.clear()
    if foreign:
        tally.foreign(foreign)
        foreign.clear()
    for text in warnings:
        tally.warn(text)
    warnings.clear()


def _result(store: Store, tally: Tally, control: int, seconds: float) -> ScanSummary:
    namespaces = tuple(NamespaceSummary(ns, counts[0], counts[1], dict(states))
                       for ns, (counts, states) in sorted(tally.namespaces.items(),
                                                          key=lambda kv: (kv[0].layout, kv[0].path)))
    corrupt = [text for _, text in sorted(tally.corrupt_warnings)]
    shown = (sorted(tally.listing_warnings)[:tally.max_warnings] + corrupt)[:tally.max_warnings]
    return ScanSummary(store.url, namespaces, tally.garbage_files, tally.uncommitted, tally.garbage_size,
                       tally.foreign_files, tally.foreign_size, control, tuple(shown), tally.warning_count,
                       tuple(sorted(tally.failed, key=lambda e: e.path)), seconds)
