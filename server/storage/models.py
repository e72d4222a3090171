"""SQLAlchemy 2 models of the index. The Alembic migrations in ``migrations/`` mirror this file.

Epoch seconds are stored as doubles everywhere (clients send epoch floats; no time zones to get
wrong between SQLite and PostgreSQL). Strings that name a dimension (team, model, ...) are ""
rather than NULL when unknown, because a NULL never conflicts in a unique index and the rollup
upsert depends on that conflict.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import BigInteger, Double, ForeignKey, Index, Integer, LargeBinary, String, Table, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


def table_of(model: Any) -> Table:
    """The Core table of a mapped class, for executemany statements that skip the ORM."""
    return cast(Table, model.__table__)


class Entry(Base):
    """One compiled graph, identified by its store-relative path (its runtime key in the layout)."""

    __tablename__ = "entries"
    # compile-samples: a target's newest entries without sorting every entry (migration 0003).
    # unrendered: the rows a rendering pass has left to do, and nothing else (migration 0004).
    __table_args__ = (Index("ix_entries_target_created", "target", "created"),
                      Index("ix_entries_unrendered", "id", sqlite_where=text("rendered IS NULL"),
                            postgresql_where=text("rendered IS NULL")))

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    path: Mapped[str] = mapped_column(String(1024), unique=True)
    layout: Mapped[str] = mapped_column(String(32))
    key: Mapped[str] = mapped_column(String(256), index=True)
    namespace: Mapped[str] = mapped_column(String(512), index=True)
    compiler_version: Mapped[str | None] = mapped_column(String(128))
    target: Mapped[str | None] = mapped_column(String(16))
    lnc: Mapped[int | None] = mapped_column(Integer)
    # "<target>-lnc<n>/neuronxcc-<version>" or "unknown": the grouping key of every size chart.
    toolchain: Mapped[str] = mapped_column(String(200), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    size: Mapped[int] = mapped_column(BigInteger)
    neff_sha256: Mapped[str | None] = mapped_column(String(64))
    created: Mapped[float] = mapped_column(Double)
    registered: Mapped[float] = mapped_column(Double)
    updated: Mapped[float] = mapped_column(Double)
    producer: Mapped[str] = mapped_column(String(256))
    compile_seconds: Mapped[float | None] = mapped_column(Double)
    # The token that wrote the row (migration 0006; "" before it): services/identity.py.
    writer: Mapped[str] = mapped_column(String(64), default="", server_default="")
    # The graph's inputs (migration 0002), NULL where the publisher did not know them: what
    # why-miss compares a missed graph with fleet-wide, and what compile forecasts fit on.
    hlo_sha256: Mapped[str | None] = mapped_column(String(64), index=True)
    hlo_size: Mapped[int | None] = mapped_column(BigInteger)
    flags: Mapped[str | None] = mapped_column(Text)  # a JSON list of strings, as the manifest has them
    # neffcache's own usage stamps: shared mounts may disable atime, so we never read it.
    hit_count: Mapped[int] = mapped_column(BigInteger, default=0)
    last_used: Mapped[float | None] = mapped_column(Double)
    # The entry's API form up to its usage stamps, and whose rendering it is (migration 0004,
    # which says why the database keeps it from going stale): what a batch lookup reads.
    # Deferred: every other question about entries has no use for it.
    rendered: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    rendered_format: Mapped[int | None] = mapped_column(Integer, deferred=True)


class EntryLocation(Base):
    """A store URL that holds an entry; an entry can be held by several stores (tiers)."""

    __tablename__ = "entry_locations"

    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), primary_key=True)
    store: Mapped[str] = mapped_column(String(1024), primary_key=True)
    added: Mapped[float] = mapped_column(Double)
    # The token that wrote the row (migration 0006; "" before it): services/identity.py.
    writer: Mapped[str] = mapped_column(String(64), default="", server_default="")


class EntryTag(Base):
    __tablename__ = "entry_tags"
    __table_args__ = (Index("ix_entry_tags_name_value", "name", "value"),)

    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class Event(Base):
    """A hit, miss, compile, evict or error reported by a client; ``event_id`` makes resends no-ops."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_kind_ts", "kind", "ts"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    ts: Mapped[float] = mapped_column(Double, index=True)
    path: Mapped[str | None] = mapped_column(String(1024))
    key: Mapped[str | None] = mapped_column(String(256))
    namespace: Mapped[str] = mapped_column(String(512))
    toolchain: Mapped[str] = mapped_column(String(200))
    job: Mapped[str] = mapped_column(String(256))
    model: Mapped[str] = mapped_column(String(256))
    team: Mapped[str] = mapped_column(String(256))
    host: Mapped[str] = mapped_column(String(256))
    instance_type: Mapped[str] = mapped_column(String(64))
    compile_seconds: Mapped[float | None] = mapped_column(Double)
    store: Mapped[str | None] = mapped_column(String(1024))
    message: Mapped[str | None] = mapped_column(Text)
    received: Mapped[float] = mapped_column(Double)
    # The token that wrote the row (migration 0006; "" before it): services/identity.py.
    writer: Mapped[str] = mapped_column(String(64), default="", server_default="")


class EventRollup(Base):
    """Hourly counts per dimension, kept in the ingest transaction so stats and metrics never scan
    the raw events, and so every replica reads the same totals from the database."""

    __tablename__ = "event_rollups"

    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    # job, warm or rewarm (neffcache.index.records.event_source of the events' job; migration 0005):
    # a hit rate is the jobs', a warm-up's compiles are work done ahead of demand.
    source: Mapped[str] = mapped_column(String(16), primary_key=True)
    team: Mapped[str] = mapped_column(String(256), primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    instance_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    toolchain: Mapped[str] = mapped_column(String(200), primary_key=True)
    # The token that reported the events (migration 0006): stats group by it as the producer.
    writer: Mapped[str] = mapped_column(String(64), primary_key=True, default="", server_default="")
    count: Mapped[int] = mapped_column(BigInteger)
    # compile: seconds spent compiling; hit: seconds the hit saved.
    seconds: Mapped[float] = mapped_column(Double)


class Lease(Base):
    """Single-flight compile lease. Times come from the database clock, not the replicas' clocks."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(1024), primary_key=True)
    # The holder is the pair (writer, owner): the token that took the lease, and the label its
    # client gave (which only tells apart the processes sharing one token).
    writer: Mapped[str] = mapped_column(String(64), default="", server_default="")
    owner: Mapped[str] = mapped_column(String(256))
    acquired: Mapped[float] = mapped_column(Double)
    expires: Mapped[float] = mapped_column(Double, index=True)
    renewals: Mapped[int] = mapped_column(Integer, default=0)


class Token(Base):
    """An API token. Only a sha256 of the secret is stored; the secret is shown once at creation."""

    __tablename__ = "tokens"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(8))
    secret_sha256: Mapped[str] = mapped_column(String(64))
    created: Mapped[float] = mapped_column(Double)
    last_used: Mapped[float | None] = mapped_column(Double)
    revoked: Mapped[float | None] = mapped_column(Double)
    # What the token may write (migration 0006): the team it reports for ("" none), and its
    # prefixes as a JSON list ("[]" anywhere). services/identity.py holds the rules.
    team: Mapped[str] = mapped_column(String(256), default="", server_default="")
    prefixes: Mapped[str] = mapped_column(Text, default="[]", server_default="[]")


class Eviction(Base):
    """The newest budget eviction of a path (migration 0007): what a later miss of it regrets.

    One row per path, however often it is evicted: ``recreated`` is the first hit or compile of
    it after ``evicted_at`` and ``regretted`` the first miss before that, so a miss regrets an
    eviction at most once, and a graph compiled again regrets nothing more (services/regret.py)."""

    __tablename__ = "evictions"

    path: Mapped[str] = mapped_column(String(1024), primary_key=True)
    store: Mapped[str | None] = mapped_column(String(1024))
    policy: Mapped[str] = mapped_column(String(16))
    compile_seconds: Mapped[float] = mapped_column(Double)
    evicted_at: Mapped[float] = mapped_column(Double, index=True)
    recreated: Mapped[float | None] = mapped_column(Double)
    regretted: Mapped[float | None] = mapped_column(Double)


class RegretRollup(Base):
    """Hourly budget evictions per policy, and the regretted ones by the hour of their miss with
    the compile seconds they cost (migration 0007): stats and metrics never scan events for them."""

    __tablename__ = "regret_rollups"

    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    policy: Mapped[str] = mapped_column(String(16), primary_key=True)
    evictions: Mapped[int] = mapped_column(BigInteger)
    regretted: Mapped[int] = mapped_column(BigInteger)
    seconds: Mapped[float] = mapped_column(Double)
