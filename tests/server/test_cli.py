"""`neffcache serve`, `neffcache token create|list|revoke`, `neffcache stats`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import httpx
import pytest
from click.testing import CliRunner

from neffcache.cli import index as index_cli
from neffcache.cli import server as server_cli
from neffcache.cli.index import stats_cmd
from neffcache.cli.server import token_group
from neffcache.errors import ConfigError
from tests.server.conftest import LiveServer, Tokens, free_port
from tests.server.factories import entry, event


def _all_commands() -> list[click.Command]:
    out: list[click.Command] = []
    for command in [*server_cli.COMMANDS, *index_cli.COMMANDS]:
        out.append(command)
        if isinstance(command, click.Group):
            out += list(command.commands.values())
    return out


@pytest.mark.parametrize("command", _all_commands(), ids=lambda c: c.name)
def test_every_command_has_help_with_an_example(command: click.Command) -> None:
    result = CliRunner().invoke(command, ["--help"])
    assert result.exit_code == 0
    assert "Example" in result.output and "neffcache " in result.output


def test_token_create_list_revoke(db_url: str, start_server: Callable[..., LiveServer]) -> None:
    runner = CliRunner()
    created = runner.invoke(token_group, ["create", "ci-warmers", "--scope", "write", "--database-url", db_url])
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip().splitlines()[0]
    assert secret.startswith("nfc_")
    listed = runner.invoke(token_group, ["list", "--database-url", db_url, "--json"])
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["scope"], r["active"]) for r in rows] == [("ci-warmers", "write", True)]
    assert secret not in listed.stdout

    server = start_server(db_url)
    with server.client(secret) as client:
        assert client.post("/v1/events", json=[event("hit")]).status_code == 200
        revoked = runner.invoke(token_group, ["revoke", "ci-warmers", "--database-url", db_url])
        assert revoked.exit_code == 0 and "revoked" in revoked.stdout
        assert client.post("/v1/events", json=[event("hit")]).status_code == 401
    table = runner.invoke(token_group, ["list", "--database-url", db_url]).stdout
    assert "ci-warmers" in table and "revoked" in table

    duplicate = runner.invoke(token_group, ["create", "ci-warmers", "--database-url", db_url])
    assert isinstance(duplicate.exception, ConfigError)
    missing = runner.invoke(token_group, ["revoke", "nobody", "--database-url", db_url])
    assert isinstance(missing.exception, ConfigError)


def test_token_create_with_a_team_and_prefixes(db_url: str, start_server: Callable[..., LiveServer]) -> None:
    runner = CliRunner()
    created = runner.invoke(token_group, ["create", "pr-123", "--scope", "write", "--team", "search", "--prefix",
                                          "pr-123/", "--prefix", "s3://cache/pr/123/", "--database-url", db_url])
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip().splitlines()[0]
    rows = json.loads(runner.invoke(token_group, ["list", "--database-url", db_url, "--json"]).stdout)
    assert [(r["team"], r["prefixes"]) for r in rows] == [("search", ["pr-123", "s3://cache/pr/123"])]
    assert "s3://cache/pr/123" in runner.invoke(token_group, ["list", "--database-url", db_url]).stdout
    bad = runner.invoke(token_group, ["create", "bad", "--prefix", "a/../b", "--database-url", db_url])
    assert isinstance(bad.exception, ConfigError) and "'..'" in str(bad.exception)

    server = start_server(db_url)
    with server.client(secret) as client:
        inside = entry(1, namespace="pr-123/ns", store="s3://cache/pr/123/tier")
        assert client.post("/v1/entries", json=[inside]).status_code == 200
        assert client.post("/v1/entries", json=[entry(2, namespace="main/ns", store="s3://cache/pr/123/tier")]
                           ).status_code == 403
        assert client.post("/v1/events", json=[event("hit", team="other")]).status_code == 403


def test_token_commands_default_to_the_embedded_database(tmp_path: Path) -> None:
    result = CliRunner().invoke(token_group, ["create", "local", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["token"].startswith("nfc_")
    assert (Path(os.environ["HOME"]) / ".local/share/neffcache/server/index.db").is_file()


def test_stats_table_and_json(server: LiveServer, tokens: Tokens) -> None:
    with server.client(tokens.write) as client:
        client.post("/v1/entries", json=[entry(1, size=2_000_000)]).raise_for_status()
        client.post("/v1/events", json=[event("hit", compile_seconds=3600.0), event("miss", key="MODULE_7+ab"),
                                        event("compile", compile_seconds=1800.0)]).raise_for_status()
    args = ["--index-url", server.url, "--token", tokens.read]
    text = CliRunner().invoke(stats_cmd, args)
    assert text.exit_code == 0, text.output
    assert "hit rate        50.0%  (1 hit, 1 miss: job traffic)" in text.stdout
    assert "saved by hits   60 min of compile time" in text.stdout
    assert "warm-ups        0 graphs compiled ahead of demand (0.0 s of compile time; warm 0, rewarm 0)" in text.stdout
    assert "MODULE_7+ab" in text.stdout and "2.0 MB in 1 entry" in text.stdout
    data = json.loads(CliRunner().invoke(stats_cmd, [*args, "--json", "--window", "24h"]).stdout)
    assert data["totals"]["hits"] == 1 and data["totals"]["compile_hours"] == 0.5
    assert data["hit_rate"] == 0.5


@pytest.mark.parametrize("window", ["3x", "1.5d", "0", "7 d", "-1h"])
def test_a_window_the_index_does_not_take_is_a_usage_error_before_any_request(window: str) -> None:
    """Exit 2 with what a window is, not exit 7 with the server's regex (no server runs here)."""
    result = CliRunner().invoke(stats_cmd, ["--index-url", "http://127.0.0.1:9", "--window", window])
    assert result.exit_code == 2, result.output
    assert f"{window!r} is not a window: a whole number and a unit" in result.output
    assert "^[1-9]" not in result.output


def test_stats_needs_an_index() -> None:
    result = CliRunner().invoke(stats_cmd, [])
    assert isinstance(result.exception, ConfigError)
    assert "NEFFCACHE_INDEX_URL" in str(result.exception)


@pytest.mark.slow
def test_serve_without_database_arguments_uses_embedded_sqlite(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "neffcache.cli.main", "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = proc.stdout.readline()  # type: ignore[union-attr]
        assert f"http://127.0.0.1:{port}/" in banner
        database = proc.stdout.readline()  # type: ignore[union-attr]
        assert "sqlite:///" in database and ".local/share/neffcache/server/index.db" in database
        assert "neffcache token create" in proc.stdout.readline()  # type: ignore[union-attr]
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None  # waits as long as the server lives: the test's timeout bounds it
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]


@pytest.mark.slow
def test_serve_with_workers_answers_without_delayed_ack_stalls(tmp_path: Path) -> None:
    """uvicorn's own --workers socket misses TCP_NODELAY (~40 ms per response); ours must not."""
    import http.client

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "neffcache.cli.main", "serve", "--port", str(port), "--workers",
                             "2", "--anonymous-read", "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                break
            except OSError:
                assert proc.poll() is None  # waits as long as the server lives: the test's timeout bounds it
                time.sleep(0.2)
        latencies = []
        for _ in range(40):
            started = time.perf_counter()
            conn.request("GET", "/v1/whoami")
            assert conn.getresponse().read()
            latencies.append(time.perf_counter() - started)
        conn.close()
        # With the stall every response takes >= 40 ms; without it the fastest are far below,
        # however busy the machine is.
        assert min(latencies) < 0.020, f"fastest of 40 requests took {min(latencies) * 1000:.0f} ms"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_db_status_and_upgrade(db_url: str) -> None:
    from neffcache.cli.server import db_group

    runner = CliRunner()
    before = runner.invoke(db_group, ["status", "--database-url", db_url, "--check", "--json"])
    assert before.exit_code == 8, before.output
    state = json.loads(before.stdout)
    assert state["current"] is None and not state["up_to_date"]

    upgraded = runner.invoke(db_group, ["upgrade", "--database-url", db_url, "--json"])
    assert upgraded.exit_code == 0, upgraded.output
    done = json.loads(upgraded.stdout)
    assert done["before"] is None and done["current"] == done["head"] and done["up_to_date"]

    again = runner.invoke(db_group, ["upgrade", "--database-url", db_url])
    assert again.exit_code == 0 and "nothing to do" in again.stdout
    after = runner.invoke(db_group, ["status", "--database-url", db_url, "--check"])
    assert after.exit_code == 0 and "up to date" in after.stdout


@pytest.mark.parametrize(("args", "code", "message"), [
    (["db", "status", "--database-url", "not a url"], 2, "bad database URL"),
    (["db", "upgrade", "--database-url", "mysql://root@127.0.0.1/test"], 2, "SQLite and PostgreSQL"),
    (["token", "list", "--database-url", "postgresql://root@127.0.0.1:1/test"], 7, "cannot use the database"),
    (["serve", "--database-url", "sqlite:////proc/no/such/dir/index.db"], 4, "No such file or directory"),
])
def test_bad_database_urls_are_one_line_errors(args: list[str], code: int, message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args], capture_output=True, text=True,
                            timeout=60)
    assert "Traceback" not in result.stderr and result.stderr.startswith("neffcache: "), result.stderr
    assert result.returncode == code and message in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["--access-log"]], ids=["default", "access-log"])
def test_serve_logs_one_line_per_request_only_with_access_log(tmp_path: Path, flags: list[str]) -> None:
    """As shipped (the default log level, as deploy/k8s runs it) no line per request: it cost a
    third of a worker's lookups (issue 38); --access-log turns it on."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "neffcache.cli.main", "serve", "--port", str(port), "--workers",
                             "2", "--data-dir", str(tmp_path), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while True:  # bounded by the test's timeout
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None
                time.sleep(0.1)
        for _ in range(3):
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
    logged = [line for line in output.splitlines() if '"GET /healthz HTTP/1.1" 200' in line]
    assert len(logged) == (3 if flags else 0), output
