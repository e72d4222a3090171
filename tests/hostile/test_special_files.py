"""FIFOs where a store's files belong (N8): opened ``O_NONBLOCK``, checked with ``fstat``, and
reported against that item; never a hang. Every run is a subprocess with a timeout, so a hang
fails the test instead of stopping the runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.coordination.lease import lease_path
from neffcache.coordination.write_leases import prune_group_lease, publish_lease_name
from neffcache.errors import UnsafePath
from neffcache.manifest import MANIFEST_NAME
from neffcache.regular import open_regular
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.hostile.trees import neffcache
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[2]
KEY = "MODULE_1+abb26765"


def _fifo_at(store: LocalStore, rel: str) -> Path:
    path = store.root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def test_open_regular_refuses_a_fifo_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafePath, match="a FIFO, not a regular file"):
        open_regular(tmp_path / "fifo")
    with pytest.raises(UnsafePath, match="a directory"):
        open_regular(tmp_path)
    (tmp_path / "f").write_bytes(b"x")
    fd = open_regular(tmp_path / "f")
    try:
        assert os.get_blocking(fd) and os.read(fd, 4) == b"x"
    finally:
        os.close(fd)


def test_a_fifo_at_a_publish_lease_does_not_hang_pull(tmp_path: Path) -> None:
    src, dst = LocalStore(tmp_path / "src"), LocalStore(tmp_path / "dst")
    path, neff = publish_a(src, key=KEY)
    _fifo_at(dst, lease_path(publish_lease_name(path)))
    done = neffcache("pull", str(src.root), str(dst.root))
    assert done.returncode == 0, done.stderr
    assert "a FIFO, not a regular file" in done.stderr  # reported: an invalid lease, taken over
    assert dst.read_bytes(f"{path}/model.neff") == neff


@pytest.mark.parametrize(("shared", "lease"), [(True, "publish"), (False, "prune-group")])
def test_a_fifo_at_a_lease_does_not_hang_prune(tmp_path: Path, shared: bool, lease: str) -> None:
    store = LocalStore(tmp_path / "c")
    path, _ = publish_a(store, key=KEY)
    kept, _ = publish_a(store, key="MODULE_2+abb26765")
    name = publish_lease_name(path) if lease == "publish" else prune_group_lease(path)
    _fifo_at(store, lease_path(name))
    url = f"fsx://{store.root}" if shared else str(store.root)
    done = neffcache("prune", "--store", url, "--older-than", "0d", "--stale-locks", "--yes", "--force")
    assert done.returncode == 0, done.stderr
    assert "a FIFO, not a regular file" in done.stderr
    assert store.stat(f"{path}/model.done") is None and store.stat(f"{kept}/model.done") is None


def _swapped(action: str, tmp_path: Path, name: str, *endpoint: str) -> tuple[list[str], dict[str, list[str]]]:
    done = subprocess.run([sys.executable, "-m", "tests.hostile.fifo_swap", action, str(tmp_path), name, *endpoint],
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    return got["paths"], got["outcomes"]


@pytest.mark.parametrize("name", ["model.neff", MANIFEST_NAME])
def test_a_fifo_swapped_in_fails_that_entry_of_verify(tmp_path: Path, name: str) -> None:
    paths, outcomes = _swapped("verify", tmp_path, name)
    assert outcomes[paths[0]] == ["ok"] and outcomes[paths[2]] == ["ok"]
    status, *problems = outcomes[paths[1]]
    # Neither a manifest nor a NEFF that cannot be read says anything of the entry's bytes:
    # FAILED (not checked), never quarantined for it (a FIFO someone planted is not the entry's).
    assert status == "failed"
    assert "a FIFO, not a regular file" in " ".join(problems)


@pytest.mark.parametrize("to", ["local", "s3"])
def test_a_fifo_swapped_in_fails_that_entry_of_push(request: pytest.FixtureRequest, tmp_path: Path, to: str) -> None:
    endpoint = [request.getfixturevalue("s3_endpoint")] if to == "s3" else []
    paths, outcomes = _swapped("push", tmp_path, "model.neff", *endpoint)
    assert outcomes[paths[0]] == ["copied"] and outcomes[paths[2]] == ["copied"]
    assert outcomes[paths[1]][0] == "failed" and "a FIFO" in outcomes[paths[1]][1]


def test_fifos_planted_at_a_neff_and_a_manifest_do_not_hang_verify_or_push(tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    paths = [publish_a(src, key=f"MODULE_{i}+abb26765")[0] for i in range(3)]
    for path, name in ((paths[0], "model.neff"), (paths[1], MANIFEST_NAME)):
        (src.root / path / name).unlink()
        _fifo_at(src, f"{path}/{name}")
    verified = neffcache("verify", str(src.root))
    assert verified.returncode == 5, verified.stderr  # listings skip FIFOs: the NEFF is missing
    assert f"CORRUPT {paths[0]}: model.neff recorded in the manifest is missing" in verified.stdout
    pushed = neffcache("push", str(src.root), str(tmp_path / "dst"))
    assert pushed.returncode == 0 and "Traceback" not in pushed.stderr, pushed.stderr
    assert not (tmp_path / "dst" / paths[0]).exists()  # a corrupt entry is never copied
    assert (tmp_path / "dst" / paths[2] / "model.done").exists()


def test_a_scan_names_special_files_and_the_entries_they_lie_in(tmp_path: Path) -> None:
    """A FIFO where an entry's NEFF belongs makes that entry CORRUPT, naming the FIFO (it was
    left out of the listing without a word: the entry read as if its NEFF were missing); one
    outside any entry is a warning. The plain scan (counting in C) and the full report agree."""
    from neffcache.entry import EntryState
    from neffcache.scan.report import scan
    from neffcache.scan.summary import ScanSummary, summarize

    store = LocalStore(tmp_path / "c")
    paths = [publish_a(store, key=f"MODULE_{i}+abb26765")[0] for i in range(3)]
    (store.root / paths[0] / "model.neff").unlink()
    _fifo_at(store, f"{paths[0]}/model.neff")
    _fifo_at(store, "stray-fifo")
    report = scan(store)
    states = {e.path: e.state for e in report.entries}
    assert states == {paths[0]: EntryState.CORRUPT, paths[1]: EntryState.SUCCESS, paths[2]: EntryState.SUCCESS}
    (corrupt,) = [e for e in report.entries if e.path == paths[0]]
    assert f"{paths[0]}/model.neff: a FIFO, not a regular file (not listed)" in corrupt.problems
    assert "stray-fifo: a FIFO, not a regular file (not listed)" in report.warnings
    summary = summarize(store)
    assert summary.by_state()["CORRUPT"] == 1 and summary.by_state()["SUCCESS"] == 2
    assert (summary.namespaces, summary.warnings) == (ScanSummary.of_report(report).namespaces,
                                                     ScanSummary.of_report(report).warnings)
