"""Layout C read, verified, pushed, pulled and pruned as vLLM-Neuron writes it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from neffcache.application.jobenv import job_env
from neffcache.entry import EntryState
from neffcache.layouts import get_layout
from neffcache.operations.scan import scan
from neffcache.operations.verify import CheckStatus, verify
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.replication.sync import sync
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from tests.runtime_caches import VERSION, all_files, write_vllm_entry
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint

__all__ = ["aws_env", "moto_server", "s3_endpoint"]

TC = Toolchain(VERSION, "trn2", 2)
NS = f"trn2-lnc2/vllm-{VERSION}"


def _age(root: Path, seconds: float) -> None:
    old = time.time() - seconds
    for p in root.rglob("*"):
        os.utime(p, (old, old))


def _managed(tmp_path: Path) -> Path:
    """A store whose namespace vLLM filled through ``neffcache env``'s VLLM_CACHE_ROOT."""
    root = tmp_path / "store"
    env, _ = job_env(str(root), TC, ("vllm",))
    vllm_root = Path(env["VLLM_CACHE_ROOT"])
    assert vllm_root == root / NS
    write_vllm_entry(vllm_root, "llama-3-8b")
    write_vllm_entry(vllm_root, "mistral-7b")
    write_vllm_entry(vllm_root, "compiling-now", complete=False)
    return root


def test_scan_counts_entries_with_nested_artifacts(tmp_path: Path) -> None:
    report = scan(LocalStore(_managed(tmp_path)))
    states = sorted(e.state.value for e in report.entries)
    assert states == ["LOCKED", "SUCCESS", "SUCCESS"]
    ok = next(e for e in report.entries if e.state is EntryState.SUCCESS)
    assert ok.layout == "vllm" and ok.namespace.toolchain == TC and ok.namespace.path == NS
    assert "context_encoding_model/_tp0_bk0/model.neff" in ok.files
    assert ok.path == f"{NS}/neuron/compile_cache/{ok.key}"
    assert report.garbage == () and report.uncommitted == ()


def test_bare_vllm_cache_root(tmp_path: Path) -> None:
    root = tmp_path / "vllm-cache"
    write_vllm_entry(root, "a")
    (root / "torch_compile_cache").mkdir()
    (root / "torch_compile_cache" / "x.py").write_text("# vLLM's own\n")
    report = scan(LocalStore(root))
    (entry,) = report.entries
    assert entry.namespace.path == "" and entry.namespace.compiler_version is None
    assert entry.state is EntryState.SUCCESS


def test_uncommitted_publish_and_corrupt_manifest(tmp_path: Path) -> None:
    store = LocalStore(_managed(tmp_path))
    report = scan(store)
    entry = next(e for e in report.entries if e.state is EntryState.SUCCESS)
    # Publish it to a second store, then break it there.
    other = LocalStore(tmp_path / "other")
    assert len(sync(store, other).copied) == 2
    (copy,) = [e for e in scan(other, read_manifests=True).entries if e.key == entry.key]
    assert copy.manifest is not None and set(copy.manifest.files) >= {".compilation_complete", "model.pt"}
    nested = other.root / copy.base / "token_generation_model/_tp0_bk0/model.neff"
    nested.write_bytes(b"short")
    (bad,) = [e for e in scan(other, read_manifests=True).entries if e.key == entry.key]
    assert bad.state is EntryState.CORRUPT
    (other.root / copy.base / ".compilation_complete").unlink()
    after = scan(other)
    assert [e.key for e in after.uncommitted] == [entry.key]


def test_verify_push_pull_prune_local(tmp_path: Path) -> None:
    root = _managed(tmp_path)
    store = LocalStore(root)
    _roundtrip(store, LocalStore(tmp_path / "second"), tmp_path)


@pytest.mark.s3
def test_push_pull_s3(tmp_path: Path, s3_endpoint: str) -> None:
    store = LocalStore(_managed(tmp_path))
    remote = open_store(f"s3://{BUCKET}/vllm", endpoint_url=s3_endpoint)
    try:
        _roundtrip(store, remote, tmp_path)
    finally:
        remote.close()


def _roundtrip(store: LocalStore, remote: Store, tmp_path: Path) -> None:
    pushed = sync(store, remote)
    assert len(pushed.copied) == 2 and not pushed.failed  # the compile in progress stays home
    checked = verify(remote)
    assert [c.status for c in checked.checks] == [CheckStatus.OK] * 2
    back = LocalStore(tmp_path / "pulled")
    pulled = sync(remote, back)
    assert len(pulled.copied) == 2 and not pulled.failed
    originals = {e.key: e for e in scan(store).entries if e.state is EntryState.SUCCESS}
    for entry in scan(back).entries:
        assert entry.state is EntryState.SUCCESS
        src = originals[entry.key]
        for name in src.files:
            assert (back.root / entry.base / name).read_bytes() == (store.root / src.base / name).read_bytes()
    # vLLM reads the pulled copy where neffcache env points it.
    env, _ = job_env(str(back.root), TC, ("vllm",))
    assert Path(env["VLLM_CACHE_ROOT"], "neuron/compile_cache").is_dir()


def test_prune_garbage_removes_none_of_vllms_files(tmp_path: Path) -> None:
    root = _managed(tmp_path)
    _age(root, 3 * 86400)
    before = all_files(root)
    store = LocalStore(root)
    plan = plan_prune([store], PrunePolicy(garbage=True, stale_locks=True, grace=0, lock_age=0))
    assert not plan.items
    execute_plan(plan, [store])
    assert all_files(root) == before


def test_prune_compiler_rule_removes_old_vllm_namespace(tmp_path: Path) -> None:
    root = _managed(tmp_path)
    new = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
    env, _ = job_env(str(root), new, ("vllm",))
    write_vllm_entry(Path(env["VLLM_CACHE_ROOT"]), "llama-3-8b")
    store = LocalStore(root)
    plan = plan_prune([store], PrunePolicy(keep_compilers=(new.compiler_version,)))
    assert sorted(i.path.split("/")[1] for i in plan.items) == [f"vllm-{VERSION}"] * 2
    execute_plan(plan, [store])
    left = scan(store)
    assert {e.namespace.compiler_version for e in left.entries if e.state is EntryState.SUCCESS} == {
        new.compiler_version}
    # The compile in progress under the old version is kept: vLLM may still write it.
    assert [e.state for e in left.entries if e.namespace.compiler_version == VERSION] == [EntryState.LOCKED]


def test_vllm_names_and_order() -> None:
    layout = get_layout("vllm")
    ns = layout.namespace_for(TC)
    names = layout.names(ns, "abc")
    assert names.hlo is None and names.flags is None and names.marker == ".compilation_complete"
    order = layout.write_order(["b/x.neff", ".compilation_complete", "neffcache.json", "a.pt"],
                               names.marker, names.manifest)
    assert order[0] == "neffcache.json" and order[-1] == ".compilation_complete"
    assert layout.job_env("/mnt/fsx/c", ns) == {"VLLM_CACHE_ROOT": f"/mnt/fsx/c/{NS}"}
    assert layout.locate(f"{NS}/neuron/compile_cache/abc/../x") is None
    assert layout.locate("neuron/compile_cache/.hidden/x") is None


def test_env_prints_vllm_cache_root_and_the_runtimes_notes(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from neffcache.cli.main import cli

    args = ["env", "--instance", "trn2.48xlarge", "--compiler-version", VERSION, "--store", str(tmp_path)]
    bash = CliRunner().invoke(cli, args, catch_exceptions=False).output
    assert f"export VLLM_CACHE_ROOT={tmp_path}/{NS}" in bash
    assert "# note: TorchNeuron's locks live on local disk" in bash
    assert "no compiler version" in bash and "rewarm cannot rebuild vLLM entries" in bash
    only = json.loads(CliRunner().invoke(cli, [*args, "--layout", "vllm", "--shell", "json"]).output)
    assert set(only["env"]) == {"VLLM_CACHE_ROOT", "NEURON_LOGICAL_NC_CONFIG"}
    s3 = json.loads(CliRunner().invoke(cli, ["env", "--instance", "trn2.48xlarge", "--compiler-version", VERSION,
                                            "--store", "s3://b/c", "--shell", "json"]).output)
    assert "VLLM_CACHE_ROOT" not in s3["env"] and any("vllm runtime reads a filesystem" in n for n in s3["notes"])


def test_removal_takes_the_marker_first(tmp_path: Path) -> None:
    root = _managed(tmp_path)
    layout = get_layout("vllm")
    entry = next(e for e in scan(LocalStore(root)).entries if e.state is EntryState.SUCCESS)
    phases = layout.removal_phases(entry)
    assert phases[0] == [".compilation_complete"] and "model.pt" in phases[1]
    assert layout.raw_copy_order(entry)[-1] == ".compilation_complete"
    assert layout.payload_names(entry) >= {".compilation_complete", "context_encoding_model/_tp0_bk0/model.neff"}
