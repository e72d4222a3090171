"""Child processes that can always be stopped: one process group each, signals turned into
an orderly shutdown.

A workload spawns compilers, a compiler spawns its own helpers; killing only the direct
child would leave the rest compiling (and holding the runtime's ``.lock`` files) after we
exit. So every child starts in its own process group and is stopped as a group: SIGTERM first
(the runtimes unwind and remove their locks), SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType
from typing import IO, Any

log = logging.getLogger(__name__)
DEFAULT_GRACE = 5.0


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: children were stopped; the caller unwinds and exits 128+signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_group(proc: subprocess.Popen[Any], grace: float = DEFAULT_GRACE) -> None:
    """SIGTERM the child's process group, SIGKILL it if still alive after ``grace`` seconds."""
    _signal_group(proc, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    # Even when the leader exited, members of its group may linger (a compiler that ignored TERM).
    _signal_group(proc, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


def stop_ready_server(proc: subprocess.Popen[Any], grace: float = DEFAULT_GRACE) -> None:
    """Stop a server that said it is up, the way its operator would: SIGINT (Ctrl-C, a
    graceful shutdown), SIGTERM after ``grace`` seconds, SIGKILL after as many again."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        _signal_group(proc, sig)
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    _signal_group(proc, signal.SIGKILL)  # a leader that ignored both, or stragglers of its group
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class Children:
    """The live child process groups of one command; thread-safe."""

    def __init__(self, grace: float = DEFAULT_GRACE) -> None:
        self.grace = grace
        self.stopping = threading.Event()
        self._live: set[subprocess.Popen[Any]] = set()
        self._lock = threading.Lock()

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
              stdin: int | IO[Any] | None = subprocess.DEVNULL, stdout: int | IO[Any] | None = None,
              stderr: int | IO[Any] | None = None, new_group: bool = True) -> subprocess.Popen[bytes]:
        if self.stopping.is_set():
            raise Interrupted(signal.SIGTERM)
        proc = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, cwd=cwd,
                                stdin=stdin, stdout=stdout, stderr=stderr,
                                process_group=0 if new_group else None)
        with self._lock:
            self._live.add(proc)
        return proc

    def forget(self, proc: subprocess.Popen[Any]) -> None:
        with self._lock:
            self._live.discard(proc)

    def wait(self, proc: subprocess.Popen[Any], timeout: float | None = None) -> int | None:
        """The exit status, or None when ``timeout`` passed (the group is then stopped)."""
        try:
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc, self.grace)
            self.forget(proc)
            return None
        # The leader is gone; stragglers of its group (a compiler it orphaned) go with it.
        _signal_group(proc, signal.SIGKILL)
        self.forget(proc)
        return status

    def stop_all(self) -> None:
        """Stop every child group now (in parallel: each may take the grace period)."""
        self.stopping.set()
        with self._lock:
            procs = list(self._live)
        threads = [threading.Thread(target=stop_group, args=(p, self.grace), daemon=True) for p in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


@contextlib.contextmanager
def stop_on_signals(children: Children, on_signal: Callable[[int], None] | None = None) -> Iterator[None]:
    """In the main thread: SIGINT/SIGTERM stop ``children`` and raise :class:`Interrupted`.

    Worker threads notice ``children.stopping`` and their children's exit, and return; the
    caller's ``finally`` blocks release leases, so the cache is left consistent.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread (e.g. under a test runner)
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if children.stopping.is_set():
            return  # a second Ctrl-C while stopping: the shutdown is under way already
        if on_signal is not None:
            on_signal(signum)
        children.stop_all()
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def wait_all(futures: Sequence[Any], poll: float = 0.2) -> None:
    """Wait for futures in short slices, so the main thread stays responsive to signals."""
    from concurrent.futures import FIRST_EXCEPTION
    from concurrent.futures import wait as futures_wait

    pending = set(futures)
    while pending:
        done, pending = futures_wait(pending, timeout=poll, return_when=FIRST_EXCEPTION)
        for fut in done:
            if fut.exception() is not None:
                raise fut.exception()  # type: ignore[misc]


def exit_status(status: int) -> int:
    """A shell-style exit code: 128+N for a child killed by signal N."""
    return 128 - status if status < 0 else status


def monotonic_deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout
