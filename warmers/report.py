"""What a warm-up or re-warm did, per group (bucket, or source namespace) and in total."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Group statuses, worst last: the total takes the worst of its groups.
STATUSES = ("ok", "failed", "timeout", "crashed", "interrupted")


@dataclass
class Failure:
    group: str
    what: str  # the entry path, or "workload"
    kind: str  # compile | timeout | workload | crash
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"group": self.group, "what": self.what, "kind": self.kind, "reason": self.reason}


@dataclass
class GroupReport:
    name: str
    status: str = "ok"
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

    def fail(self, what: str, kind: str, reason: str) -> None:
        self.failures.append(Failure(self.name, what, kind, reason))

    def worsen(self, status: str) -> None:
        if STATUSES.index(status) > STATUSES.index(self.status):
            self.status = status

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
        return not self.interrupted and not self.problems and all(g.status == "ok" for g in self.groups)

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
                 "published", "seconds", "interrupted", "notes", "problems")
        return cls(**{k: data[k] for k in names if k in data}, groups=groups)

    def to_json(self) -> dict[str, Any]:
        return {"command": self.command, "ok": self.ok, "mode": self.mode, "toolchain": self.toolchain,
                "namespaces": self.namespaces, "stores": self.stores, "shard": self.shard,
                "parallel": self.parallel, "groups": [g.to_json() for g in self.groups],
                "totals": self.totals(), "prefetched": self.prefetched, "published": self.published,
                "seconds": round(self.seconds, 3), "interrupted": self.interrupted, "notes": self.notes,
                "problems": self.problems}
