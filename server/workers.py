"""`neffcache serve --workers N`: N uvicorn workers, each accepting on a listening socket of its own.

uvicorn's supervisor hands every worker the one listening socket. When connections arrive
together, the worker whose event loop wakes first accepts every one waiting (asyncio accepts in
a loop), and keep-alive clients then stay where they landed: eight clients ingesting events kept
one worker at 0.93 of a core and the other idle (docs/index-server.md#performance).

Here worker ``i`` owns socket ``i`` of :func:`listening_sockets`, all bound to one port with
``SO_REUSEPORT``, and the kernel spreads new connections over the sockets by a hash of their
addresses. Slot ``i`` keeps its socket for the supervisor's lifetime: a worker that dies is
replaced on the same socket, so the connections the kernel queued to it wait for the replacement
instead of being refused. The parent holds every socket open for that reason (the kernel only
ever queues to a socket that is listening, and a socket listens until its last holder closes it).

The supervision itself is uvicorn's: its ``Process`` (spawned, health-checked over a pipe), the
same signals (INT and TERM stop, HUP replaces each worker once its successor is ready), and a
worker that fails during startup stops the server instead of restarting forever.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from types import FrameType

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Process

log = logging.getLogger("uvicorn.error")


def listening_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A socket bound to ``host``:``port``, with TCP_NODELAY. uvicorn's own (``--workers``) is
    created without a protocol number, so asyncio does not set TCP_NODELAY on accepted
    connections and every response whose headers and body go out in two writes waits ~40 ms for
    a delayed ACK. Linux copies TCP_NODELAY from a listening socket to the connections it accepts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def listening_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` sockets on one port (``port`` 0: the one the first is given), one per worker.

    The first is bound once without ``SO_REUSEPORT`` before the group is formed: a server
    already listening there with ``SO_REUSEPORT`` (another neffcache, by the same user) would
    otherwise let the group join its own and the two would silently share connections, where
    the operator must hear that the port is taken (EADDRINUSE, as with one worker)."""
    if count == 1:
        return [listening_socket(host, port)]
    probe = listening_socket(host, port)
    port = probe.getsockname()[1]
    probe.close()
    sockets: list[socket.socket] = []
    try:
        sockets += [listening_socket(host, port, reuse_port=True) for _ in range(count)]
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Workers:
    """Run one uvicorn worker per socket until INT or TERM, keeping every slot filled."""

    CHECK_SECONDS = 0.5

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        self.config = config
        self.sockets = sockets
        self.processes: list[Process] = []
        self.should_exit = threading.Event()
        self._restart = threading.Event()
        self.failed = False

    def run(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._stop)
        signal.signal(signal.SIGHUP, lambda *_: self._restart.set())
        self.processes = [self._start(slot) for slot in range(len(self.sockets))]
        try:
            while not self.should_exit.wait(self.CHECK_SECONDS):
                if self._restart.is_set():
                    self._restart.clear()
                    self._replace_all()
                self._keep_alive()
        finally:
            for process in self.processes:
                process.terminate()
            for process in self.processes:
                process.join()

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        self.should_exit.set()

    def _start(self, slot: int) -> Process:
        process = Process(self.config, [self.sockets[slot]])
        process.start()
        return process

    def _keep_alive(self) -> None:
        for slot, process in enumerate(self.processes):
            if self.should_exit.is_set() or process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung, or already gone
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                # The app, the database or the socket is broken: every restart would fail the same way.
                log.error("worker [%s] failed to start; stopping the server", process.pid)
                self.failed = True
                self.should_exit.set()
                return
            log.info("worker [%s] died; starting another on its socket", process.pid)
            self.processes[slot] = self._start(slot)

    def _replace_all(self) -> None:
        """SIGHUP: each worker replaced once its successor (on the same socket) is ready."""
        for slot, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self._start(slot)
            if not new.wait_until_ready(self.config.timeout_worker_healthcheck, self.should_exit):
                new.kill()
                new.join()
                log.error("worker [%s] was not ready in time; keeping [%s]", new.pid, old.pid)
                return
            old.terminate()
            old.join()
            self.processes[slot] = new
