"""Leases for single-flight compiles across hosts.

Acquisition is one ``INSERT ... ON CONFLICT (name) DO UPDATE ... WHERE <expired or same owner>
RETURNING`` statement. PostgreSQL evaluates the WHERE on the latest committed row version while
holding that row's lock, and SQLite serialises writers, so of any number of concurrent acquirers
on any number of replicas exactly one gets a row back. Expiry is judged by the database clock
(:class:`db_now`), never a replica's, so clock skew between replicas cannot hand a lease out twice.

The holder is the pair (writer, owner): the authenticated token, and the label its client sends,
which only tells apart the processes that share one token. Every statement that could take,
extend or drop a held lease matches both, so knowing a holder's label (any reader can list it)
gives another token nothing: ownership comes from the token, never from the string.
"""

from __future__ import annotations

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from neffcache.server.services.records import LeaseOut
from neffcache.server.storage.db import db_now, upsert
from neffcache.server.storage.models import Lease

# Expired leases are kept this long (they tell who last compiled), then swept by acquire.
_KEEP_EXPIRED = 3600.0


_Row = tuple[str, str, float, float]  # writer, owner, acquired, expires


def _out(held: bool, name: str, row: _Row | None, now: float) -> LeaseOut:
    if row is None:
        return LeaseOut(held=held, name=name, owner=None, writer=None, acquired_at=None, expires_at=None,
                        expires_in=None)
    writer, owner, acquired, expires = row
    return LeaseOut(held=held, name=name, owner=owner, writer=writer, acquired_at=acquired, expires_at=expires,
                    expires_in=max(0.0, expires - now))


def _now(session: Session) -> float:
    return float(session.scalar(select(db_now())) or 0.0)


_COLUMNS = (Lease.writer, Lease.owner, Lease.acquired, Lease.expires)


def _current(session: Session, name: str) -> _Row | None:
    row = session.execute(select(*_COLUMNS).where(Lease.name == name)).first()
    return (row[0], row[1], row[2], row[3]) if row is not None else None


def acquire(session: Session, name: str, writer: str, owner: str, ttl: float) -> LeaseOut:
    """Take the lease if it is free, expired, or already ours; else say who holds it until when."""
    now = db_now()
    stmt = upsert(session, Lease).values(name=name, writer=writer, owner=owner, acquired=now, expires=now + ttl,
                                         renewals=0)
    stmt = stmt.on_conflict_do_update(
        index_elements=[Lease.name],
        set_={"writer": stmt.excluded.writer, "owner": stmt.excluded.owner, "acquired": stmt.excluded.acquired,
              "expires": stmt.excluded.expires, "renewals": 0},
        where=(Lease.expires <= now) | ((Lease.writer == writer) & (Lease.owner == owner)),
    ).returning(*_COLUMNS)
    got = session.execute(stmt).first()
    clock = _now(session)
    if got is not None:
        return _out(True, name, (got[0], got[1], got[2], got[3]), clock)
    return _out(False, name, _current(session, name), clock)


def renew(session: Session, name: str, writer: str, owner: str, ttl: float) -> tuple[LeaseOut, bool]:
    """Extend our lease. Returns (state, exists). An expired lease nobody took over is still ours:
    taking it over would have changed the holder in the same row."""
    now = db_now()
    got = session.execute(
        update(Lease).where(Lease.name == name, Lease.writer == writer, Lease.owner == owner)
        .values(expires=now + ttl, renewals=Lease.renewals + 1)
        .returning(*_COLUMNS)
    ).first()
    clock = _now(session)
    if got is not None:
        return _out(True, name, (got[0], got[1], got[2], got[3]), clock), True
    current = _current(session, name)
    return _out(False, name, current, clock), current is not None


def release(session: Session, name: str, writer: str, owner: str) -> tuple[bool, LeaseOut]:
    """Drop our lease. Returns (released, current state when not released)."""
    gone = session.execute(
        delete(Lease).where(Lease.name == name, Lease.writer == writer, Lease.owner == owner).returning(Lease.name)
    ).first()
    if gone is not None:
        return True, _out(False, name, None, 0.0)
    return False, _out(False, name, _current(session, name), _now(session))


def lookup(session: Session, name: str) -> LeaseOut:
    clock = _now(session)
    current = _current(session, name)
    if current is not None and current[3] <= clock:
        current = None  # expired: free for the taking
    return _out(current is not None, name, current, clock)


def active(session: Session, limit: int = 1000) -> list[LeaseOut]:
    clock = _now(session)
    rows = session.execute(
        select(Lease.name, *_COLUMNS).where(Lease.expires > clock).order_by(Lease.expires).limit(limit))
    return [_out(True, name, (writer, owner, acquired, expires), clock)
            for name, writer, owner, acquired, expires in rows]


def sweep_expired(session: Session) -> int:
    result = session.execute(delete(Lease).where(Lease.expires < db_now() - _KEEP_EXPIRED))
    return int(result.rowcount or 0)  # type: ignore[attr-defined]
