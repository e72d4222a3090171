"""A small HTTP proxy in front of an S3 endpoint (moto) that misbehaves on purpose, or is far away.

    python -m neffcache.testing.faultproxy --upstream http://127.0.0.1:5000 --latency-ms 20

Each request gets a fate, by chance (``rates``) or by a rule of the test's own:

- ``ok``: forwarded to moto, reply relayed;
- ``slowdown``: answered ``503 SlowDown`` the way S3 throttles, moto never sees it;
- ``drop``: the connection is closed before the request is forwarded (no reply);
- ``lost_reply``: forwarded to moto (it happens!), then the connection is closed before the
  reply: the nasty case for exclusive writes, whose retry then meets its own object;
- ``cut``: forwarded, and only the first half of the reply body is sent before closing;
- ``deny``: answered ``403 AccessDenied``.

**Latency** (``latency_ms``, for the benchmarks): every request is held that long before it
is forwarded and its reply that long again before it is sent, so each request costs one
round trip of ``2 * latency_ms`` (20 ms each way is about what in-region S3 costs a client
on EC2, 60 ms a cross-region bucket). A new client connection first pays one more round trip,
its TCP handshake, so a client that reuses connections gains what it would gain on a real
network. Bandwidth is not limited (loopback), and every client behind the proxy sees the
same delays: it is a fair field for comparing them, not a model of TCP's slow start.

Connections to the clients are kept alive (moto answers every request with ``Connection:
close``; that header is not relayed); the proxy opens its own connection upstream per
request when moto closes it.

Part of the simulated environment beside the library (``neffcache.testing``): the tests and
``bench/`` use it; nothing in the library imports it. It imports nothing from neffcache.
"""

from __future__ import annotations

import argparse
import http.client
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

Rule = Callable[[str, str, dict[str, str]], str | None]  # (method, path, headers) -> fate or None
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade", "content-length"}
_XML = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{msg}</Message></Error>'


class FaultProxy:
    def __init__(self, upstream: str, *, rates: dict[str, float] | None = None, rule: Rule | None = None,
                 seed: int = 1, latency_ms: float = 0.0, port: int = 0) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rates = dict(rates or {})
        self.rule = rule
        self.random = random.Random(seed)
        self.latency = max(0.0, latency_ms) / 1000
        self.lock = threading.Lock()
        self.fates: Counter[str] = Counter()
        self.connections = 0  # client connections accepted (each paid a handshake's round trip)
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.request_queue_size = 1024  # s5cmd opens hundreds of connections at once
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def requests(self) -> int:
        """Requests seen so far, whatever their fate."""
        with self.lock:
            return sum(self.fates.values())

    def delay(self, round_trips: float = 0.5) -> None:
        """Hold the calling handler for ``round_trips`` of the simulated network."""
        if self.latency:
            time.sleep(2 * self.latency * round_trips)

    def fate(self, method: str, path: str, headers: dict[str, str]) -> str:
        chosen = self.rule(method, path, headers) if self.rule is not None else None
        if chosen is None:
            with self.lock:
                roll = self.random.random()
            chosen = "ok"
            for name, rate in self.rates.items():
                if roll < rate:
                    chosen = name
                    break
                roll -= rate
        with self.lock:
            self.fates[chosen] += 1
        return chosen

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        return type("Handler", (_Handler,), {"proxy": self})


class _Handler(BaseHTTPRequestHandler):
    """One client connection; ``proxy`` is set on the subclass each FaultProxy makes."""

    protocol_version = "HTTP/1.1"
    proxy: FaultProxy
    upstream: http.client.HTTPConnection | None = None

    def setup(self) -> None:
        super().setup()
        with self.proxy.lock:
            self.proxy.connections += 1
        self.proxy.delay(1.0)  # the TCP handshake: SYN, SYN-ACK, then the request can leave

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self.upstream is not None:
                self.upstream.close()

    def log_message(self, format: str, *args: object) -> None:
        return

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes, *, length: int) -> None:
        self.send_response_only(status)
        for name, value in headers:
            if name.lower() not in _HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if body:
            self.wfile.write(body)
        self.wfile.flush()

    def _error(self, status: int, code: str, message: str) -> None:
        body = _XML.format(code=code, msg=message).encode()
        self._reply(status, [("Content-Type", "application/xml")],
                    b"" if self.command == "HEAD" else body, length=len(body))

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        for attempt in range(2):
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(*self.proxy.upstream, timeout=60)
            conn = self.upstream
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                return reply.status, list(reply.getheaders()), data
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self.upstream = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _proxy(self) -> None:
        body = self._body()
        self.proxy.delay()  # the request's way there
        fate = self.proxy.fate(self.command, self.path, dict(self.headers.items()))
        if fate == "drop":
            self.close_connection = True
            return
        if fate == "slowdown":
            self._error(503, "SlowDown", "Please reduce your request rate.")
            return
        if fate == "deny":
            self._error(403, "AccessDenied", "Access Denied")
            return
        status, headers, data = self._forward(body)
        if fate == "lost_reply":
            self.close_connection = True
            return
        self.proxy.delay()  # the reply's way back
        length = next((int(v) for k, v in headers if k.lower() == "content-length"), len(data))
        if self.command == "HEAD":
            self._reply(status, headers, b"", length=length)
        elif fate == "cut" and len(data) > 1:
            self._reply(status, headers, data[: len(data) // 2], length=len(data))
            self.close_connection = True
        else:
            self._reply(status, headers, data, length=len(data))

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _proxy  # noqa: N815 - http.server names


def main(argv: list[str] | None = None) -> int:
    """Run a proxy until interrupted; its URL is the first line on stdout."""
    parser = argparse.ArgumentParser(prog="python -m neffcache.testing.faultproxy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="The S3 endpoint to forward to (http://host:port).")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="Delay each way per request (ms).")
    parser.add_argument("--port", type=int, default=0, help="Port to listen on (default: any free one).")
    args = parser.parse_args(argv)
    proxy = FaultProxy(args.upstream, latency_ms=args.latency_ms, port=args.port)
    print(proxy.url, flush=True)
    try:
        proxy.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.server.server_close()
        print(f"{proxy.requests} requests, {proxy.connections} connections", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
