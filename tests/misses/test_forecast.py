"""The forecast by hand-computed numbers: the same graph's median, the least-squares fit on HLO
size, unknowns kept apart, and the longest-first schedule's wall time."""

from __future__ import annotations

import math

import pytest

from neffcache.index.records import CompileSample
from neffcache.misses.forecast import ForecastBasis, Line, estimate, fit, forecast, makespan
from neffcache.misses.lookup import History
from neffcache.misses.wanted import WantedGraph
from neffcache.toolchain import Toolchain

TRN2 = Toolchain("2.28.1001.0+0badc0de", "trn2", 2)


def graph(name: str, *, digest: str | None = None, size: int | None = 1000, toolchain: Toolchain | None = TRN2
          ) -> WantedGraph:
    return WantedGraph(path=f"ns/{name}", layout="neuronxcc", namespace="ns", key=name, toolchain=toolchain,
                       hlo_sha256=digest, hlo_size=size)


def samples(*points: tuple[int, float]) -> tuple[CompileSample, ...]:
    return tuple(CompileSample(size, seconds) for size, seconds in points)


def test_least_squares_through_three_points() -> None:
    # x = 1000, 2000, 3000; y = 12, 18, 30. mean x 2000, mean y 20;
    # slope = ((-1000)(-8) + 0 + 1000*10) / (1e6 + 0 + 1e6) = 18000 / 2e6 = 0.009; intercept = 20 - 18 = 2.
    line = fit(samples((1000, 12.0), (2000, 18.0), (3000, 30.0)))
    assert line is not None
    assert line.slope == pytest.approx(0.009) and line.intercept == pytest.approx(2.0)
    assert line.at(4000) == pytest.approx(38.0)


def test_one_size_is_a_flat_line_at_the_mean_and_none_is_nothing() -> None:
    assert fit(samples((500, 10.0), (500, 20.0))) == Line(15.0, 0.0)
    assert fit(()) is None


def test_a_fit_never_predicts_negative_seconds() -> None:
    line = fit(samples((1000, 100.0), (2000, 10.0)))  # slope -0.09, intercept 190
    assert line is not None and line.at(10_000) == 0.0


def test_untrusted_samples_never_reach_the_arithmetic() -> None:
    line = fit(samples((1000, math.nan), (2000, math.inf), (3000, -5.0), (0, 7.0), (1000, 4.0)))
    assert line == Line(4.0, 0.0)


def test_the_same_graph_wins_with_the_median_of_its_target() -> None:
    history = History(by_hlo={"d" * 64: (("trn2", 30.0), ("trn2", 10.0), ("trn2", 50.0), ("trn1", 999.0))},
                      samples={"trn2": samples((1000, 1.0), (2000, 2.0))})
    got = estimate(graph("a", digest="d" * 64), history)
    assert (got.seconds, got.basis) == (30.0, ForecastBasis.SAME_GRAPH)


def test_the_same_graph_on_another_target_is_used_when_its_own_has_none() -> None:
    history = History(by_hlo={"d" * 64: (("trn1", 40.0), (None, 60.0))})
    got = estimate(graph("a", digest="d" * 64), history)
    assert (got.seconds, got.basis) == (50.0, ForecastBasis.SAME_GRAPH)


def test_without_the_graph_the_size_fit_of_its_target_and_else_unknown() -> None:
    history = History(samples={"trn2": samples((1000, 12.0), (2000, 18.0), (3000, 30.0))})
    fitted = estimate(graph("a", size=2500), history)
    assert fitted.basis is ForecastBasis.SIZE_FIT and fitted.seconds == pytest.approx(24.5)  # 2 + 0.009 * 2500
    assert estimate(graph("b", toolchain=Toolchain("2.28.1001.0+0badc0de", "trn1", 1)), history).basis \
        is ForecastBasis.UNKNOWN
    assert estimate(graph("c", size=None), history).basis is ForecastBasis.UNKNOWN


def test_longest_first_schedule() -> None:
    # 4 slots: 60 | 10+10+... The hour-long graph bounds the wall time; the sum over slots would say 30.
    assert makespan([60.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0], 4) == 60.0
    # 2 slots, longest first (7, 5, 4, 3, 3): 7 -> A; 5 -> B; 4 -> B (9); 3 -> A (10); 3 -> B (12).
    assert makespan([3.0, 5.0, 3.0, 7.0, 4.0], 2) == 12.0
    assert makespan([], 3) == 0.0
    assert makespan([5.0, 5.0], 0) == 10.0  # no slot is one slot


def test_forecast_totals_eta_and_unknowns() -> None:
    history = History(by_hlo={"a" * 64: (("trn2", 3600.0),)},
                      samples={"trn2": samples((1000, 600.0), (1000, 600.0))})
    misses = [graph("big", digest="a" * 64), graph("s1"), graph("s2"), graph("s3"), graph("s1"),
              graph("odd", toolchain=Toolchain("2.28.1001.0+0badc0de", "trn1", 1))]
    fc = forecast(misses, history, parallel=2, hosts=2)
    assert len(fc.estimates) == 5  # s1 once
    assert fc.slots == 4
    assert fc.compile_seconds == pytest.approx(3600 + 3 * 600)
    assert fc.eta_seconds == pytest.approx(3600)
    assert fc.unknown == ["ns/odd"]
    data = fc.to_json()
    assert data["compile_hours"] == pytest.approx(1.5)
    assert data["by_basis"] == {"same-graph": 1, "size-fit": 3, "unknown": 1}
