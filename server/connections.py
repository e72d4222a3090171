"""Connections a worker accepts: read deadlines and a cap, so idle or unfinished ones cannot exhaust it.

uvicorn closes a keep-alive connection that stays quiet after a response, but not one that
never finishes a request: a client that connects and sends nothing, or half its headers, or a
body shorter than its Content-Length, holds a socket and a file descriptor for ever. One client
holding ~20k of them took ``/healthz`` down (issue 41, N14): the worker ran out of descriptors,
``accept`` failed, and every new connection waited in the backlog.

:class:`GuardedProtocol` is uvicorn's httptools protocol with two additions, set by
:class:`Limits` (``neffcache serve --header-timeout --body-timeout --max-connections``):

- **Deadlines.** A connection must deliver a request's headers within ``header_timeout``
  seconds of connecting or of the request's first byte, and its body within ``body_timeout``
  seconds of the headers; otherwise it gets ``408`` and is closed. Between requests uvicorn's
  keep-alive timeout applies, so no phase of a connection's life waits without a bound.
- **A cap.** A worker holds at most ``max_connections``, clamped below its descriptor limit
  (:func:`connection_cap`), so ``accept`` never fails for want of descriptors. At the cap a new
  connection makes room by closing the one that has waited longest without a request in
  flight; only when every connection has a request in flight is the newcomer refused (``503``).

Why a flood cannot lock out a real client: every socket the flood holds is waiting (it has no
request in flight, or it would be a real client), so a new connection always finds one to
evict, and every one of them is closed by a deadline anyway. Requests in flight are never cut.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

log = logging.getLogger("uvicorn.error")

# Descriptors a worker keeps for everything that is not a client connection: its listening
# socket, database connections and files, logs, the supervisor's pipe.
RESERVED_DESCRIPTORS = 128
MIN_CONNECTIONS = 16
# Refused connections left open for a second so that their 503 arrives (GuardedProtocol._refuse).
REFUSALS_LINGERING = 64


@dataclass(frozen=True)
class Limits:
    """How long a connection may take to send a request, and how many a worker holds."""

    header_timeout: float = 10.0
    body_timeout: float = 60.0
    max_connections: int = 1024


@functools.cache  # a process's descriptor limit is fixed before it serves: one getrlimit, not one a connection
def connection_cap(wanted: int) -> int:
    """``wanted``, lowered so that this many connections leave :data:`RESERVED_DESCRIPTORS` of
    the process's soft descriptor limit free: past it ``accept`` fails, and then no connection
    can be answered, evicted or refused."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(MIN_CONNECTIONS, min(wanted, soft - RESERVED_DESCRIPTORS))


class GuardedConfig(Config):
    """uvicorn's Config carrying :class:`Limits` to every worker (it is pickled into spawned
    workers, so the limits travel with it) and selecting :class:`GuardedProtocol`."""

    def __init__(self, app: str, *, limits: Limits, **kwargs: Any) -> None:
        super().__init__(app, http=GuardedProtocol, **kwargs)
        self.limits = limits


def _response(status: bytes, message: str) -> bytes:
    body = ('{"detail":"' + message + '"}').encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)


TIMED_OUT_HEADERS = _response(b"408 Request Timeout", "request headers not received in time")
TIMED_OUT_BODY = _response(b"408 Request Timeout", "request body not received in time")
FULL = _response(b"503 Service Unavailable", "too many connections with requests in flight; retry shortly")


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's protocol with read deadlines and a connection cap (see the module docstring)."""

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = getattr(config, "limits", None)
        self.limits = limits if isinstance(limits, Limits) else Limits()
        self.cap = connection_cap(self.limits.max_connections)
        self.deadline: asyncio.TimerHandle | None = None
        self.refused = False  # answered 503 at the cap: what it sends is dropped until it closes
        # When the connection began waiting for a request; None while one is in flight (or
        # once it is evicted), which is what makes it safe from eviction.
        self.waiting_since: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        full = len(self.connections) >= self.cap and not self._make_room()
        super().connection_made(transport)
        if full:
            self._refuse(transport)
            return
        self.waiting_since = self.loop.time()
        self._arm(self.limits.header_timeout, TIMED_OUT_HEADERS)

    def _refuse(self, transport: asyncio.Transport) -> None:
        """Answer 503 and close. Closing a socket whose request is still unread makes the
        kernel reset it, and a reset can destroy the 503 before the client reads it: so the
        answer is followed by a FIN, the request is read and dropped, and the socket closed a
        second later. At most :data:`REFUSALS_LINGERING` do so at once (they count against
        the descriptors the cap leaves free); past that a refusal is closed at once."""
        log.warning("connection cap (%d) reached with every connection busy: refusing one", self.cap)
        transport.write(FULL)
        if len(self.connections) > self.cap + REFUSALS_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        self.refused = True
        transport.write_eof()
        self.deadline = self.loop.call_later(1.0, transport.close)

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            super().data_received(data)

    def _make_room(self) -> bool:
        """Close the connection that has waited longest without a request in flight."""
        waiting = [(c.waiting_since, c) for c in self.connections
                   if isinstance(c, GuardedProtocol) and c.waiting_since is not None]
        if not waiting:
            return False
        victim = min(waiting, key=lambda pair: pair[0])[1]
        victim.waiting_since = None
        # Out of the count now, not when its close completes: the next newcomer of this same
        # loop iteration must pick another one.
        self.connections.discard(victim)
        victim.transport.close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.waiting_since = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.deadline is None:  # the first byte of a request on a kept-alive connection
            self._arm(self.limits.header_timeout, TIMED_OUT_HEADERS)

    def on_headers_complete(self) -> None:
        self.waiting_since = None
        super().on_headers_complete()
        self._arm(self.limits.body_timeout, TIMED_OUT_BODY)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self.waiting_since = self.loop.time()  # nothing in flight (a pipelined request would be)

    def _arm(self, seconds: float, answer: bytes) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(seconds, self._timed_out, answer)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _timed_out(self, answer: bytes) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        # A 408 only where no response has begun; an app still reading the body sees a disconnect.
        if answer is TIMED_OUT_HEADERS or not (self.cycle is None or self.cycle.response_started):
            self.transport.write(answer)
        self.transport.close()
