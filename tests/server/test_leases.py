"""/v1/leases semantics on one replica (the multi-replica race is in test_replicas.py)."""

from __future__ import annotations

import time

import httpx
import pytest


def _acquire(client: httpx.Client, name: str, owner: str, ttl: float = 60) -> dict[str, object]:
    response = client.post("/v1/leases/acquire", json={"name": name, "owner": owner, "ttl": ttl})
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


def test_second_acquirer_learns_holder_and_expiry(writer: httpx.Client) -> None:
    first = _acquire(writer, "graph/MODULE_1", "host-a:1:x", ttl=120)
    assert first["held"] is True and first["owner"] == "host-a:1:x"
    second = _acquire(writer, "graph/MODULE_1", "host-b:2:y")
    assert second["held"] is False
    assert second["owner"] == "host-a:1:x"
    assert second["expires_at"] == pytest.approx(first["expires_at"])
    assert 100 < second["expires_in"] <= 120


def test_reacquire_by_owner_extends(writer: httpx.Client) -> None:
    _acquire(writer, "n", "a", ttl=10)
    again = _acquire(writer, "n", "a", ttl=100)
    assert again["held"] is True and again["expires_in"] > 50


def test_expired_lease_is_taken_over(writer: httpx.Client) -> None:
    _acquire(writer, "stale", "dead-host:1:x", ttl=0.2)
    time.sleep(0.4)
    taken = _acquire(writer, "stale", "live-host:2:y")
    assert taken["held"] is True and taken["owner"] == "live-host:2:y"
    assert writer.post("/v1/leases/renew", json={"name": "stale", "owner": "dead-host:1:x", "ttl": 5}
                       ).status_code == 409


def test_renew_and_release_only_by_owner(writer: httpx.Client) -> None:
    _acquire(writer, "r", "a", ttl=5)
    renewed = writer.post("/v1/leases/renew", json={"name": "r", "owner": "a", "ttl": 300}).json()
    assert renewed["held"] is True and renewed["expires_in"] > 200
    denied = writer.post("/v1/leases/release", json={"name": "r", "owner": "b"})
    assert denied.status_code == 409 and "held by 'a'" in denied.json()["detail"]
    assert writer.post("/v1/leases/release", json={"name": "r", "owner": "a"}).json() == {"released": True}
    assert writer.post("/v1/leases/release", json={"name": "r", "owner": "a"}).status_code == 404
    assert writer.post("/v1/leases/renew", json={"name": "r", "owner": "a", "ttl": 5}).status_code == 404
    assert _acquire(writer, "r", "b")["held"] is True


def test_list_and_lookup(writer: httpx.Client) -> None:
    _acquire(writer, "x/1", "a")
    _acquire(writer, "x/2", "b", ttl=0.1)
    time.sleep(0.3)
    active = writer.get("/v1/leases").json()
    assert [lease["name"] for lease in active] == ["x/1"]
    assert writer.get("/v1/leases", params={"name": "x/2"}).json()[0]["held"] is False
    assert writer.get("/v1/leases", params={"name": "x/1"}).json()[0]["owner"] == "a"
