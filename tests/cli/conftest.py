"""Fixtures of the CLI tests: a real index server (uvicorn, SQLite) with real tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import ServerProcess, Tokens, free_port, prepare_database


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[ServerProcess, Tokens]]:
    db_url = f"sqlite:///{tmp_path / 'index.db'}"
    tokens = prepare_database(db_url)
    server = ServerProcess(db_url, free_port(), tmp_path / "server.log")
    try:
        server.wait_ready()
        yield server, tokens
    finally:
        server.stop()
