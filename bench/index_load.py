"""The index benchmark's load generator: its own process, raw keep-alive sockets, prebuilt requests.

Why a process of its own: on a 2-core machine a load generator sharing the benchmark's
interpreter (or the server's cores through the GIL of client threads) takes CPU the server
would have had, and nobody sees how much. Here it runs in a child process (spawned, so it
shares nothing with the parent) that reports the CPU it used in the timed loop
(``resource.getrusage`` of itself), which bench/index_bench.py prints beside the server's.

Why raw sockets: each request is built once, as bytes, before the clock starts; one thread
multiplexes every client connection through ``selectors`` (epoll), so a request costs the
generator a ``send``, a ``recv`` or two and a header scan, against several times that for
``http.client`` in a thread (its CPU per request is printed: bench/index_bench.py). Each
"client" is one keep-alive HTTP/1.1 connection with at most one request in flight, as a real
client's connection is.

The answers are checked here (status, and for a batch/ingest the body), so the parent never
copies megabytes of responses across the process boundary.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import socket
import time
import urllib.parse
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

RETRY_PAUSE = 1.0  # a 503 (SQLite busy timeout ran out) is retried after this, like the real client


@dataclass
class Load:
    """What the generator sends: prebuilt requests, what each answer must be, how many clients."""

    requests: list[bytes]
    kind: str  # "lookup" (200), "batch" (200, no missing key), "ingest" (200, all counted; 503 retried)
    clients: int
    # ingest: events per request; lookup: the status each answer must have (200 a hit, 404 a
    # miss), 200 for every one when empty
    expected: list[int] = field(default_factory=list)


@dataclass
class Outcome:
    seconds: float
    latencies: list[float]
    cpu_seconds: float  # the generator's own user + system CPU in the timed loop
    retried_503: int
    reconnects: int  # idle connections the server closed, opened again


def request(method: str, port: int, path: str, token: str, body: bytes | None = None) -> bytes:
    head = [f"{method} {urllib.parse.quote(path)} HTTP/1.1", f"Host: 127.0.0.1:{port}",
            f"Authorization: Bearer {token}"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")


class _Connection:
    """One keep-alive connection, non-blocking: a request whose body the kernel cannot take at
    once is finished when the socket is writable, so one slow connection never stalls the
    others (a stalled loop would leave answers unread past uvicorn's 5 s keep-alive timeout)."""

    def __init__(self, port: int, share: list[tuple[int, bytes]], selector: selectors.BaseSelector) -> None:
        self.port = port
        self.share = share
        self.selector = selector
        self.next = 0
        self.buffer = bytearray()
        self.out = memoryview(b"")
        self.started = 0.0
        self.resume_at = 0.0  # after a 503: not before this
        self.reconnects = 0
        self.sock = self._connect()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, self)
        return sock

    def send(self) -> bool:
        if self.next >= len(self.share):
            return False
        self.buffer.clear()
        self.started = time.perf_counter()
        self.out = memoryview(self.share[self.next][1])
        self.flush()
        return True

    def flush(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            sent = 0
        self.out = self.out[sent:]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if self.out else 0)
        self.selector.modify(self.sock, events, self)

    def answer(self) -> tuple[int, bytes] | None:
        """(status, body) once the whole response is in, else None."""
        try:
            chunk = self.sock.recv(1 << 20)
        except BlockingIOError:
            return None
        if not chunk:
            if self.buffer or self.reconnects >= 3:
                raise ConnectionError("server closed the connection")
            # An idle keep-alive connection the server timed out: a real client's pool opens a
            # new one and sends again, and so does this one (counted, and printed by the bench).
            self.reconnects += 1
            self.selector.unregister(self.sock)
            self.sock.close()
            self.sock = self._connect()
            self.send()
            return None
        self.buffer += chunk
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            raise ConnectionError(f"response without content-length: {head[:200]!r}")
        stop = head.find(b"\r\n", at + 17)
        length = int(head[at + 17:stop if stop >= 0 else len(head)])
        if len(self.buffer) < end + 4 + length:
            return None
        return int(head[9:12]), bytes(self.buffer[end + 4:end + 4 + length])


def _check(load: Load, index: int, status: int, body: bytes) -> None:
    wanted = load.expected[index] if load.kind == "lookup" and load.expected else 200
    if status != wanted:
        raise RuntimeError(f"{load.kind} request {index}: {status} {body[:200]!r}")
    if load.kind == "batch" and b'"missing":[]' not in body:  # every key asked exists
        raise RuntimeError(f"batch lookup missed keys: {body[-200:]!r}")
    if load.kind == "ingest":
        answer = json.loads(body)
        if answer["accepted"] + answer["duplicates"] != load.expected[index]:
            raise RuntimeError(f"ingest request {index}: {body[:200]!r}")


def drive(port: int, load: Load) -> Outcome:
    """Send every request of ``load`` over ``load.clients`` connections; runs in the child."""
    numbered = list(enumerate(load.requests))
    selector = selectors.DefaultSelector()
    connections = [_Connection(port, numbered[i::load.clients], selector) for i in range(load.clients)]
    latencies: list[float] = []
    retried = 0
    waiting: list[_Connection] = []  # paused after a 503
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    busy = sum(conn.send() for conn in connections)
    while busy or waiting:
        timeout = max(0.0, min(c.resume_at for c in waiting) - time.perf_counter()) if waiting else None
        for key, mask in selector.select(timeout):
            conn = key.data
            if mask & selectors.EVENT_WRITE and conn.out:
                conn.flush()
            if not mask & selectors.EVENT_READ or (got := conn.answer()) is None:
                continue
            status, body = got
            index = conn.share[conn.next][0]
            if status == 503 and load.kind == "ingest":  # idempotent batch: resend it later
                retried += 1
                conn.resume_at = time.perf_counter() + RETRY_PAUSE
                waiting.append(conn)
                busy -= 1
                continue
            latencies.append(time.perf_counter() - conn.started)
            _check(load, index, status, body)
            conn.next += 1
            if not conn.send():  # its share is done: closed, so the server's idle timeout cannot reach it
                busy -= 1
                selector.unregister(conn.sock)
                conn.sock.close()
        now = time.perf_counter()
        for conn in [c for c in waiting if c.resume_at <= now]:
            waiting.remove(conn)
            busy += conn.send()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    for conn in connections:
        conn.sock.close()
    return Outcome(seconds, latencies, after.ru_utime - cpu.ru_utime + after.ru_stime - cpu.ru_stime, retried,
                   sum(conn.reconnects for conn in connections))


class Generator:
    """The load generator process, started once and reused for every timed loop of a run."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
        self.pid: int = self.pool.submit(os.getpid).result()

    def run(self, load: Load) -> Outcome:
        return self.pool.submit(drive, self.port, load).result()

    def close(self) -> None:
        self.pool.shutdown()

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
