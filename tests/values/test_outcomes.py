"""The outcome vocabulary: every enum's values are the strings reports printed before it existed
(JSON output and scripts reading it do not change), and a group's status only gets worse."""

from __future__ import annotations

import enum
import json
import threading

import pytest

from neffcache.outcomes import PublishStatus, TierOp, TierProblemKind, TransferOutcome
from neffcache.replication.sync_report import EntryOutcome, Tally
from neffcache.warmers.report import (
    CompileStatus,
    Failure,
    FailureKind,
    GroupReport,
    GroupStatus,
    WarmReport,
)

DOCUMENTED: dict[type[enum.StrEnum], list[str]] = {
    PublishStatus: ["published", "exists", "busy"],
    TransferOutcome: ["copied", "skipped", "failed", "filtered", "busy", "cancelled"],
    TierOp: ["open", "get", "promote", "publish", "prefetch", "push"],
    TierProblemKind: ["down", "corrupt", "changed", "busy", "refused"],
    CompileStatus: ["compiled", "hit", "failed", "refused", "timeout", "environment", "interrupted"],
    GroupStatus: ["ok", "failed", "timeout", "crashed", "interrupted"],
    FailureKind: ["compile", "timeout", "environment", "flags", "crash"],
}


@pytest.mark.parametrize("kind", list(DOCUMENTED), ids=lambda k: k.__name__)
def test_values_are_the_documented_strings(kind: type[enum.StrEnum]) -> None:
    assert [m.value for m in kind] == DOCUMENTED[kind]
    # In JSON and in f-strings a member is its bare string, never "Kind.MEMBER".
    assert json.loads(json.dumps(list(kind))) == DOCUMENTED[kind]
    assert [f"{m}" for m in kind] == DOCUMENTED[kind]


def test_group_status_severity_is_the_declaration_order() -> None:
    assert sorted(GroupStatus, key=lambda s: s.severity) == list(GroupStatus)
    assert GroupStatus.OK.worst(GroupStatus.FAILED) is GroupStatus.FAILED
    assert GroupStatus.CRASHED.worst(GroupStatus.FAILED) is GroupStatus.CRASHED


def test_a_group_only_gets_worse() -> None:
    row = GroupReport("b")
    assert row.status is GroupStatus.OK
    row.worsen(GroupStatus.TIMEOUT)
    row.worsen(GroupStatus.FAILED)  # a failed graph after the timeout does not hide it
    assert row.status is GroupStatus.TIMEOUT
    row.worsen(GroupStatus.INTERRUPTED)
    assert row.status is GroupStatus.INTERRUPTED


def test_a_report_read_back_from_json_holds_the_enums() -> None:
    report = WarmReport("warm", {}, [], [], "one-phase")
    row = report.group("b")
    row.worsen(GroupStatus.CRASHED)
    row.fail("workload", FailureKind.CRASH, "exited 3")
    back = WarmReport.from_json(json.loads(json.dumps(report.to_json())))
    assert back.groups[0].status is GroupStatus.CRASHED
    assert back.failures == [Failure("b", "workload", FailureKind.CRASH, "exited 3")]
    assert back.failures[0].kind is FailureKind.CRASH and back.to_json() == report.to_json()


def test_the_tally_counts_every_outcome_from_many_threads() -> None:
    tally = Tally(4000, None)
    kinds = [TransferOutcome.COPIED, TransferOutcome.SKIPPED, TransferOutcome.FAILED, TransferOutcome.FILTERED]

    def work(kind: TransferOutcome) -> None:
        for i in range(1000):
            tally.add(kind, None if kind is TransferOutcome.FILTERED else EntryOutcome(f"{kind}/{i}", bytes=1))

    threads = [threading.Thread(target=work, args=(k,)) for k in kinds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = tally.report("a", "b", 0.0, [], False)
    assert (len(report.copied), len(report.skipped), len(report.failed), report.filtered, report.bytes,
            tally.done) == (1000, 1000, 1000, 1000, 1000, 4000)


def test_a_publish_result_is_ok_unless_another_writer_holds_the_entry() -> None:
    from neffcache.operations.publish import PublishResult

    assert PublishResult("a/b", PublishStatus.PUBLISHED).ok and PublishResult("a/b", PublishStatus.EXISTS).ok
    assert not PublishResult("a/b", PublishStatus.BUSY).ok
