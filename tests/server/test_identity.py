"""Attacks by one write token on what another wrote, on SQLite and PostgreSQL (issue 37).

Each test is an attack measured against the server before identities: any write token could
overwrite another's entry record, forget its locations, evict its entries, report for its team,
take over its lease with the owner string a reader lists, and write anywhere. Each now gets a
403 (or 409 for a lease) and leaves the victim's data as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from neffcache.server.services.tokens import create_token
from tests.server.conftest import ADMIN_SECRET, LiveServer
from tests.server.factories import entry, event

STORE_A = "s3://bucket/team-a"


@dataclass
class Clients:
    alice: httpx.Client  # team-a's writer, the victim
    mallory: httpx.Client  # team-b's writer, the attacker
    loner: httpx.Client  # a write token without a team
    admin: httpx.Client
    reader: httpx.Client


def _token(server: LiveServer, name: str, scope: str = "write", **limits: Any) -> str:
    with server.db.write() as session:
        return create_token(session, name, scope, **limits)[1]


@pytest.fixture
def clients(server: LiveServer) -> Iterator[Clients]:
    made = [server.client(_token(server, "alice", team="team-a")),
            server.client(_token(server, "mallory", team="team-b")),
            server.client(_token(server, "loner")), server.client(ADMIN_SECRET),
            server.client(_token(server, "viewer", "read"))]
    try:
        yield Clients(*made)
    finally:
        for client in made:
            client.close()


def _lookup(reader: httpx.Client, path: str) -> dict[str, Any]:
    response = reader.get(f"/v1/entries/{path}")
    response.raise_for_status()
    return response.json()  # type: ignore[no-any-return]


def _register(client: httpx.Client, *records: dict[str, Any]) -> httpx.Response:
    return client.post("/v1/entries", json=list(records))


def test_another_token_cannot_overwrite_a_record(clients: Clients) -> None:
    mine = entry(1, store=STORE_A, tags={"team": "team-a", "model": "llama"})
    assert _register(clients.alice, mine).status_code == 200
    forged = {**mine, "neff_sha256": "cd" * 32, "size": 5, "tags": {"team": "team-b"}, "store": "s3://evil/x"}
    refused = _register(clients.mallory, entry(2), forged)
    assert refused.status_code == 403, refused.text
    assert "alice" in refused.json()["detail"]
    assert [e["loc"][:2] for e in refused.json()["errors"]] == [["body", 1]]  # the item, named
    after = _lookup(clients.reader, mine["path"])
    assert (after["neff_sha256"], after["size"], after["tags"], after["stores"]) == (
        mine["neff_sha256"], mine["size"], mine["tags"], [STORE_A])
    assert clients.reader.get(f"/v1/entries/{entry(2)['path']}").status_code == 404  # nothing of the batch
    # The same bytes from another store are a location of its own, not a change of the record.
    same = {**mine, "store": "s3://bucket/team-b", "tags": {"team": "team-b"}}
    assert _register(clients.mallory, same).status_code == 200
    joined = _lookup(clients.reader, mine["path"])
    assert joined["stores"] == sorted([STORE_A, "s3://bucket/team-b"]) and joined["tags"] == mine["tags"]
    # The owner and an admin still may change it.
    assert _register(clients.alice, {**mine, "size": 7}).status_code == 200
    assert _register(clients.admin, {**mine, "size": 8}).status_code == 200
    assert _lookup(clients.reader, mine["path"])["size"] == 8
    assert _register(clients.alice, {**mine, "size": 9}).status_code == 200  # an admin's repair keeps the owner
    owned = clients.reader.get("/v1/entries", params={"writer": "alice"}).json()["entries"]
    assert [e["path"] for e in owned] == [mine["path"]]
    assert clients.reader.get("/v1/entries", params={"writer": "mallory"}).json()["entries"] == []


def test_another_token_cannot_forget_a_location(clients: Clients) -> None:
    mine = entry(3, store=STORE_A)
    _register(clients.alice, mine).raise_for_status()
    _register(clients.mallory, {**mine, "store": "s3://bucket/team-b"}).raise_for_status()
    path = mine["path"]
    for params in ({"store": STORE_A}, {}):
        refused = clients.mallory.delete(f"/v1/entries/{path}", params=params)
        assert refused.status_code == 403 and "alice" in refused.json()["detail"], refused.text
    assert STORE_A in _lookup(clients.reader, path)["stores"]
    # Its own location it may forget; alice's stays, and with it the entry.
    gone = clients.mallory.delete(f"/v1/entries/{path}", params={"store": "s3://bucket/team-b"})
    assert gone.status_code == 200 and gone.json()["entry_removed"] is False
    assert _lookup(clients.reader, path)["stores"] == [STORE_A]
    assert clients.admin.delete(f"/v1/entries/{path}").json()["entry_removed"] is True


def test_another_token_cannot_evict_an_entry(clients: Clients) -> None:
    mine = entry(4, store=STORE_A)
    _register(clients.alice, mine).raise_for_status()
    evict = event("evict", path=mine["path"], store=STORE_A, team="team-b")
    refused = clients.mallory.post("/v1/events", json=[event("hit", team="team-b"), evict])
    assert refused.status_code == 403, refused.text
    assert [e["loc"] for e in refused.json()["errors"]] == [["body", 1, "store"]]
    assert _lookup(clients.reader, mine["path"])["stores"] == [STORE_A]
    stats = clients.reader.get("/v1/stats", params={"window": "1d"}).json()
    assert stats["totals"]["evictions"] == 0 and stats["totals"]["hits"] == 0  # the batch was refused whole
    own = clients.alice.post("/v1/events", json=[event("evict", path=mine["path"], store=STORE_A, team="team-a")])
    assert own.status_code == 200 and own.json()["accepted"] == 1
    assert clients.reader.get(f"/v1/entries/{mine['path']}").status_code == 404


def test_a_token_reports_only_for_its_own_team(clients: Clients) -> None:
    inflate = [event("hit", team="team-a", compile_seconds=1e8) for _ in range(100)]
    refused = clients.mallory.post("/v1/events", json=inflate)
    assert refused.status_code == 403 and "team-b" in refused.json()["detail"], refused.text
    assert len(refused.json()["errors"]) == 100
    # A token without a team may not name a team a token is bound to either.
    assert clients.loner.post("/v1/events", json=[event("hit", team="team-a")]).status_code == 403
    # What each may do: its own team, none (the token's is recorded), a team no token is bound to.
    assert clients.mallory.post("/v1/events", json=[event("hit", team="team-b"), event("hit", team="")]
                                ).json()["accepted"] == 2
    assert clients.loner.post("/v1/events", json=[event("hit", team="research")]).json()["accepted"] == 1
    assert clients.alice.post("/v1/events", json=[event("miss", team="team-a")]).json()["accepted"] == 1
    groups = {g["name"]: g for g in clients.reader.get("/v1/stats", params={"window": "1d"}).json()["groups"]}
    assert groups["team-a"]["hits"] == 0 and groups["team-a"]["saved_hours"] == 0.0
    assert groups["team-b"]["hits"] == 2 and groups["research"]["hits"] == 1


def test_stats_group_by_producer_is_the_reporting_token(clients: Clients) -> None:
    clients.alice.post("/v1/events", json=[event("hit", team="team-a") for _ in range(3)]).raise_for_status()
    clients.mallory.post("/v1/events", json=[event("miss", team="team-b")]).raise_for_status()
    stats = clients.reader.get("/v1/stats", params={"window": "1d", "group_by": "producer"}).json()
    groups = {g["name"]: (g["hits"], g["misses"]) for g in stats["groups"]}
    assert groups == {"alice": (3, 0), "mallory": (0, 1)}


def test_another_token_cannot_take_over_a_lease(clients: Clients) -> None:
    held = clients.alice.post("/v1/leases/acquire", json={"name": "graph/M1", "owner": "host-a:1:x", "ttl": 300})
    assert held.json()["held"] is True and held.json()["writer"] == "alice"
    listed = clients.reader.get("/v1/leases").json()[0]  # what any reader learns: name and owner label
    steal = {"name": listed["name"], "owner": listed["owner"], "ttl": 300}
    taken = clients.mallory.post("/v1/leases/acquire", json=steal)
    assert taken.status_code == 200 and taken.json()["held"] is False and taken.json()["writer"] == "alice"
    assert clients.mallory.post("/v1/leases/renew", json=steal).status_code == 409
    assert clients.mallory.post("/v1/leases/release", json={"name": steal["name"], "owner": steal["owner"]}
                                ).status_code == 409
    still = clients.reader.get("/v1/leases", params={"name": "graph/M1"}).json()[0]
    assert (still["held"], still["writer"], still["owner"]) == (True, "alice", "host-a:1:x")
    assert clients.alice.post("/v1/leases/release", json={"name": "graph/M1", "owner": "host-a:1:x"}
                              ).json() == {"released": True}


@pytest.mark.parametrize(("prefix", "inside", "outside"), [
    ("pr-123/", "pr-123/trn2-lnc2/neuronxcc-2.27.5334.0+f702b353", "pr-1234/trn2-lnc2/neuronxcc-2.27.5334.0+f702b353"),
    ("s3://bucket/pr/123/", "s3://bucket/pr/123/cache", "s3://bucket/pr/1234"),
])
def test_a_scoped_token_writes_only_inside_its_prefixes(server: LiveServer, clients: Clients, prefix: str,
                                                       inside: str, outside: str) -> None:
    with server.client(_token(server, "pr-ci", prefixes=[prefix])) as scoped:
        field = "store" if "://" in prefix else "namespace"
        assert _register(scoped, entry(5, **{field: inside})).status_code == 200
        refused = _register(scoped, entry(6, **{field: outside}))
        assert refused.status_code == 403 and "outside the token's prefixes" in refused.json()["detail"]
        assert refused.json()["errors"][0]["loc"][:2] == ["body", 0]
        assert scoped.post("/v1/events", json=[event("compile", **{field: outside}, team="")]).status_code == 403
        assert scoped.post("/v1/events", json=[event("compile", **{field: inside}, team="")]).status_code == 200
        if field == "store":  # no spelling walks out of the prefix
            for sneaky in (f"{inside}/../../main", "s3://bucket/pr/123/./../124", "s3://bucket/main"):
                assert _register(scoped, entry(7, store=sneaky)).status_code == 403, sneaky
    assert _register(clients.alice, entry(8, store=outside if "://" in prefix else STORE_A)).status_code == 200


def test_token_teams_and_prefixes_are_checked_at_creation(server: LiveServer, clients: Clients) -> None:
    made = clients.admin.post("/v1/tokens", json={"name": "pr-9", "scope": "write", "team": "team-c",
                                                  "prefixes": ["pr-9/", "s3://bucket/pr/9/"]})
    assert made.status_code == 201, made.text
    assert (made.json()["team"], made.json()["prefixes"]) == ("team-c", ["pr-9", "s3://bucket/pr/9"])
    for bad in (["../x"], ["s3://bucket/a/../b"], ["/"], ["a//b"], ["s3://"]):
        response = clients.admin.post("/v1/tokens", json={"name": "bad", "scope": "write", "prefixes": bad})
        assert response.status_code == 422, (bad, response.text)
    for reserved in ("bootstrap-admin", "anonymous"):
        assert clients.admin.post("/v1/tokens", json={"name": reserved, "scope": "write"}).status_code == 409
    with server.client(made.json()["token"]) as created:
        assert created.get("/v1/whoami").json()["name"] == "pr-9"


def test_a_token_whose_prefixes_do_not_parse_is_refused_not_unlimited(server: LiveServer, clients: Clients) -> None:
    """Bytes from the database are untrusted too: damaged prefixes must not read as "anywhere"."""
    from sqlalchemy import text

    secret = _token(server, "damaged", prefixes=["pr-1/"])
    with server.db.write() as session:
        session.execute(text("UPDATE tokens SET prefixes = :junk WHERE name = 'damaged'"), {"junk": '{"not": "a list"'})
    with server.client(secret) as damaged:
        assert damaged.post("/v1/entries", json=[entry(9, namespace="main/ns")]).status_code == 401
    listed = {t["name"]: t for t in clients.admin.get("/v1/tokens").json()}
    assert listed["damaged"]["prefixes"] == ["(unreadable: refused)"]
