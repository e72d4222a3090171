"""`neffcache warm` end to end: real `neffcache`, workload and `neuronx-cc` processes (simulated toolchain)."""

from __future__ import annotations

from pathlib import Path

import pytest

from neffcache.entry import EntryState
from neffcache.scan.report import scan
from neffcache.stores import open_store
from tests.warmers.conftest import INSTANCE, V1, Cli, Index, healthy, summary, warm_args

MODES = [pytest.param("xla", [], id="layoutA-one-phase"), pytest.param("xla", ["--two-phase"], id="layoutA-two-phase"),
         pytest.param("native", [], id="layoutB")]


@pytest.mark.parametrize(("backend", "extra"), MODES)
def test_warm_compiles_what_is_missing_then_serves_hits(cli: Cli, tmp_path: Path, backend: str,
                                                        extra: list[str]) -> None:
    store = tmp_path / "store"
    args = warm_args(store, "--parallel", "2", "--tag", "model=llama-tiny", *extra, backend=backend)
    first = cli.json(*args)
    assert first["ok"] and first["mode"] == ("two-phase" if extra else "one-phase")
    assert first["toolchain"] == {"compiler_version": V1, "target": "trn2", "lnc": 2, "instance": INSTANCE}
    assert {k: first["totals"][k] for k in ("graphs", "hits", "compiled", "failed")} == \
        {"graphs": 4, "hits": 0, "compiled": 4, "failed": 0}
    assert [(g["name"], g["compiled"], g["status"]) for g in first["groups"]] == \
        [("SEQ=128", 2, "ok"), ("SEQ=256", 2, "ok")]
    assert first["totals"]["bytes"] > 0 and first["totals"]["compile_seconds"] > 0
    assert len(cli.sim.compiles()) == 4

    report = healthy(store)
    assert [e.state for e in report.entries] == [EntryState.SUCCESS] * 4
    for entry in report.entries:
        assert entry.manifest is not None and not entry.manifest.computed
        assert entry.manifest.tags["model"] == "llama-tiny" and entry.manifest.tags["bucket"] in ("SEQ=128", "SEQ=256")
        assert entry.manifest.toolchain is not None and entry.manifest.toolchain.target == "trn2"
        assert entry.manifest.compile_seconds is not None
        assert entry.namespace.path.startswith("trn2-lnc2/")

    second = cli.json(*args)
    assert {k: second["totals"][k] for k in ("graphs", "hits", "compiled")} == {"graphs": 4, "hits": 4, "compiled": 0}
    assert len(cli.sim.compiles()) == 4
    # The runtime on its own, pointed at the store the way `neffcache env` says, finds everything.
    counts = summary(cli.workload(store, "--model", "llama-tiny", "--bucket", "128,256", "--graphs", "2",
                                  backend=backend).stderr)
    assert (counts["hits"], counts["compiled"]) == (4, 0)


def test_text_report_and_help(cli: Cli, tmp_path: Path) -> None:
    proc = cli.run(*warm_args(tmp_path / "store"))
    assert proc.returncode == 0, proc.stderr
    assert "SEQ=128" in proc.stdout and "total" in proc.stdout and "compiled" in proc.stdout
    for command in ("warm", "rewarm", "run"):
        help_text = cli.run(command, "--help").stdout
        assert "Example:" in help_text


def test_bad_input_changes_nothing(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    for args, message in ((["--instance", "trn9.huge"], "unknown instance type"),
                          (["--instance", INSTANCE, "--shard", "4/4"], "shard"),
                          (["--instance", INSTANCE, "--bucket", "BAD KEY=1"], "bucket key")):
        proc = cli.run("warm", "--store", str(store), *args, "--", "true")
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    proc = cli.run("warm", "--store", str(store), "--", "true")
    assert proc.returncode == 2 and "--instance" in proc.stderr
    assert not cli.sim.compiles()


@pytest.mark.s3
def test_warm_with_s3_and_index_then_another_host_only_hits(cli: Cli, tmp_path: Path, s3: str, index: Index) -> None:
    first = cli.json(*warm_args(tmp_path / "host-a", "--store", s3, "--tag", "team=llm"))
    assert first["totals"]["compiled"] == 4 and first["published"] == 4
    remote = scan(open_store(s3, endpoint_url=cli.env["AWS_ENDPOINT_URL_S3"]), read_manifests=True)
    assert len(remote.entries) == 4 and all(e.state is EntryState.SUCCESS and e.manifest for e in remote.entries)
    assert all(e.manifest and e.manifest.tags["team"] == "llm" for e in remote.entries)

    # A second host with an empty local disk: the namespace comes from S3, nothing is compiled.
    second = cli.json(*warm_args(tmp_path / "host-b", "--store", s3))
    assert second["prefetched"] == 4
    assert (second["totals"]["hits"], second["totals"]["compiled"]) == (4, 0)
    assert len(cli.sim.compiles()) == 4
    healthy(tmp_path / "host-b")

    stats = index.stats()  # warm-ups, every one of them: apart from the jobs' traffic
    ahead = stats["by_source"]["warm"]
    assert (ahead["compiles"], ahead["misses"], ahead["hits"]) == (4, 4, 4)
    assert stats["totals"]["hits"] + stats["totals"]["misses"] == 0 and stats["hit_rate"] is None
    stores = {e["path"]: e for e in index.entries()}
    assert len(stores) == 4


@pytest.mark.s3
def test_native_backend_with_s3(cli: Cli, tmp_path: Path, s3: str) -> None:
    report = cli.json(*warm_args(tmp_path / "local", "--store", s3, backend="native"))
    assert report["totals"]["compiled"] == 4 and report["published"] == 4
    remote = healthy(s3, endpoint_url=cli.env["AWS_ENDPOINT_URL_S3"])
    assert {e.layout for e in remote.entries} == {"torchneuron"} and len(remote.entries) == 4


@pytest.mark.s3
def test_a_tier_that_is_down_is_skipped_reported_and_caught_up_later(cli: Cli, tmp_path: Path, s3: str) -> None:
    # Nothing listens on port 9: the S3 tier is down for the whole first run.
    report = cli.json(*warm_args(tmp_path / "local", "--store", s3), rc=1, AWS_ENDPOINT_URL_S3="http://127.0.0.1:9")
    assert report["totals"]["compiled"] == 4 and all(g["status"] == "ok" for g in report["groups"])
    assert report["problems"] and s3 in report["problems"][0]
    assert len(healthy(tmp_path / "local").entries) == 4
    # S3 is back: the next warm-up compiles nothing and publishes what S3 missed.
    again = cli.json(*warm_args(tmp_path / "local", "--store", s3))
    assert (again["totals"]["hits"], again["totals"]["compiled"], again["published"]) == (4, 0, 4)
    assert len(healthy(s3, endpoint_url=cli.env["AWS_ENDPOINT_URL_S3"]).entries) == 4
