"""The first hour's rough edges: mistakes a new user makes get one line and an exit code.

Real subprocesses of the CLI, so what is checked is what a user sees (stdout, stderr, code).
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.services import postgres_reachable, service_missing

CLI = [sys.executable, "-m", "neffcache.cli.main"]


def run(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code, *args] if code else [*CLI, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def test_a_bucket_key_without_values_is_a_usage_error() -> None:
    proc = run("warm", "--instance", "trn2.48xlarge", "--bucket", "SEQ", "--", "true")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = one_line(proc.stderr)
    assert "--bucket SEQ=V1,V2" in line


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_busy_port_is_one_line_with_one_code(workers: str, tmp_path: object) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run("serve", "--port", str(port), "--workers", workers, "--data-dir", f"{tmp_path}/server")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "serving on" not in proc.stdout
    assert f"cannot listen on 127.0.0.1:{port}" in one_line(proc.stderr)


MISSING_SQLALCHEMY = (
    "import sys; sys.modules['sqlalchemy'] = None; sys.argv = ['neffcache', *sys.argv[1:]]\n"
    "from neffcache.cli.main import main; main()"
)


@pytest.mark.parametrize("args", [["serve"], ["token", "list"], ["db", "status"], ["token", "create", "ci"]])
def test_server_commands_without_the_extra_name_it(args: list[str], tmp_path: object) -> None:
    proc = run(*args, "--data-dir", f"{tmp_path}/server", code=MISSING_SQLALCHEMY)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pip install 'neffcache[server]'" in one_line(proc.stderr)


def test_postgres_scheme_is_accepted_as_postgresql() -> None:
    if not postgres_reachable():
        service_missing("PostgreSQL", "nothing listens on 127.0.0.1:5432")
    proc = run("db", "status", "--database-url", "postgres://postgres@127.0.0.1:5432/test", "--json")
    assert proc.returncode in (0, 8), proc.stdout + proc.stderr  # 8: schema behind head, still a valid answer
    assert '"current"' in proc.stdout or '"head"' in proc.stdout, proc.stdout
