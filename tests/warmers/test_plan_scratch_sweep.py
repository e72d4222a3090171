"""A plan killed by SIGKILL cannot remove its scratch directory; the next plan sweeps it, and
only it (the directories of live plans, other hosts and other shapes stay)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from neffcache.warmers.discovery import OWNER_FILE, SCRATCH_PREFIX, sweep_dead_scratch


def _scratch(tmp: Path, name: str, owner: str | None) -> Path:
    path = tmp / (SCRATCH_PREFIX + name)
    (path / "b000" / "cache").mkdir(parents=True)
    if owner is not None:
        (path / OWNER_FILE).write_text(owner + "\n")
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_the_scratch_of_a_dead_plan_on_this_host_is_swept(tmp_path: Path) -> None:
    host = socket.gethostname()
    dead = _scratch(tmp_path, "dead", f"{host}:{_dead_pid()}")
    live = _scratch(tmp_path, "live", f"{host}:{os.getpid()}")
    elsewhere = _scratch(tmp_path, "elsewhere", f"other-host.example:{_dead_pid()}")
    anonymous = _scratch(tmp_path, "anonymous", None)
    garbled = _scratch(tmp_path, "garbled", "not a pid")
    target = tmp_path / "precious"
    target.mkdir()
    (target / OWNER_FILE).write_text(f"{host}:{_dead_pid()}\n")
    link = tmp_path / (SCRATCH_PREFIX + "link")
    link.symlink_to(target)

    assert sweep_dead_scratch(tmp_path) == [dead]
    assert not dead.exists()
    assert all(p.exists() for p in (live, elsewhere, anonymous, garbled, target, link))
