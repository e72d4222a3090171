"""API tokens: creation, listing, revocation and verification.

A token reads ``nfc_<id>_<secret>``. The public ``id`` finds the row; only sha256(secret) is
stored, and it is compared with :func:`hmac.compare_digest` so response timing says nothing about
how much of a guessed secret was right. The secret has 256 bits of entropy, so a plain sha256
(no slow KDF) is enough to make a stolen database useless.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time

from pydantic import BaseModel, ConfigDict, computed_field
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from neffcache.errors import ConfigError
from neffcache.server.storage.models import Token

SCOPES = ("read", "write", "admin")
_RANK = {scope: rank for rank, scope in enumerate(SCOPES)}
PREFIX = "nfc_"
_ID_LEN = 12
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$")


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
                     revoked=row.revoked)


def split_token(presented: str) -> tuple[str, str] | None:
    if not presented.startswith(PREFIX) or len(presented) < len(PREFIX) + _ID_LEN + 2:
        return None
    token_id = presented[len(PREFIX):len(PREFIX) + _ID_LEN]
    if presented[len(PREFIX) + _ID_LEN] != "_":
        return None
    return token_id, presented[len(PREFIX) + _ID_LEN + 1:]


def create_token(session: Session, name: str, scope: str) -> tuple[TokenInfo, str]:
    """Store a new token and return it with its secret, which is never retrievable again."""
    if scope not in SCOPES:
        raise ConfigError(f"unknown scope {scope!r}; choose one of {', '.join(SCOPES)}")
    if not _NAME_RE.match(name):
        raise ConfigError(f"invalid token name {name!r}: 1-64 of [A-Za-z0-9_.@:-], starting alphanumeric")
    if session.scalar(select(Token.id).where(Token.name == name)) is not None:
        raise ConfigError(f"a token named {name!r} exists already; revoke it or choose another name")
    token_id = secrets.token_hex(_ID_LEN // 2)
    secret = secrets.token_urlsafe(32)
    row = Token(id=token_id, name=name, scope=scope, secret_sha256=_digest(secret),
                created=time.time(), last_used=None, revoked=None)
    session.add(row)
    session.flush()
    return _info(row), f"{PREFIX}{token_id}_{secret}"


def list_tokens(session: Session, *, include_revoked: bool = True) -> list[TokenInfo]:
    stmt = select(Token).order_by(Token.created, Token.id)
    if not include_revoked:
        stmt = stmt.where(Token.revoked.is_(None))
    return [_info(row) for row in session.scalars(stmt)]


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
    return _info(row)


def touch_token(session: Session, token_id: str, now: float) -> None:
    session.execute(update(Token).where(Token.id == token_id).values(last_used=now))
