"""The simulated runtime and neffcache agree on what a cache holds, in both layouts."""

from __future__ import annotations

import re

from neffcache.application.jobenv import job_env
from neffcache.entry import EntryState
from neffcache.operations.ingest import transfer
from neffcache.operations.verify import CheckStatus, verify
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain, compiler_version
from tests.simulation import Sim

HIT = re.compile(r"Using a cached neff at |\[NEFF_CACHE\] Cache HIT")
MISS = re.compile(r"Call compiler with cmd: |\[NEFF_CACHE\] Cache MISS")


def counts(stderr: str) -> tuple[int, int]:
    lines = stderr.splitlines()
    return sum(bool(HIT.search(x)) for x in lines), sum(bool(MISS.search(x)) for x in lines)


def toolchain(sim: Sim) -> Toolchain:
    return Toolchain.for_instance("trn2.48xlarge", compiler_version(sim.bin_dir / "neuronx-cc"))


def test_workload_twice_second_all_hits_both_layouts(sim: Sim) -> None:
    store = LocalStore(sim.root / "store")
    env, _ = job_env(str(store.root), toolchain(sim))
    args = ["--model", "llama-tiny", "--bucket", "128,256", "--graphs", "3"]
    for backend in ("xla", "native"):
        first = sim.run_workload(*args, "--backend", backend, **env)
        assert first.returncode == 0, first.stderr
        assert counts(first.stderr) == (0, 6)
        second = sim.run_workload(*args, "--backend", backend, **env)
        assert second.returncode == 0, second.stderr
        # TorchNeuron's lines come from a fresh process's in-memory dictionary: a MISS for every
        # graph, served by the disk all the same (the runtime's own count says so).
        assert counts(second.stderr) == ((6, 0) if backend == "xla" else (0, 6)), second.stderr
        assert "graphs=6 hits=6 compiled=0" in second.stderr
    report = scan(store)
    by_layout = {s.namespace.layout: s for s in report.namespaces()}
    assert by_layout["neuronxcc"].entries == 6 and by_layout["neuronxcc"].states == {"SUCCESS": 6}
    assert by_layout["torchneuron"].entries == 6 and by_layout["torchneuron"].states == {"SUCCESS": 6}
    assert all(e.toolchain == toolchain(sim) for e in report.entries)
    assert report.garbage == () and report.uncommitted == ()
    assert len(sim.compiles()) == 12  # each graph compiled once per layout


def test_runtime_entries_ingested_then_served_from_a_fresh_root(sim: Sim) -> None:
    """Entries the runtime wrote (no manifest) get one on ingest; the copy serves a new host."""
    tc = toolchain(sim)
    host_a = LocalStore(sim.root / "host-a")
    env_a, _ = job_env(str(host_a.root), tc)
    args = ["--model", "bert", "--bucket", "64", "--graphs", "4"]
    assert sim.run_workload(*args, **env_a).returncode == 0
    shared = LocalStore(sim.root / "shared", shared=True)
    for entry in scan(host_a).entries:
        assert entry.state is EntryState.SUCCESS and entry.manifest is None
        transfer(host_a, entry, shared, tags={"model": "bert"})
    checked = verify(shared)
    assert checked.count(CheckStatus.OK) == 4
    report = scan(shared, read_manifests=True)
    assert all(e.manifest is not None and e.manifest.computed and e.manifest.tags["model"] == "bert"
               for e in report.entries)
    env_b, _ = job_env(str(shared.root), tc)
    rerun = sim.run_workload(*args, **env_b)
    assert counts(rerun.stderr) == (4, 0), rerun.stderr
