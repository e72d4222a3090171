"""Each entry's graph inputs (HLO digest and size, user flags), on SQLite and PostgreSQL: kept,
served, validated, absent for records of older clients, and never erased by a registration that
does not know them."""

from __future__ import annotations

import httpx
import pytest

from neffcache.manifest import MAX_FLAG_LEN, MAX_FLAGS
from tests.server.factories import digest, entry

FLAGS = ["--model-type=transformer", "-O1", "--auto-cast=none"]


def _get(client: httpx.Client, path: str) -> dict[str, object]:
    response = client.get(f"/v1/entries/{path}")
    assert response.status_code == 200, response.text
    found: dict[str, object] = response.json()
    return found


def test_the_inputs_are_kept_and_served_by_every_read(writer: httpx.Client) -> None:
    record = entry(1, hlo_sha256=digest(1), hlo_size=123_456, flags=FLAGS)
    writer.post("/v1/entries", json=[record]).raise_for_status()
    got = _get(writer, record["path"])
    assert (got["hlo_sha256"], got["hlo_size"], got["flags"]) == (digest(1), 123_456, FLAGS)
    listed = writer.get("/v1/entries", params={"key": record["key"]}).json()["entries"][0]
    batch = writer.post("/v1/entries/lookup", json={"paths": [record["path"]]}).json()["found"][0]
    assert listed == got == batch


def test_records_of_older_clients_have_no_inputs(writer: httpx.Client) -> None:
    record = entry(2)
    assert "hlo_sha256" not in record  # what a client before these fields sends
    writer.post("/v1/entries", json=[record]).raise_for_status()
    got = _get(writer, record["path"])
    assert (got["hlo_sha256"], got["hlo_size"], got["flags"]) == (None, None, None)


def test_empty_flags_are_known_and_differ_from_unknown(writer: httpx.Client) -> None:
    record = entry(3, flags=[])
    writer.post("/v1/entries", json=[record]).raise_for_status()
    assert _get(writer, record["path"])["flags"] == []


def test_a_registration_without_the_inputs_keeps_them(writer: httpx.Client) -> None:
    record = entry(4, hlo_sha256=digest(4), hlo_size=99, flags=FLAGS)
    writer.post("/v1/entries", json=[record]).raise_for_status()
    # Another tier, registered by an older client (or from a store without manifests).
    old_style = {k: v for k, v in record.items() if k not in ("hlo_sha256", "hlo_size", "flags")}
    writer.post("/v1/entries", json=[{**old_style, "store": "fsx:///mnt/fsx", "state": "SUCCESS"}]
                ).raise_for_status()
    got = _get(writer, record["path"])
    assert got["stores"] == ["fsx:///mnt/fsx", "s3://bucket/prefix"]
    assert (got["hlo_sha256"], got["hlo_size"], got["flags"]) == (digest(4), 99, FLAGS)
    # One that knows them says what is true now.
    writer.post("/v1/entries", json=[{**record, "hlo_size": 100, "flags": []}]).raise_for_status()
    assert (_get(writer, record["path"])["hlo_size"], _get(writer, record["path"])["flags"]) == (100, [])


@pytest.mark.parametrize(("field", "value"), [
    ("hlo_sha256", "AB" * 32),  # uppercase
    ("hlo_sha256", "ab" * 31),  # short
    ("hlo_sha256", "zz" * 32),
    ("hlo_sha256", 12),
    ("hlo_size", -1),
    ("hlo_size", 2**63),
    ("hlo_size", 1.5),
    ("flags", "--model-type=transformer"),  # a string, not a list
    ("flags", [1, 2]),
    ("flags", ["ok", None]),
    ("flags", ["a\x00b"]),
    ("flags", ["x"] * (MAX_FLAGS + 1)),
    ("flags", ["x" * (MAX_FLAG_LEN + 1)]),
])
def test_bad_inputs_refuse_the_batch(writer: httpx.Client, field: str, value: object) -> None:
    good, bad = entry(5), entry(6, **{field: value})
    response = writer.post("/v1/entries", json=[good, bad])
    assert response.status_code == 422, response.text
    assert f"body.1.{field}" in response.json()["detail"]
    assert writer.get(f"/v1/entries/{good['path']}").status_code == 404  # nothing registered


def test_flags_at_the_manifests_bounds_are_kept(writer: httpx.Client) -> None:
    flags = ["-x\t\n\"'\\ é"] + ["f"] * 200 + ["y" * MAX_FLAG_LEN]
    record = entry(7, flags=flags)
    writer.post("/v1/entries", json=[record]).raise_for_status()
    assert _get(writer, record["path"])["flags"] == flags


@pytest.mark.parametrize("path", ["similar", "compile-samples", "lookup"])
def test_an_entry_may_not_take_a_path_the_api_answers(writer: httpx.Client, path: str) -> None:
    response = writer.post("/v1/entries", json=[entry(8, path=path)])
    assert response.status_code == 422
    assert "reserved" in response.json()["detail"]


def test_a_path_ending_in_a_reserved_name_is_an_ordinary_entry(writer: httpx.Client) -> None:
    record = entry(9, path="trn2-lnc2/similar")
    writer.post("/v1/entries", json=[record]).raise_for_status()
    assert _get(writer, "trn2-lnc2/similar")["key"] == record["key"]
    assert writer.get("/v1/entries/similar/compile-samples").status_code == 404  # a path, not a query
