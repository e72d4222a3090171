"""A per-compile timeout for compilers that a workload (not neffcache) starts.

In the one-phase mode the runtime inside the workload runs ``neuronx-cc`` itself, so neffcache
cannot wrap that call with a timeout. A compiler stuck in a pass would hold its workload (and
the whole warm-up) forever. The watchdog looks at the processes in the workloads' process
groups (Linux ``/proc``) and kills a compiler that has run longer than the limit, with its
helpers: the runtime then sees a failed compile, records it as such (``model.log``) and goes
on with its other graphs, exactly as after a compiler crash.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
PROC = Path("/proc")
# The real compiler is a console script (`python .../bin/neuronx-cc compile ...`); the simulated
# one runs as `python -m neffcache.testing.compiler compile ...` once its shim has exec'd.
COMPILER_CMDLINE = re.compile(r"(?:^|/)neuronx-?cc$|^neffcache\.testing\.compiler$")


@dataclass(frozen=True)
class KilledCompile:
    pid: int
    seconds: float
    input: str | None  # the HLO path from its command line, to name the graph in the report


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    pgrp: int
    age: float


def _clock() -> tuple[float, float]:
    uptime = float((PROC / "uptime").read_text().split()[0])
    return uptime, float(os.sysconf("SC_CLK_TCK"))


def _read_proc(pid: int, uptime: float, ticks: float) -> _Proc | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ")".
    fields = raw[raw.rfind(")") + 2:].split()
    try:
        return _Proc(pid, int(fields[1]), int(fields[2]), uptime - int(fields[19]) / ticks)
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def compiler_input(argv: list[str]) -> str | None:
    """The input path of a ``neuronx-cc compile`` command line, or None if it is not one."""
    for i, arg in enumerate(argv[:3]):
        if COMPILER_CMDLINE.search(arg) and "compile" in argv[i + 1:]:
            rest = argv[argv.index("compile", i + 1) + 1:]
            for j, tok in enumerate(rest):
                if tok.startswith("-"):
                    continue
                prev = rest[j - 1] if j else ""
                if prev in ("--output", "--framework", "--target", "--lnc", "--logfile", "--workdir"):
                    continue
                return tok
            return ""
    return None


def supported() -> bool:
    return (PROC / "uptime").exists()


class CompileWatchdog:
    """Kills compilers older than ``timeout`` seconds in the process groups ``groups()`` names."""

    def __init__(self, timeout: float, groups: Callable[[], set[int]],
                 on_kill: Callable[[KilledCompile], None] | None = None, poll: float | None = None) -> None:
        self.timeout = timeout
        self.groups = groups
        self.on_kill = on_kill
        self.poll = poll if poll is not None else max(0.1, min(1.0, timeout / 4))
        self.killed: list[KilledCompile] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> CompileWatchdog:
        if supported():
            self._thread = threading.Thread(target=self._loop, name="compile-watchdog", daemon=True)
            self._thread.start()
        else:
            log.warning("no /proc here: compiles started by workloads are not timed out")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.sweep()
            except OSError as exc:  # /proc raced with exiting processes: next round
                log.debug("watchdog sweep: %s", exc)

    def sweep(self) -> list[KilledCompile]:
        groups = self.groups()
        if not groups:
            return []
        uptime, ticks = _clock()
        procs = [p for pid in _pids() if (p := _read_proc(pid, uptime, ticks)) is not None]
        children: dict[int, list[int]] = {}
        for p in procs:
            children.setdefault(p.ppid, []).append(p.pid)
        killed = []
        for p in procs:
            if p.pgrp not in groups or p.age < self.timeout:
                continue
            hlo = compiler_input(_cmdline(p.pid))
            if hlo is None:
                continue
            for pid in [*_descendants(p.pid, children), p.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    continue
            record = KilledCompile(p.pid, p.age, hlo or None)
            log.warning("killed neuronx-cc pid %d after %.0fs (compile timeout %.0fs): %s",
                        p.pid, p.age, self.timeout, hlo or "?")
            killed.append(record)
            self.killed.append(record)
            if self.on_kill is not None:
                self.on_kill(record)
        return killed


def _pids() -> list[int]:
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def _descendants(pid: int, children: dict[int, list[int]]) -> list[int]:
    out: list[int] = []
    stack = list(children.get(pid, ()))
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(children.get(child, ()))
    return out
