"""The n largest entries of a streaming scan (a sink: neffcache/scan/sinks.py) are the full
report's n largest, whether the store counted its plain entries (the C helper, each count
reporting its own largest) or listed them, in every listing order the stores produce."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from neffcache.cli.main import cli
from neffcache.entry import EntryState
from neffcache.scan import summary as summary_module
from neffcache.scan.report import scan
from neffcache.scan.sinks import MAX_LARGEST, Largest, SizedEntry, sized
from neffcache.scan.summary import summarize
from neffcache.stores import local_listing
from neffcache.stores.base import Store
from neffcache.stores.local import LocalStore
from neffcache.stores.s3 import S3Store
from tests.runtime_caches import write_kernel_neff, write_native_neff, write_neuronxcc_entry
from tests.scan.test_summary import KeyOrder, _all_layouts
from tests.stores.conftest import aws_env, moto_server, s3_endpoint, s3_store  # noqa: F401 - fixtures

ORDERS = ["walk", "python walk", "threaded", "key order", "no shard counts"]


def _sized_tree(root: Path, entries: int = 300, seed: int = 7) -> None:
    """Layouts A and B (both of TorchNeuron's writers) with NEFFs of many sizes, ties among them,
    and HLOs beside some layout-B NEFFs in the other tree (an entry's size spans both trees)."""
    rng = random.Random(seed)
    sizes = [rng.randrange(1, 5000) for _ in range(entries)]
    ns = root / "trn2-lnc2" / "torchneuron-2.9.0"
    for j in range(2):  # four tied for first, in shards and kernel directories: one NEFF each
        write_native_neff(ns / "neff", f"tie-{j}", b"N" + bytes(6000))
        write_kernel_neff(ns / "neff", f"tie-{j}", b"N" + bytes(6000))
    for i, size in enumerate(sizes):
        body = bytes(size)
        if i % 3 == 0:
            write_neuronxcc_entry(root, f"a-{i}".encode(), neff=b"N" + body)
        elif i % 3 == 1:
            neff = write_native_neff(ns / "neff", f"b-{i}", b"N" + body)
            if i % 2:
                hlo = ns / "hlo" / neff.relative_to(ns / "neff").with_suffix(".hlo")
                hlo.parent.mkdir(parents=True, exist_ok=True)
                hlo.write_bytes(bytes(i))
        else:
            write_kernel_neff(ns / "neff", f"k-{i}", b"N" + body)


def _expected(store: Store, n: int) -> list[SizedEntry]:
    sink = Largest(n)
    sink.add_all(sized(e) for e in scan(store).entries)
    return sink.entries()


def _store(root: Path, order: str, monkeypatch: pytest.MonkeyPatch) -> Store:
    if order == "python walk":
        monkeypatch.setattr(local_listing, "native", None)
    if order == "no shard counts":
        monkeypatch.setattr(summary_module, "COUNT_PLAIN_SHARDS", False)
    local = LocalStore(root)
    return {"threaded": LocalStore(root, list_workers=4), "key order": KeyOrder(local, 0)}.get(order, local)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("n", [1, 4, 10, 10_000])
def test_the_largest_are_the_full_reports(tmp_path: Path, order: str, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    _sized_tree(tmp_path)
    store = _store(tmp_path, order, monkeypatch)
    sink = Largest(n)
    summary = summarize(store, sinks=[sink])
    expected = _expected(store, n)
    assert sink.entries() == expected == _expected(LocalStore(tmp_path), n)
    assert len(expected) == min(n, summary.entries)
    assert [e.size for e in expected] == sorted((e.size for e in expected), reverse=True)


@pytest.mark.parametrize("order", ORDERS)
def test_failed_and_corrupt_entries_are_ranked_too(tmp_path: Path, order: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every committed entry counts, whatever its state; uncommitted ones and garbage do not."""
    _all_layouts(tmp_path)
    store = _store(tmp_path, order, monkeypatch)
    sink = Largest(MAX_LARGEST)
    summary = summarize(store, sinks=[sink])
    got = sink.entries()
    assert got == _expected(store, MAX_LARGEST)  # the same store: key order sees no links
    assert len(got) == summary.entries
    assert {e.state for e in got} >= {EntryState.SUCCESS, EntryState.FAILED, EntryState.CORRUPT}


class EveryEntry:
    """A sink whose answer needs every entry: the summary must not let a store count any."""

    largest = 0
    needs_every_entry = True

    def __init__(self) -> None:
        self.paths: list[str] = []

    def add(self, entry: SizedEntry) -> None:
        self.paths.append(entry.path)


def test_a_sink_that_needs_every_entry_turns_counting_off(tmp_path: Path) -> None:
    _sized_tree(tmp_path, entries=120)
    sink = EveryEntry()
    summary = summarize(LocalStore(tmp_path), sinks=[sink])
    assert sorted(sink.paths) == sorted(e.path for e in scan(LocalStore(tmp_path)).entries)
    assert len(sink.paths) == summary.entries == 124


def test_totals_do_not_depend_on_the_sinks(tmp_path: Path) -> None:
    _sized_tree(tmp_path, entries=90)
    plain = summarize(LocalStore(tmp_path))
    with_sinks = summarize(LocalStore(tmp_path), sinks=[Largest(3), EveryEntry()])
    assert (plain.namespaces, plain.warnings) == (with_sinks.namespaces, with_sinks.warnings)


@pytest.mark.parametrize("n", [0, -1, MAX_LARGEST + 1])
def test_a_bad_count_is_refused(n: int) -> None:
    with pytest.raises(ValueError, match="largest"):
        Largest(n)


def test_the_cli_names_the_largest_as_json_and_as_text(tmp_path: Path) -> None:
    _sized_tree(tmp_path, entries=60)
    runner = CliRunner()
    out = runner.invoke(cli, ["scan", str(tmp_path), "--largest", "5", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    expected = _expected(LocalStore(tmp_path), 5)
    assert [(e["path"], e["size"], e["files"], e["state"]) for e in data["largest"]] == [
        (e.path, e.size, e.files, e.state.value) for e in expected]
    assert data["entries"] == 64 and "entry_list" not in data  # the totals, not every entry
    assert data["largest"][0]["size"] == data["largest"][3]["size"]  # the four tied, by path
    assert [e["path"] for e in data["largest"][:4]] == sorted(e["path"] for e in data["largest"][:4])
    text = runner.invoke(cli, ["scan", str(tmp_path), "--largest", "2"])
    assert text.exit_code == 0, text.output
    assert "largest 2 entries:" in text.output and expected[1].path in text.output
    full = json.loads(runner.invoke(cli, ["scan", str(tmp_path), "--largest", "5", "--json", "--entries"]).output)
    assert full["largest"] == data["largest"] and len(full["entry_list"]) == 64


@pytest.mark.parametrize("bad", ["0", "-3", "ten", str(MAX_LARGEST + 1)])
def test_the_cli_refuses_a_bad_count(tmp_path: Path, bad: str) -> None:
    out = CliRunner().invoke(cli, ["scan", str(tmp_path), "--largest", bad])
    assert out.exit_code == 2 and "--largest" in out.output


def test_an_empty_store_has_no_largest(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["scan", str(tmp_path), "--largest", "3", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["largest"] == []
    text = CliRunner().invoke(cli, ["scan", str(tmp_path), "--largest", "3"])
    assert "largest entries: none" in text.output


def test_the_sinks_bound_is_the_c_helpers() -> None:
    """--largest is refused above the bound the C counts accept, so no count refuses it midway."""
    native = local_listing.native
    if native is None:
        pytest.skip("the C listing helper is not built here (NEFFCACHE_NATIVE=0 or no compiler)")
    assert native.MAX_LARGEST == MAX_LARGEST


def test_the_largest_of_an_s3_store_over_http(tmp_path: Path, s3_store: S3Store) -> None:  # noqa: F811
    """An object store counts nothing: every entry is judged from its keys (layout B's only at
    the end of the listing), and the sink sees them all; the answer is the local tree's."""
    _sized_tree(tmp_path, entries=45)
    for path in sorted(p for p in tmp_path.rglob("*") if p.is_file()):
        s3_store.put_file(path.relative_to(tmp_path).as_posix(), path)
    sink = Largest(7)
    summary = summarize(s3_store, sinks=[sink])
    assert summary.entries == 49
    assert sink.entries() == _expected(s3_store, 7) == _expected(LocalStore(tmp_path), 7)
