"""/v1/leases: single-flight compile leases with a TTL, exact across replicas."""

from __future__ import annotations

import random
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel

from neffcache.server.api.deps import ReadAccess, WriteAccess
from neffcache.server.api.routes.common import AUTH_ERRORS, WRITE_ERRORS
from neffcache.server.api.schemas import Problem
from neffcache.server.services import leases as lease_table
from neffcache.server.services.records import LeaseAcquire, LeaseOut, LeaseRelease

router = APIRouter(prefix="/v1/leases", tags=["leases"])
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": Problem, "description": "another owner holds the lease"},
    404: {"model": Problem, "description": "no such lease"},
}


class Released(BaseModel):
    released: bool


def _held_by_other(state: LeaseOut) -> HTTPException:
    return HTTPException(status.HTTP_409_CONFLICT,
                         f"lease {state.name!r} is held by {state.owner!r} of token {state.writer!r} "
                         f"for {state.expires_in or 0:.0f}s more")


@router.post("/acquire", name="leases.acquire", summary="Acquire a compile lease", responses=WRITE_ERRORS)
def acquire(body: LeaseAcquire, access: WriteAccess) -> LeaseOut:
    """Take the lease for ``ttl`` seconds if it is free or expired (or already ours).

    ``held`` says whether you got it; if not, ``owner`` and ``expires_in`` say who has it and
    for how long. Not getting a lease is an answer, not an error (200)."""
    writer = access.writer.name
    if random.random() < 0.01:  # expired rows are harmless; sweeping now and then keeps the table small
        access.db.transact(lease_table.sweep_expired)
    return access.db.transact(lambda s: lease_table.acquire(s, body.name, writer, body.owner, body.ttl))


@router.post("/renew", name="leases.renew", summary="Renew a lease", responses={**WRITE_ERRORS, **_CONFLICT})
def renew(body: LeaseAcquire, access: WriteAccess) -> LeaseOut:
    """Extend a lease you hold by ``ttl`` seconds from now. Held means by this token and owner
    label together: another token gets 409 whatever label it sends."""
    writer = access.writer.name
    state, exists = access.db.transact(lambda s: lease_table.renew(s, body.name, writer, body.owner, body.ttl))
    if state.held:
        return state
    if not exists:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"lease {body.name!r} is not held by anyone")
    raise _held_by_other(state)


@router.post("/release", name="leases.release", summary="Release a lease", responses={**WRITE_ERRORS, **_CONFLICT})
def release(body: LeaseRelease, access: WriteAccess) -> Released:
    """Give a lease back. Only its holder (this token and owner label) can; a retry after
    success gets 404."""
    writer = access.writer.name
    released, state = access.db.transact(lambda s: lease_table.release(s, body.name, writer, body.owner))
    if released:
        return Released(released=True)
    if state.owner is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"lease {body.name!r} is not held by anyone")
    raise _held_by_other(state)


@router.get("", name="leases.list", summary="Held leases", responses=AUTH_ERRORS)
def list_leases(
    access: ReadAccess,
    name: Annotated[str | None, Query(min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+$",
                                      description="one lease by name (held or not)")] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
) -> list[LeaseOut]:
    """Leases held now, soonest expiry first; or the one named by ``name``."""
    with access.db.read() as session:
        if name is not None:
            return [lease_table.lookup(session, name)]
        held: list[LeaseOut] = lease_table.active(session, limit)
        return held
