"""Layout ``vllm`` read, verified, pushed, pulled and pruned in both of vLLM-Neuron's forms: the
node-local ``$VLLM_CACHE_ROOT/neuron/compile_cache/<hash>/`` and the shared tier's flat
``$NEURON_LIBTORCH_REMOTE_CACHE/<hash>/``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from neffcache.application.jobenv import job_env
from neffcache.entry import EntryState
from neffcache.layouts import entry_forms, get_layout, locate
from neffcache.operations.verify import CheckStatus, verify
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.replication.sync import sync
from neffcache.replication.tiers import Tiers
from neffcache.scan.report import load_entry, scan
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from tests.runtime_caches import VERSION, all_files, vllm_hash, write_vllm_entry
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint

__all__ = ["aws_env", "moto_server", "s3_endpoint"]

TC = Toolchain(VERSION, "trn2", 2)
NS = f"trn2-lnc2/vllm-{VERSION}"
MARKER = ".compilation_complete"


def _age(root: Path, seconds: float) -> None:
    old = time.time() - seconds
    for p in root.rglob("*"):
        os.utime(p, (old, old))


def _node_local(tmp_path: Path) -> Path:
    """A node-local tier vLLM filled through ``neffcache env``'s VLLM_CACHE_ROOT (local form)."""
    root = tmp_path / "node"
    env, _ = job_env(str(tmp_path / "store"), TC, ("vllm",), local_root=str(root))
    vllm_root = Path(env["VLLM_CACHE_ROOT"])
    assert vllm_root == root / NS
    write_vllm_entry(vllm_root, "llama-3-8b")
    write_vllm_entry(vllm_root, "mistral-7b")
    write_vllm_entry(vllm_root, "compiling-now", complete=False)
    return root


def _shared(tmp_path: Path) -> Path:
    """A store whose namespace vLLM's save_cache() filled (flat form, no manifests)."""
    root = tmp_path / "store"
    env, _ = job_env(str(root), TC, ("vllm",))
    remote = Path(env["NEURON_LIBTORCH_REMOTE_CACHE"])
    assert remote == root / NS
    write_vllm_entry(remote, "llama-3-8b", flat=True)
    write_vllm_entry(remote, "mistral-7b", flat=True)
    write_vllm_entry(remote, "compiling-now", complete=False, flat=True)
    return root


@pytest.mark.parametrize("form", ["local", "flat"])
def test_scan_counts_entries_with_nested_artifacts(tmp_path: Path, form: str) -> None:
    root = _node_local(tmp_path) if form == "local" else _shared(tmp_path)
    report = scan(LocalStore(root))
    states = sorted(e.state.value for e in report.entries)
    assert states == ["LOCKED", "SUCCESS", "SUCCESS"]
    ok = next(e for e in report.entries if e.state is EntryState.SUCCESS)
    assert ok.layout == "vllm" and ok.namespace.toolchain == TC and ok.namespace.path == NS
    assert "context_encoding_model/_tp0_bk0/model.neff" in ok.files
    where = f"{NS}/neuron/compile_cache/{ok.key}" if form == "local" else f"{NS}/{ok.key}"
    assert ok.path == where and ok.base == where
    assert report.garbage == () and report.uncommitted == () and report.foreign == ()


@pytest.mark.parametrize("flat", [False, True])
def test_bare_vllm_roots(tmp_path: Path, flat: bool) -> None:
    root = tmp_path / "vllm-cache"
    write_vllm_entry(root, "a", flat=flat)
    (root / "torch_compile_cache").mkdir()
    (root / "torch_compile_cache" / "x.py").write_text("# vLLM's own\n")
    report = scan(LocalStore(root))
    (entry,) = report.entries
    assert entry.namespace.path == "" and entry.namespace.compiler_version is None
    assert entry.state is EntryState.SUCCESS
    assert [f.path for f in report.foreign] == ["torch_compile_cache/x.py"]


def test_a_flat_entry_is_exactly_32_lowercase_hex(tmp_path: Path) -> None:
    """Nothing at a store root is claimed that is not an MD5-named directory, and no other
    layout's path becomes a vLLM entry."""
    root = _shared(tmp_path)
    key = vllm_hash("odd")
    for name in (key.upper(), key[:31], key + "0", key * 2, "g" + key[1:], ".neffcache-x"):
        write_vllm_entry(root, "x", flat=True).rename(root / name)
    # The torchneuron layout's bare shards and kernel directories, neuronxcc's namespace, beside them.
    shard = root / key[:2] / key[2:4]
    shard.mkdir(parents=True)
    (shard / f"{key}.neff").write_bytes(b"NEFF")
    (root / (key * 2)).mkdir(exist_ok=True)
    report = scan(LocalStore(root))
    layouts = sorted((e.layout, e.path) for e in report.entries)
    assert ("torchneuron", f"{key[:2]}/{key[2:4]}/{key}") in layouts
    assert {p for lay, p in layouts if lay == "vllm"} == {f"{NS}/{vllm_hash(n)}" for n in
                                                          ("llama-3-8b", "mistral-7b", "compiling-now")}
    foreign = {f.path.split("/")[0] for f in report.foreign}
    assert foreign == {key.upper(), key[:31], key + "0", key * 2, "g" + key[1:], ".neffcache-x"}
    for path in (key.upper() + f"/{MARKER}", f"{key}/../x", f"{NS}/{key}\n/{MARKER}", f"neffcache/{key}/{MARKER}"):
        assert locate(path) is None or locate(path).namespace.layout != "vllm", path  # type: ignore[union-attr]


def test_hostile_flat_entries_are_per_entry_problems(tmp_path: Path) -> None:
    root = _shared(tmp_path)
    ns = root / NS
    marker_dir = ns / vllm_hash("marker-dir")
    (marker_dir / MARKER).mkdir(parents=True)
    (marker_dir / "graph.hlo").write_bytes(b"x")
    fifo = ns / vllm_hash("fifo")
    fifo.mkdir()
    os.mkfifo(fifo / "graph.hlo")
    (fifo / MARKER).touch()
    link = ns / vllm_hash("link")
    link.mkdir()
    (link / "graph.neff").symlink_to("/etc/passwd")
    (link / MARKER).touch()
    (ns / vllm_hash("linked-dir")).symlink_to(ns / vllm_hash("llama-3-8b"))
    report = scan(LocalStore(root))
    states = {e.key: e.state for e in report.entries}
    assert states[vllm_hash("llama-3-8b")] is EntryState.SUCCESS
    assert states[vllm_hash("link")] is EntryState.CORRUPT and states[vllm_hash("fifo")] is EntryState.CORRUPT
    assert states[vllm_hash("marker-dir")] is not EntryState.SUCCESS
    assert vllm_hash("linked-dir") not in states or states[vllm_hash("linked-dir")] is not EntryState.SUCCESS


def test_push_from_a_local_tree_lands_flat_and_twice_copies_nothing(tmp_path: Path) -> None:
    node = LocalStore(_node_local(tmp_path))
    store = LocalStore(tmp_path / "store")
    first = sync(node, store)
    assert len(first.copied) == 2 and not first.failed  # the compile in progress stays home
    entries = scan(store, read_manifests=True).entries
    assert sorted(e.path for e in entries) == sorted(f"{NS}/{vllm_hash(n)}" for n in ("llama-3-8b", "mistral-7b"))
    assert all(e.state is EntryState.SUCCESS and e.manifest is not None and e.manifest.computed for e in entries)
    assert not list((store.root / NS).glob("neuron"))  # nothing in the local form
    second = sync(node, store)
    assert not second.copied and len(second.skipped) == 2 and {s.reason for s in second.skipped} == {"exists"}
    # One at a time too (a tier's promotion: explicit paths), and in the other direction.
    one = sync(node, store, paths=[f"{NS}/neuron/compile_cache/{vllm_hash('mistral-7b')}"])
    assert not one.copied and [s.reason for s in one.skipped] == ["exists"]
    back = sync(store, node)
    assert not back.copied and len(back.skipped) == 2


def test_uncommitted_publish_and_corrupt_manifest(tmp_path: Path) -> None:
    store = LocalStore(_node_local(tmp_path))
    entry = next(e for e in scan(store).entries if e.state is EntryState.SUCCESS)
    other = LocalStore(tmp_path / "other")
    assert len(sync(store, other).copied) == 2
    (copy,) = [e for e in scan(other, read_manifests=True).entries if e.key == entry.key]
    assert copy.path == f"{NS}/{entry.key}"
    assert copy.manifest is not None and set(copy.manifest.files) >= {MARKER, "model.pt"}
    nested = other.root / copy.base / "token_generation_model/_tp0_bk0/model.neff"
    nested.write_bytes(b"short")
    (bad,) = [e for e in scan(other, read_manifests=True).entries if e.key == entry.key]
    assert bad.state is EntryState.CORRUPT
    (other.root / copy.base / MARKER).unlink()
    after = scan(other)
    assert [e.key for e in after.uncommitted] == [entry.key]


def test_verify_push_pull_prune_local(tmp_path: Path) -> None:
    _roundtrip(LocalStore(_node_local(tmp_path)), LocalStore(tmp_path / "second"), tmp_path)


@pytest.mark.s3
def test_push_pull_s3(tmp_path: Path, s3_endpoint: str) -> None:
    store = LocalStore(_node_local(tmp_path))
    remote = open_store(f"s3://{BUCKET}/vllm", endpoint_url=s3_endpoint)
    try:
        _roundtrip(store, remote, tmp_path)
    finally:
        remote.close()


def _roundtrip(node: LocalStore, remote: Store, tmp_path: Path) -> None:
    pushed = sync(node, remote)
    assert len(pushed.copied) == 2 and not pushed.failed
    checked = verify(remote)
    assert [c.status for c in checked.checks] == [CheckStatus.OK] * 2
    back = LocalStore(tmp_path / "pulled")
    pulled = sync(remote, back)
    assert len(pulled.copied) == 2 and not pulled.failed
    assert not sync(remote, back).copied
    originals = {e.key: e for e in scan(node).entries if e.state is EntryState.SUCCESS}
    for entry in scan(back).entries:
        assert entry.state is EntryState.SUCCESS and entry.path == f"{NS}/{entry.key}"
        src = originals[entry.key]
        for name in src.files:
            assert (back.root / entry.base / name).read_bytes() == (node.root / src.base / name).read_bytes()
    # vLLM reads the pulled copy where neffcache env points its shared tier.
    env, _ = job_env(str(back.root), TC, ("vllm",))
    for key in originals:
        assert Path(env["NEURON_LIBTORCH_REMOTE_CACHE"], key, MARKER).is_file()


def test_tiers_find_a_local_form_path_in_its_flat_form(tmp_path: Path) -> None:
    shared = LocalStore(_shared(tmp_path))
    node = LocalStore(tmp_path / "node")
    key = vllm_hash("llama-3-8b")
    local_path = f"{NS}/neuron/compile_cache/{key}"
    assert entry_forms(local_path) == (local_path, f"{NS}/{key}")
    assert entry_forms(f"{NS}/{key}") == (f"{NS}/{key}", local_path)
    with Tiers([node, shared]) as chain:
        hit = chain.get_entry(local_path)
        assert hit is not None and hit.promoted_to == (node.url,) and hit.entry.path == f"{NS}/{key}"
        again = chain.get_entry(local_path)
        assert again is not None and again.found_in == node.url


@pytest.mark.parametrize("form", ["local", "flat"])
def test_prune_garbage_removes_none_of_vllms_files(tmp_path: Path, form: str) -> None:
    root = _node_local(tmp_path) if form == "local" else _shared(tmp_path)
    _age(root, 3 * 86400)
    before = all_files(root)
    store = LocalStore(root)
    plan = plan_prune([store], PrunePolicy(garbage=True, stale_locks=True, grace=0, lock_age=0))
    assert not plan.items
    execute_plan(plan, [store])
    # neffcache's own control files (the prune space reserve) aside, every file is as it was.
    assert {p: b for p, b in all_files(root).items() if not p.startswith(".neffcache/")} == before


def test_prune_garbage_cli_keeps_a_flat_compile_in_progress(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from neffcache.cli.main import cli

    root = _shared(tmp_path)
    compiling = root / NS / vllm_hash("compiling-now")
    _age(root, 3 * 86400)
    result = CliRunner().invoke(cli, ["prune", "--store", str(root), "--garbage", "--grace", "0s", "--yes"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert compiling.is_dir() and any(compiling.rglob("*.neff"))
    (entry,) = [e for e in scan(LocalStore(root)).entries if e.key == vllm_hash("compiling-now")]
    assert entry.state is EntryState.LOCKED


@pytest.mark.parametrize("form", ["local", "flat"])
def test_prune_compiler_rule_removes_old_vllm_namespace(tmp_path: Path, form: str) -> None:
    root = _node_local(tmp_path) if form == "local" else _shared(tmp_path)
    new = Toolchain("2.27.5334.0+f702b353", "trn2", 2)
    write_vllm_entry(root / new.target_dir / f"vllm-{new.compiler_version}", "llama-3-8b", flat=form == "flat")
    store = LocalStore(root)
    plan = plan_prune([store], PrunePolicy(keep_compilers=(new.compiler_version,)))
    assert sorted(i.path.split("/")[1] for i in plan.items) == [f"vllm-{VERSION}"] * 2
    execute_plan(plan, [store])
    left = scan(store)
    assert {e.namespace.compiler_version for e in left.entries if e.state is EntryState.SUCCESS} == {
        new.compiler_version}
    # The compile in progress under the old version is kept: vLLM may still write it.
    assert [e.state for e in left.entries if e.namespace.compiler_version == VERSION] == [EntryState.LOCKED]


def test_vllm_names_forms_and_order() -> None:
    layout = get_layout("vllm")
    ns = layout.namespace_for(TC)
    key = vllm_hash("g")
    names = layout.names(ns, key)
    assert names.hlo is None and names.flags is None and names.marker == MARKER
    order = layout.write_order(["b/x.neff", MARKER, "neffcache.json", "a.pt"], names.marker, names.manifest)
    assert order[0] == "neffcache.json" and order[-1] == MARKER
    # Writers use the flat form; a key that cannot be flat keeps the local one.
    assert layout.plan_entry(ns, key).path == f"{NS}/{key}"
    assert layout.plan_entry(ns, "abc").path == f"{NS}/neuron/compile_cache/abc"
    assert layout.entry_paths(ns, key) == (f"{NS}/{key}", f"{NS}/neuron/compile_cache/{key}")
    # The local-form path of an entry for a prefetch into a node-local tier.
    local = layout.runtime_local_path(ns, key)
    assert local == f"{NS}/neuron/compile_cache/{key}"
    found = layout.locate_entry(local)
    assert found is not None and found.namespace == ns and found.key == key
    assert layout.runtime_local_path(get_layout("vllm").locate_entry(key).namespace, key) == (  # type: ignore[union-attr]
        f"neuron/compile_cache/{key}")
    assert layout.job_env("/mnt/fsx/c", ns) == {"NEURON_LIBTORCH_REMOTE_CACHE": f"/mnt/fsx/c/{NS}"}
    assert layout.node_local_env("/nvme/v", ns) == {"VLLM_CACHE_ROOT": f"/nvme/v/{NS}"}
    assert layout.locate(f"{NS}/neuron/compile_cache/abc/../x") is None
    assert layout.locate("neuron/compile_cache/.hidden/x") is None
    assert layout.locate(f"{NS}/{key}/./x") is None
    assert get_layout("neuronxcc").runtime_local_path(ns, key) is None


def test_load_entry_of_either_form(tmp_path: Path) -> None:
    node, shared = LocalStore(_node_local(tmp_path)), LocalStore(_shared(tmp_path))
    key = vllm_hash("llama-3-8b")
    local = load_entry(node, f"{NS}/neuron/compile_cache/{key}")
    flat = load_entry(shared, f"{NS}/{key}")
    assert local is not None and flat is not None
    assert local.state is flat.state is EntryState.SUCCESS and local.namespace == flat.namespace
    assert set(local.files) == set(flat.files)


def test_removal_takes_the_marker_first(tmp_path: Path) -> None:
    root = _shared(tmp_path)
    layout = get_layout("vllm")
    entry = next(e for e in scan(LocalStore(root)).entries if e.state is EntryState.SUCCESS)
    phases = layout.removal_phases(entry)
    assert phases[0] == [MARKER] and "model.pt" in phases[1]
    assert layout.raw_copy_order(entry)[-1] == MARKER
    assert layout.payload_names(entry) >= {MARKER, "context_encoding_model/_tp0_bk0/model.neff"}
