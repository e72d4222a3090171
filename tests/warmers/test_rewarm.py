"""`neffcache rewarm` after a simulated compiler bump: the new runtime then hits everything."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.warmers.conftest import V1, V2, Cli, Index, healthy, summary, warm_args

pytestmark = pytest.mark.slow

WORKLOAD_ARGS = ("--model", "llama-tiny", "--bucket", "128,256", "--graphs", "2")


def _warm_both_layouts(cli: Cli, store: Path, *stores: str) -> None:
    for backend in ("xla", "native"):
        extra = [a for s in stores for a in ("--store", s)]
        assert cli.json(*warm_args(store, *extra, "--tag", "model=llama-tiny", backend=backend))["ok"]


def test_rewarm_lands_where_the_new_runtime_looks(cli: Cli, tmp_path: Path, index: Index) -> None:
    store = tmp_path / "store"
    _warm_both_layouts(cli, store)
    cli.bump(V2)
    report = cli.json("rewarm", "--from-compiler", V1, "--store", str(store), "--parallel", "2", "-q")
    assert report["totals"]["compiled"] == 8 and report["ok"]
    assert sorted(report["namespaces"]) == [f"trn2-lnc2/neuronxcc-{V2}", f"trn2-lnc2/torchneuron-{V2}"]
    assert [r["version"] for r in cli.sim.compiles()].count(V2) == 8

    entries = healthy(store).entries
    old = {e.key for e in entries if e.layout == "neuronxcc" and e.namespace.compiler_version == V1}
    new = {e.key for e in entries if e.layout == "neuronxcc" and e.namespace.compiler_version == V2}
    assert old == new  # MODULE_<same>+<same>
    for e in entries:
        if e.namespace.compiler_version == V2:
            assert e.manifest and e.manifest.toolchain and e.manifest.toolchain.compiler_version == V2
            assert e.manifest.tags["model"] == "llama-tiny"  # carried over from the old entry

    counts = summary(cli.workload(store, *WORKLOAD_ARGS, backend="xla").stderr)
    assert (counts["hits"], counts["compiled"]) == (4, 0)
    # TorchNeuron's native runtime names NEFFs by its own key, which neffcache cannot compute:
    # rewarmed layout-B entries (neffcache's key) are not what it looks for (see rewarm --help).
    counts = summary(cli.workload(store, *WORKLOAD_ARGS, backend="native").stderr)
    assert (counts["hits"], counts["compiled"]) == (0, 4)
    assert [r["version"] for r in cli.sim.compiles()].count(V2) == 12
    assert index.stats()["totals"]["compiles"] >= 16

    again = cli.json("rewarm", "--from-compiler", V1, "--store", str(store), "-q")
    assert (again["totals"]["hits"], again["totals"]["compiled"]) == (8, 0)


@pytest.mark.s3
def test_sharded_rewarm_on_two_hosts_through_s3(cli: Cli, tmp_path: Path, s3: str) -> None:
    _warm_both_layouts(cli, tmp_path / "warm-host", s3)
    cli.bump(V2)
    procs = [cli.popen("rewarm", "--from-compiler", V1, "--store", str(tmp_path / f"host-{i}"), "--store", s3,
                       "--shard", f"{i}/2", "--json", "-q") for i in range(2)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    assert sum(r["totals"]["compiled"] for r in reports) == 8
    assert all(r["totals"]["compiled"] < 8 for r in reports)  # the work was split
    v2 = [r for r in cli.sim.compiles() if r["version"] == V2]
    # The two layouts hold the same four graphs: each HLO compiled once per layout, never more.
    assert sorted(Counter(r["hlo_sha256"] for r in v2).values()) == [2, 2, 2, 2]
    remote = healthy(s3, endpoint_url=cli.env["AWS_ENDPOINT_URL_S3"]).entries
    assert sum(1 for e in remote if e.namespace.compiler_version == V2) == 8

    # A third host pulls the new namespace and its runtime only hits.
    fresh = tmp_path / "fresh"
    assert cli.json(*warm_args(fresh, "--store", s3))["totals"]["hits"] == 4
    assert summary(cli.workload(fresh, *WORKLOAD_ARGS).stderr)["compiled"] == 0


def test_rewarm_refuses_the_installed_version(cli: Cli, tmp_path: Path) -> None:
    proc = cli.run("rewarm", "--from-compiler", V1, "--store", str(tmp_path / "store"))
    assert proc.returncode == 2 and "already" in proc.stderr
