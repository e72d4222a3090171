"""Layouts read caches exactly as the runtimes write them."""

from __future__ import annotations

import os
from pathlib import Path

from neffcache.entry import EntryState
from neffcache.layouts import get_layout, locate
from neffcache.layouts.torchneuron import shard
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from tests.runtime_caches import VERSION, module_name, write_neuronxcc_entry


def test_libneuronxla_root_all_states(tmp_path: Path) -> None:
    root = tmp_path / "neuron-compile-cache"
    write_neuronxcc_entry(root, b"hlo-success")
    write_neuronxcc_entry(root, b"hlo-legacy", version="2.12.54.0+f631c2365", legacy=True)
    write_neuronxcc_entry(root, b"hlo-failed", state="FAILED")
    write_neuronxcc_entry(root, b"hlo-locked", state="LOCKED")
    write_neuronxcc_entry(root, b"hlo-empty", state="EMPTY")
    report = scan(LocalStore(root))
    states = {e.key: e.state for e in report.entries}
    assert states == {
        module_name(b"hlo-success", "--model-type=transformer"): EntryState.SUCCESS,
        module_name(b"hlo-legacy", "--model-type=transformer", "2.12.54.0+f631c2365"): EntryState.SUCCESS,
        module_name(b"hlo-failed", "--model-type=transformer"): EntryState.FAILED,
        module_name(b"hlo-locked", "--model-type=transformer"): EntryState.LOCKED,
        module_name(b"hlo-empty", "--model-type=transformer"): EntryState.EMPTY,
    }
    assert report.garbage == ()  # the root lock file is the runtime's, not garbage
    legacy = next(e for e in report.entries if e.namespace.compiler_version == "2.12.54.0+f631c2365")
    assert legacy.marker_name == "model.neff"
    # A root the runtime filled has no target directory: the toolchain is unknown.
    assert all(e.namespace.target is None for e in report.entries)
    assert {s.namespace.path for s in report.namespaces()} == {f"neuronxcc-{VERSION}", "neuronxcc-2.12.54.0+f631c2365"}


def test_corrupt_states(tmp_path: Path) -> None:
    root = tmp_path / "c"
    e1 = write_neuronxcc_entry(root, b"done-no-neff")
    (e1 / "model.neff").unlink()
    e2 = write_neuronxcc_entry(root, b"empty-neff")
    (e2 / "model.neff").write_bytes(b"")
    e3 = write_neuronxcc_entry(root, b"interrupted")
    (e3 / "model.done").unlink()
    report = scan(LocalStore(root))
    corrupt = {e.key: e.problems for e in report.entries if e.state is EntryState.CORRUPT}
    assert set(corrupt) == {e1.name, e2.name}
    assert "model.done without model.neff" in corrupt[e1.name]
    assert [e.key for e in report.uncommitted] == [e3.name]
    assert len(report.warnings) == 2


def test_manifest_mismatch_is_corrupt(tmp_path: Path) -> None:
    from neffcache.operations.cache import NeffCache

    tc = Toolchain("2.27.5334.0+f702b353", "trn1", 1)
    store = LocalStore(tmp_path / "b")
    NeffCache(store).put(b"hlo", [], tc, b"N" * 100)
    (entry,) = scan(store).entries
    path = store.root / entry.store_path(entry.marker_name)
    path.write_bytes(b"N" * 50)
    (entry,) = scan(store, read_manifests=True).entries
    assert entry.state is EntryState.CORRUPT
    assert any("manifest says 100" in p for p in entry.problems)


def test_torchneuron_bare_dir(tmp_path: Path) -> None:
    """A TORCH_NEURONX_NEFF_CACHE_DIR a job filled directly: ab/cd/<key>.neff."""
    key = "ab" + "cd" + "0" * 60
    neff = tmp_path / "neffs" / shard(key)
    neff.parent.mkdir(parents=True)
    Path(str(neff) + ".neff").write_bytes(os.urandom(100))
    (entry,) = scan(LocalStore(tmp_path / "neffs")).entries
    assert entry.layout == "torchneuron" and entry.state is EntryState.SUCCESS and entry.key == key
    assert entry.namespace.path == ""


def test_locate_rejects_foreign_paths() -> None:
    assert locate("random/file.txt") is None
    assert locate("neuronxcc-2.21/not-a-module/model.neff") is None
    assert locate("trn9-lnc2/neuronxcc-2.21/MODULE_1+2/model.neff") is None
    hit = locate("trn2-lnc2/neuronxcc-2.21.1/MODULE_1+2/model.neff")
    assert hit is not None and hit.namespace.target == "trn2" and hit.namespace.lnc == 2
    bad_shard = f"trn2-lnc2/torchneuron-2.21/neff/ff/ff/{'ab' * 32}.neff"
    assert locate(bad_shard) is None


def test_job_env_points_runtimes_at_namespace() -> None:
    tc = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
    a = get_layout("neuronxcc")
    b = get_layout("torchneuron")
    assert a.job_env("/mnt/fsx/c", a.namespace_for(tc)) == {"NEURON_COMPILE_CACHE_URL": "/mnt/fsx/c/trn2-lnc2"}
    env = b.job_env("/mnt/fsx/c", b.namespace_for(tc))
    assert env["TORCH_NEURONX_NEFF_CACHE_DIR"] == "/mnt/fsx/c/trn2-lnc2/torchneuron-2.27.5334.0+f702b353/neff"
