"""Fixtures for the deploy suite: real servers started with the manifests' own command lines
and environment, moto's S3 on 127.0.0.1, and a fresh PostgreSQL schema per test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.services import POSTGRES_URL, postgres_reachable, service_missing
from tests.stores.moto_server import S3TestServer, start_server

NEFFCACHE = [sys.executable, "-m", "neffcache.cli.main"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def local_argv(argv: list[str]) -> list[str]:
    """``neffcache ...`` as this interpreter runs it (the venv's package, no PATH lookup)."""
    assert argv[0] == "neffcache", argv
    return [*NEFFCACHE, *argv[1:]]


def with_option(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced (the flag must be there: we only rebind, never add)."""
    assert flag in argv, f"{flag} not in {argv}"
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen[str]
    log: Path

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.url + path, headers=headers, timeout=10)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serve(argv: list[str], env: Mapping[str, str], workdir: Path) -> Iterator[RunningServer]:
    """Run a manifest's ``neffcache serve ...`` for real, rebound to a free port of 127.0.0.1."""
    port = free_port()
    argv = with_option(with_option(argv, "--host", "127.0.0.1"), "--port", str(port))
    log = workdir / f"serve-{port}.log"
    full_env = {**os.environ, **env}
    with log.open("w") as out:
        process = subprocess.Popen(local_argv(argv), env=full_env, stdout=out, stderr=subprocess.STDOUT, text=True,
                                   cwd=workdir, start_new_session=True)
    server = RunningServer(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"`{' '.join(argv)}` exited {process.returncode}:\n{server.output()}")
            try:
                if server.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"`{' '.join(argv)}` never became ready:\n{server.output()}")
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # uvicorn stops its worker processes on SIGTERM
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL whose connections see only a fresh schema of the `test` database."""
    if not postgres_reachable():
        service_missing("PostgreSQL on 127.0.0.1:5432", "connection refused")
    schema = f"deploy_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as exc:
        admin.dispose()
        service_missing("PostgreSQL database 'test'", str(exc).splitlines()[0])
    sep = "&" if "?" in POSTGRES_URL else "?"
    try:
        yield f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="session")
def moto() -> Iterator[S3TestServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def s3_env(moto: S3TestServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """AWS settings that reach moto; buckets are created by each test (as the manifests do)."""
    env = {"AWS_ENDPOINT_URL": moto.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def make_bucket(s3_env: dict[str, str]) -> Callable[[], str]:
    def make() -> str:
        name = f"deploy-{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1").create_bucket(Bucket=name)
        return name

    return make
