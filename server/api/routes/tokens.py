"""/v1/tokens (admin): create, list, revoke API tokens; /v1/whoami for any valid token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, status
from sqlalchemy.exc import IntegrityError

from neffcache.errors import ConfigError
from neffcache.server.api.deps import AdminAccess, ReadAccess
from neffcache.server.api.routes.common import AUTH_ERRORS, WRITE_ERRORS, not_found
from neffcache.server.api.schemas import Problem, TokenCreated, TokenOut, WhoAmI
from neffcache.server.services import tokens
from neffcache.server.services.identity import check_team, normalize_prefixes
from neffcache.server.services.records import TokenCreate

router = APIRouter(tags=["tokens"])


@router.post("/v1/tokens", name="tokens.create", summary="Create a token", status_code=status.HTTP_201_CREATED,
             responses={**WRITE_ERRORS, 409: {"model": Problem, "description": "name taken"}})
def create_token(body: TokenCreate, access: AdminAccess) -> TokenCreated:
    """Create a token; the response carries the secret, which cannot be retrieved again.
    ``team`` and ``prefixes`` bound what it may write (a bad one is a 422)."""
    try:
        team = check_team(body.team) if body.team else ""
        prefixes = normalize_prefixes(body.prefixes)
    except ConfigError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    try:
        info, secret = access.db.transact(lambda s: tokens.create_token(s, body.name, body.scope, team=team,
                                                                            prefixes=prefixes))
    except (ConfigError, IntegrityError) as exc:
        detail = str(exc) if isinstance(exc, ConfigError) else f"a token named {body.name!r} exists already"
        raise HTTPException(status.HTTP_409_CONFLICT, detail) from None
    return TokenCreated.model_validate({**info.to_json(), "token": secret})


@router.get("/v1/tokens", name="tokens.list", summary="List tokens", responses=AUTH_ERRORS)
def list_tokens(access: AdminAccess) -> list[TokenOut]:
    """Every token, revoked ones included (never the secrets)."""
    with access.db.read() as session:
        return [TokenOut.model_validate(t.to_json()) for t in tokens.list_tokens(session)]


@router.delete("/v1/tokens/{token}", name="tokens.revoke", summary="Revoke a token",
               responses={**AUTH_ERRORS, 404: {"model": Problem, "description": "no such token"}})
def revoke_token(
    token: Annotated[str, Path(max_length=64, pattern=r"^[A-Za-z0-9_.@:-]+$", description="id or name")],
    access: AdminAccess,
) -> TokenOut:
    """Revoke a token by id or name. Other replicas stop accepting it within a few seconds."""
    info = access.db.transact(lambda s: tokens.revoke_token(s, token))
    if info is None:
        raise not_found(f"token {token!r}")
    access.state.token_cache.forget(info.id)
    return TokenOut.model_validate(info.to_json())


@router.get("/v1/whoami", name="tokens.whoami", summary="Who the token is", responses=AUTH_ERRORS)
async def whoami(access: ReadAccess) -> WhoAmI:
    """Which token the request authenticated as, and its scope."""
    who = access.principal
    return WhoAmI(name=who.name, scope=who.scope, anonymous=who.anonymous, team=who.team, prefixes=list(who.prefixes))
