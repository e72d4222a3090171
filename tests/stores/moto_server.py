"""moto's S3 over real HTTP on 127.0.0.1, the way s3fs tests against it.

One gap of moto is closed here: moto checks ``If-None-Match: *`` and then stores the object
in two steps, without a lock, so two concurrent conditional writes can both succeed (seen
with a short thread switch interval). Real S3 decides conditional writes atomically, and the
store contract tests exactly that, so the server below serializes conditional writes with one
lock around moto's WSGI app. Nothing else about moto is changed, and boto3 is never patched.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

Environ = dict[str, Any]


class ConditionalWriteLock:
    """WSGI middleware: one conditional write (If-None-Match / If-Match) at a time."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: Callable[..., Any]) -> Iterable[bytes]:
        conditional = environ.get("REQUEST_METHOD") in ("PUT", "POST") and (
            "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ)
        if not conditional:
            return self.app(environ, start_response)
        with self.lock:
            return list(self.app(environ, start_response))


class S3TestServer(ThreadedMotoServer):
    def _server_entry(self) -> None:
        app = ConditionalWriteLock(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()

    @property
    def url(self) -> str:
        host, port = self.get_host_and_port()
        return f"http://{host}:{port}"

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server() -> S3TestServer:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = S3TestServer("127.0.0.1", free_port(), verbose=False)
    server.start()
    return server
