"""/v1/entries on SQLite and PostgreSQL: register, look up, list, paginate, forget."""

from __future__ import annotations

import time

import httpx

from tests.server.conftest import LiveServer
from tests.server.factories import NAMESPACE, TOOLCHAIN_LABEL, entry, event


def test_register_then_lookup_returns_the_record_with_its_store(writer: httpx.Client) -> None:
    record = entry(1)
    assert writer.post("/v1/entries", json=[record]).json() == {"registered": 1}
    got = writer.get(f"/v1/entries/{record['path']}").json()
    assert got["key"] == record["key"]
    assert got["stores"] == ["s3://bucket/prefix"]
    assert got["toolchain_label"] == TOOLCHAIN_LABEL
    assert got["tags"] == {"bucket": "seq2048", "model": "llama3-8b", "team": "search"}
    assert got["hit_count"] == 0 and got["last_used"] is None


def test_a_second_store_adds_a_location_and_keeps_usage(writer: httpx.Client) -> None:
    record = entry(2)
    writer.post("/v1/entries", json=[record]).raise_for_status()
    writer.post("/v1/events", json=[event("hit", path=record["path"])]).raise_for_status()
    writer.post("/v1/entries", json=[{**record, "store": "fsx:///mnt/fsx/cache", "state": "SUCCESS"}]
                ).raise_for_status()
    got = writer.get(f"/v1/entries/{record['path']}").json()
    assert got["stores"] == ["fsx:///mnt/fsx/cache", "s3://bucket/prefix"]
    assert got["hit_count"] == 1


def test_reregistering_updates_state_in_place(writer: httpx.Client) -> None:
    record = entry(3, state="LOCKED")
    writer.post("/v1/entries", json=[record]).raise_for_status()
    writer.post("/v1/entries", json=[{**record, "state": "SUCCESS"}]).raise_for_status()
    page = writer.get("/v1/entries", params={"key": record["key"]}).json()
    assert [e["state"] for e in page["entries"]] == ["SUCCESS"]


def test_unknown_entry_is_404(reader: httpx.Client) -> None:
    response = reader.get(f"/v1/entries/{NAMESPACE}/MODULE_404+00000000")
    assert response.status_code == 404
    assert "not found" in response.json()["detail"]


def test_list_filters_and_paginates(writer: httpx.Client) -> None:
    records = [entry(i, state="FAILED" if i % 5 == 0 else "SUCCESS",
                     tags={"team": "search" if i % 2 else "ads", "model": "m"}) for i in range(23)]
    other = entry(99, namespace="trn1-lnc1/neuronxcc-2.21.33363.0+82129205",
                  toolchain={"compiler_version": "2.21.33363.0+82129205", "target": "trn1", "lnc": 1})
    writer.post("/v1/entries", json=[*records, other]).raise_for_status()

    seen, cursor = [], None
    while True:
        params = {"limit": 5, "namespace": NAMESPACE, **({"cursor": cursor} if cursor else {})}
        page = writer.get("/v1/entries", params=params).json()
        seen += [e["key"] for e in page["entries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(r["key"] for r in records)
    assert len(seen) == len(set(seen))

    failed = writer.get("/v1/entries", params={"state": "FAILED"}).json()["entries"]
    assert {e["key"] for e in failed} == {r["key"] for r in records if r["state"] == "FAILED"}
    ads = writer.get("/v1/entries", params=[("tag", "team=ads"), ("tag", "model=m")]).json()["entries"]
    assert len(ads) == 12
    trn1 = writer.get("/v1/entries", params={"target": "trn1", "lnc": 1}).json()["entries"]
    assert [e["key"] for e in trn1] == [other["key"]]


def test_unused_since_uses_neffcaches_own_stamps(writer: httpx.Client) -> None:
    old, hot = entry(10), entry(11)
    writer.post("/v1/entries", json=[old, hot]).raise_for_status()
    cutoff = time.time() + 1
    writer.post("/v1/events", json=[event("hit", path=hot["path"], ts=cutoff + 5)]).raise_for_status()
    stale = writer.get("/v1/entries", params={"unused_since": cutoff}).json()["entries"]
    assert [e["key"] for e in stale] == [old["key"]]


def test_forget_one_store_then_the_last(writer: httpx.Client) -> None:
    record = entry(5)
    writer.post("/v1/entries", json=[record, {**record, "store": "fsx:///mnt/fsx"}]).raise_for_status()
    first = writer.delete(f"/v1/entries/{record['path']}", params={"store": "fsx:///mnt/fsx"}).json()
    assert first == {"path": record["path"], "removed_stores": 1, "entry_removed": False}
    assert writer.get(f"/v1/entries/{record['path']}").json()["stores"] == ["s3://bucket/prefix"]
    assert writer.delete(f"/v1/entries/{record['path']}", params={"store": "nope://x"}).status_code == 404
    last = writer.delete(f"/v1/entries/{record['path']}").json()
    assert last["entry_removed"] is True
    assert writer.get(f"/v1/entries/{record['path']}").status_code == 404


def test_evict_event_removes_the_location(writer: httpx.Client) -> None:
    record = entry(6)
    writer.post("/v1/entries", json=[record]).raise_for_status()
    writer.post("/v1/events", json=[event("evict", path=record["path"], store=record["store"])]).raise_for_status()
    assert writer.get(f"/v1/entries/{record['path']}").status_code == 404


def test_openapi_is_published(server: LiveServer) -> None:
    with server.client() as client:
        spec = client.get("/openapi.json").json()
    assert {"/v1/entries", "/v1/events", "/v1/leases/acquire", "/v1/stats", "/v1/tokens"} <= set(spec["paths"])
