"""Rules by which a listing may count entries instead of listing them: what a walk plan
(neffcache/stores/walk.py) hands a store.

A layout makes a rule (``Layout.directory_role``: its ``shards_below``, ``entries_below``), a
summary checks it against what its grouping would ask (``Grouper.plain_rule``,
``Grouper.entry_rule``) and puts it in its plan, and a local store applies it in C
(neffcache/stores/_listdir.c): the store counts without knowing the runtime facts behind a
rule. Values only: no store imports a layout.
"""

from __future__ import annotations

from typing import NamedTuple

from neffcache.entry import Namespace


class PlainFiles(NamedTuple):
    """A rule by which a listing may count the entries of leaf directories instead of listing
    them (``WalkPlan.shards_below``): for each child named in ``children`` of
    the directories it was made for, every file must be a regular file named ``<key><suffix>``
    (``key_min`` to ``key_max`` lowercase hex digits starting with ``prefix`` plus the child's
    name; a suffix of ``suffixes``, from the first dot on), and each key must have a non-empty
    ``primary`` file in a directory of ``primary_dirs``. A child where anything else is found
    (a subdirectory, a link, another name, an empty primary, a key without one, a directory
    that cannot be read) is listed as usual instead: a count stands for listings that would
    have said nothing else. The layout makes the rule (``DirectoryRole.shards_below``); the store
    only applies it."""

    children: frozenset[str]
    prefix: str
    suffixes: tuple[str, ...]
    primary: str
    primary_dirs: frozenset[str]
    key_min: int
    key_max: int
    namespace: Namespace | None = None  # whose entries these are (the layout's answer, handed back)


class PlainEntryDirs(NamedTuple):
    """A rule by which a walk may count entry directories instead of listing them
    (``WalkPlan.entries_below``): each child named ``prefix`` plus one or
    more characters of ``charset`` of the directory it was made for is one entry, counted when
    it holds nothing but regular files named in ``names``, with each of ``required`` present
    and ``primary`` not empty. Any other child, or one where anything else is found, is walked
    as usual. The layout makes the rule (``DirectoryRole.entries_below``)."""

    prefix: str
    charset: str
    names: tuple[str, ...]
    required: tuple[str, ...]
    primary: str
    namespace: Namespace | None = None  # whose entries these are (the layout's answer, handed back)


# A count's largest entries, [(directory, key, bytes, files)]: ``Counted.top`` (stores/walk.py).
CountedTop = list[tuple[str, str, int, int]]
