"""why-miss asks the index fleet-wide: a real index server (uvicorn, SQLite) knows an entry held only
in a store the question was not given; with the index down the stores still answer, and say so."""

from __future__ import annotations

import hashlib
from pathlib import Path

from neffcache.index import open_index
from neffcache.index.records import entry_record
from neffcache.layouts import get_layout
from neffcache.misses.explain import Field, FoundIn, Match
from neffcache.misses.inputs import Known, missed_from_argument
from neffcache.misses.nearest import StoreCatalog, why_miss
from neffcache.operations.ingest import build_manifest
from neffcache.operations.publish import publish
from neffcache.scan.report import load_entry
from neffcache.stores.local import LocalStore
from neffcache.toolchain import Toolchain
from tests.cli.conftest import index  # noqa: F401 (the fixture: a real index server, SQLite)
from tests.runtime_caches import VERSION, write_runtime_a
from tests.server.conftest import ServerProcess, Tokens, free_port

V22 = "2.22.4455.0+0123abcd"
HLO = b"HloModule attention_block " + bytes(range(256)) * 64
FLAGS = ["--model-type=transformer"]
LAYOUT_A = get_layout("neuronxcc")


def publish_hidden(root: Path, hlo: bytes = HLO) -> tuple[LocalStore, str]:
    """An entry neffcache published (manifest: digests, flags, toolchain, tags) in a store of its own."""
    store = LocalStore(root)
    tc = Toolchain(VERSION, "trn2", 2)
    ns = LAYOUT_A.namespace_for(tc)
    graph = int.from_bytes(hashlib.sha256(hlo).digest()[:8], "big")
    key = LAYOUT_A.key_with_flags(f"MODULE_{graph}+00000000", ns, FLAGS)
    assert key is not None
    names = LAYOUT_A.names(ns, key)
    flags_name, flags_data = LAYOUT_A.flags_file(ns, key, FLAGS)
    assert names.hlo and names.neff and flags_name
    files = {names.hlo: hlo, flags_name: flags_data, names.neff: b"NEFF" + bytes(4096), names.marker: b""}
    manifest = build_manifest(LAYOUT_A.name, key, files, toolchain=tc, flags=FLAGS, tags={"model": "llama3-8b"})
    assert publish(store, ns, key, files, manifest).ok
    return store, f"{ns.path}/{key}"


def register(server: ServerProcess, tokens: Tokens, store: LocalStore, path: str, spool: Path) -> None:
    entry = load_entry(store, path)
    assert entry is not None
    with open_index(server.url, tokens.write, spool_root=spool) as client:
        client.register_entry(entry_record(entry, store.url))
        flushed = client.flush()
        assert (flushed.delivered_entries, flushed.error) == (1, None)


def test_the_index_finds_a_graph_held_only_in_a_store_not_given(
        tmp_path: Path, index: tuple[ServerProcess, Tokens]) -> None:  # noqa: F811
    proc, tokens = index
    hidden, path = publish_hidden(tmp_path / "other-region")
    register(proc, tokens, hidden, path, tmp_path / "spool")
    given = LocalStore(tmp_path / "mine")
    write_runtime_a(given.root / "trn2-lnc2", b"HloModule unrelated", version=VERSION, target="trn2")
    hlo = tmp_path / "job" / "model.hlo_module.pb"
    hlo.parent.mkdir()
    hlo.write_bytes(HLO)
    missed = missed_from_argument(str(hlo), Known(compiler_version=V22, target="trn2", lnc=2, flags=tuple(FLAGS)))
    with open_index(proc.url, tokens.read, spool_root=tmp_path / "spool") as client:
        (found,) = why_miss([missed], [StoreCatalog.build(given)], client)
    assert found.cause == "compiler 2.21 → 2.22"
    best = found.comparisons[0]
    assert (best.candidate.path, best.candidate.source, best.candidate.stores) == (path, FoundIn.INDEX,
                                                                                  (hidden.url,))
    assert best.match(Field.HLO) is Match.SAME and best.match(Field.FLAGS) is Match.SAME
    assert f"--store {hidden.url}" in found.fix
    assert found.index == f"asked {proc.url}: 1 entry"


def test_with_the_index_down_the_stores_answer_and_say_so(tmp_path: Path) -> None:
    given = LocalStore(tmp_path / "mine")
    old = write_runtime_a(given.root / "trn2-lnc2", HLO, version=VERSION, flags=" ".join(FLAGS), target="trn2")
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens
    missed = [missed_from_argument(f"trn2-lnc2/neuronxcc-{V22}/{old.name}", Known()) for _ in range(3)]
    with open_index(down, "nc_token", spool_root=tmp_path / "spool", retries=0) as client:
        found = why_miss(missed, [StoreCatalog.build(given)], client)
    assert [f.cause for f in found] == ["compiler 2.21 → 2.22"] * 3
    assert all(f.index.startswith(f"{down} did not answer") and "answered from the stores only" in f.index
               for f in found)
