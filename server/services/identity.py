"""Who wrote what: the identity a write carries, and the rules it is held to.

A request's token resolves to one :class:`Writer` (api/deps.py builds it from the token, the one
place that does); the services take it and never a name from the request body. The rules:

- *records and locations are the writer's*: an entry's record belongs to the token that
  registered it, each location to the token that added it. Another token may add its own
  location to an entry only when it claims the same bytes (state, size, NEFF digest), and it
  cannot change the record or remove a location that is not its own. Rows written before
  identities existed (writer "") belong to nobody: the next writer claims them.
- *the team is the token's*: a token with a team reports for that team only (an event naming
  another is refused; one naming none gets the token's). A token without a team may not name a
  team some token is bound to, so every team that adopted team tokens is protected from the rest.
- *prefixes*: a token with prefixes writes only inside them. A prefix with a scheme (``s3://``)
  or a leading ``/`` limits store URLs, any other limits entry paths and namespaces; matching is
  path-wise (``pr-123/`` covers ``pr-123/x`` and not ``pr-1234/x``), and a value with a ``.`` or
  ``..`` segment is inside no prefix, so no spelling walks out of one.
- admin is bound by none of these (it is what repairs a mistaken claim).

Each rule refuses with :class:`Forbidden`, naming every offending item of a batch, so a client
can set those aside and send the rest (neffcache/index/delivery.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from neffcache.errors import ConfigError

MAX_PREFIXES = 32
_PREFIX_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,1024}$")
TEAM_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,256}$")  # what an event's team may be (records.Label), non-empty


@dataclass(frozen=True)
class Refusal:
    """One refused item of a batch: its index, the field at fault, why."""

    index: int
    field: str
    reason: str


class Forbidden(Exception):
    """The writer may not do this; ``items`` name the refused items of a batch (empty: all)."""

    def __init__(self, message: str, items: Iterable[Refusal] = ()) -> None:
        super().__init__(message)
        self.items = tuple(items)


def is_store_prefix(prefix: str) -> bool:
    return "://" in prefix or prefix.startswith("/")


def _segments_safe(value: str) -> bool:
    rest = value.split("://", 1)[1] if "://" in value else value
    return not any(part in (".", "..") for part in rest.split("/"))


def normalize_prefix(text: str) -> str:
    """A prefix as stored: trailing slashes dropped (``pr-123/`` and ``pr-123`` are one prefix).
    Raises ConfigError for one that could match unintended paths."""
    if not _PREFIX_RE.match(text):
        raise ConfigError(f"invalid prefix {text!r}: 1-1024 printable characters")
    clean = text.rstrip("/")
    if not clean or clean.endswith(":") or not _segments_safe(clean):
        raise ConfigError(f"invalid prefix {text!r}: it must name a folder, with no '.' or '..' segment")
    if not is_store_prefix(clean) and (clean.startswith("/") or "//" in clean):
        raise ConfigError(f"invalid prefix {text!r}: an entry-path prefix is relative, with no empty segment")
    return clean


def normalize_prefixes(texts: Iterable[str]) -> tuple[str, ...]:
    prefixes = tuple(sorted({normalize_prefix(text) for text in texts}))
    if len(prefixes) > MAX_PREFIXES:
        raise ConfigError(f"at most {MAX_PREFIXES} prefixes per token, not {len(prefixes)}")
    return prefixes


def covers(prefix: str, value: str) -> bool:
    """Whether ``value`` is ``prefix`` or below it, path-wise (a stored, normalized prefix)."""
    if not _segments_safe(value):
        return False
    value = value.rstrip("/")
    return value == prefix or value.startswith(prefix + "/")


def check_team(team: str) -> str:
    if not TEAM_RE.match(team) or team != team.strip():
        raise ConfigError(f"invalid team {team!r}: 1-256 printable characters, no surrounding spaces")
    return team


@dataclass(frozen=True)
class Writer:
    """The authenticated identity of a write: a token's name (unique for the life of the
    database: a revoked token keeps its row and its name), team and prefixes."""

    name: str
    team: str = ""
    prefixes: tuple[str, ...] = ()
    admin: bool = False
    _paths: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _stores: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_paths", tuple(p for p in self.prefixes if not is_store_prefix(p)))
        object.__setattr__(self, "_stores", tuple(p for p in self.prefixes if is_store_prefix(p)))

    def owns(self, writer: str) -> bool:
        """Whether a row written by ``writer`` is this identity's to change ("" is nobody's)."""
        return self.admin or writer in ("", self.name)

    def path_outside(self, path: str | None) -> bool:
        return bool(self._paths) and path is not None and not any(covers(p, path) for p in self._paths)

    def store_outside(self, store: str | None) -> bool:
        return bool(self._stores) and store is not None and not any(covers(p, store) for p in self._stores)

    def scope_refusals(self, index: int, path: str | None, namespace: str | None,
                      store: str | None) -> list[Refusal]:
        """Why an item naming these is outside the token's prefixes (nothing when inside)."""
        if self.admin or not self.prefixes:
            return []
        return [Refusal(index, name, f"{name} {value!r} is outside the token's prefixes")
                 for name, value, outside in (("path", path, self.path_outside(path)),
                                              ("namespace", namespace, self.path_outside(namespace or None)),
                                              ("store", store, self.store_outside(store)))
                 if outside]

    def team_for(self, index: int, team: str, bound: frozenset[str]) -> tuple[str, Refusal | None]:
        """The team an event of this writer is recorded under, or why it may not name ``team``."""
        if self.admin:
            return team, None
        if self.team:
            if team in ("", self.team):
                return self.team, None
            return team, Refusal(index, "team", f"token {self.name!r} reports for team {self.team!r}, not {team!r}")
        if team in bound:
            return team, Refusal(index, "team", f"team {team!r} is reported only by its own tokens")
        return team, None


def refuse(what: str, refusals: list[Refusal]) -> None:
    """Raise Forbidden for ``refusals`` (a batch's refused items), if there are any."""
    if not refusals:
        return
    first = refusals[0]
    more = f" (and {len(refusals) - 1} more)" if len(refusals) > 1 else ""
    raise Forbidden(f"{what}: item {first.index}: {first.reason}{more}", refusals)
