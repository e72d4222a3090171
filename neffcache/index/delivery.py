"""Sending report batches to the index: what a refusal of a batch means, and the spool's round.

A batch the index refuses for a reason that can change (down, overloaded, a token or deployment
problem) is kept to be sent again; one it refuses as invalid is set aside (:class:`Rejected`),
and when the server names the invalid items only those are, the rest of the batch is sent. A
403 that names items is of the second kind: the token may write, but not those (another
token's entry, another team, outside its prefixes), and sending them again cannot change that,
while keeping them would hold every later batch behind them.
:func:`deliver_spooled` sends the spooled batches oldest first and stops at the first sign the
index cannot take them; :class:`~neffcache.index.client.IndexClient` decides when to call it
and what the outcome means for its cool-down.
"""

from __future__ import annotations

import logging
from typing import Any

from neffcache.errors import IndexServerError
from neffcache.index.queries import RETRY_STATUS, ErrorBody, IndexQueries
from neffcache.index.spool import Spool

log = logging.getLogger(__name__)
KEEP_STATUS = frozenset({401, 403, 404, 405, 408, 409})  # config or deployment problems: keep, retry later
_PATHS = {"entries": "/v1/entries", "events": "/v1/events"}
# Entry fields a server older than this client may not know (it forbids unknown fields): a batch
# refused for them alone is sent again without them, so clients can be upgraded before servers.
NEWER_ENTRY_FIELDS = frozenset({"hlo_sha256", "hlo_size", "flags"})


class Rejected(Exception):
    """The index refused a batch as invalid: ``items`` are the refused ones (None: all)."""

    def __init__(self, message: str, items: list[dict[str, Any]] | None) -> None:
        super().__init__(message)
        self.items = items


def send_batch(queries: IndexQueries, kind: str, items: list[dict[str, Any]], counts: dict[str, int],
               attempts: int | None) -> None:
    """POST one batch of ``kind`` ("events" or "entries"), adding what the index took to ``counts``."""
    try:
        body = queries.request("POST", _PATHS[kind], json=items, attempts=attempts)
    except IndexServerError as exc:
        if exc.status is None or exc.status in RETRY_STATUS or exc.status >= 500:
            raise
        if exc.status in KEEP_STATUS and not (exc.status == 403 and _bad_indexes(exc, len(items))):
            raise
        if kind == "entries" and _refused_newer_fields(exc):
            older = [{k: v for k, v in item.items() if k not in NEWER_ENTRY_FIELDS} for item in items]
            send_batch(queries, kind, older, counts, attempts)  # refused again only for other reasons
            return
        bad = _bad_indexes(exc, len(items))
        if not bad or len(bad) == len(items):
            raise Rejected(str(exc), None) from None
        # Drop only the items the server named as invalid; the rest of the batch is good.
        good = [item for i, item in enumerate(items) if i not in bad]
        send_batch(queries, kind, good, counts, attempts)
        raise Rejected(str(exc), [items[i] for i in sorted(bad)]) from None
    if kind == "events":
        counts["events"] += int(body.get("accepted", 0))
        counts["duplicates"] += int(body.get("duplicates", 0))
    else:
        counts["entries"] += int(body.get("registered", 0))


def deliver_spooled(spool: Spool, queries: IndexQueries, counts: dict[str, int],
                    attempts: int | None) -> IndexServerError | None:
    """Send every spooled batch, oldest first, counting into ``counts``; returns the error that
    stopped the round (the index is down or refuses the token), None when the spool was emptied."""
    spool.recover_stale()
    for path in spool.pending():
        claimed = spool.claim(path)
        if claimed is None:
            continue
        batch = spool.read(claimed)
        if batch is None:
            counts["rejected"] += 1
            continue
        try:
            send_batch(queries, batch.kind, batch.items, counts, attempts)
        except Rejected as exc:
            log.warning("index refused a spooled %s batch (%s); kept in %s", batch.kind, exc, spool.rejected_dir)
            spool.reject(claimed, str(exc), exc.items)
            counts["rejected"] += 1
            continue
        except IndexServerError as exc:
            spool.unclaim(claimed)
            return exc
        spool.done(claimed)
    return None


def _errors(exc: IndexServerError) -> list[dict[str, Any]]:
    """The server's structured validation errors of a refusal (``{"loc", "msg", "type"}`` each)."""
    cause = exc.__cause__
    body = cause.body if isinstance(cause, ErrorBody) else None
    errors = body.get("errors") if isinstance(body, dict) else None
    return [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []


def _refused_newer_fields(exc: IndexServerError) -> bool:
    """Whether the server refused one of :data:`NEWER_ENTRY_FIELDS` as unknown (then it knows
    none of them; whatever else it found wrong it says again when they are gone)."""
    return any(error.get("type") == "extra_forbidden" and isinstance(loc := error.get("loc"), list)
               and len(loc) == 3 and loc[2] in NEWER_ENTRY_FIELDS for error in _errors(exc))


def _bad_indexes(exc: IndexServerError, count: int) -> set[int]:
    bad: set[int] = set()
    for error in _errors(exc):
        loc = error.get("loc") or []
        if len(loc) >= 2 and loc[0] == "body" and isinstance(loc[1], int) and 0 <= loc[1] < count:
            bad.add(loc[1])
    return bad
