"""No silent failures: reports that wait in the spool are announced, in one line, by every
command that reports; a refused token is named; `flush` shows spools of other index URLs;
push/pull say when they made their destination.

Real processes throughout: the CLI as a subprocess, the index as a uvicorn process (or
nothing listening on its port), the simulated toolchain for warm and run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.server.conftest import ServerProcess, Tokens, free_port
from tests.simulation import Sim

CLI = [sys.executable, "-m", "neffcache.cli.main"]
WORKLOAD = [sys.executable, "-m", "neffcache.testing.workload"]


def neffcache(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, check=False, env=env)


def notice(stderr: str) -> str:
    """The spool notice: exactly one line says reports are spooled, and it is the last one."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    spooled = [line for line in lines if "spooled" in line]
    assert len(spooled) == 1, stderr
    assert lines[-1] == spooled[0], stderr
    assert "Traceback" not in stderr
    return spooled[0]


def source(tmp_path: Path, entries: int = 3) -> LocalStore:
    src = LocalStore(tmp_path / "src")
    for i in range(entries):
        publish_a(src, key=f"MODULE_{i}+abb26765")
    return src


def test_push_to_a_down_index_says_how_many_wait_why_and_how_to_deliver(tmp_path: Path) -> None:
    src = source(tmp_path)
    down = f"http://127.0.0.1:{free_port()}"
    proc = neffcache("push", str(src.root), str(tmp_path / "dst"), "--index-url", down, "--token", "t", "--json")
    assert proc.returncode == 0, proc.stderr
    line = notice(proc.stderr)
    assert line.startswith("neffcache: 3 index reports spooled (index unreachable: connection refused)"), line
    # The URL came from a flag: a plain `neffcache flush` would not find it, so the hint names it.
    assert line.endswith(f"deliver them with `neffcache flush --index-url {down}`"), line
    data = json.loads(proc.stdout)
    assert data["index"]["waiting"] == 3 and data["index"]["problem"].startswith("index unreachable")
    assert data["created_destination"] is True


def test_the_configured_index_gets_a_plain_flush_hint(tmp_path: Path) -> None:
    src = source(tmp_path, 1)
    env = {**os.environ, "NEFFCACHE_INDEX_URL": f"http://127.0.0.1:{free_port()}"}
    proc = neffcache("push", str(src.root), str(tmp_path / "dst"), env=env)
    assert proc.returncode == 0, proc.stderr
    assert notice(proc.stderr).endswith("deliver them with `neffcache flush`")
    assert f"created file://{tmp_path / 'dst'} (it did not exist)" in proc.stdout


def test_a_refused_token_is_named_and_the_reports_kept_for_a_flush(
        tmp_path: Path, index: tuple[ServerProcess, Tokens]) -> None:
    server, tokens = index
    src = source(tmp_path)
    dst = LocalStore(tmp_path / "dst")  # exists: nothing created, nothing said about it
    proc = neffcache("push", str(src.root), str(dst.root), "--index-url", server.url, "--token", "not-a-token")
    assert proc.returncode == 0, proc.stderr
    line = notice(proc.stderr)
    assert "3 index reports spooled (the index refused the token (401)" in line, line
    assert "created" not in proc.stdout

    read_only = neffcache("push", str(src.root), str(tmp_path / "dst2"), "--index-url", server.url,
                          "--token", tokens.read, "--json")
    assert proc.returncode == 0, read_only.stderr
    assert "the token may not write to the index (403)" in notice(read_only.stderr)
    assert json.loads(read_only.stdout)["index"]["token_refused"] is True

    flushed = neffcache("flush", "--index-url", server.url, "--token", "not-a-token")
    assert flushed.returncode == 7
    assert "refused the token (401)" in flushed.stdout
    delivered = neffcache("flush", "--index-url", server.url, "--token", tokens.write, "--json")
    assert delivered.returncode == 0, delivered.stdout + delivered.stderr
    assert json.loads(delivered.stdout)["delivered_entries"] == 6


def test_nothing_is_said_when_every_report_was_delivered(
        tmp_path: Path, index: tuple[ServerProcess, Tokens]) -> None:
    server, tokens = index
    src = source(tmp_path)
    proc = neffcache("push", str(src.root), str(tmp_path / "dst"), "--index-url", server.url,
                     "--token", tokens.write, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "spooled" not in proc.stderr
    assert json.loads(proc.stdout)["index"]["waiting"] == 0


def test_prune_and_verify_announce_their_spooled_reports(tmp_path: Path) -> None:
    store = source(tmp_path)
    down = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "NEFFCACHE_INDEX_URL": down}
    # One entry of three over a size budget: no guard rail stands in the way.
    pruned = neffcache("prune", "--store", str(store.root), "--max-size", "11000", "--hit-grace", "0s", "--yes",
                       env=env)
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert "removed 1 item (1 entry)" in pruned.stdout
    assert "1 index report spooled (index unreachable" in notice(pruned.stderr)

    bad = next(iter(sorted(p.parent for p in store.root.rglob("model.neff"))))
    (bad / "model.neff").write_bytes(b"flipped bits")
    verified = neffcache("verify", str(store.root), "--fix", "--index-url", down)
    assert verified.returncode == 0, verified.stderr
    assert "3 index reports spooled (index unreachable" in notice(verified.stderr)


def test_warm_and_run_announce_their_spooled_reports(tmp_path: Path, sim: Sim) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    store = tmp_path / "store"
    warm = subprocess.run([*CLI, "warm", "--instance", "trn2.48xlarge", "--store", str(store), "--bucket",
                           "SEQ=128,256", "--quiet", "--index-url", down, "--", *WORKLOAD, "--model", "tiny",
                           "--bucket", "{SEQ}", "--graphs", "2"],
                          env=sim.env, capture_output=True, text=True, timeout=180, check=False)
    assert warm.returncode == 0, warm.stdout + warm.stderr
    assert "index reports spooled (index unreachable" in notice(warm.stderr)

    run = subprocess.run([*CLI, "run", "--instance", "trn2.48xlarge", "--store", str(store), "--index-url", down,
                          "--", *WORKLOAD, "--model", "tiny", "--bucket", "128", "--graphs", "2"],
                         env=sim.env, capture_output=True, text=True, timeout=180, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "index reports spooled (index unreachable" in notice(run.stderr)


def test_flush_shows_spools_waiting_for_another_index_url(tmp_path: Path) -> None:
    src = source(tmp_path, 2)
    other = f"http://127.0.0.1:{free_port()}"
    neffcache("push", str(src.root), str(tmp_path / "dst"), "--index-url", other)

    unconfigured = neffcache("flush")
    assert unconfigured.returncode == 2
    assert f"2 reports in 1 batch for {other} (deliver: neffcache flush --index-url {other})" in unconfigured.stdout
    assert len(unconfigured.stderr.strip().splitlines()) == 1

    mine = f"http://127.0.0.1:{free_port()}"
    listed = neffcache("flush", "--index-url", mine, "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["others"] == [
        {"url": other, "spool": json.loads(listed.stdout)["others"][0]["spool"], "batches": 1, "reports": 2}]

    still = neffcache("flush", "--index-url", other)
    assert still.returncode == 7
    assert "also waiting" not in still.stdout
