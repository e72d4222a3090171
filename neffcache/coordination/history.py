"""The action journal: who removed or quarantined what, when and why (``prune --history``).

Every destructive action neffcache takes on a store — a prune's removals, ``verify --fix``'s
quarantines, a tier's quarantine of an entry that failed its digests on a pull — leaves a
record in the store's own control directory, so a mistake can be seen afterwards::

    .neffcache/history/20250611T101502.123456Z-prune-3f9c1a2b7d0e4c11-1.json

One object per record, written whole through the store's ``put_file`` (an append that works
the same on a directory, a shared mount and S3, where objects cannot be appended to). The name
starts with the UTC time, so a listing sorts newest-last and ``--since`` filters on names
without reading bodies. A record holds at most :data:`MAX_ITEMS` paths; a larger action is
split into parts ``-1``, ``-2``... of one action id, merged again when read.

No record holds a secret: the command line, ``why`` and details go through
:mod:`neffcache.redaction` when written and again when read (older records). On a local or
shared directory a record is created 0o640 filtered by the umask (``PRIVATE_DIRS`` in
:mod:`neffcache.stores.base`): never group-writable, so a co-tenant cannot rewrite who removed
what, and never world-readable.

The journal is neffcache's control data: the scan counts it as control files, prune never
removes it except by its own retention (:data:`HISTORY_DAYS`, with ``prune --garbage``).
"""

from __future__ import annotations

import calendar
import getpass
import json
import logging
import os
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neffcache.entry import FileInfo
from neffcache.errors import EntryNotFound, NeffcacheError
from neffcache.redaction import redact_argv, redact_text
from neffcache.stores.base import CONTROL_DIR, Store

log = logging.getLogger(__name__)
HISTORY_DIR = f"{CONTROL_DIR}/history"
HISTORY_DAYS = 365.0  # records older than this go with `prune --garbage` (reason history-expired)
MAX_ITEMS = 500  # paths per record: bounds a record to ~0.5 MB whatever the action's size
MAX_RECORD_BYTES = 4 << 20  # a record larger than this is not ours (or crafted): skipped when read
MAX_COMMAND = 2000  # characters of the command line kept
_STAMP = "%Y%m%dT%H%M%S"


@dataclass(frozen=True)
class ActionItem:
    path: str
    reason: str
    bytes: int = 0
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "reason": self.reason, "bytes": self.bytes, "detail": self.detail}


@dataclass(frozen=True)
class Action:
    """One destructive action on one store."""

    kind: str  # prune, quarantine
    store: str
    why: str  # the policy or the cause, for people
    items: tuple[ActionItem, ...] = ()
    at: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    who: str = ""  # user@host
    pid: int = 0
    command: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)  # plan id, policy, ...
    counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # reason -> items, bytes

    @property
    def bytes(self) -> int:
        return sum(c.get("bytes", 0) for c in self.counts.values())

    @property
    def total(self) -> int:
        return sum(c.get("items", 0) for c in self.counts.values())

    def to_json(self, *, items: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "store": self.store, "at": self.at,
                               "who": self.who, "pid": self.pid, "command": self.command, "why": self.why,
                               "items_total": self.total, "bytes": self.bytes,
                               "counts": {k: dict(v) for k, v in self.counts.items()},
                               "details": dict(self.details)}
        if items:
            out["items"] = [i.to_json() for i in self.items]
        return out


def who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command line as a journal keeps it: secrets redacted (neffcache/redaction.py)."""
    args = list(sys.argv if argv is None else argv)
    if args:
        args[0] = os.path.basename(args[0])
        if args[0] in ("__main__.py", "main.py"):
            args[0] = "neffcache"
    return shlex.join(redact_argv(args))[:MAX_COMMAND]


def _redacted(value: Any) -> Any:
    """``value`` (a record's details) with every string in it redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {str(k): _redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v) for v in value]
    return value


def tally(items: Iterable[ActionItem]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for item in items:
        slot = out.setdefault(item.reason, {"items": 0, "bytes": 0})
        slot["items"] += 1
        slot["bytes"] += item.bytes
    return out


def record(store: Store, kind: str, why: str, items: Sequence[ActionItem], *, details: Mapping[str, Any] | None = None,
           command: str | None = None, at: float | None = None) -> Action:
    """Write the record of an action just taken on ``store``; returns it.

    A record that cannot be written is logged, never raised: the action is done already, and
    refusing to report it would not undo it.
    """
    action = Action(kind=kind, store=store.url, why=redact_text(why), items=tuple(items),
                    at=time.time() if at is None else at, who=who(), pid=os.getpid(),
                    command=command_line() if command is None else redact_text(command)[:MAX_COMMAND],
                    details=_redacted(dict(details or {})), counts=tally(items))
    chunks = [action.items[i:i + MAX_ITEMS] for i in range(0, len(action.items), MAX_ITEMS)] or [()]
    stamp = time.strftime(_STAMP, time.gmtime(action.at)) + f".{int(action.at % 1 * 1e6):06d}Z"
    for part, chunk in enumerate(chunks, 1):
        body = action.to_json(items=False) | {"part": part, "parts": len(chunks),
                                              "items": [i.to_json() for i in chunk]}
        path = f"{HISTORY_DIR}/{stamp}-{kind}-{action.id}-{part}.json"
        try:
            store.put_file(path, json.dumps(body, sort_keys=True).encode())
        except (NeffcacheError, OSError) as exc:
            log.warning("cannot record the %s action in %s: %s", kind, store.url, exc)
            break
    return action


def record_time(path: str) -> float | None:
    """The UTC time a record's name starts with, or None for a name that is not a record's."""
    name = path.rsplit("/", 1)[-1]
    try:
        return calendar.timegm(time.strptime(name[:15], _STAMP)) + float("0" + name[15:22])
    except ValueError:
        return None


def record_files(store: Store) -> list[tuple[float, FileInfo]]:
    """(time, file) of every record, oldest first."""
    out = []
    for info in store.iter_files(HISTORY_DIR):
        at = record_time(info.path)
        if at is not None and info.path.endswith(".json"):
            out.append((at, info))
    return sorted(out, key=lambda t: (t[0], t[1].path))


def _parse(raw: bytes) -> tuple[Action, int, int] | None:
    try:
        data = json.loads(raw)
        items = tuple(ActionItem(str(i["path"]), str(i["reason"]), int(i.get("bytes") or 0),
                                 str(i.get("detail") or "")) for i in data.get("items") or ())
        counts = {str(k): {"items": int(v["items"]), "bytes": int(v["bytes"])}
                  for k, v in (data.get("counts") or {}).items()}
        # Records written before redaction existed (or by anyone else) are redacted as read.
        action = Action(kind=str(data["kind"]), store=str(data["store"]), why=redact_text(str(data.get("why") or "")),
                        items=items, at=float(data["at"]), id=str(data["id"]), who=str(data.get("who") or ""),
                        pid=int(data.get("pid") or 0), command=redact_text(str(data.get("command") or "")),
                        details=_redacted(dict(data.get("details") or {})), counts=counts)
        return action, int(data.get("part") or 1), int(data.get("parts") or 1)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def read_history(store: Store, *, since: float | None = None, warnings: list[str] | None = None) -> list[Action]:
    """The store's actions since ``since`` (epoch seconds), newest first, parts merged."""
    parts: dict[str, list[tuple[int, Action]]] = {}
    for at, info in record_files(store):
        if since is not None and at < since:
            continue
        if info.size > MAX_RECORD_BYTES:
            if warnings is not None:
                warnings.append(f"{store.url}: {info.path}: {info.size} bytes, too large for a record: skipped")
            continue
        try:
            got = _parse(store.read_bytes(info.path))
        except (EntryNotFound, FileNotFoundError):
            continue
        except (NeffcacheError, OSError) as exc:
            if warnings is not None:
                warnings.append(f"{store.url}: {info.path}: {exc}")
            continue
        if got is None:
            if warnings is not None:
                warnings.append(f"{store.url}: {info.path}: not a readable action record: skipped")
            continue
        action, part, _ = got
        parts.setdefault(action.id, []).append((part, action))
    merged = []
    for pieces in parts.values():
        pieces.sort(key=lambda p: p[0])
        first = pieces[0][1]
        items = tuple(i for _, a in pieces for i in a.items)
        merged.append(Action(kind=first.kind, store=first.store, why=first.why, items=items, at=first.at, id=first.id,
                             who=first.who, pid=first.pid, command=first.command, details=first.details,
                             counts=first.counts))
    return sorted(merged, key=lambda a: a.at, reverse=True)


def expired_records(store: Store, now: float, days: float = HISTORY_DAYS) -> list[FileInfo]:
    """Records older than the journal's retention."""
    cutoff = now - days * 86400
    return [info for at, info in record_files(store) if at < cutoff]
