"""StoreLease files from outside: an invalid one is treated as expired (taken over, removed by
``prune --stale-locks``) and reported; never a traceback, never an entry blocked forever."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.coordination.lease import LeaseRecord, StoreLease, lease_path, read_lease, try_acquire
from neffcache.prune import PrunePolicy, execute_plan, plan_prune
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint  # noqa: F401 - fixtures


def _record(**changes: object) -> dict[str, object]:
    now = time.time()
    return {"name": "x", "owner": "h:1", "token": "abcdef0123456789", "host": socket.gethostname(), "pid": 1,
            "acquired_at": now, "expires_at": now + 60, **changes}


HOSTILE: dict[str, bytes] = {
    "pid-2**70": json.dumps(_record(pid=2**70)).encode(),
    "pid-negative": json.dumps(_record(pid=-1)).encode(),
    "pid-string": json.dumps(_record(pid="1")).encode(),
    "expires-NaN": json.dumps(_record(expires_at=float("nan"))).encode(),
    "expires-Infinity": json.dumps(_record(expires_at=float("inf"))).encode(),
    "expires-year-3000": json.dumps(_record(expires_at=32503680000.0)).encode(),
    "expires-1e400": json.dumps(_record()).replace('"expires_at": ', '"expires_at": 1e400, "x": ').encode(),
    "token-path": json.dumps(_record(token="../../escape")).encode(),
    "host-huge": json.dumps(_record(host="h" * 100_000)).encode(),
    "not-a-dict": b"[1, 2, 3]",
    "nested": b"[" * 100_000 + b"]" * 100_000,
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_invalid_lease_records_are_refused_with_a_reason(name: str) -> None:
    parsed = LeaseRecord.parse(HOSTILE[name])
    assert isinstance(parsed, str) and parsed
    assert LeaseRecord.from_bytes(HOSTILE[name]) is None


def test_a_valid_record_parses() -> None:
    parsed = LeaseRecord.parse(json.dumps(_record()).encode())
    assert isinstance(parsed, LeaseRecord) and not parsed.expired()


@pytest.fixture(params=["local", "shared", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        s3 = S3Store(f"s3://{BUCKET}/leases", endpoint_url=endpoint)
        yield s3
        s3.close()
    else:
        yield LocalStore(tmp_path / "c", shared=request.param == "shared")


@pytest.mark.parametrize("name", ["pid-2**70", "expires-NaN", "expires-year-3000", "token-path"])
def test_an_invalid_lease_is_taken_over_and_pruned(store: Store, name: str) -> None:
    store.put_file(lease_path("entry-a"), HOSTILE[name])
    store.put_file(lease_path("entry-b"), HOSTILE[name])
    seen = read_lease(store, "entry-a")
    assert seen is not None and seen.expired() and "invalid lease" in seen.owner
    got = try_acquire(store, "entry-a", ttl=30)
    assert isinstance(got, StoreLease), got  # taken over: not blocked forever, no traceback
    got.release()
    plan = plan_prune([store], PrunePolicy(stale_locks=True))
    stale = [i for i in plan.items if i.path == lease_path("entry-b")]
    assert stale and "invalid lease" in stale[0].detail
    result = execute_plan(plan, [store])
    assert not result.failed
    assert store.stat(lease_path("entry-b")) is None
