"""Layout ``nxdi``: NxD Inference compiled models read in their three forms (neffcache's managed
namespace, a model's ``neuron-compiled-artifacts/<hash>/``, a NEURON_COMPILED_ARTIFACTS root),
judged without a runtime marker, checked against their config hash, and verified, pushed,
pulled, prefetched and pruned like any entry."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neffcache.entry import EntryState
from neffcache.layouts import get_layout, locate
from neffcache.operations.verify import CheckStatus, verify
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.replication.prefetch import PrefetchRequest, prefetch
from neffcache.replication.sync import sync
from neffcache.scan.report import load_entry, scan
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from tests.runtime_caches import VERSION, all_files, nxdi_config, nxdi_dir, write_nxdi_entry, write_vllm_entry
from tests.simulation import Sim

TC = Toolchain(VERSION, "trn2", 2)
NS = f"trn2-lnc2/nxdi-{VERSION}"
WEIGHT = "weights/tp0_sharded_checkpoint.safetensors"


def _hash(name: str) -> str:
    return hashlib.md5(nxdi_config(name), usedforsecurity=False).hexdigest()


def _managed(root: Path, name: str, **kwargs: object) -> Path:
    return write_nxdi_entry(root / NS / _hash(name), name, **kwargs)  # type: ignore[arg-type]


def test_the_three_forms_read_as_entries(tmp_path: Path) -> None:
    managed = tmp_path / "store"
    _managed(managed, "llama")
    (entry,) = scan(LocalStore(managed)).entries
    assert (entry.layout, entry.state, entry.path, entry.key) == ("nxdi", EntryState.SUCCESS, f"{NS}/{_hash('llama')}",
                                                                  _hash("llama"))
    assert entry.namespace.toolchain == TC and WEIGHT in entry.files and "model.pt" in entry.files

    model = tmp_path / "Llama-3.1-8B"  # a model directory: NxDI's default place
    write_nxdi_entry(nxdi_dir(model, "llama"), "llama")
    (model / "config.json").write_text("{}")  # the model's own files stay foreign
    report = scan(LocalStore(model))
    (bare,) = report.entries
    assert bare.path == f"neuron-compiled-artifacts/{_hash('llama')}" and bare.namespace.toolchain is None
    assert bare.state is EntryState.SUCCESS and [f.path for f in report.foreign] == ["config.json"]

    root = write_nxdi_entry(tmp_path / "compiled", "llama")  # NEURON_COMPILED_ARTIFACTS itself
    (root / "notes.txt").write_text("mine")
    report = scan(LocalStore(root))
    (whole,) = report.entries
    assert (whole.path, whole.key, whole.state) == ("", "", EntryState.SUCCESS)
    assert set(whole.files) == {"model.pt", "neuron_config.json", WEIGHT, "weights/tp1_sharded_checkpoint.safetensors"}
    assert [f.path for f in report.foreign] == ["notes.txt"]
    loaded = load_entry(LocalStore(root), "")
    assert loaded is not None and loaded.state is EntryState.SUCCESS


def test_a_directory_nxdi_still_writes_is_in_progress_and_a_dead_one_corrupt(tmp_path: Path) -> None:
    """No runtime marker: an entry once nothing changed for SETTLE_SECONDS (docs/runtimes.md)."""
    root = tmp_path / "store"
    fresh = _managed(root, "writing", settled=False)
    dead = _managed(root, "died")
    (dead / "model.pt").unlink()
    old = time.time() - 7200
    os.utime(dead / "neuron_config.json", (old, old))
    states = {e.key: (e.state, e.problems) for e in scan(LocalStore(root)).entries}
    assert states[_hash("writing")][0] is EntryState.LOCKED and "in progress" in states[_hash("writing")][1][0]
    assert states[_hash("died")][0] is EntryState.CORRUPT and "no model.pt" in states[_hash("died")][1][0]
    # Prune keeps the compile in progress, whatever the rules.
    store = LocalStore(root)
    plan = plan_prune([store], PrunePolicy(garbage=True, stale_locks=True, grace=0, lock_age=0))
    assert fresh.relative_to(root).as_posix() not in {i.path for i in plan.items}
    # Neither is copied anywhere.
    assert not sync(store, LocalStore(tmp_path / "other")).copied


def test_a_directory_named_by_another_configs_hash_is_reported_and_never_copied(tmp_path: Path) -> None:
    root = tmp_path / "store"
    good = _managed(root, "llama")
    swapped = root / NS / _hash("mistral")
    write_nxdi_entry(swapped, "llama")  # llama's config under mistral's name: NxDI would load the wrong model
    report = verify(LocalStore(root))
    statuses = {c.path: (c.status, c.problems) for c in report.checks}
    # Reported, but a runtime's own directory is never CORRUPT on an inferred rule (--fix
    # would quarantine it): how NxDI hashes its config is unverified (docs/runtimes.md).
    assert statuses[f"{NS}/{_hash('mistral')}"][0] is CheckStatus.UNVERIFIED
    assert "names another configuration" in statuses[f"{NS}/{_hash('mistral')}"][1][0]
    assert not report.corrupt
    assert statuses[good.relative_to(root).as_posix()][0] is CheckStatus.UNVERIFIED
    pushed = sync(LocalStore(root), LocalStore(tmp_path / "shared"))
    assert [c.path for c in pushed.copied] == [f"{NS}/{_hash('llama')}"]
    assert [f.path for f in pushed.failed] == [f"{NS}/{_hash('mistral')}"]
    assert "another configuration" in pushed.failed[0].reason
    assert not (tmp_path / "shared" / NS / _hash("mistral")).exists()


def test_push_pull_verify_roundtrip_and_the_root_lands_under_its_hash(tmp_path: Path) -> None:
    model = tmp_path / "model"
    write_nxdi_entry(nxdi_dir(model, "llama"), "llama")
    shared = LocalStore(tmp_path / "shared")
    first = sync(LocalStore(model), shared)
    assert len(first.copied) == 1 and not first.failed
    (copy,) = scan(shared, read_manifests=True).entries
    assert copy.state is EntryState.SUCCESS and copy.manifest is not None and copy.manifest.computed
    assert set(copy.manifest.files) >= {"model.pt", "neuron_config.json", WEIGHT, "neffcache.done"}
    assert [c.status for c in verify(shared).checks] == [CheckStatus.OK]
    assert not sync(LocalStore(model), shared).copied  # idempotent

    root = write_nxdi_entry(tmp_path / "compiled", "mistral")  # a NEURON_COMPILED_ARTIFACTS directory
    again = sync(LocalStore(root), shared)
    assert len(again.copied) == 1, again.failed
    assert (shared.root / "neuron-compiled-artifacts" / _hash("mistral") / "neffcache.done").is_file()
    assert [s.reason for s in sync(LocalStore(root), shared).skipped] == ["exists"]

    back = LocalStore(tmp_path / "pulled")
    assert len(sync(shared, back).copied) == 2
    for entry in scan(back).entries:
        source = model / "neuron-compiled-artifacts" / entry.key if entry.key == _hash("llama") else root
        assert (back.root / entry.base / "model.pt").read_bytes() == (source / "model.pt").read_bytes()
    # Tampered in the store: verify says so, a pull does not land it.
    (shared.root / copy.base / WEIGHT).write_bytes(b"x" * 300)
    assert [c.path for c in verify(shared).corrupt] == [copy.path]
    pulled = sync(shared, LocalStore(tmp_path / "again"))
    assert [f.path for f in pulled.failed] == [copy.path] and len(pulled.copied) == 1


def test_prefetch_and_prune_by_compiler(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    _managed(shared, "llama")
    newer = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
    write_nxdi_entry(shared / newer.target_dir / f"nxdi-{newer.compiler_version}" / _hash("llama"), "llama")
    pushed = sync(LocalStore(shared), LocalStore(tmp_path / "managed"))  # manifests and markers of our own
    assert len(pushed.copied) == 2
    layout = get_layout("nxdi")
    local = LocalStore(tmp_path / "nvme")
    got = prefetch([LocalStore(tmp_path / "managed")], local, PrefetchRequest(namespaces=(layout.namespace_for(TC),)))
    assert [f.path for f in got.copied] == [f"{NS}/{_hash('llama')}"] and got.ok
    assert (local.root / NS / _hash("llama") / "model.pt").is_file()
    store = LocalStore(tmp_path / "managed")
    plan = plan_prune([store], PrunePolicy(keep_compilers=(newer.compiler_version,)))
    assert [i.path for i in plan.items] == [f"{NS}/{_hash('llama')}"]
    execute_plan(plan, [store])
    assert [e.namespace.compiler_version for e in scan(store).entries] == [newer.compiler_version]
    assert not [p for p in (store.root / NS).rglob("*") if p.is_file()]


def test_no_other_layouts_path_is_claimed(tmp_path: Path) -> None:
    """vLLM's entries hold a model.pt and a neuron_config.json too: they stay vLLM's."""
    root = tmp_path / "store"
    write_vllm_entry(root / f"trn2-lnc2/vllm-{VERSION}", "x", flat=True)
    write_vllm_entry(root, "y")
    assert {e.layout for e in scan(LocalStore(root)).entries} == {"vllm"}
    key = _hash("z")
    for path in (f"{NS}/{key}/../model.pt", f"{NS}/{key.upper()}/model.pt", f"neuron-compiled-artifacts/{key}x/a",
                 "models/model.pt", "weights", f"trn9-lnc2/nxdi-{VERSION}/{key}/model.pt"):
        found = locate(path)
        assert found is None or found.namespace.layout != "nxdi", path


def test_write_and_removal_order() -> None:
    layout = get_layout("nxdi")
    ns = layout.namespace_for(TC)
    names = layout.names(ns, "k")
    order = layout.write_order([WEIGHT, "model.pt", "neuron_config.json", names.marker, names.manifest],
                               names.marker, names.manifest)
    assert order == [names.manifest, WEIGHT, "neuron_config.json", "model.pt", names.marker]
    assert layout.plan_entry(ns, "k").path == f"{NS}/k"
    assert layout.plan_entry(layout.locate_entry("").namespace, "k").path == "neuron-compiled-artifacts/k"  # type: ignore[union-attr]
    assert layout.job_env("/mnt/fsx", ns) == {} and "NEURON_COMPILED_ARTIFACTS" in layout.env_notes("/mnt/fsx", ns)[0]


def test_the_simulated_compile_writes_what_the_layout_reads(sim: Sim, tmp_path: Path) -> None:
    model = tmp_path / "Llama-tiny"
    first = sim.run_nxdi("--model", str(model), "--seq-len", "128,256")
    assert first.returncode == 0, first.stderr
    assert "loaded=0 compiled=1" in first.stderr and len(sim.compiles()) == 4
    (entry_dir,) = (model / "neuron-compiled-artifacts").iterdir()
    config = (entry_dir / "neuron_config.json").read_bytes()
    assert entry_dir.name == hashlib.md5(config, usedforsecurity=False).hexdigest()
    assert json.loads(config)["target"] == "trn2"
    again = sim.run_nxdi("--model", str(model), "--seq-len", "128,256", NEFFSIM_NXDI_MUST_LOAD="1")
    assert again.returncode == 0 and "loaded=1 compiled=0" in again.stderr and len(sim.compiles()) == 4
    missing = sim.run_nxdi("--model", str(model), "--seq-len", "512", NEFFSIM_NXDI_MUST_LOAD="1")
    assert missing.returncode == 1 and "NEFFSIM_NXDI_MUST_LOAD" in missing.stderr
    old = time.time() - 3600
    for p in [entry_dir, *entry_dir.rglob("*")]:
        os.utime(p, (old, old))
    (entry,) = scan(LocalStore(model)).entries
    assert entry.state is EntryState.SUCCESS and entry.key == entry_dir.name and len(entry.files) == 4
    before = all_files(model)
    assert [c.status for c in verify(LocalStore(model)).checks] == [CheckStatus.UNVERIFIED]
    assert all_files(model) == before


@pytest.mark.parametrize("name", ["model.pt", "neuron_config.json"])
def test_hostile_files_are_per_entry_problems(tmp_path: Path, name: str) -> None:
    root = tmp_path / "store"
    good = _managed(root, "good")
    bad = _managed(root, "bad")
    (bad / name).unlink()
    os.mkfifo(bad / name)
    link = _managed(root, "link")
    (link / "model.pt").unlink()
    (link / "model.pt").symlink_to("/etc/passwd")
    report = scan(LocalStore(root))
    states = {e.key: e.state for e in report.entries}
    assert states[good.name] is EntryState.SUCCESS
    assert states[link.name] is EntryState.CORRUPT
    assert states.get(bad.name) is not EntryState.SUCCESS
    result = sync(LocalStore(root), LocalStore(tmp_path / "shared"))
    assert good.relative_to(root).as_posix() in [c.path for c in result.copied]


def _age(root: Path) -> None:
    old = time.time() - 3600  # the compile long finished: settled
    for p in [root, *root.rglob("*")]:
        os.utime(p, (old, old))


def test_a_compiled_model_pushed_with_its_toolchain_is_prefetched_and_loads_without_compiling(
        sim: Sim, tmp_path: Path) -> None:
    """The NxDI cold start end to end: compiled on one host (a model's default directory and a
    NEURON_COMPILED_ARTIFACTS one), pushed into the toolchain's namespace, prefetched on another,
    loaded there with nothing compiled."""
    def neffcache(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args], env=sim.env, capture_output=True,
                              text=True, timeout=120, check=False)

    model, artifacts, shared = tmp_path / "Llama-tiny", tmp_path / "compiled", tmp_path / "shared"
    assert sim.run_nxdi("--model", str(model)).returncode == 0
    assert sim.run_nxdi("--model", str(model), "--tp-degree", "4",
                        NEURON_COMPILED_ARTIFACTS=str(artifacts)).returncode == 0
    _age(model)
    _age(artifacts)
    for src in (model, artifacts):
        pushed = neffcache("push", str(src), str(shared), "--adopt-instance", "trn2.48xlarge", "--json")
        assert pushed.returncode == 0 and json.loads(pushed.stdout)["copied"] == 1, pushed.stderr
    entries = scan(LocalStore(shared), read_manifests=True).entries
    namespace = get_layout("nxdi").namespace_for(Toolchain("2.27.5334.0+f702b353", "trn2", 2))
    assert {e.namespace for e in entries} == {namespace} and len(entries) == 2
    assert all(e.state is EntryState.SUCCESS and e.manifest is not None and e.manifest.toolchain == namespace.toolchain
               for e in entries)
    again = neffcache("push", str(model), str(shared), "--adopt-instance", "trn2.48xlarge", "--json")
    assert json.loads(again.stdout)["copied"] == 0  # found where it was published

    local = tmp_path / "nvme"
    fetched = neffcache("prefetch", "--instance", "trn2.48xlarge", "--layout", "nxdi", "--store", str(shared),
                        "--to", str(local), "--json")
    assert fetched.returncode == 0 and json.loads(fetched.stdout)["copied"] == 2, fetched.stderr
    before = len(sim.compiles())
    (default,) = (model / "neuron-compiled-artifacts").iterdir()
    loaded = sim.run_nxdi("--model", str(model), NEURON_COMPILED_ARTIFACTS=str(local / namespace.path / default.name),
                          NEFFSIM_NXDI_MUST_LOAD="1")
    assert loaded.returncode == 0 and "loaded=1 compiled=0" in loaded.stderr, loaded.stderr
    assert len(sim.compiles()) == before
