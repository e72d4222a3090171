"""How many compiles fit in memory right now.

``neuronx-cc`` on a large graph takes tens of GB; starting as many as there are cores gets
the host OOM-killed, which loses every compile in flight. The gate admits another compile only
while the memory available (the kernel's MemAvailable, or the container's cgroup limit if
tighter) covers one more compile's peak: given with ``--compile-memory``, otherwise learned
from the largest compiler process seen so far (RUSAGE_CHILDREN's peak RSS). One compile may
always run, so a host that is short of memory is slow, never stuck.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

_MEMINFO = Path("/proc/meminfo")
_CGROUP = Path("/sys/fs/cgroup")
MB = 1024 * 1024


def available_bytes() -> int | None:
    """Memory this process may still use, or None where the platform does not say."""
    best: int | None = None
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                best = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        best = None
    try:
        limit = (_CGROUP / "memory.max").read_text().strip()
        current = int((_CGROUP / "memory.current").read_text().strip())
        if limit != "max":
            room = int(limit) - current
            best = room if best is None else min(best, room)
    except (OSError, ValueError):
        pass
    return best


def peak_child_bytes() -> int:
    """The largest peak RSS of any child waited for so far (kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class MemoryGate:
    def __init__(self, per_compile_mb: float | None = None, reserve_mb: float = 512) -> None:
        self.per_compile = int(per_compile_mb * MB) if per_compile_mb else None
        self.reserve = int(reserve_mb * MB)

    def estimate(self) -> int:
        return self.per_compile if self.per_compile is not None else peak_child_bytes()

    def room_for_another(self, running: int) -> bool:
        if running == 0:
            return True
        available = available_bytes()
        if available is None:
            return True
        return available - self.reserve >= self.estimate()
