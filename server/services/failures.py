"""Failed graphs grouped by the signature of their error, from the error events of a window.

The index keeps every ``error`` event a client sent (a compile pool's failed compile, a
runtime's failure line), with its ``message`` (the compiler's text and neffcache's note),
``path``, ``model``, ``team`` and ``toolchain``. ``GET /v1/failures`` groups the events of a
window at query time with the library's own functions (:mod:`neffcache.failure_groups`), so
a signature here is the one ``neffcache failures`` computes from a store's failure logs. No
table, no migration: the query reads the newest :data:`MAX_EVENTS` error events of the window
(``ix_events_kind_ts`` serves it) and says when it stopped there (``truncated``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from neffcache.events import EventKind
from neffcache.failure_groups import SeenIn, group_sightings, sighting, version_of_label
from neffcache.server.storage.models import Event

MAX_EVENTS = 10_000  # error events one query groups, newest first


class FailureGroupOut(BaseModel):
    """One signature's group, as :meth:`neffcache.failure_groups.FailureGroup.to_json` writes it."""

    model_config = ConfigDict(populate_by_name=True)

    signature: str
    failure_class: str = Field(alias="class")  # compiler | environment | storage
    cause: str
    pattern: str
    graphs: int
    occurrences: int
    first_seen: float
    last_seen: float
    compiler_versions: list[str]
    models: list[str]
    teams: list[str]
    sources: list[str]
    paths: list[str]
    sample: dict[str, Any]


class FailuresOut(BaseModel):
    start: float
    end: float
    events: int  # error events grouped
    truncated: bool  # more error events in the window than MAX_EVENTS: the oldest were left out
    groups: list[FailureGroupOut]


@dataclass(frozen=True)
class FailuresQuery:
    start: float
    end: float
    top: int = 100
    max_events: int = MAX_EVENTS


def failure_groups(session: Session, query: FailuresQuery) -> FailuresOut:
    """The error events of ``[start, end)`` grouped by signature, the ``top`` largest groups."""
    rows = session.execute(
        select(Event.ts, Event.path, Event.toolchain, Event.model, Event.team, Event.store, Event.message)
        .where(Event.kind == EventKind.ERROR, Event.ts >= query.start, Event.ts < query.end)
        .order_by(Event.ts.desc()).limit(query.max_events + 1)
    ).all()
    truncated = len(rows) > query.max_events
    sightings = [sighting(message or "", seen=float(ts), path=path, source=SeenIn.INDEX,
                          compiler_version=version_of_label(toolchain), model=model, team=team, store=store)
                 for ts, path, toolchain, model, team, store, message in rows[:query.max_events]]
    groups = group_sightings(sightings)[:query.top]
    return FailuresOut(start=query.start, end=query.end, events=len(sightings), truncated=truncated,
                       groups=[FailureGroupOut.model_validate(g.to_json()) for g in groups])
