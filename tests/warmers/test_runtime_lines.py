"""The log consumers on the runtimes' real line forms: work-directory compiles (neuronxcc), op keys
with no failure line (torchneuron), compile seconds per entry from the lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from neffcache.entry import EntryState
from neffcache.layouts import LAYOUTS, get_layout
from neffcache.scan.report import load_entry
from neffcache.stores import open_store
from neffcache.toolchain import Toolchain
from neffcache.warmers.logscan import LogCounter, compile_patterns
from neffcache.warmers.report import GroupReport
from neffcache.warmers.workload import WorkloadRun, clean_after_dead_workload
from tests.runtime_caches import write_neuronxcc_entry
from tests.warmers.conftest import Cli, healthy, warm_args

TC = Toolchain("2.21.33363.0+82129205", "trn2", 2)
WORKDIR = "/tmp/ubuntu/neuroncc_compile_workdir/5d7c1a52-8f0e-4b1a-9c33-0e1f2a3b4c5d"


def test_stale_lock_found_from_a_work_directory_compile_line(tmp_path: Path) -> None:
    """libneuronxla compiles in /tmp/<user>/neuroncc_compile_workdir/<uuid>/: the line names the
    entry only by its MODULE name, which is enough to find the lock a killed job left."""
    root = tmp_path / "store"
    entry_dir = write_neuronxcc_entry(root / "trn2-lnc2", b"HLO" * 100, state="LOCKED")
    module = entry_dir.name
    counter = LogCounter(compile_patterns(), str(root), [lay.namespace_for(TC) for lay in LAYOUTS.values()])
    counter.feed(f"2026-01-01 10:00:00.000000:  7  INFO ||NEURON_CC_WRAPPER||: Call compiler with cmd: neuronx-cc "
                 f"compile --framework=XLA {WORKDIR}/model.{module}.hlo_module.pb --output "
                 f"{WORKDIR}/model.{module}.neff --target=trn2 --lnc=2 --verbose=35")
    path = str(entry_dir.relative_to(root))
    assert counter.entries("compile") == [path]
    store = open_store(str(root))
    run = WorkloadRun(GroupReport("b"), counter, started=entry_dir.stat().st_mtime - 5)
    assert clean_after_dead_workload(store, run) == [path]
    found = load_entry(store, path)
    assert found is not None and found.state is EntryState.EMPTY


def test_a_lock_older_than_the_run_is_not_ours(tmp_path: Path) -> None:
    root = tmp_path / "store"
    entry_dir = write_neuronxcc_entry(root / "trn2-lnc2", b"HLO" * 100, state="LOCKED")
    counter = LogCounter(compile_patterns(), str(root), [get_layout("neuronxcc").namespace_for(TC)])
    counter.feed(f"Call compiler with cmd: neuronx-cc compile {WORKDIR}/model.{entry_dir.name}.hlo_module.pb")
    run = WorkloadRun(GroupReport("b"), counter, started=entry_dir.stat().st_mtime + 3600)
    assert clean_after_dead_workload(open_store(str(root)), run) == []
    assert (entry_dir / "model.hlo_module.pb.lock").exists()


def test_native_warm_failure_is_a_failed_graph_named_by_its_op_key(cli: Cli, tmp_path: Path) -> None:
    """TorchNeuron has no failure line: a MISS never followed by a stored NEFF in a run that
    exited non-zero is the graph it failed on (not a crash), named by its op key."""
    store = tmp_path / "store"
    report = cli.json(*warm_args(store, "--parallel", "2", backend="native"), rc=1, NEFFSIM_FAIL_MATCH="b128/g1")
    groups = {g["name"]: g for g in report["groups"]}
    failed = groups["SEQ=128"]
    assert (failed["status"], failed["compiled"], failed["failed"]) == ("failed", 1, 1), failed
    assert failed["failures"][0]["what"] == "aten::add_t0_(128, 64)_llama-tiny_g1"
    assert "RuntimeError" in failed["failures"][0]["reason"]
    assert (groups["SEQ=256"]["status"], groups["SEQ=256"]["compiled"]) == ("ok", 2)
    entries = healthy(store).entries
    done = [e for e in entries if e.state is EntryState.SUCCESS]
    assert len(done) == 3 and all(e.manifest and e.manifest.compile_seconds is not None for e in done)
    # The failed graph left only its HLO (failures are not cached): pending, compiled next time.
    assert [e.state for e in entries if e not in done] == [EntryState.EMPTY]


def test_run_reports_counts_per_namespace(cli: Cli, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    job = (sys.executable, "-m", "neffcache.testing.workload", "--graphs", "2", "--backend", "native")
    proc = cli.run("run", "--instance", "trn2.48xlarge", "--store", str(tmp_path / "s"), "--report", str(report),
                   "--", *job)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    (ns,) = [k for k in data["namespaces"] if "/torchneuron-" in k]
    assert data["namespaces"][ns] == {"hit": 0, "miss": 2, "compile": 2, "failure": 0}
    assert data["published"] == 2 and len(data["compile_seconds"]) == 2


def _both_writers(*extra: str) -> tuple[str, ...]:
    """A TorchNeuron job whose graphs go through the C++ writer and whose kernels through the
    Python kernel path: both write the one TORCH_NEURONX_NEFF_CACHE_DIR."""
    return (sys.executable, "-m", "neffcache.testing.workload", "--backend", "native", "--graphs", "3",
            "--kernels", "2", *extra)


def test_a_cache_both_torchneuron_writers_filled_scans_whole_survives_prune_and_serves_a_rerun(
        cli: Cli, tmp_path: Path) -> None:
    """Done means of issue 35 for TorchNeuron: every NEFF of both writers is an entry, a garbage
    prune with no grace removes none of them, and a rerun served from disk counts 0 compiles
    although the runtime prints a MISS line for every graph it looks up."""
    store = tmp_path / "s"
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    run = ("run", "--instance", "trn2.48xlarge", "--store", str(store))
    proc = cli.run(*run, "--report", str(first), "--", *_both_writers())
    assert proc.returncode == 0, proc.stderr
    data = json.loads(first.read_text())
    assert (data["hit"], data["miss"], data["compile"]) == (0, 5, 5) and data["published"] == 5
    ns = get_layout("torchneuron").namespace_for(Toolchain(data["env"]["TORCH_NEURONX_NEFF_CACHE_DIR"]
                                                           .split("torchneuron-")[1].split("/")[0], "trn2", 2))
    report = healthy(store)
    neffs = sorted(p for p in (store / ns.path / "neff").rglob("*.neff"))
    assert len(neffs) == 5 and len([e for e in report.entries if e.namespace == ns]) == 5
    assert sum("/" in e.key for e in report.entries) == 2  # the kernels' <K>/<K> entries
    pruned = cli.run("prune", "--store", str(store), "--garbage", "--grace", "0s", "--yes")
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(p for p in (store / ns.path / "neff").rglob("*.neff")) == neffs
    proc = cli.run(*run, "--report", str(second), "--", *_both_writers("--steps", "2"),
                   TORCH_NEURONX_COMPILE_ONLY="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("Cache MISS") == 3 and proc.stderr.count("Cache HIT") == 6
    again = json.loads(second.read_text())
    # The graphs the C++ writer looked up were served by the disk; the kernels' lookups print
    # no line (a lower bound: never counted as misses); in-process HITs are not cache hits.
    assert (again["hit"], again["miss"], again["compile"]) == (3, 0, 0), again
    assert again["published"] == 0 and again["graphs"] == []


def test_warm_counts_torchneuron_compiles_from_the_cache(cli: Cli, tmp_path: Path) -> None:
    """Warming twice: the first warm compiles every graph and kernel (the kernels, which no line
    announces, in a row of their own), the second compiles nothing and hits every graph."""
    store = tmp_path / "store"
    first = cli.json(*warm_args(store, backend="native", workload=("--kernels", "1")))
    rows = {g["name"]: g for g in first["groups"]}
    assert [rows[b]["compiled"] for b in ("SEQ=128", "SEQ=256")] == [2, 2]
    assert rows["(unattributed)"]["compiled"] == 2
    assert sum(g["compiled"] for g in first["groups"]) == 6 == len(healthy(store).entries)
    second = cli.json(*warm_args(store, backend="native", workload=("--kernels", "1")))
    assert sum(g["compiled"] for g in second["groups"]) == 0
    assert sum(g["hits"] for g in second["groups"]) == 4
