"""A summary's totals are the full scan's, on every layout and every listing order the stores
produce (neffcache/scan/summary.py says why streaming is exact)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from neffcache.entry import EntryState, FileInfo
from neffcache.layouts.torchneuron import shard
from neffcache.scan import summary as summary_module
from neffcache.scan import tally as tally_module
from neffcache.scan.report import scan
from neffcache.scan.summary import ScanSummary, summarize
from neffcache.stores import local_listing
from neffcache.stores.base import TEMP_MARKER, Store
from neffcache.stores.local import LocalStore
from neffcache.stores.walk import DirListing
from tests.runtime_caches import (
    kernel_key,
    native_key,
    write_kernel_neff,
    write_kernel_temp,
    write_native_neff,
    write_native_temp,
    write_neuronxcc_entry,
    write_vllm_entry,
)
from tests.scan.test_scan_listing import FileByFile, _messy_root, _touch


class KeyOrder(FileByFile):
    """Lists in key order, as S3 and fsspec do: ``Store.iter_dirs``' default groups the runs."""

    def iter_files(self, prefix: str = "") -> Iterator[FileInfo]:
        yield from sorted(self.inner.iter_files(prefix))


def _all_layouts(root: Path) -> None:
    """Entries of layouts A, B and C in every state, with garbage, foreign files and problems."""
    _messy_root(root)  # A and B, temp files, foreign files, control files, a runtime lock
    for i in range(40):
        write_neuronxcc_entry(root, f"ok-{i}".encode(), target="trn1")
    write_neuronxcc_entry(root, b"failed", state="FAILED")
    write_neuronxcc_entry(root, b"failed-2", state="FAILED")
    write_neuronxcc_entry(root, b"locked-2", state="LOCKED")
    write_neuronxcc_entry(root, b"empty", state="EMPTY")
    write_neuronxcc_entry(root, b"empty-neff", neff=b"")  # CORRUPT: an empty NEFF
    linked = write_neuronxcc_entry(root, b"linked")
    (linked / "escape").symlink_to("/etc/hostname")  # CORRUPT: a link out of the root
    (linked / "nested").mkdir()
    (linked / "nested" / "x.bin").write_bytes(b"nested")  # foreign: below an entry
    (root / "stray-link").symlink_to("/etc")  # a warning outside any entry
    ns = root / "trn2-lnc2" / "torchneuron-2.9.0"
    for i in range(60):
        key = native_key(f"op-{i}")
        if i % 3 != 1:
            write_native_neff(ns / "neff", f"op-{i}", b"" if i == 9 else None)  # i == 9: CORRUPT
        if i % 3 != 0:
            _touch(ns / "hlo" / f"{shard(key)}.hlo", b"HLO" * i)  # i % 3 == 1: EMPTY (no NEFF)
            _touch(ns / "hlo" / f"{shard(key)}.flags.json", b"[]")
        if i == 12:
            (ns / "neff" / f"{shard(key)}.neff").unlink()
            _touch(ns / "neff" / f"{shard(key)}.neffcache.json", b"{}")  # uncommitted
    _touch(ns / "neff" / "zz" / "notes.txt")  # foreign in a layout-B namespace
    key = native_key("op-3")  # a NEFF, no HLO
    (ns / "hlo" / shard(key)).parent.mkdir(parents=True, exist_ok=True)
    (ns / "hlo" / f"{shard(key)}.flags.json").symlink_to("/etc/hostname")  # CORRUPT: a link out of the root
    (ns / "hlo" / f"{shard(key)}.hlo").symlink_to("/etc")  # and a symlinked directory beside it
    _touch(ns / "neff" / f"{shard(key)}.sub" / "x.bin")  # foreign: nested below a shard
    linked_tree = root / "trn1-lnc1" / "torchneuron-2.8.0"
    write_native_neff(linked_tree / "neff", "op-linked")
    (linked_tree / "hlo").symlink_to(ns / "hlo")  # a symlinked tree: reported once, not followed
    _touch(ns / "neff" / "ab" / "cd" / f"x{TEMP_MARKER}1")  # our temp file
    # TorchNeuron's kernel writer beside the C++ one: <K>/<K>.neff, its temp files, odd cases.
    for i in range(12):
        write_kernel_neff(ns / "neff", f"kernel-{i}", b"" if i == 5 else None)  # i == 5: CORRUPT
    write_kernel_temp(ns / "neff", "kernel-1")
    write_native_temp(ns / "neff", "op-2")
    gone = kernel_key("kernel-7")
    (ns / "neff" / gone / f"{gone}.neff").unlink()
    _touch(ns / "neff" / gone / f"{gone}.neffcache.json", b"{}")  # uncommitted
    _touch(ns / "neff" / kernel_key("kernel-8") / "notes.txt")  # foreign beside a kernel's NEFF
    write_kernel_neff(root / "bare-kernels", "bare-kernel")  # a bare NEFF dir is no namespace here
    vllm = root / "trn2-lnc2" / "vllm-0.9.1"
    write_vllm_entry(vllm, "llama")
    write_vllm_entry(vllm, "mistral", complete=False)  # LOCKED
    _touch(vllm / "torch_compile_cache" / "x.py")  # foreign


def _without_seconds(summary: ScanSummary) -> ScanSummary:
    return dataclasses.replace(summary, seconds=0.0)


@pytest.mark.parametrize("order", ["walk", "python walk", "threaded", "key order"])
def test_a_summary_is_the_full_reports_totals(tmp_path: Path, order: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``walk``: layout B's trees are left out of the walk and listed in step; ``python walk``:
    the same without the C helper; ``threaded`` and ``key order``: its entries are kept to the end."""
    if order == "python walk":
        monkeypatch.setattr(local_listing, "native", None)
    root = tmp_path / "c"
    _all_layouts(root)
    local = LocalStore(root)
    stores: dict[str, Store] = {"walk": local, "python walk": local, "threaded": LocalStore(root, list_workers=4),
                                "key order": KeyOrder(local, 0)}
    store = stores[order]
    report = scan(store)
    summary = summarize(store)
    assert _without_seconds(summary) == _without_seconds(ScanSummary.of_report(report))
    # The tree has what it should, so the comparison covers every case.
    states = summary.by_state()
    assert all(states[s.value] for s in EntryState), states
    assert {ns.namespace.layout for ns in summary.namespaces} == {"neuronxcc", "torchneuron", "vllm"}
    assert summary.garbage_files and summary.uncommitted_entries >= 3 and summary.foreign_files >= 7
    assert len(summary.failed) == 2 and summary.warning_count == len(report.warnings) >= 2  # CORRUPT entries
    if order != "key order":  # what a listing would not follow (only local stores have such problems)
        assert summary.warning_count >= 4 and any("stray-link" in w for w in summary.warnings)
    assert summary.entries == len(report.entries) and summary.size == report.size


def test_warnings_are_capped_and_counted(tmp_path: Path) -> None:
    root = tmp_path / "c"
    for i in range(5):
        write_neuronxcc_entry(root, f"bad-{i}".encode(), neff=b"")
    summary = summarize(LocalStore(root), max_warnings=2)
    assert summary.warning_count == 5 and len(summary.warnings) == 2
    assert summary.by_state()["CORRUPT"] == 5


def test_the_plain_scan_command_prints_the_full_scans_text(tmp_path: Path) -> None:
    """The plain command (a summary) and --entries (the full report) print the same totals."""
    root = tmp_path / "c"
    _all_layouts(root)

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "neffcache.cli.main", "scan", str(root), *args],
                              capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
        assert done.returncode == 1, done.stdout + done.stderr  # CORRUPT entries
        return done.stdout

    def without_timing(text: str) -> list[str]:
        return [line.split(" (scanned in")[0] for line in text.splitlines()]

    plain = without_timing(cli())
    detailed = without_timing(cli("--entries"))
    entry_table = detailed.index("", 1)
    table_end = next(i for i, line in enumerate(detailed) if line.startswith("garbage:"))
    assert plain == detailed[:entry_table] + detailed[table_end:]
    assert any("failed: 2 compiler errors" in line or "failed:" in line for line in plain)


@pytest.mark.parametrize("counting", [True, False], ids=["plain shards counted", "every entry judged"])
def test_layout_b_entries_are_counted_shard_by_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     counting: bool) -> None:
    """The walk leaves a layout-B namespace's two trees out and the summary lists them in step:
    at most one shard's entries are open at a time, none kept to the end (the peak RSS of a
    summary of a million entries is bounded: bench/scan_bench.py measures it). Shards of plain
    SUCCESS entries, all of them here, are counted without a group at all."""
    monkeypatch.setattr(summary_module, "COUNT_PLAIN_SHARDS", counting)
    ns = tmp_path / "c" / "trn2-lnc2" / "torchneuron-2.9.0"
    for i in range(400):
        key = native_key(f"op-{i}")
        write_native_neff(ns / "neff", f"op-{i}")
        if i % 2:
            _touch(ns / "hlo" / f"{shard(key)}.hlo", b"HLO")
    open_at_most = 0

    class Watched(summary_module.Grouper):
        def add(self, listing: DirListing) -> None:
            nonlocal open_at_most
            super().add(listing)
            open_at_most = max(open_at_most, len(self.groups))

    def not_kept(self: object, group: object) -> None:
        raise AssertionError("a layout-B entry kept to the end")

    monkeypatch.setattr(summary_module, "Grouper", Watched)
    monkeypatch.setattr(tally_module.KeptEntries, "add", not_kept)
    store = LocalStore(tmp_path / "c")
    summary = summarize(store)
    assert summary.entries == 400 and summary.by_state()["SUCCESS"] == 400
    assert _without_seconds(summary) == _without_seconds(ScanSummary.of_report(scan(store)))
    if counting:
        assert open_at_most == 0
    else:
        assert 1 <= open_at_most <= 4  # one shard's entries (400 keys in 65,536 shards)


@pytest.mark.parametrize("counting", [True, False], ids=["plain shards counted", "every entry judged"])
def test_a_problem_below_a_counted_shard_still_reaches_its_entry(monkeypatch: pytest.MonkeyPatch,
                                                                 counting: bool) -> None:
    """A subdirectory of a shard that cannot be opened comes in the batch after the shard's,
    and may be named like an entry's file: that entry is CORRUPT. A counted shard is not
    counted until the walk has left it, and is judged entry by entry when the walk goes below."""
    monkeypatch.setattr(summary_module, "COUNT_PLAIN_SHARDS", counting)
    ns = "trn2-lnc2/torchneuron-2.9.0"
    key, other = "ab12" + "3" * 28, "ab12" + "4" * 28
    neffs = f"{ns}/neff/ab/12"
    plain = DirListing(neffs, [f"{key}.neff", f"{other}.neff"],
                       [FileInfo(f"{neffs}/{key}.neff", 5, 1.0), FileInfo(f"{neffs}/{other}.neff", 6, 1.0)])
    unreadable = DirListing(neffs, [], [], ((f"{key}.neffcache.json", "unreadable directory (Permission denied)"),))
    third = f"ab13{'5' * 28}.neff"
    later = DirListing(f"{ns}/neff/ab/13", [third], [FileInfo(f"{ns}/neff/ab/13/{third}", 7, 1.0)])
    batches = [("ab/12", [plain]), (f"ab/12/{key}.neffcache.json", [unreadable]), ("ab/13", [later])]
    tally = tally_module.Tally(10)
    in_step = summary_module._InStep(ns, summary_module.Grouper(), tally, [], [], count=counting)
    for rel, batch in batches:
        in_step.add(rel, batch)
    in_step.finish()
    (counts, states), = tally.namespaces.values()
    assert counts == [3, 18] and states == {"SUCCESS": 2, "CORRUPT": 1}
    assert tally.corrupt_warnings and key in tally.corrupt_warnings[0][1]
