"""The runtime's own "someone compiles this graph" file, held by neffcache while it compiles.

libneuronxla creates ``<entry>/model.hlo_module.pb.lock`` before compiling a graph and removes
it after; a process that finds it waits (the lock is existence-based: no owner inside, no
flock). When neffcache compiles into a root a runtime also uses, it creates the same file the
same way (``O_CREAT|O_EXCL``), so a runtime that arrives meanwhile waits for our NEFF instead
of compiling the graph a second time, and a runtime already compiling it makes us wait.

While held, the file also carries an advisory ``flock``: prune's stale-lock rule asks
``/proc/locks`` whether a live process holds a lock on it, so it never removes ours. Released
on every way out of the ``with`` block (success, failure, timeout, exception, and the orderly
Ctrl-C/SIGTERM shutdown of :mod:`.children`); only kill -9 leaves it behind, exactly like the
runtime's own, and prune's stale-lock rule then removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from types import TracebackType


class RuntimeLock:
    """A held runtime lock file; :meth:`release` (or leaving the ``with``) removes it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path) -> RuntimeLock | None:
        """Create ``path`` exclusively; None when it exists (a runtime compiles the graph)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return None
        with contextlib.suppress(OSError):  # a filesystem without flock: the file alone still works
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return cls(path, fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        # Unlink first: the flock dies with the descriptor, and until then prune sees us live.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(fd)

    def __enter__(self) -> RuntimeLock:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def lock_age(path: Path) -> float | None:
    """Seconds since ``path`` was created (its mtime: nobody refreshes it), None if absent."""
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except FileNotFoundError:
        return None
