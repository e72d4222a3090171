"""Every hint a command prints runs as printed: each test makes a command print its hint, then
executes that very line in a shell (``sh -c``, with this checkout's ``neffcache`` first on
PATH) and checks it did what the hint says.

The hints tested elsewhere the same way: `failures`' bundle command (tests/cli/test_failures.py),
the demo's dashboard command (tests/warmers/test_demo.py), a guarded prune's --yes --force
(tests/prune/test_guard.py). Tokens are never printed: a hint that needs one finds it where the
user keeps it (NEFFCACHE_TOKEN or neffcache.toml), as here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from neffcache.server.storage.db import Database, head_revision, migrate
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.server.conftest import ServerProcess, free_port, prepare_database
from tests.simulation import Sim

CLI = [sys.executable, "-m", "neffcache.cli.main"]


def _env(**extra: str) -> dict[str, str]:
    """The environment a user's shell has: this checkout's `neffcache` first on PATH."""
    env = {**os.environ, **extra}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def neffcache(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, check=False, env=env, cwd=cwd)


def hint(text: str) -> str:
    """The one command in backquotes that ``text`` offers, as printed."""
    found = re.findall(r"`((?:[A-Z_]+=\S+ )?neffcache [^`]+)`", text)
    assert len(found) == 1, text
    return found[0]


def run_hint(command: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert (Path(sys.executable).parent / "neffcache").exists()
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=180, check=False,
                          env=env, cwd=cwd)


def _source(tmp_path: Path, entries: int = 3) -> LocalStore:
    src = LocalStore(tmp_path / "src")
    for i in range(entries):
        publish_a(src, key=f"MODULE_{i}+abb26765")
    return src


def _registered(server: ServerProcess, token: str) -> list[str]:
    body = httpx.get(f"{server.url}/v1/entries", params={"limit": 100},
                     headers={"Authorization": f"Bearer {token}"}).json()
    return sorted(e["path"] for e in body["entries"])


@pytest.mark.parametrize("configured", [True, False], ids=["configured-index", "index-from-a-flag"])
def test_the_spool_notice_flush_delivers_once_the_index_is_up(tmp_path: Path, configured: bool) -> None:
    db_url = f"sqlite:///{tmp_path / 'index.db'}"
    tokens = prepare_database(db_url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = _env(NEFFCACHE_TOKEN=tokens.write, NEFFCACHE_SPOOL_DIR=str(tmp_path / "spool"),
               **({"NEFFCACHE_INDEX_URL": url} if configured else {}))
    pushed = neffcache("push", str(_source(tmp_path).root), str(tmp_path / "dst"),
                       *(() if configured else ("--index-url", url)), env=env)
    assert pushed.returncode == 0, pushed.stderr
    command = hint(pushed.stderr.strip().splitlines()[-1])
    assert command == ("neffcache flush" if configured else f"neffcache flush --index-url {url}")
    server = ServerProcess(db_url, port, tmp_path / "server.log")
    try:
        server.wait_ready()
        ran = run_hint(command, env, tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert len(_registered(server, tokens.read)) == 3
    finally:
        server.stop()


def test_the_lost_reports_reconcile_restores_the_index(tmp_path: Path) -> None:
    """A spool that cannot be written and the index down: the reports are lost, and the
    warning's reconcile (with the index URL the flag named) registers what push copied."""
    db_url = f"sqlite:///{tmp_path / 'index.db'}"
    tokens = prepare_database(db_url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "a-file").write_bytes(b"")
    env = _env(NEFFCACHE_TOKEN=tokens.write, NEFFCACHE_SPOOL_DIR=str(tmp_path / "a-file" / "spool"))
    dst = tmp_path / "dst"
    pushed = neffcache("push", str(_source(tmp_path).root), str(dst), "--index-url", url, env=env)
    assert pushed.returncode == 0, pushed.stderr
    (warning,) = [line for line in pushed.stderr.splitlines() if line.startswith("neffcache: warning:")]
    command = hint(warning)
    assert command == f"NEFFCACHE_INDEX_URL={url} neffcache reconcile --store {dst} --yes"
    server = ServerProcess(db_url, port, tmp_path / "server.log")
    try:
        server.wait_ready()
        ran = run_hint(command, _env(NEFFCACHE_TOKEN=tokens.admin), tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert len(_registered(server, tokens.read)) == 3
    finally:
        server.stop()


def test_the_token_hints_of_serve_and_token_commands_use_the_same_database(tmp_path: Path) -> None:
    data_dir = tmp_path / "server data"  # a space: the hint quotes it
    env = _env()
    port = free_port()
    serve = subprocess.Popen([*CLI, "serve", "--port", str(port), "--data-dir", str(data_dir)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = [serve.stdout.readline() for _ in range(3)]  # type: ignore[union-attr]
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        serve.stdout.close()  # type: ignore[union-attr]
    created = run_hint(hint(lines[2]), env, tmp_path)
    assert created.returncode == 0 and created.stdout.startswith("nfc_"), created.stderr
    listed = neffcache("token", "list", "--data-dir", str(data_dir), "--json", env=env)
    assert [t["name"] for t in json.loads(listed.stdout)] == ["ci"]

    other = tmp_path / "empty"
    empty = neffcache("token", "list", "--data-dir", str(other), env=env)
    assert run_hint(hint(empty.stdout), env, tmp_path).returncode == 0
    missing = neffcache("token", "revoke", "nobody", "--data-dir", str(other), env=env)
    assert missing.returncode == 2
    shown = run_hint(hint(missing.stderr), env, tmp_path)
    assert shown.returncode == 0 and "ci" in shown.stdout


def test_db_status_behind_names_the_upgrade_of_that_database(tmp_path: Path) -> None:
    data_dir = tmp_path / "server"
    data_dir.mkdir()
    db = Database(f"sqlite:///{data_dir / 'index.db'}", pool_size=1)
    try:
        migrate(db.engine, "0004")
    finally:
        db.dispose()
    env = _env()
    status = neffcache("db", "status", "--data-dir", str(data_dir), env=env)
    assert status.returncode == 0 and "behind" in status.stdout, status.stderr
    ran = run_hint(hint(status.stdout), env, tmp_path)
    assert ran.returncode == 0, ran.stderr
    now = json.loads(neffcache("db", "status", "--data-dir", str(data_dir), "--json", env=env).stdout)
    assert now["current"] == head_revision()


def test_the_scan_hints_plan_what_they_say(tmp_path: Path, sim: Sim) -> None:
    """scan names the failures and prune commands of the store it scanned."""
    store = tmp_path / "my cache"
    env = _env(**sim.env, NEFFSIM_FAIL_MATCH="g1$")
    warmed = neffcache("warm", "--instance", "trn2.48xlarge", "--store", str(store), "--bucket", "SEQ=128",
                       "--quiet", "--", sys.executable, "-m", "neffcache.testing.workload", "--model", "llama-tiny",
                       "--bucket", "{SEQ}", "--graphs", "2", env=env)
    assert warmed.returncode == 1, warmed.stderr  # one graph failed to compile: a cached compiler error
    (marker,) = list(store.rglob("model.done"))
    marker.unlink()  # an uncommitted entry: garbage for prune
    scanned = neffcache("scan", str(store), env=env)
    failed = next(line for line in scanned.stdout.splitlines() if line.startswith("failed: "))
    garbage = next(line for line in scanned.stdout.splitlines() if line.startswith("garbage: "))
    commands = [*re.findall(r"`(neffcache [^`]+)`", failed), hint(garbage)]
    assert len(commands) == 3
    for command in commands:
        ran = run_hint(command, env, tmp_path)
        assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
    groups = json.loads(run_hint(commands[0] + " --json", env, tmp_path).stdout)["groups"]
    assert [g["class"] for g in groups] == ["compiler"]
    plan = run_hint(commands[2], env, tmp_path).stdout
    assert "grace period" in plan  # the uncommitted entry is young: planned, kept while it may be in flight


def test_runs_why_miss_hint_explains_the_jobs_misses(tmp_path: Path, sim: Sim) -> None:
    store = tmp_path / "cache"
    env = _env(**{**sim.env, "TORCH_NEURONX_COMPILE_ONLY": ""})
    job = neffcache("run", "--instance", "trn2.48xlarge", "--store", str(store), "--report", "report.json", "--",
                    sys.executable, "-m", "neffcache.testing.workload", "--model", "llama-tiny", "--bucket", "128",
                    "--graphs", "2", "--steps", "1", env=env, cwd=tmp_path)
    assert job.returncode == 0, job.stderr
    (line,) = [ln for ln in job.stderr.splitlines() if "why: " in ln]
    command = line.split("why: ", 1)[1]
    assert command == f"neffcache why-miss --from-report report.json --store {store}"
    ran = run_hint(command, env, tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "MODULE_" in ran.stdout
