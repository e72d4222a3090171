"""Idle and unfinished connections cannot exhaust `neffcache serve` (issue 41, N14; server/connections.py).

Real servers in subprocesses, with the descriptor limit lowered the way a container's would be,
and thousands of real sockets that never finish a request: ``/healthz`` and lookups still answer,
and every unfinished connection is closed with a 408 once its deadline passes. The assertions
are about outcomes (answered, closed, which status), never about how long anything took.
"""

from __future__ import annotations

import http.client
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import Tokens, free_port, prepare_database

pytestmark = pytest.mark.slow

IDLE_SOCKETS = 2000
DESCRIPTORS = 512  # per worker; 2000 idle sockets over 2 workers is far more than they can hold


def _serve(tmp_path: Path, port: int, *args: str) -> subprocess.Popen[bytes]:
    def low_descriptor_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, DESCRIPTORS))

    return subprocess.Popen(
        [sys.executable, "-m", "neffcache.cli.main", "serve", "--port", str(port), "--workers", "2",
         "--data-dir", str(tmp_path / "data"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=low_descriptor_limit)


def _get(port: int, path: str, token: str | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _wait_answering(proc: subprocess.Popen[bytes], port: int) -> None:
    while True:  # bounded by the test timeout: a server that never starts fails the test there
        assert proc.poll() is None, proc.communicate()[0].decode(errors="replace")
        try:
            if _get(port, "/readyz") == 200:
                return
        except OSError:
            time.sleep(0.2)


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    return prepare_database(f"sqlite:///{tmp_path / 'data' / 'index.db'}")


def _start(tmp_path: Path, *args: str) -> Iterator[int]:
    port = free_port()
    proc = _serve(tmp_path, port, *args)
    try:
        _wait_answering(proc, port)
        yield port
    finally:
        proc.terminate()
        proc.communicate(timeout=120)


def _read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(300)  # only so that a server that never closes fails the test instead of hanging it
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_thousands_of_idle_sockets_leave_health_and_lookups_answering(tmp_path: Path, tokens: Tokens) -> None:
    for port in _start(tmp_path):
        idle = []
        try:
            for n in range(IDLE_SOCKETS):
                sock = socket.create_connection(("127.0.0.1", port), timeout=60)
                if n % 2:  # half send half a request's headers and stop, half send nothing at all
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                idle.append(sock)
            # Fresh connections while every idle socket the server could not evict is still open.
            assert _get(port, "/healthz") == 200
            assert _get(port, "/v1/entries/ns/MODULE_1+0badc0de", tokens.read) == 404  # a miss, answered
            assert _get(port, "/v1/entries/ns/MODULE_1+0badc0de") == 401
        finally:
            for sock in idle:
                sock.close()


def test_unfinished_requests_get_408_and_are_closed(tmp_path: Path, tokens: Tokens) -> None:
    for port in _start(tmp_path, "--header-timeout", "1", "--body-timeout", "1"):
        silent = socket.create_connection(("127.0.0.1", port), timeout=60)
        half_headers = socket.create_connection(("127.0.0.1", port), timeout=60)
        half_headers.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        short_body = socket.create_connection(("127.0.0.1", port), timeout=60)
        short_body.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tokens.write.encode()
                           + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[{\"kind\":")
        kept_alive = socket.create_connection(("127.0.0.1", port), timeout=60)
        kept_alive.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\n")
        try:
            for sock in (silent, half_headers):
                answer = _read_to_close(sock)
                assert answer.startswith(b"HTTP/1.1 408 ") and b"headers not received in time" in answer
            answer = _read_to_close(short_body)
            assert answer.startswith(b"HTTP/1.1 408 ") and b"body not received in time" in answer
            # A finished request is answered; the next one, left unfinished, times out like any other.
            answer = _read_to_close(kept_alive)
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1 408 ") == 1
            assert _get(port, "/healthz") == 200
        finally:
            for sock in (silent, half_headers, short_body, kept_alive):
                sock.close()


def _closed_without_a_word(sock: socket.socket) -> bool:
    """The server closed ``sock`` without answering (a reset when its request was unread)."""
    try:
        return _read_to_close(sock) == b""
    except ConnectionResetError:
        return True


def _serve_one(tmp_path: Path, *args: str) -> Iterator[int]:
    """One worker process (the cap is per worker), with a cap of 16 connections."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "neffcache.cli.main", "serve", "--port", str(port), "--max-connections", "16",
         "--data-dir", str(tmp_path / "data"), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_answering(proc, port)
        yield port
    finally:
        proc.terminate()
        proc.communicate(timeout=120)


def test_at_the_cap_the_longest_idle_connection_makes_room(tmp_path: Path, tokens: Tokens) -> None:
    for port in _serve_one(tmp_path):
        idle: list[socket.socket] = []
        try:
            for _ in range(16):  # one at a time: each waits from a moment of its own
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=60))
                idle[-1].sendall(b"G")
                time.sleep(0.05)
            assert _get(port, "/healthz") == 200
            assert _closed_without_a_word(idle[0])  # the one waiting longest
            idle[-1].settimeout(0.5)
            with pytest.raises(TimeoutError):
                idle[-1].recv(1)  # the newest is still open
        finally:
            for sock in idle:
                sock.close()


def test_at_the_cap_with_every_request_in_flight_a_newcomer_gets_503(tmp_path: Path, tokens: Tokens) -> None:
    for port in _serve_one(tmp_path, "--body-timeout", "3600"):
        # Requests in flight: their headers are in, their bodies are coming (never evicted).
        uploading = []
        for _ in range(16):
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + tokens.write.encode()
                         + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
            uploading.append(sock)
        try:
            while True:  # until the server has read every upload's headers; then the newcomer is refused
                newcomer = socket.create_connection(("127.0.0.1", port), timeout=60)
                newcomer.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = _read_to_close(newcomer)
                newcomer.close()
                if answer.startswith(b"HTTP/1.1 503 "):
                    break
                assert answer.startswith(b"HTTP/1.1 200 "), answer
                time.sleep(0.1)
            assert b"too many connections" in answer
            uploading.pop().close()  # one upload gives up: room for the next client
            while _get_or_503(port) == 503:
                time.sleep(0.1)
        finally:
            for sock in uploading:
                sock.close()


def _get_or_503(port: int) -> int:
    try:
        return _get(port, "/healthz")
    except (ConnectionError, http.client.HTTPException):
        return 503
