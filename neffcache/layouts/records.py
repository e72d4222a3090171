"""The values layouts hand out: where a listed file belongs, the names and paths of an entry a
writer makes, what a log line or failure record says, what defeats a runtime's cache.

Kept apart from :mod:`neffcache.layouts.base` (the questions a layout answers) because they are
plain data: every layout builds them and the rest of the library reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from neffcache.entry import Namespace
from neffcache.instances import TARGETS
from neffcache.stores.plain import PlainEntryDirs, PlainFiles

# neffcache's namespace directory above a runtime's own versioned directory.
TARGET_DIR_RE = r"(?:(?P<tdir>(?:" + "|".join(TARGETS) + r")-lnc(?P<lnc>[12]))/)?"


def parse_target_dir(match: re.Match[str]) -> tuple[str | None, int | None]:
    tdir = match.group("tdir")
    if not tdir:
        return None, None
    return tdir.split("-lnc")[0], int(match.group("lnc"))


class Located(NamedTuple):
    """Where one listed file belongs: which entry, under which name.

    A NamedTuple, not a dataclass: a scan makes one per entry (a frozen dataclass's
    ``__init__`` costs a microsecond, a million times)."""

    namespace: Namespace
    key: str
    path: str
    base: str
    name: str


class ShardDir:
    """One directory of a layout whose entries are files sharing directories (torchneuron's
    ``neff/ab/cd``), resolved once for all its files (:attr:`DirectoryRole.shard`): a scan then
    does per file only what must be per file, the key from the name (:meth:`key_of`).

    ``entry_dir``: the prefix of the paths of the entries whose files lie here; ``name_dir``:
    the prefix of their names (relative to ``base``); ``key_prefix``: what a key has before the
    name's (TorchNeuron's kernel entries are keyed ``<K>/<K>``, their directory's name first).
    A plain class with slots: a scan of a million entries makes one per shard directory,
    131,072 of them.
    """

    __slots__ = ("base", "entry_dir", "key_prefix", "name_dir", "namespace", "shard", "suffixes")

    # A plain key's length in lowercase hex digits: the runtime's 32, neffcache's own 64.
    KEY_MIN, KEY_MAX = 32, 64

    def __init__(self, namespace: Namespace, base: str, entry_dir: str, name_dir: str, shard: str,
                 suffixes: frozenset[str], *, key_prefix: str = "") -> None:
        self.namespace = namespace
        self.base = base
        self.entry_dir = entry_dir
        self.name_dir = name_dir
        self.shard = shard  # every key here starts with it
        self.suffixes = suffixes  # what may follow a key (``.neff``)
        self.key_prefix = key_prefix

    def key_of(self, name: str) -> str | None:
        """The key of the entry a file named ``name`` here belongs to, when the name is one of
        the plain forms (``<key><suffix>``: ``KEY_MIN`` to ``KEY_MAX`` lowercase hex digits, then a
        suffix of ``suffixes`` from the first dot on; the C helper's count_plain applies the same
        rule, stores/plain.PlainFiles); None otherwise, and the caller asks
        :meth:`Layout.locate` of the whole path (which decides every other name exactly as a
        scan always has). So this may only say yes to names ``locate`` places the same way.
        The key is ``key_prefix`` and the name's digits."""
        dot = name.find(".")
        if self.KEY_MIN <= dot <= self.KEY_MAX and name[dot:] in self.suffixes:
            key = name[:dot]
            if key.startswith(self.shard) and not key.strip(_HEX_DIGITS):
                return self.key_prefix + key
        return None


_HEX_DIGITS = "0123456789abcdef"


class DirectoryRole(NamedTuple):
    """What one directory is to one layout (:meth:`Layout.directory_role`): every question a
    scan asks of a directory, answered at once. None of a field: not that.

    ``entry``: the directory is this entry's own directory (its name left empty), and ``flat``:
    the entry's files are exactly those directly in it (a summary judges the entry once the
    listing has left it). ``shard``: it holds files of entries that share directories.
    ``spread_of``: it is one of the :attr:`Layout.spread_trees` of this namespace directory.
    ``entries_below``: a rule by which a walk may count the entry directories among its
    children. ``shards_below``: a rule by which a listing may count its children as shard
    directories, for this directory's tree alone (``primary_dirs``: the directory itself when
    the children hold the primary files, else empty); a caller merges a level's answers.

    A NamedTuple, as :class:`Located`: a scan makes one per directory a layout claims."""

    entry: Located | None = None
    flat: bool = False
    shard: ShardDir | None = None
    spread_of: str | None = None
    entries_below: PlainEntryDirs | None = None
    shards_below: PlainFiles | None = None


@dataclass(frozen=True)
class EntryPlan:
    """The store paths of an entry that is about to be written, in commit order."""

    namespace: Namespace
    key: str
    path: str
    base: str
    manifest_name: str
    marker_name: str


@dataclass(frozen=True)
class EntryNames:
    """The names (relative to the entry's base) a layout gives the files of an entry it writes.

    Writers ask for these instead of spelling runtime file names: the runtime's facts live in
    its layout alone (issue #11). ``None``: the layout has no such file.
    """

    hlo: str | None
    flags: str | None
    neff: str | None
    marker: str
    manifest: str
    failure_log: str | None = None
    runtime_lock: str | None = None  # the runtime's own "someone compiles this" file


@dataclass(frozen=True)
class LogLine:
    """What one line of a runtime's log says about one graph (see each layout's
    :meth:`Layout.parse_log_line`; the lines themselves are runtime facts and live there).

    ``kind``: ``hit`` (served from the cache), ``miss`` (not found, a compile follows),
    ``compile`` (a compiler run started), ``success`` (a compile finished and was stored),
    ``failure`` (a compile failed, or a cached failure was skipped).
    """

    kind: str
    entry: str | None = None  # the entry's name inside its namespace (neuronxcc: MODULE_<g>+<f>)
    path: str | None = None  # a file path the line names, as printed (may be a cache path)
    key: str | None = None  # a runtime key that is not a file name (torchneuron's readable op key)


@dataclass(frozen=True)
class FailureLog:
    """What a runtime's record of a failed compile says (see :meth:`Layout.read_failure_log`):
    the compiler command the runtime ran, when the record names it (None otherwise), and what
    the compiler printed (with neffcache's note when neffcache wrote the record)."""

    command: tuple[str, ...] | None
    output: str


@dataclass(frozen=True)
class EnvProblem:
    """A variable in a job's environment that defeats this runtime's cache (``env``, ``doctor``).

    ``variable``: the variable's name; ``message``: what goes wrong; ``fix``: what to do."""

    variable: str
    message: str
    fix: str
