"""What a streaming summary keeps while it lists (neffcache/scan/summary.py): the
counters (:class:`Tally`) and the entries known whole only at the end (:class:`KeptEntries`).
The summary's module docstring says why these are exact."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts import Located
from neffcache.scan.grouping import Group, judge
from neffcache.scan.sinks import EntrySink, SizedEntry, sized

_KEY = "\0"  # stands for the entry's key in a kept name: no file name holds a NUL
_SUCCESS = EntryState.SUCCESS.value  # an enum member's value is a property: looked up once


@dataclass
class Tally:
    """The counters a summary keeps."""

    max_warnings: int
    # One lookup per entry: [entries, size, Counter of states]
    namespaces: dict[Namespace, tuple[list[int], Counter[str]]] = field(default_factory=dict)
    garbage_files: int = 0
    garbage_size: int = 0
    uncommitted: int = 0
    foreign_files: int = 0
    foreign_size: int = 0
    listing_warnings: list[str] = field(default_factory=list)
    corrupt_warnings: list[tuple[str, str]] = field(default_factory=list)
    warning_count: int = 0
    failed: list[Entry] = field(default_factory=list)
    sinks: tuple[EntrySink, ...] = ()  # handed every committed entry judged here (sinks.py)

    def warn(self, text: str) -> None:
        self.warning_count += 1
        kept = self.listing_warnings
        kept.append(text)
        if len(kept) > 2 * self.max_warnings:  # keep the first by path, in amortised O(1)
            kept.sort()
            del kept[self.max_warnings:]

    def foreign(self, files: list[FileInfo]) -> None:
        self.foreign_files += len(files)
        self.foreign_size += sum(f.size for f in files)

    def garbage(self, files: list[FileInfo]) -> None:
        self.garbage_files += len(files)
        self.garbage_size += sum(f.size for f in files)

    def _counters(self, ns: Namespace) -> tuple[list[int], Counter[str]]:
        """``ns``'s [entries, size] and its Counter of states, made on first use."""
        found = self.namespaces.get(ns)
        if found is None:
            found = self.namespaces[ns] = ([0, 0], Counter())
        return found

    def plain(self, ns: Namespace, entries: int, size: int) -> None:
        """``entries`` committed SUCCESS entries of ``ns``, ``size`` bytes in all."""
        counts, states = self._counters(ns)
        counts[0] += entries
        counts[1] += size
        states[_SUCCESS] += entries

    def counted_entry(self, entry: SizedEntry) -> None:
        """One of the largest entries of a count, for the sinks (its totals came in :meth:`plain`)."""
        for sink in self.sinks:
            sink.add(entry)

    def group(self, group: Group) -> None:
        entry, theirs = judge(group)
        if theirs:
            self.foreign(theirs)
        if entry is None:
            return
        size = entry.size
        if not entry.committed:
            self.uncommitted += 1
            self.garbage_size += size
            return
        counts, states = self._counters(entry.namespace)
        counts[0] += 1
        counts[1] += size
        state = entry.state
        states[state.value] += 1
        if self.sinks:
            seen = sized(entry)
            for sink in self.sinks:
                sink.add(seen)
        if state is EntryState.CORRUPT:
            self.warning_count += 1
            if len(self.corrupt_warnings) < self.max_warnings:
                self.corrupt_warnings.append((entry.path, f"{entry.path}: {'; '.join(entry.problems)}"))
        elif state is EntryState.FAILED:
            self.failed.append(entry)


class KeptEntries:
    """Entries known whole only at the end of the listing (layout B), as small records."""

    def __init__(self) -> None:
        self.forms: dict[str, str] = {}  # one copy of each name form (a name with the key taken out)
        self.where: dict[str, tuple[Namespace, str]] = {}  # path form -> (namespace, base)
        self.records: dict[str, dict[str, tuple[str | int, ...]]] = {}  # path form -> key -> (form, size)*
        self.problems: dict[str, list[str]] = {}  # entry path -> problems (rare)

    def _form(self, text: str, key: str) -> str:
        form = text.replace(key, _KEY)
        return self.forms.setdefault(form, form)

    def add(self, group: Group) -> None:
        loc = group.located
        path_form = self._form(loc.path, loc.key)
        if path_form not in self.where:
            self.where[path_form] = (loc.namespace, loc.base)
        kept = self.records.setdefault(path_form, {})
        record = list(kept.get(loc.key, ()))
        for name, info in group.files.items():
            record += (self._form(name, loc.key), info.size)
        kept[loc.key] = tuple(record)
        if group.problems:
            self.problems.setdefault(loc.path, []).extend(group.problems)

    def groups(self) -> list[Group]:
        """Every kept entry as a group again, and forget them."""
        out = []
        for path_form, kept in self.records.items():
            namespace, base = self.where[path_form]
            for key, record in kept.items():
                path = path_form.replace(_KEY, key)
                group = Group(Located(namespace, key, path, base, ""))
                for i in range(0, len(record), 2):
                    name = str(record[i]).replace(_KEY, key)
                    group.files[name] = FileInfo(f"{base}/{name}" if base else name, int(record[i + 1]), 0.0)
                group.problems = self.problems.get(path, [])
                out.append(group)
        self.records.clear()
        return out
