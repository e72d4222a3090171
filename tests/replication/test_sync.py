"""push / pull between local, shared and memory stores, and the CLI around them."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from neffcache.cli.main import cli
from neffcache.coordination.lease import StoreLease, try_acquire
from neffcache.coordination.write_leases import publish_lease_name
from neffcache.entry import EntryState
from neffcache.errors import ConfigError
from neffcache.layouts import get_layout
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.operations.verify import CheckStatus, verify
from neffcache.replication.sync import SyncReport, pull, push, sync
from neffcache.scan.report import scan
from neffcache.stores import open_store
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import TC, publish_a
from neffcache.toolchain import Toolchain
from tests.runtime_caches import write_neuronxcc_entry

TRN1 = Toolchain("2.27.5334.0+f702b353", "trn1", 1)


def fill(store: Store, n: int, *, start: int = 0) -> list[str]:
    return [publish_a(store, key=f"MODULE_{i}+abb26765", neff=b"NEFF" + bytes([i % 256]) * (500 + i))[0]
            for i in range(start, start + n)]


def publish_tc(store: Store, tc: Toolchain, key: str, tags: dict[str, str]) -> str:
    ns = get_layout("neuronxcc").namespace_for(tc)
    files = {"model.hlo_module.pb": b"HLO" + key.encode(), "model.neff": b"NEFF" + key.encode(), "model.done": b""}
    manifest = build_manifest("neuronxcc", key, files, toolchain=tc, tags=tags)
    assert publish(store, ns, key, files, manifest).ok
    return f"{ns.path}/{key}"


@pytest.fixture
def src(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "src")


@pytest.fixture
def dst(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "dst")


def test_push_copies_only_what_is_missing(src: LocalStore, dst: LocalStore) -> None:
    paths = fill(src, 6)
    fill(dst, 2)  # dst already has the first two
    seen: list[tuple[int, int, int]] = []
    report = push(src, dst, progress=lambda done, total, size: seen.append((done, total, size)))
    assert isinstance(report, SyncReport) and report.ok
    assert sorted(c.path for c in report.copied) == sorted(paths[2:])
    assert sorted(s.path for s in report.skipped) == sorted(paths[:2]) and report.skipped_reasons() == {"exists": 2}
    assert report.bytes == sum(c.bytes for c in report.copied) > 0
    assert seen[0] == (0, 4, 0) and seen[-1][0:2] == (4, 4)
    assert verify(dst).count(CheckStatus.OK) == 6
    again = push(src, dst)
    assert again.copied == () and len(again.skipped) == 6
    data = again.to_json()
    assert data["copied"] == 0 and data["skipped"] == 6 and data["failed"] == 0
    json.dumps(data)
    with pytest.raises(AttributeError):
        report.bytes = 0  # type: ignore[misc]


def test_filters(src: LocalStore, dst: LocalStore) -> None:
    a = publish_tc(src, TC, "MODULE_1+abb26765", {"model": "llama", "team": "a"})
    b = publish_tc(src, TRN1, "MODULE_2+abb26765", {"model": "llama"})
    c = publish_tc(src, TC, "MODULE_3+abb26765", {"model": "bert"})
    assert [x.path for x in sync(src, dst, targets=["trn1"]).copied] == [b]
    assert [x.path for x in sync(src, dst, tags={"model": "llama"}).copied] == [a]
    report = sync(src, dst, namespaces=["trn2-lnc2"], compiler_versions=[TC.compiler_version])
    assert [x.path for x in report.copied] == [c] and report.filtered == 0
    assert sync(src, dst, compiler_versions=["9.9"]).filtered == 3
    with pytest.raises(ConfigError):
        sync(src, dst, states=["CORRUPT"])


def test_corrupt_source_entry_fails_and_lands_nowhere(src: LocalStore, dst: LocalStore) -> None:
    good, bad = fill(src, 2)
    neff = src.root / bad / "model.neff"
    neff.write_bytes(b"X" * neff.stat().st_size)  # same size: only the digest can tell
    report = push(src, dst)
    assert [c.path for c in report.copied] == [good]
    assert [f.path for f in report.failed] == [bad] and "sha256" in report.failed[0].reason
    assert [e.path for e in scan(dst).entries] == [good] and scan(dst).uncommitted == ()


def test_runtime_written_root_gets_manifests(tmp_path: Path, dst: LocalStore) -> None:
    root = tmp_path / "neuron-compile-cache"
    ok = write_neuronxcc_entry(root, b"hlo-1")
    legacy = write_neuronxcc_entry(root, b"hlo-2", legacy=True, flags="--model-type=transformer -O1")
    failed = write_neuronxcc_entry(root, b"hlo-3", state="FAILED")
    empty = write_neuronxcc_entry(root, b"hlo-4", state="EMPTY")
    write_neuronxcc_entry(root, b"hlo-5", state="LOCKED")
    rel = {p: str(p.relative_to(root)) for p in (ok, legacy, failed, empty)}
    report = pull(str(root), dst)
    assert sorted(c.path for c in report.copied) == sorted([rel[ok], rel[legacy]])
    entries = {e.path: e for e in scan(dst, read_manifests=True).entries}
    manifest = entries[rel[legacy]].manifest
    assert manifest is not None and manifest.computed and manifest.flags == ("--model-type=transformer", "-O1")
    assert verify(dst).count(CheckStatus.OK) == 2
    more = pull(str(root), dst, states=["FAILED", "EMPTY"])
    assert sorted(c.path for c in more.copied) == sorted([rel[failed], rel[empty]])
    states = {e.path: e.state for e in scan(dst).entries}
    assert states[rel[failed]] is EntryState.FAILED and states[rel[empty]] is EntryState.EMPTY


def test_failed_entries_are_copied_under_the_publish_lease(tmp_path: Path, dst: LocalStore) -> None:
    """FAILED/EMPTY entries have no commit marker, so only the lease keeps two writers (or a
    writer and a prune) apart: a held lease makes the copy wait, then report busy."""
    root = tmp_path / "neuron-compile-cache"
    failed = str(write_neuronxcc_entry(root, b"hlo-9", state="FAILED").relative_to(root))
    held = try_acquire(dst, publish_lease_name(failed), ttl=60)
    assert isinstance(held, StoreLease)
    try:
        busy = pull(str(root), dst, states=["FAILED"], busy_wait=0.5)
        assert [(f.path, f.reason.split(":")[0]) for f in busy.failed] == [(failed, "busy")]
        assert not any(dst.iter_files(failed))
    finally:
        held.release()
    done = pull(str(root), dst, states=["FAILED"])
    assert [c.path for c in done.copied] == [failed]
    assert {e.path: e.state for e in scan(dst).entries} == {failed: EntryState.FAILED}


def test_interrupted_sync_reruns_to_completion(src: LocalStore, dst: LocalStore) -> None:
    paths = fill(src, 20)

    def interrupt(done: int, total: int, size: int) -> None:
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        push(src, dst, parallel=2, progress=interrupt)
    partial = scan(dst)
    assert 5 <= len(partial.entries) < 20
    assert all(e.state is EntryState.SUCCESS for e in partial.entries) and partial.uncommitted == ()
    rest = push(src, dst)
    assert len(rest.copied) == 20 - len(partial.entries) and rest.ok
    assert sorted(e.path for e in scan(dst).entries) == sorted(paths)
    assert verify(dst).count(CheckStatus.OK) == 20


def test_leftovers_of_a_killed_publish_are_completed(src: LocalStore, dst: LocalStore) -> None:
    (path,) = fill(src, 1)
    (dst.root / path).mkdir(parents=True)
    (dst.root / path / "model.neff").write_bytes(b"half")  # no manifest, no marker: invisible
    assert scan(dst).entries == ()
    report = push(src, dst)
    assert [c.path for c in report.copied] == [path]
    assert verify(dst).count(CheckStatus.OK) == 1


def test_concurrent_syncs_publish_each_entry_once(src: LocalStore, dst: LocalStore) -> None:
    paths = fill(src, 30)
    reports: list[SyncReport] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        barrier.wait()
        reports.append(push(src, dst, parallel=4, busy_wait=30))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    copied = [c.path for r in reports for c in r.copied]
    assert sorted(copied) == sorted(paths)  # every entry published by exactly one of them
    assert all(r.ok for r in reports)
    assert verify(dst).count(CheckStatus.OK) == 30


def test_memory_store_roundtrip(src: LocalStore, dst: LocalStore) -> None:
    paths = fill(src, 3)
    mem = open_store("memory://neffcache-sync-test/cache")
    try:
        assert len(push(src, mem).copied) == 3
        assert sorted(c.path for c in pull(mem, dst).copied) == sorted(paths)
    finally:
        mem.fs.rm(mem.root, recursive=True)  # type: ignore[attr-defined]


def test_same_store_refused(src: LocalStore) -> None:
    with pytest.raises(ConfigError):
        push(src, src.url)


# -- CLI -----------------------------------------------------------------------------------------
def test_cli_push_pull_json(src: LocalStore, tmp_path: Path) -> None:
    fill(src, 3)
    runner = CliRunner()
    out = runner.invoke(cli, ["push", str(src.root), str(tmp_path / "remote"), "--json", "--parallel", "2"],
                        catch_exceptions=False)
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["copied"] == 3 and data["failed"] == 0
    out = runner.invoke(cli, ["pull", str(tmp_path / "remote"), str(tmp_path / "local"), "--target", "trn2",
                              "--tag", "model=llama"], catch_exceptions=False)
    assert out.exit_code == 0 and "3 copied" in out.stdout


def test_cli_exit_code_on_failure(src: LocalStore, tmp_path: Path) -> None:
    (bad,) = fill(src, 1)
    neff = src.root / bad / "model.neff"
    neff.write_bytes(b"Y" * neff.stat().st_size)
    out = CliRunner().invoke(cli, ["push", str(src.root), str(tmp_path / "remote")], catch_exceptions=False)
    assert out.exit_code == 1
    assert "1 failed" in out.stdout and "sha256" in out.stdout


@pytest.mark.parametrize("command", ["push", "pull"])
def test_cli_help_has_example(command: str) -> None:
    out = CliRunner().invoke(cli, [command, "--help"], catch_exceptions=False)
    assert out.exit_code == 0 and "Example" in out.output and "--endpoint-url" in out.output


def test_cli_bad_state(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["push", str(tmp_path), str(tmp_path / "x"), "--state", "LOCKED"])
    assert out.exit_code == 2
