"""The index-server fixtures (a real server on SQLite and on PostgreSQL), for the client's tests."""

from tests.server.conftest import db_url, server, start_server, tokens, writer

__all__ = ["db_url", "server", "start_server", "tokens", "writer"]
