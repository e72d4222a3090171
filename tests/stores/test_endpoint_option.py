"""One way to point at an S3-compatible endpoint: ``--endpoint-url`` on every command that opens
a store, ``endpoint_url`` in the settings (NEFFCACHE_ENDPOINT_URL, neffcache.toml), and
AWS_ENDPOINT_URL underneath. Each family of commands runs for real, as a subprocess, against
moto's S3 server over HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from neffcache.cli.main import cli
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from neffcache.testing.store_contract import publish_a
from tests.simulation import Sim
from tests.stores.conftest import BUCKET

CLI = [sys.executable, "-m", "neffcache.cli.main"]
STORE_COMMANDS = ["scan", "show", "verify", "push", "pull", "prune", "reconcile", "warm", "rewarm", "run", "doctor"]
URL = f"s3://{BUCKET}/cache"


@pytest.mark.parametrize("command", STORE_COMMANDS)
def test_every_command_that_opens_a_store_takes_endpoint_url(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "--endpoint-url URL" in result.output


def neffcache(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, **(env or {})})


def filled(s3_endpoint: str, entries: int = 2) -> S3Store:
    store = S3Store(URL, endpoint_url=s3_endpoint)
    for i in range(entries):
        publish_a(store, key=f"MODULE_{i}+abb26765")
    return store


def test_scan_show_and_verify_reach_the_endpoint_by_flag_settings_and_file(
        s3_endpoint: str, tmp_path: Path) -> None:
    filled(s3_endpoint)
    scanned = neffcache("scan", URL, "--endpoint-url", s3_endpoint, "--json")
    assert scanned.returncode == 0, scanned.stderr
    assert json.loads(scanned.stdout)["entries"] == 2

    by_env = neffcache("verify", URL, "--json", env={"NEFFCACHE_ENDPOINT_URL": s3_endpoint})
    assert by_env.returncode == 0, by_env.stderr
    assert json.loads(by_env.stdout)["ok"] == 2

    (tmp_path / "neffcache.toml").write_text(f'endpoint_url = "{s3_endpoint}"\n')
    listed = neffcache("scan", URL, "--entries", "--json", env={"NEFFCACHE_CONFIG": str(tmp_path / "neffcache.toml")})
    assert listed.returncode == 0, listed.stderr
    path = json.loads(listed.stdout)["entry_list"][0]["path"]
    shown = neffcache("show", URL, path, "--json", env={"AWS_ENDPOINT_URL": s3_endpoint})
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "SUCCESS"


def test_push_and_prune_take_the_flag(s3_endpoint: str, tmp_path: Path) -> None:
    src = LocalStore(tmp_path / "src")
    for i in range(3):
        publish_a(src, key=f"MODULE_{i}+abb26765")
    pushed = neffcache("push", str(src.root), URL, "--endpoint-url", s3_endpoint, "--json")
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["copied"] == 3

    planned = neffcache("prune", "--store", URL, "--max-size", "11000", "--hit-grace", "0s", "--no-index",
                        "--endpoint-url", s3_endpoint, "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["plan"]["entries"] == 1


def test_run_publishes_to_s3_through_the_flag(s3_endpoint: str, tmp_path: Path, sim: Sim) -> None:
    env = {**sim.env, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    proc = subprocess.run([*CLI, "run", "--instance", "trn2.48xlarge", "--store", str(tmp_path / "local"),
                           "--store", URL, "--endpoint-url", s3_endpoint, "--", sys.executable, "-m",
                           "neffcache.testing.workload", "--model", "tiny", "--bucket", "128", "--graphs", "2"],
                          env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "published 2 new entries" in proc.stderr
    scanned = neffcache("scan", URL, "--endpoint-url", s3_endpoint, "--json")
    assert json.loads(scanned.stdout)["entries"] == 2, scanned.stdout
