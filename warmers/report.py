"""What a warm-up or re-warm did, per group (bucket, or source namespace) and in total.

The warm-ups' outcome vocabulary is here, as StrEnums whose values are the strings the
reports always printed (so ``--json`` output is unchanged): a compile's
:class:`CompileStatus`, a group's :class:`GroupStatus` and a failure's :class:`FailureKind`.
They are not in :mod:`neffcache.outcomes` with the library's outcomes because only the
warmers produce and read them; the library never returns a compile or a group.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


class CompileStatus(enum.StrEnum):
    """How one graph of the compile pool ended."""

    COMPILED = "compiled"
    HIT = "hit"  # a tier already held the entry
    FAILED = "failed"
    REFUSED = "refused"  # its flags file does not back its key: never compiled
    TIMEOUT = "timeout"  # stopped past --compile-timeout: an environment failure, never cached
    # The host failed the compile (killed, out of memory, compiler missing, disk full...):
    # retried a few times, never cached (neffcache.failures).
    ENVIRONMENT = "environment"
    INTERRUPTED = "interrupted"  # the run was stopping: not attempted, or stopped mid-compile


class GroupStatus(enum.StrEnum):
    """A group's status, in order of severity: the members are declared best first, and
    :meth:`worst` of two is the later one. A group only ever gets worse (:meth:`GroupReport.worsen`),
    so a crash reported after a failed graph is not hidden by it, nor the reverse."""

    OK = "ok"
    FAILED = "failed"  # some graphs failed; the workload itself ended
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    INTERRUPTED = "interrupted"

    @property
    def severity(self) -> int:
        # The declaration order (an Enum iterates its members in it) is the severity order.
        return _SEVERITY[self]

    def worst(self, other: GroupStatus) -> GroupStatus:
        return other if other.severity > self.severity else self


_SEVERITY = {status: rank for rank, status in enumerate(GroupStatus)}


class FailureKind(enum.StrEnum):
    """What failed, for one line of a report's failures."""

    COMPILE = "compile"  # the compiler rejected the graph (or its cached failure stands)
    TIMEOUT = "timeout"  # a compile or the workload ran past its timeout
    ENVIRONMENT = "environment"  # the host failed the compile: not cached, the next run compiles it
    FLAGS = "flags"  # the flags file does not back the key: not compiled
    CRASH = "crash"  # the workload died or could not start


@dataclass
class Failure:
    group: str
    what: str  # the entry path, or "workload"
    kind: FailureKind
    reason: str
    signature: str = ""  # the error's signature (neffcache.failures), when a compile failed
    attempts: int = 1  # compiles tried in this run (environment failures are retried)

    def __post_init__(self) -> None:
        self.kind = FailureKind(self.kind)  # a report read back from JSON holds the string

    def to_json(self) -> dict[str, str | int]:
        out: dict[str, str | int] = {"group": self.group, "what": self.what, "kind": self.kind, "reason": self.reason}
        if self.signature:
            out["signature"] = self.signature
        if self.attempts != 1:
            out["attempts"] = self.attempts
        return out


@dataclass
class GroupReport:
    name: str
    status: GroupStatus = GroupStatus.OK
    graphs: int = 0
    hits: int = 0
    compiled: int = 0
    failed: int = 0
    compile_seconds: float = 0.0
    bytes: int = 0
    seconds: float = 0.0
    exit_code: int | None = None
    log: str | None = None
    failures: list[Failure] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.status = GroupStatus(self.status)  # a report read back from JSON holds the string

    def fail(self, what: str, kind: FailureKind, reason: str, *, signature: str = "", attempts: int = 1) -> None:
        self.failures.append(Failure(self.name, what, kind, reason, signature, attempts))

    def worsen(self, status: GroupStatus) -> None:
        self.status = self.status.worst(status)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "graphs": self.graphs, "hits": self.hits,
                "compiled": self.compiled, "failed": self.failed,
                "compile_seconds": round(self.compile_seconds, 3), "bytes": self.bytes,
                "seconds": round(self.seconds, 3), "exit_code": self.exit_code, "log": self.log,
                "failures": [f.to_json() for f in self.failures]}


@dataclass
class WarmReport:
    command: str  # warm | rewarm
    toolchain: dict[str, Any]
    namespaces: list[str]
    stores: list[str]
    mode: str  # one-phase | two-phase | rewarm
    shard: str = "0/1"
    parallel: int = 1
    groups: list[GroupReport] = field(default_factory=list)
    prefetched: int = 0
    published: int = 0  # entries published to tiers beyond the work store
    seconds: float = 0.0
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    # Tiers that were down or refused (skipped, so the entries did not reach them): a failure.
    problems: list[str] = field(default_factory=list)
    # rewarm: how the flags form of each new neuronxcc namespace was decided (FormDecision.to_json).
    flags_forms: list[dict[str, Any]] = field(default_factory=list)

    def group(self, name: str) -> GroupReport:
        for g in self.groups:
            if g.name == name:
                return g
        found = GroupReport(name)
        self.groups.append(found)
        return found

    @property
    def failures(self) -> list[Failure]:
        return [f for g in self.groups for f in g.failures]

    @property
    def ok(self) -> bool:
        return not self.interrupted and not self.problems and all(g.status is GroupStatus.OK for g in self.groups)

    def totals(self) -> dict[str, Any]:
        return {
            "groups": len(self.groups),
            "graphs": sum(g.graphs for g in self.groups),
            "hits": sum(g.hits for g in self.groups),
            "compiled": sum(g.compiled for g in self.groups),
            "failed": sum(g.failed for g in self.groups),
            "compile_seconds": round(sum(g.compile_seconds for g in self.groups), 3),
            "bytes": sum(g.bytes for g in self.groups),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WarmReport:
        """Back from :meth:`to_json` (e.g. a report another process printed with --json)."""
        groups = []
        for g in data.get("groups", []):
            row = GroupReport(**{k: v for k, v in g.items() if k != "failures"})
            row.failures = [Failure(**f) for f in g.get("failures", [])]
            groups.append(row)
        names = ("command", "toolchain", "namespaces", "stores", "mode", "shard", "parallel", "prefetched",
                 "published", "seconds", "interrupted", "notes", "problems", "flags_forms")
        return cls(**{k: data[k] for k in names if k in data}, groups=groups)

    def to_json(self) -> dict[str, Any]:
        return {"command": self.command, "ok": self.ok, "mode": self.mode, "toolchain": self.toolchain,
                "namespaces": self.namespaces, "stores": self.stores, "shard": self.shard,
                "parallel": self.parallel, "groups": [g.to_json() for g in self.groups],
                "totals": self.totals(), "prefetched": self.prefetched, "published": self.published,
                "seconds": round(self.seconds, 3), "interrupted": self.interrupted, "notes": self.notes,
                "problems": self.problems, "flags_forms": self.flags_forms}


@contextmanager
def reporting(report: WarmReport, *, stop_children: Callable[[], None],
              problem_notes: Callable[[], Iterable[str]]) -> Iterator[WarmReport]:
    """Run a warm-up's body so that its report is complete however the body ends.

    Ctrl-C marks the report interrupted (the caller renders it and exits 130); any other error
    first stops every child (a store or index error: no workload or compiler may outlive us);
    in every case the report gets its duration and the tiers' problems, so a partial report
    never claims success it did not have."""
    started = time.monotonic()
    try:
        yield report
    except KeyboardInterrupt:
        report.interrupted = True
        raise
    except Exception:
        stop_children()
        raise
    finally:
        report.seconds = time.monotonic() - started
        report.problems.extend(problem_notes())
