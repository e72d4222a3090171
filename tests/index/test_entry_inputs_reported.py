"""What a publisher registers about a graph's inputs: the HLO digest and size and the user flags
from the entry's manifest, through a real publish and `neffcache push` (a subprocess) to a real
server on SQLite and PostgreSQL; none of them for a record without a manifest or from an older
client."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import httpx

from neffcache.index import IndexClient, entry_record
from neffcache.scan.report import scan
from neffcache.stores.local import LocalStore
from neffcache.testing.store_contract import publish_a
from tests.runtime_caches import write_neuronxcc_entry
from tests.server.conftest import LiveServer, Tokens

HLO_NAME = "model.hlo_module.pb"  # the test's own writer (publish_a) names it so


def _get(server: LiveServer, token: str, path: str) -> dict[str, object]:
    with server.client(token) as client:
        response = client.get(f"/v1/entries/{path}")
    assert response.status_code == 200, response.text
    found: dict[str, object] = response.json()
    return found


def test_push_registers_each_entrys_hlo_digest_size_and_flags(server: LiveServer, tokens: Tokens,
                                                              tmp_path: Path) -> None:
    src, dst = LocalStore(tmp_path / "src"), LocalStore(tmp_path / "dst")
    published = [publish_a(src, key=f"MODULE_{i}+abb26765")[0] for i in range(3)]
    native = write_neuronxcc_entry(src.root, b"HLO written by the runtime", version="2.27.5334.0+f702b353")
    pushed = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "push", str(src.root), str(dst.root),
                             "--index-url", server.url, "--token", tokens.write, "--json"],
                            capture_output=True, text=True, timeout=120)
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["index"]["registered"] == 4

    for path in published:
        hlo = (dst.root / path / HLO_NAME).read_bytes()
        manifest = json.loads((dst.root / path / "neffcache.json").read_text())
        got = _get(server, tokens.read, path)
        assert got["hlo_sha256"] == hashlib.sha256(hlo).hexdigest() == manifest["files"][HLO_NAME]["sha256"]
        assert got["hlo_size"] == len(hlo)
        assert got["flags"] == manifest["flags"] == ["--model-type=transformer"]
    # An entry the runtime wrote gets its manifest computed on the way: its inputs are known too.
    native_path = native.relative_to(src.root).as_posix()
    assert _get(server, tokens.read, native_path)["hlo_sha256"] == \
        hashlib.sha256(b"HLO written by the runtime").hexdigest()

    with server.client(tokens.read) as reader:
        digest = _get(server, tokens.read, published[1])["hlo_sha256"]
        same = reader.get("/v1/entries/similar", params={"hlo_sha256": digest}).json()["entries"]
        assert [e["path"] for e in same] == [published[1]]
        samples = reader.get("/v1/entries/compile-samples", params={"target": "trn2"}).json()["samples"]
        assert sorted((s["hlo_size"], s["compile_seconds"]) for s in samples) == \
            sorted((len((dst.root / p / HLO_NAME).read_bytes()), 12.5) for p in published)


def test_a_record_from_an_older_client_registers_without_inputs(server: LiveServer, tokens: Tokens,
                                                                tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    path = publish_a(store)[0]
    (entry,) = scan(store, read_manifests=True).entries
    record = dict(entry_record(entry, store.url))
    older = {name: value for name, value in record.items() if name not in ("hlo_sha256", "hlo_size", "flags")}
    with IndexClient(server.url, tokens.write, spool_dir=tmp_path / "spool") as client:
        client.register_entry(older)
        assert client.flush().delivered_entries == 1
    got = _get(server, tokens.read, path)
    assert (got["hlo_sha256"], got["hlo_size"], got["flags"]) == (None, None, None)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {tokens.write}"}) as writer:
        writer.post("/v1/entries", json=[record]).raise_for_status()  # the same entry from a current client
    assert _get(server, tokens.read, path)["flags"] == ["--model-type=transformer"]


def test_entry_record_without_a_manifest_knows_only_the_hlo_size(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    write_neuronxcc_entry(store.root, b"HLO bytes", version="2.27.5334.0+f702b353")
    (entry,) = scan(store).entries
    assert entry.manifest is None
    record = entry_record(entry, store.url)
    assert (record["hlo_sha256"], record["hlo_size"], record["flags"]) == (None, len(b"HLO bytes"), None)


def test_entry_record_with_a_manifest_takes_its_digest_size_and_flags(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    path = publish_a(store, key="MODULE_7+abb26765")[0]
    (entry,) = scan(store, read_manifests=True).entries
    assert entry.manifest is not None
    record = entry_record(entry, store.url)
    hlo = (store.root / path / HLO_NAME).read_bytes()
    assert (record["hlo_sha256"], record["hlo_size"]) == (hashlib.sha256(hlo).hexdigest(), len(hlo))
    assert record["flags"] == list(entry.manifest.flags) == ["--model-type=transformer"]
