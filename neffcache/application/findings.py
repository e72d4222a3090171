"""What ``neffcache doctor`` reports: one :class:`Finding` per check, each ok, a warning or a
problem with its fix, and the :class:`DoctorReport` whose worst finding decides the exit code.
Plain values, so the checks (neffcache/application/doctor.py) and whoever renders them share them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Level(enum.IntEnum):
    """How bad a finding is; the command's exit code follows the worst one."""

    OK = 0
    WARNING = 1
    PROBLEM = 2

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Finding:
    check: str
    level: Level
    message: str
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "level": self.level.label, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class DoctorReport:
    findings: tuple[Finding, ...]

    @property
    def worst(self) -> Level:
        return max((f.level for f in self.findings), default=Level.OK)

    def to_json(self) -> dict[str, Any]:
        counts = {level.label: sum(1 for f in self.findings if f.level is level) for level in Level}
        return {"worst": self.worst.label, "counts": counts, "findings": [f.to_json() for f in self.findings]}
