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

A SIGHUP replaces the workers one at a time, each only once its successor on the same socket
is ready, so the port answers throughout. The successor is waited for as long as it is alive
(up to :data:`SUCCESSOR_STARTUP_SECONDS`), not the few seconds of a health check: on a loaded
machine importing the app takes tens of seconds, and uvicorn's own wait gave up, killed the
successor and kept the old worker (issue 38). The wait is a step of the supervision loop, not
a blocking call, so the other slots stay supervised while one successor starts.
"""

from __future__ import annotations

import logging
import pickle
import signal
import socket
import threading
import time
from dataclasses import dataclass
from types import FrameType

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Process

log = logging.getLogger("uvicorn.error")

# How long a SIGHUP's successor may take to start before it is given up (the old worker stays).
SUCCESSOR_STARTUP_SECONDS = 600.0


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


def _answers_started(process: Process, timeout: float) -> bool:
    """Whether ``process`` answers its health check as started. uvicorn's ``is_ready`` sends
    a ping and reads one reply, but the pings sent while the worker was still importing are
    all answered at once when it can (mostly "not started yet"), and reading one a check would
    leave the answer a check receives as old as that backlog: the newest reply waiting counts."""
    started = process.is_ready(timeout=timeout)
    try:
        while process.parent_conn.poll(0):
            started = process.parent_conn.recv() is True
    except (OSError, EOFError, pickle.UnpicklingError):
        return False
    return started


@dataclass
class _Successor:
    slot: int
    process: Process
    started: float


class Workers:
    """Run one uvicorn worker per socket until INT or TERM, keeping every slot filled."""

    CHECK_SECONDS = 0.5

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        self.config = config
        self.sockets = sockets
        self.processes: list[Process] = []
        self.should_exit = threading.Event()
        self._restart = threading.Event()
        self._to_replace: list[int] = []  # slots a SIGHUP still has to replace, in order
        self._successor: _Successor | None = None
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
                    self._to_replace = [slot for slot in range(len(self.sockets))
                                        if self._successor is None or slot != self._successor.slot]
                self._replace_next()
                self._keep_alive()
        finally:
            running = self.processes + ([self._successor.process] if self._successor else [])
            for process in running:
                process.terminate()
            for process in running:
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

    def _replace_next(self) -> None:
        """One step of a SIGHUP: start the next slot's successor, or, once the pending one is
        ready, stop the worker it replaces. Order: the old worker is stopped only after its
        successor answers as started, so each socket always has a worker accepting on it."""
        if self._successor is None:
            if self._to_replace:
                slot = self._to_replace.pop(0)
                self._successor = _Successor(slot, self._start(slot), time.monotonic())
            return
        pending = self._successor
        new, old = pending.process, self.processes[pending.slot]
        if _answers_started(new, self.CHECK_SECONDS):
            old.terminate()
            old.join()
            self.processes[pending.slot] = new
            self._successor = None
            log.info("worker [%s] replaced by [%s]", old.pid, new.pid)
            return
        gone = not new.process.is_alive()
        if not gone and time.monotonic() - pending.started < SUCCESSOR_STARTUP_SECONDS:
            return  # still starting: the old worker keeps serving meanwhile
        new.kill()
        new.join()
        why = f"exited with {new.exitcode} before it was ready" if gone else "was not ready in time"
        log.error("worker [%s] %s; keeping [%s] and the workers not yet replaced", new.pid, why, old.pid)
        self._successor = None
        self._to_replace = []
