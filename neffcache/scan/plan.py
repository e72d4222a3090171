"""The scan's walk plan: what a summary tells a store's walk (stores/walk.py ``WalkPlan``).

Made once per scan from the layouts' one question per directory (``Layout.directory_role``)
and the grouping's checks (:class:`~neffcache.scan.grouping.Grouper`): the sibling trees to
hold back and list in step, and, when counting is on, the rules by which a store may count
entries instead of listing them. Every rule it hands out is one the grouping would agree with
(``Grouper.entry_rule``, ``Grouper.plain_rule`` argue it), so a count stands for exactly the
entries judging would have made committed SUCCESS entries.
"""

from __future__ import annotations

from collections.abc import Sequence

from neffcache.layouts import LAYOUTS
from neffcache.scan.grouping import Grouper
from neffcache.stores.plain import PlainEntryDirs, PlainFiles


class SummaryPlan:
    """The summary's walk plan (``WalkPlan``, stores/walk.py): the layouts' spread trees held
    back to be listed in step, and, when ``counting``, the grouper's rules (:meth:`Grouper.plain_rule`
    for layout-B levels, :meth:`Grouper.entry_rule` for layout-A namespaces: what judging would
    decide). A store counts a directory only where nothing lies below it and its listing would
    have had no problem, so unlike a shard the summary counts in its in-step judging, a store's
    count needs no waiting for the walk to leave it, and unlike an open flat entry no judging
    when it does."""

    def __init__(self, grouper: Grouper, *, counting: bool, largest: int) -> None:
        self._grouper = grouper
        self._counting = counting
        self.largest = largest  # how many of each count's largest entries the sinks want
        self._layouts = [lay for lay in LAYOUTS.values() if lay.spread_trees]
        self.held = frozenset(tree for lay in self._layouts for tree in lay.spread_trees)

    def in_step_group(self, directory: str) -> str | None:
        for lay in self._layouts:
            role = lay.directory_role(directory)
            if role is not None and role.spread_of is not None:
                return role.spread_of
        return None

    def entries_below(self, directory: str) -> PlainEntryDirs | None:
        return self._grouper.entry_rule(directory) if self._counting else None

    def shards_below(self, directories: Sequence[str]) -> PlainFiles | None:
        return self._grouper.plain_rule(directories) if self._counting else None
