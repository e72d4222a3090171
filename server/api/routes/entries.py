"""/v1/entries: register on publish, look up by path (one or many), list with filters, the
entries near a graph, compile samples, forget a location.

Order matters: ``GET /v1/entries/{path:path}`` matches any path, so the fixed routes
(``/similar``, ``/compile-samples``) are declared before it. No entry can be registered at
those one-component paths (``RESERVED_PATHS`` in services/records.py).
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Query, Response, status
from fastapi.concurrency import run_in_threadpool
from pydantic import StringConstraints

from neffcache.index.records import SAMPLE_TARGETS
from neffcache.server.api.deps import ReadAccess, WriteAccess
from neffcache.server.api.responses import FastJSONResponse
from neffcache.server.api.routes.common import AUTH_ERRORS, WRITE_ERRORS, QText, checked_path, not_found
from neffcache.server.api.schemas import MAX_BATCH, Problem, RegisterResult
from neffcache.server.services import catalog, lookups
from neffcache.server.services.records import (
    CompileSamples,
    EntryIn,
    EntryOut,
    EntryPage,
    ForgetResult,
    LookupRequest,
    LookupResult,
    SimilarEntries,
    State,
)
from neffcache.server.storage.db import Database

router = APIRouter(prefix="/v1/entries", tags=["entries"])
TagFilter = Annotated[str, StringConstraints(max_length=330, pattern=r"^[A-Za-z0-9_.-]{1,64}=[^\x00-\x1f\x7f]{0,256}$")]
Digest = Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$", description="the HLO's sha256")]
Model = Annotated[str | None, Query(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$",
                                    description="the value of the entries' model tag")]
Target = Annotated[str, Query(pattern="^(" + "|".join(map(re.escape, SAMPLE_TARGETS)) + ")$",
                              description=f"a compile target: {', '.join(SAMPLE_TARGETS)}")]


@router.post("", name="entries.register", summary="Register published entries", responses=WRITE_ERRORS)
def register_entries(
    records: Annotated[list[EntryIn], Body(max_length=MAX_BATCH)], access: WriteAccess
) -> RegisterResult:
    """Register (or update) entries a client published; the store URL becomes one of its locations.

    Idempotent: registering the same entry again from the same store changes nothing but
    ``updated``; from another store it adds a location. The record is the registering token's:
    another token may add its own location only by claiming the same bytes (state, size,
    digest), and a token with prefixes registers only inside them; else 403, naming the items.
    """
    now = time.time()
    writer = access.writer
    return RegisterResult(registered=access.db.transact(lambda s: catalog.register_entries(s, records, now, writer)))


@router.get("", name="entries.list", summary="List entries", responses=AUTH_ERRORS)
def list_entries(
    access: ReadAccess,
    key: QText = None,
    namespace: QText = None,
    toolchain: Annotated[str | None, Query(max_length=256, pattern=r"^[^\x00-\x1f\x7f]*$",
                                           description="label, e.g. trn2-lnc2/neuronxcc-2.27.5334.0+f702b353")]
    = None,
    compiler_version: QText = None,
    target: QText = None,
    lnc: Annotated[int | None, Query(ge=1, le=2)] = None,
    state: Annotated[list[State] | None, Query(description="repeat for several states")] = None,
    store: QText = None,
    tag: Annotated[list[TagFilter] | None, Query(description="name=value; repeat to require several")] = None,
    unused_since: Annotated[float | None, Query(ge=0, le=1e11, allow_inf_nan=False,
                                                description="only entries not hit since this epoch time")]
    = None,
    writer: Annotated[str | None, Query(max_length=64, pattern=r"^[^\x00-\x1f\x7f]*$",
                                        description="only entries whose record this token registered")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[int | None, Query(ge=0, le=2**62)] = None,
) -> EntryPage:
    """List entries, oldest registration first, one page at a time (follow ``next_cursor``)."""
    where = catalog.EntryFilter(
        key=key, namespace=namespace, toolchain=toolchain, compiler_version=compiler_version, target=target,
        lnc=lnc, states=tuple(state or ()), store=store,
        tags=dict(item.split("=", 1) for item in (tag or [])), unused_since=unused_since, writer=writer,
    )
    with access.db.read() as session:
        return catalog.list_entries(session, where, limit=limit, cursor=cursor)


@router.post("/lookup", name="entries.lookup_many", summary="Look up many entries", response_model=LookupResult,
             responses=WRITE_ERRORS)  # WRITE_ERRORS for its 413: the scope needed is read
async def lookup_many(asked: LookupRequest, access: ReadAccess) -> Response:
    """Many entries by path in one round trip (``plan``: every graph a job will look up), each
    with the stores that hold it; the paths the index has no entry for are listed in ``missing``.
    Each path is checked like a single lookup's (a bad one is a 422 naming it), and a request
    carries at most 10,000 of them (the client splits longer lists). Needs read scope."""
    answer = await run_in_threadpool(lookups.lookup_many, access.db, asked.paths)
    # The entries' stored JSON as it is (services/rendering.py): the declared model documents it.
    return Response(answer.body(), media_type="application/json")


@router.get("/similar", name="entries.similar", summary="Entries near a graph", response_model=SimilarEntries,
            responses=AUTH_ERRORS)
async def similar_entries(access: ReadAccess, hlo_sha256: Digest = None, model: Model = None,
                          limit: Annotated[int, Query(ge=1, le=lookups.MAX_SIMILAR)] = 50) -> FastJSONResponse:
    """Entries that share a graph's HLO digest, or carry its ``model`` tag (give one or both),
    newest first: what ``why-miss`` compares a missed graph with, across every store."""
    if hlo_sha256 is None and model is None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "give hlo_sha256, model, or both")

    def ask(db: Database) -> list[dict[str, Any]]:
        with db.read() as session:
            return lookups.similar(session.connection(), hlo_sha256=hlo_sha256, model=model, limit=limit)

    return FastJSONResponse({"entries": await run_in_threadpool(ask, access.db)})


@router.get("/compile-samples", name="entries.compile_samples", summary="Compile times by HLO size",
            responses=AUTH_ERRORS)
async def compile_samples(access: ReadAccess, target: Target,
                          limit: Annotated[int, Query(ge=1, le=lookups.MAX_SAMPLES)] = 1000) -> CompileSamples:
    """The newest SUCCESS entries of ``target`` that recorded both their HLO size and their
    compile time, newest first: the points a forecast of a miss's compile time fits on."""

    def ask(db: Database) -> list[dict[str, Any]]:
        with db.read() as session:
            return lookups.compile_samples(session.connection(), target, limit)

    return CompileSamples.model_validate({"samples": await run_in_threadpool(ask, access.db)})


@router.get("/{path:path}", name="entries.lookup", summary="Look up one entry", response_model=EntryOut,
            responses={**AUTH_ERRORS, 404: {"model": Problem, "description": "no such entry"}})
async def lookup_entry(path: str, access: ReadAccess) -> FastJSONResponse:
    """One entry by its store-relative path, with the stores that hold it and its usage stamps."""
    clean = checked_path(path)
    db = access.db
    found = _lookup(db, clean) if db.inline_reads else await run_in_threadpool(_lookup, db, clean)
    if found is None:
        raise not_found(f"entry {clean!r}")
    # Built straight from the row (the hot path): the declared response_model documents the shape.
    return FastJSONResponse(found)


def _lookup(db: Database, path: str) -> dict[str, Any] | None:
    with db.single_read() as conn:
        found: dict[str, Any] | None = catalog.lookup_entry(conn, path)
    return found


@router.delete("/{path:path}", name="entries.forget", summary="Forget a store's copy of an entry",
               responses={**AUTH_ERRORS, 404: {"model": Problem, "description": "no such entry"}})
def forget_entry(
    path: str,
    access: WriteAccess,
    store: Annotated[str | None, Query(min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+$",
                                       description="remove only this store's copy")] = None,
) -> ForgetResult:
    """Forget that ``store`` holds the entry (all stores if omitted); the entry record goes with
    its last location. Prune calls this after deleting the files. A location another token
    added is its own to forget (403)."""
    clean = checked_path(path)
    writer = access.writer
    result = access.db.transact(lambda s: catalog.forget_entry(s, clean, store, writer))
    if result is None:
        raise not_found(f"entry {clean!r}")
    if result.removed_stores == 0 and store is not None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"store {store!r} does not hold entry {clean!r}")
    return result
