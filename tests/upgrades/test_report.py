"""The report's arithmetic (neffcache/upgrades/report.py) and the failure signature seam."""

from __future__ import annotations

import pytest

from neffcache.entry import EntryState
from neffcache.failures import signature
from neffcache.upgrades import Build, GraphComparison, GraphStatus, Regression, UpgradeReport
from neffcache.upgrades.signature import MAX_SIGNATURE, failure_signature

OK = EntryState.SUCCESS


def _graph(name: str, hits: int, old_s: float | None, old_b: int | None, new: Build | None = None,
           named: bool = True) -> GraphComparison:
    old = Build(f"old/{name}", "s", OK, old_s, old_b)
    return GraphComparison(old, hits, f"new/{name}" if named else None, new,
                           None if named else "its name cannot be computed")


def _report(*graphs: GraphComparison, hits_known: bool = True) -> UpgradeReport:
    return UpgradeReport("2.27.1.0+a", "2.28.1.0+b", ["s"], (0.0, 1.0), 1.5, hits_known, list(graphs))


GRAPHS = (
    _graph("same", 4, 100.0, 1000, Build("new/same", "s", OK, 140.0, 1400)),  # 1.4x: below the threshold
    _graph("slow", 2, 100.0, 1000, Build("new/slow", "s", OK, 151.0, 900)),
    _graph("big", 1, 100.0, 1000, Build("new/big", "s", OK, 90.0, 1501)),
    _graph("unknown", 0, None, None, Build("new/unknown", "s", OK, 30.0, 10)),
    _graph("fails", 3, 60.0, 1000, Build("new/fails", "s", EntryState.FAILED, failure="ERROR: x")),
    _graph("locked", 0, 80.0, 1000, Build("new/locked", "s", EntryState.LOCKED)),
    _graph("missing", 5, 50.0, 1000),
    _graph("unnamed", 1, None, 1000, named=False),
)


def test_statuses_regressions_and_readiness() -> None:
    report = _report(*GRAPHS)
    assert [g.status for g in report.graphs] == [GraphStatus.READY] * 4 + [
        GraphStatus.FAILING, GraphStatus.UNUSABLE, GraphStatus.MISSING, GraphStatus.UNNAMED]
    assert [g.old.path for g in report.grown(Regression.SLOWER)] == ["old/slow"]
    assert [g.old.path for g in report.grown(Regression.BIGGER)] == ["old/big"]
    assert [g.old.path for g in report.new_failures()] == ["old/fails"]
    assert [g.old.path for g in report.missing()] == ["old/missing", "old/fails", "old/unnamed", "old/locked"]
    ready = 4.1 + 2.1 + 1.1 + 0.1
    assert report.readiness() == pytest.approx(ready / (ready + 3.1 + 0.1 + 5.1 + 1.1))


def test_totals() -> None:
    report = _report(*GRAPHS)
    assert report.rewarm_seconds() == pytest.approx(140 + 151 + 90 + 30)
    hot, seconds, unknown = report.first_day()
    # Hot (hit) and not ready: missing 50 s (old time), fails 60 s (no new time), unnamed unknown.
    assert [g.old.path for g in hot] == ["old/missing", "old/fails", "old/unnamed"]
    assert (seconds, unknown) == (110.0, 1)
    # Without hit counts every graph not ready counts as hot.
    assert len(_report(*GRAPHS, hits_known=False).first_day()[0]) == 4


def test_the_gate() -> None:
    report = _report(*GRAPHS)
    reasons = report.gate_reasons(0.95)
    assert len(reasons) == 2 and "below the gate 95.0%" in reasons[0] and "fails under" in reasons[1]
    ready_only = _report(*GRAPHS[:4])
    assert ready_only.gate_reasons(1.0) == [] and ready_only.to_json(1.0)["gate"]["passed"] is True
    # ready 4.1 + 2.1 + 1.1 + 0.1 = 7.4 of 7.4 + 5.1: 59.2%
    assert _report(*GRAPHS[:4], GRAPHS[6]).gate_reasons(0.6) == ["readiness 59.2% is below the gate 60.0%"]


def test_json_holds_every_graph() -> None:
    data = _report(*GRAPHS).to_json()
    assert len(data["by_graph"]) == len(GRAPHS) and data["gate"]["passed"] is None
    assert data["regressions"]["slower"][0]["compile_ratio"] == pytest.approx(1.51)
    assert data["weights"] == {"by": "hits", "unused_weight": 0.1, "rule": "weight = hits in the window + 0.1"}


def test_the_signature_is_the_failures_key_and_the_first_error_line() -> None:
    log = b"\n\n  ERROR:neuronxcc: [NCC_E123] bad op at /tmp/w1/x.pb:12  \nmore\n"
    sig = failure_signature(log)
    assert sig == f"{signature(log.decode())}: ERROR:neuronxcc: [NCC_E123] bad op at /tmp/w1/x.pb:12"
    # Paths and numbers differ between hosts: the key `neffcache failures` groups by does not.
    other = failure_signature(log.replace(b"/tmp/w1/x.pb:12", b"/scratch/q/y.pb:99"))
    assert other.split(":")[0] == sig.split(":")[0]


def test_the_signature_of_an_odd_log_is_printable_and_bounded() -> None:
    assert failure_signature(b"") == failure_signature(b" \n\n") == "(empty log)"
    assert all(c.isprintable() for c in failure_signature(b"caf\xc3\xa9 \xff\x1b[31m red"))
    assert len(failure_signature(b"x" * 10_000)) == MAX_SIGNATURE
