"""`neffcache serve --workers 2` (server/workers.py): connections opened together spread over
both workers (each accepts on its own SO_REUSEPORT socket), a killed worker is replaced on its
socket and the connections queued to it are answered, and a port another such server holds is
refused with the one-line error instead of silently shared."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import free_port

pytestmark = pytest.mark.slow


def _serve(tmp_path: Path, port: int, name: str = "a") -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "neffcache.cli.main", "serve", "--port", str(port), "--workers", "2",
         "--anonymous-read", "--log-level", "warning", "--data-dir", str(tmp_path / name)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _workers(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if "uvicorn" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")
            or "multiprocessing.spawn" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]


def _answer(port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    response.read()
    assert response.status == 200
    return conn


def _sockets_by_process(port: int, pids: list[int], state: str) -> dict[int, set[str]]:
    """The sockets on local ``port`` in TCP ``state`` ("01" established, "0A" listening) that
    each process holds, by inode (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                inodes.add(fields[9])
    held: dict[int, set[str]] = {}
    for pid in pids:
        held[pid] = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                held[pid].add(target[8:-1])
    return held


def _established_by_process(port: int, pids: list[int]) -> dict[int, int]:
    return {pid: len(inodes) for pid, inodes in _sockets_by_process(port, pids, "01").items()}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    proc = _serve(tmp_path, port)
    try:
        deadline = time.monotonic() + 180  # workers import the app slowly on a loaded machine
        while True:
            try:
                _answer(port).close()
                if len(_workers(proc.pid)) >= 2:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
            time.sleep(0.2)
        # Both workers answering (each on its own socket) before the test starts.
        deadline = time.monotonic() + 180
        while True:
            conns = [_answer(port) for _ in range(16)]
            busy = _established_by_process(port, _workers(proc.pid))
            for conn in conns:
                conn.close()
            if sum(1 for n in busy.values() if n) >= 2:
                break
            assert time.monotonic() < deadline, f"only one worker accepted: {busy}"
            time.sleep(0.5)
        yield proc, port
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_each_worker_accepts_on_a_socket_of_its_own(server: tuple[subprocess.Popen[bytes], int]) -> None:
    """What spreads connections that arrive together: with one socket shared, the worker whose
    loop woke first accepted every one waiting and kept them (keep-alive)."""
    proc, port = server
    listening = _sockets_by_process(port, _workers(proc.pid), "0A")
    assert len(listening) == 2 and all(len(inodes) == 1 for inodes in listening.values()), listening
    first, second = listening.values()
    assert first != second  # two sockets, one each: the kernel picks one by the connection's hash
    supervisor = _sockets_by_process(port, [proc.pid], "0A")[proc.pid]
    assert supervisor == first | second  # kept open for the replacement of a worker that dies


def test_connections_opened_together_land_on_both_workers(server: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, port = server
    # 32 at once: with one socket shared, the first worker to wake took every one waiting; over
    # two sockets, the chance that a hash sends all 32 to one is 2 in 2**32.
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(32)]
    for conn in conns:
        conn.connect()
    for conn in conns:
        conn.request("GET", "/healthz")
    for conn in conns:
        assert conn.getresponse().read()
    held = _established_by_process(port, _workers(proc.pid))
    try:
        assert sum(1 for n in held.values() if n) == 2, held
        assert sum(held.values()) == 32, held
    finally:
        for conn in conns:
            conn.close()


def test_a_killed_worker_is_replaced_on_its_socket(server: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, port = server
    victim = _workers(proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    # Connections the kernel hashes to the dead worker's socket wait there for its successor.
    answered = [_answer(port) for _ in range(24)]
    for conn in answered:
        conn.close()
    workers = _workers(proc.pid)
    assert victim not in workers and len(workers) == 2
    assert proc.poll() is None


def test_a_port_another_server_holds_is_refused(server: tuple[subprocess.Popen[bytes], int],
                                                tmp_path: Path) -> None:
    _, port = server
    second = _serve(tmp_path, port, name="b")
    output, _ = second.communicate(timeout=120)
    assert second.returncode != 0
    assert b"cannot listen" in output and b"choose another --port" in output


def test_sighup_replaces_each_worker_and_the_port_keeps_answering(
        server: tuple[subprocess.Popen[bytes], int]) -> None:
    proc, port = server
    before = set(_workers(proc.pid))
    os.kill(proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 180
    while True:
        _answer(port).close()  # answered throughout: a worker goes only once its successor is ready
        now = set(_workers(proc.pid))
        if len(now) == 2 and not now & before:
            break
        assert time.monotonic() < deadline, f"workers {before} were not all replaced: {now}"
        time.sleep(0.2)
    listening = _sockets_by_process(port, sorted(now), "0A")
    assert len({frozenset(inodes) for inodes in listening.values()}) == 2  # still a socket each
    assert proc.poll() is None
