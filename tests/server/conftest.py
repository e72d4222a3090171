"""Index-server fixtures: a clean database per test (SQLite file or a fresh PostgreSQL schema)
and real servers on 127.0.0.1 (uvicorn in a thread, or uvicorn processes for the replica tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from neffcache.server.app import create_app
from neffcache.server.config import ServerSettings
from neffcache.server.services.tokens import create_token
from neffcache.server.storage.db import Database, migrate
from tests.services import fresh_postgres_schema

ADMIN_SECRET = "bootstrap-admin-secret-for-tests"


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_postgres_schema()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'index.db'}"
    else:
        yield from fresh_postgres_schema()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'index.db'}"


class LiveServer:
    """A real uvicorn server for one app, on an ephemeral port of 127.0.0.1, in a thread."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_config=None, log_level="warning",
                                access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        # As long as the server thread lives, however loaded the machine: a server that never
        # starts fails the test at its timeout (pyproject.toml), never at a deadline of ours.
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("index server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def db(self) -> Database:
        db: Database = self.app.state.neffcache.db
        return db

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)


@dataclass
class Tokens:
    read: str
    write: str
    admin: str


def make_tokens(db: Database) -> Tokens:
    with db.write() as session:
        secrets = {scope: create_token(session, f"test-{scope}", scope)[1] for scope in ("read", "write", "admin")}
    return Tokens(**secrets)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    started: list[LiveServer] = []

    def start(database_url: str, **settings: Any) -> LiveServer:
        values: dict[str, Any] = {"data_dir": tmp_path / "data", "database_url": database_url,
                                  "admin_token": ADMIN_SECRET, "token_cache_seconds": 0.0, **settings}
        live = LiveServer(ServerSettings(**values)).__enter__()
        started.append(live)
        return live

    yield start
    for live in reversed(started):
        live.__exit__()


@pytest.fixture
def server(db_url: str, start_server: Callable[..., LiveServer]) -> LiveServer:
    return start_server(db_url)


@pytest.fixture
def tokens(server: LiveServer) -> Tokens:
    return make_tokens(server.db)


@pytest.fixture
def writer(server: LiveServer, tokens: Tokens) -> Iterator[httpx.Client]:
    with server.client(tokens.write) as client:
        yield client


@pytest.fixture
def reader(server: LiveServer, tokens: Tokens) -> Iterator[httpx.Client]:
    with server.client(tokens.read) as client:
        yield client


def prepare_database(url: str) -> Tokens:
    db = Database(url, pool_size=2)
    try:
        migrate(db.engine)
        return make_tokens(db)
    finally:
        db.dispose()


class ServerProcess:
    """``uvicorn --factory neffcache.server.app:create_app`` as a separate process, like a replica."""

    def __init__(self, database_url: str, port: int, log: Path, **env: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        # Only the settings given here: nothing from a developer's NEFFCACHE_SERVER_* environment.
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("NEFFCACHE_SERVER_")}
        environ = {**inherited, "NEFFCACHE_SERVER_DATABASE_URL": database_url,
                   "NEFFCACHE_SERVER_ADMIN_TOKEN": ADMIN_SECRET, "NEFFCACHE_SERVER_TOKEN_CACHE_SECONDS": "0", **env}
        self.log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "neffcache.server.app:create_app", "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning", "--no-access-log"],
            env=environ, stdout=self.log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> None:
        """Until the replica answers ready, as long as its process lives (bounded by the test's
        timeout, not by a deadline that a loaded machine would miss)."""
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
