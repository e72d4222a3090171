"""Leases for single-flight compiles across hosts.

Acquisition is one ``INSERT ... ON CONFLICT (name) DO UPDATE ... WHERE <expired or same owner>
RETURNING`` statement. PostgreSQL evaluates the WHERE on the latest committed row version while
holding that row's lock, and SQLite serialises writers, so of any number of concurrent acquirers
on any number of replicas exactly one gets a row back. Expiry is judged by the database clock
(:class:`db_now`), never a replica's, so clock skew between replicas cannot hand a lease out twice.
"""

from __future__ import annotations

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from neffcache.server.services.records import LeaseOut
from neffcache.server.storage.db import db_now, upsert
from neffcache.server.storage.models import Lease

# Expired leases are kept this long (they tell who last compiled), then swept by acquire.
_KEEP_EXPIRED = 3600.0


def _out(held: bool, name: str, row: tuple[str, float, float] | None, now: float) -> LeaseOut:
    if row is None:
        return LeaseOut(held=held, name=name, owner=None, acquired_at=None, expires_at=None, expires_in=None)
    owner, acquired, expires = row
    return LeaseOut(held=held, name=name, owner=owner, acquired_at=acquired, expires_at=expires,
                    expires_in=max(0.0, expires - now))


def _now(session: Session) -> float:
    return float(session.scalar(select(db_now())) or 0.0)


def _current(session: Session, name: str) -> tuple[str, float, float] | None:
    row = session.execute(select(Lease.owner, Lease.acquired, Lease.expires).where(Lease.name == name)).first()
    return (row[0], row[1], row[2]) if row is not None else None


def acquire(session: Session, name: str, owner: str, ttl: float) -> LeaseOut:
    """Take the lease if it is free, expired, or already ours; else say who holds it until when."""
    now = db_now()
    stmt = upsert(session, Lease).values(name=name, owner=owner, acquired=now, expires=now + ttl, renewals=0)
    stmt = stmt.on_conflict_do_update(
        index_elements=[Lease.name],
        set_={"owner": stmt.excluded.owner, "acquired": stmt.excluded.acquired,
              "expires": stmt.excluded.expires, "renewals": 0},
        where=(Lease.expires <= now) | (Lease.owner == owner),
    ).returning(Lease.owner, Lease.acquired, Lease.expires)
    got = session.execute(stmt).first()
    clock = _now(session)
    if got is not None:
        return _out(True, name, (got[0], got[1], got[2]), clock)
    return _out(False, name, _current(session, name), clock)


def renew(session: Session, name: str, owner: str, ttl: float) -> tuple[LeaseOut, bool]:
    """Extend our lease. Returns (state, exists). An expired lease nobody took over is still ours:
    taking it over would have changed the owner in the same row."""
    now = db_now()
    got = session.execute(
        update(Lease).where(Lease.name == name, Lease.owner == owner)
        .values(expires=now + ttl, renewals=Lease.renewals + 1)
        .returning(Lease.owner, Lease.acquired, Lease.expires)
    ).first()
    clock = _now(session)
    if got is not None:
        return _out(True, name, (got[0], got[1], got[2]), clock), True
    current = _current(session, name)
    return _out(False, name, current, clock), current is not None


def release(session: Session, name: str, owner: str) -> tuple[bool, LeaseOut]:
    """Drop our lease. Returns (released, current state when not released)."""
    gone = session.execute(
        delete(Lease).where(Lease.name == name, Lease.owner == owner).returning(Lease.name)
    ).first()
    if gone is not None:
        return True, _out(False, name, None, 0.0)
    return False, _out(False, name, _current(session, name), _now(session))


def lookup(session: Session, name: str) -> LeaseOut:
    clock = _now(session)
    current = _current(session, name)
    if current is not None and current[2] <= clock:
        current = None  # expired: free for the taking
    return _out(current is not None, name, current, clock)


def active(session: Session, limit: int = 1000) -> list[LeaseOut]:
    clock = _now(session)
    rows = session.execute(
        select(Lease.name, Lease.owner, Lease.acquired, Lease.expires)
        .where(Lease.expires > clock).order_by(Lease.expires).limit(limit)
    )
    return [_out(True, name, (owner, acquired, expires), clock) for name, owner, acquired, expires in rows]


def sweep_expired(session: Session) -> int:
    result = session.execute(delete(Lease).where(Lease.expires < db_now() - _KEEP_EXPIRED))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
