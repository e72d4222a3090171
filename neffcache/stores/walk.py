"""What a store's walk is told and what it tells back: :meth:`Store.walk`'s plan and items.

A scan's fast path is a conversation between two parts that must not know each other's
facts: the scan knows the runtimes (which directories hold entries, which trees belong
together, what counting may stand for), the store knows how to list. The scan writes what it
knows into a :class:`WalkPlan`; the store applies it, and everything it found comes back in
one stream of items, in band:

- a :class:`DirListing` per listed directory (what ``iter_dirs`` yields);
- a :class:`Counted` where the store counted a directory's children by a rule of the plan's
  instead of listing them (their totals and their ``largest`` largest entries);
- an :class:`InStep` batch per relative directory of sibling trees the walk held back and
  then listed in step (``held``: layout B's ``hlo/`` and ``neff/``, the same shard path in
  each), so a scan knows an entry whole once its shard has been listed.

A store need not take any of it: an object store lists keys, not trees, and yields listings
only (:meth:`Store.walk`'s default); the scan's answer is the same either way
(tests/scan/test_summary.py compares them). Values and a protocol only: no store imports
a layout, and the store calls nothing of the plan's from C (neffcache/stores/_listdir.c is
steered between two steps, in band too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from neffcache.entry import FileInfo
from neffcache.stores.plain import CountedTop, PlainEntryDirs, PlainFiles


class DirListing(NamedTuple):
    """Files of one directory, as :meth:`Store.iter_dirs` yields them.

    ``files[i].path`` is ``directory/names[i]`` (``names[i]`` at the root, where ``directory``
    is ""): a scan resolves the directory once and keys the files by name without splitting
    every path again.

    ``problems`` are (name, reason) pairs of what the listing found in the directory and did
    not follow, could not read or would not open: a symlink out of the root, a dangling one, a
    symlinked directory, an unreadable subdirectory, a FIFO, a socket or a device (a reader
    that opens one may wait for ever). A scan reports each against the entry it lies in
    (which is then CORRUPT) instead of stopping. Object stores have none.
    """

    directory: str
    names: list[str]
    files: list[FileInfo]
    problems: tuple[tuple[str, str], ...] = ()


class WalkPlan(Protocol):
    """What a scan tells a store's walk (the module docstring).

    ``held``: names of subdirectories the walk asks :meth:`in_step_group` about before it
    enters one (the names keep that question off the hot path: a walk of a million entry
    directories asks it only about the few so named). ``largest``: how many of each count's
    largest entries to report (0 to 10,000; 0 asks for none and costs nothing)."""

    held: frozenset[str]
    largest: int

    def in_step_group(self, directory: str) -> str | None:
        """The group of sibling trees ``directory`` is one of (a namespace directory), to be
        listed in step with the others of its group after the walk; None: walk it as usual."""
        ...

    def entries_below(self, directory: str) -> PlainEntryDirs | None:
        """A rule by which the walk may count ``directory``'s entry subdirectories instead of
        listing them, or None."""
        ...

    def shards_below(self, directories: Sequence[str]) -> PlainFiles | None:
        """A rule by which an in-step listing may count the children of one level
        (``directories``: its store path in each tree that has it) instead of listing them, or None."""
        ...


class Counted(NamedTuple):
    """Entries a store counted by ``rule`` instead of listing them: ``entries`` entries of
    ``size`` bytes in ``files`` files, and the ``largest`` of them (``top``:
    (directory, key, bytes, files), bytes descending, then directory, then key: the same tree
    gives the same ``top``). For a :class:`PlainFiles` count, ``directory`` is the counted
    child's store path in the first tree of ``primary_dirs`` that holds the entry's primary
    file and ``key`` the file names' part before the first dot (without a layout's key
    prefix); for a :class:`PlainEntryDirs` count, ``directory`` is the entry directory's store
    path and ``key`` its name. A count stands for listings that would have said nothing else:
    every counted entry is a committed SUCCESS entry of the rule's namespace."""

    rule: PlainFiles | PlainEntryDirs
    entries: int
    size: int
    files: int
    top: CountedTop


class InStep(NamedTuple):
    """Every listing of the relative directory ``directory`` (``ab/cd``) in each of the sibling
    trees of ``group`` (its namespace directory), listed in step. What could not be opened
    below ``directory`` comes in a batch of its own below it, so once a batch outside a
    relative directory comes, nothing more of it will. The groups come one after another."""

    group: str
    directory: str
    listings: list[DirListing]


WalkItem = DirListing | Counted | InStep
