"""`neffcache plan` end to end: real `neffcache`, workload and `neuronx-cc` processes (simulated
toolchain), a real index server. Nothing is compiled, no placeholder reaches a store, the scratch
root goes; --require-warm gates, --warm compiles exactly the misses."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from neffcache.layouts import get_layout
from neffcache.misses.wanted import WantedGraph
from neffcache.placeholder import file_is_placeholder, is_placeholder
from neffcache.scan.report import scan
from neffcache.stores import LocalStore, open_store
from neffcache.testing.shim import read_invocation_log
from tests.server.conftest import free_port
from tests.warmers.conftest import INSTANCE, V2, WORKLOAD, Cli, Index, healthy, summary, warm_args

NOT_WARM = 13
BACKENDS = [pytest.param("xla", id="layoutA"), pytest.param("native", id="layoutB")]


def plan_args(store: Path | str, *extra: str, buckets: str = "128,256", graphs: int = 2, backend: str = "xla"
              ) -> list[str]:
    return ["plan", "--instance", INSTANCE, "--store", str(store), "--bucket", f"SEQ={buckets}", "--quiet", *extra,
            "--", *WORKLOAD, "--model", "llama-tiny", "--bucket", "{SEQ}", "--graphs", str(graphs),
            "--backend", backend]


def plan_json(cli: Cli, tmp_path: Path, *args: str, rc: int = 0, **env: str) -> dict[str, Any]:
    """Run a plan with a fresh compiler invocation log and a private TMPDIR: afterwards neither may
    hold anything (no compile ran; the scratch root is gone)."""
    log, tmp = tmp_path / f"plan-compiles-{time.monotonic_ns()}.jsonl", tmp_path / f"plan-tmp-{time.monotonic_ns()}"
    tmp.mkdir()
    data = cli.json(*args, rc=rc, NEFFSIM_INVOCATION_LOG=str(log), TMPDIR=str(tmp), **env)
    assert read_invocation_log(log) == [], "plan ran the compiler"
    assert list(tmp.iterdir()) == [], f"plan left {list(tmp.iterdir())}"
    assert data["scratch_removed"] is True
    for graph in data["graphs"]:  # what why-miss --from-report reads back
        assert WantedGraph.from_json(graph).path == graph["path"]
    return data


def no_placeholders(*roots: Path) -> None:
    for root in roots:
        for entry in scan(LocalStore(root)).entries:
            neff = get_layout(entry.layout).neff_of(entry)
            assert neff is not None and not file_is_placeholder(root / entry.store_path(neff)), entry.path


def misses(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for g in data["graphs"] if g["status"] != "hit"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_warm_job_plans_no_miss_and_a_new_bucket_exactly_its_graphs(cli: Cli, tmp_path: Path, index: Index,
                                                                       backend: str) -> None:
    store = tmp_path / "store"
    cli.json(*warm_args(store, backend=backend), NEFFSIM_COMPILE_SECONDS="0.3")
    compiled = len(cli.sim.compiles())
    assert compiled == 4

    warm = plan_json(cli, tmp_path, *plan_args(store, "--require-warm", backend=backend))
    assert data_totals(warm) == {"graphs": 4, "hits": 4, "misses": 0}
    assert all(g["store"] == f"file://{store}" for g in warm["graphs"]) and warm["index"] is True
    assert {g["bucket"] for g in warm["graphs"]} == {"SEQ=128", "SEQ=256"}

    cold = plan_json(cli, tmp_path, *plan_args(store, "--require-warm", "--parallel", "2", "--hosts", "3",
                                               buckets="128,256,512", backend=backend), rc=NOT_WARM)
    assert data_totals(cold) == {"graphs": 6, "hits": 4, "misses": 2}
    assert {g["bucket"] for g in misses(cold)} == {"SEQ=512"}
    assert [b["misses"] for b in cold["buckets"]] == [0, 0, 2]
    fc = cold["forecast"]
    # From the index's history: the warm-up's compiles of the same-sized HLOs for trn2 (0.3 s each).
    assert fc["by_basis"] == {"same-graph": 0, "size-fit": 2, "unknown": 0}
    assert fc["compile_seconds"] >= 0.6 and fc["compile_hours"] == pytest.approx(fc["compile_seconds"] / 3600, abs=1e-6)
    assert fc["slots"] == 6 and fc["eta_seconds"] == pytest.approx(max(e["seconds"] for e in fc["estimates"]))
    assert len(cli.sim.compiles()) == compiled
    no_placeholders(store)
    healthy(store)

    text = cli.run(*plan_args(store, buckets="128,256,512", backend=backend))
    assert text.returncode == 0, text.stderr
    assert "SEQ=512" in text.stdout and "of compile time estimated" in text.stdout and "ETA:" in text.stdout
    assert "neffcache why-miss --from-report FILE" in text.stdout


def data_totals(data: dict[str, Any]) -> dict[str, int]:
    return dict(data["totals"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_warm_compiles_exactly_the_misses_and_the_next_plan_has_none(cli: Cli, tmp_path: Path, backend: str) -> None:
    store, shared = tmp_path / "nvme", tmp_path / "shared"
    cli.json(*warm_args(store, "--store", str(shared), backend=backend))
    before = len(cli.sim.compiles())
    data = cli.json(*plan_args(store, "--store", str(shared), "--warm", "--require-warm", buckets="128,256,512",
                               backend=backend))
    assert data_totals(data) == {"graphs": 6, "hits": 4, "misses": 2}
    assert data["warm"]["ok"] and data["warm"]["totals"]["compiled"] == 2
    assert len(cli.sim.compiles()) == before + 2
    assert {c["graph"] for c in cli.sim.compiles()[before:]} == {"llama-tiny/b512/g0", "llama-tiny/b512/g1"}
    again = plan_json(cli, tmp_path, *plan_args(store, "--require-warm", buckets="128,256,512", backend=backend))
    assert data_totals(again) == {"graphs": 6, "hits": 6, "misses": 0}
    assert len(healthy(shared).entries) == 6  # published to every writable tier
    no_placeholders(store, shared)
    # The runtime itself, pointed at the store, finds every graph plan --warm compiled.
    counts = summary(cli.workload(store, "--model", "llama-tiny", "--bucket", "512", "--graphs", "2",
                                  backend=backend).stderr)
    assert (counts["hits"], counts["compiled"]) == (2, 0)


def test_a_compiler_bump_is_forecast_from_the_same_graphs_history(cli: Cli, tmp_path: Path, index: Index) -> None:
    store = tmp_path / "store"
    cli.json(*warm_args(store), NEFFSIM_COMPILE_SECONDS="0.4")
    cli.bump(V2)
    data = plan_json(cli, tmp_path, *plan_args(store, "--require-warm"), rc=NOT_WARM)
    assert data["toolchain"]["compiler_version"] == V2
    assert data_totals(data) == {"graphs": 4, "hits": 0, "misses": 4}
    assert all(g["namespace"].endswith(f"neuronxcc-{V2}") for g in data["graphs"])
    assert data["forecast"]["by_basis"]["same-graph"] == 4
    assert all(e["seconds"] >= 0.4 for e in data["forecast"]["estimates"])


def test_the_index_down_still_plans_from_the_stores(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    cli.json(*warm_args(store))
    data = plan_json(cli, tmp_path, *plan_args(store, "--require-warm", buckets="128,256,512"), rc=NOT_WARM,
                     NEFFCACHE_INDEX_URL=f"http://127.0.0.1:{free_port()}", NEFFCACHE_TOKEN="t")
    assert data_totals(data) == {"graphs": 6, "hits": 4, "misses": 2}
    assert data["index"] is False and any("index did not answer" in n for n in data["notes"])
    assert data["forecast"]["by_basis"]["unknown"] == 2


def test_layout_a_without_extraction_records_the_compiles_instead(cli: Cli, tmp_path: Path) -> None:
    store = tmp_path / "store"
    cli.json(*warm_args(store, workload=("--flags=--model-type=transformer",)))
    data = plan_json(cli, tmp_path, *plan_args(store, "--no-extract", buckets="128,512"))
    assert data_totals(data) == {"graphs": 4, "hits": 0, "misses": 4}  # other flags: other entries
    assert [b["recorded_compiles"] for b in data["buckets"]] == [2, 2]
    assert all(g["hlo_sha256"] and g["hlo_size"] == 20_000 and g["flags"] == [] for g in data["graphs"])
    same = plan_json(cli, tmp_path, *plan_args(store, "--no-extract", buckets="128"))
    assert data_totals(same)["graphs"] == 2


def test_shard_plans_its_own_buckets_and_a_failed_discovery_exits_1(cli: Cli, tmp_path: Path) -> None:
    data = plan_json(cli, tmp_path, *plan_args(tmp_path / "store", "--shard", "1/2", buckets="128,256,512"))
    assert [b["bucket"] for b in data["buckets"]] == ["SEQ=256"]
    crashed = plan_json(cli, tmp_path, *plan_args(tmp_path / "store", buckets="128", graphs=2)[:-2],
                        "--backend", "native", "--crash-after", "1", rc=1)
    assert crashed["discovery_failed"] == ["SEQ=128"]


def test_ctrl_c_removes_the_scratch_root(cli: Cli, tmp_path: Path) -> None:
    tmp = tmp_path / "plan-tmp"
    tmp.mkdir()
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = cli.popen("plan", "--instance", INSTANCE, "--store", str(tmp_path / "store"), "--", *hang,
                     TMPDIR=str(tmp))
    deadline = time.monotonic() + 60
    while not any(p.name.startswith("neffcache-plan-") for p in tmp.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.5)  # the workload is running
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert list(tmp.iterdir()) == []


def test_bad_input_changes_nothing(cli: Cli, tmp_path: Path) -> None:
    for args, message in ((["--instance", "trn9.huge"], "unknown instance type"),
                          (["--instance", INSTANCE, "--bucket", "BAD KEY=1"], "bucket key"),
                          (["--instance", INSTANCE, "--hosts", "0"], "--hosts")):
        proc = cli.run("plan", "--store", str(tmp_path / "store"), *args, "--", "true")
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "store").exists()
    help_text = cli.run("plan", "--help").stdout
    assert "Example:" in help_text and "--require-warm" in help_text
    assert json.loads(cli.run(*plan_args(tmp_path / "none", "--json", graphs=1, buckets="128")).stdout)["totals"] \
        == {"graphs": 1, "hits": 0, "misses": 1}


@pytest.mark.s3
def test_a_ci_host_plans_and_warms_against_s3_alone(cli: Cli, tmp_path: Path, s3: str) -> None:
    cli.json(*warm_args(tmp_path / "host-a", "--store", s3))
    gate = plan_json(cli, tmp_path, *plan_args(s3, "--require-warm"))
    assert data_totals(gate) == {"graphs": 4, "hits": 4, "misses": 0}
    assert {g["store"] for g in gate["graphs"]} == {s3}
    before = len(cli.sim.compiles())
    warmed = cli.json(*plan_args(s3, "--warm", "--require-warm", buckets="128,256,512"))
    assert data_totals(warmed)["misses"] == 2 and len(cli.sim.compiles()) == before + 2
    assert data_totals(plan_json(cli, tmp_path, *plan_args(s3, "--require-warm", buckets="128,256,512"))) == \
        {"graphs": 6, "hits": 6, "misses": 0}
    remote = open_store(s3, endpoint_url=cli.env["AWS_ENDPOINT_URL_S3"])
    entries = scan(remote).entries
    assert len(entries) == 6
    for entry in entries:
        neff = get_layout(entry.layout).neff_of(entry)
        assert neff is not None and not is_placeholder(remote.read_bytes(entry.store_path(neff))[:64])


def test_layout_b_locks_of_a_plan_stay_out_of_the_hosts_shared_lock_dir(cli: Cli, tmp_path: Path) -> None:
    """TorchNeuron keeps compile locks in one host-local directory every job shares: a plan's
    recording compiles must not take locks there (a job would wait on them)."""
    host_local = tmp_path / "host-local"
    data = plan_json(cli, tmp_path, *plan_args(tmp_path / "store", backend="native"), rc=0,
                     TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR=str(host_local))
    assert data_totals(data)["misses"] == 4
    assert not host_local.exists(), list(host_local.rglob("*"))


def test_a_torchneuron_opt_level_drift_is_planned_as_misses_and_named(cli: Cli, tmp_path: Path) -> None:
    """NEURON_COMPILER_OPT_LEVEL is part of every TorchNeuron key: a job planned with another
    level than the warm-up's misses every graph, and why-miss on the plan names the variable."""
    store = tmp_path / "store"
    cli.json(*warm_args(store, backend="native", buckets="128", graphs=2))
    data = plan_json(cli, tmp_path, *plan_args(store, buckets="128", backend="native"),
                     NEURON_COMPILER_OPT_LEVEL="-O2")
    assert data_totals(data) == {"graphs": 2, "hits": 0, "misses": 2}
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(data))
    explained = cli.json("why-miss", "--from-report", str(plan_file), "--store", str(store))["graphs"]
    assert [g["cause"] for g in explained] == ["NEURON_COMPILER_OPT_LEVEL `-O1` → `-O2`: part of every "
                                               "torchneuron key"] * 2
    same = plan_json(cli, tmp_path, *plan_args(store, buckets="128", backend="native"))
    assert data_totals(same) == {"graphs": 2, "hits": 2, "misses": 0}
