"""How tests treat an external service (PostgreSQL, Chromium) that is not there.

On a laptop without the service the test skips with a message that says so; in CI
(``.ci/run`` sets ``NEFFCACHE_REQUIRE_SERVICES=1``) a missing service is a failure, so a
skip can never hide a broken CI machine.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Iterator

import pytest

REQUIRE_ENV = "NEFFCACHE_REQUIRE_SERVICES"
POSTGRES_URL = os.environ.get("NEFFCACHE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def services_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def service_missing(name: str, reason: str) -> None:
    message = f"{name} is not available ({reason}); CI sets {REQUIRE_ENV}=1 and fails instead of skipping"
    if services_required():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def postgres_reachable(host: str = "127.0.0.1", port: int = 5432) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def chromium_executable() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def fresh_postgres_schema(prefix: str = "t") -> Iterator[str]:
    """Yield a URL of the `test` database whose connections see only a new, empty schema
    (dropped afterwards): a clean database per test without CREATE DATABASE rights."""
    from sqlalchemy import create_engine, text

    if not postgres_reachable():
        service_missing("PostgreSQL on 127.0.0.1:5432", "connection refused")
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
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
