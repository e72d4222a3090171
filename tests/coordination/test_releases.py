"""Publish leases released in batches (neffcache/coordination/releases.py), on a local store
and on S3 over HTTP: a deferred lease stays held until its batch goes, a batch goes when full,
on a timer and on close; a lease that may have been taken over meanwhile is read back and
never deleted when it is someone else's; a failed batch delete is logged, not raised."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from neffcache.coordination import releases as releases_module
from neffcache.coordination.lease import LeaseRecord, StoreLease, lease_path, read_lease, try_acquire
from neffcache.coordination.releases import BATCH, BatchedReleases
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint  # noqa: F401 - fixtures


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    endpoint = request.getfixturevalue("s3_endpoint")
    return S3Store(f"s3://{BUCKET}/releases-{time.monotonic_ns()}", endpoint_url=endpoint)


def _acquire(store: Store, name: str, ttl: float = 300.0) -> StoreLease:
    got = try_acquire(store, name, ttl=ttl)
    assert isinstance(got, StoreLease)
    got.keep_alive()
    return got


def test_deferred_leases_stay_held_until_their_batch_goes_in_one_request(store: Store) -> None:
    with BatchedReleases(store) as batch:
        leases = [_acquire(store, f"publish:e{i}") for i in range(5)]
        for lease in leases:
            batch.release(lease)
            assert lease._thread is None  # the heartbeat stopped at once
        for i in range(5):  # still held: another publisher of the entry finds it busy
            assert isinstance(try_acquire(store, f"publish:e{i}"), LeaseRecord)
    assert batch.requests == 1
    assert all(read_lease(store, f"publish:e{i}") is None for i in range(5))
    assert isinstance(try_acquire(store, "publish:e0"), StoreLease)  # free again


def test_a_full_batch_goes_at_once(store: Store) -> None:
    batch = BatchedReleases(store)
    for i in range(BATCH):
        batch.release(_acquire(store, f"publish:full{i}"))
    assert batch.requests == 1  # before any close
    assert all(read_lease(store, f"publish:full{i}") is None for i in (0, BATCH - 1))
    batch.close()
    assert batch.requests == 1  # nothing was left


def test_the_timer_sends_a_short_batch(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(releases_module, "MAX_DELAY", 0.2)
    batch = BatchedReleases(store)
    batch.release(_acquire(store, "publish:slow"))
    deadline = time.monotonic() + 10
    while read_lease(store, "publish:slow") is not None:
        assert time.monotonic() < deadline, "the timer never released the lease"
        time.sleep(0.05)
    assert batch.requests == 1
    batch.close()
    assert batch.requests == 1


def test_a_lease_near_its_expiry_is_released_at_once(store: Store) -> None:
    batch = BatchedReleases(store)
    lease = _acquire(store, "publish:short", ttl=releases_module.MAX_DELAY)  # would expire while waiting
    batch.release(lease)
    assert read_lease(store, "publish:short") is None and batch.requests == 0


def test_a_lease_taken_over_while_deferred_is_left_to_its_new_holder(store: Store) -> None:
    """Time passes past the deferred lease's expiry (its record says so), another host takes it
    over: the batch reads it back and deletes nothing of theirs."""
    batch = BatchedReleases(store)
    ours = _acquire(store, "publish:taken")
    batch.release(ours)
    ours.record = LeaseRecord(**{**ours.record.__dict__, "expires_at": time.time() - 1})  # it lapsed
    theirs = LeaseRecord("publish:taken", "other@host pid 9", "fedcba9876543210", "other-host", 9,
                         time.time(), time.time() + 300)
    store.put_file(lease_path("publish:taken"), theirs.to_bytes())
    batch.close()
    current = read_lease(store, "publish:taken")
    assert current is not None and current.token == theirs.token


def test_a_failed_batch_delete_is_logged_not_raised(store: Store, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    batch = BatchedReleases(store)
    batch.release(_acquire(store, "publish:stuck"))

    def refuse(paths: object, **kwargs: object) -> None:
        raise OSError("the store went away")

    monkeypatch.setattr(store, "discard", refuse)
    with caplog.at_level(logging.WARNING, logger="neffcache.coordination.releases"):
        batch.close()  # no exception: the entry it would land on is committed
    assert "not released" in caplog.text and "the store went away" in caplog.text
    monkeypatch.undo()
    assert read_lease(store, "publish:stuck") is not None  # left to expire, as a killed publisher's


def test_releases_from_many_threads_each_go_exactly_once(store: Store) -> None:
    batch = BatchedReleases(store)
    leases = [_acquire(store, f"publish:t{i}") for i in range(BATCH + 7)]
    threads = [threading.Thread(target=batch.release, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    batch.close()
    assert batch.requests == 2  # one full batch, then the rest on close
    assert all(read_lease(store, f"publish:t{i}") is None for i in range(BATCH + 7))
