"""Two lists of compiler flags compared option by option: what was added, removed or changed.

A flag is an option (``--model-type``) with an optional value, spelled ``--opt=value`` or as
two tokens, ``--opt value`` (a token that does not start with ``-`` is the value of the option
before it). Options are matched by name, so ``--optlevel=1`` against ``--optlevel=2`` is one
*changed* option rather than one removed and one added. The key a runtime computes hashes the
flags as spelled, so two spellings of one value, or the same flags in another order, are
reported too: either one changes a key. Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Flag:
    """One option as given: its name, its value (None for a switch), its tokens as spelled."""

    name: str
    value: str | None
    spelling: str

    @property
    def has_path(self) -> bool:
        """True when the value is a location: a path, ``~``, or a URL. Paths differ per run,
        user and host (a log file, a dump directory), and each one makes a new key."""
        value = self.value if self.value is not None else ("" if self.name.startswith("-") else self.name)
        return "/" in value or value.startswith("~")


@dataclass(frozen=True)
class FlagChange:
    """One option present on both sides with another value (or another spelling of it)."""

    name: str
    found: str  # as the entry's flags spell it
    wanted: str  # as the missed graph's flags spell it
    same_value: bool  # only the spelling differs
    has_path: bool

    def to_json(self) -> dict[str, Any]:
        return {"option": self.name, "found": self.found, "wanted": self.wanted,
                "same_value": self.same_value, "path": self.has_path}


@dataclass(frozen=True)
class FlagDiff:
    """The wanted flags against an entry's: ``added`` are only in the wanted ones, ``removed``
    only in the entry's, ``reordered``: the same flags in another order."""

    added: tuple[Flag, ...] = ()
    removed: tuple[Flag, ...] = ()
    changed: tuple[FlagChange, ...] = ()
    reordered: bool = False

    @property
    def same(self) -> bool:
        return not (self.added or self.removed or self.changed or self.reordered)

    @property
    def count(self) -> int:
        return len(self.added) + len(self.removed) + len(self.changed)

    def path_flags(self) -> list[str]:
        """The names of the options that differ and hold a path."""
        return list(dict.fromkeys([*(c.name for c in self.changed if c.has_path),
                                   *(f.name for f in (*self.added, *self.removed) if f.has_path)]))

    def to_json(self) -> dict[str, Any]:
        return {"added": [f.spelling for f in self.added], "removed": [f.spelling for f in self.removed],
                "changed": [c.to_json() for c in self.changed], "reordered": self.reordered,
                "paths": self.path_flags()}


def parse_flags(flags: Sequence[str]) -> list[Flag]:
    """The options of ``flags`` in order (see the module docstring for the two spellings)."""
    out: list[Flag] = []
    i = 0
    while i < len(flags):
        token = flags[i]
        name, eq, value = token.partition("=")
        if token.startswith("-") and not eq and i + 1 < len(flags) and not flags[i + 1].startswith("-"):
            out.append(Flag(token, flags[i + 1], f"{token} {flags[i + 1]}"))
            i += 2
            continue
        out.append(Flag(name, value if eq else None, token) if token.startswith("-") else Flag(token, None, token))
        i += 1
    return out


def diff_flags(found: Sequence[str], wanted: Sequence[str]) -> FlagDiff:
    """The wanted flags against an entry's (``found``), option by option."""
    mine, theirs = parse_flags(wanted), parse_flags(found)
    names = list(dict.fromkeys([f.name for f in mine] + [f.name for f in theirs]))
    added: list[Flag] = []
    removed: list[Flag] = []
    changed: list[FlagChange] = []
    for name in names:
        want = [f for f in mine if f.name == name]
        have = [f for f in theirs if f.name == name]
        for flag in list(want):  # the spellings both sides have are no difference
            if flag in have:
                have.remove(flag)
                want.remove(flag)
        for w, h in zip(want, have, strict=False):
            changed.append(FlagChange(name, h.spelling, w.spelling, w.value == h.value, w.has_path or h.has_path))
        added.extend(want[len(have):])
        removed.extend(have[len(want):])
    reordered = not (added or removed or changed) and list(found) != list(wanted)
    return FlagDiff(tuple(added), tuple(removed), tuple(changed), reordered)
