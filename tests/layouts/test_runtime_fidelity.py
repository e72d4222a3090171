"""Caches laid out exactly as the runtimes and the tools around them write them (issue #11).

The neuronxcc layout in every wrapper era with every state, libneuronxla's root lock, optimum-neuron's
registry and nested traced models, NxD's extra file; torchneuron as TorchNeuron's native backend
writes it (32-hex keys). neffcache must count every entry, keep every file it did not write
(``prune --garbage`` through the real CLI), and carry every layout through push and pull.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from neffcache.replication.sync import pull, push
from neffcache.scan.report import ScanReport, scan
from neffcache.stores import open_store
from neffcache.stores.base import CONTROL_DIR, Store
from neffcache.stores.local import LocalStore
from tests.runtime_caches import (
    ERA_JSON,
    ERA_TARGET,
    ERA_TXT,
    write_native_neff,
    write_nxd_wrapped_neff,
    write_optimum_registry,
    write_optimum_traced_model,
    write_runtime_a,
)
from tests.stores.conftest import BUCKET, aws_env, moto_server, s3_endpoint

__all__ = ["aws_env", "moto_server", "s3_endpoint"]  # the S3 fixtures, reused here

TRANSFERRED = ("SUCCESS", "FAILED", "EMPTY")  # a LOCKED entry's lock is a live process's: not copied


def files_of(root: Path) -> dict[str, str]:
    """Every file below ``root`` but neffcache's control directory: path -> sha256."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.relative_to(root).as_posix().startswith(
                CONTROL_DIR + "/")}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neffcache.cli.main", *args], capture_output=True, text=True,
                          check=False, timeout=120)


def layout_a_root(root: Path) -> dict[str, list[Path]]:
    """Every era, every state, the root lock, and the other tools' files."""
    made: dict[str, list[Path]] = {"entries": [], "foreign": [], "wrapped": []}
    for version, states in ((ERA_TXT, ("SUCCESS", "SUCCESS", "FAILED", "EMPTY")),
                            (ERA_JSON, ("SUCCESS", "SUCCESS", "FAILED", "LOCKED", "EMPTY")),
                            (ERA_TARGET, ("SUCCESS", "SUCCESS", "FAILED", "LOCKED", "EMPTY"))):
        for i, state in enumerate(states):
            made["entries"].append(write_runtime_a(root, f"{version}-{i}".encode(), version=version, state=state))
    # NxD's wrapped NEFF inside a 2.20 and a 2.21 SUCCESS entry: the entry's own file.
    made["wrapped"] += [write_nxd_wrapped_neff(made["entries"][i]) for i in (4, 9)]
    made["foreign"] += write_optimum_registry(root)
    made["foreign"] += write_optimum_traced_model(root)
    made["foreign"] += write_optimum_traced_model(root, ERA_JSON, top_level_file=True)
    return made


A_STATES = {"SUCCESS": 6, "FAILED": 3, "LOCKED": 2, "EMPTY": 3, "CORRUPT": 0}


def test_scan_counts_every_layout_a_entry_of_every_era(tmp_path: Path) -> None:
    root = tmp_path / "neuron-compile-cache"
    made = layout_a_root(root)
    report = scan(LocalStore(root))
    assert report.by_state() == A_STATES
    assert report.warnings == () and report.garbage == () and report.uncommitted == ()
    assert sorted(e.path for e in report.entries) == sorted(p.relative_to(root).as_posix() for p in made["entries"])
    # Other tools' files are foreign: reported with their size, part of no entry.
    assert sorted(f.path for f in report.foreign) == sorted(p.relative_to(root).as_posix() for p in made["foreign"])
    assert report.foreign_size == sum(p.stat().st_size for p in made["foreign"])
    assert sorted(e.path for e in report.entries if "wrapped_neff.hlo" in e.files) == sorted(
        p.parent.relative_to(root).as_posix() for p in made["wrapped"])
    versions = {e.namespace.compiler_version for e in report.entries}
    assert versions == {ERA_TXT, ERA_JSON, ERA_TARGET}


def test_prune_garbage_keeps_every_runtime_and_other_tool_file(tmp_path: Path) -> None:
    root = tmp_path / "neuron-compile-cache"
    layout_a_root(root)
    before = files_of(root)
    dry = run_cli("prune", "--store", str(root), "--garbage", "--grace", "0s")
    assert dry.returncode == 0, dry.stderr
    assert "foreign, kept: 9 files" in dry.stdout and "model.neuron" in dry.stdout
    done = run_cli("prune", "--store", str(root), "--garbage", "--grace", "0s", "--yes")
    assert done.returncode == 0, done.stderr
    assert files_of(root) == before  # byte for byte
    assert scan(LocalStore(root)).by_state() == A_STATES


def test_removing_entries_leaves_the_files_of_other_tools(tmp_path: Path) -> None:
    """A compiler bump removes the old namespace's entries: the runtime's files of each entry go
    (NxD's wrapped NEFF in it too); optimum's nested models and registry stay."""
    root = tmp_path / "neuron-compile-cache"
    made = layout_a_root(root)
    done = run_cli("prune", "--store", str(root), "--keep-compiler", ERA_TARGET, "--yes", "--force")
    assert done.returncode == 0, done.stderr
    after = files_of(root)
    assert all(p.relative_to(root).as_posix() in after for p in made["foreign"])
    assert not made["entries"][4].exists() or not any(made["entries"][4].iterdir())  # the whole entry is gone
    report = scan(LocalStore(root))
    # The old era's LOCKED entry stays too: its lock is fresh, a compile may still run.
    assert {(e.namespace.compiler_version, e.state.value) for e in report.entries
            if e.namespace.compiler_version != ERA_TARGET} == {(ERA_JSON, "LOCKED")}
    assert report.by_state() == {"SUCCESS": 2, "FAILED": 1, "LOCKED": 2, "EMPTY": 1, "CORRUPT": 0}


Content = dict[str, tuple[str, dict[str, bytes], str]]


def _content(store: Store, report: ScanReport) -> Content:
    """Entry path -> (state, the runtime's files by name, marker name): what a runtime would see."""
    return {e.path: (e.state.value, {n: store.read_bytes(e.store_path(n)) for n in e.files
                                     if n != e.manifest_name}, e.marker_name)
            for e in report.entries if e.state.value in TRANSFERRED}


def _same(got: Content, want: Content) -> None:
    """The same entries in the same states with the same bytes and the same commit marker: a
    copy keeps its entry's flags form (a text-form entry gets no model.done: its NEFF commits it)."""
    assert sorted(got) == sorted(want)
    for path, (state, files, marker) in want.items():
        got_state, got_files, got_marker = got[path]
        assert got_state == state, path
        assert got_files == files, path
        assert got_marker == marker, path


def _round_trip(source: Path, second: Store, back: Store) -> None:
    src = LocalStore(source)
    want = _content(src, scan(src))
    assert want
    first = push(src, second, states=TRANSFERRED)
    assert first.ok and len(first.copied) == len(want)
    _same(_content(second, scan(second)), want)
    again = pull(second, back, states=TRANSFERRED)
    assert again.ok and len(again.copied) == len(want)
    _same(_content(back, scan(back)), want)


def test_push_pull_round_trips_layout_a(tmp_path: Path) -> None:
    root = tmp_path / "neuron-compile-cache"
    layout_a_root(root)
    _round_trip(root, LocalStore(tmp_path / "second"), LocalStore(tmp_path / "back"))


@pytest.mark.s3
def test_push_pull_round_trips_layout_a_through_s3(tmp_path: Path, s3_endpoint: str) -> None:
    root = tmp_path / "neuron-compile-cache"
    layout_a_root(root)
    remote = open_store(f"s3://{BUCKET}/fleet", endpoint_url=s3_endpoint)
    try:
        _round_trip(root, remote, LocalStore(tmp_path / "back"))
    finally:
        remote.close()


# -- torchneuron: TorchNeuron's native cache ----------------------------------------------------------
def layout_b_roots(tmp_path: Path) -> tuple[Path, Path, list[Path]]:
    """A neffcache-managed root the runtime filled (TORCH_NEURONX_NEFF_CACHE_DIR=<ns>/neff) and a
    bare native directory (/tmp/neff_cache), both with the runtime's 32-hex keys."""
    managed = tmp_path / "managed"
    neff_dir = managed / "trn1-lnc1" / f"torchneuron-{ERA_TARGET}" / "neff"
    bare = tmp_path / "neff_cache"
    neffs = [write_native_neff(neff_dir, f"op-{i}".encode()) for i in range(3)]
    neffs += [write_native_neff(bare, f"bare-{i}".encode()) for i in range(2)]
    return managed, bare, neffs


def test_prune_garbage_keeps_native_neffs(tmp_path: Path) -> None:
    """Whether or not torchneuron recognises the runtime's keys, its NEFFs are never garbage."""
    managed, bare, _ = layout_b_roots(tmp_path)
    for root in (managed, bare):
        before = files_of(root)
        done = run_cli("prune", "--store", str(root), "--garbage", "--grace", "0s", "--yes")
        assert done.returncode == 0, done.stderr
        assert files_of(root) == before


def test_scan_counts_native_entries(tmp_path: Path) -> None:
    managed, bare, _ = layout_b_roots(tmp_path)
    for root, count in ((managed, 3), (bare, 2)):
        report = scan(LocalStore(root))
        assert report.by_state() == {"SUCCESS": count, "FAILED": 0, "LOCKED": 0, "EMPTY": 0, "CORRUPT": 0}
        assert report.foreign == () and report.garbage == ()


def test_push_pull_round_trips_layout_b(tmp_path: Path) -> None:
    managed, bare, _ = layout_b_roots(tmp_path)
    for root in (managed, bare):
        _round_trip(root, LocalStore(tmp_path / f"{root.name}-second"), LocalStore(tmp_path / f"{root.name}-back"))


@pytest.mark.s3
def test_push_pull_round_trips_layout_b_through_s3(tmp_path: Path, s3_endpoint: str) -> None:
    managed, _, _ = layout_b_roots(tmp_path)
    remote = open_store(f"s3://{BUCKET}/native", endpoint_url=s3_endpoint)
    try:
        _round_trip(managed, remote, LocalStore(tmp_path / "back"))
    finally:
        remote.close()


def test_scan_reports_foreign_files_in_json(tmp_path: Path) -> None:
    root = tmp_path / "neuron-compile-cache"
    made = layout_a_root(root)
    data = scan(LocalStore(root)).to_json()
    foreign = data["foreign"]
    assert isinstance(foreign, dict)
    assert foreign["files"] == len(made["foreign"]) and foreign["size"] == sum(p.stat().st_size
                                                                               for p in made["foreign"])
    text = run_cli("scan", str(root))
    assert text.returncode == 0, text.stderr
    assert f"foreign, kept: {len(made['foreign'])} files" in text.stdout
    assert "warning" not in text.stdout and "14 entries" in text.stdout
