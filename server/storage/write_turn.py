"""Whose turn it is to write a SQLite index: a queue across threads and across worker processes.

SQLite lets one connection write at a time. A connection that finds the write lock taken does
not queue for it: its busy handler sleeps and polls, in steps that grow to 100 ms. With two
server workers ingesting events, the worker that lost the race slept through most of the other's
commit and the lock then sat idle until its next poll: two workers wrote no faster than one
(7,615 against 7,120 events/s, docs/index-server.md#performance).

:class:`WriteTurn` queues writers where waiting wakes at once instead:

- threads of one process on a ``threading.Lock`` (only one connection per process then contends
  for SQLite's lock, so none can starve past the busy timeout);
- processes on ``flock(LOCK_EX)`` of a file beside the database (``<database>-writer``). The
  kernel hands the lock to a waiter the moment its holder releases it, and releases it itself
  when the holder dies, so a killed worker never leaves the index locked.

The file lock is an optimisation, never a condition of correctness: SQLite's own lock still
guards every write (``BEGIN IMMEDIATE``), and a process that cannot open the file (a read-only
directory, a database in memory) writes exactly as before, through the busy handler. The turn is
always taken before SQLite's lock and released after the commit, and no holder of SQLite's lock
ever waits for a turn, so the two cannot deadlock.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from types import TracebackType

log = logging.getLogger(__name__)

WRITER_SUFFIX = "-writer"


class WriteTurn:
    """A context manager: entered, the caller is the only writer of ``database`` among the
    threads of this process and the processes that share the database file."""

    def __init__(self, database: str | None) -> None:
        self._thread_turn = threading.Lock()
        self._path = database + WRITER_SUFFIX if database and database != ":memory:" else None
        self._fd: int | None = None
        self._pid = -1  # the fd is this process's own: a forked child opens its own

    def __enter__(self) -> WriteTurn:
        self._thread_turn.acquire()
        try:
            fd = self._file()
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_turn.release()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self._fd is not None and self._pid == os.getpid():
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_turn.release()

    def close(self) -> None:
        with self._thread_turn:
            if self._fd is not None and self._pid == os.getpid():
                os.close(self._fd)
            self._fd = None

    def _file(self) -> int | None:
        """The lock file's descriptor, opened on first use in this process (under the thread
        turn, so once); None where there is none to be had."""
        if self._path is None:
            return None
        if self._pid != os.getpid():
            self._pid, self._fd = os.getpid(), None
            try:
                # O_NOFOLLOW: a symlink planted in the database's directory cannot make the
                # server create or truncate a file elsewhere (nothing is ever written to it).
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                level = logging.WARNING if exc.errno == errno.ELOOP else logging.DEBUG
                log.log(level, "SQLite writers queue on SQLite's busy handler only: cannot open %s (%s)",
                        self._path, exc.strerror)
        return self._fd
