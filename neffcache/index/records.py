"""What the library sends to the index: events and entry records.

An event id is generated on the client, once, when the event happens; the server stores each id
once, so the spool may resend a batch after any failure without counting anything twice.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from neffcache.entry import Entry
from neffcache.events import EventKind
from neffcache.instances import TARGETS
from neffcache.layouts import get_layout
from neffcache.manifest import MAX_FLAG_LEN, MAX_FLAGS, Manifest
from neffcache.toolchain import Toolchain

# The most paths one batch lookup (POST /v1/entries/lookup) may carry; the client splits longer lists.
MAX_LOOKUP_BATCH = 10_000
# ...and the most bytes of paths it puts in one request: well below the server's default body limit
# (4 MiB), which 10,000 paths of the longest allowed length (1,024 characters) would exceed.
MAX_LOOKUP_BYTES = 1 << 20
# An entry's user flags as the index keeps them: the manifest's bounds (one home: neffcache.manifest).
MAX_RECORD_FLAGS, MAX_RECORD_FLAG_LEN = MAX_FLAGS, MAX_FLAG_LEN
# The compile targets compile_samples may ask about: the instance catalog's (the server has no catalog).
SAMPLE_TARGETS: tuple[str, ...] = TARGETS
# Where an event comes from: a job's own traffic, or a warm-up compiling ahead of demand. A hit
# rate is the jobs' (a warm-up's compiles are its purpose, not misses anybody waited for). The
# compiling commands send their name as the event's ``job`` (cli/jobs.py): warm and plan --warm
# are warm-ups, rewarm recompiles for a new compiler; everything else (run, a library caller,
# prune's evictions) is "job". The index server reads the source from ``job`` with
# :func:`event_source`, so events of every client release, spooled ones too, are told apart.
EventSource = Literal["job", "warm", "rewarm"]
EVENT_SOURCES: tuple[EventSource, ...] = ("job", "warm", "rewarm")
WARM_UP_JOBS: Mapping[str, EventSource] = {"warm": "warm", "plan": "warm", "rewarm": "rewarm"}


# A size budget's evict event says so in its message, and by which policy it chose:
# ``prune (size, value): ...``. The index counts a later miss of that path as a regretted eviction
# (server/services/regret.py); an eviction for another reason (age, superseded) regrets nothing.
# A client of before the policy field wrote ``prune (size): ...`` and said "least recently
# used" when that was the policy.
BUDGET_REASON = "size"
# The policies a budget evicts by (neffcache.prune.value.Retention); a message naming another
# counts as "other", so no client can make the index export a series per made-up name.
BUDGET_POLICIES: tuple[str, ...] = ("value", "lru")
_BUDGET_MESSAGE = re.compile(r"^prune \(size(?:, ([a-z][a-z0-9-]{0,15}))?\): ")


def eviction_message(reason: str, policy: str | None, detail: str) -> str:
    """The message of prune's evict event: its reason, the budget's policy, and why."""
    return f"prune ({reason}{f', {policy}' if policy else ''}): {detail}"


def budget_policy(message: str | None) -> str | None:
    """The policy a budget evicted by, from an evict event's message; None when no budget did."""
    found = _BUDGET_MESSAGE.match(message or "")
    if found is None:
        return None
    if found.group(1):
        return found.group(1) if found.group(1) in BUDGET_POLICIES else "other"
    return "lru" if "least recently used" in (message or "") else "value"


# How far back the index's read endpoints look (/v1/stats, /v1/failures): a whole number of 1 to
# 6 digits and a unit (s, m, h, d, w; none is seconds). The server's query check and the CLI's
# (:func:`check_window`, before any request) are this one pattern.
WINDOW_PATTERN = r"^[1-9][0-9]{0,5}[smhdw]?$"


def check_window(text: str) -> str:
    """``text`` when the index takes it as a window; else ValueError saying what it takes."""
    if re.fullmatch(WINDOW_PATTERN, text) is None:
        raise ValueError(f"{text!r} is not a window: a whole number and a unit, s, m, h, d or w (24h, 7d, 2w, "
                         "90m; a bare number is seconds)")
    return text


def event_source(job: str) -> EventSource:
    """The source of an event sent with ``job``: a warm-up's (:data:`WARM_UP_JOBS`) or "job"."""
    return WARM_UP_JOBS.get(job, "job")


def new_event_id() -> str:
    """A unique event id that sorts by when it was made: 16 hex digits of the clock in
    nanoseconds, then 16 of randomness (two ids made in the same nanosecond are equal with a
    chance of 2**-64). The index keeps a unique B-tree of event ids: a
    random id (a UUID4) lands each insert on its own page of it, so a batch of 500 dirtied
    ~500 pages; ids made in time order land at its end (docs/index-server.md#performance)."""
    return f"{time.time_ns():016x}{secrets.token_hex(8)}"


def new_owner() -> str:
    """A lease owner id: host:pid:random, unique per process and client."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ToolchainRecord(TypedDict):
    compiler_version: str
    target: str
    lnc: int


class EntryRecord(TypedDict, total=False):
    """An entry as registered on publish. ``path`` is its identity within a store."""

    path: str
    layout: str  # a name in neffcache.layouts.LAYOUTS
    key: str
    namespace: str
    toolchain: ToolchainRecord | None
    state: Literal["SUCCESS", "FAILED", "LOCKED", "EMPTY", "CORRUPT"]
    size: int
    neff_sha256: str | None
    store: str
    tags: dict[str, str]
    created: float
    producer: str
    compile_seconds: float | None
    # The graph's inputs, for why-miss and compile forecasts; None where unknown (no manifest).
    hlo_sha256: str | None
    hlo_size: int | None
    flags: list[str] | None


def entry_record(entry: Entry, store_url: str, manifest: Manifest | None = None) -> EntryRecord:
    """What a publisher registers for ``entry`` held by ``store_url`` (``manifest``: the entry's
    own, when the caller has it; without one, sizes and times come from the listing)."""
    manifest = manifest or entry.manifest
    tc = entry.toolchain
    names = get_layout(entry.layout).names(entry.namespace, entry.key)
    neff = manifest.files.get(names.neff) if manifest and names.neff else None
    hlo = manifest.files.get(names.hlo) if manifest and names.hlo else None
    listed_hlo = entry.files.get(names.hlo) if names.hlo else None  # without a manifest: its size only
    if manifest is not None:
        created = manifest.created
    else:  # the commit marker's time: when the entry became visible
        marker = entry.files.get(entry.marker_name)
        created = marker.mtime if marker is not None else entry.mtime
    return {
        "path": entry.path, "layout": entry.layout,
        "key": entry.key, "namespace": entry.namespace.path,
        "toolchain": {"compiler_version": tc.compiler_version, "target": tc.target, "lnc": tc.lnc} if tc else None,
        "state": entry.state.value,
        "size": manifest.size if manifest else entry.size,
        "neff_sha256": neff.sha256 if neff else None, "store": store_url,
        "tags": dict(manifest.tags) if manifest else {},
        "created": created,
        "producer": manifest.producer if manifest else "",
        "compile_seconds": manifest.compile_seconds if manifest else None,
        "hlo_sha256": hlo.sha256 if hlo else None,
        "hlo_size": hlo.size if hlo else (listed_hlo.size if listed_hlo else None),
        "flags": list(manifest.flags) if manifest else None,
    }


def toolchain_json(toolchain: Toolchain | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if toolchain is None:
        return None
    if isinstance(toolchain, Toolchain):
        return toolchain.to_json()
    return {"compiler_version": toolchain["compiler_version"], "target": toolchain["target"],
            "lnc": int(toolchain["lnc"])}


@dataclass(frozen=True)
class Event:
    """A cache event. ``compile_seconds``: for a compile, the seconds it took; for a hit, the
    seconds the hit saved (leave None and the server uses the entry's recorded compile time)."""

    kind: EventKind
    path: str | None = None
    key: str | None = None
    namespace: str = ""
    toolchain: Toolchain | Mapping[str, Any] | None = None
    job: str = ""
    model: str = ""
    team: str = ""
    host: str = field(default_factory=socket.gethostname)
    instance_type: str = ""
    compile_seconds: float | None = None
    store: str | None = None
    message: str | None = None
    ts: float = field(default_factory=time.time)
    id: str = field(default_factory=new_event_id)

    def __post_init__(self) -> None:
        # A kind given as its string ("hit", as a caller of before the enum wrote) becomes the member.
        try:
            kind = EventKind(self.kind)
        except ValueError:
            raise ValueError(f"unknown event kind {self.kind!r}; one of {', '.join(EventKind)}") from None
        object.__setattr__(self, "kind", kind)

    def to_json(self, defaults: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The wire form; empty job/model/team/instance_type are filled from ``defaults``."""
        out: dict[str, Any] = {
            "id": self.id, "kind": self.kind, "ts": self.ts, "path": self.path, "key": self.key,
            "namespace": self.namespace, "toolchain": toolchain_json(self.toolchain), "job": self.job,
            "model": self.model, "team": self.team, "host": self.host, "instance_type": self.instance_type,
            "compile_seconds": self.compile_seconds, "store": self.store, "message": self.message,
        }
        for name, value in (defaults or {}).items():
            if name in ("job", "model", "team", "instance_type", "host") and not out[name]:
                out[name] = value
        if out["message"] is not None and len(out["message"]) > 8000:
            out["message"] = out["message"][:8000]  # a compiler log tail is plenty; the server caps at 8192
        return out


@dataclass(frozen=True)
class IndexLease:
    """The answer to acquire/renew: ``held`` says whether ``owner`` (you) holds it now; otherwise
    ``holder`` holds it for ``expires_in`` more seconds."""

    name: str
    owner: str
    held: bool
    holder: str | None
    expires_at: float | None
    expires_in: float | None

    @classmethod
    def from_json(cls, owner: str, data: Mapping[str, Any]) -> IndexLease:
        return cls(name=str(data["name"]), owner=owner, held=bool(data["held"]), holder=data.get("owner"),
                   expires_at=data.get("expires_at"), expires_in=data.get("expires_in"))


@dataclass(frozen=True)
class CompileSample:
    """One compile the index remembers: the HLO's size and how long it took (a forecast's data),
    with the compiler that took it and the HLO's digest (the same graph under another compiler)."""

    hlo_size: int
    compile_seconds: float
    compiler_version: str | None = None
    hlo_sha256: str | None = None
