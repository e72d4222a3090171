"""Symlinks planted in a store's destination, control and staging directories: real CLI runs of
pull, push, scan, verify, verify --fix and prune change nothing outside the root.

The sentinel directory outside the root holds the names a followed link would reach
(model.neff, model.done); its fingerprint (names, sizes, mtimes, digests) is compared before
and after. Good entries are still copied; the bad ones are reported, never a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.layouts import get_layout
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import TC, publish_a
from neffcache.toolchain import Toolchain
from tests.hostile.sentinel import fingerprint, make_sentinel

NS = f"trn2-lnc2/neuronxcc-{TC.compiler_version}"
PLANTED_NS = "trn2-lnc2/neuronxcc-2.27.1.0+abc"


def neffcache(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args], capture_output=True, text=True,
                          timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _publish(store: LocalStore, tc: Toolchain, key: str) -> None:
    files = {"model.hlo_module.pb": b"HLO", "compile_flags.json": b"[]", "model.neff": b"NEFF" * 99,
             "model.done": b""}
    layout = get_layout("neuronxcc")
    manifest = build_manifest("neuronxcc", key, files, toolchain=tc)
    assert publish(store, layout.namespace_for(tc), key, files, manifest).ok
    assert layout.namespace_for(tc).path == PLANTED_NS


def _stores(tmp_path: Path) -> tuple[LocalStore, LocalStore, Path]:
    src, dst = LocalStore(tmp_path / "src"), LocalStore(tmp_path / "dst")
    for i in range(3):
        publish_a(src, key=f"MODULE_{i}+abb26765")
    publish_a(src, key="MODULE_99+abb26765")  # its directory in dst is a link
    return src, dst, make_sentinel(tmp_path)


def test_planted_destination_links(tmp_path: Path) -> None:
    src, dst, sentinel = _stores(tmp_path)
    # A namespace directory, an entry directory and an entry file, each a link out of the root.
    (dst.root / PLANTED_NS).parent.mkdir(parents=True)
    (dst.root / PLANTED_NS).symlink_to(sentinel)
    (dst.root / NS).mkdir(parents=True)
    (dst.root / NS / "MODULE_99+abb26765").symlink_to(sentinel / "sub")
    path, _ = publish_a(dst, key="MODULE_50+abb26765")
    (dst.root / path / "model.neff").unlink()
    (dst.root / path / "model.neff").symlink_to(sentinel / "model.neff")
    other = tmp_path / "other"  # a source with an entry in the linked namespace
    _publish(LocalStore(other), Toolchain("2.27.1.0+abc", "trn2", 2), "MODULE_7+abb26765")
    before = fingerprint(sentinel)

    pulled = neffcache("pull", str(src.root), str(dst.root), "--json")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    report = json.loads(pulled.stdout)
    # The linked entry directory is CORRUPT at the destination: reported, not written through.
    assert report["copied"] == 3 and report["skipped_reasons"] == {
        "corrupt at the destination (neffcache verify --fix, then rerun)": 1}
    for i in range(3):
        assert (dst.root / NS / f"MODULE_{i}+abb26765" / "model.done").is_file()
    into_link = neffcache("pull", str(other), str(dst.root), "--json")
    assert into_link.returncode == 1, into_link.stdout + into_link.stderr  # some failed
    failures = json.loads(into_link.stdout)["failures"]
    assert len(failures) == 1 and "symlink" in json.dumps(failures)

    scanned = neffcache("scan", str(dst.root), "--json")
    assert scanned.returncode == 1, scanned.stderr  # some entries are CORRUPT
    assert "MODULE_50+abb26765/model.neff: a symlink pointing outside the root" in scanned.stdout
    assert "MODULE_99+abb26765: a symlink pointing outside the root" in scanned.stdout

    verified = neffcache("verify", str(dst.root))
    assert verified.returncode == 5, verified.stdout + verified.stderr
    fixed = neffcache("verify", str(dst.root), "--fix")
    assert fixed.returncode in (0, 5), fixed.stdout + fixed.stderr

    out = tmp_path / "out"
    pushed = neffcache("push", str(dst.root), str(out), "--json")
    assert pushed.returncode in (0, 1), pushed.stdout + pushed.stderr
    assert json.loads(pushed.stdout)["copied"] >= 3

    for args in (["--garbage", "--grace", "0s"], ["--keep-compiler", TC.compiler_version]):
        pruned = neffcache("prune", "--store", str(dst.root), *args, "--yes")
        assert pruned.returncode in (0, 1, 4), pruned.stdout + pruned.stderr

    assert fingerprint(sentinel) == before
    assert (dst.root / PLANTED_NS).is_symlink()


@pytest.mark.parametrize("planted", [".neffcache", ".neffcache/leases", ".neffcache/staging",
                                     ".neffcache/stamps", ".neffcache/prune"])
def test_planted_control_links(tmp_path: Path, planted: str) -> None:
    src, dst, sentinel = _stores(tmp_path)
    publish_a(dst, key="MODULE_40+abb26765")
    (dst.root / NS / f".model.neff.neffcache-tmp-{'0' * 12}").write_bytes(b"garbage")
    link = dst.root / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.exists():
        import shutil
        shutil.rmtree(link)
    # The sentinel holds what those directories would: a lease shard, a journal, a stamp.
    for sub in ("leases/ab", "prune", "stamps", "staging/neffcache-tmp-x"):
        (sentinel / sub).mkdir(parents=True, exist_ok=True)
    (sentinel / "prune" / "journal.json").write_text('{"entries": {"x/MODULE_1+ab": ["model.neff"]}}')
    # An orphaned last-use stamp: prune --garbage removes those (when it can reach them safely).
    for stamps in (sentinel / "stamps", sentinel):  # reached through .neffcache, through stamps
        gone = stamps / NS / "MODULE_404+abb26765.used"
        gone.parent.mkdir(parents=True)
        gone.write_bytes(b"")
    link.symlink_to(sentinel)
    before = fingerprint(sentinel)

    results = [
        neffcache("pull", str(src.root), str(dst.root)),
        neffcache("scan", str(dst.root)),
        neffcache("verify", str(dst.root)),
        neffcache("verify", str(dst.root), "--fix"),
        neffcache("push", str(dst.root), str(tmp_path / "out")),
        neffcache("prune", "--store", str(dst.root), "--garbage", "--grace", "0s", "--yes"),
        neffcache("prune", "--store", str(dst.root), "--stale-locks", "--failed", "--yes"),
    ]
    assert fingerprint(sentinel) == before
    for done in results:
        assert done.returncode in (0, 1, 4, 5), done.stdout + done.stderr
    # The store's own entries are still served from inside the root.
    assert LocalStore(tmp_path / "out").stat(f"{NS}/MODULE_40+abb26765/model.done") is not None
