"""Pieces both simulated runtimes (libneuronxla's neuronxcc, TorchNeuron's torchneuron) share:
the log format, running ``neuronx-cc`` as a child process, and waiting on another process's lock.

SIMULATION: this reproduces the runtimes' observable behaviour, not their code.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import overload


class GraphOutcome(StrEnum):
    """What became of one graph in a simulated run (the workload's summary line counts these)."""

    HIT = "hit"
    COMPILED = "compiled"
    FAILED = "failed"
    EXTRACTED = "extracted"  # NEURON_EXTRACT_GRAPHS_ONLY: the HLO stored, nothing compiled
    FETCHED = "fetched"  # vLLM: copied from the remote tier into the local one


_POLL = 0.05


class WorkloadLog:
    """Line-at-a-time output to stderr; safe from several compile threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def wrapper(self, level: str, message: str) -> None:
        """A libneuronxla NEURON_CC_WRAPPER line, with the timestamp and pid prefix it carries."""
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
        self.line(f"{stamp}:  {os.getpid()}  {level} ||NEURON_CC_WRAPPER||: {message}")


class WorkloadStopped(Exception):
    """The workload is being stopped: abandon the graph without recording a failure."""


class CompilerRunner:
    """Runs ``neuronx-cc`` children and can kill every one still running.

    Killing matters because a simulated hang never ends on its own: when the workload is
    stopped (SIGTERM, a simulated crash) its compilers must not outlive it.
    """

    def __init__(self) -> None:
        self._live: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self, cmd: Sequence[str]) -> tuple[int, str]:
        """Exit status and combined output of ``cmd``; status -1 if it could not start.

        Raises :class:`WorkloadStopped` once :meth:`kill_all` ran, so a compile we killed is
        not mistaken for a compile error (and never becomes a cached failure).
        """
        if self.stopping.is_set():
            raise WorkloadStopped
        try:
            proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            return -1, f"could not run {cmd[0]}: {exc}"
        with self._lock:
            self._live.add(proc)
        try:
            out, _ = proc.communicate()
        except BaseException:
            # Interrupted (SIGTERM/SIGINT unwinding): reap the child ourselves, since in a
            # container PID 1 may never collect the zombie it would otherwise become.
            proc.kill()
            proc.wait()
            raise
        finally:
            with self._lock:
                self._live.discard(proc)
        if self.stopping.is_set():
            raise WorkloadStopped
        return proc.returncode, out.decode(errors="replace")

    def kill_all(self) -> None:
        self.stopping.set()
        with self._lock:
            procs = list(self._live)
        for proc in procs:
            proc.kill()


def wait_for_unlock(
    lock: Path,
    *,
    timeout: float | None,
    report_every: float,
    report: Callable[[int], None],
    stopping: threading.Event,
    is_stale: Callable[[], bool] | None = None,
) -> bool:
    """Wait until ``lock`` disappears (True) or ``timeout`` passes (False).

    ``report(seconds_waited)`` runs every ``report_every`` seconds, like the runtime's
    "Another process must be compiling ..." line. With no timeout this waits forever, which is
    exactly the stale-lock trap operators hit with the real runtime after a killed compile.
    ``is_stale`` lets a caller that can tell a dead owner (a local pid) break the lock.
    Raises :class:`WorkloadStopped` when the workload is being stopped.
    """
    start = time.monotonic()
    next_report = report_every
    while lock.exists():
        if is_stale is not None and is_stale():
            lock.unlink(missing_ok=True)
            return True
        if stopping.is_set():
            raise WorkloadStopped
        waited = time.monotonic() - start
        if timeout is not None and waited >= timeout:
            return False
        if waited >= next_report:
            report(int(waited))
            next_report += report_every
        time.sleep(_POLL)
    return True


@overload
def env_float(name: str, default: float, *, error: type[Exception] = ..., what: str = ...) -> float: ...
@overload
def env_float(name: str, default: None, *, error: type[Exception] = ..., what: str = ...) -> float | None: ...
def env_float(name: str, default: float | None, *, error: type[Exception] = ValueError,
              what: str = "a number") -> float | None:
    """The number in environment variable ``name``; ``default`` when it is unset or blank.

    One parser for every ``NEFFSIM_*`` number, so the compiler and the workloads agree on what
    a malformed value is: an ``error`` naming the variable, never a silent default."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise error(f"{name}={raw!r} is not {what}") from None


def env_seconds(name: str, default: float | None) -> float | None:
    return env_float(name, default, what="a number of seconds")
