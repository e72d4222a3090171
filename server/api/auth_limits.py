"""Failed token checks, limited per client address: guessing tokens costs a guesser time.

Each address has a bucket of ``per_minute`` failures that refills continuously at
``per_minute`` a minute. A failed check (an unknown, malformed or revoked token) takes one;
while the bucket holds less than one, the address's new tokens are refused with 429 and a
``Retry-After`` saying when the next check will be made, before any database work.

What it cannot lock out: tokens verified recently (the token cache) are accepted from any
address without a check, so one misconfigured client behind a NAT stops only clients whose
token is new to this worker, and only for seconds. Why memory stays bounded: at most
``max_addresses`` buckets are kept; past that, full buckets (addresses that have not failed
lately, which the limit no longer needs to remember) are dropped, and if the flood is of
distinct addresses every one of which is failing, all are forgotten — a guesser gets a fresh
bucket, which a limit per address cannot prevent anyway. The limit is per worker process:
``--workers N`` and replicas multiply it (docs/index-server.md#limits).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from fastapi import HTTPException, status


@dataclass
class FailedTokens:
    per_minute: int
    max_addresses: int = 65536
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # address -> (allowance, when)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def _rate(self) -> float:
        return self.per_minute / 60.0

    def _allowance(self, address: str, now: float) -> float:
        allowance, when = self._buckets.get(address, (float(self.per_minute), now))
        return min(float(self.per_minute), allowance + (now - when) * self._rate)

    def check(self, address: str | None) -> None:
        """Raise 429 when ``address`` has used up its failures."""
        key = address or "-"
        now = time.monotonic()
        with self._lock:
            if key not in self._buckets:
                return
            allowance = self._allowance(key, now)
        if allowance < 1.0:
            wait = math.ceil((1.0 - allowance) / self._rate)
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                f"too many failed token checks from this address; retry in {wait} s",
                                headers={"Retry-After": str(wait)})

    def failed(self, address: str | None) -> None:
        key = address or "-"
        now = time.monotonic()
        with self._lock:
            allowance = self._allowance(key, now)
            if key not in self._buckets and len(self._buckets) >= self.max_addresses:
                self._forget_full(now)
            self._buckets[key] = (allowance - 1.0, now)

    def _forget_full(self, now: float) -> None:
        self._buckets = {k: v for k, v in self._buckets.items() if self._allowance(k, now) < self.per_minute}
        if len(self._buckets) >= self.max_addresses:
            self._buckets.clear()
