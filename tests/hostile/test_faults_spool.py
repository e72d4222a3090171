"""Honest index counts: with the spool unwritable (a path under a file) or full (a small tmpfs),
push says what it delivered, spooled and lost, never "8 entries registered" for 8 dropped."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.hostile.trees import json_of, neffcache
from tests.server.conftest import ServerProcess, free_port, prepare_database

ENTRIES = 8


def _source(tmp_path: Path) -> LocalStore:
    src = LocalStore(tmp_path / "src")
    for i in range(ENTRIES):
        publish_a(src, key=f"MODULE_{i}+abb26765")
    return src


def _push(src: LocalStore, dst: Path, index_url: str, spool: Path, token: str = "nfc_x_y"
          ) -> subprocess.CompletedProcess[str]:
    return neffcache("push", str(src.root), str(dst), "--index-url", index_url, "--token", token, "--json",
                     env={"NEFFCACHE_SPOOL_DIR": str(spool)})


@contextlib.contextmanager
def _full_tmpfs(where: Path) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with contextlib.suppress(OSError), open(where / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("spool_kind", ["unwritable", "full"])
def test_a_spool_that_cannot_be_written_with_the_index_down_is_reported_as_lost(
        tmp_path: Path, spool_kind: str) -> None:
    src = _source(tmp_path)
    down = f"http://127.0.0.1:{free_port()}"
    with contextlib.ExitStack() as stack:
        if spool_kind == "full":
            spool = stack.enter_context(_full_tmpfs(tmp_path / "tmpfs")) / "spool"
        else:
            (tmp_path / "a-file").write_bytes(b"")
            spool = tmp_path / "a-file" / "spool"
        pushed = _push(src, tmp_path / "dst", down, spool)
    assert pushed.returncode == 0, pushed.stderr[-2000:]  # the cache data was copied: not a failure
    report = json_of(pushed)
    assert report["copied"] == ENTRIES
    index = report["index"]
    assert (index["reported"], index["lost"], index["registered"], index["spooled"]) == (ENTRIES, ENTRIES, 0, 0)
    assert index["spool_error"]
    warning = [line for line in pushed.stderr.splitlines() if line.startswith("neffcache: warning:")]
    assert len(warning) == 1 and f"{ENTRIES} of {ENTRIES} index reports lost" in warning[0]


def test_a_spool_that_cannot_be_written_sends_straight_to_a_live_index(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'index.db'}"
    tokens = prepare_database(db_url)
    server = ServerProcess(db_url, free_port(), tmp_path / "server.log")
    try:
        server.wait_ready()
        src = _source(tmp_path)
        (tmp_path / "a-file").write_bytes(b"")
        pushed = _push(src, tmp_path / "dst", server.url, tmp_path / "a-file" / "spool", token=tokens.write)
        assert pushed.returncode == 0, pushed.stderr[-2000:]
        index = json_of(pushed)["index"]
        assert (index["reported"], index["sent_direct"], index["lost"], index["registered"]) \
            == (ENTRIES, ENTRIES, 0, ENTRIES)
        listed = httpx.get(f"{server.url}/v1/entries", headers={"Authorization": f"Bearer {tokens.read}"},
                           params={"limit": 100}).json()["entries"]
        assert len(listed) == ENTRIES
    finally:
        server.stop()
