"""API tokens: creation, listing, revocation and verification.

A token reads ``nfc_<id>_<secret>``. The public ``id`` finds the row; only sha256(secret) is
stored, and it is compared with :func:`hmac.compare_digest` so response timing says nothing about
how much of a guessed secret was right. The secret has 256 bits of entropy, so a plain sha256
(no slow KDF) is enough to make a stolen database useless.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import time

from pydantic import BaseModel, ConfigDict, computed_field
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from neffcache.errors import ConfigError
from neffcache.server.services.identity import check_team, normalize_prefixes
from neffcache.server.storage.models import Token, table_of

log = logging.getLogger(__name__)

SCOPES = ("read", "write", "admin")
_RANK = {scope: rank for rank, scope in enumerate(SCOPES)}
PREFIX = "nfc_"
_ID_LEN = 12
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$")
# The names api/deps.py gives the identities that are no token: a token may not pose as one.
RESERVED_NAMES = frozenset({"bootstrap-admin", "anonymous"})


class TokenInfo(BaseModel):
    """What may be shown of a token (never its secret). The API answers with this model itself
    (server/api/schemas.py), so its fields have one home."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    scope: str
    created: float
    last_used: float | None
    revoked: float | None
    team: str = ""  # the team it reports for; "" none (services/identity.py)
    prefixes: tuple[str, ...] = ()  # where it may write; () anywhere

    @computed_field  # type: ignore[prop-decorator]
    @property
    def active(self) -> bool:
        return self.revoked is None

    def to_json(self) -> dict[str, object]:
        return self.model_dump()


def scope_allows(have: str, need: str) -> bool:
    """admin implies write implies read."""
    return _RANK.get(have, -1) >= _RANK[need]


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _info(row: Token) -> TokenInfo:
    return TokenInfo(id=row.id, name=row.name, scope=row.scope, created=row.created, last_used=row.last_used,
                     revoked=row.revoked, team=row.team, prefixes=_prefixes(row.prefixes))


class DamagedToken(ValueError):
    """A token row whose prefixes do not parse: it is refused, never read as unlimited."""


def _prefixes(stored: str) -> tuple[str, ...]:
    try:
        parsed = json.loads(stored)
        if not isinstance(parsed, list) or not all(isinstance(p, str) for p in parsed):
            raise TypeError("not a list of strings")
        return normalize_prefixes(parsed)
    except (ValueError, TypeError, ConfigError) as exc:
        raise DamagedToken(f"stored prefixes {stored[:100]!r} do not parse: {exc}") from None


def split_token(presented: str) -> tuple[str, str] | None:
    if not presented.startswith(PREFIX) or len(presented) < len(PREFIX) + _ID_LEN + 2:
        return None
    token_id = presented[len(PREFIX):len(PREFIX) + _ID_LEN]
    if presented[len(PREFIX) + _ID_LEN] != "_":
        return None
    return token_id, presented[len(PREFIX) + _ID_LEN + 1:]


def create_token(session: Session, name: str, scope: str, *, team: str = "",
                 prefixes: tuple[str, ...] | list[str] = ()) -> tuple[TokenInfo, str]:
    """Store a new token and return it with its secret, which is never retrievable again.
    ``team`` and ``prefixes`` bound what it may write (services/identity.py)."""
    if scope not in SCOPES:
        raise ConfigError(f"unknown scope {scope!r}; choose one of {', '.join(SCOPES)}")
    if not _NAME_RE.match(name):
        raise ConfigError(f"invalid token name {name!r}: 1-64 of [A-Za-z0-9_.@:-], starting alphanumeric")
    if name in RESERVED_NAMES:
        raise ConfigError(f"the token name {name!r} is reserved for the server's own identities")
    team = check_team(team) if team else ""
    limits = normalize_prefixes(prefixes)
    if session.scalar(select(Token.id).where(Token.name == name)) is not None:
        raise ConfigError(f"a token named {name!r} exists already; revoke it or choose another name")
    token_id = secrets.token_hex(_ID_LEN // 2)
    secret = secrets.token_urlsafe(32)
    row = Token(id=token_id, name=name, scope=scope, secret_sha256=_digest(secret),
                created=time.time(), last_used=None, revoked=None, team=team, prefixes=json.dumps(list(limits)))
    session.add(row)
    session.flush()
    return _info(row), f"{PREFIX}{token_id}_{secret}"


def list_tokens(session: Session, *, include_revoked: bool = True) -> list[TokenInfo]:
    stmt = select(Token).order_by(Token.created, Token.id)
    if not include_revoked:
        stmt = stmt.where(Token.revoked.is_(None))
    return [_listed(row) for row in session.scalars(stmt)]


def _listed(row: Token) -> TokenInfo:
    """A token as listed: one whose prefixes do not parse (it is refused, see verify_token) is
    shown with that said, so the operator sees which one to revoke."""
    try:
        return _info(row)
    except DamagedToken:
        return TokenInfo(id=row.id, name=row.name, scope=row.scope, created=row.created, last_used=row.last_used,
                         revoked=row.revoked, team=row.team, prefixes=("(unreadable: refused)",))


def revoke_token(session: Session, id_or_name: str) -> TokenInfo | None:
    """Revoke by id or name; returns None when no such token exists. Revoking twice is a no-op."""
    row = session.scalar(select(Token).where(or_(Token.id == id_or_name, Token.name == id_or_name)))
    if row is None:
        return None
    if row.revoked is None:
        row.revoked = time.time()
        session.flush()
    return _info(row)


def verify_token(session: Session, presented: str) -> TokenInfo | None:
    """The active token ``presented`` stands for, or None."""
    parts = split_token(presented)
    if parts is None:
        return None
    token_id, secret = parts
    row = session.get(Token, token_id)
    # Compare even when the row is missing so a wrong id costs the same time as a wrong secret.
    expected = row.secret_sha256 if row is not None else "0" * 64
    if not hmac.compare_digest(expected, _digest(secret)) or row is None or row.revoked is not None:
        return None
    try:
        return _info(row)
    except DamagedToken:
        log.error("token %s refused: its stored prefixes do not parse (revoke it and create another)", row.id)
        return None


def touch_token(session: Session, token_id: str, now: float) -> None:
    session.execute(update(Token).where(Token.id == token_id).values(last_used=now))


def bound_teams(session: Session) -> frozenset[str]:
    """Every team some token is bound to, revoked tokens' too: revoking a team's last token
    must not open its name to every other token (services/identity.py). A Core statement built
    once: every event batch of a token without a team asks, and the ORM's per-call work cost
    more than the query."""
    return frozenset(session.connection().execute(_BOUND_TEAMS).scalars())


_TOKENS = table_of(Token)
_BOUND_TEAMS = select(_TOKENS.c.team).where(_TOKENS.c.team != "").distinct()
