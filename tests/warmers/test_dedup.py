"""Several warmers at once: every unique graph is compiled exactly once (counted by the compiler)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.warmers.conftest import Cli, graphs_compiled, healthy, warm_args

pytestmark = pytest.mark.slow

BUCKETS = "128,256,512,1024"
GRAPHS = 3
UNIQUE = 4 * GRAPHS


def _run_four(cli: Cli, per_process: list[list[str]], **env: str) -> list[dict[str, object]]:
    procs = [cli.popen(*args[:args.index("--")], "--json", *args[args.index("--"):], **env) for args in per_process]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    return reports


def _assert_once(cli: Cli) -> None:
    compiled = Counter(graphs_compiled(cli.sim))
    assert len(compiled) == UNIQUE and set(compiled.values()) == {1}, compiled


@pytest.mark.parametrize(("split", "mode"), [("shards", []), ("same-work", []), ("same-work", ["--two-phase"]),
                                              ("shards", ["--two-phase"])],
                         ids=["shards", "same-work", "same-work-two-phase", "shards-two-phase"])
def test_four_warmers_on_one_shared_store(cli: Cli, tmp_path: Path, split: str, mode: list[str]) -> None:
    store = tmp_path / "shared"
    runs = [warm_args(store, "--parallel", "2", *mode, *(["--shard", f"{i}/4"] if split == "shards" else []),
                      buckets=BUCKETS, graphs=GRAPHS) for i in range(4)]
    reports = _run_four(cli, runs, NEFFSIM_COMPILE_SECONDS="0.2")
    _assert_once(cli)
    assert sum(r["totals"]["compiled"] for r in reports) == UNIQUE  # type: ignore[index]
    report = healthy(store)
    assert len(report.entries) == UNIQUE and all(e.manifest is not None for e in report.entries)


@pytest.mark.s3
def test_hosts_with_their_own_disks_lease_through_s3(cli: Cli, tmp_path: Path, s3: str) -> None:
    """Four "hosts" (separate local stores) share only S3: the compile leases there keep every
    graph to one compile, and every host ends up with every NEFF."""
    runs = [warm_args(tmp_path / f"host-{i}", "--store", s3, "--two-phase", "--parallel", "2",
                      buckets=BUCKETS, graphs=GRAPHS) for i in range(4)]
    reports = _run_four(cli, runs, NEFFSIM_COMPILE_SECONDS="0.3")
    _assert_once(cli)
    assert sum(r["totals"]["compiled"] for r in reports) == UNIQUE  # type: ignore[index]
    for i in range(4):
        assert len(healthy(tmp_path / f"host-{i}").entries) == UNIQUE
    assert len(healthy(s3, endpoint_url=cli.env["AWS_ENDPOINT_URL_S3"]).entries) == UNIQUE
