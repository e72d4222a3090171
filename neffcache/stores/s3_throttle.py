"""Adapting to S3 throttling: fewer requests in flight after a SlowDown, more after successes.

Why not botocore's ``adaptive`` retry mode: its client-side *rate* limiter cuts the send rate
by 30% on every throttled attempt and regrows it on a cubic curve over seconds. Against a
service that throttles a steady fraction of requests whatever the rate (S3 while a prefix is
being repartitioned; our fault-injection proxy) it never regrows and settles near its floor of
half a request per second: a push of 60 small entries took 85 s instead of 6 s in our test.

So the store uses botocore's ``standard`` mode (exponential backoff with jitter, 1 s base for
throttling) and this gate, which applies TCP's AIMD to the number of S3 calls in flight: a
throttle halves the window's headroom (x0.7, at most once per ``cut_interval`` so one burst
counts once), every successful call adds 1/window. It stays well above its floor under a
steady drizzle of SlowDowns and returns to full concurrency within a few hundred calls.
``retry_mode="adaptive"`` on the store still selects botocore's limiter for those who want it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

THROTTLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                            "TooManyRequestsException", "ServiceUnavailable", "503"})


class ThrottleGate:
    """Per attempt, not per call: a throttled call must not hold its slot while botocore sleeps."""

    def __init__(self, ceiling: int, *, floor: int = 2, cut_interval: float = 0.2) -> None:
        self.ceiling = max(1, ceiling)
        self.floor = max(1, min(floor, self.ceiling))
        self.window = float(self.ceiling)
        self.cut_interval = cut_interval
        self.inflight = 0
        self.throttles = 0
        self._last_cut = 0.0
        self._cond = threading.Condition()
        self._held = threading.local()

    def register(self, events: Any) -> None:
        """Hook into a botocore client's events (every HTTP attempt passes both)."""
        events.register("before-send.s3", self.before_send)
        events.register("needs-retry.s3", self.after_attempt)

    def before_send(self, **_: Any) -> None:
        with self._cond:
            while self.inflight >= max(self.floor, int(self.window)):
                self._cond.wait()
            self.inflight += 1
        self._held.slot = True

    def release(self) -> None:
        """Give the attempt's slot back (idempotent per thread)."""
        if getattr(self._held, "slot", False):
            self._held.slot = False
            with self._cond:
                self.inflight -= 1
                self._cond.notify()

    def after_attempt(self, response: Any = None, **_: Any) -> None:
        """botocore ``needs-retry`` hook: sees every attempt, decides nothing (returns None)."""
        self.release()
        if not response:
            return
        http, parsed = response
        status = getattr(http, "status_code", 200)
        code = str((parsed or {}).get("Error", {}).get("Code") or "")
        with self._cond:
            if code in THROTTLE_CODES or status == 503:
                self.throttles += 1
                now = time.monotonic()
                if now - self._last_cut >= self.cut_interval:
                    self._last_cut = now
                    self.window = max(float(self.floor), self.window * 0.7)
            elif status < 400 and self.window < self.ceiling:
                self.window = min(float(self.ceiling), self.window + 1.0 / self.window)
                self._cond.notify()
