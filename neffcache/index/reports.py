"""What became of a client's reports and of a flush: the outcomes a command prints at its end.

Values only (no I/O): the client fills them, the CLI renders them.
"""

from __future__ import annotations

from dataclasses import dataclass

from neffcache.errors import IndexServerError


@dataclass(frozen=True)
class ReportCounts:
    """What became of the reports (entry records and events) handed to one client, so a command
    can say what it delivered instead of what it meant to.

    ``reported`` = ``spooled`` + ``sent_direct`` + ``lost`` + ``buffered``. ``delivered`` counts
    what the index confirmed from this process (spooled batches of earlier processes included).

    A spool that cannot be written (disk full, a read-only or unwritable directory) is *not* a
    command failure: the cache data the command moved is intact, and what the index lacks
    ``neffcache reconcile --yes`` restores from the stores. Failing the command would invite a
    rerun that changes nothing. It is reported instead: ``spool_error`` and ``lost``, which the
    CLI prints as a warning line and puts in its JSON. Reports are first sent straight to the
    index when the spool refuses them, so only an unwritable spool *and* an unreachable index
    lose anything.
    """

    reported: int = 0
    spooled: int = 0  # written to the spool: delivered from there, now or by a later `flush`
    sent_direct: int = 0  # delivered without the spool, because it could not be written
    lost: int = 0  # neither: dropped (the spool refused them and the index could not take them)
    buffered: int = 0  # still in memory (a client not closed yet)
    delivered: int = 0
    spool_error: str | None = None
    # Reports waiting in this index's spool now (this process's and earlier ones'), and why the
    # last delivery failed: what the command announces at its end (`neffcache flush` delivers).
    waiting: int = 0
    waiting_batches: int = 0
    problem: str | None = None
    token_refused: bool = False  # 401/403: a configuration error, not an outage

    def to_json(self) -> dict[str, object]:
        return {"reported": self.reported, "spooled": self.spooled, "sent_direct": self.sent_direct,
                "lost": self.lost, "delivered": self.delivered, "spool_error": self.spool_error,
                "waiting": self.waiting, "waiting_batches": self.waiting_batches, "problem": self.problem,
                "token_refused": self.token_refused}


def describe_failure(exc: IndexServerError) -> str:
    """Why a delivery failed, in a few words a command's last line can carry (never the token)."""
    status = exc.status
    if status is None:
        cause = exc.__cause__
        text = str(cause) if cause is not None and str(cause) else str(exc)
        if text.startswith("[Errno") and "] " in text:
            text = text.split("] ", 1)[1]  # "[Errno 111] Connection refused" -> "connection refused"
        return f"index unreachable: {text[:1].lower()}{text[1:200]}"
    if status == 401:
        return "the index refused the token (401): set a valid --token or NEFFCACHE_TOKEN"
    if status == 403:
        return "the token may not write to the index (403): use a token with write scope"
    if status >= 500:
        return f"index server error ({status})"
    if status in (404, 405):
        return f"the index URL answered {status}: is it a neffcache index server?"
    return f"the index answered {status}"


@dataclass(frozen=True)
class FlushReport:
    delivered_events: int = 0
    duplicate_events: int = 0
    delivered_entries: int = 0
    rejected: int = 0
    pending_batches: int = 0
    error: str | None = None
