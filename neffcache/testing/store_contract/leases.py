"""Lease files on the store: exclusive, taken over once expired, kept alive by a heartbeat."""

from __future__ import annotations

import time

from neffcache.coordination.lease import LeaseRecord, acquire, read_lease, try_acquire
from neffcache.stores.base import Store


class LeaseContract:
    def test_lease_exclusive_and_takeover(self, store: Store) -> None:
        first = acquire(store, "compile:g1", ttl=60)
        second = try_acquire(store, "compile:g1", ttl=60, owner="other")
        assert isinstance(second, LeaseRecord) and second.token == first.record.token
        first.release()
        third = acquire(store, "compile:g1", ttl=0.2, owner="third")
        time.sleep(0.3)  # third's lease is past its expiry: anyone may take it over
        fourth = acquire(store, "compile:g1", ttl=60, owner="fourth")
        assert not third.renew()  # the old holder learns it lost the lease
        current = read_lease(store, "compile:g1")
        assert current is not None and current.owner == "fourth"
        fourth.release()
        assert read_lease(store, "compile:g1") is None

    def test_live_lease_not_taken(self, store: Store) -> None:
        holder = acquire(store, "compile:g2", ttl=0.5)
        holder.keep_alive(0.05)
        time.sleep(0.8)  # longer than the ttl, but the heartbeat keeps it alive
        got = try_acquire(store, "compile:g2", owner="intruder")
        assert isinstance(got, LeaseRecord)
        holder.release()
