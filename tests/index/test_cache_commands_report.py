"""Cache commands report to the index, and an index that is down never fails them.

Real processes throughout: the CLI as a subprocess, the index as a uvicorn process that starts
only after the commands ran. push registers what it copied, verify --fix reports the corrupt
entry (error) and its quarantine (evict); all of it waits in the spool, and `neffcache flush`
delivers it once the index is up.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.server.conftest import ServerProcess, Tokens, free_port, prepare_database


def neffcache(*args: str, index_url: str, token: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args, "--index-url", index_url,
                           "--token", token, "--json"], capture_output=True, text=True, timeout=120)


def test_push_and_verify_report_through_a_down_index(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'index.db'}"
    tokens: Tokens = prepare_database(db_url)
    index_url = f"http://127.0.0.1:{free_port()}"  # nothing listens here yet
    src, dst = LocalStore(tmp_path / "src"), LocalStore(tmp_path / "dst")
    paths = [publish_a(src, key=f"MODULE_{i}+abb26765")[0] for i in range(5)]

    pushed = neffcache("push", str(src.root), str(dst.root), index_url=index_url, token=tokens.write)
    assert pushed.returncode == 0, pushed.stderr
    report = json.loads(pushed.stdout)
    assert report["copied"] == 5
    assert report["index"]["registered"] == 5 and report["index"]["spooled_batches"] >= 1

    bad = paths[0]
    (dst.root / bad / "model.neff").write_bytes(b"flipped bits")
    verified = neffcache("verify", str(dst.root), "--fix", index_url=index_url, token=tokens.write)
    assert verified.returncode == 0, verified.stderr  # the corrupt entry was quarantined
    assert json.loads(verified.stdout)["corrupt"] == 1

    still_down = neffcache("flush", index_url=index_url, token=tokens.write)
    assert still_down.returncode == 7, still_down.stdout + still_down.stderr
    waiting = json.loads(still_down.stdout)
    assert waiting["pending_batches"] >= 2 and waiting["delivered_entries"] == 0

    server = ServerProcess(db_url, int(index_url.rsplit(":", 1)[1]), tmp_path / "server.log")
    try:
        server.wait_ready()
        flushed = neffcache("flush", index_url=index_url, token=tokens.write)
        assert flushed.returncode == 0, flushed.stdout + flushed.stderr
        delivered = json.loads(flushed.stdout)
        assert (delivered["delivered_entries"], delivered["delivered_events"], delivered["pending_batches"]) \
            == (5, 2, 0)

        again = neffcache("flush", index_url=index_url, token=tokens.write)
        assert json.loads(again.stdout)["pending_before"] == 0

        headers = {"Authorization": f"Bearer {tokens.read}"}
        for path in paths[1:]:
            found = httpx.get(f"{index_url}/v1/entries/{path}", headers=headers)
            assert found.status_code == 200, found.text
            assert found.json()["stores"] == [dst.url]
        # The quarantined entry was evicted from its only store: the index no longer serves it.
        gone = httpx.get(f"{index_url}/v1/entries/{bad}", headers=headers)
        assert gone.status_code == 404, gone.text
        totals = httpx.get(f"{index_url}/v1/stats", params={"window": "1d"}, headers=headers).json()["totals"]
        assert (totals["errors"], totals["evictions"]) == (1, 1)
        text = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "stats", "--window", "1d",
                               "--index-url", index_url, "--token", tokens.read],
                              capture_output=True, text=True, timeout=60)
        assert text.returncode == 0, text.stderr
        header = next(line for line in text.stdout.splitlines() if line.startswith("team "))
        assert header.split()[-2:] == ["errors", "evicted"]
        row = next(line for line in text.stdout.splitlines() if line.startswith("(none)"))
        assert row.split()[-2:] == ["1", "1"]  # verify's reports carry no team
    finally:
        server.stop()
