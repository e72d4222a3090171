"""/v1/events: batches of hit/miss/compile/evict/error events, idempotent by event id."""

from __future__ import annotations

import random
import time
from typing import Annotated

from fastapi import APIRouter, Body

from neffcache.server.api.deps import WriteAccess
from neffcache.server.api.routes.common import WRITE_ERRORS
from neffcache.server.api.schemas import MAX_BATCH, IngestResult
from neffcache.server.services import events as event_log
from neffcache.server.services.records import EventIn

router = APIRouter(prefix="/v1/events", tags=["events"])


@router.post("", name="events.ingest", summary="Ingest a batch of events", responses=WRITE_ERRORS)
def ingest_events(
    events: Annotated[list[EventIn], Body(max_length=MAX_BATCH)], access: WriteAccess
) -> IngestResult:
    """Store a batch of events. Each event carries a client-generated ``id``; an id seen before is
    skipped and counted in ``duplicates``, so a client may resend a batch as often as it likes.

    Events are the token's: a token with a team reports for it (an event naming none gets it),
    one without may not name a team a token is bound to, a token with prefixes reports only
    inside them, and an ``evict`` removes only a location the token added; else 403, naming the
    refused events (nothing of the batch is stored)."""
    now = time.time()
    retention = access.state.settings.event_retention_days * 86400
    horizon = now - retention if retention else None
    writer = access.writer
    outcome = access.db.transact(lambda s: event_log.ingest_events(s, events, now, writer, horizon))
    if horizon is not None and random.random() < 0.01:  # now and then, in bounded steps
        access.db.transact(lambda s: event_log.sweep_events(s, horizon))
    metrics = access.state.metrics.ingested
    metrics.labels("accepted").inc(outcome.accepted)
    metrics.labels("duplicate").inc(outcome.duplicates)
    metrics.labels("expired").inc(outcome.expired)
    return IngestResult(accepted=outcome.accepted, duplicates=outcome.duplicates, expired=outcome.expired)
