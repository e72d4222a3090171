"""One process-wide budget of transfer bytes held in memory.

Big files move in parts (S3 multipart uploads, ranged downloads) and each part is held in a
buffer while it is hashed and sent or written. Bounding the number of *workers* does not bound
memory: ``--parallel 64`` entries times 8 MiB parts is half a gigabyte. So every part buffer
(and every whole small object read for a single PUT) first takes its size from this budget and
gives it back when the buffer is dropped; peak RSS is then the interpreter, the clients and
this budget, whatever the file sizes or ``--parallel``.

Deadlock freedom: a buffer is only ever waited for by the thread that reads or hashes parts in
order; part workers never take from the budget, and every buffer taken is released by a worker
that does not wait on anything but the network. A request larger than the whole budget takes
the whole budget (one part at a time still makes progress).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

DEFAULT_BUDGET = 64 << 20


class ByteBudget:
    def __init__(self, capacity: int = DEFAULT_BUDGET) -> None:
        self.capacity = capacity
        self._free = capacity
        self._cond = threading.Condition()
        self.peak = 0  # the most ever taken at once (tests and benchmarks read it)

    def _clamp(self, n: int) -> int:
        return max(0, min(n, self.capacity))

    def acquire(self, n: int) -> int:
        """Take ``n`` bytes (at most the whole budget), waiting until they are free; returns
        what was taken, the amount to :meth:`release`."""
        n = self._clamp(n)
        with self._cond:
            while self._free < n:
                self._cond.wait()
            self._take(n)
        return n

    def try_acquire(self, n: int) -> int | None:
        """Take ``n`` bytes if they are free now; None otherwise."""
        n = self._clamp(n)
        with self._cond:
            if self._free < n:
                return None
            self._take(n)
        return n

    def _take(self, n: int) -> None:
        self._free -= n
        self.peak = max(self.peak, self.capacity - self._free)

    def release(self, n: int) -> None:
        with self._cond:
            self._free += n
            self._cond.notify_all()

    @contextlib.contextmanager
    def hold(self, n: int) -> Iterator[int]:
        taken = self.acquire(n)
        try:
            yield taken
        finally:
            self.release(taken)

    @property
    def in_use(self) -> int:
        with self._cond:
            return self.capacity - self._free


TRANSFER_BUDGET = ByteBudget()
