"""Routing listed files to entries: the part of a scan between the listing and the layouts.

Every listed file ends up in exactly one place: an entry's group (the files a layout locates
in it), ``garbage`` (neffcache's temp names), a count of control files (``.neffcache/``),
a runtime's own file outside any entry (layout A's root ``lock``; ``runtime_temp`` when a dead
writer may leave it behind: TorchNeuron's temp files), or ``foreign``.
A listing's problems (a symlink not followed, an unreadable directory) go to the entry they
lie in, which is then CORRUPT, or to the warnings.

:class:`Grouper` takes one listing at a time, so a caller may also take finished groups out
as it goes (:mod:`neffcache.scan.summary` does, to keep its memory bounded);
:func:`group_dirs` feeds it a whole listing (``scan``). :func:`judge` turns a group into an
entry, the same way for both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from neffcache.entry import Entry, EntryState, FileInfo, Namespace
from neffcache.layouts import LAYOUTS, Located, locate
from neffcache.layouts.base import Layout
from neffcache.layouts.records import ShardDir
from neffcache.manifest import Manifest
from neffcache.stores.base import CONTROL_DIR, TEMP_MARKER
from neffcache.stores.plain import PlainEntryDirs, PlainFiles
from neffcache.stores.walk import DirListing

Progress = Callable[[int], None]
CONTROL_PREFIX = CONTROL_DIR + "/"


class Group:
    """The files (by name relative to the entry's base) and problems found for one entry.

    A plain class with slots, not a dataclass: a scan makes one per entry."""

    __slots__ = ("files", "flat", "located", "problems")

    def __init__(self, located: Located, flat: bool = False) -> None:
        self.located = located
        # The layout's role for the entry's directory said flat (DirectoryRole.flat): its files
        # are exactly those directly in it. False when no role said so: kept whole until the end.
        self.flat = flat
        self.files: dict[str, FileInfo] = {}
        self.problems: list[str] = []  # what the listing would not follow or read


class Grouper:
    """Assigns listings to entry groups, one listing at a time (:meth:`add`).

    ``groups`` (by entry path), ``garbage``, ``unclaimed`` (foreign files), ``runtime_temp`` (a
    runtime's temp files) and ``control`` grow as listings come; ``created`` lists every group
    made since the caller last cleared it.
    """

    def __init__(self, progress: Progress | None = None, warnings: list[str] | None = None, *,
                 foreign: list[FileInfo] | None = None) -> None:
        self.groups: dict[str, Group] = {}
        self.garbage: list[FileInfo] = []
        self.unclaimed: list[FileInfo] = foreign if foreign is not None else []
        self.runtime_temp: list[FileInfo] = []
        self.warnings = warnings
        self.control = 0
        self.created: list[Group] = []
        self._progress = progress
        self._count = 0
        self._layouts = list(LAYOUTS.values())
        # Each directory is resolved once, not each file (400k regex matches for 100k entries):
        # each layout asked its role, with a namespace cache of its own (layouts key theirs by
        # paths alike); those whose entries are directories first, as the first entry ends the
        # asking. A directory may come in several listings: ``entry_dirs`` remembers its group.
        ordered = sorted(self._layouts, key=lambda lay: not lay.entry_is_dir)
        self._asking = [(lay, lay.directory_role, dict[str, Namespace | None]()) for lay in ordered]
        self.entry_dirs: dict[str, Group | None] = {}

    def add(self, listing: DirListing) -> None:
        directory, names, files, problems = listing
        if problems:
            self._place_problems(directory, problems)
        self.counted(len(files))
        in_control = _in_control(directory)
        # Names hold no "/": a marker found in the joined names lies within one name.
        if TEMP_MARKER in "/".join(names):
            kept_names, kept_files = _without_temp_files(names, files, self.garbage)
            if not in_control:
                names, files = kept_names, kept_files
        if in_control:
            self.control += len(files)  # temp files there too: they are control files and garbage
            return
        if not files:
            return  # no group for a directory of temp files only
        entry_dirs = self.entry_dirs
        if directory in entry_dirs:
            group = entry_dirs[directory]
            resolved = None if group is not None else self._resolve(directory)[2]
        else:
            entry, flat, resolved = self._resolve(directory)
            # A listing's problem may have made the entry's group already.
            group = entry_dirs[directory] = None if entry is None else self._group(entry, flat)
        if group is not None:
            group.files.update(zip(names, files, strict=True))
            return
        if resolved is not None:
            self._group_shard(resolved[1], names, files)
            return
        self._group_each_file(files)

    def _resolve(self, directory: str) -> tuple[Located | None, bool, tuple[Layout, ShardDir] | None]:
        """What ``directory`` is to this grouping, each layout asked its role once: the entry
        whose directory it is in the first layout with one (and whether that role says flat),
        else the first layout that resolves it as a shard directory, and its answer."""
        shard = None
        for lay, role_of, namespaces in self._asking:
            role = role_of(directory, namespaces)
            if role is None:
                continue
            if role.entry is not None:
                return role.entry, role.flat, None
            if shard is None and role.shard is not None:
                shard = (lay, role.shard)
        return None, False, shard

    def count_plain(self, batch: list[DirListing]) -> tuple[Namespace, int, int] | None:
        """(namespace, entries, bytes) of the entries of ``batch`` (one shard path's listings in
        each spread tree, an ``InStep`` batch: stores/walk.py) when its layout says they are all plain
        SUCCESS entries (:meth:`Layout.plain_entries`): counted, not grouped. None (nothing
        done; :meth:`add` each listing) when a listing has a problem or a temp file, is not a
        shard directory of one namespace, or :meth:`add` would place it otherwise (an entry's
        directory, the control directory).

        No group can exist yet for an entry of these shards: only a file or a problem named
        ``<shard directory>/<key><suffix>`` locates to one, and those come in this directory's
        own listing (here) or, for a subdirectory that could not be opened, in the batch
        below it, which summary.py's in-step judging (``_InStep``) waits for before it counts."""
        shards: list[tuple[ShardDir, list[str], list[FileInfo]]] = []
        lay: Layout | None = None
        files_seen = 0
        for directory, names, files, problems in batch:
            if problems or TEMP_MARKER in "/".join(names):
                return None
            if not files:
                continue
            if _in_control(directory) or directory in self.entry_dirs:
                return None
            entry, _, resolved = self._resolve(directory)
            if entry is not None or resolved is None:
                return None
            candidate, shard = resolved
            if (lay is not None and candidate is not lay) or (shards and shards[0][0].namespace != shard.namespace):
                return None
            lay = candidate
            shards.append((shard, names, files))
            files_seen += len(files)
        if lay is None:
            return None
        counted = lay.plain_entries(shards)
        if counted is None:
            return None
        self.counted(files_seen)
        return shards[0][0].namespace, counted[0], counted[1]

    def plain_rule(self, directories: Sequence[str]) -> PlainFiles | None:
        """A rule for counting the children of ``directories`` (one level of a layout's spread
        trees, listed in step) without listing them (``WalkPlan.shards_below``):
        what :meth:`count_plain` would decide of each child's batch. The layout vouches for
        its own part (:attr:`DirectoryRole.shards_below` of each directory, merged by
        :func:`merged_shards_below`); what :meth:`count_plain` asks besides is answered here
        for every child at once, from one child named like them (``00``):

        - ``_in_control`` looks at the parents only (a child of two hex digits is not ``.neffcache``);
        - ``_resolve``: every layout's role answers every child named by two lowercase hex
          digits as it answers ``00``, an entry's directory or not, a shard or not
          (tests/stores/test_count_plain.py holds the rule to each of these questions, child
          by child): none may be an entry's, and the first layout resolving one as a shard
          must be the rule's layout;
        - ``entry_dirs``: no child of a spread tree is in it, since the walk left those trees
          out and ``summary._group_batch`` forgets each directory it adds.

        A child whose listing has a problem, a temp file or anything :meth:`count_plain`
        declines is declined by the rule too (stores/plain.PlainFiles)."""
        probes = [f"{directory}/00" for directory in directories]
        if not probes or any(_in_control(p) for p in probes):
            return None
        resolved = [self._resolve(p) for p in probes]
        if any(entry is not None for entry, _, _ in resolved):
            return None
        for lay, role_of, namespaces in self._asking:
            roles = [role_of(directory, namespaces) for directory in directories]
            rule = merged_shards_below([None if role is None else role.shards_below for role in roles])
            if rule is None:
                continue
            if any(TEMP_MARKER in suffix for suffix in rule.suffixes):
                return None  # count_plain's temp-name check: such names must not count
            return rule if all(shard is not None and shard[0] is lay for _, _, shard in resolved) else None
        return None

    def entry_rule(self, directory: str) -> PlainEntryDirs | None:
        """A rule for counting the entry directories below ``directory`` without listing them
        (``WalkPlan.entries_below``): what :meth:`add` and :func:`judge` would make of each child it
        covers, decided once. The layout vouches for its part (:attr:`DirectoryRole.entries_below`:
        each covered child an entry of the rule's namespace, judged SUCCESS when its files pass);
        what :meth:`add` asks besides:

        - ``_in_control``: the child of a directory outside ``.neffcache`` is outside it (a
          covered child is not named ``.neffcache``);
        - ``entry_dirs``: a walk lists each directory once, so a child not yet listed is not in it;
        - ``_resolve``: the first layout to find an entry in a covered child must be the rule's,
          with the rule's namespace; checked on one child (``<prefix>0``), since every layout's
          role answers every covered name alike (tests/layouts/test_plain_entry_dirs.py);
        - a group made for the entry before its listing (a problem of its parent's placed in it)
          comes only with a child that cannot be opened, which the walk lists instead.

        A child with a temp file, a link or a subdirectory is not counted (PlainEntryDirs)."""
        if _in_control(directory):
            return None
        for _, role_of, namespaces in self._asking:
            role = role_of(directory, namespaces)
            rule = None if role is None else role.entries_below
            if rule is None:
                continue
            # A covered child could be named like our temp directories only if the marker's every
            # character were in the charset; a file named like our temp files is not in names.
            if all(c in rule.charset for c in TEMP_MARKER) or any(TEMP_MARKER in name for name in rule.names):
                return None
            probe = f"{directory}/{rule.prefix}0" if directory else f"{rule.prefix}0"
            found = self._resolve(probe)[0]
            return rule if found is not None and found.namespace == rule.namespace else None
        return None

    def counted_path(self, directory: str, key: str, entry_dir: bool) -> str | None:
        """The path of an entry a store counted (``Counted.top``, stores/walk.py): the entry
        whose directory is ``directory`` (an entry-directory rule), or the entry keyed ``key``
        in the shard ``directory`` (a plain-files rule: the key as the store grouped the names,
        before the layout's ``key_prefix``). None where this grouping would not place it, which
        the rules that let a store count exclude."""
        found, _, resolved = self._resolve(directory)
        if entry_dir:
            return None if found is None else found.path
        return None if resolved is None else resolved[1].entry_dir + resolved[1].key_prefix + key

    def counted(self, files: int) -> None:
        """Report progress for ``files`` more files listed."""
        if self._progress is not None:
            before, self._count = self._count, self._count + files
            if self._count // 5000 != before // 5000:
                self._progress(self._count)

    def _group_shard(self, shard: ShardDir, names: list[str], files: list[FileInfo]) -> None:
        """Place the files of a shard directory: by key when the name is a plain one, by
        ``locate`` of the whole path otherwise (what a file-by-file placement would do)."""
        groups, key_of, entry_dir, name_dir = self.groups, shard.key_of, shard.entry_dir, shard.name_dir
        odd: list[FileInfo] = []
        for name, info in zip(names, files, strict=True):
            key = key_of(name)
            if key is None:
                odd.append(info)
                continue
            path = entry_dir + key
            group = groups.get(path)
            if group is None:
                group = groups[path] = Group(Located(shard.namespace, key, path, shard.base, name_dir + name))
                self.created.append(group)
            group.files[name_dir + name] = info
        if odd:
            self._group_each_file(odd)

    def _group(self, found: Located, flat: bool = False) -> Group:
        group = self.groups.get(found.path)
        if group is None:
            group = self.groups[found.path] = Group(found, flat)
            self.created.append(group)
        return group

    def _group_each_file(self, files: list[FileInfo]) -> None:
        """Place files one by one (layouts whose entries are files, or a directory no layout knows)."""
        for info in files:
            located = locate(info.path)
            if located is None:
                # Not an entry's, not a temp name of ours: a runtime's own, another tool's or
                # unknown. Kept; a runtime's temp file is reported, so an old one can be swept.
                runtime = [lay for lay in self._layouts if lay.is_runtime_file(info.path)]
                if not runtime:
                    self.unclaimed.append(info)
                elif any(lay.runtime_debris_after(info.path) is not None for lay in runtime):
                    self.runtime_temp.append(info)
                continue
            self._group(located).files[located.name] = info

    def _place_problems(self, directory: str, problems: tuple[tuple[str, str], ...]) -> None:
        in_entry, in_flat, _ = self._resolve(directory)
        for name, reason in problems:
            path = f"{directory}/{name}" if directory else name
            # In an entry's directory, or the entry's directory itself, or (layout B) a file's entry.
            found, flat = in_entry, in_flat
            if found is None:
                found, flat, _ = self._resolve(path)
            if found is None:
                found = locate(path)
            if found is None:
                if self.warnings is not None:
                    self.warnings.append(f"{path}: {reason}")
                continue
            self._group(found, flat).problems.append(f"{path}: {reason}")


def group_dirs(listings: Iterable[DirListing], progress: Progress | None = None,
               warnings: list[str] | None = None, *, foreign: list[FileInfo] | None = None,
               runtime_temp: list[FileInfo] | None = None) -> tuple[dict[str, Group], list[FileInfo], int]:
    """Assign listings by directory (``Store.iter_dirs``) to entries; return (groups by entry
    path, garbage, control-file count). Files no layout claims are appended to ``foreign``, a
    runtime's temp files to ``runtime_temp``.

    A listing's problems (a symlink not followed, an unreadable directory) make the entry they
    lie in CORRUPT with the reason; one outside any entry is added to ``warnings``."""
    grouper = Grouper(progress, warnings, foreign=foreign)
    add = grouper.add
    for listing in listings:
        add(listing)
    if runtime_temp is not None:
        runtime_temp.extend(grouper.runtime_temp)
    return grouper.groups, grouper.garbage, grouper.control


def group_files(files: Iterable[FileInfo], progress: Progress | None = None, *,
                foreign: list[FileInfo] | None = None) -> tuple[dict[str, Group], list[FileInfo], int]:
    """:func:`group_dirs` for files one by one."""
    listings = (DirListing(head, [name], [info])
                for info in files for head, _, name in (info.path.rpartition("/"),))
    return group_dirs(listings, progress, foreign=foreign)


def merged_shards_below(rules: Sequence[PlainFiles | None]) -> PlainFiles | None:
    """One level's rule from each tree's (:attr:`DirectoryRole.shards_below` of the level's
    directory in each spread tree that has it, in order), or None: every tree's must be there
    and agree on everything but ``primary_dirs``, which is the union of theirs.

    It gives what the layout's rule for the whole level (``plain_files_below``, before issue
    39) gave. That rule asked each directory ``d`` for the shard ``<d>/00``, and each tree's
    rule here is made from that shard alone. It declined when one was missing (here: a None)
    or when they differed in namespace, suffixes or shard: the shard is the rule's prefix and
    ``00``, so here that is disagreeing on namespace, suffixes or prefix; the fields left
    (children, primary, key lengths) are the layout's constants, equal in every rule. It made
    the first shard's rule, with ``primary_dirs`` the directories whose shard holds primary
    files: each tree's rule names its own directory there exactly when its shard does."""
    first = rules[0] if rules else None
    if first is None or any(rule is None or rule._replace(primary_dirs=first.primary_dirs) != first for rule in rules):
        return None
    return first._replace(primary_dirs=frozenset().union(*(rule.primary_dirs for rule in rules if rule)))


def _in_control(directory: str) -> bool:
    """Whether ``directory`` is neffcache's control directory or lies below it."""
    return directory == CONTROL_DIR or directory.startswith(CONTROL_PREFIX)


def _without_temp_files(names: list[str], files: list[FileInfo],
                        garbage: list[FileInfo]) -> tuple[list[str], list[FileInfo]]:
    """A listing's names and files without our temp files, which go to ``garbage``."""
    kept_names: list[str] = []
    kept_files: list[FileInfo] = []
    for name, info in zip(names, files, strict=True):
        if TEMP_MARKER in name:
            garbage.append(info)
        else:
            kept_names.append(name)
            kept_files.append(info)
    return kept_names, kept_files


def own_files(lay: Layout, entry: Entry) -> tuple[Entry | None, list[FileInfo]]:
    """The entry without the files in its directory that are not its (another tool's), and
    those files; None when none of its files is the runtime's or neffcache's (a directory that
    only looks like an entry: optimum-neuron's traced model, say). Files nested below an entry
    never reach an entry (no layout locates them): they are foreign too."""
    names = lay.foreign_names(entry)
    if not names:
        return entry, []
    foreign = [entry.files[n] for n in names if n in entry.files]
    # A set: a tuple's membership test made this quadratic in the foreign files of one
    # directory (80,000 of them took minutes); linear now, whatever a co-tenant drops there.
    alien = set(names)
    files = {n: info for n, info in entry.files.items() if n not in alien}
    if not files:
        return None, foreign
    return dataclasses.replace(entry, files=files, extra=()), foreign


def judge(group: Group, manifest: Manifest | None = None, error: str | None = None
          ) -> tuple[Entry | None, list[FileInfo]]:
    """The entry a group makes (None: not an entry, its files are another tool's) and the
    foreign files in its directory. The listing's problems make it CORRUPT."""
    lay = LAYOUTS[group.located.namespace.layout]
    entry = lay.classify(group.located, group.files, manifest, error)
    if group.problems:
        entry = dataclasses.replace(entry, state=EntryState.CORRUPT, committed=True,
                                    problems=(*entry.problems, *group.problems))
    return own_files(lay, entry)
