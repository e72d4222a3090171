"""Response bodies only the HTTP layer builds: counts of a batch, tokens as shown, errors.

Every request body, and every record a service returns, is in
:mod:`neffcache.server.services.records`.
"""

from __future__ import annotations

from typing import TypeAlias

from pydantic import BaseModel, Field

from neffcache.server.services.tokens import TokenInfo


class RegisterResult(BaseModel):
    registered: int


MAX_BATCH = 5000


class IngestResult(BaseModel):
    accepted: int = Field(description="events stored now")
    duplicates: int = Field(description="events already stored by an earlier (re)send")
    expired: int = Field(default=0, description="events older than the server's retention, not stored")


TokenOut: TypeAlias = TokenInfo  # the service's value is the response body: its fields have one home


class TokenCreated(TokenInfo):
    token: str = Field(description="the secret; shown once, store it now")


class WhoAmI(BaseModel):
    name: str
    scope: str
    anonymous: bool
    team: str = Field(default="", description="the team its events count for; none if empty")
    prefixes: list[str] = Field(default_factory=list, description="where it may write; anywhere if none")


class Problem(BaseModel):
    detail: str
