"""What the compile pool takes and gives back: a :class:`CompileJob` per graph, a
:class:`CompileOutcome` per job, and how an outcome counts into a warm report.

Kept apart from :mod:`.compiling` (the pool itself) so the pool's failure handling
(:mod:`.compile_failures`) can name jobs and outcomes without importing the pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from neffcache.entry import Namespace
from neffcache.failures import FailureCause, Verdict
from neffcache.layouts import get_layout
from neffcache.stores.base import Store
from neffcache.toolchain import Toolchain

from .report import CompileStatus, FailureKind, GroupStatus, WarmReport


@dataclass(frozen=True)
class CompileJob:
    group: str  # the report row: a bucket, or the namespace a rewarm reads from
    namespace: Namespace  # where the new entry goes
    key: str
    source: Store  # holds the HLO
    hlo_path: str
    flags: tuple[str, ...]
    toolchain: Toolchain
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return get_layout(self.namespace.layout).plan_entry(self.namespace, self.key).path


@dataclass(frozen=True)
class CompileOutcome:
    job: CompileJob
    status: CompileStatus
    seconds: float = 0.0
    bytes: int = 0
    reason: str = ""
    tiers: int = 0  # how many tiers hold the new entry
    # A failed compile: who failed it (compiler or environment) and the error's signature.
    verdict: Verdict | None = None
    signature: str = ""
    attempts: int = 1  # compiles of this graph in this run (environment failures are retried)


def failure_kind(outcome: CompileOutcome) -> FailureKind:
    """The kind a report lists for a compile that did not succeed."""
    if outcome.status is CompileStatus.REFUSED:
        return FailureKind.FLAGS
    if outcome.status is CompileStatus.TIMEOUT or (outcome.verdict and outcome.verdict.cause is FailureCause.TIMEOUT):
        return FailureKind.TIMEOUT
    if outcome.verdict is not None and outcome.verdict.is_environment:
        return FailureKind.ENVIRONMENT
    return FailureKind.COMPILE


def record_outcome(report: WarmReport, outcome: CompileOutcome) -> None:
    """Count one compile outcome into its group's row. Not thread-safe: the caller holds
    whatever lock guards ``report`` against its other writers."""
    row = report.group(outcome.job.group)
    status = outcome.status
    if status is CompileStatus.INTERRUPTED:
        row.worsen(GroupStatus.INTERRUPTED)
        return
    row.graphs += 1
    if status is CompileStatus.HIT:
        row.hits += 1
    elif status is CompileStatus.COMPILED:
        row.compiled += 1
        row.compile_seconds += outcome.seconds
        row.bytes += outcome.bytes
        report.published += max(0, outcome.tiers - 1)
    else:
        row.failed += 1
        row.worsen(GroupStatus.FAILED)
        row.fail(outcome.job.path, failure_kind(outcome), outcome.reason, signature=outcome.signature,
                 attempts=outcome.attempts)
