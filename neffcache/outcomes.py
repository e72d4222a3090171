"""The one vocabulary of what the library's operations did: publish, transfer, tier problems.

Each result the library hands back names its outcome with a member of one of these enums,
never a bare string, so a caller dispatches on ``is`` and a typo is an AttributeError at the
call site instead of a branch that silently never runs. They are StrEnums (:class:`enum.StrEnum`)
whose values are the strings the reports printed before the enums existed: a member *is* its
string (``TransferOutcome.COPIED == "copied"``, ``json.dumps`` writes ``"copied"``), so JSON
output, log lines and scripts reading them are unchanged.

A value module: no I/O, imports nothing of neffcache, so every layer may name an outcome.

The warm-ups' vocabulary (a compile's status, a group's status with its severity order, a
failure's kind) lives in :mod:`neffcache.warmers.report`, not here: the library never
produces or reads those outcomes, only the warmers do, and the values layer holds what the
library itself returns. Those are StrEnums on the same terms.
"""

from __future__ import annotations

import enum


class PublishStatus(enum.StrEnum):
    """How :func:`neffcache.operations.publish.publish` ended. Every status is a success for the
    caller's purpose except BUSY, which means "not there yet, look again"."""

    PUBLISHED = "published"
    EXISTS = "exists"  # someone else's healthy entry is there: losing the race is success
    BUSY = "busy"  # another publisher or a compiling runtime holds it right now


class TransferOutcome(enum.StrEnum):
    """What a sync (push or pull) did with one source entry.

    COPIED, SKIPPED, FAILED and FILTERED are final and counted in the report. BUSY (another
    publisher held the entry) is retried until the sync's ``busy_wait`` ends, then counted as
    FAILED; CANCELLED (the sync was stopping before the copy began) is not counted at all.
    """

    COPIED = "copied"
    SKIPPED = "skipped"  # the destination has it, or it cannot be copied
    FAILED = "failed"
    FILTERED = "filtered"  # left out by the filters (tags are only known once the manifest is read)
    BUSY = "busy"
    CANCELLED = "cancelled"


class TierOp(enum.StrEnum):
    """The operation of a tier chain during which a tier failed."""

    OPEN = "open"
    GET = "get"
    PROMOTE = "promote"
    PUBLISH = "publish"
    PREFETCH = "prefetch"
    PUSH = "push"


class TierProblemKind(enum.StrEnum):
    """What went wrong with a tier. Only DOWN takes the tier out of the chain for a while: a
    CORRUPT copy is never served, CHANGED and BUSY are a miss for now, and none of those three
    says anything about the tier's health."""

    DOWN = "down"  # unreachable or failing: skipped for ``down_for`` seconds
    CORRUPT = "corrupt"  # digests did not match
    CHANGED = "changed"  # rewritten while it was read
    BUSY = "busy"  # another process is publishing it
    REFUSED = "refused"  # the reader's trust policy refuses it, or its flags contradict its namespace
