"""Leases: "I am working on X until T", kept as files any store can hold.

Shared mounts may fake ``flock`` (Lustre, GPFS, some NFS), so coordination never relies on it.
A lease is a small JSON file created exclusively (``put_file(exclusive=True)``: link(2) on a
filesystem, ``If-None-Match: *`` on S3) that names its owner and an expiry. The holder renews
it from a heartbeat thread; anyone may take over a lease past its expiry. Takeover is
arbitrated by exclusively creating a tombstone named after the stale lease's token, so of
several hosts that saw the same stale lease exactly one replaces it.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import logging
import math
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from neffcache.errors import EntryNotFound, LeaseHeld, UnsafePath
from neffcache.stores.base import CONTROL_DIR, Store

log = logging.getLogger(__name__)
LEASE_DIR = f"{CONTROL_DIR}/leases"
DEFAULT_TTL = 120.0
# Bounds on a lease file from outside. A lease holder renews every ttl/3, so no valid lease
# claims much more than its ttl ahead; a day is far above any ttl neffcache uses.
MAX_LEASE_BYTES = 64 << 10
MAX_LEASE_TEXT = 1024
MAX_PID = 2**31 - 1  # pid_t
MAX_LEASE_AHEAD = 86400.0
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # it names the takeover tombstone: a path part
# Clock skew between hosts we tolerate when trusting our own expiry time.
RELEASE_MARGIN = 5.0


def lease_path(name: str) -> str:
    # surrogateescape: an entry named with bytes that are not UTF-8 (listed as surrogates)
    # still has one lease name, the hash of its raw bytes, instead of an exception.
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{LEASE_DIR}/{digest[:2]}/{digest}.lease"


def default_owner() -> str:
    """``user@host pid 123``: what a busy-lease error shows, so a person knows whom to ask."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):  # no passwd entry (containers with an arbitrary uid)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


@dataclass(frozen=True)
class LeaseRecord:
    name: str
    owner: str
    token: str
    host: str
    pid: int
    acquired_at: float
    expires_at: float

    def expired(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) >= self.expires_at

    def holder_dead_here(self) -> bool:
        """True when the holder ran on this host and its process is gone."""
        if self.host != socket.gethostname() or not 0 < self.pid <= MAX_PID:
            return False  # the range check keeps os.kill from ever seeing a pid it cannot take
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> LeaseRecord | None:
        """The record, or None for a torn, foreign or invalid file (treated as expired)."""
        record = cls.parse(raw)
        return record if isinstance(record, LeaseRecord) else None

    @classmethod
    def parse(cls, raw: bytes, *, now: float | None = None) -> LeaseRecord | str:
        """The record, or why it is not a valid one.

        A lease file is written by whoever can write the store, so every field is checked: a
        pid os.kill cannot take (``2**70``) would be a traceback, an expiry of NaN or of the
        year 3000 would hold the entry forever. An invalid lease is treated as expired: taken
        over by :func:`try_acquire`, removed by ``prune --stale-locks``, its reason in the owner.
        """
        if len(raw) > MAX_LEASE_BYTES:
            return f"{len(raw)} bytes, above {MAX_LEASE_BYTES}"
        try:
            data = json.loads(raw, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            return "not JSON"
        if not isinstance(data, dict):
            return "not a JSON object"
        for field_name in ("name", "owner", "host"):
            value = data.get(field_name)
            if not isinstance(value, str) or len(value) > MAX_LEASE_TEXT:
                return f"{field_name!r} is not a string of at most {MAX_LEASE_TEXT} characters"
        token = data.get("token")
        if not isinstance(token, str) or not _TOKEN_RE.match(token):
            return "'token' is not a short word"
        pid = data.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= MAX_PID:
            return f"'pid' is not an integer in 1..{MAX_PID}"
        times = []
        for field_name in ("acquired_at", "expires_at"):
            value = data.get(field_name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or not 0 <= value <= 2**40:
                return f"{field_name!r} is not a finite time"
            times.append(float(value))
        acquired_at, expires_at = times
        if expires_at < acquired_at:
            return "it expires before it was acquired"
        if expires_at > (now if now is not None else time.time()) + MAX_LEASE_AHEAD:
            return f"it claims more than {MAX_LEASE_AHEAD:.0f} s ahead"
        return cls(data["name"], data["owner"], token, data["host"], pid, acquired_at, expires_at)

    @classmethod
    def invalid(cls, name: str, reason: str) -> LeaseRecord:
        """The stand-in for a lease file that does not hold a valid record: long expired."""
        return cls(name, f"(invalid lease: {reason})", "torn", "", 0, 0.0, 0.0)


class StoreLease:
    """One acquired lease. Use :func:`acquire` to get one."""

    def __init__(self, store: Store, record: LeaseRecord, ttl: float) -> None:
        self.store = store
        self.record = record
        self.ttl = ttl
        self.path = lease_path(record.name)
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def renew(self) -> bool:
        """Push the expiry out by ``ttl``; False when someone took the lease over."""
        current = read_lease(self.store, self.record.name)
        if current is None or current.token != self.record.token:
            self.lost = True
            log.warning("lease %s was taken over by %s", self.record.name, current.owner if current else "?")
            return False
        self.record = LeaseRecord(**{**self.record.__dict__, "expires_at": time.time() + self.ttl})
        self.store.put_file(self.path, self.record.to_bytes())
        return True

    def release(self) -> None:
        self.stop()
        if self.ours(time.time()):
            # Nobody may take over an unexpired lease, so it is still ours: no read-back needed
            # (on S3 that read is a request per publish), nor a count of what was deleted.
            self.store.discard([self.path])
            return
        self.release_checked()

    def stop(self) -> None:
        """End the heartbeat: the lease stays held until it is released or expires."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def ours(self, now: float) -> bool:
        """Whether the lease file is certainly still ours at ``now``: not lost, and short of its
        expiry by the clock-skew margin (before its expiry nobody may take it over)."""
        return not self.lost and now < self.record.expires_at - RELEASE_MARGIN

    def release_checked(self) -> None:
        """Release a lease that may have been taken over: delete it only if it is still ours."""
        current = read_lease(self.store, self.record.name)
        if current is not None and current.token == self.record.token:
            self.store.discard([self.path, _tombstone(self.record.name, self.record.token)])

    def keep_alive(self, interval: float | None = None) -> None:
        """Renew from a daemon thread every ``interval`` (default ttl/3) until released."""
        every = interval if interval is not None else max(self.ttl / 3, 0.05)

        def beat() -> None:
            while not self._stop.wait(every):
                try:
                    if not self.renew():
                        return
                except OSError as exc:  # a blip on the mount: try again next beat
                    log.warning("lease %s heartbeat failed: %s", self.record.name, exc)

        self._thread = threading.Thread(target=beat, name=f"lease:{self.record.name}", daemon=True)
        self._thread.start()

    def __enter__(self) -> StoreLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a time")


def _tombstone(name: str, token: str) -> str:
    return f"{lease_path(name)}.taken-{token}"


def read_lease(store: Store, name: str) -> LeaseRecord | None:
    try:
        with store.open_read(lease_path(name)) as stream:
            raw = stream.read(MAX_LEASE_BYTES + 1)
    except (EntryNotFound, FileNotFoundError):
        return None
    except UnsafePath as exc:
        # A FIFO, device or link planted at the lease's name: never read (it could block for
        # ever), invalid like a garbled record, so taken over by replacing the name itself.
        log.warning("lease %s is invalid (%s): treated as expired", name, exc.reason)
        return LeaseRecord.invalid(name, exc.reason)
    record = LeaseRecord.parse(raw)
    if isinstance(record, str):
        log.warning("lease %s is invalid (%s): treated as expired", name, record)
        return LeaseRecord.invalid(name, record)
    return record


def try_acquire(
    store: Store, name: str, *, ttl: float = DEFAULT_TTL, owner: str | None = None
) -> StoreLease | LeaseRecord:
    """The lease, or the live record of whoever holds it."""
    path = lease_path(name)
    for _ in range(8):
        now = time.time()
        record = LeaseRecord(name, owner or default_owner(), secrets.token_hex(8), socket.gethostname(),
                             os.getpid(), now, now + ttl)
        if store.put_file(path, record.to_bytes(), exclusive=True):
            return StoreLease(store, record, ttl)
        current = read_lease(store, name)
        if current is None:
            continue  # released between our attempt and our read: try again
        if not (current.expired() or current.holder_dead_here()):
            return current
        # Stale: exactly one contender creates the tombstone for this token and replaces it.
        if store.put_file(_tombstone(name, current.token), b"", exclusive=True):
            again = read_lease(store, name)
            if again is not None and again.token != current.token:
                continue  # it changed under us (released and re-acquired): start over
            log.info("taking over stale lease %s from %s", name, current.owner)
            store.put_file(path, record.to_bytes())
            store.delete([_tombstone(name, current.token)])
            return StoreLease(store, record, ttl)
        time.sleep(0.01)
    current = read_lease(store, name)
    if current is not None:
        return current
    raise LeaseHeld(name, "(contended: it changed hands repeatedly)", time.time())


def acquire(store: Store, name: str, *, ttl: float = DEFAULT_TTL, wait: float = 0.0,
            poll: float = 0.2, owner: str | None = None) -> StoreLease:
    """Acquire ``name``, waiting up to ``wait`` seconds for a live holder; else LeaseHeld."""
    deadline = time.monotonic() + wait
    while True:
        got = try_acquire(store, name, ttl=ttl, owner=owner)
        if isinstance(got, StoreLease):
            return got
        if time.monotonic() >= deadline:
            raise LeaseHeld(name, got.owner, got.expires_at)
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.0)))


@contextlib.contextmanager
def held(store: Store, name: str, *, ttl: float = DEFAULT_TTL, wait: float = 0.0) -> Iterator[StoreLease]:
    lease = acquire(store, name, ttl=ttl, wait=wait)
    lease.keep_alive()
    try:
        yield lease
    finally:
        lease.release()
